// The blocked bf16 GEMM driver (core/cpu/gemm_bf16.h), written once and instantiated by each
// kernel file (gemm_bf16_amx.cpp, gemm_bf16_avx512.cpp, gemm_bf16_generic.cpp) so that it is
// compiled for that file's instruction set. Include it only from those files; like
// gemm_driver.h (whose thread grid and buffers it shares) it uses no C++ library templates and
// everything in it has internal linkage.
//
// Both operands are packed into the layout of AMX tiles, which the AVX512-BF16 and generic
// kernels read too. A tile is 16 rows of 64 bytes: 32 bf16.
//   A rowgroup (16 rows of op(A)), for each depth tile t (32 values of k):
//     a[t * 512 + r * 32 + k]             = op(A)[i + r][p0 + 32 t + k]
//   B colgroup (16 columns of op(B)), for each depth tile t, in pairs of k (VNNI layout):
//     b[t * 512 + kp * 32 + c * 2 + h]    = op(B)[p0 + 32 t + 2 kp + h][j + c]
// so that one 32-bit word of A (two consecutive k of a row) meets one 32-bit word of B (the
// same two k of a column): what _tile_dpbf16ps and vdpbf16ps multiply and add. Rows past M,
// columns past N and depths past K are zero. Packing rounds float32 operands to bf16 the way
// vcvtne2ps2bf16 does (nearest even; subnormals become zero), in vector code where the file is
// compiled for AVX512-BF16 and in scalar code otherwise, with the same bits either way.
//
// In a thread's rectangle of C (whole 32 x 32 blocks; gemm_driver.h's thread_grid), outermost
// first:
//   pc: K in blocks of kc <= kKcMax (multiples of 32, the same at every thread count)
//     jc: N in blocks of nc (the packed kc x nc block of op(B) fills at most kBBlockBytes)
//       ib: 32 rows of op(A), packed (2 rowgroups, 64 kc bytes: stays in L1)
//         jb: 32 columns of the packed B block: the kernel's block, 2 x 2 tiles of 16 x 16
// A bf16 operand A that is not transposed needs no packing when its rows are whole rowgroups
// and K is a multiple of 32: its tiles are read where they are (ATiles below, with A's row
// stride), and only the rows of a last partial kernel block are packed.
// A Kernel provides begin() and end() (around a thread's rectangle: AMX loads and releases its
// tile configuration) and
//   template <int RG, int CG> static void block(int64_t ktiles, const ATiles& a,
//                                               const uint16_t* b, const BlockC& c);
// computing the RG x CG tiles of C for one depth block (RG, CG in {1, 2}; colgroup q at
// b + q * ktiles * 512) and storing them as BlockC says.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/cpu/gemm_bf16.h"
#include "core/cpu/gemm_driver.h"

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define CLUSTR_BF16_VECTOR 1
#endif

namespace clustr::cpu::gemm_bf16_impl {
namespace {

using gemm_impl::ceil_div;
using gemm_impl::Grid;
using gemm_impl::min64;
using gemm_impl::round_up;

constexpr int64_t kTileK = 32;       // bf16 values of k in a tile row
constexpr int64_t kTileElems = 512;  // 16 x 32 bf16: one tile, 1 KiB
constexpr int64_t kBlock = 32;       // rows and columns of a kernel block (2 x 2 tiles)
// The depth of a block of K: with op(A) = A^T a 32-row A block is 16 KiB; op(A) = A goes deeper.
constexpr int64_t kKcMax = gemm_impl::kBf16KcMaxTrans;
constexpr int64_t kKcMaxRows = gemm_impl::kBf16KcMaxRows;
constexpr int64_t kMc = 64;          // rows of op(A) packed at a time (32 KiB at kc = 256)
constexpr int64_t kBBlockBytes = 512 * 1024;  // a packed B block: half of a Zen 4 L2
// A C of at least this many bytes has its lines fetched ahead of the stores (a kernel may do
// so): such a C is in memory, not in the caches. A smaller one (full attention's
// tiles of scores, 16-64 KiB) is mostly in L1 or L2, where fetching it again only costs issue
// slots (a 128 x 128 x 32 product 10% slower on Zen 4).
constexpr int64_t kFetchCBytes = 1024 * 1024;
// Operands of at least this many bytes (A and B together) have the lines of their next
// packing fetched ahead, while the kernel works (FetchAhead).
constexpr int64_t kFetchOperandBytes = 1024 * 1024;
// When N takes several B blocks, a thread's packed op(A) for one depth block is kept for all
// of them (packed once, not once per B block) if it fills at most this many bytes.
constexpr int64_t kKeepABytes = 8 * 1024 * 1024;

// Where a kernel block's rowgroups of op(A) are: element k of row r (r < 16) of depth tile t of
// rowgroup g at a[g * gs + t * ts + r * ld + k]. Packed: ld = 32, ts = 512, gs = ktiles * 512;
// read in place from A: ld = lda, ts = 32, gs = 16 lda.
struct ATiles {
  const uint16_t* a;
  int64_t ld, ts, gs;
};

// The results of one kernel block for one depth block, and what to do with them:
//   C = alpha * P + beta * C (+ bias[j] when bias) then ReLU when relu, then 0 where
//   !(mask[i, j] > 0) when mask (or maskb, the same in bf16). beta == 0: C is not read.
// rows x cols of the block are in C (fewer than 32 at its edges), or in cb, the block's first
// element of a bf16 C (then c is null, beta is 0 and there is one depth block: the driver
// never accumulates into a bf16 C). The driver sets beta to 1 and bias to null after the first
// depth block, and relu and mask only for the last one.
struct BlockC {
  float* c;
  int64_t ldc;
  int64_t rows, cols;
  float alpha, beta;
  const float* bias;  // at the block's first column
  bool relu;
  const float* mask;  // at the block's first element
  int64_t ldm;
  uint16_t* cb;              // a bf16 C at the block's first element, or null
  const uint16_t* maskb;     // a bf16 mask at the block's first element, or null
  bool fetch_c;              // C is large enough to be in memory: fetch its lines ahead
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#ifdef CLUSTR_BF16_VECTOR
// The lowest n bits set (n <= 16 for a 16-bit mask, <= 32 for a 32-bit one).
inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}
inline __mmask32 mask32(int64_t n) {
  return n >= 32 ? static_cast<__mmask32>(0xffffffffu) : static_cast<__mmask32>((1u << n) - 1u);
}

// 16 bf16 widened exactly to float32 (a shift: subnormals stay subnormal).
inline __m512 widen16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Columns [j, j + 16) of row r of the block (those < c.cols) from their products p, as BlockC
// says: the AVX-512 kernel finishes its registers with it, the AMX kernel its scratch rows.
inline void finish16(const BlockC& c, int64_t r, int64_t j, __m512 p) {
  const __mmask16 m = mask16(c.cols - j);
  const __m512 zero = _mm512_setzero_ps();
  __m512 v = _mm512_mul_ps(_mm512_set1_ps(c.alpha), p);
  if (c.beta != 0.0f)
    v = _mm512_fmadd_ps(_mm512_set1_ps(c.beta), _mm512_maskz_loadu_ps(m, c.c + r * c.ldc + j), v);
  if (c.bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, c.bias + j));
  if (c.relu) v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), v, zero);
  if (c.mask || c.maskb) {
    const __m512 keep = c.mask ? _mm512_maskz_loadu_ps(m, c.mask + r * c.ldm + j)
                               : widen16(_mm256_maskz_loadu_epi16(m, c.maskb + r * c.ldm + j));
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(keep, zero, _CMP_GT_OQ), v);
  }
  if (c.cb) {
    const __m256i h = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
    _mm256_mask_storeu_epi16(c.cb + r * c.ldc + j, m, h);
    return;
  }
  _mm512_mask_storeu_ps(c.c + r * c.ldc + j, m, v);
}
#endif

#pragma GCC diagnostic pop

// ---- scalar conversions (the packing's scalar path and the generic kernel) -----------------

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// float32 -> bf16 as vcvtne2ps2bf16 does it: zero and subnormal inputs give a signed zero,
// NaN stays NaN (quiet), everything else rounds to nearest even.
inline uint16_t to_bf16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7f800000u) == 0) return static_cast<uint16_t>((u >> 16) & 0x8000u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// bf16 -> float32 as the dot-product instructions read it: subnormals count as zero.
inline float from_bf16(uint16_t h) {
  const uint32_t u = (h & 0x7f80u) == 0 ? static_cast<uint32_t>(h & 0x8000u) << 16
                                         : static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// A bf16 bit pattern widened exactly (subnormals kept): how the epilogue reads a bf16 mask.
inline float exact_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The block's products p (row stride ldp) stored into C as BlockC says: C = alpha p + beta C
// (+ bias), then ReLU (keeping NaN, as math::relu) and the mask (dropping NaN, as
// math::ReluGrad), then rounded when C is bf16.
inline void finish_block(const float* p, int64_t ldp, const BlockC& c) {
#ifdef CLUSTR_BF16_VECTOR
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t j = 0; j < c.cols; j += 16) finish16(c, r, j, _mm512_loadu_ps(p + r * ldp + j));
#else
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t j = 0; j < c.cols; ++j) {
      float v = c.alpha * p[r * ldp + j];
      if (c.beta != 0.0f) v += c.beta * c.c[r * c.ldc + j];
      if (c.bias) v += c.bias[j];
      if (c.relu) v = v < 0.0f ? 0.0f : v;
      if (c.mask && !(c.mask[r * c.ldm + j] > 0.0f)) v = 0.0f;
      if (c.maskb && !(exact_bf16(c.maskb[r * c.ldm + j]) > 0.0f)) v = 0.0f;
      if (c.cb)
        c.cb[r * c.ldc + j] = to_bf16(v);
      else
        c.c[r * c.ldc + j] = v;
    }
#endif
}

// Element idx of an operand as a bf16 bit pattern.
inline uint16_t operand_bf16(const void* base, Operand type, int64_t idx) {
  if (type == Operand::bf16) return static_cast<const uint16_t*>(base)[idx];
  return to_bf16(static_cast<const float*>(base)[idx]);
}

// Bytes per element of an operand.
inline int64_t elem_bytes(Operand type) { return type == Operand::f32 ? 4 : 2; }

inline const char* byte_ptr(const void* base, Operand type, int64_t idx) {
  return static_cast<const char*>(base) + idx * elem_bytes(type);
}

// ---- packing ------------------------------------------------------------------------------

// GCC 12 reports the AVX-512 intrinsics' internal undefined vectors as (maybe) uninitialized
// (a known false positive of its headers; see transpose16).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#ifdef CLUSTR_BF16_VECTOR
// 32 floats (lo: the first 16) -> 32 bf16 in order.
inline __m512i cvt32(__m512 lo, __m512 hi) {
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// n <= 32 consecutive elements of an operand from p as 32 bf16; the rest zero.
inline __m512i load32_bf16(const char* p, Operand type, int64_t n) {
  if (n <= 0) return _mm512_setzero_si512();
  if (type == Operand::bf16) return _mm512_maskz_loadu_epi16(mask32(n), p);
  return cvt32(_mm512_maskz_loadu_ps(mask16(n), p),
               n > 16 ? _mm512_maskz_loadu_ps(mask16(n - 16), p + 64) : _mm512_setzero_ps());
}

// Two rows of an operand, x and y (n <= 16 consecutive elements each; null: a row of zeros),
// as bf16 interleaved word by word: word c = (x[c], y[c]), x in the low half. That is one pair
// of k of a B tile row, and of 16 rows of A^T. A bf16 operand is never widened.
inline __m512i pair16(const char* x, const char* y, Operand type, int64_t n) {
  alignas(64) static const uint16_t kInterleave[32] = {0,  16, 1,  17, 2,  18, 3,  19,
                                                       4,  20, 5,  21, 6,  22, 7,  23,
                                                       8,  24, 9,  25, 10, 26, 11, 27,
                                                       12, 28, 13, 29, 14, 30, 15, 31};
  if (n <= 0) return _mm512_setzero_si512();
  const __mmask16 m = mask16(n);
  __m512i both;
  if (type == Operand::bf16) {
    const __m256i xs = x ? _mm256_maskz_loadu_epi16(m, x) : _mm256_setzero_si256();
    const __m256i ys = y ? _mm256_maskz_loadu_epi16(m, y) : _mm256_setzero_si256();
    both = _mm512_inserti64x4(_mm512_castsi256_si512(xs), ys, 1);
  } else {
    both = cvt32(x ? _mm512_maskz_loadu_ps(m, x) : _mm512_setzero_ps(),
                 y ? _mm512_maskz_loadu_ps(m, y) : _mm512_setzero_ps());
  }
  return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), both);
}

// Transposes 16 x 16 32-bit words (row i in r[i]).
inline void transpose16i(__m512i r[16]) {
  __m512 f[16];
  for (int i = 0; i < 16; ++i) f[i] = _mm512_castsi512_ps(r[i]);
  gemm_impl::transpose16(f);
  for (int i = 0; i < 16; ++i) r[i] = _mm512_castps_si512(f[i]);
}
#endif

// One rowgroup of op(A): rows [i, i + rows) (rows <= 16; the rest zero), depths [p0, p0 + kc),
// into ktiles tiles at dst.
inline void pack_a(const GemmBf16Call& g, int64_t i, int64_t rows, int64_t p0, int64_t kc,
                   int64_t ktiles, uint16_t* dst) {
#ifdef CLUSTR_BF16_VECTOR
  const Operand type = g.a_type;
  if (!g.trans_a) {  // rows of op(A) are rows of A: 32 values of k at a time
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t t = 0; t < ktiles; ++t) {
        const int64_t n = r < rows ? min64(kTileK, kc - t * kTileK) : 0;
        const char* src = byte_ptr(g.A, type, (i + r) * g.lda + p0 + t * kTileK);
        _mm512_store_si512(dst + t * kTileElems + r * kTileK, load32_bf16(src, type, n));
      }
    return;
  }
  // A transposed: pack_a_rows packs it in vector code, across all its rowgroups at once.
#endif
  for (int64_t t = 0; t < ktiles; ++t)
    for (int64_t r = 0; r < 16; ++r)
      for (int64_t k = 0; k < kTileK; ++k) {
        const int64_t p = t * kTileK + k;
        uint16_t v = 0;
        if (r < rows && p < kc)
          v = operand_bf16(g.A, g.a_type, g.trans_a ? (p0 + p) * g.lda + i + r
                                                    : (i + r) * g.lda + p0 + p);
        dst[t * kTileElems + r * kTileK + k] = v;
      }
}

// Rows [i, i + rows) of op(A) as ceil(rows / 16) rowgroups `group` elements apart (the last one
// zero-padded), depths [p0, p0 + kc). op(A) = A^T is packed tile by tile across all the
// rowgroups, so that each of the tile's 32 rows of A is read in one sweep along its columns
// (whole cache lines, in order: the hardware prefetcher follows 32 such streams, not the
// scattered lines of one rowgroup at a time). A rowgroup's tile is 16 pairs of rows of A,
// interleaved into words (pair16), then one 16 x 16 transpose of words: row r of the tile.
inline void pack_a_rows(const GemmBf16Call& g, int64_t i, int64_t rows, int64_t p0, int64_t kc,
                        int64_t ktiles, uint16_t* dst, int64_t group) {
  const int64_t groups = ceil_div(rows, 16);
#ifdef CLUSTR_BF16_VECTOR
  if (g.trans_a) {
    const Operand type = g.a_type;
    const int64_t elem = elem_bytes(type);
    auto row_of = [&](int64_t k, int64_t col) {  // row p0 + k of A from column col, or null
      return k < kc ? byte_ptr(g.A, type, (p0 + k) * g.lda + col) : nullptr;
    };
    for (int64_t t = 0; t < ktiles; ++t) {
      // The next tile's 32 rows of A, this chunk's width of each: they are far apart (a row
      // of A apart), so the hardware prefetcher does not see them coming.
      for (int64_t k = (t + 1) * kTileK; k < (t + 2) * kTileK && k < kc; ++k) {
        const char* row = byte_ptr(g.A, type, (p0 + k) * g.lda + i);
        for (int64_t b = 0; b < rows * elem; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
      }
      for (int64_t q = 0; q < groups; ++q) {
        const int64_t r = min64(16, rows - 16 * q), col = i + 16 * q;
        __m512i w[16];
        for (int64_t kp = 0; kp < 16; ++kp) {
          const int64_t k = t * kTileK + 2 * kp;
          w[kp] = pair16(row_of(k, col), row_of(k + 1, col), type, r);
        }
        transpose16i(w);
        uint16_t* out = dst + q * group + t * kTileElems;
        for (int64_t rr = 0; rr < 16; ++rr) _mm512_store_si512(out + rr * kTileK, w[rr]);
      }
    }
    return;
  }
#endif
  for (int64_t q = 0; q < groups; ++q)
    pack_a(g, i + 16 * q, min64(16, rows - 16 * q), p0, kc, ktiles, dst + q * group);
}

// One colgroup of op(B): columns [j, j + cols) (cols <= 16; the rest zero), depths [p0, p0 +
// kc), into ktiles tiles at dst, in pairs of k.
inline void pack_b(const GemmBf16Call& g, int64_t j, int64_t cols, int64_t p0, int64_t kc,
                   int64_t ktiles, uint16_t* dst) {
#ifdef CLUSTR_BF16_VECTOR
  // B not transposed: pack_b_cols packs it in vector code, across all its colgroups at once.
  if (g.trans_b) {
    // op(B) = B^T: column c of op(B) is row j + c of B, whose 32 consecutive values make the
    // 16 words of that column; a 16 x 16 transpose of words puts them in tile order.
    const Operand type = g.b_type;
    for (int64_t t = 0; t < ktiles; ++t) {
      __m512i w[16];
      const int64_t n = min64(kTileK, kc - t * kTileK);
      for (int64_t c = 0; c < 16; ++c)
        w[c] = c < cols ? load32_bf16(byte_ptr(g.B, type, (j + c) * g.ldb + p0 + t * kTileK),
                                      type, n)
                        : _mm512_setzero_si512();
      transpose16i(w);
      for (int64_t kp = 0; kp < 16; ++kp)
        _mm512_store_si512(dst + t * kTileElems + kp * kTileK, w[kp]);
    }
    return;
  }
#endif
  for (int64_t t = 0; t < ktiles; ++t)
    for (int64_t kp = 0; kp < 16; ++kp)
      for (int64_t c = 0; c < 16; ++c)
        for (int64_t h = 0; h < 2; ++h) {
          const int64_t p = t * kTileK + 2 * kp + h;
          uint16_t v = 0;
          if (c < cols && p < kc)
            v = operand_bf16(g.B, g.b_type, g.trans_b ? (j + c) * g.ldb + p0 + p
                                                      : (p0 + p) * g.ldb + j + c);
          dst[t * kTileElems + kp * kTileK + c * 2 + h] = v;
        }
}

// Columns [j, j + cols) of op(B) as ceil(cols / 16) colgroups `group` elements apart (the last
// zero-padded), depths [p0, p0 + kc). For B not transposed, each pair of rows of B is read in
// one sweep across all the colgroups (rather than 64 bytes of every row per colgroup).
inline void pack_b_cols(const GemmBf16Call& g, int64_t j, int64_t cols, int64_t p0, int64_t kc,
                        int64_t ktiles, uint16_t* dst, int64_t group) {
  const int64_t groups = ceil_div(cols, 16);
#ifdef CLUSTR_BF16_VECTOR
  if (!g.trans_b) {
    const Operand type = g.b_type;
    const int64_t elem = elem_bytes(type);
    for (int64_t t = 0; t < ktiles; ++t)
      for (int64_t kp = 0; kp < 16; ++kp) {
        const int64_t k0 = t * kTileK + 2 * kp, k1 = k0 + 1;
        const char* x_row = k0 < kc ? byte_ptr(g.B, type, (p0 + k0) * g.ldb + j) : nullptr;
        const char* y_row = k1 < kc ? byte_ptr(g.B, type, (p0 + k1) * g.ldb + j) : nullptr;
        // The pair of rows 8 pairs ahead, a line per colgroup: the rows of a deep B (the
        // activations of a weight gradient) come from memory, and this loop does little else.
        const int64_t ahead = k0 + 16;
        const char* x_next = ahead < kc ? byte_ptr(g.B, type, (p0 + ahead) * g.ldb + j) : nullptr;
        const char* y_next =
            ahead + 1 < kc ? byte_ptr(g.B, type, (p0 + ahead + 1) * g.ldb + j) : nullptr;
        for (int64_t q = 0; q < groups; ++q) {
          const int64_t off = 16 * q * elem;
          if (off % 64 == 0) {  // a new line of both rows
            if (x_next) _mm_prefetch(x_next + off, _MM_HINT_T0);
            if (y_next) _mm_prefetch(y_next + off, _MM_HINT_T0);
          }
          _mm512_store_si512(dst + q * group + t * kTileElems + kp * kTileK,
                             pair16(x_row ? x_row + off : nullptr, y_row ? y_row + off : nullptr,
                                    type, min64(16, cols - 16 * q)));
        }
      }
    return;
  }
#endif
  for (int64_t q = 0; q < groups; ++q)
    pack_b(g, j + 16 * q, min64(16, cols - 16 * q), p0, kc, ktiles, dst + q * group);
}

#pragma GCC diagnostic pop

// An element as stored, as a double.
inline double stored_value(float x) { return x; }
inline double stored_value(uint16_t h) { return exact_bf16(h); }

// (GCC 12's false positive on the intrinsics' undefined vectors again: see the packing above.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
template <typename T>
void add_row_sums_typed(const T* a, int64_t lda, bool trans, int64_t rows, int64_t kc,
                        double* sums) {
  if (trans) {  // the rows of op(A) run along A's rows: vectors over r
#ifdef CLUSTR_BF16_VECTOR
    if constexpr (sizeof(T) == 2) {  // bf16: widened 8 at a time (the scalar loop's sums)
      const int64_t whole = rows / 8 * 8;
      for (int64_t p = 0; p < kc; ++p) {
        const T* row = a + p * lda;
        for (int64_t r = 0; r < whole; r += 8) {
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + r));
          const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
          _mm512_storeu_pd(sums + r,
                           _mm512_add_pd(_mm512_loadu_pd(sums + r), _mm512_cvtps_pd(f)));
        }
        for (int64_t r = whole; r < rows; ++r) sums[r] += stored_value(row[r]);
      }
      return;
    }
#endif
    for (int64_t p = 0; p < kc; ++p)
      for (int64_t r = 0; r < rows; ++r) sums[r] += stored_value(a[p * lda + r]);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0.0;
    for (int64_t p = 0; p < kc; ++p) s += stored_value(a[r * lda + p]);
    sums[r] += s;
  }
}

#pragma GCC diagnostic pop

// sums[r] += the sum over k in [p0, p0 + kc) of op(A)[i + r][k] for r < rows, in double (the
// stored values, in the order of k).
inline void add_row_sums(const GemmBf16Call& g, int64_t i, int64_t rows, int64_t p0, int64_t kc,
                         double* sums) {
  const int64_t first = g.trans_a ? p0 * g.lda + i : i * g.lda + p0;
  if (g.a_type == Operand::f32)
    return add_row_sums_typed(static_cast<const float*>(g.A) + first, g.lda, g.trans_a, rows, kc,
                              sums);
  add_row_sums_typed(static_cast<const uint16_t*>(g.A) + first, g.lda, g.trans_a, rows, kc, sums);
}

// A grow-only buffer of bf16 values owned by one thread, 64-byte aligned.
struct Bf16Buffer {
  gemm_impl::PackBuffer floats;  // two bf16 per float
  uint16_t* reserve(int64_t n) {
    return reinterpret_cast<uint16_t*>(floats.reserve(static_cast<size_t>((n + 1) / 2)));
  }
};

// A part of an operand that a later packing reads: `rows` runs of `bytes` bytes, `stride` apart.
struct Region {
  const char* base;
  int64_t rows, bytes, stride;
};

// The source lines of the next packing (the next chunk of op(A), or the next block of op(B)
// and its first chunk of op(A)), fetched into L2 (prefetcht2) a few lines after each kernel
// block of the current chunk, so that the packing finds them there rather than in L3 or
// memory. A weight gradient reads two activations of 1.5-9 MB once each, and its packing
// waits on those loads: on Zen 4 these products ran 4-15% faster on one thread, the others
// within +-3% (docs/PERFORMANCE.md).
struct FetchAhead {
  Region regions[2];
  int count = 0, cur = 0;
  int64_t row = 0;         // the next run of regions[cur] to fetch from
  int64_t per_block = 0;   // lines fetched after each kernel block

  // The lines of a region's first run (the others may straddle one more).
  static int64_t lines(const Region& r) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(r.base);
    return static_cast<int64_t>(((p + r.bytes - 1) >> 6) - (p >> 6) + 1);
  }
  // Fetches the regions (count <= 2, empty ones skipped) over `blocks` kernel blocks.
  void start(const Region* rs, int n, int64_t blocks) {
    count = cur = 0;
    row = 0;
    int64_t total = 0;
    for (int q = 0; q < n; ++q)
      if (rs[q].rows > 0 && rs[q].bytes > 0) {
        regions[count++] = rs[q];
        total += rs[q].rows * lines(rs[q]);  // about: see lines()
      }
    per_block = blocks > 0 ? ceil_div(total, blocks) : 0;
  }
  // Fetches the next whole runs of about per_block lines.
  void step() {
    for (int64_t budget = per_block; budget > 0 && cur < count;) {
      const Region& r = regions[cur];
      const uintptr_t p = reinterpret_cast<uintptr_t>(r.base + row * r.stride);
      for (uintptr_t l = p & ~uintptr_t{63}; l < p + r.bytes; l += 64, --budget)
        __builtin_prefetch(reinterpret_cast<const void*>(l), 0, 1);
      if (++row == r.rows) {
        ++cur;
        row = 0;
      }
    }
  }
};

template <typename Kernel>
void run_block(int rg, int cg, int64_t ktiles, const ATiles& a, const uint16_t* b,
               const BlockC& c) {
  if (rg == 2 && cg == 2) return Kernel::template block<2, 2>(ktiles, a, b, c);
  if (rg == 2) return Kernel::template block<2, 1>(ktiles, a, b, c);
  if (cg == 2) return Kernel::template block<1, 2>(ktiles, a, b, c);
  return Kernel::template block<1, 1>(ktiles, a, b, c);
}

// Rows [i0, i1) x columns [j0, j1) of C (i0, j0 multiples of 32) on the calling thread. With
// row_sums this thread also owns the epilogue's row sums of op(A) for rows [i0, i1).
template <typename Kernel>
void gemm_rect(const GemmBf16Call& g, int64_t kc_max, int64_t i0, int64_t i1, int64_t j0,
               int64_t j1, bool row_sums) {
  int64_t nc_cap = kBBlockBytes / (kc_max * 2) / kBlock * kBlock;
  if (nc_cap < kBlock) nc_cap = kBlock;
  const int64_t nblocks = ceil_div(j1 - j0, nc_cap);
  const int64_t nc_max = round_up(ceil_div(j1 - j0, nblocks), kBlock);
  const int64_t kt_max = ceil_div(kc_max, kTileK);
  // A's tiles read in place (see the top of the file): bf16 rows of A, every depth block whole
  // tiles (kc_max is a multiple of 32, and so is the last block when K is), and rows that do
  // not pile up in a few L1 sets: a row stride that is a multiple of 512 bytes (K = 256, 512,
  // 768 unpadded) puts a tile's 16 rows in 4 sets or fewer, and measured 5-25% slower than
  // packing (K = 192, 384 bytes: 10% faster).
  const bool a_in_place = !g.trans_a && g.a_type == Operand::bf16 && g.K % kTileK == 0 &&
                          (g.lda * 2) % 512 != 0;
  // Several B blocks: the rectangle's rows of op(A), packed as the first B block meets them, are
  // kept for the others (2048^3 repacked A eight times per depth block: 7% of its time on Zen 4).
  // (Read in place, A packs only a last partial block's rows, each time: nothing to keep.)
  const int64_t a_groups = round_up(i1 - i0, kMc) / 16;
  const bool keep_a =
      !a_in_place && nblocks > 1 && a_groups * kt_max * kTileElems * 2 <= kKeepABytes;
  thread_local Bf16Buffer a_buffer, b_buffer;
  uint16_t* a_pack = a_buffer.reserve((keep_a ? a_groups : kMc / 16) * kt_max * kTileElems);
  uint16_t* b_pack = b_buffer.reserve(nc_max / 16 * kt_max * kTileElems);
  thread_local gemm_impl::SumBuffer sum_buffer;
  double* sums = nullptr;
  if (row_sums) {
    sums = sum_buffer.reserve(static_cast<size_t>(i1 - i0));
    for (int64_t r = 0; r < i1 - i0; ++r) sums[r] = 0.0;
  }
  const GemmEpilogue& e = g.epilogue;
  const bool fetch_c = g.M * g.N * (g.C_bf16 ? 2 : 4) >= kFetchCBytes;
  // The operands' lines fetched ahead of their packing: only when they are large enough to be
  // outside L2 (small ones, such as full attention's tiles, are in cache, where fetching
  // them again only costs issue slots).
  const int64_t a_elem = elem_bytes(g.a_type), b_elem = elem_bytes(g.b_type);
  const bool fetch_ahead = g.M * g.K * a_elem + g.K * g.N * b_elem >= kFetchOperandBytes;
  FetchAhead ahead;
  // The source of chunk [ic, ic + mc) of op(A) at depths [p0, p0 + kc), and of the block
  // [jc, jc + nc) of op(B).
  auto a_region = [&](int64_t p0, int64_t kc, int64_t ic, int64_t mc) {
    return g.trans_a ? Region{byte_ptr(g.A, g.a_type, p0 * g.lda + ic), kc, mc * a_elem,
                              g.lda * a_elem}
                     : Region{byte_ptr(g.A, g.a_type, ic * g.lda + p0), mc, kc * a_elem,
                              g.lda * a_elem};
  };
  auto b_region = [&](int64_t p0, int64_t kc, int64_t jc, int64_t nc) {
    return g.trans_b ? Region{byte_ptr(g.B, g.b_type, jc * g.ldb + p0), nc, kc * b_elem,
                              g.ldb * b_elem}
                     : Region{byte_ptr(g.B, g.b_type, p0 * g.ldb + jc), kc, nc * b_elem,
                              g.ldb * b_elem};
  };
  Kernel::begin();
  for (int64_t p0 = 0; p0 < g.K; p0 += kc_max) {
    const int64_t kc = min64(kc_max, g.K - p0), ktiles = ceil_div(kc, kTileK);
    const int64_t group = ktiles * kTileElems;  // one packed rowgroup or colgroup
    const bool first_k = p0 == 0, last_k = p0 + kc >= g.K;
    for (int64_t jc = j0; jc < j1; jc += nc_max) {
      const int64_t nc = min64(nc_max, j1 - jc);
      pack_b_cols(g, jc, nc, p0, kc, ktiles, b_pack, group);
      for (int64_t ic = i0; ic < i1; ic += kMc) {  // kMc rows of op(A) packed at a time
        const int64_t mc = min64(kMc, i1 - ic);
        // In place: the chunk's whole kernel blocks (32 rows); packed: the rows of a last
        // partial block (or all of them), so that no block mixes an in-place rowgroup with a
        // packed one (ATiles has one stride between a block's two rowgroups).
        const int64_t in_place = a_in_place ? mc / kBlock * kBlock : 0;
        uint16_t* a_chunk = keep_a ? a_pack + (ic - i0) / 16 * group : a_pack;
        if (in_place < mc && (!keep_a || jc == j0))
          pack_a_rows(g, ic + in_place, mc - in_place, p0, kc, ktiles, a_chunk, group);
        if (sums && jc == j0) add_row_sums(g, ic, mc, p0, kc, sums + (ic - i0));
        if (fetch_ahead) {  // what the next packing reads (op(A) kept: only the first B block's)
          Region next[2] = {};
          int n = 0;
          if (ic + kMc < i1) {
            if (!keep_a || jc == j0)
              next[n++] = a_region(p0, kc, ic + kMc, min64(kMc, i1 - ic - kMc));
          } else {
            int64_t p1 = p0, j = jc + nc_max;
            if (j >= j1) p1 += kc_max, j = j0;
            if (p1 < g.K) {
              const int64_t kc1 = min64(kc_max, g.K - p1);
              next[n++] = b_region(p1, kc1, j, min64(nc_max, j1 - j));
              if (!keep_a || j == j0) next[n++] = a_region(p1, kc1, i0, min64(kMc, i1 - i0));
            }
          }
          ahead.start(next, n, ceil_div(mc, kBlock) * ceil_div(nc, kBlock));
        }
        for (int64_t ib = ic; ib < ic + mc; ib += kBlock) {
          const int64_t rows = min64(kBlock, ic + mc - ib);
          const bool direct = ib + rows <= ic + in_place;
          const ATiles a =
              direct ? ATiles{static_cast<const uint16_t*>(g.A) + ib * g.lda + p0, g.lda,
                              kTileK, 16 * g.lda}
                     : ATiles{a_chunk + (ib - ic - in_place) / 16 * group, kTileK, kTileElems,
                              group};
          for (int64_t jb = 0; jb < nc; jb += kBlock) {
            const int64_t cols = min64(kBlock, nc - jb);
            const int64_t j = jc + jb;
            BlockC c{g.C ? g.C + ib * g.ldc + j : nullptr,
                     g.ldc,
                     rows,
                     cols,
                     g.alpha,
                     first_k ? g.beta : 1.0f,
                     first_k && e.bias ? e.bias + j : nullptr,
                     last_k && e.relu,
                     last_k && e.mask ? e.mask + ib * e.ldm + j : nullptr,
                     e.ldm,
                     g.C_bf16 ? g.C_bf16 + ib * g.ldc + j : nullptr,
                     last_k && g.mask_bf16 ? g.mask_bf16 + ib * e.ldm + j : nullptr,
                     fetch_c};
            run_block<Kernel>(rows > 16 ? 2 : 1, cols > 16 ? 2 : 1, ktiles, a,
                              b_pack + (jb / 16) * group, c);
            if (fetch_ahead) ahead.step();
          }
        }
      }
    }
  }
  Kernel::end();
  if (sums)
    for (int64_t r = 0; r < i1 - i0; ++r) e.a_row_sums[i0 + r] = static_cast<float>(sums[r]);
}

// One product's threads: the grid of rectangles (whole 32 x 32 blocks) and the depth blocking.
template <typename Kernel>
struct Plan {
  Grid grid{1, 1};
  int64_t kc_max = 0, mblocks = 0, nblocks = 0;

  // False when there is nothing to multiply (the caller handles K == 0 and alpha == 0).
  bool make(const GemmBf16Call& g, int threads) {
    if (g.M == 0 || g.N == 0 || g.K == 0 || g.alpha == 0.0f) return false;
    // Depth blocks of equal size in whole tiles: K = 768 gives three of 256, K = 576 three of
    // 192, K = 17 one of 32 (15 of them zero).
    const int64_t kblocks = ceil_div(g.K, g.trans_a ? kKcMax : kKcMaxRows);
    kc_max = round_up(ceil_div(g.K, kblocks), kTileK);
    mblocks = ceil_div(g.M, kBlock);
    nblocks = ceil_div(g.N, kBlock);
    grid = gemm_impl::thread_grid<kBlock, kBlock>(mblocks, nblocks, threads);
    return true;
  }
  int threads() const { return grid.tm * grid.tn; }

  void run(const GemmBf16Call& g, int tid) const {
    const int64_t ti = tid / grid.tn, tj = tid % grid.tn;
    const int64_t mb0 = ti * mblocks / grid.tm, mb1 = (ti + 1) * mblocks / grid.tm;
    const int64_t nb0 = tj * nblocks / grid.tn, nb1 = (tj + 1) * nblocks / grid.tn;
    gemm_rect<Kernel>(g, kc_max, mb0 * kBlock, min64(g.M, mb1 * kBlock), nb0 * kBlock,
                      min64(g.N, nb1 * kBlock), g.epilogue.a_row_sums && tj == 0);
  }
};

template <typename Kernel>
void gemm_blocked(const GemmBf16Call& g, int nthreads) {
  gemm_impl::run_planned<Plan<Kernel>>(g, nthreads);
}

// Independent products in one parallel region (gemm_driver.h's run_planned_many).
template <typename Kernel>
void gemm_many_blocked(const GemmBf16Call* g, int count, int nthreads) {
  gemm_impl::run_planned_many<Plan<Kernel>>(g, count, nthreads);
}

}  // namespace
}  // namespace clustr::cpu::gemm_bf16_impl
