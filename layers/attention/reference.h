// The paper's three attention types (and its clustering of the queries) written as plainly as
// its equations: a few matrix products,
// softmaxes and sums of autograd (autograd/ops.h), the masks and the cluster memberships as
// constant matrices. Their gradients come from the autograd engine, not from a derivation by
// hand. Read these first; full.h, clustered.h and improved_clustered.h are the same functions
// as fused kernels (no N x S matrix, threads, the GPU), and the tests check them against these.
// They build every N x S and C x N matrix: for reading and for tests at small sizes, CPU only.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters, k top
// keys per cluster, L the valid keys of a sequence (lengths[b], or S).
//   Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M), lengths i32 (B) or undefined,
//   assignment i32 (B, H, N) in [-1, C): each query's cluster, -1 for a padded query
//   -> out (B, H, N, M).
// t is the temperature (<= 0: 1 / sqrt(E)). As in the fused ops: keys l >= L are masked, and
// rows that see no key, padded queries and empty clusters give zero rows. Attention dropout
// multiplies the weights by the fused ops' documented masks (full.h, clustered.h,
// improved_clustered.h), drawn here from their definition.
#pragma once

#include <cstdint>

#include "autograd/variable.h"
#include "core/tensor.h"
#include "core/random.h"
#include "layers/attention/clustered.h"
#include "layers/attention/clustering.h"
#include "layers/attention/full.h"

namespace clustr {

// eq. 1-2: out = softmax(t Q K^T + mask) V. With options.causal, query i sees the keys l <= i
// (N == S); with N == S, queries i >= L are padding (zero rows). options: temperature, causal
// and dropout as for full_attention (the products in f32 whatever options.precision says).
Variable full_attention_reference(const Variable& Q, const Variable& K, const Variable& V,
                                  const Tensor& lengths, const FullAttentionOptions& options = {});

// eq. 3-6: Qc_j = the mean of cluster j's queries, Ac = softmax(t Qc K^T + mask) (C x S),
// out_i = (Ac V)_{j(i)}.
Variable clustered_attention_reference(const Variable& Q, const Variable& K, const Variable& V,
                                       const Tensor& lengths, const Tensor& assignment,
                                       int64_t clusters, float temperature = 0.0f,
                                       const ClusteredDropout& dropout = {});

// eq. 9-11: with Ac as above, T_j = the min(k, L) keys of largest Ac_j (ties: the lower key),
// m_j = sum_{l in T_j} Ac_j[l], and for a member i of cluster j
//   out_i = m_j softmax_{l in T_j}(t q_i . k_l) V_l + sum_{l not in T_j} Ac_j[l] V_l.
// topk_sets i32 (B, H, C, min(k, S)), T_j's keys in ascending order then -1
// (improved_clustered_attention_forward's topk), gives the sets; undefined, they are chosen
// from this function's own Ac. Either way they are constants: the gradient is the one for
// fixed sets, as the fused op's.
Variable improved_clustered_attention_reference(const Variable& Q, const Variable& K,
                                                const Variable& V, const Tensor& lengths,
                                                const Tensor& assignment, int64_t clusters,
                                                int64_t topk, float temperature = 0.0f,
                                                const Tensor& topk_sets = {},
                                                const ClusteredDropout& dropout = {});

// Reformer attention (reformer.h) for given buckets (B, H, X, N) i32 (reformer_buckets'):
// keys k_j = q_j / |q_j| (q_j != 0), and query i sees, in round x, the other positions of its
// chunk and the previous one in the order of (bucket, position) over the valid positions; a key
// seen in c rounds enters the softmax c times (a logit of t q_i . k_j + log c):
//   out = softmax(t Q K^T + log C) V,
// C the counts (B H, N, N), log 0 masked. A valid query with no count but itself takes its own
// value (C_ii = 1); padded queries give 0. chunk >= L with one bucket is shared-full attention.
Variable reformer_attention_reference(const Variable& Q, const Variable& V, const Tensor& lengths,
                                      const Tensor& buckets, int64_t chunk,
                                      float temperature = 0.0f);

// sec. 3.2.2, the queries' clusters: per (b, h), bit k of a valid query q is (w_k . q > t_k), w_k
// ~ N(0, I_E), t_k uniform over the range of w_k . q on the pair's valid queries; k-means++
// seeds in Hamming distance (the first code uniform, each next one with probability ~ d^2);
// then Lloyd rounds: each query to the nearest centroid (ties: the lower index), each centroid
// bit the majority of its members' (a tie keeps it), up to options.iterations times, stopping
// when nothing moves; padded queries get -1. The draws are cluster_queries' (clustering.h), so
// the same generator state gives the same clusters: plain loops, one query and one bit at a time.
Clustering cluster_queries_reference(const Tensor& Q, const Tensor& lengths,
                                     const ClusteringOptions& options, Generator& gen);

}  // namespace clustr
