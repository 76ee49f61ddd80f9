// The clustering step of clustered attention (the paper's sec. 3.2.2): hash every query with
// `bits` random hyperplanes, then group the hash codes into C clusters by K-means (Lloyd's
// rounds) in Hamming space. Clustered and improved-clustered attention (sec. 3.2-3.3, eq. 3-11)
// consume the result. How: docs/ARCHITECTURE.md, "Clustering the queries"; the choices the
// paper leaves open (plane offsets, k-means++ seeding, ties, padding): "Where the paper is
// silent".
//
// Legend: B batch, H heads, N queries, E per-head dim, C clusters; bits and iterations as words.
//
// Q (B, H, N, E) f32, lengths i32 (B) or undefined -> assignment i32 (B, H, N),
// counts i32 (B, H, C).
// Each (b, h) is clustered on its own; queries at positions >= lengths[b] (padding) are neither
// hashed nor clustered, get assignment -1, and cannot change the other queries' result.
// Randomness: every call reserves from `gen`, in this order, ceil(bits E / 4) blocks (the
// planes, normal_), B H bits blocks (the offset of (b, h, plane k) at block (b H + h) bits + k)
// and B H C blocks (seeding draw j of (b, h) at block b H C + h C + j): counts from the shapes
// and options only. Deterministic at any thread count (ARCHITECTURE, "Threads and
// determinism"). Q and lengths on the cpu, or both on the CUDA device (cuda/clustering.h: the
// same counters, so a seed gives the same assignment on both devices up to a projection within
// an ulp of its offset).
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

// The Hamming-distance kernel the CPU's K-means runs: "avx512" (VPOPCNTQ), "popcnt" or
// "generic", the first this CPU has unless the environment variable CLUSTR_HAMMING_KERNEL names
// another (an unknown name, or one this CPU lacks, is an error). All give the same result.
const char* hamming_kernel_name();

}  // namespace clustr
