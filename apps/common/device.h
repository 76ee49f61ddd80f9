// The apps' --device flag: "cpu" or "cuda" -> the Device, checked before any work is done; and
// --tf32, which only the device's f32 products know.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "layers/module.h"

namespace clustr {

// "cpu" -> Device::cpu; "cuda" -> Device::cuda when the build has the CUDA backend and a usable
// GPU (or the emulated device) is present. Otherwise throws one line that says why (the
// driver's reason, cuda::unavailable_reason()) and suggests --device cpu.
Device resolve_device(const std::string& device);

// --tf32: lets cuBLAS run the f32 products on the GPU with TF32 tensor cores (cuda::set_tf32;
// off by default). Throws, naming the flag, for a run on the cpu, which has no TF32.
void apply_tf32(bool tf32, Device device);

// A run's machine settings taking effect: the device resolved (as resolve_device), TF32 set
// (apply_tf32), the OpenMP threads set when given. Returns the device.
struct MachineOptions;
Device prepare_machine(const MachineOptions& m);

// Build information for an app's configuration table: compiler, build type, OpenMP, CUDA, the
// GEMM kernels, threads. The GPU is probed only for a run on it (`device` "cuda"): a CPU run
// never loads the driver. The bf16 GEMM's portable kernel says that --precision bf16 gains
// nothing with it (no AMX or AVX512-BF16 in use: its products are no faster than f32 ones).
std::vector<std::pair<std::string, std::string>> build_info(const std::string& device);

// t on `device`: t itself when it is there already, else a copy.
Tensor on_device(const Tensor& t, Device device);

// The device of a model's parameters (cpu for a model without any).
Device device_of(const Module& model);

// Waits for the device's queued work (cuda::synchronize; nothing on the cpu), before a clock is
// read around device work.
void synchronize_device(Device device);

// The kernel launches and cuBLAS calls of an app's training steps (cuda::launch_counts): each
// step between begin() and end(); report() gives a log interval's averages per step and the
// log line's suffix ("  launches/step K + B cuBLAS  device MiB M" on the device, with the
// device memory that tensors hold; "" on the cpu), and starts the next interval.
class LaunchMeter {
 public:
  explicit LaunchMeter(Device device) : on_device_(device == Device::cuda) {}
  void begin();
  void end();
  std::string report(int64_t steps, double& kernels_per_step, double& blas_per_step);

 private:
  bool on_device_;
  uint64_t kernels_ = 0, blas_ = 0, graphs_ = 0, start_kernels_ = 0, start_blas_ = 0,
           start_graphs_ = 0;
};

}  // namespace clustr
