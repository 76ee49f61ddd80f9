// The layer norm module (its kernels: core/cpu/layer_norm.h, core/cuda/layer_norm.cu).
//
// Legend: D the normalised width.
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "layers/module.h"

namespace clustr {

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

}  // namespace clustr
