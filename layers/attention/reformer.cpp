// Reformer attention and shared-full (see reformer.h): hashing, the sort, and the chunked
// products, one (b, h) pair per task.
//
// Each chunk's products run through the GEMM on gathered rows: its queries (raw q), its keys
// (unit k) and values from the chunk and the one before. Forward keeps, per query, an online
// softmax over everything it has seen in the rounds so far (running max, sum and weighted sum of
// values, Milakov & Gimelshein 2018); backward recomputes the weights from the saved z.
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
#include "layers/attention/reformer_cuda.h"
#include "layers/attention/reformer_mask.h"

namespace clustr {

namespace {

constexpr int64_t kRowBlock = 64;  // query rows per product, bounding the scratch at long chunks
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Dims {
  int64_t B, H, N, E, M, X, R, m;
};

using clustered_detail::Dropout;

// The dropout of a call's options (off when p is 0).
Dropout dropout_of(const ReformerOptions& o) {
  return clustered_detail::dropout_of(o.dropout, o.seed, o.offset);
}

// The dropout factor of query i and key j in round x of pair bh (reformer.h's mask).
float keep_factor(const Dropout& drop, const Dims& d, int64_t bh, int64_t x, int64_t i,
                  int64_t j) {
  return reformer_detail::keep_factor(drop.seed, drop.offset,
                                      reformer_detail::mask_index(d.N, d.X, bh, x, i, j), drop.p,
                                      drop.scale);
}

cuda::ReformerDropout device_dropout(const Dropout& drop) {
  return cuda::ReformerDropout{drop.p, drop.scale, drop.seed, drop.offset};
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

// k_j = q_j / |q_j| for the L valid positions of one (b, h); norms kept for backward.
void unit_keys(const float* q, int64_t L, int64_t E, float* k, float* norm) {
  for (int64_t j = 0; j < L; ++j) {
    double s = 0.0;
    for (int64_t e = 0; e < E; ++e) s += double(q[j * E + e]) * q[j * E + e];
    norm[j] = static_cast<float>(std::sqrt(s));
    const float inv = norm[j] > 0.0f ? 1.0f / norm[j] : 0.0f;
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
struct Scratch {
  float *k, *norm;              // unit keys (N, E), |q| (N)
  int32_t* bucket;              // (N)
  float *qc, *kc, *vc, *s, *t;  // gathered rows and a block's products
  float *mx, *l, *acc;          // forward: each query's online softmax across rounds
  float *gc, *dp, *dqc, *dkc, *dvc, *dk, *delta;  // backward's
  std::vector<int64_t> count;                     // the sort's (R + 1)
  float* proj;  // the projections on a round's rotation (N, R / 2)
};

Tensor make_scratch(const Dims& d, bool backward, Scratch& s) {
  const int64_t nk = std::min<int64_t>(2 * d.m, d.N), rows = std::min(kRowBlock, d.m);
  return clustered_detail::carve([&](clustered_detail::Carve& c) {
    s.k = c.f32(d.N * d.E);
    s.norm = c.f32(d.N);
    s.bucket = c.i32(d.N);
    s.qc = c.f32(rows * d.E);
    s.kc = c.f32(nk * d.E);
    s.vc = c.f32(nk * d.M);
    s.s = c.f32(rows * nk);
    s.t = c.f32(rows * std::max(d.M, d.E));
    if (!backward) {  // backward reads the saved orders: no hashing
      s.proj = c.f32(d.N * (d.R / 2));
      s.mx = c.f32(d.N);
      s.l = c.f32(d.N);
      s.acc = c.f32(d.N * d.M);
      return;
    }
    s.gc = c.f32(rows * d.M);
    s.dp = c.f32(rows * nk);
    s.dqc = c.f32(rows * d.E);
    s.dkc = c.f32(nk * d.E);
    s.dvc = c.f32(nk * d.M);
    s.dk = c.f32(d.N * d.E);
    s.delta = c.f32(d.N);
  });
}

// Calls f(a0, a1, k0, nk) for each block of sorted query positions [a0, a1) and the sorted key
// positions [k0, k0 + nk) it sees (its chunk and the one before).
template <typename F>
void for_each_block(int64_t L, int64_t m, F f) {
  for (int64_t q0 = 0; q0 < L; q0 += m) {
    const int64_t q1 = std::min(L, q0 + m), k0 = q0 >= m ? q0 - m : 0;
    for (int64_t a0 = q0; a0 < q1; a0 += kRowBlock)
      f(a0, std::min(q1, a0 + kRowBlock), k0, q1 - k0);
  }
}

void gather(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) {
  for (int64_t r = 0; r < n; ++r)
    std::copy(src + rows[r] * width, src + (rows[r] + 1) * width, dst + r * width);
}

void scatter_add(const float* src, int64_t width, const int32_t* rows, int64_t n, float* dst) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < width; ++c) dst[rows[r] * width + c] += src[r * width + c];
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
    for_each_block(L, d.m, [&](int64_t a0, int64_t a1, int64_t k0, int64_t nk) {
      const int64_t nq = a1 - a0;
      gather(q, E, o + a0, nq, s.qc);
      gather(s.k, E, o + k0, nk, s.kc);
      gather(v, M, o + k0, nk, s.vc);
      cpu::gemm(false, true, nq, nk, E, t, s.qc, E, s.kc, E, 0.0f, s.s, nk);
      for (int64_t a = 0; a < nq; ++a) {
        float* row = s.s + a * nk;
        row[a0 + a - k0] = kNegInf;  // the query itself
        const int32_t i = o[a0 + a];
        float top = kNegInf;
        for (int64_t b = 0; b < nk; ++b) top = std::max(top, row[b]);
        if (top == kNegInf) {  // nothing but itself in this block
          std::fill(row, row + nk, 0.0f);
          continue;
        }
        const float m_new = std::max(mx[i], top);
        const float scale = l[i] > 0.0f ? math::exp(mx[i] - m_new) : 0.0f;
        float sum = 0.0f;
        for (int64_t b = 0; b < nk; ++b) sum += row[b] = math::exp(row[b] - m_new);
        if (drop.on())
          for (int64_t b = 0; b < nk; ++b)
            row[b] *= keep_factor(drop, d, bh, x, i, o[k0 + b]);
        l[i] = l[i] * scale + sum;
        mx[i] = m_new;
        for (int64_t c = 0; c < M; ++c) acc[i * M + c] *= scale;
      }
      cpu::gemm(false, false, nq, M, nk, 1.0f, s.s, nk, s.vc, M, 0.0f, s.t, M);
      scatter_add(s.t, M, o + a0, nq, acc);
    });
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

// One (b, h) pair of the backward: dq and dv at the pair's rows (zeroed by the caller).
void backward_pair(const Dims& d, float t, const Dropout& drop, int64_t bh, int64_t L,
                   const float* q, const float* v, const float* out, const float* g,
                   const int32_t* order, const float* z, float* dq, float* dv, Scratch& s) {
  const int64_t E = d.E, M = d.M;
  float *dk = s.dk, *delta = s.delta;
  unit_keys(q, L, E, s.k, s.norm);
  std::fill(dk, dk + L * E, 0.0f);
  for (int64_t i = 0; i < L; ++i) {  // dO_i . out_i
    float acc = 0.0f;
    for (int64_t c = 0; c < M; ++c) acc += g[i * M + c] * out[i * M + c];
    delta[i] = acc;
  }
  for (int64_t x = 0; x < d.X; ++x) {
    const int32_t* o = order + x * d.N;
    for_each_block(L, d.m, [&](int64_t a0, int64_t a1, int64_t k0, int64_t nk) {
      const int64_t nq = a1 - a0;
      gather(q, E, o + a0, nq, s.qc);
      gather(s.k, E, o + k0, nk, s.kc);
      gather(v, M, o + k0, nk, s.vc);
      gather(g, M, o + a0, nq, s.gc);
      cpu::gemm(false, true, nq, nk, E, t, s.qc, E, s.kc, E, 0.0f, s.s, nk);
      cpu::gemm(false, true, nq, nk, M, 1.0f, s.gc, M, s.vc, M, 0.0f, s.dp, nk);
      // The dropped weights Pd = P keep scale and dS = P (dP keep scale - delta) in place of S
      // and dP (delta = dout . out: out has the dropout).
      for (int64_t a = 0; a < nq; ++a) {
        float *p = s.s + a * nk, *ds = s.dp + a * nk;
        const int32_t i = o[a0 + a];
        const float zi = z[i];
        for (int64_t b = 0; b < nk; ++b) {
          p[b] = zi == kNegInf || b == a0 + a - k0 ? 0.0f : math::exp(p[b] - zi);
          const float keep = drop.on() ? keep_factor(drop, d, bh, x, i, o[k0 + b]) : 1.0f;
          ds[b] = p[b] * (ds[b] * keep - delta[i]);
          p[b] *= keep;
        }
      }
      cpu::gemm(true, false, nk, M, nq, 1.0f, s.s, nk, s.gc, M, 0.0f, s.dvc, M);
      scatter_add(s.dvc, M, o + k0, nk, dv);
      cpu::gemm(false, false, nq, E, nk, t, s.dp, nk, s.kc, E, 0.0f, s.dqc, E);
      scatter_add(s.dqc, E, o + a0, nq, dq);
      cpu::gemm(true, false, nk, E, nq, t, s.dp, nk, s.qc, E, 0.0f, s.dkc, E);
      scatter_add(s.dkc, E, o + k0, nk, dk);
    });
  }
  for (int64_t i = 0; i < L; ++i) {
    if (z[i] == kNegInf)  // took its own value
      for (int64_t c = 0; c < M; ++c) dv[i * M + c] += g[i * M + c];
    // Through k = q / |q|: dq += (dk - k (k . dk)) / |q|.
    if (s.norm[i] == 0.0f) continue;
    const float* ki = s.k + i * E;
    const float* dki = dk + i * E;
    float dot = 0.0f;
    for (int64_t e = 0; e < E; ++e) dot += ki[e] * dki[e];
    const float inv = 1.0f / s.norm[i];
    for (int64_t e = 0; e < E; ++e) dq[i * E + e] += (dki[e] - ki[e] * dot) * inv;
  }
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
