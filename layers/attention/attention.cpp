// The attention dispatcher (attention.h): AttentionConfig -> the chosen attention op.
#include "layers/attention/attention.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "autograd/ops.h"
#include "core/error.h"
#include "core/ops_check.h"
#include "core/random.h"
#include "layers/attention/clustered.h"
#include "layers/attention/clustered_common.h"
#include "layers/attention/clustering.h"
#include "layers/attention/full.h"
#include "layers/attention/improved_clustered.h"
#include "layers/attention/oracle_top.h"
#include "layers/attention/reformer.h"

namespace clustr {

namespace {

// The clustered types (sec. 3.2.2): hash + Hamming K-means of the queries q, then
// run(assignment, dropout) for eq. 3-6 (clustered) or eq. 9-11 (improved) on that clustering.
// The dropout's counter blocks come after the clustering's.
template <class Run>
Variable clustered_types(const AttentionConfig& config, const Tensor& q, const Tensor& k,
                         const Tensor& query_lengths, Generator& gen, bool training, Run run) {
  const bool improved = config.type == AttentionType::improved_clustered;
  const Clustering c = cluster_queries(
      q, query_lengths, ClusteringOptions{config.clusters, config.bits, config.iterations}, gen);
  ClusteredDropout dropout;
  if (training && config.dropout > 0.0f) {
    dropout.p = config.dropout;
    dropout.seed = gen.seed();
    dropout.offset = reserve_device(
        gen, improved ? improved_clustered_attention_dropout_blocks(q, k, config.clusters,
                                                                    config.topk)
                      : clustered_attention_dropout_blocks(q, k, config.clusters));
  }
  return run(c.assignment, dropout);
}

}  // namespace

Variable attention(const AttentionConfig& config, const Variable& Q, const Variable& K,
                   const Variable& V, const Tensor& lengths, Generator& gen, bool training,
                   float temperature) {
  config.validate();
  switch (config.type) {
    case AttentionType::full: {
      FullAttentionOptions options;
      options.temperature = temperature;
      options.causal = config.causal;
      if (training && config.dropout > 0.0f) {
        options.dropout = config.dropout;
        options.seed = gen.seed();
        options.offset = reserve_device(gen, full_attention_dropout_blocks(Q.data(), K.data()));
      }
      return full_attention(Q, K, V, lengths, options);
    }
    case AttentionType::clustered:
    case AttentionType::improved_clustered: {
      const Tensor& q = Q.data();
      // lengths mark padded queries only in self-attention (N == S), see attention.h.
      const bool self = q.rank() == 4 && K.data().rank() == 4 && q.size(2) == K.data().size(2);
      return clustered_types(config, q, K.data(), self ? lengths : Tensor(), gen, training,
                             [&](const Tensor& assignment, const ClusteredDropout& dropout) {
                               if (config.type == AttentionType::improved_clustered)
                                 return improved_clustered_attention(
                                     Q, K, V, lengths, assignment, config.clusters, config.topk,
                                     temperature, dropout);
                               return clustered_attention(Q, K, V, lengths, assignment,
                                                          config.clusters, temperature, dropout);
                             });
    }
    case AttentionType::oracle_top:
      CLUSTR_CHECK(!training, "attention: oracle-top attention is for evaluation only (it ",
                   "chooses each query's keys from full attention's weights); train with full, ",
                   "clustered or improved-clustered attention");
      return oracle_top_attention(Q, K, V, lengths, config.topk, temperature);
    case AttentionType::shared_full:
    case AttentionType::lsh: {
      CLUSTR_CHECK(K.impl() == Q.impl(), "attention: ", attention_type_name(config.type),
                   " attention uses one projection for queries and keys (its keys are the ",
                   "queries scaled to unit length); pass the queries as K");
      const Tensor& q = Q.data();
      CLUSTR_CHECK(q.rank() == 4, "attention: expected Q (B, H, N, E), got ", describe(q));
      ReformerOptions options;
      options.temperature = temperature;
      Tensor rotations;
      if (config.type == AttentionType::shared_full) {  // one chunk of every position
        options.buckets = 1;
        options.chunk = std::max<int64_t>(q.size(2), 1);
      } else {
        options.rounds = config.rounds;
        options.buckets = config.buckets;
        options.chunk = config.chunk;
        // The rotations: one (E, buckets / 2) Gaussian matrix per round, shared by the batch
        // and the heads, drawn from the run's stream like the clustering's planes.
        rotations = Tensor::empty({options.rounds, q.size(3), options.buckets / 2});
        normal_(rotations, gen);
      }
      if (training && config.dropout > 0.0f) {
        options.dropout = config.dropout;
        options.seed = gen.seed();
        options.offset = gen.reserve(reformer_attention_dropout_blocks(
            q.size(0), q.size(1), q.size(2), options.rounds));
      }
      return reformer_attention(Q, V, lengths, rotations, options);
    }
  }
  throw Error(detail::cat("attention: unknown AttentionType value ",
                          static_cast<int>(config.type)));
}

Variable attention_stacked(const AttentionConfig& config, const Variable& QKV,
                           const Tensor& lengths, Generator& gen, bool training,
                           float temperature) {
  config.validate();
  const clustered_detail::Stacked parts =
      clustered_detail::unstack("attention_stacked", QKV.data());
  if (config.type != AttentionType::clustered &&
      config.type != AttentionType::improved_clustered) {  // the three slices as separate inputs
    auto part = [&](int64_t i) { return reshape(slice(QKV, 0, i, 1), parts.q.shape()); };
    const Variable Q = part(0);
    return attention(config, Q, shares_query_key(config.type) ? Q : part(1), part(2), lengths,
                     gen, training, temperature);
  }
  return clustered_types(config, parts.q, parts.k, lengths, gen, training,
                         [&](const Tensor& assignment, const ClusteredDropout& dropout) {
                           if (config.type == AttentionType::improved_clustered)
                             return improved_clustered_attention(QKV, lengths, assignment,
                                                                 config.clusters, config.topk,
                                                                 temperature, dropout);
                           return clustered_attention(QKV, lengths, assignment, config.clusters,
                                                      temperature, dropout);
                         });
}

namespace {

// Oracle-top on a dense row of n weights: all but the k largest (ties: the lower index) set to
// 0, the kept ones renormalised.
void keep_top(float* row, int64_t n, int64_t k) {
  if (k >= n) return;
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  });
  std::vector<float> kept(static_cast<size_t>(n), 0.0f);
  double sum = 0.0;
  for (int64_t c = 0; c < k; ++c) sum += row[order[c]];
  for (int64_t c = 0; c < k; ++c)
    kept[static_cast<size_t>(order[c])] = static_cast<float>(row[order[c]] / sum);
  std::copy(kept.begin(), kept.end(), row);
}

}  // namespace

Tensor attention_matrix(AttentionType type, const Tensor& Q, const Tensor& K,
                        const Tensor& lengths, const Tensor& assignment, int64_t clusters,
                        int64_t topk, float temperature) {
  using namespace clustered_detail;
  const char* op = "attention_matrix";
  CLUSTR_CHECK(!shares_query_key(type), op, ": ", attention_type_name(type), " attention's "
               "weights depend on its settings and random rotations: use "
               "shared_attention_matrix");
  check_f32(op, "Q", Q);
  detail::check_same_device(op, Q, K);
  detail::require_cpu(op, Q);  // an analysis on host memory
  CLUSTR_CHECK(K.rank() == 4, op, ": expected K of shape (B, H, S, E), got ", describe(K));
  const int64_t B = Q.size(0), H = Q.size(1), N = Q.size(2), S = K.size(2);
  const Tensor V = Tensor::zeros({B, H, S, 1}, DType::f32, Q.device());
  // Oracle-top's rows are full attention's rows with all but their top k weights dropped.
  const bool oracle = type == AttentionType::oracle_top;
  const bool full = type == AttentionType::full || oracle;
  // The full type uses a one-cluster stand-in only for the checks and the temperature.
  const Tensor a = full ? Tensor::zeros({B, H, N}, DType::i32, Q.device()) : assignment;
  const ImprovedClusteredAttentionOutput f = improved_clustered_attention_forward(
      Q, K, V, lengths, a, full ? 1 : clusters, full ? S + 1 : topk, temperature);
  const int64_t E = Q.size(3), C = f.counts.size(2), kw = f.topk.size(3);
  const Params p =
      params_of(Dims{B, H, N, S, E, 1, C}, lengths, a, temperature, Precision::fp32);
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
        if (oracle) keep_top(out, kk, topk);
        continue;
      }
      std::copy(acj, acj + S, out);  // eq. 11: Ac_j off T, m_j softmax_T on T
      for (int64_t c = 0; c < kk; ++c) out[T[c]] = mass[bh * C + j] * row[c];
    }
  }
  return A;
}

Tensor shared_attention_matrix(const AttentionConfig& config, const Tensor& Q,
                               const Tensor& lengths, Generator& gen, float temperature) {
  const char* op = "shared_attention_matrix";
  CLUSTR_CHECK(shares_query_key(config.type), op, ": expected shared-full or lsh attention, got ",
               attention_type_name(config.type));
  detail::check_f32(op, "Q", Q);
  CLUSTR_CHECK(Q.rank() == 4, op, ": expected Q of shape (B, H, N, E), got ", describe(Q));
  const int64_t B = Q.size(0), H = Q.size(1), N = Q.size(2);
  // out = W V for every V: with V the identity, out is W.
  Tensor eye = Tensor::zeros({B, H, N, N});
  float* e = eye.f32();
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < N; ++i) e[(bh * N + i) * N + i] = 1.0f;
  NoGradGuard no_grad;
  const Variable q(Q);
  return attention(config, q, q, Variable(eye.to(Q.device())), lengths, gen, false, temperature)
      .data();
}

}  // namespace clustr
