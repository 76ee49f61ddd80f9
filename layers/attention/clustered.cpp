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
#include "core/cpu/gemm.h"
#include "core/error.h"
#include "core/math.h"
#include "core/ops_check.h"
#include "core/parallel.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace clustr {

namespace {

struct Dims {
  int64_t B = 0, H = 0, N = 0, S = 0, E = 0, M = 0, C = 0;
};

// What the kernels read besides the tensors; pointers into (b, h)-major buffers.
struct Params {
  const int32_t* lengths = nullptr;  // (B) or null
  const int32_t* assignment = nullptr;  // (B, H, N), values in [-1, C)
  float temperature = 1.0f;          // > 0
};

int thread_id() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

void fill(float* x, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}

// C(rows, cols) = alpha op(A) op(B) with inner size `inner` (overwritten), skipping the empty
// cases cpu::gemm's leading-dimension checks would refuse (M = 0 gives ld = 0).
void product(bool ta, bool tb, int64_t rows, int64_t cols, int64_t inner, float alpha,
             const float* A, int64_t lda, const float* Bm, int64_t ldb, float* Cm, int64_t ldc) {
  if (rows == 0 || cols == 0) return;
  if (inner == 0) {
    for (int64_t r = 0; r < rows; ++r) fill(Cm + r * ldc, cols, 0.0f);
    return;
  }
  cpu::gemm(ta, tb, rows, cols, inner, alpha, A, lda, Bm, ldb, 0.0f, Cm, ldc);
}

// Row softmax over the first n of x[0..S) (n >= 1), the rest set to 0; numerically stable (the
// max is subtracted, so every exp is <= 1 and the sum is >= 1).
void softmax_row(float* x, int64_t n, int64_t S) {
  float mx = x[0];
  for (int64_t c = 1; c < n; ++c) mx = math::Maximum{}(mx, x[c]);
  float sum = 0.0f;
  for (int64_t c = 0; c < n; ++c) {
    x[c] = math::exp(x[c] - mx);
    sum += x[c];
  }
  const float inv = 1.0f / sum;
  for (int64_t c = 0; c < n; ++c) x[c] *= inv;
  fill(x + n, S - n, 0.0f);
}

// One (b, h) pair of the forward (eq. 3-6). Writes out (N, M), ac (C, S), qc (C, E), count (C)
// of the pair; vc is C x M scratch.
void forward_pair(const Dims& d, const Params& p, int64_t bh, const float* Q, const float* K,
                  const float* V, float* out, float* ac, float* qc, int32_t* count, float* vc) {
  const int64_t L = p.lengths ? p.lengths[bh / d.H] : d.S;
  const int32_t* a = p.assignment + bh * d.N;
  const float* q = Q + bh * d.N * d.E;
  const float* k = K + bh * d.S * d.E;
  const float* v = V + bh * d.S * d.M;
  // eq. 4-5: Qc_j = (1 / |j|) sum_{i in j} Q_i, summed in query order.
  for (int64_t j = 0; j < d.C; ++j) count[j] = 0;
  fill(qc, d.C * d.E, 0.0f);
  for (int64_t i = 0; i < d.N; ++i) {
    if (a[i] < 0) continue;
    ++count[a[i]];
    float* c = qc + a[i] * d.E;
    for (int64_t e = 0; e < d.E; ++e) c[e] += q[i * d.E + e];
  }
  for (int64_t j = 0; j < d.C; ++j)
    if (count[j] > 1) {
      const float n = static_cast<float>(count[j]);
      for (int64_t e = 0; e < d.E; ++e) qc[j * d.E + e] /= n;
    }
  // eq. 3: Ac = softmax(t Qc K^T) over the valid keys; an empty cluster's row stays 0.
  product(false, true, d.C, L, d.E, p.temperature, qc, d.E, k, d.E, ac, d.S);
  for (int64_t j = 0; j < d.C; ++j) {
    float* row = ac + j * d.S;
    if (count[j] == 0 || L == 0)
      fill(row, d.S, 0.0f);
    else
      softmax_row(row, L, d.S);
  }
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

using detail::check_f32;

// Checks dtypes, devices, shapes, lengths (values in [0, S]), the assignment (values in
// [-1, C)), C and the temperature against Q's shape (B, H, N, E); returns the sizes.
Dims check_inputs(const char* op, const Shape& q_shape, const Tensor& K, const Tensor& V,
                  const Tensor& lengths, const Tensor& assignment, int64_t clusters,
                  float temperature) {
  check_f32(op, "K", K);
  check_f32(op, "V", V);
  detail::check_dtype(op, "assignment", assignment, DType::i32);
  detail::check_same_device(op, K, V);
  detail::check_same_device(op, K, assignment);
  detail::require_cpu(op, K);
  const std::string Q = "Q " + to_string(q_shape);
  CLUSTR_CHECK(q_shape.size() == 4, op, ": expected Q of shape (B, H, N, E), got ", Q);
  Dims d;
  d.B = q_shape[0], d.H = q_shape[1], d.N = q_shape[2], d.E = q_shape[3], d.C = clusters;
  CLUSTR_CHECK(d.E >= 1, op, ": expected Q with E >= 1 (the last axis), got ", Q);
  CLUSTR_CHECK(K.rank() == 4 && K.size(0) == d.B && K.size(1) == d.H && K.size(3) == d.E, op,
               ": expected K of shape (B, H, S, E) = (", d.B, ", ", d.H, ", S, ", d.E,
               ") to match ", Q, ", got ", describe(K));
  d.S = K.size(2);
  CLUSTR_CHECK(V.rank() == 4 && V.size(0) == d.B && V.size(1) == d.H && V.size(2) == d.S, op,
               ": expected V of shape (B, H, S, M) = (", d.B, ", ", d.H, ", ", d.S,
               ", M) to match K ", describe(K), ", got ", describe(V));
  d.M = V.size(3);
  CLUSTR_CHECK(clusters >= 1, op, ": expected clusters >= 1, got ", clusters);
  CLUSTR_CHECK(std::isfinite(temperature), op,
               ": expected a finite temperature (<= 0 for 1/sqrt(E)), got ", temperature);
  CLUSTR_CHECK(assignment.shape() == (Shape{d.B, d.H, d.N}), op,
               ": expected assignment of shape (B, H, N) = (", d.B, ", ", d.H, ", ", d.N,
               ") to match ", Q, ", got ", describe(assignment));
  const int32_t* a = assignment.i32();
  for (int64_t i = 0; i < d.B * d.H * d.N; ++i)
    CLUSTR_CHECK(a[i] >= -1 && a[i] < clusters, op, ": assignment value ", a[i], " at (",
                 i / (d.H * d.N), ", ", i / d.N % d.H, ", ", i % d.N,
                 ") is outside [-1, C = ", clusters, ") (-1 marks a padded query)");
  if (lengths.defined()) {
    detail::check_dtype(op, "lengths", lengths, DType::i32);
    detail::check_same_device(op, K, lengths);
    CLUSTR_CHECK(lengths.shape() == Shape{d.B}, op, ": expected lengths of shape (", d.B,
                 ",) (one per sequence of ", Q, "), got ", describe(lengths));
    const int32_t* len = lengths.i32();
    for (int64_t b = 0; b < d.B; ++b)
      CLUSTR_CHECK(len[b] >= 0 && len[b] <= d.S, op, ": lengths[", b, "] = ", len[b],
                   " is outside [0, S = ", d.S, "] (K ", describe(K), ")");
  }
  return d;
}

Params params_of(const Dims& d, const Tensor& lengths, const Tensor& assignment,
                 float temperature) {
  Params p;
  p.lengths = lengths.defined() ? lengths.i32() : nullptr;
  p.assignment = assignment.i32();
  p.temperature = temperature > 0.0f
                      ? temperature
                      : static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.E)));
  return p;
}

void check_saved(const char* op, const char* what, const Tensor& t, const Tensor& like,
                 DType dtype, const Shape& shape) {
  detail::check_dtype(op, what, t, dtype);
  detail::check_same_device(op, like, t);
  CLUSTR_CHECK(t.shape() == shape, op, ": expected ", what, " of shape ", to_string(shape),
               ", got ", describe(t));
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
