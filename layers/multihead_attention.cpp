// Multi-head self-attention (see multihead_attention.h).
#include "layers/multihead_attention.h"

#include <utility>

#include "autograd/ops.h"
#include "core/error.h"
#include "core/random.h"
#include "layers/attention/attention.h"
#include "layers/attention/full.h"

namespace clustr {

MultiHeadAttention::MultiHeadAttention(int64_t dim, int64_t heads, AttentionConfig attention_config,
                                       Generator& gen)
    : config(std::move(attention_config)),
      dim_(dim),
      heads_(heads),
      shared_qk_(shares_query_key(config.type)) {
  CLUSTR_CHECK(dim > 0 && heads > 0, "MultiHeadAttention: expected positive D and H, got D=", dim,
               " H=", heads);
  CLUSTR_CHECK(dim % heads == 0, "MultiHeadAttention: the model width D=", dim,
               " is not divisible by the number of heads H=", heads);
  config.validate();
  query_ = register_module("query", std::make_shared<Linear>(dim, dim, true, gen));
  if (!shared_qk_) key_ = register_module("key", std::make_shared<Linear>(dim, dim, true, gen));
  value_ = register_module("value", std::make_shared<Linear>(dim, dim, true, gen));
  out_ = register_module("out", std::make_shared<Linear>(dim, dim, true, gen));
  if (!shared_qk_) {
    // The three projections' weights (and biases) side by side in one storage, as PyTorch's
    // in_proj_weight: forward's concat of them is then a view (no copy, no launch), and so
    // are their gradients' parts.
    stack_rows({query_->weight(), key_->weight(), value_->weight()});
    stack_rows({query_->bias(), key_->bias(), value_->bias()});
  }
}

Variable MultiHeadAttention::forward(const Variable& x, const Tensor& lengths, Generator& gen,
                                     const TokenPacking* packing) const {
  CLUSTR_CHECK(x.defined(), "MultiHeadAttention(D=", dim_, ", H=", heads_, "): x is undefined");
  if (packing)
    CLUSTR_CHECK(x.rank() == 2 && x.size(0) == packing->tokens() && x.size(1) == dim_,
                 "MultiHeadAttention(D=", dim_, ", H=", heads_, "): expected packed x (",
                 packing->tokens(), ", ", dim_, "), got ", describe(x.data()));
  else
    CLUSTR_CHECK(x.rank() == 3 && x.size(2) == dim_, "MultiHeadAttention(D=", dim_, ", H=",
                 heads_, "): expected x (B, N, ", dim_, "), got ", describe(x.data()));
  const int64_t B = packing ? packing->batch() : x.size(0);
  const int64_t N = packing ? packing->positions() : x.size(1), H = heads_, E = dim_ / heads_;
  if (lengths.defined())
    CLUSTR_CHECK(lengths.dtype() == DType::i32 && lengths.shape() == Shape{B},
                 "MultiHeadAttention(D=", dim_, ", H=", heads_, "): expected lengths i32 ",
                 to_string(Shape{B}), " for x ", to_string(x.shape()), ", got ", describe(lengths));
  CLUSTR_CHECK(shared_qk_ || !shares_query_key(config.type), "MultiHeadAttention: ",
               attention_type_name(config.type), " attention needs a layer whose queries and keys ",
               "share one projection (a model trained with shared-full or lsh attention); this ",
               "one has a key projection of its own");
  // Projections run on x's rows as they come; the attention itself on (B, N, ...).
  auto unpacked = [&](const Variable& t) { return packing ? packing->unpack(t) : t; };
  auto packed = [&](const Variable& t) { return packing ? packing->pack(t) : t; };
  // (B, N, D) -> (B, N, H, E) -> (B, H, N, E)
  auto split_heads = [&](const Variable& t) {
    return permute(reshape(unpacked(t), {B, N, H, E}), {0, 2, 1, 3});
  };
  // (B, H, N, E) -> (B, N, H, E) -> (B, N, D)
  auto merge_heads = [&](const Variable& t) {
    return reshape(permute(t, {0, 2, 1, 3}), {B, N, dim_});
  };
  if (shared_qk_) {  // queries and keys share one projection
    const Variable Q = split_heads(query_->forward(x));
    const Variable V = split_heads(value_->forward(x));
    return out_->forward(packed(merge_heads(attention(config, Q, Q, V, lengths, gen, training()))));
  }
  // One GEMM makes the three projections, [q | k | v] side by side in each token's row
  // (B, N, 3D), against the stacked weights (a view: see the constructor).
  const Variable w = concat({query_->weight(), key().weight(), value_->weight()}, 0);
  const Variable b = concat({query_->bias(), key().bias(), value_->bias()}, 0);
  const Variable qkv = unpacked(linear(x, w, b));
  if (config.type == AttentionType::full) {
    // The attention reads its heads in that layout and writes (B, N, D) with the heads merged:
    // no permute either way.
    config.validate();
    FullAttentionOptions options;  // as attention() sets them for the split heads
    options.causal = config.causal;
    if (training() && config.dropout > 0.0f) {
      options.dropout = config.dropout;
      options.seed = gen.seed();
      options.offset = reserve_device(gen, full_attention_dropout_blocks(B, H, N, N));
    }
    return out_->forward(packed(full_attention_qkv(qkv, H, lengths, options)));
  }
  // The other types: (B, N, 3, H, E) -> (3, B, H, N, E), the heads split by one permute (and
  // their gradient stacked the same way).
  const Variable heads = permute(reshape(qkv, {B, N, 3, H, E}), {2, 0, 3, 1, 4});
  return out_->forward(
      packed(merge_heads(attention_stacked(config, heads, lengths, gen, training()))));
}

}  // namespace clustr
