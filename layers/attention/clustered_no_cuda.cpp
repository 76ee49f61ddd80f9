// The clustered attention CUDA kernels when clustr is built without the CUDA backend: every
// call throws a clear error (no tensor can be on a CUDA device in such a build, so these are
// reached only by calling them directly).
#include "core/error.h"
#include "layers/attention/clustered_cuda.h"

namespace clustr::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(detail::cat(what, ": clustr was built without the CUDA backend (configure with ",
                          "the CUDA toolkit installed, or -DCLUSTR_CUDA=ON to require it)"));
}
}  // namespace

int64_t clustered_attention_forward_workspace(const ClusteredDims&, const ClusteredParams&) {
  no_cuda("cuda::clustered_attention_forward_workspace");
}
int64_t clustered_attention_backward_workspace(const ClusteredDims&, const ClusteredParams&) {
  no_cuda("cuda::clustered_attention_backward_workspace");
}
void clustered_attention_forward(const ClusteredDims&, const ClusteredParams&, const float*,
                                 const float*, const float*, float*, float*, float*, float*) {
  no_cuda("cuda::clustered_attention_forward");
}
void clustered_attention_backward(const ClusteredDims&, const ClusteredParams&, const float*,
                                  const float*, const float*, const float*, const float*,
                                  float*, float*, float*, float*) {
  no_cuda("cuda::clustered_attention_backward");
}

void group_members(const ClusteredDims&, const int32_t*, int32_t*, int32_t*, int32_t*) {
  no_cuda("cuda::group_members");
}
int64_t count_outside_clusters(const ClusteredDims&, const int32_t*) {
  no_cuda("cuda::count_outside_clusters");
}

}  // namespace clustr::cuda
