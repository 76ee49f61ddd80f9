// The arguments of one row-major GEMM, as passed from gemm.cpp to the ISA-specific drivers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/cpu/gemm.h"

namespace clustr::cpu::gemm_impl {

using Problem = GemmCall;

// Defined in gemm.cpp, outside the ISA-specific files, where exceptions are made.
[[noreturn]] void throw_out_of_memory(size_t bytes);

// The name that CLUSTR_GEMM_KERNEL forces for one family of kernels (the float32 GEMM's or the
// bf16 GEMM's), or null when it names none of them. The variable holds one name or several
// separated by commas; "generic" belongs to both families. Any name that belongs to neither
// throws, listing the known ones. Defined in gemm.cpp.
const char* forced_kernel(const char* const* family, int count);

// The bf16 GEMM's deepest block of K (gemm_bf16_driver.h), for op(A) = A^T and for op(A) = A:
// a product no deeper is one depth block.
inline constexpr int64_t kBf16KcMaxTrans = 256;
inline constexpr int64_t kBf16KcMaxRows = 1024;

}  // namespace clustr::cpu::gemm_impl
