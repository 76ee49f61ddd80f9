// The transformer encoder layer and stack (see encoder.h).
#include "layers/encoder.h"

#include "autograd/ops.h"
#include "core/error.h"

namespace clustr {

EncoderLayer::EncoderLayer(int64_t dim, int64_t heads, int64_t hidden,
                           const AttentionConfig& attention, float dropout, Activation activation,
                           bool pre_norm, Generator& gen, float norm_eps)
    : pre_norm_(pre_norm) {
  attention_ = register_module("attention",
                               std::make_shared<MultiHeadAttention>(dim, heads, attention, gen));
  feedforward_ = register_module(
      "feedforward", std::make_shared<FeedForward>(dim, hidden, activation, dropout, gen));
  norm1_ = register_module("norm1", std::make_shared<LayerNorm>(dim, norm_eps));
  norm2_ = register_module("norm2", std::make_shared<LayerNorm>(dim, norm_eps));
  dropout1_ = register_module("dropout1", std::make_shared<Dropout>(dropout));
  dropout2_ = register_module("dropout2", std::make_shared<Dropout>(dropout));
}

Variable EncoderLayer::forward(const Variable& x, const Tensor& lengths, Generator& gen,
                              const TokenPacking* packing) const {
  const int64_t D = attention_->dim();
  if (packing)
    CLUSTR_CHECK(x.defined() && x.rank() == 2 && x.size(0) == packing->tokens() &&
                     x.size(1) == D,
                 "EncoderLayer(D=", D, ", H=", attention_->heads(), "): expected packed x (",
                 packing->tokens(), ", ", D, "), got ",
                 x.defined() ? describe(x.data()) : std::string("an undefined Variable"));
  else
    CLUSTR_CHECK(x.defined() && x.rank() == 3 && x.size(2) == D, "EncoderLayer(D=", D,
                 ", H=", attention_->heads(), "): expected x (B, N, ", D, "), got ",
                 x.defined() ? describe(x.data()) : std::string("an undefined Variable"));
  // All shapes stay those of x: (B, N, D), or (T, D) packed.
  auto attend = [&](const Variable& t) { return attention_->forward(t, lengths, gen, packing); };
  if (pre_norm_) {
    Variable h = x + dropout1_->forward(attend(norm1_->forward(x)), gen);
    return h + dropout2_->forward(feedforward_->forward(norm2_->forward(h), gen), gen);
  }
  // norm(a, b) is norm(a + b) in one fused op.
  Variable h = norm1_->forward(x, dropout1_->forward(attend(x), gen));
  return norm2_->forward(h, dropout2_->forward(feedforward_->forward(h, gen), gen));
}

Encoder::Encoder(int64_t num_layers, int64_t dim, int64_t heads, int64_t hidden,
                 const AttentionConfig& attention, float dropout, Activation activation,
                 bool pre_norm, Generator& gen, float norm_eps) {
  CLUSTR_CHECK(num_layers > 0, "Encoder: expected at least one layer, got ", num_layers);
  layers_ = register_module("layers", std::make_shared<ModuleList<EncoderLayer>>());
  for (int64_t i = 0; i < num_layers; ++i)
    layers_->push_back(std::make_shared<EncoderLayer>(dim, heads, hidden, attention, dropout,
                                                      activation, pre_norm, gen, norm_eps));
  if (pre_norm) norm_ = register_module("norm", std::make_shared<LayerNorm>(dim, norm_eps));
}

Variable Encoder::forward(const Variable& x, const Tensor& lengths, Generator& gen,
                         const TokenPacking* packing) const {
  Variable h = x;
  for (const auto& layer : *layers_) h = layer->forward(h, lengths, gen, packing);
  return norm_ ? norm_->forward(h) : h;
}

void Encoder::set_attention(const AttentionConfig& attention) {
  attention.validate();
  CLUSTR_CHECK(!shares_query_key(attention.type) || layers_->size() == 0 ||
                   layer(0).attention().shared_query_key(),
               "Encoder: ", attention_type_name(attention.type), " attention needs a model whose ",
               "queries and keys share one projection (trained with shared-full or lsh ",
               "attention); this one was trained with separate query and key projections");
  for (const auto& layer : *layers_) layer->attention().config = attention;
}

}  // namespace clustr
