// Full softmax attention (the paper's eq. 1-2) as one fused op with a hand-written backward:
//   out = softmax(Q K^T * temperature + mask) V
// Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M) -> out (B, H, N, M).
// Masks: keys at positions >= lengths[b] (i32 (B), or undefined: none); with causal, query i
// sees keys j <= i (needs N == S). Query rows at positions >= lengths[b] when N == S (padded
// queries of self-attention) and rows that see no key produce 0.
// Memory: queries are processed in blocks with an online softmax, and backward recomputes the
// attention weights from the saved per-row log-sum-exp, so no N x S matrix is ever stored
// (N = 16384 with 6 heads runs in a few hundred MB).
// Dropout on the attention weights (training): mask from Philox blocks starting at `offset` of
// stream `seed`, regenerated in backward.
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace clustr {

struct FullAttentionOptions {
  float temperature = 0.0f;  // <= 0: 1/sqrt(E)
  bool causal = false;
  float dropout = 0.0f;      // probability of dropping an attention weight
  uint64_t seed = 0, offset = 0;  // dropout stream
};

// Tensor-level forward: out and the per-row log-sum-exp (B, H, N) that backward needs.
struct FullAttentionOutput {
  Tensor out, logsumexp;
};
FullAttentionOutput full_attention_forward(const Tensor& Q, const Tensor& K, const Tensor& V,
                                           const Tensor& lengths,
                                           const FullAttentionOptions& options);
struct FullAttentionGrads {
  Tensor dQ, dK, dV;
};
FullAttentionGrads full_attention_backward(const Tensor& dout, const Tensor& Q, const Tensor& K,
                                           const Tensor& V, const Tensor& out,
                                           const Tensor& logsumexp, const Tensor& lengths,
                                           const FullAttentionOptions& options);

// The differentiable op.
Variable full_attention(const Variable& Q, const Variable& K, const Variable& V,
                        const Tensor& lengths, const FullAttentionOptions& options);

// Counter blocks the dropout mask of one call uses (reserve them from the run's Generator).
uint64_t full_attention_dropout_blocks(const Tensor& Q, const Tensor& K);

}  // namespace clustr
