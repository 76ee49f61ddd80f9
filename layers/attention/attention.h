// The attention kernel of a multi-head attention layer, chosen by AttentionConfig, and the dense
// weights each type applies (attention_matrix, for analysis).
//
// Shapes: Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M) -> (B, H, N, M).
// lengths: i32 (B) with the number of valid keys of each sequence (keys at positions >=
// lengths[b] are masked), or an undefined tensor when every position is valid. In
// self-attention (N == S) the same lengths mark the padded queries, whose output rows are 0.
// temperature: the softmax scale, 1/sqrt(E) by default when <= 0.
// gen: draws attention-dropout masks (and, for the clustered types, hyperplanes and initial
// centroids); training switches dropout on.
#pragma once

#include "autograd/variable.h"
#include "core/random.h"
#include "core/tensor.h"
#include "layers/attention/config.h"

namespace clustr {

Variable attention(const AttentionConfig& config, const Variable& Q, const Variable& K,
                   const Variable& V, const Tensor& lengths, Generator& gen, bool training,
                   float temperature = 0.0f);

// Self-attention on queries, keys and values stacked as QKV (3, B, H, N, E) (one projection
// of the tokens, its heads split once): the same result as attention() on the three slices.
// The clustered types take QKV whole, so its gradient is one tensor written by their backward;
// the others get the three slices as separate inputs.
Variable attention_stacked(const AttentionConfig& config, const Variable& QKV,
                           const Tensor& lengths, Generator& gen, bool training,
                           float temperature = 0.0f);

// Analysis (small N only): the dense attention weights (B, H, N, S) that `type` applies, so that
// out = weights V. full: softmax(t Q K^T + mask), rows of padded queries (N == S, i >=
// lengths[b]) 0, assignment, clusters and topk unused; clustered: row i is Ac_{j(i)} (eq. 3-6);
// improved_clustered: A_i of eq. 11; oracle_top: full's row with its topk largest weights kept
// and renormalised. Rows of queries with assignment -1 are 0 for the clustered types.
Tensor attention_matrix(AttentionType type, const Tensor& Q, const Tensor& K,
                        const Tensor& lengths, const Tensor& assignment, int64_t clusters,
                        int64_t topk, float temperature = 0.0f);

// The same for the shared-QK types (config.type shared_full or lsh; the keys are Q scaled to
// unit length): the weights (B, H, N, N) that attention(config, Q, Q, V, ...) applies, summed
// over the rounds, with the rotations drawn from gen as that call draws them (the same gen
// state gives the same buckets). A query with no key but itself has weight 1 on itself; rows
// of padded queries are 0. Computed as attention() of an identity V (N x N per (b, h)).
Tensor shared_attention_matrix(const AttentionConfig& config, const Tensor& Q,
                               const Tensor& lengths, Generator& gen, float temperature = 0.0f);

}  // namespace clustr
