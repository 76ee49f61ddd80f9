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
// Forward (FlashForward, one block of 4 warps per query block of Bq = 16 kMT x 4 rows and
// (b, h); each warp owns kMT 16-row tiles): Q's fragments stay in registers; key tiles K_j,
// V_j of Bk = 64 rows stream through two shared buffers each by cp.async (the next K_j while
// this tile's softmax runs, V_j while S_j = Q K_j^T is formed). Online softmax in base 2:
// x = t s log2(e), the running row max m and each thread's share of the row sum l, rescaled by
// 2^(m_old - m_new); P's accumulator fragments turn into A fragments in registers (rounded to
// bf16) for O += P V_j. At the end O / l and lse = (m + log2 l) ln 2. Masked keys (lengths,
// causal) get x = -inf; a row that sees no key ends with l = 0: out 0 and lse -inf.
//
// Backward: one grid of two kinds of blocks, both 4 warps. A key block (64 keys, 16 a warp)
// walks the query tiles that can see its keys (from its first key on when causal), recomputes
// S^T = K Q_i^T and P^T = 2^(x - lse log2 e) from the saved logsumexp, dP^T = V dO_i^T,
// dS^T = P^T (dP^T keep / (1 - p) - D) and accumulates dV += (P^T keep / (1 - p)) dO_i and
// dK += dS^T Q_i in registers, written once at the end. A query block (64 rows) walks the key
// tiles its rows see, recomputes S and dP the same way and accumulates dQ += dS K_j. Each
// output element has one writer, so there is no atomic and no N x S buffer. D_i = dO_i . O_i
// (in double) comes from the launch before, which also makes the bf16 copies.
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
using mma::FragA;
using mma::FragB;
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

// Where the rows of one head of an f32 tensor are (cpu::HeadStrides, on the device).
struct Heads {
  int64_t batch, head, row;
  CLUSTR_DEVICE float* at(float* base, int64_t b, int64_t h) const {
    return base + b * batch + h * head;
  }
  CLUSTR_DEVICE const float* at(const float* base, int64_t b, int64_t h) const {
    return base + b * batch + h * head;
  }
};
Heads heads_of(const cpu::HeadStrides& s) { return {s.batch, s.head, s.row}; }

// The rows of sequence b: keys j < length are valid, query rows i < live see a key (with N == S
// and lengths the rows past the length are padding; with no valid key no row sees one).
struct Sequence {
  int64_t length, live;
};
CLUSTR_DEVICE Sequence sequence_of(const int32_t* lengths, int64_t b, int64_t N, int64_t S) {
  const int64_t length = lengths ? lengths[b] : S;
  return {length, length == 0 ? 0 : (lengths && N == S) ? length : N};
}

// Word k of a Philox block, by selects (an array index the compiler could not resolve would put
// the block in local memory).
CLUSTR_DEVICE uint32_t word(const Philox4& w, uint64_t k) {
  return k == 0 ? w.v[0] : k == 1 ? w.v[1] : k == 2 ? w.v[2] : w.v[3];
}
// Weight element idx and idx + 1 (full_cpu.h's numbering) after dropout: x0, x1 scaled or 0.
CLUSTR_DEVICE void drop_pair(const Dropout& d, uint64_t idx, float& x0, float& x1) {
  const Philox4 w = philox4x32(d.seed, d.offset + idx / 4);
  const uint64_t k = idx % 4;
  const uint32_t w1 = k < 3 ? word(w, k + 1) : philox4x32(d.seed, d.offset + idx / 4 + 1).v[0];
  x0 = math::dropout_value(x0, word(w, k), d.p, d.scale);
  x1 = math::dropout_value(x1, w1, d.p, d.scale);
}
// The same for one element, returning its Philox word.
CLUSTR_DEVICE uint32_t dropout_word(const Dropout& d, uint64_t idx) {
  return word(philox4x32(d.seed, d.offset + idx / 4), idx % 4);
}

// ---- tiles of bf16 rows in shared memory ----
// A tile's rows are D + 8 elements apart: the 16 bytes of padding put the eight 16-byte rows
// that one ldmatrix matrix reads in eight different groups of four banks.
template <int D>
struct Tile {
  static constexpr int kStride = D + 8;
  static constexpr size_t bytes(int rows) { return size_t(rows) * kStride * sizeof(uint16_t); }

  // cp.async rows [0, rows) from src (row r at src + r D), rows >= valid zero-filled (their
  // source is not read). Every thread of the block takes part; the copies join its open group.
  static CLUSTR_DEVICE void load(const Thread& t, uint16_t* dst, const uint16_t* src, int rows,
                                 int valid) {
    constexpr int kChunks = D / 8;  // 16-byte chunks a row
    for (int e = static_cast<int>(t.thread_idx().x); e < rows * kChunks; e += kThreads) {
      const int r = e / kChunks, k = e % kChunks;
      const bool ok = r < valid;
      mma::cp_async16(t, dst + r * kStride + 8 * k, ok ? src + int64_t(r) * D + 8 * k : src,
                      ok ? 16u : 0u);
    }
  }
  // The A fragment of rows [r0, r0 + 16), columns [k0, k0 + 16).
  static CLUSTR_DEVICE FragA a(const Thread& t, const uint16_t* tile, int r0, int k0) {
    const unsigned l = mma::lane(t);
    FragA f;
    mma::ldmatrix_x4(t, f.x, tile + (r0 + l % 16) * kStride + k0 + 8 * (l / 16));
    return f;
  }
  // The B fragments of n-tiles [n0, n0 + 8) and [n0 + 8, n0 + 16), k in [k0, k0 + 16), from a
  // tile whose rows are n (B = tile^T: K in Q K^T, V in dO V^T, Q in K Q^T, dO in V dO^T).
  static CLUSTR_DEVICE void b_of_rows(const Thread& t, FragB& b0, FragB& b1, const uint16_t* tile,
                                      int n0, int k0) {
    const unsigned l = mma::lane(t);
    uint32_t r[4];
    mma::ldmatrix_x4(t, r, tile + (n0 + l % 8 + 8 * (l / 16)) * kStride + k0 + 8 * (l / 8 % 2));
    b0 = {{r[0], r[1]}};
    b1 = {{r[2], r[3]}};
  }
  // The same from a tile whose rows are k (B = tile: V in P V, dO in P^T dO, Q in dS^T Q, K in
  // dS K): transposed on the way.
  static CLUSTR_DEVICE void b_of_cols(const Thread& t, FragB& b0, FragB& b1, const uint16_t* tile,
                                      int k0, int n0) {
    const unsigned l = mma::lane(t);
    uint32_t r[4];
    mma::ldmatrix_x4_trans(t, r, tile + (k0 + l % 16) * kStride + n0 + 8 * (l / 16));
    b0 = {{r[0], r[1]}};
    b1 = {{r[2], r[3]}};
  }
};

// Columns [16 k, 16 k + 16) of a 16-row accumulator held as the C fragments lo (columns 16 k ..)
// and hi (16 k + 8 ..), as the A fragment of the next product: the layouts line up, so P and dS
// pass from one product to the next in registers, rounded to bf16.
CLUSTR_DEVICE FragA c_to_a(const FragC& lo, const FragC& hi) {
  return {{mma::pack_bf16(lo.x[0], lo.x[1]), mma::pack_bf16(lo.x[2], lo.x[3]),
           mma::pack_bf16(hi.x[0], hi.x[1]), mma::pack_bf16(hi.x[2], hi.x[3])}};
}

CLUSTR_DEVICE void zero(FragC& f) { f.x[0] = f.x[1] = f.x[2] = f.x[3] = 0.0f; }

// What both directions read: the bf16 copies (contiguous heads) and the masks.
struct Operands {
  const uint16_t *q, *k, *v;  // (B, H, N, D), (B, H, S, D), (B, H, S, D)
  const int32_t* lengths;     // (B) or null
  int64_t H, N, S;
  float scale_log2;  // temperature log2(e)
  bool causal;
  Dropout drop;
};

// ---- forward ----

template <int D, int kMT>
struct FlashForward {
  static constexpr bool kUsesBarrier = true;
  static constexpr int kBq = 16 * kMT * kWarps, kBk = 64, kSteps = D / 16;
  using T = Tile<D>;
  static constexpr size_t kShared = T::bytes(kBq + 4 * kBk);  // Q, K x 2, V x 2

  Operands a;
  float* out;  // laid out as o says
  Heads o;
  float* lse;  // (B, H, N)
  int64_t q_blocks;  // per (b, h)

  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t block = t.block_idx().x, bh = block / q_blocks, b = bh / a.H, h = bh % a.H;
    const int64_t i0 = block % q_blocks * kBq;
    const Sequence sq = sequence_of(a.lengths, b, a.N, a.S);
    const int rows = static_cast<int>(min64(kBq, a.N - i0));
    const int live = static_cast<int>(max64(0, min64(sq.live - i0, rows)));
    const unsigned tid = t.thread_idx().x, l = mma::lane(t), w = mma::warp(t);
    const unsigned g = l / 4, c = l % 4;
    float* out_head = o.at(out, b, h);
    float* lse_head = lse + bh * a.N;
    if (live == 0) {  // no row of the block sees a key (the same for every thread)
      for (int e = static_cast<int>(tid); e < rows * D; e += kThreads)
        out_head[(i0 + e / D) * o.row + e % D] = 0.0f;
      for (int r = static_cast<int>(tid); r < rows; r += kThreads) lse_head[i0 + r] = -INFINITY;
      return;
    }
    // The keys the block's last live row sees: the last row sees the most.
    const int64_t keys = math::attention_keys_seen(i0 + live - 1, sq.length, a.causal);
    const int tiles = static_cast<int>((keys + kBk - 1) / kBk);
    uint16_t* sQ = t.shared<uint16_t>();
    uint16_t* sK = sQ + kBq * T::kStride;
    uint16_t* sV = sK + 2 * kBk * T::kStride;
    const uint16_t* k_head = a.k + bh * a.S * D;
    const uint16_t* v_head = a.v + bh * a.S * D;
    T::load(t, sQ, a.q + (bh * a.N + i0) * D, kBq, rows);
    T::load(t, sK, k_head, kBk, static_cast<int>(min64(kBk, keys)));
    mma::cp_async_commit(t);

    FragA qf[kMT][kSteps];
    FragC acc[kMT][D / 8];
    float m[kMT][2], lsum[kMT][2];
    CLUSTR_UNROLL
    for (int mt = 0; mt < kMT; ++mt) {
      for (int n = 0; n < D / 8; ++n) zero(acc[mt][n]);
      m[mt][0] = m[mt][1] = -INFINITY;
      lsum[mt][0] = lsum[mt][1] = 0.0f;
    }
    for (int j = 0; j < tiles; ++j) {
      const int64_t j0 = int64_t(j) * kBk;
      const int valid = static_cast<int>(min64(kBk, keys - j0));
      const uint16_t* kt = sK + (j % 2) * kBk * T::kStride;
      const uint16_t* vt = sV + (j % 2) * kBk * T::kStride;
      T::load(t, sV + (j % 2) * kBk * T::kStride, v_head + j0 * D, kBk, valid);
      mma::cp_async_commit(t);
      mma::cp_async_wait<1>(t);  // Q and K_j are in; V_j may still be on its way
      t.sync();
      if (j == 0) {
        CLUSTR_UNROLL
        for (int mt = 0; mt < kMT; ++mt)
          CLUSTR_UNROLL
          for (int kk = 0; kk < kSteps; ++kk)
            qf[mt][kk] = T::a(t, sQ, (static_cast<int>(w) * kMT + mt) * 16, 16 * kk);
      }
      // S = Q K_j^T (16 kMT rows x 64 keys a warp).
      FragC s[kMT][kBk / 8];
      CLUSTR_UNROLL
      for (int mt = 0; mt < kMT; ++mt)
        for (int n = 0; n < kBk / 8; ++n) zero(s[mt][n]);
      CLUSTR_UNROLL
      for (int kk = 0; kk < kSteps; ++kk)
        CLUSTR_UNROLL
        for (int np = 0; np < kBk / 16; ++np) {
          FragB b0, b1;
          T::b_of_rows(t, b0, b1, kt, 16 * np, 16 * kk);
          CLUSTR_UNROLL
          for (int mt = 0; mt < kMT; ++mt) {
            mma::mma_bf16(t, s[mt][2 * np], qf[mt][kk], b0);
            mma::mma_bf16(t, s[mt][2 * np + 1], qf[mt][kk], b1);
          }
        }
      // K_{j+1} into the other buffer (read by S_{j-1}, which every warp finished before the
      // barrier above); an empty group when this is the last tile.
      if (j + 1 < tiles)
        T::load(t, sK + ((j + 1) % 2) * kBk * T::kStride, k_head + (j0 + kBk) * D, kBk,
                static_cast<int>(min64(kBk, keys - j0 - kBk)));
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
      for (int kk = 0; kk < kBk / 16; ++kk) {
        FragA p[kMT];
        CLUSTR_UNROLL
        for (int mt = 0; mt < kMT; ++mt) p[mt] = c_to_a(s[mt][2 * kk], s[mt][2 * kk + 1]);
        CLUSTR_UNROLL
        for (int np = 0; np < D / 16; ++np) {
          FragB b0, b1;
          T::b_of_cols(t, b0, b1, vt, 16 * kk, 16 * np);
          CLUSTR_UNROLL
          for (int mt = 0; mt < kMT; ++mt) {
            mma::mma_bf16(t, acc[mt][2 * np], p[mt], b0);
            mma::mma_bf16(t, acc[mt][2 * np + 1], p[mt], b1);
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
        float* row = out_head + i * o.row;
        CLUSTR_UNROLL
        for (int n = 0; n < D / 8; ++n) {
          row[8 * n + 2 * c] = acc[mt][n].x[2 * hf] * inv;
          row[8 * n + 2 * c + 1] = acc[mt][n].x[2 * hf + 1] * inv;
        }
        if (c == 0)
          lse_head[i] = total > 0.0f ? m[mt][hf] * kLn2 + logf(total) : -INFINITY;
      }
  }
};

// ---- backward ----

template <int D>
struct FlashBackward {
  static constexpr bool kUsesBarrier = true;
  using T = Tile<D>;
  static constexpr int kSteps = D / 16;
  // Key blocks: 64 keys (16 a warp) against query tiles of kBqt; query blocks: 64 rows (16 a
  // warp) against key tiles of kBkt. D = 128 takes tiles of 32, which keeps a thread's
  // accumulators within the register file.
  static constexpr int kKeys = 64, kRows = 64, kBqt = D == 128 ? 32 : 64, kBkt = kBqt;
  static constexpr size_t kKeyShared =
      T::bytes(2 * kKeys + 4 * kBqt) + 4 * kBqt * sizeof(float);  // K, V, (Q, dO) x 2, lse, D
  static constexpr size_t kRowShared = T::bytes(2 * kRows + 4 * kBkt);  // Q, dO, (K, V) x 2
  static constexpr size_t kShared = kKeyShared > kRowShared ? kKeyShared : kRowShared;

  Operands a;
  const uint16_t* dout;  // bf16 (B, H, N, D)
  const float* lse;      // (B, H, N)
  const float* delta;    // D_i (B, H, N)
  float *dq, *dk, *dv;
  Heads q_heads, k_heads, v_heads;
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
    float* dk_head = k_heads.at(dk, b, h);
    float* dv_head = v_heads.at(dv, b, h);
    // Query tiles [first, last) can see these keys: from the tile of query j0 when causal.
    const int64_t first = a.causal ? j0 / kBqt : 0;
    const int64_t last = (sq.live + kBqt - 1) / kBqt;
    if (j0 >= sq.length || first >= last) {  // no query sees them: no gradient
      for (int e = static_cast<int>(tid); e < key_rows * D; e += kThreads) {
        dk_head[(j0 + e / D) * k_heads.row + e % D] = 0.0f;
        dv_head[(j0 + e / D) * v_heads.row + e % D] = 0.0f;
      }
      return;
    }
    uint16_t* sK = t.shared<uint16_t>();
    uint16_t* sV = sK + kKeys * T::kStride;
    uint16_t* sQ = sV + kKeys * T::kStride;   // two buffers of kBqt rows
    uint16_t* sO = sQ + 2 * kBqt * T::kStride;  // dO, two buffers
    float* sL = reinterpret_cast<float*>(sO + 2 * kBqt * T::kStride);  // lse log2(e), two
    float* sD = sL + 2 * kBqt;                                          // D, two
    const int valid_keys = static_cast<int>(min64(kKeys, sq.length - j0));
    T::load(t, sK, a.k + (bh * a.S + j0) * D, kKeys, valid_keys);
    T::load(t, sV, a.v + (bh * a.S + j0) * D, kKeys, valid_keys);
    // Query tile qt into buffer `buf`: rows, their lse (in base 2) and D; rows past live are
    // masked below, so what they hold does not matter (zeros).
    auto issue = [&](int64_t qt, int buf) {
      const int64_t i0 = qt * kBqt;
      const int n = static_cast<int>(min64(kBqt, a.N - i0));
      T::load(t, sQ + buf * kBqt * T::kStride, a.q + (bh * a.N + i0) * D, kBqt, n);
      T::load(t, sO + buf * kBqt * T::kStride, dout + (bh * a.N + i0) * D, kBqt, n);
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
      const uint16_t* qtile = sQ + buf * kBqt * T::kStride;
      const uint16_t* otile = sO + buf * kBqt * T::kStride;
      // S^T = K Q_i^T and dP^T = V dO_i^T (16 keys x kBqt queries a warp).
      FragC st[kBqt / 8], dpt[kBqt / 8];
      CLUSTR_UNROLL
      for (int n = 0; n < kBqt / 8; ++n) {
        zero(st[n]);
        zero(dpt[n]);
      }
      CLUSTR_UNROLL
      for (int kk = 0; kk < kSteps; ++kk) {
        const FragA ka = T::a(t, sK, r0, 16 * kk), va = T::a(t, sV, r0, 16 * kk);
        CLUSTR_UNROLL
        for (int np = 0; np < kBqt / 16; ++np) {
          FragB b0, b1;
          T::b_of_rows(t, b0, b1, qtile, 16 * np, 16 * kk);
          mma::mma_bf16(t, st[2 * np], ka, b0);
          mma::mma_bf16(t, st[2 * np + 1], ka, b1);
          T::b_of_rows(t, b0, b1, otile, 16 * np, 16 * kk);
          mma::mma_bf16(t, dpt[2 * np], va, b0);
          mma::mma_bf16(t, dpt[2 * np + 1], va, b1);
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
          const float p = seen ? exp2_fast(st[n].x[x] * a.scale_log2 - sL[buf * kBqt + col]) : 0.0f;
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
      for (int kk = 0; kk < kBqt / 16; ++kk) {
        const FragA pa = c_to_a(st[2 * kk], st[2 * kk + 1]);
        const FragA da = c_to_a(dpt[2 * kk], dpt[2 * kk + 1]);
        CLUSTR_UNROLL
        for (int np = 0; np < D / 16; ++np) {
          FragB b0, b1;
          T::b_of_cols(t, b0, b1, otile, 16 * kk, 16 * np);
          mma::mma_bf16(t, dv_acc[2 * np], pa, b0);
          mma::mma_bf16(t, dv_acc[2 * np + 1], pa, b1);
          T::b_of_cols(t, b0, b1, qtile, 16 * kk, 16 * np);
          mma::mma_bf16(t, dk_acc[2 * np], da, b0);
          mma::mma_bf16(t, dk_acc[2 * np + 1], da, b1);
        }
      }
      t.sync();  // every warp is done with this buffer before the next round refills it
    }
    mma::cp_async_wait<0>(t);
    CLUSTR_UNROLL
    for (int x = 0; x < 4; x += 2) {
      const int key = r0 + static_cast<int>(g) + 8 * (x / 2);
      if (key >= key_rows) continue;
      float* krow = dk_head + (j0 + key) * k_heads.row;
      float* vrow = dv_head + (j0 + key) * v_heads.row;
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
    float* dq_head = q_heads.at(dq, b, h);
    if (live == 0) {
      for (int e = static_cast<int>(tid); e < rows * D; e += kThreads)
        dq_head[(i0 + e / D) * q_heads.row + e % D] = 0.0f;
      return;
    }
    const int64_t keys = math::attention_keys_seen(i0 + live - 1, sq.length, a.causal);
    const int tiles = static_cast<int>((keys + kBkt - 1) / kBkt);
    uint16_t* sQ = t.shared<uint16_t>();
    uint16_t* sO = sQ + kRows * T::kStride;
    uint16_t* sK = sO + kRows * T::kStride;  // two buffers of kBkt rows
    uint16_t* sV = sK + 2 * kBkt * T::kStride;
    const uint16_t* k_head = a.k + bh * a.S * D;
    const uint16_t* v_head = a.v + bh * a.S * D;
    T::load(t, sQ, a.q + (bh * a.N + i0) * D, kRows, rows);
    T::load(t, sO, dout + (bh * a.N + i0) * D, kRows, rows);
    auto issue = [&](int jt, int buf) {
      const int64_t j0 = int64_t(jt) * kBkt;
      const int valid = static_cast<int>(min64(kBkt, keys - j0));
      T::load(t, sK + buf * kBkt * T::kStride, k_head + j0 * D, kBkt, valid);
      T::load(t, sV + buf * kBkt * T::kStride, v_head + j0 * D, kBkt, valid);
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
    FragA qf[kSteps], of[kSteps];
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
      if (jt == 0) {
        CLUSTR_UNROLL
        for (int kk = 0; kk < kSteps; ++kk) {
          qf[kk] = T::a(t, sQ, r0, 16 * kk);
          of[kk] = T::a(t, sO, r0, 16 * kk);
        }
      }
      const uint16_t* ktile = sK + buf * kBkt * T::kStride;
      const uint16_t* vtile = sV + buf * kBkt * T::kStride;
      FragC s[kBkt / 8], dp[kBkt / 8];
      CLUSTR_UNROLL
      for (int n = 0; n < kBkt / 8; ++n) {
        zero(s[n]);
        zero(dp[n]);
      }
      CLUSTR_UNROLL
      for (int kk = 0; kk < kSteps; ++kk)
        CLUSTR_UNROLL
        for (int np = 0; np < kBkt / 16; ++np) {
          FragB b0, b1;
          T::b_of_rows(t, b0, b1, ktile, 16 * np, 16 * kk);
          mma::mma_bf16(t, s[2 * np], qf[kk], b0);
          mma::mma_bf16(t, s[2 * np + 1], qf[kk], b1);
          T::b_of_rows(t, b0, b1, vtile, 16 * np, 16 * kk);
          mma::mma_bf16(t, dp[2 * np], of[kk], b0);
          mma::mma_bf16(t, dp[2 * np + 1], of[kk], b1);
        }
      // dS = P (dP keep / (1 - p) - D), into s.
      const int64_t j0 = int64_t(jt) * kBkt;
      CLUSTR_UNROLL
      for (int n = 0; n < kBkt / 8; ++n)
        CLUSTR_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int64_t key = j0 + 8 * n + 2 * c;
          float p[2], g2[2];
          CLUSTR_UNROLL
          for (int e = 0; e < 2; ++e) {
            p[e] = key + e < seen[hf] ? exp2_fast(s[n].x[2 * hf + e] * a.scale_log2 - lse2[hf])
                                      : 0.0f;
            g2[e] = dp[n].x[2 * hf + e];
          }
          if (a.drop.on()) {
            const int64_t i = i0 + r0 + g + 8 * hf;
            drop_pair(a.drop, math::attention_dropout_index(bh, a.N, i, a.S, key), g2[0], g2[1]);
          }
          CLUSTR_UNROLL
          for (int e = 0; e < 2; ++e) s[n].x[2 * hf + e] = math::softmax_dx(p[e], g2[e], dd[hf]);
        }
      // dQ += dS K_j.
      CLUSTR_UNROLL
      for (int kk = 0; kk < kBkt / 16; ++kk) {
        const FragA da = c_to_a(s[2 * kk], s[2 * kk + 1]);
        CLUSTR_UNROLL
        for (int np = 0; np < D / 16; ++np) {
          FragB b0, b1;
          T::b_of_cols(t, b0, b1, ktile, 16 * kk, 16 * np);
          mma::mma_bf16(t, acc[2 * np], da, b0);
          mma::mma_bf16(t, acc[2 * np + 1], da, b1);
        }
      }
      t.sync();  // every warp is done with this buffer before the next round refills it
    }
    mma::cp_async_wait<0>(t);
    CLUSTR_UNROLL
    for (int hf = 0; hf < 2; ++hf) {
      const int r = r0 + static_cast<int>(g) + 8 * hf;
      if (r >= rows) continue;
      float* row = dq_head + (i0 + r) * q_heads.row;
      CLUSTR_UNROLL
      for (int n = 0; n < D / 8; ++n) {
        row[8 * n + 2 * c] = acc[n].x[2 * hf] * temperature;
        row[8 * n + 2 * c + 1] = acc[n].x[2 * hf + 1] * temperature;
      }
    }
  }
};

// ---- the bf16 copies (and D) ----

// Up to four f32 tensors of heads (laid out as their Heads say) into contiguous bf16 heads,
// four elements a thread at a time; with out and dout, also D_i = dout_i . out_i (in double,
// one row a thread) for every row of (B, H, N). One grid-stride loop over all of it.
struct Prepare {
  static constexpr bool kUsesBarrier = false;
  const float* src[4];
  Heads heads[4];
  uint16_t* dst[4];
  int64_t rows[4];  // per head: N or S
  int count;
  int64_t B, H, D;
  const float *out, *dout;  // null: no D
  Heads o;
  float* delta;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t per_row = D / 4;
    int64_t total = 0;
    for (int k = 0; k < count; ++k) total += B * H * rows[k] * per_row;
    const int64_t n_rows = out ? B * H * rows[0] : 0;
    for (int64_t e = global_x(t); e < total + n_rows; e += grid_stride_x(t)) {
      if (e >= total) {  // D of row (bh, i)
        const int64_t row = e - total, bh = row / rows[0], i = row % rows[0];
        const float* x = o.at(out, bh / H, bh % H) + i * o.row;
        const float* y = o.at(dout, bh / H, bh % H) + i * o.row;
        double acc = 0.0;
        for (int64_t m = 0; m < D; ++m) acc += double(x[m]) * y[m];
        delta[row] = static_cast<float>(acc);
        continue;
      }
      int64_t u = e;
      int k = 0;
      while (u >= B * H * rows[k] * per_row) u -= B * H * rows[k++] * per_row;
      const int64_t chunk = u % per_row, row = u / per_row, i = row % rows[k], bh = row / rows[k];
      const float* x = heads[k].at(src[k], bh / H, bh % H) + i * heads[k].row + 4 * chunk;
      uint16_t* y = dst[k] + row * D + 4 * chunk;
      for (int m = 0; m < 4; ++m) y[m] = float_to_bf16(x[m]);
    }
  }
};

// The kernels' shapes for a head size: the forward's m-tiles a warp (Bq = 64 kMT).
constexpr int forward_tiles(int D) { return D == 128 ? 1 : 2; }

template <int D>
constexpr size_t forward_shared() {
  return FlashForward<D, forward_tiles(D)>::kShared;
}

// Offsets (in bf16 elements) of the copies in the workspace: Q, K, V (and dO), each a multiple
// of 32 elements, so every copy starts 64-byte aligned.
struct Copies {
  uint16_t *q, *k, *v, *o;
  float* delta;
};
Copies copies_in(float* workspace, const FullAttentionDims& d, bool backward) {
  auto* base = reinterpret_cast<uint16_t*>(workspace);
  const int64_t nq = d.B * d.H * d.N * d.E, nk = d.B * d.H * d.S * d.E;
  Copies c;
  c.q = base;
  c.k = c.q + nq;
  c.v = c.k + nk;
  c.o = backward ? c.v + nk : nullptr;
  c.delta = backward ? reinterpret_cast<float*>(c.o + nq) : nullptr;
  return c;
}

Operands operands_of(const FullAttentionDims& d, const FullAttentionParams& p,
                     const int32_t* lengths, const Copies& c) {
  Operands a;
  a.q = c.q;
  a.k = c.k;
  a.v = c.v;
  a.lengths = lengths;
  a.H = d.H;
  a.N = d.N;
  a.S = d.S;
  a.scale_log2 = p.temperature * kLog2e;
  a.causal = p.causal;
  a.drop = dropout_of(p);
  return a;
}

void prepare(const char* name, const FullAttentionDims& d, const FullAttentionLayout& lay,
             const Copies& c, const float* Q, const float* K, const float* V, const float* out,
             const float* dout) {
  Prepare k{};
  k.src[0] = Q, k.src[1] = K, k.src[2] = V, k.src[3] = dout;
  k.heads[0] = heads_of(lay.q), k.heads[1] = heads_of(lay.k), k.heads[2] = heads_of(lay.v);
  k.heads[3] = heads_of(lay.o);
  k.dst[0] = c.q, k.dst[1] = c.k, k.dst[2] = c.v, k.dst[3] = c.o;
  k.rows[0] = d.N, k.rows[1] = d.S, k.rows[2] = d.S, k.rows[3] = d.N;
  k.count = dout ? 4 : 3;
  k.B = d.B, k.H = d.H, k.D = d.E;
  k.out = out, k.dout = dout, k.o = heads_of(lay.o), k.delta = c.delta;
  const int64_t work = d.B * d.H * ((2 * d.N + 2 * d.S) * d.E / 4 + d.N);
  launch(name, {elementwise_blocks(work)}, {kElementwiseThreads}, 0, k);
}

template <int D>
void forward_for(const FullAttentionDims& d, const FullAttentionLayout& lay, const Operands& a,
                 float* out, float* logsumexp) {
  using K = FlashForward<D, forward_tiles(D)>;
  const int64_t q_blocks = (d.N + K::kBq - 1) / K::kBq;
  launch("cuda::flash_attention_forward", {static_cast<unsigned>(d.B * d.H * q_blocks)},
         {kThreads}, K::kShared, K{a, out, heads_of(lay.o), logsumexp, q_blocks});
}

template <int D>
void backward_for(const FullAttentionDims& d, const FullAttentionLayout& lay, const Operands& a,
                  const Copies& c, const float* logsumexp, float* dQ, float* dK, float* dV,
                  float temperature) {
  using K = FlashBackward<D>;
  const int64_t key_blocks = (d.S + K::kKeys - 1) / K::kKeys;
  const int64_t row_blocks = (d.N + K::kRows - 1) / K::kRows;
  launch("cuda::flash_attention_backward",
         {static_cast<unsigned>(d.B * d.H * (key_blocks + row_blocks))}, {kThreads}, K::kShared,
         K{a, c.o, logsumexp, c.delta, dQ, dK, dV, heads_of(lay.q), heads_of(lay.k),
           heads_of(lay.v), temperature, key_blocks, row_blocks});
}

size_t shared_needed(int64_t D) {
  switch (D) {
    case 32: return forward_shared<32>() > FlashBackward<32>::kShared ? forward_shared<32>()
                                                                       : FlashBackward<32>::kShared;
    case 64: return forward_shared<64>() > FlashBackward<64>::kShared ? forward_shared<64>()
                                                                       : FlashBackward<64>::kShared;
    default: return forward_shared<128>() > FlashBackward<128>::kShared
                        ? forward_shared<128>()
                        : FlashBackward<128>::kShared;
  }
}

}  // namespace

bool flash_attention_applies(const FullAttentionDims& d, const FullAttentionParams& p) {
  if (!p.bf16 || d.E != d.M || (d.E != 32 && d.E != 64 && d.E != 128)) return false;
  if (d.N < 1 || d.S < 1 || !available()) return false;
  const DeviceInfo& info = device_info();
  // The grids are 1-D: (b, h, block) in x, below 2^31.
  const int64_t blocks = d.B * d.H * ((d.N + 63) / 64 + (d.S + 63) / 64 + 1);
  return info.capability >= 80 && info.max_shared_per_block >= shared_needed(d.E) &&
         blocks < (int64_t(1) << 31);
}

int64_t flash_attention_forward_workspace(const FullAttentionDims& d) {
  return (d.B * d.H * (d.N + 2 * d.S) * d.E + 1) / 2;
}
int64_t flash_attention_backward_workspace(const FullAttentionDims& d) {
  return d.B * d.H * (d.N + d.S) * d.E + d.B * d.H * d.N;
}

void flash_attention_forward(const FullAttentionDims& d, const FullAttentionLayout& lay,
                             const FullAttentionParams& p, const int32_t* lengths, const float* Q,
                             const float* K, const float* V, float* out, float* logsumexp,
                             float* workspace) {
  CLUSTR_CHECK(flash_attention_applies(d, p), "cuda::flash_attention_forward: not for this call");
  const Copies c = copies_in(workspace, d, false);
  prepare("cuda::flash_attention_forward (bf16 copies)", d, lay, c, Q, K, V, nullptr, nullptr);
  const Operands a = operands_of(d, p, lengths, c);
  switch (d.E) {
    case 32: return forward_for<32>(d, lay, a, out, logsumexp);
    case 64: return forward_for<64>(d, lay, a, out, logsumexp);
    default: return forward_for<128>(d, lay, a, out, logsumexp);
  }
}

void flash_attention_backward(const FullAttentionDims& d, const FullAttentionLayout& lay,
                              const FullAttentionParams& p, const int32_t* lengths,
                              const float* Q, const float* K, const float* V, const float* out,
                              const float* logsumexp, const float* dout, float* dQ, float* dK,
                              float* dV, float* workspace) {
  CLUSTR_CHECK(flash_attention_applies(d, p),
               "cuda::flash_attention_backward: not for this call");
  const Copies c = copies_in(workspace, d, true);
  prepare("cuda::flash_attention_backward (bf16 copies, D)", d, lay, c, Q, K, V, out, dout);
  const Operands a = operands_of(d, p, lengths, c);
  switch (d.E) {
    case 32: return backward_for<32>(d, lay, a, c, logsumexp, dQ, dK, dV, p.temperature);
    case 64: return backward_for<64>(d, lay, a, c, logsumexp, dQ, dK, dV, p.temperature);
    default: return backward_for<128>(d, lay, a, c, logsumexp, dQ, dK, dV, p.temperature);
  }
}

}  // namespace clustr::cuda
