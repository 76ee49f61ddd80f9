// The attention kernel of a multi-head attention layer, chosen by AttentionConfig.
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
#include "layers/attention/config.h"

namespace clustr {

Variable attention(const AttentionConfig& config, const Variable& Q, const Variable& K,
                   const Variable& V, const Tensor& lengths, Generator& gen, bool training,
                   float temperature = 0.0f);

}  // namespace clustr
