// The transformer encoder: EncoderLayer (self-attention + feed-forward, each in a residual
// branch with layer normalisation) and Encoder, a stack of them.
//
// Legend: B batch, N positions, D model width, H heads, F feed-forward width.
//
// Parameter names of one layer, and PyTorch's nn.TransformerEncoderLayer names they map to:
//   attention.query.weight/bias   self_attn.in_proj_weight/bias, rows [0, D)
//   attention.key.weight/bias     self_attn.in_proj_weight/bias, rows [D, 2D)
//   attention.value.weight/bias   self_attn.in_proj_weight/bias, rows [2D, 3D)
//   attention.out.weight/bias     self_attn.out_proj.weight/bias
//   feedforward.linear1.weight/bias, feedforward.linear2.weight/bias   linear1.*, linear2.*
//   norm1.weight/bias, norm2.weight/bias                              norm1.*, norm2.*
// (tests/fixtures/make_encoder_fixture.py writes PyTorch's weights under these names.)
#pragma once

#include <cstdint>
#include <memory>

#include "autograd/variable.h"
#include "core/random.h"
#include "layers/attention/config.h"
#include "layers/dropout.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/multihead_attention.h"

namespace clustr {

class EncoderLayer : public Module {
 public:
  // dropout: on each residual branch and inside the feed-forward block (the attention weights'
  // dropout is attention.dropout). pre_norm selects the layer's form:
  //   post-norm (default, the paper's and PyTorch's):  x = norm1(x + drop(attn(x)))
  //                                                    x = norm2(x + drop(ff(x)))
  //   pre-norm (PyTorch's norm_first=True):            x = x + drop(attn(norm1(x)))
  //                                                    x = x + drop(ff(norm2(x)))
  // norm_eps: the layer norms' epsilon (PyTorch's default 1e-5; BERT checkpoints use 1e-12).
  EncoderLayer(int64_t dim, int64_t heads, int64_t hidden, const AttentionConfig& attention,
               float dropout, Activation activation, bool pre_norm, Generator& gen,
               float norm_eps = 1e-5f);

  // x (B, N, D), lengths i32 (B) or undefined (all valid) -> (B, N, D). Outputs at padded
  // positions (>= lengths[b]) are finite but meaningless: only the attention masks them.
  // With `packing` (built from the same lengths), x and the result are the packed valid
  // tokens (T, D) instead, and no padded row is computed (layers/token_packing.h).
  Variable forward(const Variable& x, const Tensor& lengths, Generator& gen,
                   const TokenPacking* packing = nullptr) const;

  bool pre_norm() const { return pre_norm_; }
  MultiHeadAttention& attention() const { return *attention_; }
  FeedForward& feedforward() const { return *feedforward_; }
  LayerNorm& norm1() const { return *norm1_; }
  LayerNorm& norm2() const { return *norm2_; }

 private:
  bool pre_norm_;
  std::shared_ptr<MultiHeadAttention> attention_;
  std::shared_ptr<FeedForward> feedforward_;
  std::shared_ptr<LayerNorm> norm1_, norm2_;
  std::shared_ptr<Dropout> dropout1_, dropout2_;
};

// num_layers encoder layers, registered as "layers.0", "layers.1", ... A pre-norm stack ends with a
// LayerNorm "norm" (as PyTorch's nn.TransformerEncoder with a final norm), since its residual
// stream is never normalised otherwise; a post-norm stack has none.
class Encoder : public Module {
 public:
  Encoder(int64_t num_layers, int64_t dim, int64_t heads, int64_t hidden,
          const AttentionConfig& attention, float dropout, Activation activation, bool pre_norm,
          Generator& gen, float norm_eps = 1e-5f);

  // x (B, N, D), lengths i32 (B) or undefined -> (B, N, D); with `packing`, (T, D) -> (T, D)
  // as EncoderLayer's.
  Variable forward(const Variable& x, const Tensor& lengths, Generator& gen,
                   const TokenPacking* packing = nullptr) const;

  size_t num_layers() const { return layers_->size(); }
  EncoderLayer& layer(size_t i) const { return (*layers_)[i]; }
  // Sets the attention of every layer (train with one type, evaluate with another).
  void set_attention(const AttentionConfig& attention);

 private:
  std::shared_ptr<ModuleList<EncoderLayer>> layers_;
  std::shared_ptr<LayerNorm> norm_;  // pre-norm only
};

}  // namespace clustr
