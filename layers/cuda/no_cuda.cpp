// The CTC loss's CUDA kernels when clustr is built without the CUDA backend
// (clustr_cuda_sources' NO_CUDA sources): each throws cuda::no_backend's error. No tensor can be
// on a CUDA device in such a build, so they are reached only by calling them directly.
#include "core/cuda/cuda.h"
#include "layers/cuda/ctc.h"

namespace clustr {

void cuda::ctc_forward(const float*, const int32_t*, int64_t, int64_t, int64_t, int64_t, int32_t,
                       float*, float*) {
  no_backend("cuda::ctc_forward");
}
void cuda::ctc_reduce(const float*, const int32_t*, int64_t, int, bool, float*) {
  no_backend("cuda::ctc_reduce");
}
void cuda::ctc_scale_grad(const float*, const float*, const int32_t*, int64_t, int64_t, int64_t,
                          int, float*) {
  no_backend("cuda::ctc_scale_grad");
}

}  // namespace clustr
