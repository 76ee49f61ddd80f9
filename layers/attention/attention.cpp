// The attention dispatcher (attention.h): AttentionConfig -> the chosen attention op.
#include "layers/attention/attention.h"

#include "core/error.h"
#include "layers/attention/clustered.h"
#include "layers/attention/clustering.h"
#include "layers/attention/full.h"
#include "layers/attention/improved_clustered.h"

namespace clustr {

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
        options.offset = gen.reserve(full_attention_dropout_blocks(Q.data(), K.data()));
      }
      return full_attention(Q, K, V, lengths, options);
    }
    case AttentionType::clustered:
    case AttentionType::improved_clustered: {
      const bool improved = config.type == AttentionType::improved_clustered;
      const Tensor& q = Q.data();
      // lengths mark padded queries only in self-attention (N == S), see attention.h.
      const bool self = q.rank() == 4 && K.data().rank() == 4 && q.size(2) == K.data().size(2);
      // sec. 3.2.2: hash + Hamming K-means, then eq. 3-6 (clustered) or eq. 9-11 (improved)
      // for that clustering.
      const Clustering c =
          cluster_queries(q, self ? lengths : Tensor(),
                          ClusteringOptions{config.clusters, config.bits, config.iterations}, gen);
      // Dropout on the attention weights, as clustered.h and improved_clustered.h define it;
      // its counter blocks come after the clustering's.
      ClusteredDropout dropout;
      if (training && config.dropout > 0.0f) {
        dropout.p = config.dropout;
        dropout.seed = gen.seed();
        dropout.offset = gen.reserve(
            improved ? improved_clustered_attention_dropout_blocks(q, K.data(), config.clusters,
                                                                   config.topk)
                     : clustered_attention_dropout_blocks(q, K.data(), config.clusters));
      }
      if (improved)
        return improved_clustered_attention(Q, K, V, lengths, c.assignment, config.clusters,
                                            config.topk, temperature, dropout);
      return clustered_attention(Q, K, V, lengths, c.assignment, config.clusters, temperature,
                                 dropout);
    }
  }
  throw Error(detail::cat("attention: unknown AttentionType value ",
                          static_cast<int>(config.type)));
}

}  // namespace clustr
