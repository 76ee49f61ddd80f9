// The improved clustered attention CUDA kernels when clustr is built without the CUDA backend:
// every call throws a clear error (no tensor can be on a CUDA device in such a build, so these
// are reached only by calling them directly).
#include "core/error.h"
#include "layers/attention/improved_clustered_cuda.h"

namespace clustr::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(detail::cat(what, ": clustr was built without the CUDA backend (configure with ",
                          "the CUDA toolkit installed, or -DCLUSTR_CUDA=ON to require it)"));
}
}  // namespace

int64_t improved_clustered_attention_forward_workspace(const ClusteredDims&, int64_t,
                                                       const ClusteredParams&) {
  no_cuda("cuda::improved_clustered_attention_forward_workspace");
}
int64_t improved_clustered_attention_backward_workspace(const ClusteredDims&, int64_t,
                                                        const ClusteredParams&) {
  no_cuda("cuda::improved_clustered_attention_backward_workspace");
}
void improved_clustered_attention_forward(const ClusteredDims&, const ClusteredParams&, int64_t,
                                          int64_t, const float*, const float*, const float*,
                                          float*, float*, float*, int32_t*, float*, float*) {
  no_cuda("cuda::improved_clustered_attention_forward");
}
void improved_clustered_attention_backward(const ClusteredDims&, const ClusteredParams&,
                                           int64_t, const float*, const float*, const float*,
                                           const float*, const float*, const int32_t*,
                                           const float*, const float*, float*, float*, float*,
                                           float*) {
  no_cuda("cuda::improved_clustered_attention_backward");
}

}  // namespace clustr::cuda
