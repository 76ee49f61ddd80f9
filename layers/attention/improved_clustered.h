// Improved clustered attention (the paper's sec. 3.3, eq. 9-11; supplementary A.2, eq. 13-17)
// for a given clustering of the queries, as one fused op with a hand-written backward.
// cluster_queries (clustering.h) makes the clustering; attention() (attention.h) chains the two.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters,
// k the top keys per cluster (topk).
//   Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M), lengths i32 (B) or undefined,
//   assignment i32 (B, H, N) with values in [-1, C) (-1: padded query) -> out (B, H, N, M).
// Per (b, h), with t the temperature (<= 0: 1/sqrt(E)) and keys l >= lengths[b] masked:
//   Qc_j = mean of the queries of cluster j, Ac_j = softmax(t Qc_j K^T + mask)   (eq. 3-5)
//   T_j  = the min(k, L) valid keys with the largest Ac_j (ties: lower key index)  (eq. 9)
//   m_j  = sum_{l in T_j} Ac_j[l]                                 (eq. 10, the top-k mass)
//   A_i[l] = m_j softmax_{l in T_j}(t q_i . k_l)   for l in T_j, member i of j    (eq. 11)
//   A_i[l] = Ac_j[l]                               for l not in T_j
//   out_i  = m_j softmax_Tj(t q_i K_Tj^T) V_Tj + (Ac_j with T_j zeroed) V       (eq. 11)
// The second term is computed once per cluster. Padded queries, empty clusters and clusters
// that see no key give zero rows. With k >= L every row is full attention's (m_j = 1), and for
// every query the L1 distance to full attention's row A is at most clustered attention's
// (Proposition 2: off T_j both rows are Ac_j; on T_j the exact softmax is A / A(T_j), so the
// improved error there is |m_j - A(T_j)| = |sum_{T_j} (Ac_j - A)| <= sum_{T_j} |Ac_j - A|).
// Backward: the true gradient for the fixed assignment and fixed top-k sets (both piecewise
// constant in Q, K), including the paths through m_j and the non-top-k Ac_j that the authors'
// library drops; see improved_clustered_cpu.cpp for the derivation.
//
// Attention dropout (training), as the authors' library: a mask per cluster on the remainder
// (Ac_j off T_j, elements as in clustered.h) and one per query on the exact top-k weights,
//   out_i = m_j (P_i * D_i / (1 - p)) V_Tj + ((Ac_j with T_j zeroed) * Dc_j / (1 - p)) V,
// D of (b, h, query i, slot c < kw) at element B H C S + ((b H + h) N + i) kw + c, slot c being
// T_j's c-th key in ascending order; improved_clustered_attention_dropout_blocks gives the
// counter blocks. T_j, m_j and P_i are those without dropout.
// Deterministic at any thread count (ARCHITECTURE, "Threads and determinism"). On the CUDA
// device: cuda/improved_clustered.h (the same T_j and m_j for the same Ac). Details and the
// parallel plan: ARCHITECTURE, "Improved clustered attention"; dense weights of each type:
// attention_matrix() (attention.h).
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "core/tensor.h"
#include "layers/attention/clustered.h"
#include "layers/attention/config.h"

namespace clustr {

struct ImprovedClusteredAttentionOutput {
  Tensor out;        // (B, H, N, M)
  Tensor weights;    // Ac (B, H, C, S): 0 on masked keys and for empty clusters
  Tensor centroids;  // Qc (B, H, C, E): 0 for empty clusters
  Tensor counts;     // i32 (B, H, C): members of each cluster
  Tensor topk;       // i32 (B, H, C, min(k, S)): T_j in ascending key order, -1 padded
  Tensor mass;       // m_j (B, H, C): 0 for empty clusters
  Tensor start, order;  // on the CUDA device: the grouping backward reuses (clustered.h)
  ClusteredDropout dropout;  // the forward's, so that backward draws the same masks
  Precision precision = Precision::fp32;  // the forward's products', which backward's follow
};
// precision: as clustered attention's (clustered.h); the per-cluster products of the members
// with their top-k keys stay f32.
ImprovedClusteredAttentionOutput improved_clustered_attention_forward(
    const Tensor& Q, const Tensor& K, const Tensor& V, const Tensor& lengths,
    const Tensor& assignment, int64_t clusters, int64_t topk, float temperature = 0.0f,
    const ClusteredDropout& dropout = {}, Precision precision = Precision::fp32);

struct ImprovedClusteredAttentionGrads {
  Tensor dQ, dK, dV;  // the shapes of Q, K, V (overwritten, never accumulated)
};
// The gradients of sum(dout * out) for the fixed assignment and the forward's top-k sets (and
// dropout masks), written into `into`'s defined tensors as clustered_attention_backward does.
ImprovedClusteredAttentionGrads improved_clustered_attention_backward(
    const Tensor& dout, const Tensor& Q, const Tensor& K, const Tensor& V, const Tensor& lengths,
    const Tensor& assignment, const ImprovedClusteredAttentionOutput& forward,
    float temperature = 0.0f, const ImprovedClusteredAttentionGrads& into = {});

// The differentiable op (gradients for Q, K and V; the assignment is a constant), its
// products in this thread's precision.
Variable improved_clustered_attention(const Variable& Q, const Variable& K, const Variable& V,
                                      const Tensor& lengths, const Tensor& assignment,
                                      int64_t clusters, int64_t topk, float temperature = 0.0f,
                                      const ClusteredDropout& dropout = {});
// The same on queries, keys and values stacked as QKV (3, B, H, N, E), with one gradient for
// QKV (as clustered_attention's stacked form).
Variable improved_clustered_attention(const Variable& QKV, const Tensor& lengths,
                                      const Tensor& assignment, int64_t clusters, int64_t topk,
                                      float temperature = 0.0f,
                                      const ClusteredDropout& dropout = {});

// Counter blocks the dropout masks of one call use: ceil((B H C S + B H N min(k, S)) / 4) for
// Q (B, H, N, E) and K (B, H, S, E) (reserve them from the run's Generator).
uint64_t improved_clustered_attention_dropout_blocks(const Tensor& Q, const Tensor& K,
                                                     int64_t clusters, int64_t topk);

}  // namespace clustr
