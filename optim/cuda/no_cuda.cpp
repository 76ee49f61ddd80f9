// The optimizers' CUDA kernels when clustr is built without the CUDA backend: every call throws a
// clear error (no parameter can be on a CUDA device in such a build, so these are reached only
// by calling them directly).
#include "core/error.h"
#include "optim/cuda/update.h"

namespace clustr::optim::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(detail::cat(what, ": clustr was built without the CUDA backend (configure with ",
                          "the CUDA toolkit installed, or -DCLUSTR_CUDA=ON to require it)"));
}
}  // namespace

void sgd_update_many(const std::vector<TensorSlots>&, const math::SgdScalars&) {
  no_cuda("optim::cuda::sgd_update_many");
}
void adam_update_many(const std::vector<TensorSlots>&, const math::AdamScalars&, bool) {
  no_cuda("optim::cuda::adam_update_many");
}
void scale_many(const std::vector<TensorSlots>&, float) { no_cuda("optim::cuda::scale_many"); }
std::vector<double> sum_squares(const std::vector<const float*>&, const std::vector<int64_t>&) {
  no_cuda("optim::cuda::sum_squares");
}

}  // namespace clustr::optim::cuda
