// Clustered attention (the paper's sec. 3.2, eq. 3-6) for a given clustering of the queries,
// as one fused op with a hand-written backward. cluster_queries (clustering.h) makes the
// clustering; attention() (attention.h) chains the two.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters.
//   Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M), lengths i32 (B) or undefined,
//   assignment i32 (B, H, N) with values in [-1, C): the cluster of each query, -1 for a padded
//   query (no cluster) -> out (B, H, N, M).
// Per (b, h), with t the temperature (<= 0: 1/sqrt(E)) and keys j >= lengths[b] masked:
//   Qc_j = mean of the queries assigned to cluster j                     (eq. 4-5, centroids)
//   Ac   = softmax(t Qc K^T + mask)   (C x S)                            (eq. 3)
//   Vc   = Ac V                       (C x M)
//   out_i = Vc_{j(i)}                                                    (eq. 6)
// Padded queries (assignment -1), empty clusters and clusters that see no key (lengths[b] = 0)
// give zero rows.
// Backward treats the assignment as fixed (it is piecewise constant in Q, so this is the true
// gradient almost everywhere): the gradient reaches each query through its centroid's mean.
// Memory: Ac (B, H, C, S) is saved for backward; it is C / N the size of full attention's
// weights, so there is no recomputation.
//
// Attention dropout (training): a mask on the C x S centroid weights, shared by a cluster's
// members, Vc = (Ac * D / (1 - p)) V; element (b, h, j, l) of D is element ((b H + h) C + j) S + l
// of the mask stream (seed, offset), clustered_attention_dropout_blocks the counter blocks one
// call uses; backward draws it again.
// Precision (core/precision.h): under bf16 the C x S products (Qc K^T, Ac V and their
// gradients) read their operands rounded to bf16 and sum in f32; the rest stays f32. The
// tensor-level forward takes it as an argument and saves it for backward; the differentiable
// op uses this thread's setting.
// Deterministic at any thread count (ARCHITECTURE, "Threads and determinism"; the parallel
// plan: clustered_common.h). On the CUDA device (all tensors there) the same op runs as kernels
// (cuda/clustered.h). Details: ARCHITECTURE, "Clustered attention".
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "core/philox.h"
#include "core/precision.h"
#include "core/tensor.h"

namespace clustr {

// Attention dropout of the clustered types (off when p == 0).
struct ClusteredDropout {
  float p = 0.0f;                 // probability of dropping a weight, in [0, 1)
  uint64_t seed = 0;   // the mask's Philox stream
  PhiloxOffset offset;  // and its first counter block (read on the device when it is `at` one)
};

// Tensor-level forward: out and what backward needs.
struct ClusteredAttentionOutput {
  Tensor out;        // (B, H, N, M)
  Tensor weights;    // Ac (B, H, C, S) before dropout: 0 on masked keys and for empty clusters
  Tensor centroids;  // Qc (B, H, C, E): 0 for empty clusters
  Tensor counts;     // i32 (B, H, C): members of each cluster
  // On the CUDA device, the members grouped by cluster (i32 (B H (C + 1)) starts, (B H N)
  // query order), which backward reuses instead of grouping again; undefined on the cpu.
  Tensor start, order;
  ClusteredDropout dropout;  // the forward's, so that backward draws the same mask
  Precision precision = Precision::fp32;  // the forward's products', which backward's follow
};
ClusteredAttentionOutput clustered_attention_forward(const Tensor& Q, const Tensor& K,
                                                     const Tensor& V, const Tensor& lengths,
                                                     const Tensor& assignment, int64_t clusters,
                                                     float temperature = 0.0f,
                                                     const ClusteredDropout& dropout = {},
                                                     Precision precision = Precision::fp32);

struct ClusteredAttentionGrads {
  Tensor dQ, dK, dV;  // the shapes of Q, K, V (overwritten, never accumulated)
};
// The gradients of sum(dout * out) for the fixed assignment (and the forward's dropout mask),
// given the forward's outputs.
// Q's shape is (B, H, N, E) from assignment and K; Q itself enters only through the centroids.
// `into`: where to write them (each defined one must have its gradient's shape, on K's device;
// undefined ones are allocated).
ClusteredAttentionGrads clustered_attention_backward(const Tensor& dout, const Tensor& K,
                                                     const Tensor& V, const Tensor& lengths,
                                                     const Tensor& assignment,
                                                     const ClusteredAttentionOutput& forward,
                                                     float temperature = 0.0f,
                                                     const ClusteredAttentionGrads& into = {});

// The differentiable op (gradients for Q, K and V; the assignment is a constant), its
// products in this thread's precision.
Variable clustered_attention(const Variable& Q, const Variable& K, const Variable& V,
                             const Tensor& lengths, const Tensor& assignment, int64_t clusters,
                             float temperature = 0.0f, const ClusteredDropout& dropout = {});

// The same op on queries, keys and values stacked as QKV (3, B, H, N, E) (self-attention, as
// one projection of the tokens makes them): one gradient for QKV, whose three slices backward
// writes as dQ, dK and dV (no copy either way).
Variable clustered_attention(const Variable& QKV, const Tensor& lengths, const Tensor& assignment,
                             int64_t clusters, float temperature = 0.0f,
                             const ClusteredDropout& dropout = {});

// Counter blocks the dropout mask of one call uses: ceil(B H C S / 4) for Q (B, H, N, E) and
// K (B, H, S, E) (reserve them from the run's Generator).
uint64_t clustered_attention_dropout_blocks(const Tensor& Q, const Tensor& K, int64_t clusters);

}  // namespace clustr
