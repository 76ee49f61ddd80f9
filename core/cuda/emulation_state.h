// What the emulated cuBLAS (emulation_blas.cpp) asks of the emulated runtime (emulation.cpp):
// whether devices are switched off, whether a stream is live, and whether a range of bytes lies
// inside one live device allocation. Internal to device emulation.
#pragma once

#include <cstddef>

#include "core/cuda/emulation.h"

namespace clustr::cuda::emulation::state {

bool no_devices();  // CLUSTR_CUDA_EMULATION_DEVICES=0
bool live_stream(cudaStream_t s);
bool in_one_allocation(const void* p, size_t bytes);

}  // namespace clustr::cuda::emulation::state
