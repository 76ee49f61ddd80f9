// The arguments of one row-major GEMM, as passed from gemm.cpp to the ISA-specific drivers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/cpu/gemm.h"

namespace clustr::cpu::gemm_impl {

using Problem = GemmCall;

// Defined in gemm.cpp, outside the ISA-specific files, where exceptions are made.
[[noreturn]] void throw_out_of_memory(size_t bytes);

}  // namespace clustr::cpu::gemm_impl
