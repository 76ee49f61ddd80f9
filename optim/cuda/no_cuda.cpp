// The optimizers' CUDA kernels when clustr is built without the CUDA backend: each throws
// cuda::no_backend's error (no parameter can be on a CUDA device in such a build, so these are
// reached only by calling them directly).
#include "core/cuda/cuda.h"
#include "optim/cuda/update.h"

namespace clustr::optim {

void cuda::sgd_update_many(const std::vector<TensorSlots>&, const math::SgdScalars&) {
  clustr::cuda::no_backend("optim::cuda::sgd_update_many");
}
void cuda::adam_update_many(const std::vector<TensorSlots>&, const math::AdamScalars&, bool) {
  clustr::cuda::no_backend("optim::cuda::adam_update_many");
}
void cuda::scale_many(const std::vector<TensorSlots>&, float) {
  clustr::cuda::no_backend("optim::cuda::scale_many");
}
std::vector<double> cuda::sum_squares(const std::vector<const float*>&,
                                      const std::vector<int64_t>&) {
  clustr::cuda::no_backend("optim::cuda::sum_squares");
}

int64_t cuda::sum_square_blocks(const std::vector<int64_t>&, std::vector<int64_t>*) {
  clustr::cuda::no_backend("optim::cuda::sum_square_blocks");
}
void cuda::sum_squares_partials(const std::vector<const float*>&, const std::vector<int64_t>&,
                                double*) {
  clustr::cuda::no_backend("optim::cuda::sum_squares_partials");
}
void cuda::decide_step(const std::vector<const float*>&, const std::vector<int64_t>&, double*,
                       const int64_t*, const float*, const std::vector<const float*>&, double,
                       const math::StepScalars*, int32_t, math::DeviceStepState*,
                       math::StepRecord*) {
  clustr::cuda::no_backend("optim::cuda::decide_step");
}
void cuda::sgd_update_many(const std::vector<TensorSlots>&, const math::DeviceStepState*) {
  clustr::cuda::no_backend("optim::cuda::sgd_update_many");
}
void cuda::adam_update_many(const std::vector<TensorSlots>&, const math::DeviceStepState*, bool) {
  clustr::cuda::no_backend("optim::cuda::adam_update_many");
}

}  // namespace clustr::optim
