// CUDA kernels of query clustering (cuda/clustering.h gives the contract, clustering.h the
// semantics). Written against core/cuda/kernel.h, so the same code runs on a GPU and in device
// emulation.
//
// Legend: B batch, H heads, N queries, E per-head dim, C clusters, Nv valid queries of one (b, h)
// (= lengths[b], or N); bits (hash bits, the planes) and iterations (Lloyd rounds) as words.
//   proj: scratch (B H N, bits), the projections of every query on every plane.
//
// Hashing: proj = Q planes^T is one GEMM over all queries (padded ones too: each element is its
// own dot product, and padded rows are never read). Then one CUDA block per (b, h, plane)
// reduces the pair's valid projections to [lo_k, hi_k] (min and max are exact in any order) and
// draws its threshold, and a thread per query sets its bits. Only a projection within an ulp of
// its threshold could hash differently from the CPU (the GEMMs sum in other orders).
// Lloyd (sec. 3.2.2): one CUDA block per (b, h) runs every round. Assign: a thread per query,
// the nearest seeded centroid by popcount of XOR, ties to the lowest index; the number of
// changes is a block reduction (integers: exact). Update: every thread adds its queries' set
// bits to their clusters' counts in shared memory (integer atomics, so the counts are exact in
// any order), then a thread per cluster takes the majority vote, a tie keeping the bit. The
// round loop stops where the CPU's does, so the assignment is the CPU's.
// Seeding (k-means++): one CUDA block per (b, h) makes the C sequential draws, the d^2 sums
// split over the threads in contiguous spans, so each draw picks the CPU's code.
#include "layers/attention/cuda/clustering.h"

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

// Each plane's threshold, one CUDA block per (b, h, plane k) = block bh bits + k: the range
// [lo_k, hi_k] of the pair's valid projections on the plane (min and max are exact in any order)
// and the threshold drawn in it. Shared: block_dim floats.
struct ThresholdKernel {
  static constexpr bool kUsesBarrier = true;
  const float* proj;  // (B H N, bits)
  const int32_t* lengths;
  float* threshold;  // (B H, bits)
  int64_t H, N;
  int bits;
  uint64_t seed, threshold_base;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t bh = t.block_idx().x / bits, Nv = valid_queries(lengths, bh, H, N);
    const int k = static_cast<int>(t.block_idx().x % bits);
    if (Nv == 0) return;  // the same for the whole block: no barrier is reached
    const float* p = proj + bh * N * bits + k;
    float lo = p[0], hi = p[0];
    for (int64_t i = tid; i < Nv; i += nt) {
      const float x = p[i * bits];
      lo = x < lo ? x : lo;
      hi = hi < x ? x : hi;
    }
    lo = block_reduce(t, lo, t.shared<float>(), math::Minimum{});
    hi = block_reduce(t, hi, t.shared<float>(), math::Maximum{});
    if (tid != 0) return;
    const float u =
        uint_to_unit(philox4x32(seed, threshold_base + uint64_t(bh * bits + k)).v[0]);
    threshold[bh * bits + k] = math::clustering_threshold(lo, hi, u);
  }
};

// The codes, a thread per query of any pair: bit k set where the projection passes plane k's
// threshold; 0 for padded queries.
struct CodeKernel {
  static constexpr bool kUsesBarrier = false;
  const float* proj;  // (B H N, bits)
  const int32_t* lengths;
  const float* threshold;  // (B H, bits)
  uint64_t* codes;         // (B H N)
  int64_t H, N, total;
  int bits;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t q = global_x(t); q < total; q += grid_stride_x(t)) {
      const int64_t bh = q / N, i = q % N;
      uint64_t code = 0;
      if (i < valid_queries(lengths, bh, H, N)) {
        const float* p = proj + q * bits;
        const float* th = threshold + bh * bits;
        for (int k = 0; k < bits; ++k)
          if (p[k] > th[k]) code |= uint64_t{1} << k;
      }
      codes[q] = code;
    }
  }
};

// k-means++ seeding (clustering.h), one CUDA block per (b, h): C sequential draws, each over the
// pair's Nv codes. Every thread owns a contiguous span of the codes: it updates their distances
// to the nearest centroid so far (dist, global scratch) and sums their d^2 (integers: exact);
// thread 0 draws x below the total and finds the span where the running sum passes x, and that
// span's thread finds the code. So the pick is the first code whose running sum passes x, as
// the CPU's walk finds it. Shared: block_dim uint64 (the spans' sums), then 3 int64 (the pick).
struct SeedKernel {
  static constexpr bool kUsesBarrier = true;
  const uint64_t* codes;  // (B H N)
  const int32_t* lengths;
  int32_t* dist;          // (B H N): scratch
  uint64_t* centroids;    // (B H C)
  int32_t* active;        // (B H)
  int64_t H, N;
  int C;
  uint64_t seed, seed_base;
  CLUSTR_DEVICE uint64_t draw(uint64_t block) const {
    const Philox4 r = philox4x32(seed, block);
    return (uint64_t{r.v[0]} << 32) | r.v[1];
  }
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t bh = t.block_idx().x, Nv = valid_queries(lengths, bh, H, N);
    const uint64_t* code = codes + bh * N;
    int32_t* d = dist + bh * N;
    uint64_t* cent = centroids + bh * C;
    uint64_t* part = t.shared<uint64_t>();
    int64_t* pick = reinterpret_cast<int64_t*>(part + nt);  // span, x within it, seeded
    const uint64_t base = seed_base + static_cast<uint64_t>(bh * C);
    for (int c = static_cast<int>(tid); c < C; c += static_cast<int>(nt)) cent[c] = 0;
    t.sync();  // the zeros before thread 0's first centroid
    if (Nv == 0) {  // the same for the whole block
      if (tid == 0) active[bh] = 0;
      return;
    }
    const auto [i0, i1] = block_span(t, Nv);
    if (tid == 0) {
      cent[0] = code[draw(base) % static_cast<uint64_t>(Nv)];
      pick[2] = 1;
    }
    t.sync();
    for (int j = 1; j < C; ++j) {
      const uint64_t c = cent[j - 1];
      uint64_t sum = 0;
      for (int64_t i = i0; i < i1; ++i) {
        int32_t x = math::popcount64(code[i] ^ c);
        if (j > 1 && d[i] < x) x = d[i];
        d[i] = x;
        sum += static_cast<uint64_t>(x) * static_cast<uint64_t>(x);
      }
      part[tid] = sum;
      t.sync();
      if (tid == 0) {
        uint64_t total = 0;
        for (unsigned s = 0; s < nt; ++s) total += part[s];
        pick[0] = -1;  // no draw: every code is a centroid already
        if (total > 0) {
          uint64_t x = draw(base + static_cast<uint64_t>(j)) % total;
          unsigned s = 0;
          while (x >= part[s]) x -= part[s++];
          pick[0] = s;
          pick[1] = static_cast<int64_t>(x);
        }
      }
      t.sync();
      if (pick[0] < 0) break;  // the same for the whole block
      if (static_cast<int64_t>(tid) == pick[0]) {
        uint64_t acc = 0;
        int64_t i = i0;
        for (;; ++i) {
          acc += static_cast<uint64_t>(d[i]) * static_cast<uint64_t>(d[i]);
          if (static_cast<uint64_t>(pick[1]) < acc) break;
        }
        cent[j] = code[i];  // d > 0: a code not seeded before
        pick[2] = j + 1;
      }
      t.sync();  // the new centroid, and pick read, before the next draw
    }
    if (tid == 0) active[bh] = static_cast<int32_t>(pick[2]);
  }
};

// One block per (b, h) runs all of the pair's Lloyd rounds. Shared: block_dim int64 (the
// reduction of the change count), then the tally of up to `tile` clusters, bits + 1 int32 each.
struct LloydKernel {
  static constexpr bool kUsesBarrier = true;
  const uint64_t* codes;  // (B H N)
  const int32_t* lengths;
  const int32_t* active;  // (B H)
  uint64_t* centroids;    // (B H C)
  int32_t* assignment;    // (B H N)
  int32_t* counts;        // (B H C)
  int64_t H, N;
  int C, bits, iterations, tile;

  // For the clusters c0 .. c0 + n - 1: tally[(c - c0) (bits + 1) + k] = the members of c with
  // bit k set, and tally[(c - c0) (bits + 1) + bits] = its members. Every thread adds its own
  // queries (integer atomics: the counts do not depend on the order of the additions), so no
  // thread walks all Nv queries for its cluster, which serialised a warp on every member.
  CLUSTR_DEVICE void tally_members(const Thread& t, const uint64_t* code, const int32_t* a,
                                   int64_t Nv, int c0, int n, int32_t* tally) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int w = bits + 1;
    for (int x = static_cast<int>(tid); x < n * w; x += static_cast<int>(nt)) tally[x] = 0;
    t.sync();
    for (int64_t i = tid; i < Nv; i += nt) {
      const int c = a[i] - c0;
      if (c < 0 || c >= n) continue;
      int32_t* row = tally + c * w;
      const uint64_t x = code[i];
      for (int k = 0; k < bits; ++k)
        if ((x >> k) & 1u) atomic_add(row + k, 1);
      atomic_add(row + bits, 1);
    }
    t.sync();
  }

  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t bh = t.block_idx().x, Nv = valid_queries(lengths, bh, H, N);
    const uint64_t* code = codes + bh * N;
    uint64_t* cent = centroids + bh * C;
    int32_t* a = assignment + bh * N;
    int32_t* tally = reinterpret_cast<int32_t*>(t.shared<int64_t>() + nt);
    const int act = Nv > 0 ? active[bh] : 0;
    // Each query is always handled by the same thread (i = tid + k nt), so a[i] needs no
    // barrier between its writes and reads by the assign step.
    for (int64_t i = tid; i < N; i += nt) a[i] = -1;
    for (int round = 0; Nv > 0; ++round) {  // Nv is the same for the whole block
      int64_t changed = 0;
      for (int64_t i = tid; i < Nv; i += nt) {
        int best = 0, best_d = math::popcount64(code[i] ^ cent[0]);
        for (int c = 1; c < act; ++c) {
          const int dist = math::popcount64(code[i] ^ cent[c]);
          if (dist < best_d) best = c, best_d = dist;
        }
        if (a[i] != best) ++changed, a[i] = best;
      }
      // Also the barrier after the assign: the update reads every a[i].
      changed = block_reduce(t, changed, t.shared<int64_t>(), AddI64{});
      if (round == iterations || (round > 0 && changed == 0)) break;
      // The majority vote of each cluster's members, bit by bit; a tie keeps the bit.
      for (int c0 = 0; c0 < act; c0 += tile) {
        const int n = act - c0 < tile ? act - c0 : tile;
        tally_members(t, code, a, Nv, c0, n, tally);
        for (int c = static_cast<int>(tid); c < n; c += static_cast<int>(nt)) {
          const int32_t* row = tally + c * (bits + 1);
          const int64_t members = row[bits];
          uint64_t cc = cent[c0 + c];
          for (int k = 0; k < bits; ++k) {
            const int64_t twice = 2 * int64_t{row[k]};
            if (twice > members) cc |= uint64_t{1} << k;
            if (twice < members) cc &= ~(uint64_t{1} << k);
          }
          cent[c0 + c] = cc;
        }
        t.sync();  // the tally read before the next pass clears it
      }
      t.sync();  // the new centroids before the next assign
    }
    for (int c0 = 0; c0 < C; c0 += tile) {
      const int n = C - c0 < tile ? C - c0 : tile;
      tally_members(t, code, a, Nv, c0, n, tally);
      for (int c = static_cast<int>(tid); c < n; c += static_cast<int>(nt))
        counts[bh * C + c0 + c] = tally[c * (bits + 1) + bits];
      t.sync();  // the tally read before the next pass clears it
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
  Scratch<float> proj(BH * d.N * d.bits), threshold(BH * d.bits);
  gemm(false, true, BH * d.N, d.bits, d.E, 1.0f, Q, d.E, planes, d.E, 0.0f, proj.get(), d.bits);
  const unsigned threads = row_threads(d.N);
  launch("cuda::cluster_hash (thresholds)", {static_cast<unsigned>(BH * d.bits)}, {threads},
         threads * sizeof(float),
         ThresholdKernel{proj.get(), lengths, threshold.get(), d.H, d.N, d.bits, seed,
                         threshold_base});
  const int64_t total = BH * d.N;
  launch("cuda::cluster_hash (codes)", {elementwise_blocks(total)}, {kElementwiseThreads}, 0,
         CodeKernel{proj.get(), lengths, threshold.get(), codes, d.H, d.N, total, d.bits});
}

void cluster_seed(const ClusteringDims& d, const uint64_t* codes, const int32_t* lengths,
                  uint64_t seed, uint64_t seed_base, uint64_t* centroids, int32_t* active) {
  const int64_t BH = d.B * d.H;
  if (BH == 0) return;
  require("cuda::cluster_seed");
  Scratch<int32_t> dist(BH * d.N > 0 ? BH * d.N : 1);
  const unsigned threads = row_threads(d.N);
  launch("cuda::cluster_seed", {static_cast<unsigned>(BH)}, {threads},
         threads * sizeof(uint64_t) + 3 * sizeof(int64_t),
         SeedKernel{codes, lengths, dist.get(), centroids, active, d.H, d.N, d.C, seed,
                    seed_base});
}

void cluster_lloyd(const ClusteringDims& d, const uint64_t* codes, const int32_t* lengths,
                   const int32_t* active, uint64_t* centroids, int32_t* assignment,
                   int32_t* counts) {
  const int64_t BH = d.B * d.H;
  if (BH == 0) return;
  require("cuda::cluster_lloyd");
  const unsigned threads = row_threads(d.N > d.C ? d.N : d.C);
  // As many clusters' tallies as fit beside the reduction in 48 KiB (the default limit of
  // dynamic shared memory): 184 with 256 threads and 63 bits, so the usual C takes one pass.
  constexpr size_t kSharedBytes = 48 * 1024;
  const size_t reduce_bytes = threads * sizeof(int64_t);
  const size_t row_bytes = static_cast<size_t>(d.bits + 1) * sizeof(int32_t);
  const size_t fit = (kSharedBytes - reduce_bytes) / row_bytes;
  const size_t clusters = static_cast<size_t>(d.C);
  const int tile = static_cast<int>(fit < clusters ? fit : clusters);
  launch("cuda::cluster_lloyd", {static_cast<unsigned>(BH)}, {threads},
         reduce_bytes + static_cast<size_t>(tile) * row_bytes,
         LloydKernel{codes, lengths, active, centroids, assignment, counts, d.H, d.N, d.C, d.bits,
                     d.iterations, tile});
}

}  // namespace clustr::cuda
