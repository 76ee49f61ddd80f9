// The attention dispatcher (attention.h): AttentionConfig -> the chosen attention op.
#include "layers/attention/attention.h"

#include "core/error.h"
#include "layers/attention/clustered.h"
#include "layers/attention/clustering.h"
#include "layers/attention/full.h"

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
    case AttentionType::clustered: {
      // The dropout mask would fall on the C x S centroid weights, shared by a whole cluster;
      // nothing defines that yet, so refuse rather than silently train without dropout.
      CLUSTR_CHECK(!(training && config.dropout > 0.0f), "attention: dropout on the attention ",
                   "weights (", config.dropout, ") is not implemented for clustered attention; ",
                   "use dropout 0 with --attention clustered, or --attention full");
      const Tensor& q = Q.data();
      // lengths mark padded queries only in self-attention (N == S), see attention.h.
      const bool self = q.rank() == 4 && K.data().rank() == 4 && q.size(2) == K.data().size(2);
      // sec. 3.2.2: hash + Hamming K-means, then eq. 3-6 for that clustering.
      const Clustering c =
          cluster_queries(q, self ? lengths : Tensor(),
                          ClusteringOptions{config.clusters, config.bits, config.iterations}, gen);
      return clustered_attention(Q, K, V, lengths, c.assignment, config.clusters, temperature);
    }
    case AttentionType::improved_clustered:
      break;
  }
  throw Error(detail::cat("attention: ", attention_type_name(config.type),
                          " attention is not implemented yet (it comes with the improved ",
                          "clustered attention issue); use --attention full or clustered"));
}

}  // namespace clustr
