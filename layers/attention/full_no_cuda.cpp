// The full-attention CUDA kernels when clustr is built without the CUDA backend: every call
// throws a clear error (no tensor can be on a CUDA device in such a build, so these are reached
// only by calling them directly).
#include "core/error.h"
#include "layers/attention/full_cuda.h"

namespace clustr::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(detail::cat(what, ": clustr was built without the CUDA backend (configure with ",
                          "the CUDA toolkit installed, or -DCLUSTR_CUDA=ON to require it)"));
}
}  // namespace

int64_t full_attention_forward_workspace(const cpu::FullAttentionDims&) {
  no_cuda("cuda::full_attention_forward_workspace");
}
int64_t full_attention_backward_workspace(const cpu::FullAttentionDims&) {
  no_cuda("cuda::full_attention_backward_workspace");
}
void full_attention_forward(const cpu::FullAttentionDims&, const cpu::FullAttentionParams&,
                            const float*, const float*, const float*, float*, float*, float*) {
  no_cuda("cuda::full_attention_forward");
}
void full_attention_backward(const cpu::FullAttentionDims&, const cpu::FullAttentionParams&,
                             const float*, const float*, const float*, const float*,
                             const float*, const float*, float*, float*, float*, float*) {
  no_cuda("cuda::full_attention_backward");
}

}  // namespace clustr::cuda
