// Clustered attention for a fixed clustering (clustered.h): the CPU kernels, the front doors
// (checks, allocation) and the autograd node.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters; L the
// valid keys of a sequence (lengths[b], or S).
//
// A task is one (b, h) pair: its centroids, its C x L scores and their softmax, and the products
// with V, all by cpu::gemm on the task's thread alone (the thread count is set to 1 inside the
// OpenMP region, as in full_cpu.cpp). Every output element is written by one task, and every
// sum over queries runs in query order, so results never depend on the thread count. With fewer
// (b, h) pairs than threads some threads idle; the cost is O(N C E + C S (E + M)) per pair.
// Masked keys (j >= L) take no part in any product: their columns of Ac and their rows of dK,
// dV are written as 0, so whatever padded K, V hold (even NaN) cannot leak into a result.
#include "layers/attention/clustered.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "autograd/node.h"
#include "core/parallel.h"
#include "layers/attention/clustered_common.h"

namespace clustr {

namespace {

using namespace clustered_detail;

// One (b, h) pair of the forward (eq. 3-6). Writes out (N, M), ac (C, S), qc (C, E), count (C)
// of the pair; vc is C x M scratch.
void forward_pair(const Dims& d, const Params& p, int64_t bh, const float* Q, const float* K,
                  const float* V, float* out, float* ac, float* qc, int32_t* count, float* vc) {
  const int64_t L = p.lengths ? p.lengths[bh / d.H] : d.S;
  const int32_t* a = p.assignment + bh * d.N;
  const float* q = Q + bh * d.N * d.E;
  const float* k = K + bh * d.S * d.E;
  const float* v = V + bh * d.S * d.M;
  centroids(d, a, q, qc, count);                // eq. 4-5
  centroid_weights(d, p, L, qc, count, k, ac);  // eq. 3
  // Vc = Ac V, then eq. 6: each query takes its cluster's row.
  product(false, false, d.C, d.M, L, 1.0f, ac, d.S, v, d.M, vc, d.M);
  for (int64_t i = 0; i < d.N; ++i) {
    float* o = out + (bh * d.N + i) * d.M;
    if (a[i] < 0) {
      fill(o, d.M, 0.0f);
      continue;
    }
    const float* src = vc + a[i] * d.M;
    for (int64_t c = 0; c < d.M; ++c) o[c] = src[c];
  }
}

// One (b, h) pair of the backward for the fixed assignment:
//   dVc_j = sum_{i in j} dO_i, dV = Ac^T dVc, dAc = dVc V^T, dS = Ac (dAc - rowsum(dAc Ac)),
//   dQc = t dS K, dK = t dS^T Qc, dQ_i = dQc_{j(i)} / |j(i)| (through the mean of eq. 4-5).
// Writes dQ (N, E), dK (S, E), dV (S, M) of the pair; scratch: dvc C x M, ds C x S, dqc C x E.
void backward_pair(const Dims& d, const Params& p, int64_t bh, const float* K, const float* V,
                   const float* ac, const float* qc, const int32_t* count, const float* dout,
                   float* dQ, float* dK, float* dV, float* dvc, float* ds, float* dqc) {
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

  fill(dvc, d.C * d.M, 0.0f);
  for (int64_t i = 0; i < d.N; ++i) {
    if (a[i] < 0) continue;
    const float* g = dout + (bh * d.N + i) * d.M;
    float* c = dvc + a[i] * d.M;
    for (int64_t m = 0; m < d.M; ++m) c[m] += g[m];
  }
  product(true, false, L, d.M, d.C, 1.0f, ac, d.S, dvc, d.M, dv, d.M);
  product(false, true, d.C, L, d.M, 1.0f, dvc, d.M, v, d.M, ds, d.S);
  for (int64_t j = 0; j < d.C; ++j) {
    const float* w = ac + j * d.S;
    float* g = ds + j * d.S;
    float dot = 0.0f;
    for (int64_t c = 0; c < L; ++c) dot += g[c] * w[c];
    for (int64_t c = 0; c < L; ++c) g[c] = w[c] * (g[c] - dot);  // empty cluster: w = 0
  }
  product(false, false, d.C, d.E, L, p.temperature, ds, d.S, k, d.E, dqc, d.E);
  product(true, false, L, d.E, d.C, p.temperature, ds, d.S, qc, d.E, dk, d.E);
  for (int64_t i = 0; i < d.N; ++i) {
    float* g = dq + i * d.E;
    if (a[i] < 0) {
      fill(g, d.E, 0.0f);
      continue;
    }
    const float n = static_cast<float>(count[a[i]]);
    const float* src = dqc + a[i] * d.E;
    for (int64_t e = 0; e < d.E; ++e) g[e] = src[e] / n;
  }
}

// Saves K, V, the assignment, lengths and the forward's Ac, Qc and counts (not Q: it enters
// backward only through Qc).
class ClusteredAttentionNode : public Node {
 public:
  const char* name() const override { return "clustered_attention"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    ClusteredAttentionGrads d =
        clustered_attention_backward(g, K_, V_, lengths_, assignment_, saved_, temperature_);
    return {std::move(d.dQ), std::move(d.dK), std::move(d.dV)};
  }
  void release() override {
    K_ = V_ = lengths_ = assignment_ = Tensor();
    saved_ = ClusteredAttentionOutput();
  }

  Tensor K_, V_, lengths_, assignment_;
  ClusteredAttentionOutput saved_;  // out left undefined
  float temperature_ = 0.0f;
};

}  // namespace

ClusteredAttentionOutput clustered_attention_forward(const Tensor& Q, const Tensor& K,
                                                     const Tensor& V, const Tensor& lengths,
                                                     const Tensor& assignment, int64_t clusters,
                                                     float temperature) {
  const char* op = "clustered_attention";
  check_f32(op, "Q", Q);
  detail::check_same_device(op, Q, K);
  const Dims d = check_inputs(op, Q.shape(), K, V, lengths, assignment, clusters, temperature);
  const Params p = params_of(d, lengths, assignment, temperature);
  ClusteredAttentionOutput r;
  r.out = Tensor::empty({d.B, d.H, d.N, d.M}, DType::f32, Q.device());
  r.weights = Tensor::empty({d.B, d.H, d.C, d.S}, DType::f32, Q.device());
  r.centroids = Tensor::empty({d.B, d.H, d.C, d.E}, DType::f32, Q.device());
  r.counts = Tensor::empty({d.B, d.H, d.C}, DType::i32, Q.device());
  const int64_t pairs = d.B * d.H;
  if (pairs == 0) return r;
  const int threads = num_threads();
  const int64_t per_thread = d.C * d.M;  // Vc
  Tensor ws = Tensor::empty({per_thread * threads + 1}, DType::f32, Q.device());
  const float *q = Q.f32(), *k = K.f32(), *v = V.f32();
  float *out = r.out.f32(), *ac = r.weights.f32(), *qc = r.centroids.f32(), *w = ws.f32();
  int32_t* count = r.counts.i32();
#pragma omp parallel num_threads(threads)
  {
    set_num_threads(1);  // for cpu::gemm inside this region (this thread's ICV only)
    float* vc = w + thread_id() * per_thread;
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < pairs; ++bh)
      forward_pair(d, p, bh, q, k, v, out, ac + bh * d.C * d.S, qc + bh * d.C * d.E,
                   count + bh * d.C, vc);
  }
  return r;
}

ClusteredAttentionGrads clustered_attention_backward(const Tensor& dout, const Tensor& K, const Tensor& V,
                                                     const Tensor& lengths,
                                                     const Tensor& assignment,
                                                     const ClusteredAttentionOutput& forward,
                                                     float temperature) {
  const char* op = "clustered_attention_backward";
  CLUSTR_CHECK(forward.counts.defined() && forward.counts.rank() == 3, op,
               ": expected the forward's counts of shape (B, H, C), got ",
               forward.counts.defined() ? describe(forward.counts) : "undefined");
  const int64_t clusters = forward.counts.size(2);
  detail::check_dtype(op, "assignment", assignment, DType::i32);
  CLUSTR_CHECK(assignment.rank() == 3 && K.defined() && K.rank() == 4, op,
               ": expected assignment (B, H, N) and K (B, H, S, E), got ", describe(assignment),
               " and ", K.defined() ? describe(K) : "undefined");
  const Shape q_shape{assignment.size(0), assignment.size(1), assignment.size(2), K.size(3)};
  const Dims d = check_inputs(op, q_shape, K, V, lengths, assignment, clusters, temperature);
  const Params p = params_of(d, lengths, assignment, temperature);
  check_saved(op, "dout", dout, K, DType::f32, {d.B, d.H, d.N, d.M});
  check_saved(op, "weights", forward.weights, K, DType::f32, {d.B, d.H, d.C, d.S});
  check_saved(op, "centroids", forward.centroids, K, DType::f32, {d.B, d.H, d.C, d.E});
  check_saved(op, "counts", forward.counts, K, DType::i32, {d.B, d.H, d.C});
  ClusteredAttentionGrads g;
  g.dQ = Tensor::empty(q_shape, DType::f32, K.device());
  g.dK = Tensor::empty(K.shape(), DType::f32, K.device());
  g.dV = Tensor::empty(V.shape(), DType::f32, K.device());
  const int64_t pairs = d.B * d.H;
  if (pairs == 0) return g;
  const int threads = num_threads();
  const int64_t per_thread = d.C * (d.M + d.S + d.E);  // dVc, dS, dQc
  Tensor ws = Tensor::empty({per_thread * threads + 1}, DType::f32, K.device());
  const float *k = K.f32(), *v = V.f32(), *ac = forward.weights.f32(),
              *qc = forward.centroids.f32(), *go = dout.f32();
  const int32_t* count = forward.counts.i32();
  float *dQ = g.dQ.f32(), *dK = g.dK.f32(), *dV = g.dV.f32(), *w = ws.f32();
#pragma omp parallel num_threads(threads)
  {
    set_num_threads(1);  // for cpu::gemm inside this region (this thread's ICV only)
    float* dvc = w + thread_id() * per_thread;
    float* ds = dvc + d.C * d.M;
    float* dqc = ds + d.C * d.S;
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < pairs; ++bh)
      backward_pair(d, p, bh, k, v, ac + bh * d.C * d.S, qc + bh * d.C * d.E, count + bh * d.C,
                    go, dQ, dK, dV, dvc, ds, dqc);
  }
  return g;
}

Variable clustered_attention(const Variable& Q, const Variable& K, const Variable& V,
                             const Tensor& lengths, const Tensor& assignment, int64_t clusters,
                             float temperature) {
  ClusteredAttentionOutput r = clustered_attention_forward(Q.data(), K.data(), V.data(), lengths,
                                                           assignment, clusters, temperature);
  if (!record_needed({&Q, &K, &V})) return Variable(std::move(r.out));
  auto node = std::make_shared<ClusteredAttentionNode>();
  node->K_ = K.data();
  node->V_ = V.data();
  node->lengths_ = lengths;
  node->assignment_ = assignment;
  node->saved_.weights = std::move(r.weights);
  node->saved_.centroids = std::move(r.centroids);
  node->saved_.counts = std::move(r.counts);
  node->temperature_ = temperature;
  return attach(std::move(r.out), std::move(node), {&Q, &K, &V});
}

}  // namespace clustr