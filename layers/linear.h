// The linear layer, the activations and the position-wise feed-forward block built on them.
//
// Legend: D model width, F feed-forward width.
// Initialisation follows PyTorch's defaults (named at each layer), drawn from the run's
// Generator, so a model is reproducible from its seed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "autograd/variable.h"
#include "core/random.h"
#include "layers/dropout.h"
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

}  // namespace clustr
