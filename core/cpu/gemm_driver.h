// The blocked GEMM driver (Goto/BLIS style), written once and instantiated by each
// micro-kernel file (gemm_avx512.cpp, gemm_avx2.cpp, gemm_generic.cpp) so that it is compiled
// for that file's instruction set. Include it only from those files. It uses no C++ library
// templates, so nothing compiled for AVX-512 can be merged into an inline function that a
// plain-x86-64 file also uses.
//
// Row-major C(M,N) += op(A)(M,K) op(B)(K,N). Vectors run along N (rows of B and C), elements of
// A are broadcast. The threads split C into rectangles (a grid of tm x tn, whole micro-panels
// each) and each computes its own with no synchronisation until the end. (Sharing one packed
// block of op(A) among threads costs two barriers per depth block: the weight gradients of a
// layer, K = B N = 2048 deep, have eight.) In a rectangle, outermost first:
//   pc: K in blocks of kc <= kKcMax       (the same blocks at every thread count)
//     jc: N in blocks of nc               (the kc x nc block of op(B): half of L2)
//       ir: MR-row micro-panel of op(A)   (stays in L1 while the jr loop runs)
//         jr: NR-column micro-panel of op(B)  (streams from L2)
//           micro-kernel: MR x NR tile of C, accumulators in registers
// Each C element is computed by one thread with the same kc blocking and the same summation
// order whatever the thread count, so results do not depend on it.
//
// Operands are read in place where the kernel can stream them: op(A)'s micro-panel is MR rows
// of A (A not transposed: MR row streams, kc <= 256 floats each, which stay in L1) or MR
// consecutive elements of each of kc rows (A transposed); op(B)'s is NR consecutive elements
// of each of kc rows of B (B not transposed). Only op(B) of a transposed B (which needs the
// transpose) and micro-panels cut by the edge of C (which would read past the operand; packed
// with zeros) are copied into packed panels. Copying costs a pass over each operand per GEMM
// that the kernel does not need: in a transformer layer's step the operands come from memory
// rather than cache, and the packing took 15% of the step.
//
// A Kernel provides: static constexpr int MR, NR; and
//   template <int R> static void tile(int64_t kc, const APanel& a, const BPanel& b, float* c,
//                                     int64_t ldc, float alpha, float beta,
//                                     const TileEpilogue& ep);
// computing the full R x NR tile C = alpha * a.b + beta * C (beta == 0: C is not read), then
// applying ep (gemm.h's epilogue, cut to the tile) to the registers before they are stored.
// R is MR, or MR / 3 and 2 MR / 3 for the last rows of C when MR is a multiple of 3 (see
// edge_rows).
#pragma once

#include <cstdint>
#include <cstdlib>

#include "core/cpu/gemm_problem.h"

#ifdef __AVX512F__
#include <immintrin.h>
#elif defined(__SSE__)
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
constexpr int64_t kKcMax = 256;                // depth of a block
constexpr int64_t kBBlockFloats = 128 * 1024;  // a B block (kc x nc): half of L2

// A micro-panel of op(A) as the kernel reads it: element (r, p), r < MR, p < kc, at
// a[r * rs + p * cs]. Packed: rs = 1, cs = MR. A^T in place: rs = 1, cs = lda. A's own rows in
// place: rs = lda, cs = 1.
struct APanel {
  const float* a;
  int64_t rs, cs;
};
// A micro-panel of op(B): element (p, j), j < NR, at b[p * ld + j]. Packed: ld = NR.
struct BPanel {
  const float* b;
  int64_t ld;
};

// The part of the epilogue (gemm.h) that applies to one tile and one depth block: the bias
// (first block only) at the tile's NR columns, ReLU and the mask (last block only) at its
// MR x NR elements. Null / false: not applied.
struct TileEpilogue {
  const float* bias = nullptr;
  bool relu = false;
  const float* mask = nullptr;
  int64_t ldm = 0;
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

#ifdef __AVX512F__
// GCC 12 reports the unpack intrinsics' internal _mm512_undefined_ps as maybe uninitialized
// (a known false positive of its AVX-512 headers; -Wuninitialized where it is inlined into a
// caller that GCC can see whole).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// Transposes the 16 x 16 block in r (row i in r[i]) in place: 4 rounds of 16 shuffles.
inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 4; ++j) {
      t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0x88);
      t[8 * i + j + 4] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
}
#pragma GCC diagnostic pop
#endif

// dst[p][c] (row length W) = src[c * ld + p] for c < cols, 0 for cols <= c < W, p < kc: the
// transposing copy that packs op(B) when B is transposed (and edge panels of op(A)). Full
// panels move in 16 x 16 blocks through AVX-512 registers where the file is compiled for it,
// else in 4 x 4 blocks through SSE registers (rows read in step, output rows written whole),
// which is several times faster than element-by-element strided stores.
template <int W>
void pack_transposed(const float* src, int64_t ld, int64_t cols, int64_t kc, float* dst) {
  int64_t p = 0;
#ifdef __AVX512F__
  if (cols == W && W % 16 == 0) {
    for (; p + 16 <= kc; p += 16)
      for (int c = 0; c < W; c += 16) {
        __m512 r[16];
        for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + (c + i) * ld + p);
        transpose16(r);
        for (int i = 0; i < 16; ++i) _mm512_storeu_ps(dst + (p + i) * W + c, r[i]);
      }
  }
#endif
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

// The epilogue of C's element (i, j) given its value v = alpha op(A) op(B) + beta C.
inline float epilogue_value(const GemmEpilogue& ep, int64_t i, int64_t j, float v) {
  if (ep.bias) v += ep.bias[j];
  if (ep.relu) v = v < 0.0f ? 0.0f : v;
  if (ep.mask && !(ep.mask[i * ep.ldm + j] > 0.0f)) v = 0.0f;
  return v;
}

// A grow-only buffer of doubles owned by one thread (the row sums of op(A)).
struct SumBuffer {
  double* data = nullptr;
  size_t n = 0;
  SumBuffer() = default;
  SumBuffer(const SumBuffer&) = delete;
  SumBuffer& operator=(const SumBuffer&) = delete;
  ~SumBuffer() { std::free(data); }
  double* reserve(size_t count) {
    if (count > n) {
      std::free(data);
      data = static_cast<double*>(std::malloc(count * sizeof(double)));
      n = data ? count : 0;
      if (!data) throw_out_of_memory(count * sizeof(double));
    }
    return data;
  }
};

// One R x NR tile of C at (i, j) for the depth block [p0, p0 + kc): R = MR but for an edge
// panel, which runs the kernel's narrower variant when one covers it (see edge_rows). Tiles cut
// by the right or bottom edge of C go through a scratch tile, so that the kernels only handle
// full tiles.
template <typename Kernel, int R>
void run_tile(int64_t kc, const APanel& a, const BPanel& b, const Problem& g, int64_t i,
              int64_t j, float beta, bool first_k, bool last_k) {
  constexpr int MR = Kernel::MR, NR = Kernel::NR;
  const int64_t mv = min64(R, g.M - i), nv = min64(NR, g.N - j);
  const GemmEpilogue& e = g.epilogue;
  float* c = g.C + i * g.ldc + j;
  if (mv == R && nv == NR) {
    TileEpilogue ep;
    if (first_k && e.bias) ep.bias = e.bias + j;
    if (last_k) {
      ep.relu = e.relu;
      if (e.mask) ep.mask = e.mask + i * e.ldm + j, ep.ldm = e.ldm;
    }
    return Kernel::template tile<R>(kc, a, b, c, g.ldc, g.alpha, beta, ep);
  }
  alignas(64) float scratch[MR * NR];
  Kernel::template tile<R>(kc, a, b, scratch, NR, g.alpha, 0.0f, TileEpilogue{});
  GemmEpilogue edge{};  // the parts of the epilogue that this depth block applies
  if (first_k) edge.bias = e.bias;
  if (last_k) edge.relu = e.relu, edge.mask = e.mask, edge.ldm = e.ldm;
  const bool any = edge.bias || edge.relu || edge.mask;
  for (int64_t r = 0; r < mv; ++r) {
    const float* v = scratch + r * NR;
    float* out = c + r * g.ldc;
    if (beta == 0.0f)
      for (int64_t col = 0; col < nv; ++col) out[col] = v[col];
    else
      for (int64_t col = 0; col < nv; ++col) out[col] = v[col] + beta * out[col];
    if (any)
      for (int64_t col = 0; col < nv; ++col)
        out[col] = epilogue_value(edge, i + r, j + col, out[col]);
  }
}

// The kernel rows for an edge panel of mv < MR rows: MR / 3 or 2 MR / 3 when that covers mv
// (kernels whose MR is a multiple of 3 have those variants), else MR. Short sequences meet
// this all the time: attention over N = 64 positions is 64 = 5 x 12 + 4 rows, and the last
// panel would otherwise cost a full 12-row tile.
template <int MR>
constexpr int edge_rows(int64_t mv) {
  if (MR % 3 == 0 && mv <= MR / 3) return MR / 3;
  if (MR % 3 == 0 && mv <= 2 * MR / 3) return 2 * MR / 3;
  return MR;
}

// Where the B micro-panels of a block are: B's own rows from b_src (row stride ldb), except
// the panels in b_pack (all of them when op(B) was transposed, else only a last one cut by
// C's right edge).
struct BBlock {
  const float* b_src;
  int64_t ldb;
  const float* b_pack;
  int64_t first_packed;  // panels q >= first_packed are in b_pack
  BPanel panel(int64_t q, int64_t NR, int64_t kc) const {
    return q >= first_packed ? BPanel{b_pack + q * NR * kc, NR} : BPanel{b_src + q * NR, ldb};
  }
};

// The tiles of one A micro-panel (R rows) against the npanels B micro-panels of a block.
template <typename Kernel, int R>
void run_panel(int64_t kc, const APanel& a, const BBlock& b, int64_t npanels, const Problem& g,
               int64_t i, int64_t j0, float beta, bool first_k, bool last_k) {
  constexpr int NR = Kernel::NR;
  for (int64_t q = 0; q < npanels; ++q)
    run_tile<Kernel, R>(kc, a, b.panel(q, NR, kc), g, i, j0 + q * NR, beta, first_k, last_k);
}

// C = beta * C (+ epilogue), and the row sums of op(A), for K == 0 or alpha == 0.
inline void scale_c(const Problem& g) {
  for (int64_t i = 0; i < g.M; ++i)
    for (int64_t j = 0; j < g.N; ++j) {
      float* c = g.C + i * g.ldc + j;
      *c = epilogue_value(g.epilogue, i, j, g.beta == 0.0f ? 0.0f : g.beta * *c);
    }
  if (g.epilogue.a_row_sums)
    for (int64_t i = 0; i < g.M; ++i) {
      double sum = 0.0;
      for (int64_t p = 0; p < g.K; ++p) sum += g.trans_a ? g.A[p * g.lda + i] : g.A[i * g.lda + p];
      g.epilogue.a_row_sums[i] = static_cast<float>(sum);
    }
}

// How the threads split C: a grid of tm x tn rectangles of whole micro-panels.
struct Grid {
  int tm, tn;
};

// The grid for `threads` threads over mpanels x npanels micro-panels (MR x NR elements): the
// one whose largest rectangle is smallest; on a tie, split the operand that each rectangle
// then packs in part (splitting M makes every thread pack all of the B block, K x N, and
// splitting N all of the A block, M x K). Fewer threads when there are fewer panels.
template <int MR, int NR>
Grid thread_grid(int64_t mpanels, int64_t npanels, int threads) {
  Grid best{1, 1};
  int64_t best_area = -1;
  for (int t = threads; t >= 1 && best_area < 0; --t)
    for (int tm = 1; tm <= t; ++tm) {
      if (t % tm != 0 || tm > mpanels || t / tm > npanels) continue;
      const int tn = t / tm;
      const int64_t area = ceil_div(mpanels, tm) * MR * ceil_div(npanels, tn) * NR;
      const bool tie_prefers_m = npanels * NR <= mpanels * MR;
      if (best_area < 0 || area < best_area ||
          (area == best_area && (tie_prefers_m ? tm > best.tm : tm < best.tm))) {
        best = {tm, tn};
        best_area = area;
      }
    }
  return best;
}

// sums[r] += the sum over p < kc of the micro-panel's element (r, p), r < mv; the block's
// part is summed first, in double.
template <int MR>
void add_row_sums(const APanel& a, int64_t kc, int64_t mv, double* sums) {
  double acc[MR] = {};
  if (a.rs == 1 && mv == MR) {  // MR consecutive elements per step (dY^T): vectors along r
    for (int64_t p = 0; p < kc; ++p)
      for (int r = 0; r < MR; ++r) acc[r] += a.a[p * a.cs + r];
  } else {  // only the mv rows that exist in a narrow edge panel
    for (int64_t r = 0; r < mv; ++r)
      for (int64_t p = 0; p < kc; ++p) acc[r] += a.a[r * a.rs + p * a.cs];
  }
  for (int64_t r = 0; r < mv; ++r) sums[r] += acc[r];
}

// Rows [i0, i1) x columns [j0, j1) of C (i0 and j0 multiples of MR and NR) on the calling
// thread, with its own packing buffers. kc_max: the depth blocking. With `row_sums`, this
// thread also owns the epilogue's row sums of op(A) for rows [i0, i1): each A micro-panel is
// added up right after the kernels used it (from L1), in the order of k.
template <typename Kernel>
void gemm_rect(const Problem& g, int64_t kc_max, int64_t i0, int64_t i1, int64_t j0,
               int64_t j1, bool row_sums) {
  constexpr int MR = Kernel::MR, NR = Kernel::NR;
  // Column blocks of equal size, multiples of NR, that fill half of L2 at most.
  int64_t nc_cap = kBBlockFloats / kc_max / NR * NR;
  if (nc_cap < NR) nc_cap = NR;
  const int64_t nblocks = ceil_div(j1 - j0, nc_cap);
  const int64_t nc_max = round_up(ceil_div(j1 - j0, nblocks), NR);
  const int64_t mpanels = ceil_div(i1 - i0, MR);
  thread_local PackBuffer a_buffer, b_buffer;
  float* a_edge = a_buffer.reserve(static_cast<size_t>(MR * kc_max));
  float* b_pack = b_buffer.reserve(static_cast<size_t>(nc_max * kc_max));
  thread_local SumBuffer sum_buffer;
  double* sums = nullptr;
  if (row_sums) {
    sums = sum_buffer.reserve(static_cast<size_t>(i1 - i0));
    for (int64_t r = 0; r < i1 - i0; ++r) sums[r] = 0.0;
  }
  for (int64_t p0 = 0; p0 < g.K; p0 += kc_max) {
    const int64_t kc = min64(kc_max, g.K - p0);
    const bool first_k = p0 == 0, last_k = p0 + kc >= g.K;  // for beta and the epilogue
    const float beta = first_k ? g.beta : 1.0f;
    for (int64_t jc = j0; jc < j1; jc += nc_max) {
      const int64_t nc = min64(nc_max, j1 - jc), npanels = ceil_div(nc, NR);
      const bool b_cut = nc % NR != 0;  // the last panel is cut by C's right edge
      const float* b_src = g.trans_b ? g.B + jc * g.ldb + p0 : g.B + p0 * g.ldb + jc;
      if (g.trans_b)
        pack_panels<NR>(b_src, g.ldb, true, nc, 0, npanels, kc, b_pack);
      else if (b_cut)
        pack_panels<NR>(b_src, g.ldb, false, nc, npanels - 1, npanels, kc, b_pack);
      const BBlock b{b_src, g.ldb, b_pack, g.trans_b ? 0 : b_cut ? npanels - 1 : npanels};
      for (int64_t ir = 0; ir < mpanels; ++ir) {
        const int64_t i = i0 + ir * MR, mv = min64(MR, g.M - i);
        const int rows = edge_rows<MR>(mv);
        APanel a;
        if (mv == rows) {  // every row the kernel reads is in A
          a = g.trans_a ? APanel{g.A + p0 * g.lda + i, 1, g.lda}
                        : APanel{g.A + i * g.lda + p0, g.lda, 1};
        } else {  // cut by C's bottom edge: packed, with zero rows
          const float* a_src = g.trans_a ? g.A + p0 * g.lda + i : g.A + i * g.lda + p0;
          pack_panels<MR>(a_src, g.lda, !g.trans_a, mv, 0, 1, kc, a_edge);
          a = APanel{a_edge, 1, MR};
        }
        if (rows == MR)
          run_panel<Kernel, MR>(kc, a, b, npanels, g, i, jc, beta, first_k, last_k);
        else if (rows == 2 * MR / 3)
          run_panel<Kernel, 2 * MR / 3>(kc, a, b, npanels, g, i, jc, beta, first_k, last_k);
        else
          run_panel<Kernel, MR / 3>(kc, a, b, npanels, g, i, jc, beta, first_k, last_k);
        if (sums && jc == j0) add_row_sums<MR>(a, kc, min64(MR, g.M - i), sums + (i - i0));
      }
    }
  }
  if (sums)
    for (int64_t r = 0; r < i1 - i0; ++r)
      g.epilogue.a_row_sums[i0 + r] = static_cast<float>(sums[r]);
}

// One product's threads: its grid, the depth blocking and its panel counts.
template <typename Kernel>
struct Plan {
  Grid grid{1, 1};
  int64_t kc_max = 0, mpanels = 0, npanels = 0;

  // Plans g on at most `threads` threads; false when there is nothing to multiply (then C is
  // already done: scaled by beta, or untouched when it is empty).
  bool make(const Problem& g, int threads) {
    if (g.M == 0 || g.N == 0) return false;
    if (g.K == 0 || g.alpha == 0.0f) {
      scale_c(g);
      return false;
    }
    // Depth blocks of equal size: K = 768 gives three blocks of 256, K = 576 three of 192.
    const int64_t kblocks = ceil_div(g.K, kKcMax);
    kc_max = ceil_div(g.K, kblocks);
    mpanels = ceil_div(g.M, Kernel::MR);
    npanels = ceil_div(g.N, Kernel::NR);
    grid = thread_grid<Kernel::MR, Kernel::NR>(mpanels, npanels, threads);
    return true;
  }
  int threads() const { return grid.tm * grid.tn; }

  // Thread tid's rectangle (balanced shares of whole panels).
  void run(const Problem& g, int tid) const {
    constexpr int MR = Kernel::MR, NR = Kernel::NR;
    const int64_t ti = tid / grid.tn, tj = tid % grid.tn;
    const int64_t mp0 = ti * mpanels / grid.tm, mp1 = (ti + 1) * mpanels / grid.tm;
    const int64_t np0 = tj * npanels / grid.tn, np1 = (tj + 1) * npanels / grid.tn;
    // The threads of one row of the grid share the rows of op(A): the first adds them up.
    gemm_rect<Kernel>(g, kc_max, mp0 * MR, min64(g.M, mp1 * MR), np0 * NR,
                      min64(g.N, np1 * NR), g.epilogue.a_row_sums && tj == 0);
  }
};

inline int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// One product on its plan's threads (a plan type PlanT provides make(g, threads), threads()
// and run(g, tid); the f32 driver's Plan here, the bf16 driver's in gemm_bf16_driver.h).
template <typename PlanT, typename ProblemT>
void run_planned(const ProblemT& g, int nthreads) {
  PlanT plan;
  if (!plan.make(g, nthreads)) return;
  if (plan.threads() == 1)  // no parallel region at all: even a team of one costs a syscall
    return plan.run(g, 0);
#pragma omp parallel num_threads(plan.threads())
  plan.run(g, thread_id());
}

// Independent products in one parallel region: each product is cut into the rectangles it
// would have on all the threads, and the threads take the rectangles of all products in turn,
// so that each does a share of every product. (A fork and join costs a wake-up of the sleeping
// threads, and a layer's backward has pairs of products, dX and dW, of the same size. Giving
// each product a thread of its own was slower: the two kinds run at different speeds.) Each C
// is what run_planned would give, whoever computes its rectangles.
template <typename PlanT, typename ProblemT>
void run_planned_many(const ProblemT* g, int count, int nthreads) {
  constexpr int kMax = 4;
  if (count > kMax || nthreads == 1) {
    for (int c = 0; c < count; ++c) run_planned<PlanT>(g[c], nthreads);
    return;
  }
  PlanT plan[kMax];
  int first[kMax + 1];  // product c's rectangles are pieces [first[c], first[c + 1])
  first[0] = 0;
  for (int c = 0; c < count; ++c)
    first[c + 1] = first[c] + (plan[c].make(g[c], nthreads) ? plan[c].threads() : 0);
  const int pieces = first[count];
#pragma omp parallel for schedule(dynamic) num_threads(nthreads) if (pieces > 1)
  for (int piece = 0; piece < pieces; ++piece)
    for (int c = 0; c < count; ++c)
      if (piece < first[c + 1]) {
        plan[c].run(g[c], piece - first[c]);
        break;
      }
}

template <typename Kernel>
void gemm_blocked(const Problem& g, int nthreads) {
  run_planned<Plan<Kernel>>(g, nthreads);
}

template <typename Kernel>
void gemm_many_blocked(const Problem* g, int count, int nthreads) {
  run_planned_many<Plan<Kernel>>(g, count, nthreads);
}

}  // namespace
}  // namespace clustr::cpu::gemm_impl
