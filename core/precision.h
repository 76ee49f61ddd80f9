// The precision policy of matrix products (docs/ARCHITECTURE.md, "Mixed precision").
//
//   fp32  every product reads its operands as float32 (the default).
//   bf16  the products of the policy (linear layers, the fused Q/K/V projection, the
//         feed-forward block, full attention's Q K^T and P V, the clustered types' C x S
//         products, and their gradients) read their float32 operands rounded to bfloat16
//         (core/bf16.h) and accumulate in float32; their results are float32. Everything else
//         (softmax, layer norm, residual sums, losses, reductions, the optimizer and its
//         state, the master weights, the queries' hashing) stays float32.
//
// Like PyTorch's autocast, the policy is a per-thread setting that the ops read when they run
// (PrecisionScope sets it for a block); autograd records it with each node, so that a backward
// pass computes its products in the precision of the forward pass whatever the setting is when
// backward runs. A model runs with one setting (its config's precision), set for its forward.
#pragma once

#include <string>

namespace clustr {

enum class Precision { fp32, bf16 };

const char* to_string(Precision p);  // "fp32" | "bf16"
// "fp32" | "bf16" -> Precision; anything else throws clustr::Error listing the accepted names.
Precision parse_precision(const std::string& name);

// This thread's setting (fp32 unless a PrecisionScope says otherwise).
Precision current_precision();

// Sets this thread's precision for its scope and restores the previous one. Scopes nest.
class PrecisionScope {
 public:
  explicit PrecisionScope(Precision p);
  ~PrecisionScope();
  PrecisionScope(const PrecisionScope&) = delete;
  PrecisionScope& operator=(const PrecisionScope&) = delete;

 private:
  Precision previous_;
};

}  // namespace clustr
