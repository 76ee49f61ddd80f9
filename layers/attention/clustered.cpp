// Clustered attention for a fixed clustering (clustered.h): the CPU kernels, the front doors
// (checks, allocation) and the autograd node.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters; L the
// valid keys of a sequence (lengths[b], or S).
//
// A pair's work: its centroids, its C x L scores and their softmax, and the products with V,
// by cpu::gemm. With at least as many (b, h) pairs as threads, a task is one pair on one
// thread (the thread count is set to 1 inside the OpenMP region, as in full_cpu.cpp); with
// fewer, the pairs run in turn and every thread works inside each (clustered_common.h): a
// batch of one sequence and one head uses both cores. Every output element is written by one
// task or one loop iteration, every sum over queries runs in query order and every sum over
// clusters or keys is one GEMM's, so results never depend on the thread count. The cost is
// O(N E + C S (E + M) + N M) per pair.
// Masked keys (j >= L) take no part in any product: their columns of Ac and their rows of dK,
// dV are written as 0, so whatever padded K, V hold (even NaN) cannot leak into a result.
#include "layers/attention/clustered.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "core/parallel.h"
#include "core/random.h"
#include "layers/attention/clustered_common.h"
#include "layers/attention/cuda/clustered.h"

namespace clustr {

namespace {

using namespace clustered_detail;

// Scratch of one pair in flight.
struct Scratch {
  float *vc = nullptr, *dvc = nullptr, *ds = nullptr, *dqc = nullptr;  // C x M, C x M, C x S, C x E
  float* ad = nullptr;  // C x S: the dropped-out weights Ac D / (1 - p) (dropout only)
  Members members{};
};

Tensor make_scratch(const Dims& d, bool backward, bool dropout, Scratch& s) {
  return carve([&](Carve& c) {
    if (backward) {
      s.dvc = c.f32(d.C * d.M);
      s.ds = c.f32(d.C * d.S);
      s.dqc = c.f32(d.C * d.E);
    } else {
      s.vc = c.f32(d.C * d.M);
    }
    s.ad = dropout ? c.f32(d.C * d.S) : nullptr;
    s.members.count = c.i32(d.C);
    s.members.start = c.i32(d.C + 1);
    s.members.order = c.i32(d.N);
  });
}

// Runs pair(bh, inner, scratch) for every pair: one pair per task, or (fewer pairs than
// threads) pair after pair with every thread inside.
template <class Pair>
void for_each_pair(const Dims& d, bool backward, bool dropout, Pair pair) {
  const int64_t pairs = d.B * d.H;
  const int threads = num_threads();
  if (pairs < threads) {
    Scratch s;
    const Tensor hold = make_scratch(d, backward, dropout, s);
    for (int64_t bh = 0; bh < pairs; ++bh) pair(bh, true, s);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    set_num_threads(1);  // for cpu::gemm inside this region (this thread's ICV only)
    Scratch s;
    const Tensor hold = make_scratch(d, backward, dropout, s);
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < pairs; ++bh) pair(bh, false, s);
  }
}

// One (b, h) pair of the forward (eq. 3-6). Writes out (N, M), ac (C, S), qc (C, E), count (C)
// of the pair.
void forward_pair(const Dims& d, const Params& p, const Dropout& drop, int64_t bh, bool inner,
                  const float* Q, const float* K, const float* V, float* out, float* ac,
                  float* qc, int32_t* count, Scratch& s) {
  const int64_t L = p.lengths ? p.lengths[bh / d.H] : d.S;
  const int32_t* a = p.assignment + bh * d.N;
  const float* q = Q + bh * d.N * d.E;
  const float* k = K + bh * d.S * d.E;
  const float* v = V + bh * d.S * d.M;
  Members& m = s.members;
  group(d, a, m);
  std::copy(m.count, m.count + d.C, count);
  centroids(d, m, q, qc, inner);                      // eq. 4-5
  centroid_weights(d, p, L, qc, count, k, ac, inner);  // eq. 3
  // Vc = Ac V (Ac D / (1 - p) with dropout), then eq. 6: each query takes its cluster's row.
  const float* w = ac;
  if (drop.on()) {
#pragma omp parallel for schedule(static) if (inner)
    for (int64_t j = 0; j < d.C; ++j)
      dropout_row(drop, static_cast<uint64_t>((bh * d.C + j) * d.S), L, ac + j * d.S,
                  s.ad + j * d.S);
    w = s.ad;
  }
  cluster_product(p, false, false, d.C, d.M, L, 1.0f, w, d.S, v, d.M, s.vc, d.M);
#pragma omp parallel for schedule(static) if (inner)
  for (int64_t i = 0; i < d.N; ++i) {
    float* o = out + (bh * d.N + i) * d.M;
    if (a[i] < 0) {
      fill(o, d.M, 0.0f);
      continue;
    }
    const float* src = s.vc + a[i] * d.M;
    for (int64_t c = 0; c < d.M; ++c) o[c] = src[c];
  }
}

// One (b, h) pair of the backward for the fixed assignment (and dropout mask D, scale
// r = 1 / (1 - p); without dropout D r = 1):
//   dVc_j = sum_{i in j} dO_i, dV = (Ac D r)^T dVc, dAc = (dVc V^T) D r,
//   dS = Ac (dAc - rowsum(dAc Ac)), dQc = t dS K, dK = t dS^T Qc,
//   dQ_i = dQc_{j(i)} / |j(i)| (through the mean of eq. 4-5).
// Writes dQ (N, E), dK (S, E), dV (S, M) of the pair.
void backward_pair(const Dims& d, const Params& p, const Dropout& drop, int64_t bh, bool inner,
                   const float* K, const float* V, const float* ac, const float* qc,
                   const float* dout, float* dQ, float* dK, float* dV, Scratch& s) {
  const int64_t L = p.lengths ? p.lengths[bh / d.H] : d.S;
  const int32_t* a = p.assignment + bh * d.N;
  const float* k = K + bh * d.S * d.E;
  const float* v = V + bh * d.S * d.M;
  float* dq = dQ + bh * d.N * d.E;
  float* dk = dK + bh * d.S * d.E;
  float* dv = dV + bh * d.S * d.M;
  // Masked keys get no gradient.
  fill(dk + L * d.E, (d.S - L) * d.E, 0.0f);
  fill(dv + L * d.M, (d.S - L) * d.M, 0.0f);
  if (L == 0) return fill(dq, d.N * d.E, 0.0f);

  Members& m = s.members;
  group(d, a, m);
  sum_members(d, m, dout + bh * d.N * d.M, d.M, s.dvc, inner);
  cluster_product(p, false, true, d.C, L, d.M, 1.0f, s.dvc, d.M, v, d.M, s.ds, d.S);
  const float* w = ac;
  if (drop.on()) {
    // One draw of each row's mask serves both Ac D r (for dV) and dAc D r.
#pragma omp parallel for schedule(static) if (inner)
    for (int64_t j = 0; j < d.C; ++j) {
      const float* x = ac + j * d.S;
      float* y = s.ad + j * d.S;
      float* g = s.ds + j * d.S;
      for_each_mask_word(drop, static_cast<uint64_t>((bh * d.C + j) * d.S), L,
                         [&](int64_t c, uint32_t word) {
                           y[c] = math::dropout_value(x[c], word, drop.p, drop.scale);
                           g[c] = math::dropout_value(g[c], word, drop.p, drop.scale);
                         });
    }
    w = s.ad;
  }
  cluster_product(p, true, false, L, d.M, d.C, 1.0f, w, d.S, s.dvc, d.M, dv, d.M);
  softmax_backward_rows(d, L, ac, s.ds, inner);  // empty cluster: Ac = 0
  cluster_product(p, false, false, d.C, d.E, L, p.temperature, s.ds, d.S, k, d.E, s.dqc, d.E);
  cluster_product(p, true, false, L, d.E, d.C, p.temperature, s.ds, d.S, qc, d.E, dk, d.E);
#pragma omp parallel for schedule(static) if (inner)
  for (int64_t i = 0; i < d.N; ++i) {
    float* g = dq + i * d.E;
    if (a[i] < 0) {
      fill(g, d.E, 0.0f);
      continue;
    }
    const float n = static_cast<float>(m.count[a[i]]);
    const float* src = s.dqc + a[i] * d.E;
    for (int64_t e = 0; e < d.E; ++e) g[e] = src[e] / n;
  }
}

void check_dropout(const char* op, const ClusteredDropout& drop) {
  CLUSTR_CHECK(drop.p >= 0.0f && drop.p < 1.0f, op,
               ": expected a dropout probability in [0, 1), got ", drop.p);
}

// Saves K, V, the assignment, lengths and the forward's Ac, Qc, counts and dropout stream (not
// Q: it enters backward only through Qc).
// With `stacked_` its one input is QKV (3, B, H, N, E) and its gradient one tensor of that
// shape, whose slices backward writes.
class ClusteredAttentionNode : public Node {
 public:
  const char* name() const override { return "clustered_attention"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    ClusteredAttentionGrads into;
    const Tensor stacked = stacked_ ? stacked_grads(name(), K_, into) : Tensor();
    ClusteredAttentionGrads d = clustered_attention_backward(g, K_, V_, lengths_, assignment_,
                                                             saved_, temperature_, into);
    if (stacked_) return {stacked};
    return {std::move(d.dQ), std::move(d.dK), std::move(d.dV)};
  }
  void release() override {
    K_ = V_ = lengths_ = assignment_ = Tensor();
    saved_ = ClusteredAttentionOutput();
  }

  Tensor K_, V_, lengths_, assignment_;
  ClusteredAttentionOutput saved_;  // out left undefined
  float temperature_ = 0.0f;
  bool stacked_ = false;
};

}  // namespace

uint64_t clustered_attention_dropout_blocks(const Tensor& Q, const Tensor& K, int64_t clusters) {
  CLUSTR_CHECK(Q.rank() == 4 && K.rank() == 4 && clusters >= 1,
               "clustered_attention_dropout_blocks: expected Q (B, H, N, E), K (B, H, S, E) and ",
               "clusters >= 1, got ", describe(Q), ", ", describe(K), " and ", clusters);
  const uint64_t n = static_cast<uint64_t>(Q.size(0) * Q.size(1) * clusters * K.size(2));
  return (n + 3) / 4;
}

ClusteredAttentionOutput clustered_attention_forward(const Tensor& Q, const Tensor& K,
                                                     const Tensor& V, const Tensor& lengths,
                                                     const Tensor& assignment, int64_t clusters,
                                                     float temperature,
                                                     const ClusteredDropout& dropout,
                                                     Precision precision) {
  const char* op = "clustered_attention";
  check_f32(op, "Q", Q);
  detail::check_same_device(op, Q, K);
  check_dropout(op, dropout);
  const Dims d = check_inputs(op, Q.shape(), K, V, lengths, assignment, clusters, temperature,
                              true);
  ClusteredAttentionOutput r;
  r.out = Tensor::empty({d.B, d.H, d.N, d.M}, DType::f32, Q.device());
  r.weights = Tensor::empty({d.B, d.H, d.C, d.S}, DType::f32, Q.device());
  r.centroids = Tensor::empty({d.B, d.H, d.C, d.E}, DType::f32, Q.device());
  r.dropout = dropout;
  r.precision = precision;
  if (Q.device() == Device::cuda) {
    DeviceParams dp;
    device_params(op, d, lengths, assignment, temperature, dropout, precision, dp);
    const cuda::ClusteredDims cd{d.B, d.H, d.N, d.S, d.E, d.M, d.C};
    const Tensor ws = device_workspace(cuda::clustered_attention_forward_workspace(cd, dp.p));
    cuda::clustered_attention_forward(cd, dp.p, Q.f32(), K.f32(), V.f32(), r.out.f32(),
                                      r.weights.f32(), r.centroids.f32(), ws.f32());
    r.counts = dp.count;
    r.start = dp.start;
    r.order = dp.order;
    return r;
  }
  const Params p = params_of(d, lengths, assignment, temperature, precision);
  const Dropout drop = dropout_of(dropout.p, dropout.seed, host_offset(dropout.offset, "clustered_attention"));
  r.counts = Tensor::empty({d.B, d.H, d.C}, DType::i32, Q.device());
  const float *q = Q.f32(), *k = K.f32(), *v = V.f32();
  float *out = r.out.f32(), *ac = r.weights.f32(), *qc = r.centroids.f32();
  int32_t* count = r.counts.i32();
  for_each_pair(d, false, drop.on(), [&](int64_t bh, bool inner, Scratch& s) {
    forward_pair(d, p, drop, bh, inner, q, k, v, out, ac + bh * d.C * d.S, qc + bh * d.C * d.E,
                 count + bh * d.C, s);
  });
  return r;
}

ClusteredAttentionGrads clustered_attention_backward(const Tensor& dout, const Tensor& K, const Tensor& V,
                                                     const Tensor& lengths,
                                                     const Tensor& assignment,
                                                     const ClusteredAttentionOutput& forward,
                                                     float temperature,
                                                     const ClusteredAttentionGrads& into) {
  const char* op = "clustered_attention_backward";
  CLUSTR_CHECK(forward.counts.defined() && forward.counts.rank() == 3, op,
               ": expected the forward's counts of shape (B, H, C), got ",
               forward.counts.defined() ? describe(forward.counts) : "undefined");
  check_dropout(op, forward.dropout);
  const int64_t clusters = forward.counts.size(2);
  detail::check_dtype(op, "assignment", assignment, DType::i32);
  CLUSTR_CHECK(assignment.rank() == 3 && K.defined() && K.rank() == 4, op,
               ": expected assignment (B, H, N) and K (B, H, S, E), got ", describe(assignment),
               " and ", K.defined() ? describe(K) : "undefined");
  const Shape q_shape{assignment.size(0), assignment.size(1), assignment.size(2), K.size(3)};
  // On the device the forward's grouping of the assignment is reused (its values were checked
  // there); the assignment must be the forward's.
  const bool grouped = K.device() == Device::cuda && forward.start.defined();
  const Dims d = check_inputs(op, q_shape, K, V, lengths, assignment, clusters, temperature,
                              true, !grouped);
  check_saved(op, "dout", dout, K, DType::f32, {d.B, d.H, d.N, d.M});
  check_saved(op, "weights", forward.weights, K, DType::f32, {d.B, d.H, d.C, d.S});
  check_saved(op, "centroids", forward.centroids, K, DType::f32, {d.B, d.H, d.C, d.E});
  check_saved(op, "counts", forward.counts, K, DType::i32, {d.B, d.H, d.C});
  if (grouped) {
    check_saved(op, "start", forward.start, K, DType::i32, {d.B * d.H * (d.C + 1)});
    check_saved(op, "order", forward.order, K, DType::i32, {d.B * d.H * d.N});
  }
  ClusteredAttentionGrads g;
  g.dQ = grad_buffer(op, "dQ", into.dQ, q_shape, K);
  g.dK = grad_buffer(op, "dK", into.dK, K.shape(), K);
  g.dV = grad_buffer(op, "dV", into.dV, V.shape(), K);
  if (K.device() == Device::cuda) {
    DeviceParams dp;
    device_params(op, d, lengths, assignment, temperature, forward.dropout, forward.precision, dp,
                  forward.counts, forward.start, forward.order);
    const cuda::ClusteredDims cd{d.B, d.H, d.N, d.S, d.E, d.M, d.C};
    const Tensor ws = device_workspace(cuda::clustered_attention_backward_workspace(cd, dp.p));
    cuda::clustered_attention_backward(cd, dp.p, K.f32(), V.f32(), forward.weights.f32(),
                                       forward.centroids.f32(), dout.f32(), g.dQ.f32(),
                                       g.dK.f32(), g.dV.f32(), ws.f32());
    return g;
  }
  const Params p = params_of(d, lengths, assignment, temperature, forward.precision);
  const Dropout drop = dropout_of(forward.dropout.p, forward.dropout.seed,
                                  host_offset(forward.dropout.offset, "clustered_attention"));
  const float *k = K.f32(), *v = V.f32(), *ac = forward.weights.f32(),
              *qc = forward.centroids.f32(), *go = dout.f32();
  float *dQ = g.dQ.f32(), *dK = g.dK.f32(), *dV = g.dV.f32();
  for_each_pair(d, true, drop.on(), [&](int64_t bh, bool inner, Scratch& s) {
    backward_pair(d, p, drop, bh, inner, k, v, ac + bh * d.C * d.S, qc + bh * d.C * d.E, go, dQ,
                  dK, dV, s);
  });
  return g;
}

namespace {

// The differentiable op on Q, K, V (three inputs) or on QKV stacked (one input).
Variable clustered_attention_op(const std::vector<Variable>& inputs, const Tensor& Q,
                                const Tensor& K, const Tensor& V, const Tensor& lengths,
                                const Tensor& assignment, int64_t clusters, float temperature,
                                const ClusteredDropout& dropout) {
  ClusteredAttentionOutput r = clustered_attention_forward(
      Q, K, V, lengths, assignment, clusters, temperature, dropout, current_precision());
  if (!any_record_needed(inputs)) return Variable(std::move(r.out));
  auto node = std::make_shared<ClusteredAttentionNode>();
  node->stacked_ = inputs.size() == 1;
  node->K_ = K;
  node->V_ = V;
  node->lengths_ = lengths;
  node->assignment_ = assignment;
  node->saved_.weights = std::move(r.weights);
  node->saved_.centroids = std::move(r.centroids);
  node->saved_.counts = std::move(r.counts);
  node->saved_.start = std::move(r.start);
  node->saved_.order = std::move(r.order);
  node->saved_.dropout = r.dropout;
  node->saved_.precision = r.precision;
  node->temperature_ = temperature;
  return attach(std::move(r.out), std::move(node), inputs);
}

}  // namespace

Variable clustered_attention(const Variable& Q, const Variable& K, const Variable& V,
                             const Tensor& lengths, const Tensor& assignment, int64_t clusters,
                             float temperature, const ClusteredDropout& dropout) {
  return clustered_attention_op({Q, K, V}, Q.data(), K.data(), V.data(), lengths, assignment,
                                clusters, temperature, dropout);
}

Variable clustered_attention(const Variable& QKV, const Tensor& lengths, const Tensor& assignment,
                             int64_t clusters, float temperature,
                             const ClusteredDropout& dropout) {
  const Stacked s = unstack("clustered_attention", QKV.data());
  return clustered_attention_op({QKV}, s.q, s.k, s.v, lengths, assignment, clusters, temperature,
                                dropout);
}

}  // namespace clustr
