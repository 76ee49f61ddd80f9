// Full attention on tensor cores (flash.h gives the contract): FlashAttention-2's forward and
// backward (Dao 2023, Algorithms 1 and 2) written against core/cuda/kernel.h and the fragments of
// core/cuda/mma.h, so the same code runs on a GPU and in device emulation.
//
// Legend: B batch, H heads, N queries, S keys, D = E = M the head size; a warp's tile is 16
// rows; Bq query rows and Bk keys of a block or tile; g = lane / 4, c = lane % 4 (mma.h).
//
// Counting first (one (b, h), N = S, forward): 4 N^2 D flops on tensor cores (Q K^T and P V) and
// N^2 exponentials; memory: Q, K, V read once per query block from L2 (N / Bq passes over K and
// V), out written once. At N = 16384, D = 64, H = 6: 412 GFLOP, on an H100's ~660 dense bf16
// TFLOP/s (mma.sync reaches ~70% of it) about 0.9 ms; K and V in bf16 are 12 MiB, read 128
// times from L2 at Bq = 128: 1.6 GB, ~0.3 ms at L2's ~5 TB/s. Backward: 2.5 times the forward's
// flops in FlashAttention-2's count, 3.5 times here (dQ has its own pass, which recomputes
// Q K^T and dO V^T: the price of having no float atomics).
//
// The products' arithmetic is a policy (Bf16, Tf32 below): bf16 operands on m16n8k16, or f32
// operands on m16n8k8 in TF32, each operand split into a TF32 head and a TF32 tail and three
// products summed (3xTF32: f32's accuracy, the tail of the tail aside, at half the bf16 rate
// over three) or, with cuda::tf32() on, the heads only. bf16 reads bf16 copies of the operands
// (made by the launch before); f32 reads the operands in place, in any head layout.
//
// Forward (FlashForward, one block of 4 warps per query block of Bq = 16 kMT x 4 rows and
// (b, h); each warp owns kMT 16-row tiles): key tiles K_j, V_j of Bk rows stream through two
// shared buffers each by cp.async (the next K_j while this tile's softmax runs, V_j while
// S_j = Q K_j^T is formed). Online softmax in base 2: x = t s log2(e), the running row max m and
// each thread's share of the row sum l, rescaled by 2^(m_old - m_new); P's accumulator fragments
// turn into A fragments in registers for O += P V_j. At the end O / l and
// lse = (m + log2 l) ln 2. Masked keys (lengths, causal) get x = -inf; a row that sees no key
// ends with l = 0: out 0 and lse -inf.
//
// Backward: one grid of two kinds of blocks, both 4 warps. A key block (64 keys, 16 a warp)
// walks the query tiles that can see its keys (from its first key on when causal), recomputes
// S^T = K Q_i^T and P^T = 2^(x - lse log2 e) from the saved logsumexp, dP^T = V dO_i^T,
// dS^T = P^T (dP^T keep / (1 - p) - D) and accumulates dV += (P^T keep / (1 - p)) dO_i and
// dK += dS^T Q_i in registers, written once at the end. A query block (64 rows) walks the key
// tiles its rows see, recomputes S and dP the same way and accumulates dQ += dS K_j. Each
// output element has one writer, so there is no atomic and no N x S buffer. D_i = dO_i . O_i
// (in double) comes from the launch before.
//
// Dropout: the mask of weight (b, h, i, j) is full_cpu.h's Philox word, regenerated where the
// weight is (the forward and the query blocks draw a block of four words for two neighbouring
// keys; the key blocks, whose neighbours are queries S apart, one block per weight).
#include "layers/attention/cuda/flash.h"

#include <cmath>
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/mma.h"
#include "core/error.h"
#include "core/math.h"
#include "core/philox.h"
#include "layers/attention/cuda/dropout.h"

namespace clustr::cuda {

namespace {

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

// ---- forward ----

template <class Math, int D>
struct FlashForward {
  static constexpr bool kUsesBarrier = true;
  using T = Tile<Math, D>;
  using Elem = typename Math::Elem;
  static constexpr int kMT = Shape<Math, D>::kMT, kBk = Shape<Math, D>::kBk;
  static constexpr int kBq = 16 * kMT * kWarps, kSteps = D / Math::kK, kStride = T::kStride;
  static constexpr size_t kShared = T::bytes(kBq + 4 * kBk);  // Q, K x 2, V x 2

  Operands<Elem> a;
  Heads<float> out;
  float* lse;        // (B, H, N)
  int64_t q_blocks;  // per (b, h)

  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t block = t.block_idx().x, bh = block / q_blocks, b = bh / a.H, h = bh % a.H;
    const int64_t i0 = block % q_blocks * kBq;
    const Sequence sq = sequence_of(a.lengths, b, a.N, a.S);
    const int rows = static_cast<int>(min64(kBq, a.N - i0));
    const int live = static_cast<int>(max64(0, min64(sq.live - i0, rows)));
    const unsigned tid = t.thread_idx().x, l = mma::lane(t), w = mma::warp(t);
    const unsigned g = l / 4, c = l % 4;
    float* out_head = out.at(b, h);
    float* lse_head = lse + bh * a.N;
    if (live == 0) {  // no row of the block sees a key (the same for every thread)
      for (int e = static_cast<int>(tid); e < rows * D; e += kThreads)
        out_head[(i0 + e / D) * out.row + e % D] = 0.0f;
      for (int r = static_cast<int>(tid); r < rows; r += kThreads) lse_head[i0 + r] = -INFINITY;
      return;
    }
    // The keys the block's last live row sees: the last row sees the most.
    const int64_t keys = math::attention_keys_seen(i0 + live - 1, sq.length, a.causal);
    const int tiles = static_cast<int>((keys + kBk - 1) / kBk);
    Elem* sQ = t.shared<Elem>();
    Elem* sK = sQ + kBq * kStride;
    Elem* sV = sK + 2 * kBk * kStride;
    const Elem* k_head = a.k.at(b, h);
    const Elem* v_head = a.v.at(b, h);
    T::load(t, sQ, a.q.at(b, h) + i0 * a.q.row, a.q.row, kBq, rows);
    T::load(t, sK, k_head, a.k.row, kBk, static_cast<int>(min64(kBk, keys)));
    mma::cp_async_commit(t);

    FragC acc[kMT][D / 8];
    float m[kMT][2], lsum[kMT][2];
    CLUSTR_UNROLL
    for (int mt = 0; mt < kMT; ++mt) {
      CLUSTR_UNROLL
      for (int n = 0; n < D / 8; ++n) zero(acc[mt][n]);
      m[mt][0] = m[mt][1] = -INFINITY;
      lsum[mt][0] = lsum[mt][1] = 0.0f;
    }
    for (int j = 0; j < tiles; ++j) {
      const int64_t j0 = int64_t(j) * kBk;
      const int valid = static_cast<int>(min64(kBk, keys - j0));
      const Elem* kt = sK + (j % 2) * kBk * kStride;
      Elem* vt = sV + (j % 2) * kBk * kStride;
      T::load(t, vt, v_head + j0 * a.v.row, a.v.row, kBk, valid);
      mma::cp_async_commit(t);
      mma::cp_async_wait<1>(t);  // Q and K_j are in; V_j may still be on its way
      t.sync();
      // S = Q K_j^T (16 kMT rows x kBk keys a warp).
      FragC s[kMT][kBk / 8];
      CLUSTR_UNROLL
      for (int mt = 0; mt < kMT; ++mt)
        CLUSTR_UNROLL
        for (int n = 0; n < kBk / 8; ++n) zero(s[mt][n]);
      CLUSTR_UNROLL
      for (int kk = 0; kk < kSteps; ++kk) {
        typename Math::A qa[kMT];
        CLUSTR_UNROLL
        for (int mt = 0; mt < kMT; ++mt)
          qa[mt] = Math::a(t, sQ, kStride, (static_cast<int>(w) * kMT + mt) * 16, Math::kK * kk);
        CLUSTR_UNROLL
        for (int np = 0; np < kBk / 16; ++np) {
          typename Math::B b0, b1;
          Math::b_rows(t, b0, b1, kt, kStride, 16 * np, Math::kK * kk);
          CLUSTR_UNROLL
          for (int mt = 0; mt < kMT; ++mt) {
            Math::mma(t, s[mt][2 * np], qa[mt], b0);
            Math::mma(t, s[mt][2 * np + 1], qa[mt], b1);
          }
        }
      }
      // K_{j+1} into the other buffer (read by S_{j-1}, which every warp finished before the
      // barrier above); an empty group when this is the last tile.
      if (j + 1 < tiles)
        T::load(t, sK + ((j + 1) % 2) * kBk * kStride, k_head + (j0 + kBk) * a.k.row, a.k.row,
                kBk, static_cast<int>(min64(kBk, keys - j0 - kBk)));
      mma::cp_async_commit(t);
      // Online softmax over this tile, each of the thread's rows g and g + 8 of each m-tile.
      CLUSTR_UNROLL
      for (int mt = 0; mt < kMT; ++mt)
        CLUSTR_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int r = (static_cast<int>(w) * kMT + mt) * 16 + static_cast<int>(g) + 8 * hf;
          const int64_t i = i0 + r;
          const int64_t seen = r < live ? math::attention_keys_seen(i, sq.length, a.causal) : 0;
          float top = -INFINITY;
          CLUSTR_UNROLL
          for (int n = 0; n < kBk / 8; ++n)
            CLUSTR_UNROLL
            for (int e = 0; e < 2; ++e) {
              const int64_t col = j0 + 8 * n + 2 * c + e;
              float& x = s[mt][n].x[2 * hf + e];
              x = col < seen ? x * a.scale_log2 : -INFINITY;
              top = top > x ? top : x;
            }
          top = math::Maximum{}(top, t.shfl_xor(top, 1));
          top = math::Maximum{}(top, t.shfl_xor(top, 2));
          const float m_new = m[mt][hf] > top ? m[mt][hf] : top;
          const float base = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: every p is 0
          const float alpha = exp2_fast(m[mt][hf] - base);
          m[mt][hf] = m_new;
          float sum = 0.0f;
          CLUSTR_UNROLL
          for (int n = 0; n < kBk / 8; ++n) {
            float& x0 = s[mt][n].x[2 * hf];
            float& x1 = s[mt][n].x[2 * hf + 1];
            x0 = exp2_fast(x0 - base);
            x1 = exp2_fast(x1 - base);
            sum += x0 + x1;
            if (a.drop.on())
              drop_pair(a.drop, math::attention_dropout_index(bh, a.N, i, a.S, j0 + 8 * n + 2 * c),
                        x0, x1);
          }
          lsum[mt][hf] = lsum[mt][hf] * alpha + sum;
          CLUSTR_UNROLL
          for (int n = 0; n < D / 8; ++n) {
            acc[mt][n].x[2 * hf] *= alpha;
            acc[mt][n].x[2 * hf + 1] *= alpha;
          }
        }
      mma::cp_async_wait<1>(t);  // V_j is in; K_{j+1} may still be on its way
      t.sync();
      // O += P V_j.
      CLUSTR_UNROLL
      for (int kk = 0; kk < kBk / Math::kK; ++kk) {
        typename Math::A p[kMT];
        CLUSTR_UNROLL
        for (int mt = 0; mt < kMT; ++mt) p[mt] = Math::c_to_a(s[mt], kk);
        CLUSTR_UNROLL
        for (int np = 0; np < D / 16; ++np) {
          typename Math::B b0, b1;
          Math::b_cols(t, b0, b1, vt, kStride, Math::kK * kk, 16 * np);
          CLUSTR_UNROLL
          for (int mt = 0; mt < kMT; ++mt) {
            Math::mma(t, acc[mt][2 * np], p[mt], b0);
            Math::mma(t, acc[mt][2 * np + 1], p[mt], b1);
          }
        }
      }
    }
    mma::cp_async_wait<0>(t);
    // out = O / l, lse = (m + log2 l) ln 2; a row with l = 0 saw no key: 0 and -inf.
    CLUSTR_UNROLL
    for (int mt = 0; mt < kMT; ++mt)
      CLUSTR_UNROLL
      for (int hf = 0; hf < 2; ++hf) {
        float total = lsum[mt][hf];
        total += t.shfl_xor(total, 1);
        total += t.shfl_xor(total, 2);
        const int r = (static_cast<int>(w) * kMT + mt) * 16 + static_cast<int>(g) + 8 * hf;
        if (r >= rows) continue;
        const int64_t i = i0 + r;
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        float* row = out_head + i * out.row;
        CLUSTR_UNROLL
        for (int n = 0; n < D / 8; ++n) {
          row[8 * n + 2 * c] = acc[mt][n].x[2 * hf] * inv;
          row[8 * n + 2 * c + 1] = acc[mt][n].x[2 * hf + 1] * inv;
        }
        if (c == 0) lse_head[i] = total > 0.0f ? m[mt][hf] * kLn2 + logf(total) : -INFINITY;
      }
  }
};

// ---- backward ----

template <class Math, int D>
struct FlashBackward {
  static constexpr bool kUsesBarrier = true;
  using T = Tile<Math, D>;
  using Elem = typename Math::Elem;
  static constexpr int kSteps = D / Math::kK, kStride = T::kStride;
  static constexpr int kKeys = 64, kRows = 64, kBqt = Shape<Math, D>::kBt, kBkt = kBqt;
  static constexpr size_t kKeyShared =
      T::bytes(2 * kKeys + 4 * kBqt) + 4 * kBqt * sizeof(float);  // K, V, (Q, dO) x 2, lse, D
  static constexpr size_t kRowShared = T::bytes(2 * kRows + 4 * kBkt);  // Q, dO, (K, V) x 2
  static constexpr size_t kShared = kKeyShared > kRowShared ? kKeyShared : kRowShared;

  Operands<Elem> a;
  const float* lse;    // (B, H, N)
  const float* delta;  // D_i (B, H, N)
  Heads<float> dq, dk, dv;
  float temperature;
  int64_t key_blocks, row_blocks;  // per (b, h)

  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t per_head = key_blocks + row_blocks;
    const int64_t bh = t.block_idx().x / per_head, r = t.block_idx().x % per_head;
    if (r < key_blocks)
      key_block(t, bh, r * kKeys);
    else
      row_block(t, bh, (r - key_blocks) * kRows);
  }

  // dK and dV of keys [j0, j0 + 64).
  CLUSTR_DEVICE void key_block(const Thread& t, int64_t bh, int64_t j0) const {
    const int64_t b = bh / a.H, h = bh % a.H;
    const Sequence sq = sequence_of(a.lengths, b, a.N, a.S);
    const int key_rows = static_cast<int>(min64(kKeys, a.S - j0));
    const unsigned tid = t.thread_idx().x, l = mma::lane(t), w = mma::warp(t);
    const unsigned g = l / 4, c = l % 4;
    float* dk_head = dk.at(b, h);
    float* dv_head = dv.at(b, h);
    // Query tiles [first, last) can see these keys: from the tile of query j0 when causal.
    const int64_t first = a.causal ? j0 / kBqt : 0;
    const int64_t last = (sq.live + kBqt - 1) / kBqt;
    if (j0 >= sq.length || first >= last) {  // no query sees them: no gradient
      for (int e = static_cast<int>(tid); e < key_rows * D; e += kThreads) {
        dk_head[(j0 + e / D) * dk.row + e % D] = 0.0f;
        dv_head[(j0 + e / D) * dv.row + e % D] = 0.0f;
      }
      return;
    }
    Elem* sK = t.shared<Elem>();
    Elem* sV = sK + kKeys * kStride;
    Elem* sQ = sV + kKeys * kStride;    // two buffers of kBqt rows
    Elem* sO = sQ + 2 * kBqt * kStride;  // dO, two buffers
    float* sL = reinterpret_cast<float*>(sO + 2 * kBqt * kStride);  // lse log2(e), two
    float* sD = sL + 2 * kBqt;                                       // D, two
    const int valid_keys = static_cast<int>(min64(kKeys, sq.length - j0));
    T::load(t, sK, a.k.at(b, h) + j0 * a.k.row, a.k.row, kKeys, valid_keys);
    T::load(t, sV, a.v.at(b, h) + j0 * a.v.row, a.v.row, kKeys, valid_keys);
    // Query tile qt into buffer `buf`: rows, their lse (in base 2) and D; rows past live are
    // masked below, so what they hold does not matter (zeros).
    auto issue = [&](int64_t qt, int buf) {
      const int64_t i0 = qt * kBqt;
      const int n = static_cast<int>(min64(kBqt, a.N - i0));
      T::load(t, sQ + buf * kBqt * kStride, a.q.at(b, h) + i0 * a.q.row, a.q.row, kBqt, n);
      T::load(t, sO + buf * kBqt * kStride, a.o.at(b, h) + i0 * a.o.row, a.o.row, kBqt, n);
      for (int e = static_cast<int>(tid); e < kBqt; e += kThreads) {
        sL[buf * kBqt + e] = e < n ? lse[bh * a.N + i0 + e] * kLog2e : 0.0f;
        sD[buf * kBqt + e] = e < n ? delta[bh * a.N + i0 + e] : 0.0f;
      }
      mma::cp_async_commit(t);
    };
    issue(first, 0);
    FragC dk_acc[D / 8], dv_acc[D / 8];
    CLUSTR_UNROLL
    for (int n = 0; n < D / 8; ++n) {
      zero(dk_acc[n]);
      zero(dv_acc[n]);
    }
    const int r0 = 16 * static_cast<int>(w);  // the warp's keys in the block
    for (int64_t qt = first; qt < last; ++qt) {
      const int buf = static_cast<int>((qt - first) % 2);
      if (qt + 1 < last)
        issue(qt + 1, 1 - buf);
      else
        mma::cp_async_commit(t);
      mma::cp_async_wait<1>(t);
      t.sync();
      const Elem* qtile = sQ + buf * kBqt * kStride;
      const Elem* otile = sO + buf * kBqt * kStride;
      // S^T = K Q_i^T and dP^T = V dO_i^T (16 keys x kBqt queries a warp).
      FragC st[kBqt / 8], dpt[kBqt / 8];
      CLUSTR_UNROLL
      for (int n = 0; n < kBqt / 8; ++n) {
        zero(st[n]);
        zero(dpt[n]);
      }
      CLUSTR_UNROLL
      for (int kk = 0; kk < kSteps; ++kk) {
        const typename Math::A ka = Math::a(t, sK, kStride, r0, Math::kK * kk);
        const typename Math::A va = Math::a(t, sV, kStride, r0, Math::kK * kk);
        CLUSTR_UNROLL
        for (int np = 0; np < kBqt / 16; ++np) {
          typename Math::B b0, b1;
          Math::b_rows(t, b0, b1, qtile, kStride, 16 * np, Math::kK * kk);
          Math::mma(t, st[2 * np], ka, b0);
          Math::mma(t, st[2 * np + 1], ka, b1);
          Math::b_rows(t, b0, b1, otile, kStride, 16 * np, Math::kK * kk);
          Math::mma(t, dpt[2 * np], va, b0);
          Math::mma(t, dpt[2 * np + 1], va, b1);
        }
      }
      // P^T, and dS^T = P^T (dP^T keep / (1 - p) - D); st becomes P^T keep / (1 - p).
      const int64_t i0 = qt * kBqt;
      CLUSTR_UNROLL
      for (int n = 0; n < kBqt / 8; ++n)
        CLUSTR_UNROLL
        for (int x = 0; x < 4; ++x) {
          const int64_t key = j0 + r0 + g + 8 * (x / 2);
          const int col = 8 * n + 2 * static_cast<int>(c) + x % 2;
          const int64_t i = i0 + col;
          const bool seen = i < sq.live && key < math::attention_keys_seen(i, sq.length, a.causal);
          const float p =
              seen ? exp2_fast(st[n].x[x] * a.scale_log2 - sL[buf * kBqt + col]) : 0.0f;
          float pd = p, dp = dpt[n].x[x];
          if (a.drop.on()) {
            const uint32_t bits =
                dropout_word(a.drop, math::attention_dropout_index(bh, a.N, i, a.S, key));
            pd = math::dropout_value(p, bits, a.drop.p, a.drop.scale);
            dp = math::dropout_value(dp, bits, a.drop.p, a.drop.scale);
          }
          st[n].x[x] = pd;
          dpt[n].x[x] = math::softmax_dx(p, dp, sD[buf * kBqt + col]);
        }
      // dV += Pd^T dO_i, dK += dS^T Q_i.
      CLUSTR_UNROLL
      for (int kk = 0; kk < kBqt / Math::kK; ++kk) {
        const typename Math::A pa = Math::c_to_a(st, kk), da = Math::c_to_a(dpt, kk);
        CLUSTR_UNROLL
        for (int np = 0; np < D / 16; ++np) {
          typename Math::B b0, b1;
          Math::b_cols(t, b0, b1, otile, kStride, Math::kK * kk, 16 * np);
          Math::mma(t, dv_acc[2 * np], pa, b0);
          Math::mma(t, dv_acc[2 * np + 1], pa, b1);
          Math::b_cols(t, b0, b1, qtile, kStride, Math::kK * kk, 16 * np);
          Math::mma(t, dk_acc[2 * np], da, b0);
          Math::mma(t, dk_acc[2 * np + 1], da, b1);
        }
      }
      t.sync();  // every warp is done with this buffer before the next round refills it
    }
    mma::cp_async_wait<0>(t);
    CLUSTR_UNROLL
    for (int x = 0; x < 4; x += 2) {
      const int key = r0 + static_cast<int>(g) + 8 * (x / 2);
      if (key >= key_rows) continue;
      float* krow = dk_head + (j0 + key) * dk.row;
      float* vrow = dv_head + (j0 + key) * dv.row;
      CLUSTR_UNROLL
      for (int n = 0; n < D / 8; ++n) {
        krow[8 * n + 2 * c] = dk_acc[n].x[x] * temperature;
        krow[8 * n + 2 * c + 1] = dk_acc[n].x[x + 1] * temperature;
        vrow[8 * n + 2 * c] = dv_acc[n].x[x];
        vrow[8 * n + 2 * c + 1] = dv_acc[n].x[x + 1];
      }
    }
  }

  // dQ of query rows [i0, i0 + 64).
  CLUSTR_DEVICE void row_block(const Thread& t, int64_t bh, int64_t i0) const {
    const int64_t b = bh / a.H, h = bh % a.H;
    const Sequence sq = sequence_of(a.lengths, b, a.N, a.S);
    const int rows = static_cast<int>(min64(kRows, a.N - i0));
    const int live = static_cast<int>(max64(0, min64(sq.live - i0, rows)));
    const unsigned tid = t.thread_idx().x, l = mma::lane(t), w = mma::warp(t);
    const unsigned g = l / 4, c = l % 4;
    float* dq_head = dq.at(b, h);
    if (live == 0) {
      for (int e = static_cast<int>(tid); e < rows * D; e += kThreads)
        dq_head[(i0 + e / D) * dq.row + e % D] = 0.0f;
      return;
    }
    const int64_t keys = math::attention_keys_seen(i0 + live - 1, sq.length, a.causal);
    const int tiles = static_cast<int>((keys + kBkt - 1) / kBkt);
    Elem* sQ = t.shared<Elem>();
    Elem* sO = sQ + kRows * kStride;
    Elem* sK = sO + kRows * kStride;  // two buffers of kBkt rows
    Elem* sV = sK + 2 * kBkt * kStride;
    const Elem* k_head = a.k.at(b, h);
    const Elem* v_head = a.v.at(b, h);
    T::load(t, sQ, a.q.at(b, h) + i0 * a.q.row, a.q.row, kRows, rows);
    T::load(t, sO, a.o.at(b, h) + i0 * a.o.row, a.o.row, kRows, rows);
    auto issue = [&](int jt, int buf) {
      const int64_t j0 = int64_t(jt) * kBkt;
      const int valid = static_cast<int>(min64(kBkt, keys - j0));
      T::load(t, sK + buf * kBkt * kStride, k_head + j0 * a.k.row, a.k.row, kBkt, valid);
      T::load(t, sV + buf * kBkt * kStride, v_head + j0 * a.v.row, a.v.row, kBkt, valid);
      mma::cp_async_commit(t);
    };
    issue(0, 0);
    // The thread's rows g and g + 8 of the warp's 16: which keys they see, lse and D.
    const int r0 = 16 * static_cast<int>(w);
    int64_t seen[2];
    float lse2[2], dd[2];
    CLUSTR_UNROLL
    for (int hf = 0; hf < 2; ++hf) {
      const int r = r0 + static_cast<int>(g) + 8 * hf;
      const int64_t i = i0 + r;
      seen[hf] = r < live ? math::attention_keys_seen(i, sq.length, a.causal) : 0;
      lse2[hf] = r < live ? lse[bh * a.N + i] * kLog2e : 0.0f;
      dd[hf] = r < live ? delta[bh * a.N + i] : 0.0f;
    }
    FragC acc[D / 8];
    CLUSTR_UNROLL
    for (int n = 0; n < D / 8; ++n) zero(acc[n]);
    for (int jt = 0; jt < tiles; ++jt) {
      const int buf = jt % 2;
      if (jt + 1 < tiles)
        issue(jt + 1, 1 - buf);
      else
        mma::cp_async_commit(t);
      mma::cp_async_wait<1>(t);
      t.sync();
      const Elem* ktile = sK + buf * kBkt * kStride;
      const Elem* vtile = sV + buf * kBkt * kStride;
      FragC s[kBkt / 8], dp[kBkt / 8];
      CLUSTR_UNROLL
      for (int n = 0; n < kBkt / 8; ++n) {
        zero(s[n]);
        zero(dp[n]);
      }
      CLUSTR_UNROLL
      for (int kk = 0; kk < kSteps; ++kk) {
        const typename Math::A qa = Math::a(t, sQ, kStride, r0, Math::kK * kk);
        const typename Math::A oa = Math::a(t, sO, kStride, r0, Math::kK * kk);
        CLUSTR_UNROLL
        for (int np = 0; np < kBkt / 16; ++np) {
          typename Math::B b0, b1;
          Math::b_rows(t, b0, b1, ktile, kStride, 16 * np, Math::kK * kk);
          Math::mma(t, s[2 * np], qa, b0);
          Math::mma(t, s[2 * np + 1], qa, b1);
          Math::b_rows(t, b0, b1, vtile, kStride, 16 * np, Math::kK * kk);
          Math::mma(t, dp[2 * np], oa, b0);
          Math::mma(t, dp[2 * np + 1], oa, b1);
        }
      }
      // dS = P (dP keep / (1 - p) - D), into s.
      const int64_t j0 = int64_t(jt) * kBkt;
      CLUSTR_UNROLL
      for (int n = 0; n < kBkt / 8; ++n)
        CLUSTR_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int64_t key = j0 + 8 * n + 2 * c;
          float p[2], d2[2];
          CLUSTR_UNROLL
          for (int e = 0; e < 2; ++e) {
            p[e] = key + e < seen[hf] ? exp2_fast(s[n].x[2 * hf + e] * a.scale_log2 - lse2[hf])
                                      : 0.0f;
            d2[e] = dp[n].x[2 * hf + e];
          }
          if (a.drop.on()) {
            const int64_t i = i0 + r0 + g + 8 * hf;
            drop_pair(a.drop, math::attention_dropout_index(bh, a.N, i, a.S, key), d2[0], d2[1]);
          }
          CLUSTR_UNROLL
          for (int e = 0; e < 2; ++e) s[n].x[2 * hf + e] = math::softmax_dx(p[e], d2[e], dd[hf]);
        }
      // dQ += dS K_j.
      CLUSTR_UNROLL
      for (int kk = 0; kk < kBkt / Math::kK; ++kk) {
        const typename Math::A da = Math::c_to_a(s, kk);
        CLUSTR_UNROLL
        for (int np = 0; np < D / 16; ++np) {
          typename Math::B b0, b1;
          Math::b_cols(t, b0, b1, ktile, kStride, Math::kK * kk, 16 * np);
          Math::mma(t, acc[2 * np], da, b0);
          Math::mma(t, acc[2 * np + 1], da, b1);
        }
      }
      t.sync();  // every warp is done with this buffer before the next round refills it
    }
    mma::cp_async_wait<0>(t);
    CLUSTR_UNROLL
    for (int hf = 0; hf < 2; ++hf) {
      const int r = r0 + static_cast<int>(g) + 8 * hf;
      if (r >= rows) continue;
      float* row = dq_head + (i0 + r) * dq.row;
      CLUSTR_UNROLL
      for (int n = 0; n < D / 8; ++n) {
        row[8 * n + 2 * c] = acc[n].x[2 * hf] * temperature;
        row[8 * n + 2 * c + 1] = acc[n].x[2 * hf + 1] * temperature;
      }
    }
  }
};

// ---- the bf16 copies and D ----

// Up to four f32 tensors of heads (laid out as their Heads say) into contiguous bf16 heads,
// four elements a thread at a time; with out and dout, also D_i = dout_i . out_i (in double,
// one row a thread) for every row of (B, H, N). One grid-stride loop over all of it.
struct Prepare {
  static constexpr bool kUsesBarrier = false;
  Heads<const float> src[4];
  uint16_t* dst[4];
  int64_t rows[4];  // per head: N or S
  int count;
  int64_t B, H, D, N;
  Heads<const float> out, dout;  // out.base null: no D
  float* delta;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t per_row = D / 4;
    int64_t total = 0;
    for (int k = 0; k < count; ++k) total += B * H * rows[k] * per_row;
    const int64_t n_rows = out.base ? B * H * N : 0;
    for (int64_t e = global_x(t); e < total + n_rows; e += grid_stride_x(t)) {
      if (e >= total) {  // D of row (bh, i)
        const int64_t row = e - total, bh = row / N, i = row % N;
        const float* x = out.at(bh / H, bh % H) + i * out.row;
        const float* y = dout.at(bh / H, bh % H) + i * dout.row;
        double acc = 0.0;
        for (int64_t m = 0; m < D; ++m) acc += double(x[m]) * y[m];
        delta[row] = static_cast<float>(acc);
        continue;
      }
      int64_t u = e;
      int k = 0;
      while (u >= B * H * rows[k] * per_row) u -= B * H * rows[k++] * per_row;
      const int64_t chunk = u % per_row, row = u / per_row, i = row % rows[k], bh = row / rows[k];
      const float* x = src[k].at(bh / H, bh % H) + i * src[k].row + 4 * chunk;
      uint16_t* y = dst[k] + row * D + 4 * chunk;
      for (int m = 0; m < 4; ++m) y[m] = float_to_bf16(x[m]);
    }
  }
};

// The workspace: the bf16 copies of Q, K, V (and dO), each a multiple of 32 elements, so every
// copy starts 64-byte aligned, then D.
struct Workspace {
  uint16_t *q, *k, *v, *o;
  float* delta;
};
Workspace workspace_of(float* base, const FullAttentionDims& d, bool bf16, bool backward) {
  const int64_t nq = d.B * d.H * d.N * d.E, nk = d.B * d.H * d.S * d.E;
  Workspace w{};
  auto* h = reinterpret_cast<uint16_t*>(base);
  if (bf16) {
    w.q = h;
    w.k = w.q + nq;
    w.v = w.k + nk;
    w.o = backward ? w.v + nk : nullptr;
    h = w.v + nk + (backward ? nq : 0);
  }
  w.delta = backward ? reinterpret_cast<float*>(h) : nullptr;
  return w;
}

// The f32 operands as the kernels read them, in place.
struct Inputs {
  const float *q, *k, *v, *o;  // o: dout
};

// The launch before the kernels: the bf16 copies (bf16) and D (backward); none for a forward in
// f32.
void prepare(const char* name, const FullAttentionDims& d, const FullAttentionLayout& lay,
             const Workspace& w, const Inputs& in, const float* out) {
  Prepare k{};
  const int count = w.q == nullptr ? 0 : in.o ? 4 : 3;
  if (count == 0 && out == nullptr) return;
  const float* src[4] = {in.q, in.k, in.v, in.o};
  const cpu::HeadStrides strides[4] = {lay.q, lay.k, lay.v, lay.o};
  uint16_t* dst[4] = {w.q, w.k, w.v, w.o};
  const int64_t rows[4] = {d.N, d.S, d.S, d.N};
  for (int i = 0; i < 4; ++i) {
    k.src[i] = heads_of(src[i], strides[i]);
    k.dst[i] = dst[i];
    k.rows[i] = rows[i];
  }
  k.count = count;
  k.B = d.B, k.H = d.H, k.D = d.E, k.N = d.N;
  k.out = heads_of(out, lay.o);
  k.dout = heads_of(in.o, lay.o);
  k.delta = w.delta;
  int64_t work = out ? d.B * d.H * d.N : 0;
  for (int i = 0; i < count; ++i) work += d.B * d.H * rows[i] * d.E / 4;
  launch(name, {elementwise_blocks(work)}, {kElementwiseThreads}, 0, k);
}

template <class Math>
Operands<typename Math::Elem> operands_of(const FullAttentionDims& d,
                                          const FullAttentionLayout& lay,
                                          const FullAttentionParams& p, const int32_t* lengths,
                                          const Workspace& w, const Inputs& in) {
  Operands<typename Math::Elem> a;
  if constexpr (sizeof(typename Math::Elem) == 2) {  // the contiguous bf16 copies
    const cpu::HeadStrides qs = cpu::heads_contiguous(d.H, d.N, d.E);
    const cpu::HeadStrides ks = cpu::heads_contiguous(d.H, d.S, d.E);
    a.q = heads_of<const uint16_t>(w.q, qs);
    a.k = heads_of<const uint16_t>(w.k, ks);
    a.v = heads_of<const uint16_t>(w.v, ks);
    a.o = heads_of<const uint16_t>(w.o, qs);
  } else {  // the f32 inputs in place
    a.q = heads_of(in.q, lay.q);
    a.k = heads_of(in.k, lay.k);
    a.v = heads_of(in.v, lay.v);
    a.o = heads_of(in.o, lay.o);
  }
  a.lengths = lengths;
  a.H = d.H;
  a.N = d.N;
  a.S = d.S;
  a.scale_log2 = p.temperature * kLog2e;
  a.causal = p.causal;
  a.drop = dropout_of(p);
  return a;
}

template <class Math, int D>
void forward_for(const FullAttentionDims& d, const FullAttentionLayout& lay,
                 const Operands<typename Math::Elem>& a, float* out, float* logsumexp) {
  using K = FlashForward<Math, D>;
  const int64_t q_blocks = (d.N + K::kBq - 1) / K::kBq;
  launch("cuda::flash_attention_forward", {static_cast<unsigned>(d.B * d.H * q_blocks)},
         {kThreads}, K::kShared, K{a, heads_of(out, lay.o), logsumexp, q_blocks});
}

template <class Math, int D>
void backward_for(const FullAttentionDims& d, const FullAttentionLayout& lay,
                  const Operands<typename Math::Elem>& a, const Workspace& w,
                  const float* logsumexp, float* dQ, float* dK, float* dV, float temperature) {
  using K = FlashBackward<Math, D>;
  const int64_t key_blocks = (d.S + K::kKeys - 1) / K::kKeys;
  const int64_t row_blocks = (d.N + K::kRows - 1) / K::kRows;
  launch("cuda::flash_attention_backward",
         {static_cast<unsigned>(d.B * d.H * (key_blocks + row_blocks))}, {kThreads}, K::kShared,
         K{a, logsumexp, w.delta, heads_of(dQ, lay.q), heads_of(dK, lay.k), heads_of(dV, lay.v),
           temperature, key_blocks, row_blocks});
}

// Calls f.template operator()<Math, D>() for the call's policy and head size.
template <class F>
auto dispatch(const FullAttentionDims& d, const FullAttentionParams& p, F f) {
  auto by_size = [&](auto math) {
    using Math = decltype(math);
    switch (d.E) {
      case 32: return f.template operator()<Math, 32>();
      case 64: return f.template operator()<Math, 64>();
      default: return f.template operator()<Math, 128>();
    }
  };
  if (p.bf16) return by_size(Bf16{});
  if (tf32()) return by_size(Tf32<false>{});
  return by_size(Tf32<true>{});
}

// The most shared memory a block of the call's kernels takes.
struct SharedNeeded {
  template <class Math, int D>
  size_t operator()() const {
    const size_t f = FlashForward<Math, D>::kShared, b = FlashBackward<Math, D>::kShared;
    return f > b ? f : b;
  }
};

// The kernels of one call, for dispatch.
struct ForwardRun {
  const FullAttentionDims& d;
  const FullAttentionLayout& lay;
  const FullAttentionParams& p;
  const int32_t* lengths;
  const Workspace& w;
  const Inputs& in;
  float *out, *logsumexp;
  template <class Math, int D>
  void operator()() const {
    forward_for<Math, D>(d, lay, operands_of<Math>(d, lay, p, lengths, w, in), out, logsumexp);
  }
};
struct BackwardRun {
  const FullAttentionDims& d;
  const FullAttentionLayout& lay;
  const FullAttentionParams& p;
  const int32_t* lengths;
  const Workspace& w;
  const Inputs& in;
  const float* logsumexp;
  float *dQ, *dK, *dV;
  template <class Math, int D>
  void operator()() const {
    backward_for<Math, D>(d, lay, operands_of<Math>(d, lay, p, lengths, w, in), w, logsumexp, dQ,
                          dK, dV, p.temperature);
  }
};

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool rows_aligned(const cpu::HeadStrides& s) {
  return s.batch % 4 == 0 && s.head % 4 == 0 && s.row % 4 == 0;
}

}  // namespace

bool flash_attention_applies(const FullAttentionDims& d, const FullAttentionLayout& lay,
                             const FullAttentionParams& p,
                             std::initializer_list<const float*> tensors) {
  if (d.E != d.M || (d.E != 32 && d.E != 64 && d.E != 128)) return false;
  if (d.N < 1 || d.S < 1 || !available()) return false;
  // The f32 kernels copy the operands' rows in place with 16-byte cp.async.
  if (!p.bf16) {
    for (const float* t : tensors)
      if (!aligned(t)) return false;
    if (!rows_aligned(lay.q) || !rows_aligned(lay.k) || !rows_aligned(lay.v) ||
        !rows_aligned(lay.o))
      return false;
  }
  const DeviceInfo& info = device_info();
  // The grids are 1-D: (b, h, block) in x, below 2^31.
  const int64_t blocks = d.B * d.H * ((d.N + 63) / 64 + (d.S + 63) / 64 + 1);
  return info.capability >= 80 && blocks < (int64_t(1) << 31) &&
         info.max_shared_per_block >= dispatch(d, p, SharedNeeded{});
}

int64_t flash_attention_forward_workspace(const FullAttentionDims& d,
                                          const FullAttentionParams& p) {
  return p.bf16 ? (d.B * d.H * (d.N + 2 * d.S) * d.E + 1) / 2 : 0;
}
int64_t flash_attention_backward_workspace(const FullAttentionDims& d,
                                           const FullAttentionParams& p) {
  return (p.bf16 ? d.B * d.H * (d.N + d.S) * d.E : 0) + d.B * d.H * d.N;
}

void flash_attention_forward(const FullAttentionDims& d, const FullAttentionLayout& lay,
                             const FullAttentionParams& p, const int32_t* lengths, const float* Q,
                             const float* K, const float* V, float* out, float* logsumexp,
                             float* workspace) {
  CLUSTR_CHECK(flash_attention_applies(d, lay, p, {Q, K, V, out}),
               "cuda::flash_attention_forward: not for this call");
  const Workspace w = workspace_of(workspace, d, p.bf16, false);
  const Inputs in{Q, K, V, nullptr};
  prepare("cuda::flash_attention_forward (bf16 copies)", d, lay, w, in, nullptr);
  dispatch(d, p, ForwardRun{d, lay, p, lengths, w, in, out, logsumexp});
}

void flash_attention_backward(const FullAttentionDims& d, const FullAttentionLayout& lay,
                              const FullAttentionParams& p, const int32_t* lengths,
                              const float* Q, const float* K, const float* V, const float* out,
                              const float* logsumexp, const float* dout, float* dQ, float* dK,
                              float* dV, float* workspace) {
  CLUSTR_CHECK(flash_attention_applies(d, lay, p, {Q, K, V, out, dout, dQ, dK, dV}),
               "cuda::flash_attention_backward: not for this call");
  const Workspace w = workspace_of(workspace, d, p.bf16, true);
  const Inputs in{Q, K, V, dout};
  prepare("cuda::flash_attention_backward (bf16 copies, D)", d, lay, w, in, out);
  dispatch(d, p, BackwardRun{d, lay, p, lengths, w, in, logsumexp, dQ, dK, dV});
}

}  // namespace clustr::cuda
