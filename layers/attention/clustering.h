// The clustering step of clustered attention (the paper's sec. 3.2.2): hash every query with
// `bits` random hyperplanes, then group the hash codes into C clusters by K-means in Hamming
// space. Clustered and improved-clustered attention (sec. 3.2-3.3, eq. 3-11) consume the result.
//
// Legend: B batch, H heads, N queries, E per-head dim, C clusters; bits and iterations as words.
//
// Q (B, H, N, E) f32, lengths i32 (B) or undefined -> assignment i32 (B, H, N), counts i32 (B, H, C).
// Each (b, h) is clustered on its own; queries at positions >= lengths[b] (padding) are neither
// hashed nor clustered, get assignment -1, and cannot change the other queries' result.
//
// Hashing (sec. 3.2.2): bit k of query q is (w_k . q + b_k > 0), codes kept as uint64_t.
//  * The weights w_k ~ N(0, I_E) are drawn anew on every call (so a seed gives the same planes)
//    and shared by all batches and heads: every (b, h) is clustered independently, so sharing
//    couples nothing, and it costs bits E normals per call instead of B H bits E. (The authors'
//    library does the same.)
//  * The bias is per (b, h, plane k): b_k = -t_k with t_k = lo_k + u (hi_k - lo_k), u uniform in
//    [0, 1) and [lo_k, hi_k] the range of w_k . q over the valid queries of that (b, h). So
//    every plane crosses that head's data (a zero bias, the authors' choice, can miss queries
//    that sit away from the origin and give a constant bit), and it lands in the gap between
//    two well-separated groups with probability proportional to the gap's width, rarely
//    cutting a group apart. It depends on valid queries only.
// K-means (sec. 3.2.2, Lloyd in Hamming space):
//  * Initial centroids by k-means++ seeding (Arthur & Vassilvitskii 2007) in Hamming distance:
//    the first is the code of a uniformly random valid query, each next one the code of a
//    valid query drawn with probability proportional to d^2, d = Hamming distance to the
//    nearest centroid so far. Uniform random picks (the authors' choice) put two of four seeds
//    in one group of four equal groups with probability 1 - 4!/4^4 ~ 0.9, and Lloyd steps
//    cannot move a centroid out of it. The seeds have distinct codes; when fewer than C
//    distinct codes exist (C > valid queries, identical queries), only that many clusters are
//    seeded and the rest stay empty (count 0) and never receive a member.
//  * Assign: each valid query joins the seeded centroid with the smallest popcount(code ^
//    centroid), ties to the lowest index. Update: each centroid bit becomes the majority vote of
//    its members' bits; on a tie it keeps its previous value, so an empty cluster keeps its
//    centroid. `iterations` assign + update rounds, then a final assign against the last
//    centroids. When an assign changes nothing, the centroids are a fixed point (the update is
//    idempotent) and the loop stops early with the same result.
// Randomness: every call reserves from `gen`, in this order, ceil(bits E / 4) blocks (the
// planes, normal_), B H bits blocks (u of (b, h, k) at block (b H + h) bits + k) and B H C blocks
// (the seeding draw j of (b, h) at block b H C + h C + j, a 64-bit word) -- counts that depend on the shapes
// and options only, whatever lengths say. Results depend only on (seed, offset) and the input,
// never on the thread count: OpenMP runs over (b, h) pairs, or, when there are fewer pairs
// than threads (batch 1, one head), over the queries (and the planes' GEMM) inside one pair,
// and every reduction is exact (min, max, integer sums). Scratch comes from tensors, so the
// allocator's memory statistics count it.
// Devices: Q and lengths on the cpu or both on the CUDA device. On the device the hashing, the
// seeding and the Lloyd rounds run as kernels (clustering_cuda.h) with the same counters; the
// planes are drawn on the host as above and copied, so a seed gives the same
// assignment on both devices (only a projection within an ulp of its threshold, which the
// devices' GEMMs may round differently, could hash otherwise).
#pragma once

#include "core/random.h"
#include "core/tensor.h"

namespace clustr {

struct ClusteringOptions {
  int clusters = 100;   // C >= 1
  int bits = 63;        // in [1, 63]
  int iterations = 10;  // >= 0 Lloyd rounds
};

struct Clustering {
  Tensor assignment;  // i32 (B, H, N): cluster of each query, -1 for padded queries
  Tensor counts;      // i32 (B, H, C): members per cluster (sums to the valid queries)
};

Clustering cluster_queries(const Tensor& Q, const Tensor& lengths,
                           const ClusteringOptions& options, Generator& gen);

}  // namespace clustr
