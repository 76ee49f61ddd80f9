// The apps' --device flag (device.h).
#include "apps/common/device.h"

#include <cmath>
#include <cstdio>

#include "apps/common/settings.h"
#include "core/cpu/gemm.h"
#include "core/cpu/gemm_bf16.h"
#include "core/cuda/cuda.h"
#include "core/parallel.h"
#include "core/error.h"
#include "core/tensor.h"

#ifndef CLUSTR_BUILD_TYPE
#define CLUSTR_BUILD_TYPE "unknown"
#endif

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
  start_kernels_ = c.kernels, start_blas_ = c.blas, start_graphs_ = c.graphs;
}

void LaunchMeter::end() {
  const cuda::LaunchCounts c = cuda::launch_counts();
  kernels_ += c.kernels - start_kernels_;
  blas_ += c.blas - start_blas_;
  graphs_ += c.graphs - start_graphs_;
}

std::string LaunchMeter::report(int64_t steps, double& kernels_per_step, double& blas_per_step) {
  std::string line;
  if (on_device_ && steps > 0) {
    kernels_per_step = double(kernels_) / double(steps);
    blas_per_step = double(blas_) / double(steps);
    line = detail::cat("  launches/step ", std::lround(kernels_per_step), " + ",
                       std::lround(blas_per_step), " cuBLAS");
    if (graphs_ > 0) {  // a graph's launches run on the device, from one host launch
      char g[32];
      std::snprintf(g, sizeof g, "%.2f", double(graphs_) / double(steps));
      line += detail::cat(" + ", g, " graph");
    }
    // The device memory that tensors hold now: a long run's growth shows here (scripts/soak.py).
    char mib[48];
    std::snprintf(mib, sizeof mib, "  device MiB %.1f",
                  double(memory_stats(Device::cuda).live_bytes) / 1048576.0);
    line += mib;
  }
  kernels_ = blas_ = graphs_ = 0;
  return line;
}

std::vector<std::pair<std::string, std::string>> build_info(const std::string& device) {
#if defined(__clang__)
  const std::string compiler = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
  const std::string compiler = std::string("g++ ") + __VERSION__;
#else
  const std::string compiler = "unknown";
#endif
#ifdef _OPENMP
  const std::string openmp = "on (" + std::to_string(_OPENMP) + ")";
#else
  const std::string openmp = "off";
#endif
  std::string cuda_state = cuda::compiled() ? "compiled" : "off";
  if (cuda::compiled() && device != "cuda")
    cuda_state += ", not used (--device " + device + ")";
  else if (cuda::compiled())
    cuda_state += !cuda::available() ? ", no GPU: " + cuda::unavailable_reason()
                  : cuda::emulated()  ? std::string(", emulated device")
                                      : std::string(", GPU present");
  std::string bf16_kernel = cpu::gemm_bf16_kernel_name();
  if (bf16_kernel == "generic")
    bf16_kernel += " (portable C++: without AMX or AVX512-BF16, --precision bf16 gains nothing)";
  return {{"compiler", compiler},
          {"build type", CLUSTR_BUILD_TYPE},
          {"OpenMP", openmp},
          {"CUDA", cuda_state},
          {"GEMM micro-kernel", cpu::gemm_kernel_name()},
          {"bf16 GEMM kernel", bf16_kernel},
          {"threads", std::to_string(num_threads())}};
}

}  // namespace clustr
