// CUDA kernels of query clustering (layers/attention/clustering.h, the paper's sec. 3.2.2): the
// hashing, the k-means++ seeding and the Lloyd iterations on device pointers. Implemented by
// cuda/clustering.cu when clustr has the CUDA backend (a GPU build or device emulation), and by
// no_cuda.cpp otherwise, where every call throws a clear error.
//
// Legend: B batch, H heads, N queries, E per-head dim, C clusters; bits (hash bits, the planes)
// and iterations (Lloyd rounds) as words.
//   Q (B, H, N, E), planes (bits, E), codes u64 (B, H, N), centroids u64 (B, H, C), active i32
//   (B, H), assignment i32 (B, H, N), counts i32 (B, H, C); lengths a device array (B) or null:
//   queries at positions >= lengths[b] are padding.
// Semantics (the thresholds' random stream, ties, the stopping rule) are clustering.h's.
#pragma once

#include <cstdint>
#include "core/philox.h"

namespace clustr::cuda {

struct ClusteringDims {
  int64_t B = 0, H = 0, N = 0, E = 0;
  int C = 1, bits = 1, iterations = 0;
};

// codes (=): bit k of valid query i is (planes_k . q_i > t_k), t_k = lo + u (hi - lo) over the
// pair's valid queries, u from philox4x32(seed, threshold_base + (b H + h) bits + k).v[0]; the
// codes of padded queries are 0. The offsets (threshold_base, seed_base below) may be read from
// device memory (PhiloxOffset: a draw a graph's replays refill).
void cluster_hash(const ClusteringDims& d, const float* Q, const float* planes,
                  const int32_t* lengths, uint64_t seed, PhiloxOffset threshold_base,
                  uint64_t* codes);

// k-means++ seeding (clustering.h): centroids (=) gets each pair's seeded codes, 0 after them,
// and active (=) their number (0 for a pair without valid queries). The draw j of pair (b, h) is
// the 64-bit word of philox4x32(seed, seed_base + (b H + h) C + j), as on the CPU.
void cluster_seed(const ClusteringDims& d, const uint64_t* codes, const int32_t* lengths,
                  uint64_t seed, PhiloxOffset seed_base, uint64_t* centroids, int32_t* active);

// Lloyd rounds in Hamming space from the seeded centroids: the first active[b, h] of the pair's
// C centroids are seeded (the others never receive a member). centroids are updated in place;
// assignment and counts are written (=), -1 for padded queries.
void cluster_lloyd(const ClusteringDims& d, const uint64_t* codes, const int32_t* lengths,
                   const int32_t* active, uint64_t* centroids, int32_t* assignment,
                   int32_t* counts);
// cluster_seed then cluster_lloyd, the same results; in one launch where a pair's queries fit
// one Lloyd block (N <= 1024).
void cluster_seed_lloyd(const ClusteringDims& d, const uint64_t* codes, const int32_t* lengths,
                        uint64_t seed, PhiloxOffset seed_base, uint64_t* centroids,
                        int32_t* active, int32_t* assignment, int32_t* counts);

}  // namespace clustr::cuda
