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
#include "core/philox.h"
#include "core/precision.h"
#include "core/tensor.h"

namespace clustr {

struct FullAttentionOptions {
  float temperature = 0.0f;  // <= 0: 1/sqrt(E)
  bool causal = false;
  float dropout = 0.0f;      // probability of dropping an attention weight
  uint64_t seed = 0;   // dropout stream
  PhiloxOffset offset;  // its first counter block (read on the device when it is `at` one)
  // The precision of the products Q K^T and P V and of their gradients (core/precision.h):
  // bf16 reads Q, K, V, the weights P and the gradients rounded to bf16, with f32 sums; the
  // softmax, its log-sum-exp and the dropout stay f32. The differentiable ops use bf16 when
  // this says so or when this thread's precision does.
  Precision precision = Precision::fp32;
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

// Self-attention over the heads of a fused projection, with no permute either way:
// qkv (B, N, 3D) holds each token's query, key and value side by side ([q | k | v], each
// D = heads E wide, head h at columns [h E, (h + 1) E) of its part), as one GEMM of x with
// the stacked weights [Wq; Wk; Wv] makes them; out (B, N, D) has the heads side by side again
// (merged, as the output projection takes them). lengths and options as above (S = N). The
// same result as full_attention on the split and permuted heads; the gradient is dqkv
// (B, N, 3D) in qkv's layout.
FullAttentionOutput full_attention_qkv_forward(const Tensor& qkv, int64_t heads,
                                               const Tensor& lengths,
                                               const FullAttentionOptions& options);
Tensor full_attention_qkv_backward(const Tensor& dout, const Tensor& qkv, int64_t heads,
                                   const Tensor& out, const Tensor& logsumexp,
                                   const Tensor& lengths, const FullAttentionOptions& options);
Variable full_attention_qkv(const Variable& qkv, int64_t heads, const Tensor& lengths,
                            const FullAttentionOptions& options);

// Counter blocks the dropout mask of one call uses (reserve them from the run's Generator):
// one element per (b, h, query, key).
uint64_t full_attention_dropout_blocks(const Tensor& Q, const Tensor& K);
uint64_t full_attention_dropout_blocks(int64_t B, int64_t H, int64_t N, int64_t S);

}  // namespace clustr
