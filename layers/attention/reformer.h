// Reformer attention (lsh-X; Kitaev, Kaiser and Levskaya 2020), as the paper compares against it,
// and shared-QK full attention (shared-full), its exact limit. Self-attention with one shared
// projection for queries and keys: the keys are the queries scaled to unit length.
//
// Legend: B batch, H heads, N positions, E query/key dim, M value dim, X rounds, R buckets per
// round, m the chunk (sorted positions per chunk), L the valid positions of a sequence
// (lengths[b], or N).
//   Q (B, H, N, E), V (B, H, N, M) f32, lengths i32 (B) or undefined,
//   rotations (X, E, R / 2) f32 (undefined when R = 1) -> out (B, H, N, M).
// Per (b, h), with t the temperature (<= 0: 1/sqrt(E)) and k_j = q_j / |q_j| (0 when q_j = 0):
//   1. hash (each round x): h_x(j) = argmax of [k_j W_x, -k_j W_x] over its R entries (ties: the
//      lower index), W_x = rotations[x]; R = 1: every position in bucket 0;
//   2. sort the valid positions j < L by (h_x(j), j) and cut the order into chunks of m;
//   3. query i, in chunk c of round x, sees P_x(i) = the positions of chunks c and c - 1 (chunk
//      0 has no previous one), other than i itself;
//   4. the rounds are combined by their log-sum-exp weights, which is one softmax over all the
//      pairs (x, j), a key seen in several rounds counted once per round:
//        out_i = sum_x sum_{j in P_x(i)} exp(t q_i . k_j - z_i) v_j,
//        z_i = log sum_x sum_{j in P_x(i)} exp(t q_i . k_j).
//      A query with no key but itself in every round takes its own value, out_i = v_i (the
//      Reformer's rule: no attention to oneself unless there is nothing else).
//      Dropout (training): the weight of pair (x, j) for query i is kept, scaled by 1 / (1 - p),
//      or dropped, by mask element ((bh X + x) N + i) N + j of the Philox stream (seed, offset):
//      kept when uint_to_unit(philox4x32(seed, offset + idx / 4).v[idx % 4]) >= p. z_i is the
//      undropped one, so out_i = sum_x sum_j keep scale exp(t q_i . k_j - z_i) v_j.
// Shared-full is R = 1, X = 1 and m >= L: every other valid position, with no hashing.
// Padded queries (i >= L) give 0; padded positions are never keys, and since the sort leaves
// them out, the valid positions' outputs do not depend on how much padding follows.
// Backward is exact for the fixed hashes (the sort has no gradient): dQ gets both the query
// term and the keys' term through the normalisation.
// CPU: one task per (b, h) (OpenMP), sums in a fixed order, so the result is the same at any
// thread count. CUDA (cuda/reformer.h): every sum has one owner, a thread or a warp (no
// atomics), so the result is the same run after run; the rotations are drawn on the host and
// copied.
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace clustr {

struct ReformerOptions {
  int64_t rounds = 1;        // X, hashing rounds (lsh-X)
  int64_t buckets = 32;      // R per round: 1, or even
  int64_t chunk = 32;        // m
  float temperature = 0.0f;  // <= 0: 1/sqrt(E)
  float dropout = 0.0f;      // probability of dropping a weight, in [0, 1)
  uint64_t seed = 0, offset = 0;  // the mask's Philox stream and first counter block
};

// Counter blocks the dropout mask of one call uses (reserve them from the run's Generator).
uint64_t reformer_attention_dropout_blocks(int64_t B, int64_t H, int64_t N, int64_t rounds);

// What backward needs besides Q and V: each round's sorted order (B, H, X, N; entries at and
// past L unused) and each query's z (B, H, N; -inf for a query that took its own value).
struct ReformerOutput {
  Tensor out, order, logsumexp;
};
ReformerOutput reformer_attention_forward(const Tensor& Q, const Tensor& V, const Tensor& lengths,
                                          const Tensor& rotations, const ReformerOptions& options);
struct ReformerGrads {
  Tensor dQ, dV;
};
ReformerGrads reformer_attention_backward(const Tensor& dout, const Tensor& Q, const Tensor& V,
                                          const Tensor& lengths, const ReformerOutput& forward,
                                          const ReformerOptions& options);

// The differentiable op.
Variable reformer_attention(const Variable& Q, const Variable& V, const Tensor& lengths,
                            const Tensor& rotations, const ReformerOptions& options);

// The buckets of every position for each round (B, H, X, N) i32, from the same float
// arithmetic as the forward (padded positions: -1). For tests and analysis.
Tensor reformer_buckets(const Tensor& Q, const Tensor& lengths, const Tensor& rotations,
                        int64_t buckets);

}  // namespace clustr
