// CUDA kernels of the fused full attention (cuda/full.h gives the contract; full_cpu.h the
// semantics). Written against core/cuda/kernel.h, so the same code runs on a GPU and in device
// emulation.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim; Bq rows of a query
// block, Sb keys the block sees.
//   scores, dP: scratch (pairs, Bq, Sb) per query block, Sb <= S; pairs = sequences x H.
//
// How: per run of consecutive sequences with the same lengths (all of them when the batch has
// no lengths, up to as many as fit kGroupFloats) and per block of Bq query rows, all heads of
// all the run's sequences at once: the launches do not grow with the batch. The block's scores
// (pairs, Bq, Sb) = t Q_blk K^T are one cuBLAS strided-batched GEMM over the run's (sequence,
// head) pairs, whose rows are evenly strided in (B, H, N, E); a fused kernel
// (one CUDA block per row) masks them, takes the row's max and sum, writes the logsumexp and
// turns the scores into the (dropped-out) weights in place, two passes over a row that is
// whole in scratch, so no online rescaling is needed; out_blk = P V is a second batched GEMM.
// Bq is the largest of at most kBlockQ rows whose scores fit kBlockFloats, so scratch is
// bounded by the shape's H S, never N x S per head (eq. 1-2 without the N x S matrix).
// Sb is the keys the block's last real row sees (lengths, causal), so masked-out keys cost
// nothing; lengths are read on the host (the front door copies them there) to size the GEMMs.
//
// Backward (FlashAttention-2's recomputation): per block, scores again and dP = dO V^T, then a
// kernel recomputes P = exp(s - lse) from the saved logsumexp, applies the same dropout mask
// (regenerated from Philox), and writes Pd = P keep / (1 - p) and dS = P (dP keep / (1 - p) - D)
// with D_i = dO_i . O_i; then dV += Pd^T dO, dQ_blk = t dS K, dK += t dS^T Q_blk by batched
// GEMMs. dK and dV are sums over the query blocks: they are zeroed once and the blocks add to
// them with beta = 1 GEMMs in block order, one after another on the stream, so there are no
// float atomics and a result never depends on timing.
//
// The per-element math (the keys a row sees, exp, the logsumexp, dropout, the softmax
// gradient) is core/math.h's, the CPU's; the dropout element numbering is full_cpu.h's.
//
// bf16 products (p.bf16, the precision policy): Q, K, V and dO are converted to bf16 once per
// call, the score blocks (P, dS) after their row kernel, and the batched GEMMs are cuBLAS's
// bf16 ones with f32 accumulation and f32 results; the row kernels stay f32.
#include "layers/attention/cuda/full.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "core/math.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "layers/attention/cuda/dropout.h"

namespace clustr::cuda {

namespace {

using cpu::FullAttentionDims;
using cpu::FullAttentionParams;

// A block of 128 query rows (the CPU's block), batched over the heads, gives each GEMM enough
// work for a GPU while keeping the score blocks an eighth of N x S at N = 1024. Bq shrinks only
// past 256 MiB of scores (H = 6: S > 87381): each block's products read all of K and V, so
// fewer rows would multiply that traffic and the launches (with a 16 MiB bound, Bq = 10 at
// S = 65536 took an H100 32 s for one forward + backward). Several sequences share a block only
// within 16 MiB, which bounds the scratch of short sequences.
constexpr int64_t kBlockQ = 128;
constexpr int64_t kBlockFloats = int64_t(1) << 26;
constexpr int64_t kGroupFloats = int64_t(1) << 22;

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Bq: rows of a query block.
int64_t block_rows(const FullAttentionDims& d) {
  const int64_t per_row = max64(1, d.H * d.S);
  return max64(1, min64(min64(kBlockQ, max64(1, d.N)), kBlockFloats / per_row));
}
// Sequences whose score blocks are computed together: as many as fit kGroupFloats (at least
// 1, at most B, and pairs within a grid's 65535 rows in y).
int64_t group_sequences(const FullAttentionDims& d) {
  const int64_t one = max64(1, d.H * block_rows(d) * max64(1, d.S));
  return max64(1, min64(min64(d.B, kGroupFloats / one), 65535 / max64(1, d.H)));
}
// Floats of one score block (pairs, Bq, S) of a full group.
int64_t score_floats(const FullAttentionDims& d) {
  return group_sequences(d) * d.H * block_rows(d) * max64(1, d.S);
}

using attention_kernels::Dropout;
using attention_kernels::dropout_of;
using attention_kernels::for_each_word;

// Where one query block's rows are: rows [i0, i0 + rows) of sequence b, keys [0, ld) computed.
struct BlockRows {
  int64_t b, i0, rows, ld;  // ld = Sb, the row length of the score block
  int64_t length;           // keys j < length are valid
};

// The columns of score row (h, r) that row i0 + r sees, [0, n).
CLUSTR_DEVICE int64_t seen_columns(const BlockRows& k, bool causal, int64_t r) {
  const int64_t n = math::attention_keys_seen(k.i0 + r, k.length, causal);
  return n < 0 ? 0 : n < k.ld ? n : k.ld;
}

// Forward, one CUDA block per score row (grid rows x pairs; pair y is sequence k.b + y / H,
// head y % H, and bh = k.b H + y its index in (B, H)): s (pairs, rows, ld) holds t q . k and
// becomes the weights, masked columns 0, P = exp(s - m) / l with the dropout mask applied;
// logsumexp (b, h, i0 + r) = m + log(l). A row that sees no key gets 0 and -inf.
struct ForwardRowsKernel {
  static constexpr bool kUsesBarrier = true;
  float* s;
  float* logsumexp;  // (B, H, N)
  BlockRows k;
  int64_t H, N, S;
  bool causal;
  Dropout drop;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t r = t.block_idx().x, h = t.block_idx().y, bh = k.b * H + h;
    float* x = s + (h * k.rows + r) * k.ld;
    const int64_t n = seen_columns(k, causal, r);
    float m = -INFINITY;
    for (int64_t j = tid; j < n; j += nt) m = math::Maximum{}(m, x[j]);
    m = block_reduce(t, m, t.shared<float>(), math::Maximum{});
    if (n == 0) {  // the same n for every thread: the whole block returns
      for (int64_t j = tid; j < k.ld; j += nt) x[j] = 0.0f;
      if (tid == 0) logsumexp[bh * N + k.i0 + r] = -INFINITY;
      return;
    }
    double acc = 0.0;
    for (int64_t j = tid; j < n; j += nt) acc += math::exp(x[j] - m);
    const float l = static_cast<float>(block_reduce(t, acc, t.shared<double>(), AddDouble{}));
    if (tid == 0) logsumexp[bh * N + k.i0 + r] = math::attention_lse(m, l);
    const float inv = 1.0f / l;  // l >= 1: the max contributes exp(0)
    if (drop.p > 0.0f) {
      const float p = drop.p, scale = drop.scale;
      for_each_word(t, drop, math::attention_dropout_index(bh, N, k.i0 + r, S, 0), n,
                    [&](int64_t j, uint32_t w) {
                      x[j] = math::dropout_value(math::exp(x[j] - m) * inv, w, p, scale);
                    });
    } else {
      for (int64_t j = tid; j < n; j += nt) x[j] = math::exp(x[j] - m) * inv;
    }
    for (int64_t j = n + tid; j < k.ld; j += nt) x[j] = 0.0f;
  }
};

// Backward, one CUDA block per score row (grid rows x pairs, as forward): s and dp (pairs,
// rows, ld) hold t q . k
// and dO V^T; s becomes Pd = P keep scale and dp becomes dS = P (dP keep scale - D), with
// P = exp(s - lse) and D = dO_i . O_i (summed here, in double). Masked columns, and every column
// of a row with lse = -inf, are 0 in both.
struct BackwardRowsKernel {
  static constexpr bool kUsesBarrier = true;
  float* s;
  float* dp;
  const float* logsumexp;  // (B, H, N)
  const float* dout;       // (B, H, N, M)
  const float* out;        // (B, H, N, M)
  BlockRows k;
  int64_t H, N, S, M;
  bool causal;
  Dropout drop;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t r = t.block_idx().x, h = t.block_idx().y, bh = k.b * H + h;
    const int64_t i = k.i0 + r;
    float* x = s + (h * k.rows + r) * k.ld;
    float* g = dp + (h * k.rows + r) * k.ld;
    const float* o = out + (bh * N + i) * M;
    const float* dO = dout + (bh * N + i) * M;
    double acc = 0.0;
    for (int64_t c = tid; c < M; c += nt) acc += double(dO[c]) * o[c];
    const float D = static_cast<float>(block_reduce(t, acc, t.shared<double>(), AddDouble{}));
    const float lr = logsumexp[bh * N + i];
    const int64_t n = lr == -INFINITY ? 0 : seen_columns(k, causal, r);
    if (drop.p > 0.0f) {
      const float p = drop.p, scale = drop.scale;
      for_each_word(t, drop, math::attention_dropout_index(bh, N, i, S, 0), n,
                    [&](int64_t j, uint32_t w) {
                      const float pr = math::exp(x[j] - lr);
                      x[j] = math::dropout_value(pr, w, p, scale);
                      g[j] = math::softmax_dx(pr, math::dropout_value(g[j], w, p, scale), D);
                    });
    } else {
      for (int64_t j = tid; j < n; j += nt) {
        const float pr = math::exp(x[j] - lr);
        x[j] = pr;
        g[j] = math::softmax_dx(pr, g[j], D);
      }
    }
    for (int64_t j = n + tid; j < k.ld; j += nt) x[j] = g[j] = 0.0f;
  }
};

// Rows [i0, N) of the (sequence, head) pairs [pair0, pair0 + pairs) see no key (padding, or
// no valid key at all): out rows 0 and logsumexp -inf. One thread per row.
struct EmptyRowsKernel {
  static constexpr bool kUsesBarrier = false;
  float* out;        // (B, H, N, M)
  float* logsumexp;  // (B, H, N)
  int64_t pair0, pairs, i0, N, M;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t per_head = N - i0;
    for (int64_t e = global_x(t); e < pairs * per_head; e += grid_stride_x(t)) {
      const int64_t row = (pair0 + e / per_head) * N + i0 + e % per_head;
      for (int64_t c = 0; c < M; ++c) out[row * M + c] = 0.0f;
      logsumexp[row] = -INFINITY;
    }
  }
};

// The query rows of sequence b that see a key: [0, live). With N == S and lengths, rows at
// positions >= lengths[b] are padding; with no valid key no row sees one.
struct Sequence {
  int64_t length, live;
};
Sequence sequence_of(const FullAttentionDims& d, const FullAttentionParams& p, int64_t b) {
  Sequence q;
  q.length = p.lengths ? p.lengths[b] : d.S;
  q.live = q.length == 0 ? 0 : (p.lengths && d.N == d.S) ? q.length : d.N;
  return q;
}

// Calls f(b0, nb, q) for each run of consecutive sequences [b0, b0 + nb) with the same rows and
// keys q, at most group_sequences(d) of them.
template <class F>
void for_each_run(const FullAttentionDims& d, const FullAttentionParams& p, F f) {
  const int64_t group = group_sequences(d);
  for (int64_t b0 = 0; b0 < d.B;) {
    const Sequence q = sequence_of(d, p, b0);
    int64_t nb = 1;
    for (; b0 + nb < d.B && nb < group; ++nb) {
      const Sequence r = sequence_of(d, p, b0 + nb);
      if (r.length != q.length || r.live != q.live) break;
    }
    f(b0, nb, q);
    b0 += nb;
  }
}

// The block of rows [i0, i0 + Bq) clipped to the live rows, and the keys its last row sees.
BlockRows block_of(const FullAttentionParams& p, const Sequence& q, int64_t b, int64_t i0,
                   int64_t bq) {
  BlockRows k;
  k.b = b;
  k.i0 = i0;
  k.rows = min64(bq, q.live - i0);
  k.length = q.length;
  k.ld = math::attention_keys_seen(i0 + k.rows - 1, q.length, p.causal);
  return k;
}

// An operand of the batched products: its f32 elements and, for bf16 products, a bf16 copy.
struct Operand {
  const float* f;
  const uint16_t* h;  // null for f32 products
  Operand at(int64_t offset) const { return {f + offset, h ? h + offset : nullptr}; }
};

// The bf16 copies of one call (p.bf16): each operand converted once, kept until the call ends.
class Bf16Copies {
 public:
  explicit Bf16Copies(bool on) : on_(on) {}
  // x (n floats) as an operand, with a bf16 copy when the products are bf16.
  Operand operand(const float* x, int64_t n) {
    if (!on_) return {x, nullptr};
    copies_.push_back(Tensor::empty({n}, DType::bf16, Device::cuda));
    f32_to_bf16(x, copies_.back().bf16(), n);
    return {x, copies_.back().bf16()};
  }
  // A scratch block that is rewritten for each query block: converted into one buffer of n
  // values made on first use.
  Operand scratch(const float* x, int64_t n, int64_t capacity, int slot) {
    if (!on_) return {x, nullptr};
    Tensor& buffer = slot == 0 ? scratch0_ : scratch1_;
    if (!buffer.defined()) buffer = Tensor::empty({capacity}, DType::bf16, Device::cuda);
    f32_to_bf16(x, buffer.bf16(), n);
    return {x, buffer.bf16()};
  }

 private:
  bool on_;
  std::vector<Tensor> copies_;
  Tensor scratch0_, scratch1_;
};

// cuda::gemm_strided_batched, or its bf16 twin on the operands' copies.
void product(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
             Operand A, int64_t lda, int64_t stride_a, Operand B, int64_t ldb, int64_t stride_b,
             float beta, float* C, int64_t ldc, int64_t stride_c, int64_t batch) {
  if (A.h)
    return gemm_bf16_strided_batched(trans_a, trans_b, M, N, K, alpha, A.h, lda, stride_a, B.h,
                                     ldb, stride_b, beta, C, ldc, stride_c, batch);
  gemm_strided_batched(trans_a, trans_b, M, N, K, alpha, A.f, lda, stride_a, B.f, ldb, stride_b,
                       beta, C, ldc, stride_c, batch);
}

}  // namespace

int64_t full_attention_forward_workspace(const FullAttentionDims& d) { return score_floats(d); }
int64_t full_attention_backward_workspace(const FullAttentionDims& d) {
  return 2 * score_floats(d);
}

void full_attention_forward(const FullAttentionDims& d, const FullAttentionParams& p,
                            const float* Q, const float* K, const float* V, float* out,
                            float* logsumexp, float* workspace) {
  if (d.B * d.H * d.N == 0) return;
  require("cuda::full_attention_forward");
  const int64_t H = d.H, N = d.N, S = d.S, E = d.E, M = d.M, bq = block_rows(d);
  const float t = p.temperature;
  const Dropout drop = dropout_of(p);
  float* s = workspace;
  Bf16Copies copies(p.bf16);
  const Operand q_all = copies.operand(Q, d.B * H * N * E);
  const Operand k_all = copies.operand(K, d.B * H * S * E);
  const Operand v_all = copies.operand(V, d.B * H * S * M);
  for_each_run(d, p, [&](int64_t b0, int64_t nb, const Sequence& q) {
    const int64_t pairs = nb * H;
    if (q.live < N)
      launch("cuda::full_attention_forward (empty rows)",
             {elementwise_blocks(pairs * (N - q.live))}, {kElementwiseThreads}, 0,
             EmptyRowsKernel{out, logsumexp, b0 * H, pairs, q.live, N, M});
    const Operand qb = q_all.at(b0 * H * N * E);
    const Operand kb = k_all.at(b0 * H * S * E);
    const Operand vb = v_all.at(b0 * H * S * M);
    float* ob = out + b0 * H * N * M;
    for (int64_t i0 = 0; i0 < q.live; i0 += bq) {
      const BlockRows k = block_of(p, q, b0, i0, bq);
      const int64_t rows = k.rows, ld = k.ld;
      // scores (pairs, rows, Sb) = t Q_blk K^T
      product(false, true, rows, ld, E, t, qb.at(i0 * E), E, N * E, kb, E, S * E, 0.0f, s, ld,
              rows * ld, pairs);
      const unsigned threads = row_threads(ld);
      launch("cuda::full_attention_forward (rows)", {static_cast<unsigned>(rows),
             static_cast<unsigned>(pairs)}, {threads}, threads * sizeof(double),
             ForwardRowsKernel{s, logsumexp, k, H, N, S, p.causal, drop});
      // out_blk (pairs, rows, M) = P V
      const Operand P = copies.scratch(s, pairs * rows * ld, score_floats(d), 0);
      product(false, false, rows, M, ld, 1.0f, P, ld, rows * ld, vb, M, S * M, 0.0f, ob + i0 * M,
              M, N * M, pairs);
    }
  });
}

void full_attention_backward(const FullAttentionDims& d, const FullAttentionParams& p,
                             const float* Q, const float* K, const float* V, const float* out,
                             const float* logsumexp, const float* dout, float* dQ, float* dK,
                             float* dV, float* workspace) {
  // Rows that see no key give no gradient; dK and dV are sums over the query blocks.
  fill_f32(dQ, 0.0f, d.B * d.H * d.N * d.E);
  fill_f32(dK, 0.0f, d.B * d.H * d.S * d.E);
  fill_f32(dV, 0.0f, d.B * d.H * d.S * d.M);
  if (d.B * d.H * d.N == 0) return;
  require("cuda::full_attention_backward");
  const int64_t H = d.H, N = d.N, S = d.S, E = d.E, M = d.M, bq = block_rows(d);
  const float t = p.temperature;
  const Dropout drop = dropout_of(p);
  float* s = workspace;
  float* dp = workspace + score_floats(d);
  Bf16Copies copies(p.bf16);
  const Operand q_all = copies.operand(Q, d.B * H * N * E);
  const Operand k_all = copies.operand(K, d.B * H * S * E);
  const Operand v_all = copies.operand(V, d.B * H * S * M);
  const Operand do_all = copies.operand(dout, d.B * H * N * M);
  for_each_run(d, p, [&](int64_t b0, int64_t nb, const Sequence& q) {
    const int64_t pairs = nb * H;
    const Operand qb = q_all.at(b0 * H * N * E);
    const Operand kb = k_all.at(b0 * H * S * E);
    const Operand vb = v_all.at(b0 * H * S * M);
    const Operand dob = do_all.at(b0 * H * N * M);
    float* dqb = dQ + b0 * H * N * E;
    float* dkb = dK + b0 * H * S * E;
    float* dvb = dV + b0 * H * S * M;
    for (int64_t i0 = 0; i0 < q.live; i0 += bq) {
      const BlockRows k = block_of(p, q, b0, i0, bq);
      const int64_t rows = k.rows, ld = k.ld;
      const Operand qi = qb.at(i0 * E);
      const Operand doi = dob.at(i0 * M);
      product(false, true, rows, ld, E, t, qi, E, N * E, kb, E, S * E, 0.0f, s, ld, rows * ld,
              pairs);
      product(false, true, rows, ld, M, 1.0f, doi, M, N * M, vb, M, S * M, 0.0f, dp, ld,
              rows * ld, pairs);
      const unsigned threads = row_threads(max64(ld, M));
      launch("cuda::full_attention_backward (rows)", {static_cast<unsigned>(rows),
             static_cast<unsigned>(pairs)}, {threads}, threads * sizeof(double),
             BackwardRowsKernel{s, dp, logsumexp, dout, out, k, H, N, S, M, p.causal, drop});
      // dV[:Sb] += Pd^T dO_blk, dQ_blk = t dS K[:Sb], dK[:Sb] += t dS^T Q_blk
      const Operand pd = copies.scratch(s, pairs * rows * ld, score_floats(d), 0);
      const Operand ds = copies.scratch(dp, pairs * rows * ld, score_floats(d), 1);
      product(true, false, ld, M, rows, 1.0f, pd, ld, rows * ld, doi, M, N * M, 1.0f, dvb, M,
              S * M, pairs);
      product(false, false, rows, E, ld, t, ds, ld, rows * ld, kb, E, S * E, 0.0f, dqb + i0 * E,
              E, N * E, pairs);
      product(true, false, ld, E, rows, t, ds, ld, rows * ld, qi, E, N * E, 1.0f, dkb, E, S * E,
              pairs);
    }
  });
}

}  // namespace clustr::cuda
