// The apps' --device flag (device.h).
#include "apps/common/device.h"

#include <cmath>

#include "apps/common/settings.h"
#include "core/cuda/cuda.h"
#include "core/parallel.h"
#include "core/error.h"

namespace clustr {

Device resolve_device(const std::string& device) {
  if (device == "cpu") return Device::cpu;
  CLUSTR_CHECK(device == "cuda", "--device must be cpu or cuda, got '", device, "'");
  CLUSTR_CHECK(cuda::compiled(), "--device cuda: ", cuda::unavailable_reason(),
               " (it is built when CMake finds the CUDA toolkit; -DCLUSTR_CUDA=ON requires it); "
               "use --device cpu");
  CLUSTR_CHECK(cuda::available(), "--device cuda: no usable GPU: ", cuda::unavailable_reason(),
               "; use --device cpu");
  return Device::cuda;
}

void apply_tf32(bool tf32, Device device) {
  if (!tf32) return;
  CLUSTR_CHECK(device == Device::cuda, "--tf32 applies to the GPU's f32 products; this run is "
               "on the cpu (give --device cuda, or leave --tf32 out)");
  cuda::set_tf32(true);
}

Device prepare_machine(const MachineOptions& m) {
  const Device device = resolve_device(m.device);
  apply_tf32(m.tf32, device);
  if (m.threads > 0) set_num_threads(m.threads);
  return device;
}

Tensor on_device(const Tensor& t, Device device) {
  return !t.defined() || t.device() == device ? t : t.to(device);
}

Device device_of(const Module& model) {
  const std::vector<Variable> params = model.parameters();
  return params.empty() ? Device::cpu : params.front().data().device();
}

void synchronize_device(Device device) {
  if (device == Device::cuda) cuda::synchronize();
}

void LaunchMeter::begin() {
  const cuda::LaunchCounts c = cuda::launch_counts();
  start_kernels_ = c.kernels, start_blas_ = c.blas;
}

void LaunchMeter::end() {
  const cuda::LaunchCounts c = cuda::launch_counts();
  kernels_ += c.kernels - start_kernels_;
  blas_ += c.blas - start_blas_;
}

std::string LaunchMeter::report(int64_t steps, double& kernels_per_step, double& blas_per_step) {
  std::string line;
  if (on_device_ && steps > 0) {
    kernels_per_step = double(kernels_) / double(steps);
    blas_per_step = double(blas_) / double(steps);
    line = detail::cat("  launches/step ", std::lround(kernels_per_step), " + ",
                       std::lround(blas_per_step), " cuBLAS");
  }
  kernels_ = blas_ = 0;
  return line;
}

}  // namespace clustr
