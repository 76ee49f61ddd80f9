// What the emulated cuBLAS (emulation_blas.cpp) and the launcher (emulation_launch.cpp) ask of
// the emulated runtime (emulation.cpp): access to the device's memory, whether devices are
// switched off, whether a stream is live, whether a range of bytes lies inside one live device
// allocation, and recording an error for cudaGetLastError. Internal to device emulation.
#pragma once

#include <cstddef>

#include "core/cuda/emulation.h"

namespace clustr::cuda::emulation::state {

// While one lives, the device arena (emulation.cpp) is open to the calling code: the emulator's
// own work on device memory (a launch, a copy, a GEMM, a fill). Outside every such scope host
// code that touches device memory faults, and the emulator names it.
class DeviceAccess {
 public:
  DeviceAccess();
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;
};

bool no_devices();  // CLUSTR_CUDA_EMULATION_DEVICES=0
void record_error(cudaError_t e);  // what the host thread's next cudaGetLastError returns
bool live_stream(cudaStream_t s);
bool in_one_allocation(const void* p, size_t bytes);

}  // namespace clustr::cuda::emulation::state
