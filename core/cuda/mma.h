// Tensor-core building blocks for kernels written against core/cuda/kernel.h: the warp-level
// matrix instructions (ldmatrix, mma.sync) and the asynchronous copies (cp.async) of sm_80 and
// later, as typed fragments and small functions. Under nvcc each is one PTX instruction; in
// device emulation each is its twin in core/cuda/emulation_mma.cpp, which follows the PTX ISA's
// per-lane layouts element by element, so the kernels that use them are tested without a GPU.
//
// Fragments (the registers one lane holds of a warp's 16 x 8 or 16 x 16 tile). In the PTX ISA's
// words, lane l has groupID g = l / 4 and threadID_in_group c = l % 4:
//   FragA  (m16n8k16, bf16, row-major A 16 x 16): x[0] = A[g][2c, 2c+1], x[1] = A[g+8][2c, 2c+1],
//          x[2] = A[g][2c+8, 2c+9], x[3] = A[g+8][2c+8, 2c+9] (two bf16 a register, the lower
//          column in the low half);
//   FragB  (m16n8k16, bf16, B 16 x 8, k down, n across): x[0] = B[2c, 2c+1][g], x[1] =
//          B[2c+8, 2c+9][g];
//   FragC  (the f32 accumulator of a 16 x 8 tile, for both shapes): x[0], x[1] = C[g][2c, 2c+1],
//          x[2], x[3] = C[g+8][2c, 2c+1];
//   FragA8 (m16n8k8, tf32, A 16 x 8): x[0] = A[g][c], x[1] = A[g+8][c], x[2] = A[g][c+4],
//          x[3] = A[g+8][c+4];
//   FragB8 (m16n8k8, tf32, B 8 x 8): x[0] = B[c][g], x[1] = B[c+4][g].
//
// ldmatrix_x4(t, r, row): the warp loads four 8 x 8 matrices of 16-bit elements from shared
// memory; lanes 8i .. 8i+7 give the addresses of matrix i's rows (each 16 bytes, 16-byte
// aligned), and lane l receives r[i] = matrix i's elements (g, 2c) and (g, 2c+1); with _trans,
// the elements (2c, g) and (2c+1, g). x2 uses lanes 0-15's addresses, x1 lanes 0-7's.
// Every lane of the warp calls each of these warp instructions at the same point (a 1-D block
// whose size is a multiple of 32); the emulator checks that, and checks that each row address
// lies in the block's shared memory.
//
// cp_async16(t, dst, src, src_bytes): starts copying 16 bytes from global src to shared dst
// (both 16-byte aligned), of which only the first src_bytes (0 or 16 here) are read and the
// rest are zero-filled. cp_async_commit(t) closes this thread's group of started copies;
// cp_async_wait<n>(t) waits until at most the n newest committed groups are still in flight.
// The data is this thread's to read after the wait, and the block's after the wait and a
// t.sync(). The emulator fills dst with NaN bytes when the copy starts and writes the data at
// the wait, so a missing wait (or barrier) reads NaN; a thread that ends with copies never
// waited for is an error.
//
// Everything here needs sm_80 or later (the host dispatch launches such kernels only there);
// compiled for an older architecture, the device functions trap.
#pragma once

#include <cstdint>

#include "core/bf16.h"
#include "core/cuda/kernel.h"

namespace clustr::cuda::mma {

struct FragA {
  uint32_t x[4];
};
struct FragB {
  uint32_t x[2];
};
struct FragC {
  float x[4];
};
struct FragA8 {
  uint32_t x[4];
};
struct FragB8 {
  uint32_t x[2];
};

// The lane of this thread in its warp (1-D blocks).
CLUSTR_DEVICE unsigned lane(const Thread& t) { return t.thread_idx().x % 32; }
CLUSTR_DEVICE unsigned warp(const Thread& t) { return t.thread_idx().x / 32; }

// Two floats as a bf16 pair (lo in the low half), each rounded to nearest even (core/bf16.h;
// cvt.rn.bf16x2.f32 on the GPU, the same bits for every number but NaN payloads).
CLUSTR_HD uint32_t pack_bf16(float lo, float hi) {
#if defined(__CUDACC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return static_cast<uint32_t>(float_to_bf16(lo)) | (static_cast<uint32_t>(float_to_bf16(hi)) << 16);
#endif
}

// x rounded to TF32 as cvt.rna.tf32.f32 does (to nearest, ties away from zero; 10 mantissa
// bits kept), returned as the float's bits.
CLUSTR_HD uint32_t to_tf32(float x) {
#if defined(__CUDACC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
#else
  const uint32_t u = float_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return u;  // inf and NaN as they are
  return (u + 0x1000u) & 0xffffe000u;              // half of the dropped 13 bits' range up
#endif
}

#if defined(__CUDACC__)

CLUSTR_DEVICE uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define CLUSTR_MMA_UNSUPPORTED() __trap()
#else
#define CLUSTR_MMA_UNSUPPORTED() (void)0
#endif

CLUSTR_DEVICE void ldmatrix_x4(const Thread&, uint32_t (&r)[4], const void* row) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#else
  CLUSTR_MMA_UNSUPPORTED();
#endif
}
CLUSTR_DEVICE void ldmatrix_x4_trans(const Thread&, uint32_t (&r)[4], const void* row) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#else
  CLUSTR_MMA_UNSUPPORTED();
#endif
}
CLUSTR_DEVICE void ldmatrix_x2(const Thread&, uint32_t (&r)[2], const void* row) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row)));
#else
  CLUSTR_MMA_UNSUPPORTED();
#endif
}
CLUSTR_DEVICE void ldmatrix_x2_trans(const Thread&, uint32_t (&r)[2], const void* row) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(shared_address(row)));
#else
  CLUSTR_MMA_UNSUPPORTED();
#endif
}

// d += a b on tensor cores (m16n8k16, bf16 operands, f32 accumulation).
CLUSTR_DEVICE void mma_bf16(const Thread&, FragC& d, const FragA& a, const FragB& b) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
#else
  CLUSTR_MMA_UNSUPPORTED();
#endif
}

// d += a b on tensor cores (m16n8k8, TF32 operands given as float bits, f32 accumulation).
CLUSTR_DEVICE void mma_tf32(const Thread&, FragC& d, const FragA8& a, const FragB8& b) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d.x[0]), "+f"(d.x[1]), "+f"(d.x[2]), "+f"(d.x[3])
      : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
#else
  CLUSTR_MMA_UNSUPPORTED();
#endif
}

CLUSTR_DEVICE void cp_async16(const Thread&, void* dst, const void* src, unsigned src_bytes) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
               :
               : "r"(shared_address(dst)), "l"(src), "r"(src_bytes)
               : "memory");
#else
  CLUSTR_MMA_UNSUPPORTED();
#endif
}
CLUSTR_DEVICE void cp_async_commit(const Thread&) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int kPending>
CLUSTR_DEVICE void cp_async_wait(const Thread&) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

#undef CLUSTR_MMA_UNSUPPORTED

#else  // device emulation: core/cuda/emulation_mma.cpp

inline void ldmatrix_x4(const Thread& t, uint32_t (&r)[4], const void* row,
                        const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  emulation::ldmatrix(t.fibers_, t.kernel_, lane(t), r, row, 4, false, {file, line});
}
inline void ldmatrix_x4_trans(const Thread& t, uint32_t (&r)[4], const void* row,
                              const char* file = __builtin_FILE(),
                              unsigned line = __builtin_LINE()) {
  emulation::ldmatrix(t.fibers_, t.kernel_, lane(t), r, row, 4, true, {file, line});
}
inline void ldmatrix_x2(const Thread& t, uint32_t (&r)[2], const void* row,
                        const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  emulation::ldmatrix(t.fibers_, t.kernel_, lane(t), r, row, 2, false, {file, line});
}
inline void ldmatrix_x2_trans(const Thread& t, uint32_t (&r)[2], const void* row,
                              const char* file = __builtin_FILE(),
                              unsigned line = __builtin_LINE()) {
  emulation::ldmatrix(t.fibers_, t.kernel_, lane(t), r, row, 2, true, {file, line});
}
inline void mma_bf16(const Thread& t, FragC& d, const FragA& a, const FragB& b,
                     const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  emulation::mma(t.fibers_, t.kernel_, emulation::MmaShape::m16n8k16_bf16, d.x, a.x, b.x,
                 {file, line});
}
inline void mma_tf32(const Thread& t, FragC& d, const FragA8& a, const FragB8& b,
                     const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) {
  emulation::mma(t.fibers_, t.kernel_, emulation::MmaShape::m16n8k8_tf32, d.x, a.x, b.x,
                 {file, line});
}
inline void cp_async16(const Thread& t, void* dst, const void* src, unsigned src_bytes) {
  emulation::cp_async(t.fibers_, t.kernel_, dst, src, 16, src_bytes);
}
inline void cp_async_commit(const Thread& t) { emulation::cp_async_commit(t.fibers_, t.kernel_); }
template <int kPending>
inline void cp_async_wait(const Thread& t) {
  emulation::cp_async_wait(t.fibers_, t.kernel_, kPending);
}

#endif

}  // namespace clustr::cuda::mma
