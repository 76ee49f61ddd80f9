// Multi-head self-attention: project x to queries, keys and values, split the width D into H
// heads of E = D / H, run the attention kernel chosen by `config` (layers/attention/), merge the
// heads and project back. The query, key and value weights (and biases) are stacked in one
// storage, so the three projections are one GEMM against a view of them; full attention works
// on the heads where that GEMM leaves them (full_attention_qkv: no permutes), the others split
// the heads of all three with one permute (attention_stacked) (docs/ARCHITECTURE.md, "Fused
// paths of the encoder layer").
//
// Legend: B batch, N positions, D model width, H heads, E = D / H per-head width.
// Parameters (PyTorch's nn.MultiheadAttention in brackets, whose fused in_proj_weight (3D, D)
// stacks query, key and value in that order):
//   query.weight (D, D), query.bias (D)   [in_proj_weight[0:D],   in_proj_bias[0:D]]
//   key.weight,   key.bias                [in_proj_weight[D:2D],  in_proj_bias[D:2D]]
//   value.weight, value.bias              [in_proj_weight[2D:3D], in_proj_bias[2D:3D]]
//   out.weight (D, D),   out.bias (D)     [out_proj.weight, out_proj.bias]
// A layer built for shared-full or lsh attention (shares_query_key) has no key projection: its
// keys are its queries (key() is query()), for every type it then runs.
// Init: every projection is a Linear with PyTorch's nn.Linear default (uniform +-1/sqrt(D)), as
// in the paper authors' fast-transformers AttentionLayer (nn.MultiheadAttention instead uses
// xavier_uniform and zero biases for the input projection).
#pragma once

#include <cstdint>
#include <memory>

#include "autograd/variable.h"
#include "core/random.h"
#include "layers/attention/config.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/token_packing.h"

namespace clustr {

class MultiHeadAttention : public Module {
 public:
  MultiHeadAttention(int64_t dim, int64_t heads, AttentionConfig config, Generator& gen);

  // x (B, N, D), lengths i32 (B) with the valid length of each sequence (or undefined: all N
  // valid) -> (B, N, D). Keys at positions >= lengths[b] are masked, and the attention output
  // of such (padded) queries is 0 before the output projection, so their rows are out.bias.
  // gen draws attention dropout (in training) and the clustered types' random hashing.
  // With `packing` (layers/token_packing.h), x is the packed valid tokens (T, D) of a batch
  // whose lengths `packing` was built from, and so is the result (T, D): the projections run
  // on the T rows, the attention on the unpacked (B, N) layout.
  Variable forward(const Variable& x, const Tensor& lengths, Generator& gen,
                   const TokenPacking* packing = nullptr) const;

  int64_t dim() const { return dim_; }
  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return dim_ / heads_; }
  Linear& query() const { return *query_; }
  Linear& key() const { return shared_qk_ ? *query_ : *key_; }
  // Whether queries and keys share one projection (fixed when the layer is built).
  bool shared_query_key() const { return shared_qk_; }
  Linear& value() const { return *value_; }
  Linear& out() const { return *out_; }

  // Which attention the layer runs. Public so that a model trained with one type can be
  // evaluated with another (no type adds parameters); attention() validates it on each call.
  AttentionConfig config;

 private:
  int64_t dim_, heads_;
  bool shared_qk_;
  std::shared_ptr<Linear> query_, key_, value_, out_;  // key_ null when shared_qk_
};

}  // namespace clustr
