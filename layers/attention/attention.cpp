// The attention dispatcher (attention.h): AttentionConfig -> the chosen attention op.
#include "layers/attention/attention.h"

#include "core/error.h"
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
    case AttentionType::clustered:
    case AttentionType::improved_clustered:
      break;
  }
  throw Error(detail::cat("attention: ", attention_type_name(config.type),
                          " attention is not implemented yet (it comes with the clustered ",
                          "attention issue); use --attention full"));
}

}  // namespace clustr
