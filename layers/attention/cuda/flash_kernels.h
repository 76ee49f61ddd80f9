// The pieces of the tensor-core attention kernels that the forward (flash_forward.h) and the
// backward (flash_backward.h) share: the exp2, the sequences' lengths, the dropout words, the
// products' arithmetic (the Bf16 and Tf32 policies), the tiles' shapes and the operands of a
// call. flash.cu describes the algorithm; it includes these headers, and only it does.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/mma.h"
#include "core/error.h"
#include "core/math.h"
#include "core/philox.h"
#include "layers/attention/cuda/dropout.h"
#include "layers/attention/cuda/flash.h"

namespace clustr::cuda::flash_kernels {

using attention_kernels::Dropout;
using attention_kernels::dropout_of;
using cpu::FullAttentionDims;
using cpu::FullAttentionLayout;
using cpu::FullAttentionParams;
using mma::FragC;

constexpr int kWarps = 4;
constexpr unsigned kThreads = 32 * kWarps;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;

// 2^x: one ex2.approx on the GPU (within 2 ulp; 2^-inf = 0), exp2 in emulation.
CLUSTR_DEVICE float exp2_fast(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

CLUSTR_DEVICE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
CLUSTR_DEVICE int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// The heads of one tensor on the device: row i of head (b, h) starts at
// base + b batch + h head + i row (cpu::HeadStrides, in elements of T).
template <class T>
struct Heads {
  T* base;
  int64_t batch, head, row;
  CLUSTR_DEVICE T* at(int64_t b, int64_t h) const { return base + b * batch + h * head; }
};
template <class T>
Heads<T> heads_of(T* base, const cpu::HeadStrides& s) {
  return {base, s.batch, s.head, s.row};
}

// The rows of sequence b: keys j < length are valid, query rows i < live see a key (with N == S
// and lengths the rows past the length are padding; with no valid key no row sees one). A
// length outside [0, S] (possible only when the front door's check was deferred to the device,
// which then reports it) is clamped, so no kernel reads past its sequence.
struct Sequence {
  int64_t length, live;
};
CLUSTR_DEVICE Sequence sequence_of(const int32_t* lengths, int64_t b, int64_t N, int64_t S) {
  const int64_t given = lengths ? lengths[b] : S;
  const int64_t length = given < 0 ? 0 : given > S ? S : given;
  return {length, length == 0 ? 0 : (lengths && N == S) ? length : N};
}

// Word k of a Philox block, by selects (an array index the compiler could not resolve would put
// the block in local memory).
CLUSTR_DEVICE uint32_t word(const Philox4& w, uint64_t k) {
  return k == 0 ? w.v[0] : k == 1 ? w.v[1] : k == 2 ? w.v[2] : w.v[3];
}
// Weight element idx and idx + 1 (full_cpu.h's numbering) after dropout: x0, x1 scaled or 0.
CLUSTR_DEVICE void drop_pair(const Dropout& d, uint64_t idx, float& x0, float& x1) {
  const uint64_t block = d.offset.get() + idx / 4;
  const Philox4 w = philox4x32(d.seed, block);
  const uint64_t k = idx % 4;
  const uint32_t w1 = k < 3 ? word(w, k + 1) : philox4x32(d.seed, block + 1).v[0];
  x0 = math::dropout_value(x0, word(w, k), d.p, d.scale);
  x1 = math::dropout_value(x1, w1, d.p, d.scale);
}
// The Philox word of one element.
CLUSTR_DEVICE uint32_t dropout_word(const Dropout& d, uint64_t idx) {
  return word(philox4x32(d.seed, d.offset.get() + idx / 4), idx % 4);
}

CLUSTR_DEVICE void zero(FragC& f) { f.x[0] = f.x[1] = f.x[2] = f.x[3] = 0.0f; }

// ---- the products' arithmetic ----
// A policy gives the operand element in shared memory (Elem), the k of one mma (kK), the padding
// of a tile's rows (kPad elements), the fragment types A and B, and
//   a(t, tile, stride, r0, k0)       the A fragment of rows r0.., columns k0.. of a tile
//   b_rows(t, b0, b1, tile, stride, n0, k0)   B fragments of n-tiles n0.. and n0 + 8.. for the
//                                    k-step k0.., from a tile whose rows are n (B = tile^T)
//   b_cols(t, b0, b1, tile, stride, k0, n0)   the same from a tile whose rows are k (B = tile)
//   c_to_a(c, kk)                    k-step kk of a 16-row accumulator held as C fragments c[],
//                                    as an A fragment: P and dS pass from one product to the
//                                    next in registers
//   mma(t, d, a, b)                  d += a b
// b_cols is only ever paired with c_to_a (the A operand from registers), b_rows with a (from
// shared memory); Tf32 numbers the k of such a pair its own way (below), which the sum ignores.

// bf16 operands, m16n8k16. Rows of D + 8 elements: the 16 bytes of padding put the eight
// 16-byte rows that one ldmatrix matrix reads in eight different groups of four banks.
struct Bf16 {
  using Elem = uint16_t;
  using A = mma::FragA;
  using B = mma::FragB;
  static constexpr int kK = 16, kPad = 8;

  static CLUSTR_DEVICE A a(const Thread& t, const Elem* tile, int stride, int r0, int k0) {
    const unsigned l = mma::lane(t);
    A f;
    mma::ldmatrix_x4(t, f.x, tile + (r0 + l % 16) * stride + k0 + 8 * (l / 16));
    return f;
  }
  static CLUSTR_DEVICE void b_rows(const Thread& t, B& b0, B& b1, const Elem* tile, int stride,
                                   int n0, int k0) {
    const unsigned l = mma::lane(t);
    uint32_t r[4];
    mma::ldmatrix_x4(t, r, tile + (n0 + l % 8 + 8 * (l / 16)) * stride + k0 + 8 * (l / 8 % 2));
    b0 = {{r[0], r[1]}};
    b1 = {{r[2], r[3]}};
  }
  static CLUSTR_DEVICE void b_cols(const Thread& t, B& b0, B& b1, const Elem* tile, int stride,
                                   int k0, int n0) {
    const unsigned l = mma::lane(t);
    uint32_t r[4];
    mma::ldmatrix_x4_trans(t, r, tile + (k0 + l % 16) * stride + n0 + 8 * (l / 16));
    b0 = {{r[0], r[1]}};
    b1 = {{r[2], r[3]}};
  }
  // Columns [16 kk, 16 kk + 16): C tiles 2 kk and 2 kk + 1, rounded to bf16.
  static CLUSTR_DEVICE A c_to_a(const FragC* c, int kk) {
    const FragC &lo = c[2 * kk], &hi = c[2 * kk + 1];
    return {{mma::pack_bf16(lo.x[0], lo.x[1]), mma::pack_bf16(lo.x[2], lo.x[3]),
             mma::pack_bf16(hi.x[0], hi.x[1]), mma::pack_bf16(hi.x[2], hi.x[3])}};
  }
  static CLUSTR_DEVICE void mma(const Thread& t, FragC& d, const A& a, const B& b) {
    mma::mma_bf16(t, d, a, b);
  }
};

// f32 operands through TF32, m16n8k8: kSplit sums three products of heads and tails (f32's
// accuracy to about 2^-21 of each product), otherwise the heads' product alone (cuda::tf32()).
// ldmatrix moves 16-bit pairs, so on f32 rows it gives lane (g, c) the float (g, c) of an 8 x 4
// block: exactly the A and non-transposed B layouts. The transposed B (b_cols) is read float by
// float; there, and in c_to_a, the k-step's k = c stands for column 2c and k = c + 4 for column
// 2c + 1, which puts a C fragment's two columns straight into the A fragment (no shuffle).
// Rows of D + 4 floats: eight rows 4 floats apart modulo the 32 banks.
template <bool kSplit>
struct Tf32 {
  using Elem = float;
  struct A {
    mma::FragA8 hi, lo;
  };
  struct B {
    mma::FragB8 hi, lo;
  };
  static constexpr int kK = 8, kPad = 4;

  static CLUSTR_DEVICE void split(float x, uint32_t& hi, uint32_t& lo) {
    hi = mma::to_tf32(x);
    lo = kSplit ? mma::to_tf32(x - bits_float(hi)) : 0u;
  }
  static CLUSTR_DEVICE A a(const Thread& t, const Elem* tile, int stride, int r0, int k0) {
    const unsigned l = mma::lane(t);
    uint32_t r[4];
    mma::ldmatrix_x4(t, r, tile + (r0 + l % 8 + 8 * (l / 8 % 2)) * stride + k0 + 4 * (l / 16));
    A f;
    for (int i = 0; i < 4; ++i) split(bits_float(r[i]), f.hi.x[i], f.lo.x[i]);
    return f;
  }
  static CLUSTR_DEVICE void b_rows(const Thread& t, B& b0, B& b1, const Elem* tile, int stride,
                                   int n0, int k0) {
    const unsigned l = mma::lane(t);
    uint32_t r[4];
    mma::ldmatrix_x4(t, r, tile + (n0 + l % 8 + 8 * (l / 16)) * stride + k0 + 4 * (l / 8 % 2));
    split(bits_float(r[0]), b0.hi.x[0], b0.lo.x[0]);
    split(bits_float(r[1]), b0.hi.x[1], b0.lo.x[1]);
    split(bits_float(r[2]), b1.hi.x[0], b1.lo.x[0]);
    split(bits_float(r[3]), b1.hi.x[1], b1.lo.x[1]);
  }
  static CLUSTR_DEVICE void b_cols(const Thread& t, B& b0, B& b1, const Elem* tile, int stride,
                                   int k0, int n0) {
    const unsigned l = mma::lane(t), g = l / 4, c = l % 4;
    const Elem* p = tile + (k0 + 2 * c) * stride + n0 + g;
    split(p[0], b0.hi.x[0], b0.lo.x[0]);
    split(p[stride], b0.hi.x[1], b0.lo.x[1]);
    split(p[8], b1.hi.x[0], b1.lo.x[0]);
    split(p[stride + 8], b1.hi.x[1], b1.lo.x[1]);
  }
  static CLUSTR_DEVICE A c_to_a(const FragC* c, int kk) {
    const FragC& f = c[kk];
    A a;
    split(f.x[0], a.hi.x[0], a.lo.x[0]);  // (g, 2c): k = c
    split(f.x[2], a.hi.x[1], a.lo.x[1]);  // (g + 8, 2c)
    split(f.x[1], a.hi.x[2], a.lo.x[2]);  // (g, 2c + 1): k = c + 4
    split(f.x[3], a.hi.x[3], a.lo.x[3]);  // (g + 8, 2c + 1)
    return a;
  }
  static CLUSTR_DEVICE void mma(const Thread& t, FragC& d, const A& a, const B& b) {
    if (kSplit) {  // the small terms first
      mma::mma_tf32(t, d, a.lo, b.hi);
      mma::mma_tf32(t, d, a.hi, b.lo);
    }
    mma::mma_tf32(t, d, a.hi, b.hi);
  }
};

// Shared-memory tiles of rows of D operand elements, kStride = D + kPad apart.
template <class Math, int D>
struct Tile {
  using Elem = typename Math::Elem;
  static constexpr int kStride = D + Math::kPad;
  static constexpr size_t bytes(int rows) { return size_t(rows) * kStride * sizeof(Elem); }
  // cp.async rows [0, rows) from src (row r at src + r src_row), rows >= valid zero-filled
  // (their source is not read). Every thread of the block takes part; the copies join its open
  // group.
  static CLUSTR_DEVICE void load(const Thread& t, Elem* dst, const Elem* src, int64_t src_row,
                                 int rows, int valid) {
    constexpr int kPer = 16 / sizeof(Elem), kChunks = D / kPer;  // 16-byte chunks a row
    for (int e = static_cast<int>(t.thread_idx().x); e < rows * kChunks; e += kThreads) {
      const int r = e / kChunks, k = e % kChunks;
      const bool ok = r < valid;
      mma::cp_async16(t, dst + r * kStride + kPer * k, ok ? src + r * src_row + kPer * k : src,
                      ok ? 16u : 0u);
    }
  }
};

// The tile sizes of a policy and head size. Forward: kMT 16-row tiles a warp (Bq = 64 kMT) and
// key tiles of kBk. Backward: key blocks of 64 keys against query tiles of kBt, query blocks
// of 64 rows against key tiles of kBt. Smaller tiles where the accumulators or the shared
// memory (f32 rows are twice as long) would not fit.
template <class Math, int D>
struct Shape {
  static constexpr bool kWide = sizeof(typename Math::Elem) == 4;
  static constexpr int kMT = kWide || D == 128 ? 1 : 2;
  static constexpr int kBk = kWide && D == 128 ? 32 : 64;
  static constexpr int kBt = kWide && D == 128 ? 16 : kWide || D == 128 ? 32 : 64;
};

// What both directions read: the operands (bf16 copies or the f32 inputs) and the masks.
template <class Elem>
struct Operands {
  Heads<const Elem> q, k, v, o;  // o: dout (backward only)
  const int32_t* lengths;        // (B) or null
  int64_t H, N, S;
  float scale_log2;  // temperature log2(e)
  bool causal;
  Dropout drop;
};

}  // namespace clustr::cuda::flash_kernels
