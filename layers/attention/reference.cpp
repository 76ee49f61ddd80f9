// The paper's attention as plain autograd expressions (reference.h). Every (b, h) pair is one
// matrix of a batch: (B, H, N, E) is viewed as (B H, N, E), so that one batched matmul is one
// product per pair.
#include "layers/attention/reference.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "autograd/ops.h"
#include "core/error.h"
#include "core/math.h"
#include "core/ops_check.h"
#include "core/philox.h"
#include "core/random.h"

namespace clustr {

namespace {

// A finite stand-in for -inf in the masks: a row that sees no key stays finite under softmax
// (it comes out uniform and is then zeroed), where -inf would give NaN and NaN gradients.
constexpr float kMasked = -1e30f;

struct Sizes {
  int64_t B, H, N, S, E, M;
  std::vector<int32_t> len;  // lengths on the host; empty: every key valid
  int64_t keys(int64_t pair) const { return len.empty() ? S : len[pair / H]; }
};

Sizes check_inputs(const char* op, const Variable& Q, const Variable& K, const Variable& V,
                   const Tensor& lengths) {
  CLUSTR_CHECK(Q.defined() && K.defined() && V.defined(), op, ": use of an undefined Variable");
  for (const Variable* x : {&Q, &K, &V}) detail::require_cpu(op, x->data());
  CLUSTR_CHECK(Q.rank() == 4 && K.rank() == 4 && V.rank() == 4, op,
               ": expected Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M), got Q ",
               describe(Q.data()), ", K ", describe(K.data()), ", V ", describe(V.data()));
  Sizes s{Q.size(0), Q.size(1), Q.size(2), K.size(2), Q.size(3), V.size(3), {}};
  CLUSTR_CHECK(K.size(0) == s.B && K.size(1) == s.H && K.size(3) == s.E && V.size(0) == s.B &&
                   V.size(1) == s.H && V.size(2) == s.S,
               op, ": K must be (B, H, S, E) and V (B, H, S, M) for Q ", describe(Q.data()),
               ", got K ", describe(K.data()), ", V ", describe(V.data()));
  if (lengths.defined()) {
    detail::check_lengths(op, lengths, s.B, s.S, "S", "K", K.data());
    s.len = lengths.to_int_vector();
  }
  return s;
}

// What element idx of a dropout mask (seed, offset) multiplies its weight by: 1 / (1 - p) when
// kept, 0 when dropped (the definition in clustered.h and full.h); 1 without dropout.
float keep_factor(float p, uint64_t seed, uint64_t offset, uint64_t idx) {
  if (p <= 0.0f) return 1.0f;
  const Philox4 r = philox4x32(seed, offset + idx / 4);
  return uint_to_unit(r.v[idx % 4]) >= p ? 1.0f / (1.0f - p) : 0.0f;
}

float temperature_of(float t, int64_t E) {
  return t > 0.0f ? t : static_cast<float>(1.0 / std::sqrt(static_cast<double>(E)));
}

// (B, H, R, D) -> (B H, R, D), one matrix per pair.
Variable pairs(const Variable& x) {
  return reshape(x, {x.size(0) * x.size(1), x.size(2), x.size(3)});
}

Variable constant(std::vector<float> values, const Shape& shape) {
  return Variable(Tensor::from_vector(values, shape));
}

// The assignment on the host, checked: (B H N) values in [-1, C).
std::vector<int32_t> check_assignment(const char* op, const Tensor& assignment, const Sizes& s,
                                      int64_t C) {
  CLUSTR_CHECK(C >= 1, op, ": expected clusters >= 1, got ", C);
  detail::check_dtype(op, "assignment", assignment, DType::i32);
  CLUSTR_CHECK(assignment.shape() == (Shape{s.B, s.H, s.N}), op,
               ": expected assignment (B, H, N) = (", s.B, ", ", s.H, ", ", s.N, "), got ",
               describe(assignment));
  std::vector<int32_t> a = assignment.to_int_vector();
  for (size_t i = 0; i < a.size(); ++i)
    CLUSTR_CHECK(a[i] >= -1 && a[i] < C, op, ": assignment value ", a[i], " at flat index ", i,
                 " is outside [-1, C = ", C, ")");
  return a;
}

// The cluster matrices of every pair: mean (B H, C, N) with 1 / |j| where query i is in
// cluster j (so mean Q = the centroids, eq. 4-5), and member (B H, N, C) with 1 there (so
// member X gives each query its cluster's row, eq. 6).
struct Clusters {
  Variable mean, member;
  std::vector<int32_t> count;  // (B H C)
};
Clusters clusters_of(const std::vector<int32_t>& a, const Sizes& s, int64_t C) {
  const int64_t P = s.B * s.H, N = s.N;
  Clusters r;
  r.count.assign(static_cast<size_t>(P * C), 0);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < N; ++i)
      if (a[p * N + i] >= 0) ++r.count[p * C + a[p * N + i]];
  std::vector<float> mean(static_cast<size_t>(P * C * N), 0.0f), member(mean.size(), 0.0f);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < N; ++i) {
      const int32_t j = a[p * N + i];
      if (j < 0) continue;
      mean[(p * C + j) * N + i] = 1.0f / static_cast<float>(r.count[p * C + j]);
      member[(p * N + i) * C + j] = 1.0f;
    }
  r.mean = constant(mean, {P, C, N});
  r.member = constant(member, {P, N, C});
  return r;
}

// eq. 3: Ac = softmax(t Qc K^T + mask) (B H, C, S), rows of empty clusters and of pairs without
// keys 0.
Variable centroid_weights(const Variable& Q, const Variable& K, const Clusters& c,
                          const Sizes& s, int64_t C, float t) {
  const int64_t P = s.B * s.H, S = s.S;
  std::vector<float> mask(static_cast<size_t>(P * S), 0.0f), keep(static_cast<size_t>(P * C));
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t l = s.keys(p); l < S; ++l) mask[p * S + l] = kMasked;
    for (int64_t j = 0; j < C; ++j) keep[p * C + j] = c.count[p * C + j] > 0 && s.keys(p) > 0;
  }
  const Variable Qc = matmul(c.mean, pairs(Q));  // eq. 4-5
  const Variable logits = matmul(Qc, pairs(K), false, true) * t + constant(mask, {P, 1, S});
  return softmax(logits) * constant(keep, {P, C, 1});
}

Variable heads_out(const Variable& x, const Sizes& s) { return reshape(x, {s.B, s.H, s.N, s.M}); }

// Ac's dropout factors Dc (B H, C, S), element ((b H + h) C + j) S + l of the stream.
Variable cluster_dropout(const ClusteredDropout& d, const Sizes& s, int64_t C) {
  const int64_t n = s.B * s.H * C * s.S;
  std::vector<float> f(static_cast<size_t>(n));
  const uint64_t offset = host_offset(d.offset, "reference attention");
  for (int64_t x = 0; x < n; ++x) f[x] = keep_factor(d.p, d.seed, offset, uint64_t(x));
  return constant(f, {s.B * s.H, C, s.S});
}

}  // namespace

Variable full_attention_reference(const Variable& Q, const Variable& K, const Variable& V,
                                  const Tensor& lengths, const FullAttentionOptions& options) {
  const char* op = "full_attention_reference";
  const Sizes s = check_inputs(op, Q, K, V, lengths);
  const bool causal = options.causal;
  CLUSTR_CHECK(!causal || s.N == s.S, op, ": causal attention needs N == S, got N = ", s.N,
               ", S = ", s.S);
  const int64_t P = s.B * s.H, N = s.N, S = s.S;
  // mask: the keys query i may not see; keep: 0 for padded queries and rows that see no key,
  // else the dropout factor of element ((b H + h) N + i) S + l.
  std::vector<float> mask(static_cast<size_t>(P * N * S), 0.0f), keep(mask.size());
  const uint64_t offset = host_offset(options.offset, "reference attention");
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < N; ++i) {
      const int64_t L = s.keys(p), seen = causal ? std::min(L, i + 1) : L;
      const bool row = seen > 0 && !(N == S && i >= L);
      for (int64_t l = 0; l < S; ++l) {
        const int64_t x = (p * N + i) * S + l;
        if (l >= seen) mask[x] = kMasked;
        keep[x] = row ? keep_factor(options.dropout, options.seed, offset, uint64_t(x)) : 0.0f;
      }
    }
  const float t = temperature_of(options.temperature, s.E);
  const Variable logits =
      matmul(pairs(Q), pairs(K), false, true) * t + constant(mask, {P, N, S});  // eq. 1
  const Variable A = softmax(logits) * constant(keep, {P, N, S});
  return heads_out(matmul(A, pairs(V)), s);  // eq. 2
}

Variable reformer_attention_reference(const Variable& Q, const Variable& V, const Tensor& lengths,
                                      const Tensor& buckets, int64_t chunk, float temperature) {
  const char* op = "reformer_attention_reference";
  const Sizes s = check_inputs(op, Q, Q, V, lengths);
  detail::check_dtype(op, "buckets", buckets, DType::i32);
  CLUSTR_CHECK(buckets.rank() == 4 && buckets.size(0) == s.B && buckets.size(1) == s.H &&
                   buckets.size(3) == s.N && chunk >= 1,
               op, ": expected buckets (B, H, X, N) and chunk >= 1, got ", describe(buckets),
               " and ", chunk);
  const int64_t P = s.B * s.H, N = s.N, X = buckets.size(2);
  const std::vector<int32_t> bk = buckets.to_int_vector();
  std::vector<float> count(static_cast<size_t>(P * N * N), 0.0f), keep(count.size(), 0.0f);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t L = s.keys(p);
    for (int64_t x = 0; x < X; ++x) {
      const int32_t* b = bk.data() + (p * X + x) * N;
      std::vector<int64_t> order(static_cast<size_t>(L));
      std::iota(order.begin(), order.end(), int64_t{0});
      std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return b[i] < b[j]; });
      for (int64_t a = 0; a < L; ++a) {
        const int64_t c = a / chunk, first = std::max<int64_t>(0, (c - 1) * chunk),
                      last = std::min(L, (c + 1) * chunk);
        for (int64_t k = first; k < last; ++k)
          if (order[k] != order[a]) count[(p * N + order[a]) * N + order[k]] += 1.0f;
      }
    }
    for (int64_t i = 0; i < N; ++i) {
      float* row = count.data() + (p * N + i) * N;
      if (std::all_of(row, row + N, [](float c) { return c == 0.0f; })) row[i] = 1.0f;
      std::fill(keep.begin() + (p * N + i) * N, keep.begin() + (p * N + i + 1) * N,
                i < L ? 1.0f : 0.0f);
    }
  }
  for (float& c : count) c = c > 0.0f ? std::log(c) : kMasked;
  const Variable K = Q / sqrt(sum(Q * Q, 3, true));
  const float t = temperature_of(temperature, s.E);
  const Variable logits = matmul(pairs(Q), pairs(K), false, true) * t + constant(count, {P, N, N});
  return heads_out(matmul(softmax(logits) * constant(keep, {P, N, N}), pairs(V)), s);
}

Variable clustered_attention_reference(const Variable& Q, const Variable& K, const Variable& V,
                                       const Tensor& lengths, const Tensor& assignment,
                                       int64_t clusters, float temperature,
                                       const ClusteredDropout& dropout) {
  const char* op = "clustered_attention_reference";
  const Sizes s = check_inputs(op, Q, K, V, lengths);
  const Clusters c = clusters_of(check_assignment(op, assignment, s, clusters), s, clusters);
  Variable Ac = centroid_weights(Q, K, c, s, clusters, temperature_of(temperature, s.E));
  if (dropout.p > 0.0f) Ac = Ac * cluster_dropout(dropout, s, clusters);
  const Variable Vc = matmul(Ac, pairs(V));    // (B H, C, M)
  return heads_out(matmul(c.member, Vc), s);  // eq. 6: out_i = Vc_{j(i)}
}

Variable improved_clustered_attention_reference(const Variable& Q, const Variable& K,
                                                const Variable& V, const Tensor& lengths,
                                                const Tensor& assignment, int64_t clusters,
                                                int64_t topk, float temperature,
                                                const Tensor& topk_sets,
                                                const ClusteredDropout& dropout) {
  const char* op = "improved_clustered_attention_reference";
  const Sizes s = check_inputs(op, Q, K, V, lengths);
  CLUSTR_CHECK(topk >= 1, op, ": expected topk >= 1, got ", topk);
  const std::vector<int32_t> a = check_assignment(op, assignment, s, clusters);
  const Clusters c = clusters_of(a, s, clusters);
  const float t = temperature_of(temperature, s.E);
  const Variable Ac = centroid_weights(Q, K, c, s, clusters, t);
  const int64_t P = s.B * s.H, N = s.N, S = s.S, C = clusters, w = std::min(topk, S);

  // T_j (eq. 9), each in ascending key order.
  std::vector<std::vector<int64_t>> T(static_cast<size_t>(P * C));
  if (topk_sets.defined()) {
    detail::check_dtype(op, "topk_sets", topk_sets, DType::i32);
    CLUSTR_CHECK(topk_sets.shape() == (Shape{s.B, s.H, C, w}), op,
                 ": expected topk_sets (B, H, C, min(k, S)) = (", s.B, ", ", s.H, ", ", C,
                 ", ", w, "), got ", describe(topk_sets));
    const std::vector<int32_t> sets = topk_sets.to_int_vector();
    for (int64_t pj = 0; pj < P * C; ++pj)
      for (int64_t x = 0; x < w; ++x) {
        const int32_t l = sets[pj * w + x];
        CLUSTR_CHECK(l >= -1 && l < s.keys(pj / C), op, ": topk_sets value ", l,
                     " is not a valid key of its sequence (or -1)");
        if (l >= 0) T[pj].push_back(l);
      }
  } else {
    const std::vector<float> weights = Ac.data().to_vector();
    for (int64_t pj = 0; pj < P * C; ++pj) {
      if (c.count[pj] == 0) continue;  // an empty cluster has no T
      const int64_t L = s.keys(pj / C);
      std::vector<int64_t>& keys = T[pj];
      keys.resize(static_cast<size_t>(L));
      std::iota(keys.begin(), keys.end(), int64_t{0});
      const float* row = weights.data() + pj * S;
      std::stable_sort(keys.begin(), keys.end(),
                       [&](int64_t x, int64_t y) { return row[x] > row[y]; });
      keys.resize(static_cast<size_t>(std::min(topk, L)));
      std::sort(keys.begin(), keys.end());
    }
  }
  // top: 1 on T_j; off: 1 elsewhere (eq. 11's second term, where the cluster's mask falls).
  std::vector<float> top(static_cast<size_t>(P * C * S), 0.0f), off(top.size(), 1.0f);
  for (int64_t pj = 0; pj < P * C; ++pj)
    for (int64_t l : T[pj]) top[pj * S + l] = 1.0f, off[pj * S + l] = 0.0f;
  Variable rest = Ac * constant(off, {P, C, S});
  if (dropout.p > 0.0f) rest = rest * cluster_dropout(dropout, s, C);

  // Each member's view of T_j: not_top masks the other keys of its exact softmax; slot holds
  // the query's dropout factor of T_j's c-th key, element B H C S + ((b H + h) N + i) w + c.
  std::vector<float> not_top(static_cast<size_t>(P * N * S), kMasked), slot(not_top.size(), 1.0f);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < N; ++i) {
      const int32_t j = a[p * N + i];
      if (j < 0) continue;
      const std::vector<int64_t>& keys = T[p * C + j];
      for (size_t x = 0; x < keys.size(); ++x) {
        const int64_t at = (p * N + i) * S + keys[x];
        not_top[at] = 0.0f;
        slot[at] = keep_factor(dropout.p, dropout.seed,
                               host_offset(dropout.offset, "reference attention"),
                               uint64_t(P * C * S + (p * N + i) * w) + x);
      }
    }
  // eq. 10-11: m_j times the members' exact softmax over T_j, plus Ac_j off T_j. A query without
  // T (padded, or a pair without keys) has m = 0 there and a zero row of member.
  const Variable m = sum(Ac * constant(top, {P, C, S}), 2, /*keepdim=*/true);  // (B H, C, 1)
  const Variable exact =
      softmax(matmul(pairs(Q), pairs(K), false, true) * t + constant(not_top, {P, N, S}));
  const Variable A =
      matmul(c.member, m) * exact * constant(slot, {P, N, S}) + matmul(c.member, rest);
  return heads_out(matmul(A, pairs(V)), s);
}

Clustering cluster_queries_reference(const Tensor& Q, const Tensor& lengths,
                                     const ClusteringOptions& options, Generator& gen) {
  const char* op = "cluster_queries_reference";
  detail::check_f32(op, "Q", Q);
  detail::require_cpu(op, Q);
  CLUSTR_CHECK(Q.rank() == 4, op, ": expected Q (B, H, N, E), got ", describe(Q));
  const int64_t B = Q.size(0), H = Q.size(1), N = Q.size(2), E = Q.size(3);
  const int C = options.clusters, K = options.bits;
  CLUSTR_CHECK(C >= 1 && K >= 1 && K <= 63 && options.iterations >= 0, op,
               ": expected clusters >= 1, bits in [1, 63] and iterations >= 0, got ", C, ", ", K,
               ", ", options.iterations);
  std::vector<int32_t> len;
  if (lengths.defined()) {
    detail::check_lengths(op, lengths, B, N, "N", "Q", Q);
    len = lengths.to_int_vector();
  }
  // The draws, in cluster_queries' order: the planes, then a threshold block per (b, h, k),
  // then a seeding block per (b, h, j).
  Tensor planes = Tensor::empty({K, E});
  normal_(planes, gen);
  const uint64_t seed = gen.seed(), threshold_base = gen.reserve(uint64_t(B * H * K)),
                 seed_base = gen.reserve(uint64_t(B * H * C));
  auto draw64 = [&](uint64_t block) {
    const Philox4 r = philox4x32(seed, block);
    return (uint64_t{r.v[0]} << 32) | r.v[1];
  };
  auto distance = [](uint64_t x, uint64_t y) { return math::popcount64(x ^ y); };

  Clustering out;
  out.assignment = Tensor::zeros({B, H, N}, DType::i32);
  out.counts = Tensor::zeros({B, H, C}, DType::i32);
  int32_t* assignment = out.assignment.i32();
  int32_t* counts = out.counts.i32();
  const std::vector<float> proj_all =
      matmul(Q.reshape({B * H * N, E}), planes, false, true).to_vector();  // w_k . q
  for (int64_t p = 0; p < B * H; ++p) {
    const int64_t V = len.empty() ? N : len[p / H];
    int32_t* a = assignment + p * N;
    std::fill(a, a + N, -1);
    if (V == 0) continue;
    const float* proj = proj_all.data() + p * N * K;
    // Hashing: each plane's threshold drawn uniformly over its range on the valid queries.
    std::vector<uint64_t> code(static_cast<size_t>(V), 0);
    for (int k = 0; k < K; ++k) {
      float lo = proj[k], hi = proj[k];
      for (int64_t i = 1; i < V; ++i)
        lo = std::min(lo, proj[i * K + k]), hi = std::max(hi, proj[i * K + k]);
      const float u = uint_to_unit(philox4x32(seed, threshold_base + uint64_t(p * K + k)).v[0]);
      const float t = math::clustering_threshold(lo, hi, u);
      for (int64_t i = 0; i < V; ++i)
        if (proj[i * K + k] > t) code[i] |= uint64_t{1} << k;
    }
    // k-means++ seeding: a uniform first code, then codes drawn with probability ~ d^2, d the
    // distance to the nearest centroid so far, until C are seeded or every code is one.
    std::vector<uint64_t> centroid{code[draw64(seed_base + uint64_t(p * C)) % uint64_t(V)]};
    while (static_cast<int>(centroid.size()) < C) {
      std::vector<uint64_t> weight(static_cast<size_t>(V));
      uint64_t total = 0;
      for (int64_t i = 0; i < V; ++i) {
        int d = K + 1;
        for (uint64_t c : centroid) d = std::min(d, distance(code[i], c));
        total += weight[i] = uint64_t(d) * uint64_t(d);
      }
      if (total == 0) break;
      uint64_t x = draw64(seed_base + uint64_t(p * C) + centroid.size()) % total;
      int64_t pick = 0;
      while (x >= weight[pick]) x -= weight[pick++];
      centroid.push_back(code[pick]);
    }
    // Lloyd rounds.
    const int active = static_cast<int>(centroid.size());
    for (int round = 0;; ++round) {
      int64_t changed = 0;
      for (int64_t i = 0; i < V; ++i) {
        int best = 0;
        for (int c = 1; c < active; ++c)
          if (distance(code[i], centroid[c]) < distance(code[i], centroid[best])) best = c;
        changed += a[i] != best;
        a[i] = best;
      }
      if (round == options.iterations || (round > 0 && changed == 0)) break;
      for (int c = 0; c < active; ++c)
        for (int k = 0; k < K; ++k) {
          int64_t members = 0, ones = 0;
          for (int64_t i = 0; i < V; ++i)
            if (a[i] == c) ++members, ones += (code[i] >> k) & 1u;
          if (2 * ones > members) centroid[c] |= uint64_t{1} << k;
          if (2 * ones < members) centroid[c] &= ~(uint64_t{1} << k);
        }
    }
    for (int64_t i = 0; i < V; ++i) ++counts[p * C + a[i]];
  }
  return out;
}

}  // namespace clustr
