// Reformer attention and shared-full (see reformer.h): hashing, the sort, and the chunked
// products, one (b, h) pair per task.
//
// Each chunk's products run through the GEMM on rows gathered into a window in sorted order: its
// queries (raw q), its keys (unit k) and values from the chunk and the one before (Scratch says
// how the window moves, so that each row is fetched once a round). Forward keeps, per query, an
// online softmax over everything it has seen in the rounds so far (running max, sum and weighted
// sum of values, Milakov & Gimelshein 2018); backward recomputes the weights from the saved z.
#include "layers/attention/reformer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/node.h"
#include "core/cpu/gemm.h"
#include "core/error.h"
#include "core/math.h"
#include "core/ops_check.h"
#include "core/parallel.h"
#include "layers/attention/clustered_common.h"
#include "layers/attention/cuda/reformer.h"
#include "layers/attention/reformer_mask.h"

namespace clustr {

namespace {

constexpr int64_t kRowBlock = 64;  // query rows per product, bounding the scratch at long chunks
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Dims {
  int64_t B, H, N, E, M, X, R, m;
};

using clustered_detail::Dropout;

// The dropout of a call's options (off when p is 0); its offset is a host value (ReformerOptions).
Dropout dropout_of(const ReformerOptions& o) {
  return clustered_detail::dropout_of(o.dropout, o.seed, o.offset);
}

// The dropout factor of query i and key j in round x of pair bh (reformer.h's mask).
float keep_factor(const Dropout& drop, const Dims& d, int64_t bh, int64_t x, int64_t i,
                  int64_t j) {
  return reformer_detail::keep_factor(drop.seed, drop.offset.value,
                                      reformer_detail::mask_index(d.N, d.X, bh, x, i, j), drop.p,
                                      drop.scale);
}

cuda::ReformerDropout device_dropout(const Dropout& drop) {
  return cuda::ReformerDropout{drop.p, drop.scale, drop.seed, drop.offset.value};
}

Dims check_inputs(const char* op, const Tensor& Q, const Tensor& V, const Tensor& lengths,
                  const Tensor& rotations, const ReformerOptions& o) {
  detail::check_f32(op, "Q", Q);
  detail::check_f32(op, "V", V);
  detail::check_same_device(op, Q, V);
  CLUSTR_CHECK(Q.rank() == 4 && V.rank() == 4 && V.size(0) == Q.size(0) && V.size(1) == Q.size(1) &&
                   V.size(2) == Q.size(2),
               op, ": expected Q (B, H, N, E) and V (B, H, N, M) of one self-attention, got Q ",
               describe(Q), " and V ", describe(V));
  CLUSTR_CHECK(o.rounds >= 1, op, ": expected rounds >= 1, got ", o.rounds);
  CLUSTR_CHECK(o.buckets == 1 || (o.buckets >= 2 && o.buckets % 2 == 0), op,
               ": expected 1 bucket or an even number of them, got ", o.buckets);
  CLUSTR_CHECK(o.chunk >= 1, op, ": expected a chunk of at least 1 position, got ", o.chunk);
  CLUSTR_CHECK(o.dropout >= 0.0f && o.dropout < 1.0f, op, ": expected dropout in [0, 1), got ",
               o.dropout);
  const Dims d{Q.size(0), Q.size(1), Q.size(2), Q.size(3), V.size(3), o.rounds, o.buckets, o.chunk};
  if (lengths.defined()) detail::check_lengths(op, lengths, d.B, d.N, "N", "Q", Q);
  if (d.R > 1) {
    CLUSTR_CHECK(rotations.defined(), op, ": ", d.R, " buckets need rotations (", d.X, ", ", d.E,
                 ", ", d.R / 2, ")");
    detail::check_f32(op, "rotations", rotations);
    CLUSTR_CHECK(Q.device() == Device::cuda || rotations.device() == Device::cpu, op,
                 ": rotations on ", describe(rotations), " for queries on the cpu");
    CLUSTR_CHECK(rotations.shape() == (Shape{d.X, d.E, d.R / 2}), op,
                 ": expected rotations of shape (rounds ", d.X, ", E ", d.E, ", buckets / 2 ",
                 d.R / 2, "), got ", describe(rotations));
  }
  return d;
}

cuda::ReformerDims device_dims(const Dims& d) {
  return cuda::ReformerDims{d.B, d.H, d.N, d.E, d.M, d.X, d.R, d.m};
}

float temperature_of(const ReformerOptions& o, int64_t E) {
  return o.temperature > 0.0f ? o.temperature : 1.0f / std::sqrt(static_cast<float>(E));
}

// |q_j| for the L valid positions of one (b, h).
void row_norms(const float* q, int64_t L, int64_t E, float* norm) {
  for (int64_t j = 0; j < L; ++j) {
    double s = 0.0;
    for (int64_t e = 0; e < E; ++e) s += double(q[j * E + e]) * q[j * E + e];
    norm[j] = static_cast<float>(std::sqrt(s));
  }
}

// 1 / |q_j|, or 0 for q_j = 0 (whose unit key is 0).
float inverse_norm(float norm) { return norm > 0.0f ? 1.0f / norm : 0.0f; }

// k_j = q_j / |q_j| for the L valid positions of one (b, h); norms kept for backward.
void unit_keys(const float* q, int64_t L, int64_t E, float* k, float* norm) {
  row_norms(q, L, E, norm);
  for (int64_t j = 0; j < L; ++j) {
    const float inv = inverse_norm(norm[j]);
    for (int64_t e = 0; e < E; ++e) k[j * E + e] = q[j * E + e] * inv;
  }
}

// Round x's bucket of each valid position: the argmax of [k W, -k W] (ties: the lower index),
// the projections k W of all positions as one GEMM into proj (L, R / 2).
void hash_round(const float* k, int64_t L, int64_t E, const float* W, int64_t R, int32_t* bucket,
                float* proj) {
  if (R == 1) {
    std::fill(bucket, bucket + L, 0);
    return;
  }
  const int64_t half = R / 2;
  cpu::gemm(false, false, L, half, E, 1.0f, k, E, W, half, 0.0f, proj, half);
  for (int64_t j = 0; j < L; ++j) {
    const float* p = proj + j * half;
    int32_t arg = 0;
    float best = p[0];
    for (int64_t c = 1; c < R; ++c) {
      const float v = c < half ? p[c] : -p[c - half];
      if (v > best) best = v, arg = int32_t(c);
    }
    bucket[j] = arg;
  }
}

// The valid positions sorted by (bucket, position): a counting sort.
void sort_round(const int32_t* bucket, int64_t L, int64_t R, std::vector<int64_t>& count,
                int32_t* order) {
  count.assign(static_cast<size_t>(R + 1), 0);
  for (int64_t j = 0; j < L; ++j) ++count[size_t(bucket[j]) + 1];
  for (int64_t c = 0; c < R; ++c) count[size_t(c) + 1] += count[size_t(c)];
  for (int64_t j = 0; j < L; ++j) order[count[size_t(bucket[j])]++] = int32_t(j);
}

// Scratch of one task, carved from one tensor (so that the allocator's figures count it).
//
// A round walks its chunks in sorted order through a window: the rows of the sorted positions
// [k0, q1) that chunk [q0, q1) sees, at rows 0.. of each window array (q, unit k, v; backward
// also dout and the gradients). Moving on, the chunk's rows stay as the next one's previous
// chunk and the next chunk's rows are gathered after them, so each position's rows are read
// once a round, and backward's gradients of a position go to it once a round, when its rows
// leave the window.
struct Scratch {
  float *k, *norm;           // forward's unit keys (N, E) for hashing; |q| (N)
  int32_t* bucket;           // (N)
  float *qw, *kw, *vw, *gw;  // the window's rows: q, unit k, v, dout
  float *s, *t, *scale;      // a block's products; forward: its rows' rescaling
  float *mx, *l, *acc;       // forward: each query's online softmax across rounds
  float *dp, *dqw, *dkw, *dvw;  // backward: dP of a block; the window's gradients
  float* delta;                 // backward: dout . out (N)
  std::vector<int64_t> count;   // the sort's (R + 1)
  float* proj;                  // the projections on a round's rotation (N, R / 2)
};

Tensor make_scratch(const Dims& d, bool backward, Scratch& s) {
  const int64_t nk = std::min<int64_t>(2 * d.m, d.N), rows = std::min(kRowBlock, d.m);
  return clustered_detail::carve([&](clustered_detail::Carve& c) {
    s.norm = c.f32(d.N);
    s.bucket = c.i32(d.N);
    s.qw = c.f32(nk * d.E);
    s.kw = c.f32(nk * d.E);
    s.vw = c.f32(nk * d.M);
    s.s = c.f32(rows * nk);
    if (!backward) {  // backward reads the saved orders: no hashing
      s.k = c.f32(d.N * d.E);
      s.proj = c.f32(d.N * (d.R / 2));
      s.t = c.f32(rows * d.M);
      s.scale = c.f32(rows);
      s.mx = c.f32(d.N);
      s.l = c.f32(d.N);
      s.acc = c.f32(d.N * d.M);
      return;
    }
    s.gw = c.f32(nk * d.M);
    s.dp = c.f32(rows * nk);
    s.dqw = c.f32(nk * d.E);
    s.dkw = c.f32(nk * d.E);
    s.dvw = c.f32(nk * d.M);
    s.delta = c.f32(d.N);
  });
}

// Walks a round's L sorted positions chunk by chunk: chunk(w0, k0, q0, q1) for each chunk [q0,
// q1), with k0 the first key it sees (the start of the chunk before, or 0) and w0 the first
// position the window held until now (its rows [0, k0 - w0) leave it, the rows of [k0, q0) stay
// and move to the front); then block(a0, a1, k0, nk) for each block of its query positions
// [a0, a1), with its keys [k0, k0 + nk).
template <typename Chunk, typename Block>
void for_each_chunk(int64_t L, int64_t m, Chunk chunk, Block block) {
  int64_t w0 = 0;
  for (int64_t q0 = 0; q0 < L; q0 += m) {
    const int64_t q1 = std::min(L, q0 + m), k0 = q0 >= m ? q0 - m : 0;
    chunk(w0, k0, q0, q1);
    w0 = k0;
    for (int64_t a0 = q0; a0 < q1; a0 += kRowBlock)
      block(a0, std::min(q1, a0 + kRowBlock), k0, q1 - k0);
  }
}

// Rows [from, from + n) of a (rows, width) array moved to rows [0, n) (from >= 0).
void move_rows(float* a, int64_t width, int64_t from, int64_t n) {
  if (from > 0) std::copy(a + from * width, a + (from + n) * width, a);
}

// The rows these loops reach in sorted order are random ones: each asks for the cache lines of
// the row kAhead iterations on, so that several rows are on their way from memory at once (at
// long N, where a pair's rows no longer fit in the caches, waiting for them one by one is what
// made the time per element grow with N).
constexpr int64_t kAhead = 8;

template <bool kWrite>
void prefetch_row(const float* row, int64_t width) {
  for (int64_t c = 0; c < width; c += 16) __builtin_prefetch(row + c, kWrite ? 1 : 0);
}

void gather(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) {
  for (int64_t r = 0; r < n; ++r) {
    if (r + kAhead < n) prefetch_row<false>(src + rows[r + kAhead] * width, width);
    std::copy(src + rows[r] * width, src + (rows[r] + 1) * width, dst + r * width);
  }
}

// Positions rows[0..n)'s q, unit k and v into qw, kw and vw. The unit key is q / |q| with
// unit_keys's arithmetic, so it equals the key the hashing saw, bit for bit.
void gather_keys(const float* q, const float* v, const float* norm, const int32_t* rows,
                 int64_t n, int64_t E, int64_t M, float* qw, float* kw, float* vw) {
  for (int64_t r = 0; r < n; ++r) {
    if (r + kAhead < n) {
      prefetch_row<false>(q + rows[r + kAhead] * E, E);
      prefetch_row<false>(v + rows[r + kAhead] * M, M);
    }
    const int64_t j = rows[r];
    const float inv = inverse_norm(norm[j]);
    const float* qj = q + j * E;
    for (int64_t e = 0; e < E; ++e) {
      qw[r * E + e] = qj[e];
      kw[r * E + e] = qj[e] * inv;
    }
    std::copy(v + j * M, v + (j + 1) * M, vw + r * M);
  }
}

// One (b, h) pair of the forward. q, v, out at the pair's (N, E), (N, M), (N, M); order (X, N);
// z (N). mx, l and acc: the online softmax of each query across rounds; the dropped weights go
// into acc, the whole ones into l.
void forward_pair(const Dims& d, float t, const Dropout& drop, int64_t bh, int64_t L,
                  const float* q, const float* v, const float* W, float* out, int32_t* order,
                  float* z, Scratch& s) {
  const int64_t E = d.E, M = d.M;
  float *mx = s.mx, *l = s.l, *acc = s.acc;
  unit_keys(q, L, E, s.k, s.norm);
  std::fill(mx, mx + L, kNegInf);
  std::fill(l, l + L, 0.0f);
  std::fill(acc, acc + L * M, 0.0f);
  for (int64_t x = 0; x < d.X; ++x) {
    int32_t* o = order + x * d.N;
    hash_round(s.k, L, E, d.R > 1 ? W + x * E * (d.R / 2) : nullptr, d.R, s.bucket, s.proj);
    sort_round(s.bucket, L, d.R, s.count, o);
    const auto chunk = [&](int64_t w0, int64_t k0, int64_t q0, int64_t q1) {
      const int64_t keep = q0 - k0;
      move_rows(s.qw, E, k0 - w0, keep);
      move_rows(s.kw, E, k0 - w0, keep);
      move_rows(s.vw, M, k0 - w0, keep);
      gather_keys(q, v, s.norm, o + q0, q1 - q0, E, M, s.qw + keep * E, s.kw + keep * E,
                  s.vw + keep * M);
    };
    const auto block = [&](int64_t a0, int64_t a1, int64_t k0, int64_t nk) {
      const int64_t nq = a1 - a0;
      cpu::gemm(false, true, nq, nk, E, t, s.qw + (a0 - k0) * E, E, s.kw, E, 0.0f, s.s, nk);
      for (int64_t a = 0; a < nq; ++a) {
        float* row = s.s + a * nk;
        row[a0 + a - k0] = kNegInf;  // the query itself
        const int32_t i = o[a0 + a];
        float top = kNegInf;
        for (int64_t b = 0; b < nk; ++b) top = std::max(top, row[b]);
        s.scale[a] = 1.0f;
        if (top == kNegInf) {  // nothing but itself in this block
          std::fill(row, row + nk, 0.0f);
          continue;
        }
        const float m_new = std::max(mx[i], top);
        s.scale[a] = l[i] > 0.0f ? math::exp(mx[i] - m_new) : 0.0f;
        float sum = 0.0f;
        for (int64_t b = 0; b < nk; ++b) sum += row[b] = math::exp(row[b] - m_new);
        if (drop.on())
          for (int64_t b = 0; b < nk; ++b)
            row[b] *= keep_factor(drop, d, bh, x, i, o[k0 + b]);
        l[i] = l[i] * s.scale[a] + sum;
        mx[i] = m_new;
      }
      cpu::gemm(false, false, nq, M, nk, 1.0f, s.s, nk, s.vw, M, 0.0f, s.t, M);
      for (int64_t a = 0; a < nq; ++a) {  // acc_i = acc_i scale + this block's sum
        if (a + kAhead < nq) prefetch_row<true>(acc + int64_t(o[a0 + a + kAhead]) * M, M);
        float* ai = acc + int64_t(o[a0 + a]) * M;
        const float* ta = s.t + a * M;
        const float sc = s.scale[a];
        for (int64_t c = 0; c < M; ++c) ai[c] = ai[c] * sc + ta[c];
      }
    };
    for_each_chunk(L, d.m, chunk, block);
  }
  for (int64_t i = 0; i < L; ++i) {
    if (l[i] == 0.0f) {  // no key but itself in any round: its own value
      std::copy(v + i * M, v + (i + 1) * M, out + i * M);
      z[i] = kNegInf;
      continue;
    }
    for (int64_t c = 0; c < M; ++c) out[i * M + c] = acc[i * M + c] / l[i];
    z[i] = mx[i] + std::log(l[i]);
  }
}

// Backward's gradients of the window's first n rows (sorted positions rows[0..n)) to their
// positions: dv_j += dvw_r and dq_j += dqw_r + (dkw_r - k_j (k_j . dkw_r)) / |q_j|, the key
// term through k = q / |q|.
void flush_rows(const int32_t* rows, int64_t n, int64_t E, int64_t M, const Scratch& s,
                float* dq, float* dv) {
  for (int64_t r = 0; r < n; ++r) {
    if (r + kAhead < n) {
      prefetch_row<true>(dq + rows[r + kAhead] * E, E);
      prefetch_row<true>(dv + rows[r + kAhead] * M, M);
    }
    const int64_t j = rows[r];
    const float *dqr = s.dqw + r * E, *dkr = s.dkw + r * E, *kr = s.kw + r * E;
    const float* dvr = s.dvw + r * M;
    float *dqj = dq + j * E, *dvj = dv + j * M;
    for (int64_t c = 0; c < M; ++c) dvj[c] += dvr[c];
    if (s.norm[j] == 0.0f) {  // k_j = 0 whatever q_j: no key term
      for (int64_t e = 0; e < E; ++e) dqj[e] += dqr[e];
      continue;
    }
    float dot = 0.0f;
    for (int64_t e = 0; e < E; ++e) dot += kr[e] * dkr[e];
    const float inv = 1.0f / s.norm[j];
    for (int64_t e = 0; e < E; ++e) dqj[e] += dqr[e] + (dkr[e] - kr[e] * dot) * inv;
  }
}

// One (b, h) pair of the backward: dq and dv at the pair's rows (zeroed by the caller).
void backward_pair(const Dims& d, float t, const Dropout& drop, int64_t bh, int64_t L,
                   const float* q, const float* v, const float* out, const float* g,
                   const int32_t* order, const float* z, float* dq, float* dv, Scratch& s) {
  const int64_t E = d.E, M = d.M;
  float* delta = s.delta;
  row_norms(q, L, E, s.norm);
  for (int64_t i = 0; i < L; ++i) {  // dO_i . out_i
    float acc = 0.0f;
    for (int64_t c = 0; c < M; ++c) acc += g[i * M + c] * out[i * M + c];
    delta[i] = acc;
  }
  for (int64_t x = 0; x < d.X; ++x) {
    const int32_t* o = order + x * d.N;
    int64_t start = 0;  // the window's first sorted position
    const auto chunk = [&](int64_t w0, int64_t k0, int64_t q0, int64_t q1) {
      const int64_t keep = q0 - k0, n = q1 - q0;
      flush_rows(o + w0, k0 - w0, E, M, s, dq, dv);  // the rows that leave
      for (float* a : {s.qw, s.kw, s.dqw, s.dkw}) move_rows(a, E, k0 - w0, keep);
      for (float* a : {s.vw, s.gw, s.dvw}) move_rows(a, M, k0 - w0, keep);
      gather_keys(q, v, s.norm, o + q0, n, E, M, s.qw + keep * E, s.kw + keep * E,
                  s.vw + keep * M);
      gather(g, M, o + q0, n, s.gw + keep * M);
      std::fill(s.dkw + keep * E, s.dkw + (keep + n) * E, 0.0f);
      std::fill(s.dvw + keep * M, s.dvw + (keep + n) * M, 0.0f);
      start = k0;
    };
    const auto block = [&](int64_t a0, int64_t a1, int64_t k0, int64_t nk) {
      const int64_t nq = a1 - a0;
      const float *qa = s.qw + (a0 - k0) * E, *ga = s.gw + (a0 - k0) * M;
      cpu::gemm(false, true, nq, nk, E, t, qa, E, s.kw, E, 0.0f, s.s, nk);
      cpu::gemm(false, true, nq, nk, M, 1.0f, ga, M, s.vw, M, 0.0f, s.dp, nk);
      // The dropped weights Pd = P keep scale and dS = P (dP keep scale - delta) in place of S
      // and dP (delta = dout . out: out has the dropout).
      for (int64_t a = 0; a < nq; ++a) {
        float *p = s.s + a * nk, *ds = s.dp + a * nk;
        const int32_t i = o[a0 + a];
        const float zi = z[i], di = delta[i];
        if (zi == kNegInf) {  // took its own value: no weights
          std::fill(p, p + nk, 0.0f);
          std::fill(ds, ds + nk, 0.0f);
          continue;
        }
        for (int64_t b = 0; b < nk; ++b) p[b] = math::exp(p[b] - zi);
        p[a0 + a - k0] = 0.0f;  // the query itself
        if (!drop.on()) {
          for (int64_t b = 0; b < nk; ++b) ds[b] = p[b] * (ds[b] - di);
          continue;
        }
        for (int64_t b = 0; b < nk; ++b) {
          const float keep = keep_factor(drop, d, bh, x, i, o[k0 + b]);
          ds[b] = p[b] * (ds[b] * keep - di);
          p[b] *= keep;
        }
      }
      cpu::gemm(true, false, nk, M, nq, 1.0f, s.s, nk, ga, M, 1.0f, s.dvw, M);
      cpu::gemm(false, false, nq, E, nk, t, s.dp, nk, s.kw, E, 0.0f, s.dqw + (a0 - k0) * E, E);
      cpu::gemm(true, false, nk, E, nq, t, s.dp, nk, qa, E, 1.0f, s.dkw, E);
    };
    for_each_chunk(L, d.m, chunk, block);
    flush_rows(o + start, L - start, E, M, s, dq, dv);  // the last window
  }
  for (int64_t i = 0; i < L; ++i)
    if (z[i] == kNegInf)  // took its own value
      for (int64_t c = 0; c < M; ++c) dv[i * M + c] += g[i * M + c];
}

// Runs f(bh, L, scratch) for every (b, h) pair, one task each.
template <typename F>
void for_each_pair(const Dims& d, const int32_t* len, bool backward, F f) {
#pragma omp parallel if (d.B * d.H > 1)
  {
    ThreadCountScope one(1);  // the GEMMs of a task run on its thread
    Scratch s;
    const Tensor hold = make_scratch(d, backward, s);
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < d.B * d.H; ++bh) f(bh, len ? int64_t(len[bh / d.H]) : d.N, s);
  }
}

class ReformerNode : public Node {
 public:
  const char* name() const override { return "reformer_attention"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    ReformerGrads r = reformer_attention_backward(g, Q_, V_, lengths_, saved_, options_);
    return {std::move(r.dQ), std::move(r.dV)};
  }
  void release() override {
    Q_ = V_ = lengths_ = Tensor();
    saved_ = ReformerOutput();
  }

  Tensor Q_, V_, lengths_;
  ReformerOutput saved_;
  ReformerOptions options_;
};

}  // namespace

ReformerOutput reformer_attention_forward(const Tensor& Q, const Tensor& V, const Tensor& lengths,
                                          const Tensor& rotations, const ReformerOptions& options) {
  const Dims d = check_inputs("reformer_attention", Q, V, lengths, rotations, options);
  const float t = temperature_of(options, d.E);
  const Dropout drop = dropout_of(options);
  ReformerOutput r;
  if (Q.device() == Device::cuda) {
    r.out = Tensor::empty({d.B, d.H, d.N, d.M}, DType::f32, Device::cuda);
    r.order = Tensor::empty({d.B, d.H, d.X, d.N}, DType::i32, Device::cuda);
    r.logsumexp = Tensor::empty({d.B, d.H, d.N}, DType::f32, Device::cuda);
    const Tensor W = d.R > 1 ? rotations.to(Device::cuda) : Tensor();  // a host draw
    cuda::reformer_attention_forward(device_dims(d), lengths.defined() ? lengths.i32() : nullptr, t,
                                     device_dropout(drop), Q.f32(), V.f32(),
                                     d.R > 1 ? W.f32() : nullptr, r.out.f32(), r.order.i32(),
                                     r.logsumexp.f32());
    return r;
  }
  r.out = Tensor::zeros({d.B, d.H, d.N, d.M});
  r.order = Tensor::zeros({d.B, d.H, d.X, d.N}, DType::i32);
  r.logsumexp = Tensor::full({d.B, d.H, d.N}, kNegInf);
  const float *q = Q.f32(), *v = V.f32(), *W = d.R > 1 ? rotations.f32() : nullptr;
  float *out = r.out.f32(), *z = r.logsumexp.f32();
  int32_t* order = r.order.i32();
  const int32_t* len = lengths.defined() ? lengths.i32() : nullptr;
  for_each_pair(d, len, false, [&](int64_t bh, int64_t L, Scratch& s) {
    forward_pair(d, t, drop, bh, L, q + bh * d.N * d.E, v + bh * d.N * d.M, W,
                 out + bh * d.N * d.M, order + bh * d.X * d.N, z + bh * d.N, s);
  });
  return r;
}

ReformerGrads reformer_attention_backward(const Tensor& dout, const Tensor& Q, const Tensor& V,
                                          const Tensor& lengths, const ReformerOutput& forward,
                                          const ReformerOptions& options) {
  const char* op = "reformer_attention_backward";
  const Dims d =
      check_inputs(op, Q, V, lengths, Tensor(),
                   ReformerOptions{options.rounds, 1, options.chunk, options.temperature,
                                   options.dropout});
  const Shape out_shape{d.B, d.H, d.N, d.M};
  CLUSTR_CHECK(
      dout.defined() && dout.dtype() == DType::f32 && dout.shape() == out_shape &&
          forward.out.defined() && forward.out.shape() == out_shape && forward.order.defined() &&
          forward.order.shape() == (Shape{d.B, d.H, d.X, d.N}) && forward.logsumexp.defined() &&
          forward.logsumexp.shape() == (Shape{d.B, d.H, d.N}),
      op, ": expected dout and the forward's out ", to_string(out_shape), ", order (", d.B, ", ",
      d.H, ", ", d.X, ", ", d.N, ") and logsumexp (", d.B, ", ", d.H, ", ", d.N, ")");
  const float t = temperature_of(options, d.E);
  const Dropout drop = dropout_of(options);
  ReformerGrads r;
  for (const Tensor* x : {&dout, &forward.out, &forward.order, &forward.logsumexp})
    detail::check_same_device(op, Q, *x);
  if (Q.device() == Device::cuda) {
    r.dQ = Tensor::empty(Q.shape(), DType::f32, Device::cuda);
    r.dV = Tensor::empty(V.shape(), DType::f32, Device::cuda);
    cuda::reformer_attention_backward(device_dims(d), lengths.defined() ? lengths.i32() : nullptr,
                                      t, device_dropout(drop), Q.f32(), V.f32(), forward.out.f32(),
                                      forward.order.i32(), forward.logsumexp.f32(), dout.f32(),
                                      r.dQ.f32(), r.dV.f32());
    return r;
  }
  r.dQ = Tensor::zeros(Q.shape());
  r.dV = Tensor::zeros(V.shape());
  const float *q = Q.f32(), *v = V.f32(), *out = forward.out.f32(), *g = dout.f32(),
              *z = forward.logsumexp.f32();
  const int32_t* order = forward.order.i32();
  float *dq = r.dQ.f32(), *dv = r.dV.f32();
  const int32_t* len = lengths.defined() ? lengths.i32() : nullptr;
  for_each_pair(d, len, true, [&](int64_t bh, int64_t L, Scratch& s) {
    backward_pair(d, t, drop, bh, L, q + bh * d.N * d.E, v + bh * d.N * d.M,
                  out + bh * d.N * d.M, g + bh * d.N * d.M, order + bh * d.X * d.N, z + bh * d.N,
                  dq + bh * d.N * d.E, dv + bh * d.N * d.M, s);
  });
  return r;
}

Variable reformer_attention(const Variable& Q, const Variable& V, const Tensor& lengths,
                            const Tensor& rotations, const ReformerOptions& options) {
  CLUSTR_CHECK(Q.defined() && V.defined(), "reformer_attention: use of an undefined Variable");
  ReformerOutput r = reformer_attention_forward(Q.data(), V.data(), lengths, rotations, options);
  if (!record_needed({&Q, &V})) return Variable(std::move(r.out));
  auto node = std::make_shared<ReformerNode>();
  node->Q_ = Q.data();
  node->V_ = V.data();
  node->lengths_ = lengths;
  node->saved_.out = r.out;
  node->saved_.order = std::move(r.order);
  node->saved_.logsumexp = std::move(r.logsumexp);
  node->options_ = options;
  return attach(std::move(r.out), std::move(node), {&Q, &V});
}

uint64_t reformer_attention_dropout_blocks(int64_t B, int64_t H, int64_t N, int64_t rounds) {
  CLUSTR_CHECK(B >= 0 && H >= 0 && N >= 0 && rounds >= 1,
               "reformer_attention_dropout_blocks: expected B, H, N >= 0 and rounds >= 1, got B=",
               B, " H=", H, " N=", N, " rounds=", rounds);
  const uint64_t elements =
      uint64_t(B) * uint64_t(H) * uint64_t(rounds) * uint64_t(N) * uint64_t(N);
  return (elements + 3) / 4;
}

Tensor reformer_buckets(const Tensor& Q, const Tensor& lengths, const Tensor& rotations,
                        int64_t buckets) {
  ReformerOptions o;
  o.buckets = buckets;
  o.rounds = buckets > 1 && rotations.defined() && rotations.rank() == 3 ? rotations.size(0) : 1;
  const Dims d = check_inputs("reformer_buckets", Q, Q, lengths, rotations, o);
  if (Q.device() == Device::cuda) {
    Tensor out = Tensor::empty({d.B, d.H, d.X, d.N}, DType::i32, Device::cuda);
    const Tensor W = d.R > 1 ? rotations.to(Device::cuda) : Tensor();
    cuda::reformer_buckets(device_dims(d), lengths.defined() ? lengths.i32() : nullptr, Q.f32(),
                           d.R > 1 ? W.f32() : nullptr, out.i32());
    return out;
  }
  Tensor out = Tensor::empty({d.B, d.H, d.X, d.N}, DType::i32);
  const float *q = Q.f32(), *W = d.R > 1 ? rotations.f32() : nullptr;
  int32_t* bk = out.i32();
  std::fill(bk, bk + out.numel(), -1);
  const int32_t* len = lengths.defined() ? lengths.i32() : nullptr;
  for_each_pair(d, len, false, [&](int64_t bh, int64_t L, Scratch& s) {
    unit_keys(q + bh * d.N * d.E, L, d.E, s.k, s.norm);
    for (int64_t x = 0; x < d.X; ++x)
      hash_round(s.k, L, d.E, W ? W + x * d.E * (d.R / 2) : nullptr, d.R, bk + (bh * d.X + x) * d.N,
                 s.proj);
  });
  return out;
}

}  // namespace clustr
