// The basic layers: Linear, LayerNorm, Embedding, Dropout, the sinusoidal positional encoding,
// the position-wise feed-forward block, and ModuleList (numbered submodules, "layers.0", ...).
//
// Legend: B batch, N positions, D model width, F feed-forward width, V vocabulary.
// Initialisation follows PyTorch's defaults (named at each layer), drawn from the run's
// Generator, so a model is reproducible from its seed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "core/random.h"
#include "layers/module.h"

namespace clustr {

// y = x W^T + b. weight (out, in), bias (out) when `bias`.
// Init (torch.nn.Linear): weight and bias uniform(-1/sqrt(in), 1/sqrt(in)); for the weight this
// is kaiming_uniform_(a = sqrt(5)), whose bound gain * sqrt(3 / in) with gain sqrt(2 / (1 + 5))
// reduces to 1/sqrt(in).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias, Generator& gen);

  // x (..., in) -> (..., out).
  Variable forward(const Variable& x) const;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  const Variable& weight() const { return weight_; }
  const Variable& bias() const { return bias_; }  // undefined when the layer has none

 private:
  int64_t in_, out_;
  Variable weight_, bias_;
};

// y = (x - mean) / sqrt(var + eps) * gamma + beta over the last axis (biased variance, as
// torch.nn.LayerNorm). Parameters "weight" (gamma, init 1) and "bias" (beta, init 0), (D).
class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);

  // x (..., D) -> (..., D).
  Variable forward(const Variable& x) const;
  // The norm of the residual sum a + b, a and b (..., D) -> (..., D), as one fused op that
  // never stores the sum.
  Variable forward(const Variable& a, const Variable& b) const;

  int64_t dim() const { return dim_; }
  float eps() const { return eps_; }
  const Variable& weight() const { return weight_; }
  const Variable& bias() const { return bias_; }

 private:
  int64_t dim_;
  float eps_;
  Variable weight_, bias_;
};

// A lookup table "weight" (V, D), init normal(0, 1) (torch.nn.Embedding).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, Generator& gen);

  // index i32 of any shape, values in [0, V) -> (index.shape..., D).
  Variable forward(const Tensor& index) const;

  int64_t num_embeddings() const { return num_; }
  int64_t dim() const { return dim_; }
  const Variable& weight() const { return weight_; }

 private:
  int64_t num_, dim_;
  Variable weight_;
};

// Inverted dropout with probability p while training (x itself in evaluation); the mask comes
// from the Generator passed to forward. No parameters.
class Dropout : public Module {
 public:
  explicit Dropout(float p);

  // x (any shape) -> the same shape.
  Variable forward(const Variable& x, Generator& gen) const;

  float p() const { return p_; }

 private:
  float p_;
};

// The fixed table of "Attention is all you need" (sec. 3.5), (N, D) f32 on `device`:
//   PE[pos, 2i] = sin(pos / 10000^(2i/D)),  PE[pos, 2i+1] = cos(pos / 10000^(2i/D)).
// Computed in double and rounded once. D may be odd (the last column is then a sine).
Tensor sinusoidal_positional_encoding(int64_t positions, int64_t dim, Device device = Device::cpu);

// Adds the sinusoidal table to a batch of sequences: x (B, N, D) -> x + PE[:N] (broadcast over
// B). No parameters; the table is computed for each call's N (its cost, N x D sines, is small
// next to the layer that follows), so any length works.
class PositionalEncoding : public Module {
 public:
  explicit PositionalEncoding(int64_t dim);

  // x (B, N, D) -> (B, N, D).
  Variable forward(const Variable& x) const;

  int64_t dim() const { return dim_; }

 private:
  int64_t dim_;
};

enum class Activation { relu, gelu };
// "relu" | "gelu" <-> Activation; parsing throws on anything else, listing the accepted names.
Activation parse_activation(const std::string& name);
const char* activation_name(Activation activation);
Variable apply_activation(Activation activation, const Variable& x);

// The position-wise feed-forward block: linear1 (D -> F), activation, dropout, linear2 (F -> D).
// Submodules "linear1", "linear2" (PyTorch's TransformerEncoderLayer names them the same).
class FeedForward : public Module {
 public:
  FeedForward(int64_t dim, int64_t hidden, Activation activation, float dropout, Generator& gen);

  // x (..., D) -> (..., D).
  Variable forward(const Variable& x, Generator& gen) const;

  Activation activation() const { return activation_; }
  Linear& linear1() const { return *linear1_; }
  Linear& linear2() const { return *linear2_; }

 private:
  Activation activation_;
  std::shared_ptr<Linear> linear1_, linear2_;
  std::shared_ptr<Dropout> dropout_;
};

// Numbered submodules of one type, registered as "0", "1", ...; a parent registers the list
// itself (e.g. as "layers"), which gives PyTorch's nn.ModuleList names "layers.0.<...>".
template <typename M>
class ModuleList : public Module {
 public:
  void push_back(std::shared_ptr<M> module) {
    items_.push_back(register_module(std::to_string(items_.size()), std::move(module)));
  }
  size_t size() const { return items_.size(); }
  M& operator[](size_t i) const { return *items_.at(i); }
  typename std::vector<std::shared_ptr<M>>::const_iterator begin() const { return items_.begin(); }
  typename std::vector<std::shared_ptr<M>>::const_iterator end() const { return items_.end(); }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

}  // namespace clustr
