// The blocked GEMM driver (Goto/BLIS style), written once and instantiated by each
// micro-kernel file (gemm_avx512.cpp, gemm_avx2.cpp, gemm_generic.cpp) so that it is compiled
// for that file's instruction set. Include it only from those files. It uses no C++ library
// templates, so nothing compiled for AVX-512 can be merged into an inline function that a
// plain-x86-64 file also uses.
//
// Row-major C(M,N) += op(A)(M,K) op(B)(K,N). Vectors run along N (rows of B and C), elements of
// A are broadcast. The loops, outermost first:
//   ic: M in blocks of kMc rows          (bounds the packed A block)
//   pc: K in blocks of kc <= kKcMax       (packed A block: MR-row micro-panels, kc deep; L3)
//   task (jc, m-chunk), shared by threads: pack B block (kc x nc, NR-wide micro-panels; L2)
//     ir: MR-row micro-panel of A         (stays in L1 while the jr loop runs)
//       jr: NR-column micro-panel of B    (streams from L2)
//         micro-kernel: MR x NR tile of C, accumulators in registers
// Each C element is computed by one thread with the same kc blocking and the same summation
// order whatever the thread count, so results do not depend on it.
//
// A Kernel provides: static constexpr int MR, NR; and
//   static void tile(int64_t kc, const float* a, const float* b, float* c, int64_t ldc,
//                    float alpha, float beta);
// computing the full MR x NR tile C = alpha * a.b + beta * C (beta == 0: C is not read), with
// a the packed MR x kc micro-panel ([p][MR]) and b the packed kc x NR micro-panel ([p][NR]),
// both aligned to 64 bytes.
#pragma once

#include <cstdint>
#include <cstdlib>

#include "core/cpu/gemm_problem.h"

#ifdef _OPENMP
#include <omp.h>
#endif

// Everything here has internal linkage (anonymous namespace): each ISA file gets its own copy,
// compiled for its own instruction set, and the linker can never mix them up.
namespace clustr::cpu::gemm_impl {
namespace {

constexpr int64_t kKcMax = 256;   // depth of a packed block
constexpr int64_t kNcMax = 512;   // columns of a packed B block: kc x nc floats sit in L2
constexpr int64_t kMc = 8192;     // rows of A packed at once (bounds the buffer to 8 MiB)

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t gcd64(int64_t a, int64_t b) { return b == 0 ? a : gcd64(b, a % b); }


// Packs rows [i0, i0+mb) x depth [p0, p0+kc) of op(A) as MR-row micro-panels:
// dst[panel][p][r] = op(A)[i0 + panel*MR + r][p0 + p], zero beyond row mb.
template <int MR>
void pack_a_panel(const Problem& g, int64_t i0, int64_t mb, int64_t p0, int64_t kc, float* dst) {
  int64_t rows = min64(MR, mb);
  if (g.trans_a) {  // op(A) rows are contiguous along i in the stored K x M matrix
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = g.A + (p0 + p) * g.lda + i0;
      for (int64_t r = 0; r < rows; ++r) dst[p * MR + r] = src[r];
      for (int64_t r = rows; r < MR; ++r) dst[p * MR + r] = 0.0f;
    }
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = g.A + (i0 + r) * g.lda + p0;
      for (int64_t p = 0; p < kc; ++p) dst[p * MR + r] = src[p];
    }
    for (int64_t r = rows; r < MR; ++r)
      for (int64_t p = 0; p < kc; ++p) dst[p * MR + r] = 0.0f;
  }
}

// Packs columns [j0, j0+nb) x depth [p0, p0+kc) of op(B) as NR-column micro-panels:
// dst[panel][p][c] = op(B)[p0 + p][j0 + panel*NR + c], zero beyond column nb.
template <int NR>
void pack_b_panel(const Problem& g, int64_t j0, int64_t nb, int64_t p0, int64_t kc, float* dst) {
  int64_t cols = min64(NR, nb);
  if (!g.trans_b) {  // rows of the stored K x N matrix are contiguous along j
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = g.B + (p0 + p) * g.ldb + j0;
      for (int64_t c = 0; c < cols; ++c) dst[p * NR + c] = src[c];
      for (int64_t c = cols; c < NR; ++c) dst[p * NR + c] = 0.0f;
    }
  } else {
    for (int64_t c = 0; c < cols; ++c) {
      const float* src = g.B + (j0 + c) * g.ldb + p0;
      for (int64_t p = 0; p < kc; ++p) dst[p * NR + c] = src[p];
    }
    for (int64_t c = cols; c < NR; ++c)
      for (int64_t p = 0; p < kc; ++p) dst[p * NR + c] = 0.0f;
  }
}

// One MR x NR tile of C at (i, j) with mv x nv valid elements. Partial tiles at the right and
// bottom edges go through a scratch tile so that the kernels only handle full tiles.
template <typename Kernel>
void run_tile(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
              float beta, int64_t mv, int64_t nv) {
  constexpr int MR = Kernel::MR, NR = Kernel::NR;
  if (mv == MR && nv == NR) return Kernel::tile(kc, a, b, c, ldc, alpha, beta);
  alignas(64) float scratch[MR * NR];
  Kernel::tile(kc, a, b, scratch, NR, alpha, 0.0f);
  for (int64_t r = 0; r < mv; ++r)
    for (int64_t col = 0; col < nv; ++col) {
      float v = scratch[r * NR + col];
      float* out = c + r * ldc + col;
      *out = beta == 0.0f ? v : v + beta * *out;
    }
}

inline void scale_c(const Problem& g) {  // C = beta * C, for K == 0 or alpha == 0
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = 0; j < g.N; ++j) {
      float* c = g.C + i * g.ldc + j;
      *c = g.beta == 0.0f ? 0.0f : g.beta * *c;
    }
}

template <typename Kernel>
void gemm_blocked(const Problem& g, int nthreads) {
  constexpr int MR = Kernel::MR, NR = Kernel::NR;
  if (g.M == 0 || g.N == 0) return;
  if (g.K == 0 || g.alpha == 0.0f) return scale_c(g);

  // Depth blocks of equal size: K = 768 gives three blocks of 256, K = 576 three of 192.
  int64_t kblocks = ceil_div(g.K, kKcMax);
  int64_t kc_max = ceil_div(g.K, kblocks);
  // Column blocks of equal size, multiples of NR; they depend on N only, never on threads.
  int64_t nblocks = ceil_div(g.N, kNcMax);
  int64_t nc_max = round_up(ceil_div(g.N, nblocks), NR);
  nblocks = ceil_div(g.N, nc_max);
  // Split rows too when the column blocks alone would leave threads idle or unbalanced.
  int64_t mb_max = min64(kMc, g.M);
  int64_t mchunks = nthreads / gcd64(nblocks, nthreads);
  mchunks = min64(mchunks, ceil_div(mb_max, MR));
  int64_t tasks = nblocks * mchunks;
  if (tasks < nthreads) nthreads = static_cast<int>(tasks);

  size_t a_bytes = static_cast<size_t>(round_up(mb_max, MR) * kc_max) * sizeof(float);
  size_t b_bytes = static_cast<size_t>(nc_max * kc_max) * sizeof(float);
  float* a_pack = static_cast<float*>(std::aligned_alloc(64, round_up(a_bytes, 64)));
  float* b_packs = static_cast<float*>(std::aligned_alloc(64, round_up(b_bytes, 64) * nthreads));
  if (!a_pack || !b_packs) {
    std::free(a_pack);
    std::free(b_packs);
    throw_out_of_memory(a_bytes + b_bytes * nthreads);
  }
  int64_t b_stride = static_cast<int64_t>(round_up(b_bytes, 64) / sizeof(float));

#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
  {
#ifdef _OPENMP
    int tid = omp_get_thread_num();
#else
    int tid = 0;
#endif
    float* b_pack = b_packs + tid * b_stride;
    for (int64_t i0 = 0; i0 < g.M; i0 += kMc) {
      int64_t mb = min64(kMc, g.M - i0);
      int64_t mpanels = ceil_div(mb, MR);
      int64_t panels_per_chunk = ceil_div(mpanels, mchunks);
      for (int64_t p0 = 0; p0 < g.K; p0 += kc_max) {
        int64_t kc = min64(kc_max, g.K - p0);
        float beta = p0 == 0 ? g.beta : 1.0f;
#pragma omp for schedule(static)
        for (int64_t panel = 0; panel < mpanels; ++panel)
          pack_a_panel<MR>(g, i0 + panel * MR, mb - panel * MR, p0, kc, a_pack + panel * MR * kc);
        int64_t packed_jc = -1;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; ++task) {
          int64_t jc = task / mchunks, chunk = task % mchunks;
          int64_t j0 = jc * nc_max, nc = min64(nc_max, g.N - j0);
          int64_t npanels = ceil_div(nc, NR);
          if (jc != packed_jc) {
            for (int64_t q = 0; q < npanels; ++q)
              pack_b_panel<NR>(g, j0 + q * NR, nc - q * NR, p0, kc, b_pack + q * NR * kc);
            packed_jc = jc;
          }
          int64_t first = chunk * panels_per_chunk;
          int64_t last = min64(mpanels, first + panels_per_chunk);
          for (int64_t ir = first; ir < last; ++ir) {
            int64_t i = i0 + ir * MR;
            int64_t mv = min64(MR, g.M - i);
            const float* a = a_pack + ir * MR * kc;
            for (int64_t q = 0; q < npanels; ++q) {
              int64_t j = j0 + q * NR;
              run_tile<Kernel>(kc, a, b_pack + q * NR * kc, g.C + i * g.ldc + j, g.ldc, g.alpha,
                               beta, mv, min64(NR, g.N - j));
            }
          }
        }
      }
    }
  }
  std::free(a_pack);
  std::free(b_packs);
}

}  // namespace
}  // namespace clustr::cpu::gemm_impl
