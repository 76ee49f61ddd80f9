// CUDA kernels of query clustering (clustering_cuda.h gives the contract, clustering.h the
// semantics). Written against core/cuda/kernel.h, so the same code runs on a GPU and in device
// emulation.
//
// Legend: B batch, H heads, N queries, E per-head dim, C clusters, K bits, V valid queries of
// one (b, h) (= lengths[b], or N).
//   proj: scratch (B H N, K), the projections of every query on every plane.
//
// Hashing: proj = Q planes^T is one GEMM over all queries (padded ones too: each element is its
// own dot product, and padded rows are never read). Then one CUDA block per (b, h): a thread per
// plane scans the pair's valid projections for [lo_k, hi_k] (min and max are exact in any
// order), draws its threshold, and the block sets the bits. Only a projection within an ulp of
// its threshold could hash differently from the CPU (the GEMMs sum in other orders).
// Lloyd (sec. 3.2.2): one CUDA block per (b, h) runs every round. Assign: a thread per query,
// the nearest seeded centroid by popcount of XOR, ties to the lowest index; the number of
// changes is a block reduction (integers: exact). Update: a thread per cluster counts the set
// bits of its members' codes (integer counts, a fixed order) and takes the majority vote, a tie
// keeping the bit. The round loop stops where the CPU's does, so the assignment is the CPU's.
#include "layers/attention/clustering_cuda.h"

#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/scratch.h"
#include "core/math.h"
#include "core/philox.h"

namespace clustr::cuda {

namespace {

struct AddI64 {
  CLUSTR_HD int64_t operator()(int64_t a, int64_t b) const { return a + b; }
};

CLUSTR_DEVICE int64_t valid_queries(const int32_t* lengths, int64_t bh, int64_t H, int64_t N) {
  return lengths ? lengths[bh / H] : N;
}

// One block per (b, h); shared: K floats (the thresholds).
struct HashKernel {
  static constexpr bool kUsesBarrier = true;
  const float* proj;  // (B H N, K)
  const int32_t* lengths;
  uint64_t* codes;  // (B H N)
  int64_t H, N;
  int K;
  uint64_t seed, threshold_base;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t bh = t.block_idx().x, V = valid_queries(lengths, bh, H, N);
    const float* p = proj + bh * N * K;
    float* threshold = t.shared<float>();
    if (V > 0)
      for (int k = static_cast<int>(tid); k < K; k += static_cast<int>(nt)) {
        // std::min / std::max's comparisons, as the CPU's range scan.
        float lo = p[k], hi = p[k];
        for (int64_t i = 1; i < V; ++i) {
          const float x = p[i * K + k];
          lo = x < lo ? x : lo;
          hi = hi < x ? x : hi;
        }
        const float u = uint_to_unit(
            philox4x32(seed, threshold_base + static_cast<uint64_t>(bh * K + k)).v[0]);
        threshold[k] = math::clustering_threshold(lo, hi, u);
      }
    t.sync();
    for (int64_t i = tid; i < N; i += nt) {
      uint64_t code = 0;
      if (i < V)
        for (int k = 0; k < K; ++k)
          if (p[i * K + k] > threshold[k]) code |= uint64_t{1} << k;
      codes[bh * N + i] = code;
    }
  }
};

// One block per (b, h) runs all of the pair's Lloyd rounds; shared: block_dim int64 (the
// reduction of the change count).
struct LloydKernel {
  static constexpr bool kUsesBarrier = true;
  const uint64_t* codes;  // (B H N)
  const int32_t* lengths;
  const int32_t* active;  // (B H)
  uint64_t* centroids;    // (B H C)
  int32_t* assignment;    // (B H N)
  int32_t* counts;        // (B H C)
  int64_t H, N;
  int C, K, L;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t bh = t.block_idx().x, V = valid_queries(lengths, bh, H, N);
    const uint64_t* code = codes + bh * N;
    uint64_t* cent = centroids + bh * C;
    int32_t* a = assignment + bh * N;
    const int act = V > 0 ? active[bh] : 0;
    // Each query is always handled by the same thread (i = tid + k nt), so a[i] needs no
    // barrier between its writes and reads by the assign step.
    for (int64_t i = tid; i < N; i += nt) a[i] = -1;
    for (int round = 0; V > 0; ++round) {  // V is the same for the whole block
      int64_t changed = 0;
      for (int64_t i = tid; i < V; i += nt) {
        int best = 0, best_d = math::popcount64(code[i] ^ cent[0]);
        for (int c = 1; c < act; ++c) {
          const int dist = math::popcount64(code[i] ^ cent[c]);
          if (dist < best_d) best = c, best_d = dist;
        }
        if (a[i] != best) ++changed, a[i] = best;
      }
      // Also the barrier after the assign: the update reads every a[i].
      changed = block_reduce(t, changed, t.shared<int64_t>(), AddI64{});
      if (round == L || (round > 0 && changed == 0)) break;
      for (int c = static_cast<int>(tid); c < act; c += static_cast<int>(nt)) {
        int32_t ones[64];
        for (int k = 0; k < K; ++k) ones[k] = 0;
        int32_t members = 0;
        for (int64_t i = 0; i < V; ++i)
          if (a[i] == c) {
            ++members;
            const uint64_t x = code[i];
            for (int k = 0; k < K; ++k) ones[k] += static_cast<int32_t>((x >> k) & 1u);
          }
        uint64_t cc = cent[c];
        for (int k = 0; k < K; ++k) {
          const int64_t twice = 2 * int64_t{ones[k]};
          if (twice > members) cc |= uint64_t{1} << k;
          if (twice < members) cc &= ~(uint64_t{1} << k);
        }
        cent[c] = cc;
      }
      t.sync();  // the new centroids before the next assign
    }
    for (int c = static_cast<int>(tid); c < C; c += static_cast<int>(nt)) {
      int32_t n = 0;
      for (int64_t i = 0; i < V; ++i) n += a[i] == c;
      counts[bh * C + c] = n;
    }
  }
};

}  // namespace

void cluster_hash(const ClusteringDims& d, const float* Q, const float* planes,
                  const int32_t* lengths, uint64_t seed, uint64_t threshold_base,
                  uint64_t* codes) {
  const int64_t BH = d.B * d.H;
  if (BH * d.N == 0) return;
  require("cuda::cluster_hash");
  Scratch<float> proj(BH * d.N * d.K);
  gemm(false, true, BH * d.N, d.K, d.E, 1.0f, Q, d.E, planes, d.E, 0.0f, proj.get(), d.K);
  const unsigned threads = 64;  // K <= 63: a thread per plane for the ranges
  launch("cuda::cluster_hash", {static_cast<unsigned>(BH)}, {threads},
         static_cast<size_t>(d.K) * sizeof(float),
         HashKernel{proj.get(), lengths, codes, d.H, d.N, d.K, seed, threshold_base});
}

void cluster_lloyd(const ClusteringDims& d, const uint64_t* codes, const int32_t* lengths,
                   const int32_t* active, uint64_t* centroids, int32_t* assignment,
                   int32_t* counts) {
  const int64_t BH = d.B * d.H;
  if (BH == 0) return;
  require("cuda::cluster_lloyd");
  const unsigned threads = row_threads(d.N > d.C ? d.N : d.C);
  launch("cuda::cluster_lloyd", {static_cast<unsigned>(BH)}, {threads},
         threads * sizeof(int64_t),
         LloydKernel{codes, lengths, active, centroids, assignment, counts, d.H, d.N, d.C, d.K,
                     d.L});
}

}  // namespace clustr::cuda
