// Oracle-top attention (the paper's Table 1, last row): for each query, the k keys with the
// highest full-attention weight, their weights renormalised, every other key dropped. It needs
// the full weights to choose its keys, so it is a reference, not a fast type: "are the top keys
// enough?" for a model trained with another attention. Evaluation only.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, k the kept keys
// (topk); L the valid keys of a sequence (lengths[b], or S).
//   Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M) f32, lengths i32 (B) or undefined
//   -> out (B, H, N, M) (overwritten).
// Per (b, h) and query i, with t the temperature (<= 0: 1/sqrt(E)):
//   s_l = t q_i . k_l for the valid keys l < L; T_i = the min(k, L) largest s_l (ties: the
//   lower key index); out_i = sum_{l in T_i} softmax_{T_i}(s)_l v_l.
// With k >= L it is full attention; with k = 1 it copies the value of the highest-scoring key.
// In self-attention (N == S) padded queries (i >= L) and rows that see no key are 0.
// Scores, the softmax and the sum are in double, one task per (b, h) pair (OpenMP), so the
// result is the same at any thread count. Tensors on the CUDA device are computed on a host
// copy (an evaluation-time reference: its cost is full attention's, N x S per head).
// Throws clustr::Error when gradients are being recorded for an input that requires them: the
// choice of keys has no gradient here, and a model trained through it would learn nothing of it.
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace clustr {

Variable oracle_top_attention(const Variable& Q, const Variable& K, const Variable& V,
                              const Tensor& lengths, int64_t topk, float temperature = 0.0f);

}  // namespace clustr
