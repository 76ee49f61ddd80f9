// Improved clustered attention for a fixed clustering (improved_clustered.h, eq. 9-11): the CPU
// kernels, the front doors, the autograd node and the dense analysis matrix.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters; L the
// valid keys of a sequence; kk = min(k, L) the top keys of a cluster, kw = min(k, S) the saved
// width; n the members of one cluster; t the temperature.
//
// A task is one (b, h) pair, as in clustered.cpp: centroids and Ac (shared helpers in
// clustered_common.h), the top-k sets, then cluster by cluster the members' exact softmax over
// their T_j, all by cpu::gemm on the task's thread alone. Members are visited in query order
// and clusters in index order, so results never depend on the thread count.
//
// Backward (fixed assignment, fixed T_j). With dO_i the upstream gradient, for cluster j:
//   P_i = softmax_Tj(t q_i K_T^T), out_i = m P_i V_T + R_j, R_j = sum_{l not in T} Ac[l] V_l
//   G_i[l]  = dO_i . V_l (l in T)                  dP_i = m G_i
//   dV_l   += m sum_i P_i[l] dO_i (l in T),        dV_l += Ac[l] dVc_j (l not in T, dVc_j =
//             sum_{i in j} dO_i)
//   dm_j    = sum_i sum_{l in T} P_i[l] G_i[l]     (out_i depends on m linearly, eq. 10)
//   dZ_i    = m P_i (G_i - sum_l P_i[l] G_i[l])    (softmax backward of the exact scores)
//   dq_i    = t dZ_i K_T,  dk_l += t sum_i dZ_i[l] q_i (l in T)
//   dAc[l]  = dm_j (l in T: m = sum_T Ac), dVc_j . V_l (l not in T: eq. 11's second term)
//   dzc     = Ac (dAc - sum_l Ac[l] dAc[l])        (softmax backward of eq. 3)
//   dQc_j   = t dzc K,  dK += t dzc^T Qc,  dq_i += dQc_j / |j|   (the mean of eq. 4-5)
// Masked keys take no part in any product; their rows of dK, dV are 0.
#include "layers/attention/improved_clustered.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "core/parallel.h"
#include "layers/attention/clustered_common.h"

namespace clustr {

namespace {

using namespace clustered_detail;

// Per-thread scratch, sized once per call.
struct Scratch {
  std::vector<float> acr, cm, ds, dqc, qj, oj, kt, vt, P, G, tk, tq;
  std::vector<int32_t> sel;
  std::vector<int64_t> order, start;
  Scratch(const Dims& d, int64_t kw)
      : acr(d.C * d.S), cm(d.C * d.M), ds(d.C * d.S), dqc(d.C * d.E), qj(d.N * d.E),
        oj(d.N * d.M), kt(kw * d.E), vt(kw * d.M), P(d.N * kw), G(d.N * kw),
        tk(kw * std::max(d.E, d.M)), tq(d.N * d.E), sel(d.S), order(d.N), start(d.C + 1) {}
};

// The queries of each cluster in query order: order[start[j] .. start[j + 1]) (a stable
// counting sort of the assignment a (N)).
void group(const Dims& d, const int32_t* a, const int32_t* count, Scratch& s) {
  s.start[0] = 0;
  for (int64_t j = 0; j < d.C; ++j) s.start[j + 1] = s.start[j] + count[j];
  std::vector<int64_t> next(s.start.begin(), s.start.end() - 1);
  for (int64_t i = 0; i < d.N; ++i)
    if (a[i] >= 0) s.order[next[a[i]]++] = i;
}

// eq. 9-10: T = the kk = min(k, L) valid keys with the largest weights of row (S), ties to the
// lower key index, written to tk (kw) in ascending key order with -1 padding; returns m = their
// summed weight (in key order). An empty row (empty cluster, L = 0) has T empty and m = 0.
float select_topk(const float* row, int64_t L, int64_t k, int64_t kw, bool empty,
                  std::vector<int32_t>& sel, int32_t* tk) {
  const int64_t kk = empty ? 0 : std::min(k, L);
  std::iota(sel.begin(), sel.begin() + L, 0);
  // The order (weight descending, then index ascending) is total, so the selected set is
  // unique; nth_element finds it in linear time, then the set is put in key order.
  if (kk > 0 && kk < L)
    std::nth_element(sel.begin(), sel.begin() + (kk - 1), sel.begin() + L,
                     [row](int32_t x, int32_t y) {
                       return row[x] > row[y] || (row[x] == row[y] && x < y);
                     });
  std::sort(sel.begin(), sel.begin() + kk);
  float m = 0.0f;
  for (int64_t c = 0; c < kw; ++c) {
    tk[c] = c < kk ? sel[c] : -1;
    if (c < kk) m += row[sel[c]];
  }
  return m;
}

int64_t topk_size(const int32_t* tk, int64_t kw) {
  int64_t kk = 0;
  while (kk < kw && tk[kk] >= 0) ++kk;
  return kk;
}

// Gathers rows idx[0..n) of x (., width) into y (n, width).
template <class I>
void gather(const float* x, int64_t width, const I* idx, int64_t n, float* y) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < width; ++c) y[r * width + c] = x[idx[r] * width + c];
}

// P (n, kk) = row softmax of t Qj K_T^T: the exact member weights on T (eq. 11), kk >= 1.
void member_weights(int64_t n, int64_t kk, int64_t E, float t, const float* qj, const float* kt,
                    float* P) {
  product(false, true, n, kk, E, t, qj, E, kt, E, P, kk);
  for (int64_t r = 0; r < n; ++r) softmax_row(P + r * kk, kk, kk);
}

// One (b, h) pair of the forward (eq. 3-11). Writes out (N, M), ac (C, S), qc (C, E),
// count (C), tk (C, kw), mass (C) of the pair.
void forward_pair(const Dims& d, const Params& p, int64_t k, int64_t kw, int64_t bh,
                  const float* Q, const float* K, const float* V, float* out, float* ac,
                  float* qc, int32_t* count, int32_t* tk, float* mass, Scratch& s) {
  const int64_t L = p.lengths ? p.lengths[bh / d.H] : d.S;
  const int32_t* a = p.assignment + bh * d.N;
  const float* q = Q + bh * d.N * d.E;
  const float* kb = K + bh * d.S * d.E;
  const float* v = V + bh * d.S * d.M;
  float* o = out + bh * d.N * d.M;
  centroids(d, a, q, qc, count);                 // eq. 4-5
  centroid_weights(d, p, L, qc, count, kb, ac);  // eq. 3
  for (int64_t j = 0; j < d.C; ++j)              // eq. 9-10
    mass[j] = select_topk(ac + j * d.S, L, k, kw, count[j] == 0 || L == 0, s.sel, tk + j * kw);
  fill(o, d.N * d.M, 0.0f);
  if (L == 0) return;
  // eq. 11, second term once per cluster: R = (Ac with the T_j columns zeroed) V.
  std::copy(ac, ac + d.C * d.S, s.acr.begin());
  for (int64_t j = 0; j < d.C; ++j)
    for (int64_t c = 0; c < kw && tk[j * kw + c] >= 0; ++c) s.acr[j * d.S + tk[j * kw + c]] = 0;
  product(false, false, d.C, d.M, L, 1.0f, s.acr.data(), d.S, v, d.M, s.cm.data(), d.M);
  // eq. 11, first term: m_j softmax_Tj(t q_i K_T^T) V_T for the members of each cluster.
  group(d, a, count, s);
  for (int64_t j = 0; j < d.C; ++j) {
    const int64_t n = count[j], kk = topk_size(tk + j * kw, kw);
    if (n == 0) continue;
    const int64_t* members = s.order.data() + s.start[j];
    gather(q, d.E, members, n, s.qj.data());
    gather(kb, d.E, tk + j * kw, kk, s.kt.data());
    gather(v, d.M, tk + j * kw, kk, s.vt.data());
    member_weights(n, kk, d.E, p.temperature, s.qj.data(), s.kt.data(), s.P.data());
    product(false, false, n, d.M, kk, mass[j], s.P.data(), kk, s.vt.data(), d.M, s.oj.data(),
            d.M);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < d.M; ++c)
        o[members[r] * d.M + c] = s.oj[r * d.M + c] + s.cm[j * d.M + c];
  }
}

// One (b, h) pair of the backward (the derivation at the top of this file). Writes dQ (N, E),
// dK (S, E), dV (S, M) of the pair.
void backward_pair(const Dims& d, const Params& p, int64_t kw, int64_t bh, const float* Q,
                   const float* K, const float* V, const float* ac, const float* qc,
                   const int32_t* count, const int32_t* tk, const float* mass, const float* dout,
                   float* dQ, float* dK, float* dV, Scratch& s) {
  const int64_t L = p.lengths ? p.lengths[bh / d.H] : d.S;
  const int32_t* a = p.assignment + bh * d.N;
  const float t = p.temperature;
  const float* q = Q + bh * d.N * d.E;
  const float* kb = K + bh * d.S * d.E;
  const float* v = V + bh * d.S * d.M;
  const float* go = dout + bh * d.N * d.M;
  float* dq = dQ + bh * d.N * d.E;
  float* dk = dK + bh * d.S * d.E;
  float* dv = dV + bh * d.S * d.M;
  fill(dq, d.N * d.E, 0.0f);  // padded queries keep 0
  fill(dk, d.S * d.E, 0.0f);  // masked keys keep 0; the valid rows accumulate below
  fill(dv + L * d.M, (d.S - L) * d.M, 0.0f);
  if (L == 0) return;

  // dVc_j = sum_{i in j} dO_i; dV = (Ac with T_j zeroed)^T dVc (eq. 11, second term).
  float* dvc = s.cm.data();
  fill(dvc, d.C * d.M, 0.0f);
  for (int64_t i = 0; i < d.N; ++i)
    if (a[i] >= 0)
      for (int64_t c = 0; c < d.M; ++c) dvc[a[i] * d.M + c] += go[i * d.M + c];
  std::copy(ac, ac + d.C * d.S, s.acr.begin());
  for (int64_t j = 0; j < d.C; ++j)
    for (int64_t c = 0; c < kw && tk[j * kw + c] >= 0; ++c) s.acr[j * d.S + tk[j * kw + c]] = 0;
  product(true, false, L, d.M, d.C, 1.0f, s.acr.data(), d.S, dvc, d.M, dv, d.M);
  // dAc = dVc V^T off the top-k sets (overwritten with dm_j on them below).
  product(false, true, d.C, L, d.M, 1.0f, dvc, d.M, v, d.M, s.ds.data(), d.S);

  // The exact top-k part of eq. 11, cluster by cluster.
  group(d, a, count, s);
  for (int64_t j = 0; j < d.C; ++j) {
    const int64_t n = count[j];
    if (n == 0) continue;
    const int32_t* T = tk + j * kw;
    const int64_t kk = topk_size(T, kw);
    const int64_t* members = s.order.data() + s.start[j];
    float *P = s.P.data(), *G = s.G.data();
    gather(q, d.E, members, n, s.qj.data());
    gather(go, d.M, members, n, s.oj.data());
    gather(kb, d.E, T, kk, s.kt.data());
    gather(v, d.M, T, kk, s.vt.data());
    member_weights(n, kk, d.E, t, s.qj.data(), s.kt.data(), P);
    product(false, true, n, kk, d.M, 1.0f, s.oj.data(), d.M, s.vt.data(), d.M, G, kk);
    // dV_T += m P^T dO
    product(true, false, kk, d.M, n, mass[j], P, kk, s.oj.data(), d.M, s.tk.data(), d.M);
    for (int64_t c = 0; c < kk; ++c)
      for (int64_t m = 0; m < d.M; ++m) dv[T[c] * d.M + m] += s.tk[c * d.M + m];
    // dm_j and dZ = m P (G - rowsum(P G)), in place of G.
    float dm = 0.0f;
    for (int64_t r = 0; r < n; ++r) {
      float dot = 0.0f;
      for (int64_t c = 0; c < kk; ++c) dot += P[r * kk + c] * G[r * kk + c];
      dm += dot;
      for (int64_t c = 0; c < kk; ++c)
        G[r * kk + c] = mass[j] * P[r * kk + c] * (G[r * kk + c] - dot);
    }
    // dq_i = t dZ_i K_T; dK_T += t dZ^T Qj
    product(false, false, n, d.E, kk, t, G, kk, s.kt.data(), d.E, s.tq.data(), d.E);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t e = 0; e < d.E; ++e) dq[members[r] * d.E + e] = s.tq[r * d.E + e];
    product(true, false, kk, d.E, n, t, G, kk, s.qj.data(), d.E, s.tk.data(), d.E);
    for (int64_t c = 0; c < kk; ++c)
      for (int64_t e = 0; e < d.E; ++e) dk[T[c] * d.E + e] += s.tk[c * d.E + e];
    for (int64_t c = 0; c < kk; ++c) s.ds[j * d.S + T[c]] = dm;  // m_j = sum_T Ac_j (eq. 10)
  }

  // Through Ac (eq. 3) and the centroids (eq. 4-5).
  for (int64_t j = 0; j < d.C; ++j) {
    const float* w = ac + j * d.S;
    float* g = s.ds.data() + j * d.S;
    float dot = 0.0f;
    for (int64_t c = 0; c < L; ++c) dot += g[c] * w[c];
    for (int64_t c = 0; c < L; ++c) g[c] = w[c] * (g[c] - dot);  // empty cluster: w = 0
  }
  product(false, false, d.C, d.E, L, t, s.ds.data(), d.S, kb, d.E, s.dqc.data(), d.E);
  product(true, false, L, d.E, d.C, t, s.ds.data(), d.S, qc, d.E, dk, d.E, 1.0f);
  for (int64_t i = 0; i < d.N; ++i) {
    if (a[i] < 0) continue;
    const float n = static_cast<float>(count[a[i]]);
    for (int64_t e = 0; e < d.E; ++e) dq[i * d.E + e] += s.dqc[a[i] * d.E + e] / n;
  }
}

void check_topk(const char* op, int64_t topk) {
  CLUSTR_CHECK(topk >= 1, op, ": expected topk >= 1 (the keys kept per cluster), got ", topk);
}

class ImprovedClusteredAttentionNode : public Node {
 public:
  const char* name() const override { return "improved_clustered_attention"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    ImprovedClusteredAttentionGrads d = improved_clustered_attention_backward(
        g, Q_, K_, V_, lengths_, assignment_, saved_, temperature_);
    return {std::move(d.dQ), std::move(d.dK), std::move(d.dV)};
  }
  void release() override {
    Q_ = K_ = V_ = lengths_ = assignment_ = Tensor();
    saved_ = ImprovedClusteredAttentionOutput();
  }

  Tensor Q_, K_, V_, lengths_, assignment_;
  ImprovedClusteredAttentionOutput saved_;  // out left undefined
  float temperature_ = 0.0f;
};

}  // namespace

ImprovedClusteredAttentionOutput improved_clustered_attention_forward(
    const Tensor& Q, const Tensor& K, const Tensor& V, const Tensor& lengths,
    const Tensor& assignment, int64_t clusters, int64_t topk, float temperature) {
  const char* op = "improved_clustered_attention";
  check_f32(op, "Q", Q);
  detail::check_same_device(op, Q, K);
  check_topk(op, topk);
  const Dims d = check_inputs(op, Q.shape(), K, V, lengths, assignment, clusters, temperature);
  const Params p = params_of(d, lengths, assignment, temperature);
  const int64_t kw = std::min(topk, d.S);
  ImprovedClusteredAttentionOutput r;
  r.out = Tensor::empty({d.B, d.H, d.N, d.M}, DType::f32, Q.device());
  r.weights = Tensor::empty({d.B, d.H, d.C, d.S}, DType::f32, Q.device());
  r.centroids = Tensor::empty({d.B, d.H, d.C, d.E}, DType::f32, Q.device());
  r.counts = Tensor::empty({d.B, d.H, d.C}, DType::i32, Q.device());
  r.topk = Tensor::empty({d.B, d.H, d.C, kw}, DType::i32, Q.device());
  r.mass = Tensor::empty({d.B, d.H, d.C}, DType::f32, Q.device());
  const int64_t pairs = d.B * d.H;
  if (pairs == 0) return r;
  const float *q = Q.f32(), *k = K.f32(), *v = V.f32();
  float *out = r.out.f32(), *ac = r.weights.f32(), *qc = r.centroids.f32(), *mass = r.mass.f32();
  int32_t *count = r.counts.i32(), *tk = r.topk.i32();
#pragma omp parallel num_threads(num_threads())
  {
    set_num_threads(1);  // for cpu::gemm inside this region (this thread's ICV only)
    Scratch s(d, kw);
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < pairs; ++bh)
      forward_pair(d, p, topk, kw, bh, q, k, v, out, ac + bh * d.C * d.S, qc + bh * d.C * d.E,
                   count + bh * d.C, tk + bh * d.C * kw, mass + bh * d.C, s);
  }
  return r;
}

ImprovedClusteredAttentionGrads improved_clustered_attention_backward(
    const Tensor& dout, const Tensor& Q, const Tensor& K, const Tensor& V, const Tensor& lengths,
    const Tensor& assignment, const ImprovedClusteredAttentionOutput& forward,
    float temperature) {
  const char* op = "improved_clustered_attention_backward";
  check_f32(op, "Q", Q);
  detail::check_same_device(op, Q, K);
  CLUSTR_CHECK(forward.topk.defined() && forward.topk.rank() == 4, op,
               ": expected the forward's topk of shape (B, H, C, min(k, S)), got ",
               forward.topk.defined() ? describe(forward.topk) : "undefined");
  const int64_t clusters = forward.topk.size(2), kw = forward.topk.size(3);
  const Dims d = check_inputs(op, Q.shape(), K, V, lengths, assignment, clusters, temperature);
  const Params p = params_of(d, lengths, assignment, temperature);
  check_saved(op, "dout", dout, K, DType::f32, {d.B, d.H, d.N, d.M});
  check_saved(op, "weights", forward.weights, K, DType::f32, {d.B, d.H, d.C, d.S});
  check_saved(op, "centroids", forward.centroids, K, DType::f32, {d.B, d.H, d.C, d.E});
  check_saved(op, "counts", forward.counts, K, DType::i32, {d.B, d.H, d.C});
  check_saved(op, "mass", forward.mass, K, DType::f32, {d.B, d.H, d.C});
  check_saved(op, "topk", forward.topk, K, DType::i32, {d.B, d.H, d.C, kw});
  CLUSTR_CHECK(kw <= d.S, op, ": the forward's topk width ", kw, " exceeds S = ", d.S);
  ImprovedClusteredAttentionGrads g;
  g.dQ = Tensor::empty(Q.shape(), DType::f32, K.device());
  g.dK = Tensor::empty(K.shape(), DType::f32, K.device());
  g.dV = Tensor::empty(V.shape(), DType::f32, K.device());
  const int64_t pairs = d.B * d.H;
  if (pairs == 0) return g;
  const float *q = Q.f32(), *k = K.f32(), *v = V.f32(), *ac = forward.weights.f32(),
              *qc = forward.centroids.f32(), *mass = forward.mass.f32(), *go = dout.f32();
  const int32_t *count = forward.counts.i32(), *tk = forward.topk.i32();
  float *dQ = g.dQ.f32(), *dK = g.dK.f32(), *dV = g.dV.f32();
#pragma omp parallel num_threads(num_threads())
  {
    set_num_threads(1);  // for cpu::gemm inside this region (this thread's ICV only)
    Scratch s(d, kw);
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < pairs; ++bh)
      backward_pair(d, p, kw, bh, q, k, v, ac + bh * d.C * d.S, qc + bh * d.C * d.E,
                    count + bh * d.C, tk + bh * d.C * kw, mass + bh * d.C, go, dQ, dK, dV, s);
  }
  return g;
}

Variable improved_clustered_attention(const Variable& Q, const Variable& K, const Variable& V,
                                      const Tensor& lengths, const Tensor& assignment,
                                      int64_t clusters, int64_t topk, float temperature) {
  ImprovedClusteredAttentionOutput r = improved_clustered_attention_forward(
      Q.data(), K.data(), V.data(), lengths, assignment, clusters, topk, temperature);
  if (!record_needed({&Q, &K, &V})) return Variable(std::move(r.out));
  auto node = std::make_shared<ImprovedClusteredAttentionNode>();
  node->Q_ = Q.data();
  node->K_ = K.data();
  node->V_ = V.data();
  node->lengths_ = lengths;
  node->assignment_ = assignment;
  Tensor out = std::move(r.out);
  node->saved_ = std::move(r);  // out left undefined
  node->temperature_ = temperature;
  return attach(std::move(out), std::move(node), {&Q, &K, &V});
}

Tensor attention_matrix(AttentionType type, const Tensor& Q, const Tensor& K,
                        const Tensor& lengths, const Tensor& assignment, int64_t clusters,
                        int64_t topk, float temperature) {
  const char* op = "attention_matrix";
  check_f32(op, "Q", Q);
  detail::check_same_device(op, Q, K);
  CLUSTR_CHECK(K.rank() == 4, op, ": expected K of shape (B, H, S, E), got ", describe(K));
  const int64_t B = Q.size(0), H = Q.size(1), N = Q.size(2), S = K.size(2);
  const Tensor V = Tensor::zeros({B, H, S, 1}, DType::f32, Q.device());
  const bool full = type == AttentionType::full;
  // The full type uses a one-cluster stand-in only for the checks and the temperature.
  const Tensor a = full ? Tensor::zeros({B, H, N}, DType::i32, Q.device()) : assignment;
  const ImprovedClusteredAttentionOutput f = improved_clustered_attention_forward(
      Q, K, V, lengths, a, full ? 1 : clusters, full ? S + 1 : topk, temperature);
  const int64_t E = Q.size(3), C = f.counts.size(2), kw = f.topk.size(3);
  const Params p = params_of(Dims{B, H, N, S, E, 1, C}, lengths, a, temperature);
  Tensor A = Tensor::zeros({B, H, N, S}, DType::f32, Q.device());
  const float *q = Q.f32(), *k = K.f32(), *ac = f.weights.f32(), *mass = f.mass.f32();
  const int32_t *ai = a.i32(), *tk = f.topk.i32();
  float* w = A.f32();
  std::vector<float> row(static_cast<size_t>(S));
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t L = p.lengths ? p.lengths[bh / H] : S;
    for (int64_t i = 0; i < N; ++i) {
      const int32_t j = ai[bh * N + i];
      float* out = w + (bh * N + i) * S;
      if (j < 0 || L == 0 || (full && N == S && i >= L)) continue;
      const float* acj = ac + (bh * C + j) * S;
      const int32_t* T = tk + (bh * C + j) * kw;
      const int64_t kk = full ? L : topk_size(T, kw);
      if (type == AttentionType::clustered) {
        std::copy(acj, acj + S, out);
        continue;
      }
      for (int64_t c = 0; c < kk; ++c) {  // exact scores on T (every valid key for full)
        const int64_t l = full ? c : T[c];
        float dot = 0.0f;
        for (int64_t e = 0; e < E; ++e) dot += q[(bh * N + i) * E + e] * k[(bh * S + l) * E + e];
        row[c] = p.temperature * dot;
      }
      softmax_row(row.data(), kk, kk);
      if (full) {
        std::copy(row.begin(), row.begin() + kk, out);
        continue;
      }
      std::copy(acj, acj + S, out);  // eq. 11: Ac_j off T, m_j softmax_T on T
      for (int64_t c = 0; c < kk; ++c) out[T[c]] = mass[bh * C + j] * row[c];
    }
  }
  return A;
}

}  // namespace clustr
