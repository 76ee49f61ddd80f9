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
//   task (jc, m-chunk), shared by threads: pack B block (kc x nc <= kBBlockFloats; L2)
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

#ifdef __SSE__
#include <xmmintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

// Everything here has internal linkage (anonymous namespace): each ISA file gets its own copy,
// compiled for its own instruction set, and the linker can never mix them up.
namespace clustr::cpu::gemm_impl {
namespace {

// Measured on a Zen 4 core (32 KiB L1, 1 MiB L2); see docs/PERFORMANCE.md.
constexpr int64_t kKcMax = 256;                // depth of a packed block
constexpr int64_t kBBlockFloats = 128 * 1024;  // a packed B block (kc x nc): half of L2
constexpr int64_t kMc = 8192;                  // rows of op(A) packed at once (<= 8 MiB)

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t gcd64(int64_t a, int64_t b) { return b == 0 ? a : gcd64(b, a % b); }


// dst[p][c] (row length W) = src[c * ld + p] for c < cols, 0 for cols <= c < W, p < kc: the
// transposing copy that packs op(A) when A is not transposed and op(B) when B is. Full panels
// move in 4 x 4 blocks through SSE registers (four rows read in step, four output rows written
// whole), which is several times faster than element-by-element strided stores.
template <int W>
void pack_transposed(const float* src, int64_t ld, int64_t cols, int64_t kc, float* dst) {
  int64_t p = 0;
#ifdef __SSE__
  if (cols == W && W % 4 == 0) {
    for (; p + 4 <= kc; p += 4)
      for (int c = 0; c < W; c += 4) {
        const float* s = src + c * ld + p;
        __m128 r0 = _mm_loadu_ps(s), r1 = _mm_loadu_ps(s + ld);
        __m128 r2 = _mm_loadu_ps(s + 2 * ld), r3 = _mm_loadu_ps(s + 3 * ld);
        _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
        float* d = dst + p * W + c;
        _mm_storeu_ps(d, r0);
        _mm_storeu_ps(d + W, r1);
        _mm_storeu_ps(d + 2 * W, r2);
        _mm_storeu_ps(d + 3 * W, r3);
      }
  }
#endif
  for (; p < kc; ++p) {
    for (int64_t c = 0; c < cols; ++c) dst[p * W + c] = src[c * ld + p];
    for (int64_t c = cols; c < W; ++c) dst[p * W + c] = 0.0f;
  }
}

// Packs panels [first, last) of W lines each into dst (panel q at dst + q * W * kc, laid out
// [p][line]). Element (line l, depth p) of the source is src[l * ld + p] when line_major, else
// src[p * ld + l]; lines at or beyond `lines` are zero. For op(A) a line is a row of op(A), for
// op(B) a column.
template <int W>
void pack_panels(const float* src, int64_t ld, bool line_major, int64_t lines, int64_t first,
                 int64_t last, int64_t kc, float* dst) {
  if (line_major) {
    for (int64_t q = first; q < last; ++q)
      pack_transposed<W>(src + q * W * ld, ld, min64(W, lines - q * W), kc, dst + q * W * kc);
    return;
  }
  // Source rows run along the lines: copy a group of panels per source row, so that each row
  // is read in one sequential sweep. (Panel by panel, a large ld that is a multiple of 4 KiB
  // would send every read to the same L1 set.)
  constexpr int64_t kGroup = 8;
  for (int64_t g0 = first; g0 < last; g0 += kGroup) {
    int64_t g1 = min64(last, g0 + kGroup);
    for (int64_t p = 0; p < kc; ++p) {
      const float* row = src + p * ld;
      for (int64_t q = g0; q < g1; ++q) {
        int64_t cols = min64(W, lines - q * W);
        float* d = dst + q * W * kc + p * W;
        for (int64_t c = 0; c < cols; ++c) d[c] = row[q * W + c];
        for (int64_t c = cols; c < W; ++c) d[c] = 0.0f;
      }
    }
  }
}

// A grow-only packing buffer owned by one thread, kept between calls so that repeated GEMMs
// of the same size neither allocate nor fault in fresh pages.
struct PackBuffer {
  float* data = nullptr;
  size_t floats = 0;
  PackBuffer() = default;
  PackBuffer(const PackBuffer&) = delete;
  PackBuffer& operator=(const PackBuffer&) = delete;
  ~PackBuffer() { std::free(data); }
  float* reserve(size_t n) {
    if (n > floats) {
      std::free(data);
      data = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
      floats = data ? n : 0;
      if (!data) throw_out_of_memory(n * sizeof(float));
    }
    return data;
  }
};

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
  int64_t nc_cap = kBBlockFloats / kc_max / NR * NR;
  if (nc_cap < NR) nc_cap = NR;
  int64_t nblocks = ceil_div(g.N, nc_cap);
  int64_t nc_max = round_up(ceil_div(g.N, nblocks), NR);
  nblocks = ceil_div(g.N, nc_max);
  // Split rows too when the column blocks alone would leave threads idle or unbalanced.
  int64_t mb_max = min64(kMc, g.M);
  int64_t mchunks = nthreads / gcd64(nblocks, nthreads);
  mchunks = min64(mchunks, ceil_div(mb_max, MR));
  int64_t tasks = nblocks * mchunks;
  if (tasks < nthreads) nthreads = static_cast<int>(tasks);

  // The calling thread owns the buffers: op(A)'s packed block (shared by the team) and one
  // packed B block per thread, each starting on a cache line.
  int64_t a_floats = round_up(round_up(mb_max, MR) * kc_max, 16);
  int64_t b_stride = round_up(nc_max * kc_max, 16);
  thread_local PackBuffer buffer;
  float* a_pack = buffer.reserve(static_cast<size_t>(a_floats + b_stride * nthreads));
  float* b_packs = a_pack + a_floats;

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
        const float* a_src = g.trans_a ? g.A + p0 * g.lda + i0 : g.A + i0 * g.lda + p0;
        const int64_t a_groups = ceil_div(mpanels, 8);
#pragma omp for schedule(static)
        for (int64_t group = 0; group < a_groups; ++group)
          pack_panels<MR>(a_src, g.lda, !g.trans_a, mb, group * 8, min64(mpanels, group * 8 + 8),
                          kc, a_pack);
        int64_t packed_jc = -1;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < tasks; ++task) {
          int64_t jc = task / mchunks, chunk = task % mchunks;
          int64_t j0 = jc * nc_max, nc = min64(nc_max, g.N - j0);
          int64_t npanels = ceil_div(nc, NR);
          if (jc != packed_jc) {
            const float* b_src = g.trans_b ? g.B + j0 * g.ldb + p0 : g.B + p0 * g.ldb + j0;
            pack_panels<NR>(b_src, g.ldb, g.trans_b, nc, 0, npanels, kc, b_pack);
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
}

}  // namespace
}  // namespace clustr::cpu::gemm_impl
