// CUDA kernels of query clustering (cuda/clustering.h gives the contract, clustering.h the
// semantics). Written against core/cuda/kernel.h, so the same code runs on a GPU and in device
// emulation.
//
// Legend: B batch, H heads, N queries, E per-head dim, C clusters, Nv valid queries of one (b, h)
// (= lengths[b], or N); bits (hash bits, the planes) and iterations (Lloyd rounds) as words. A
// chunk is a block's share of one pair's queries.
//
// Counting first (one pair, N = 65536, E = 64, C = 100, 63 bits, 10 rounds): hashing 2 N E bits
// = 0.5 GFLOP (twice: the second launch recomputes the projections rather than storing N x 63
// floats), seeding C passes over N codes (6.6 M popcounts), Lloyd 11 assignments of N codes to C
// centroids (72 M popcounts) and 10 tallies of N x 63 bits. Memory: Q read twice, the codes and
// the assignment a few dozen times (0.5 MB each): the work is small and spread thin, so what
// costs is how many blocks share it and how long each waits on the others.
//
// Hashing (2 launches): a block per chunk of 128 queries of a pair computes its queries'
// projections on every plane (fmaf in order of E: the same bits in both launches) and the
// chunk's [lo, hi] per plane; the second launch reduces the pair's chunk ranges (min and max
// are exact in any order), draws each plane's threshold and sets the chunk's bits. Only a
// projection within an ulp of its threshold could hash differently from the CPU (whose GEMM
// sums in another order).
// Seeding (k-means++, 1 launch): one block per pair; C draws one after another, each over the
// pair's Nv codes. Each warp owns a contiguous span of the codes, its lanes reading 32
// consecutive ones at a time (coalesced); a draw updates the distances to the nearest centroid
// so far and sums their squares (integers: exact), warp 0 finds the warp whose running sum
// passes the drawn x, and that warp walks its span 32 codes at a time (a warp sum, then an
// in-warp prefix sum by shuffles) to the code. So each draw picks the CPU's code: the first
// whose running sum in query order passes x.
// Lloyd: per round, assign (each query to the nearest centroid, ties to the lowest index) and
// tally (per cluster, its members and each bit's set members), then the majority vote (a tie
// keeps the bit). With the pair's queries in one chunk (N <= kLloydChunk) one block per pair
// runs every round in one launch; past that, each round is two launches over all chunks of
// all pairs: assign + tally, each block counting its chunk in shared memory and writing its
// counts, then the vote, one block per pair adding the chunks' counts (integers: the same in
// any order). A pair stops where the CPU's loop does (its state records it), so the assignment
// is the CPU's.
#include "layers/attention/cuda/clustering.h"

#include <algorithm>
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/scratch.h"
#include "core/math.h"
#include "core/philox.h"

namespace clustr::cuda {

namespace {

constexpr int kHashChunk = 128;     // queries a hashing block (a thread each)
constexpr int kLloydChunk = 1024;   // queries a Lloyd block
constexpr unsigned kLloydThreads = 256;
constexpr int kMaxTally = 48 * 1024;  // bytes of shared memory for a block's cluster counts

struct AddI64 {
  CLUSTR_HD int64_t operator()(int64_t a, int64_t b) const { return a + b; }
};
struct AddU64 {
  CLUSTR_HD uint64_t operator()(uint64_t a, uint64_t b) const { return a + b; }
};

// Clamped to [0, N]: a length outside it is possible only when the front door's check was
// deferred to the device (cuda.h's DeferredChecks), which reports it.
CLUSTR_DEVICE int64_t valid_queries(const int32_t* lengths, int64_t bh, int64_t H, int64_t N) {
  const int64_t given = lengths ? lengths[bh / H] : N;
  return given < 0 ? 0 : given > N ? N : given;
}

// ---- hashing ----

// The projection of query q (E floats) on plane w: fmaf in order of E, so both launches (and any
// thread) get the same bits.
CLUSTR_DEVICE float projection(const float* q, const float* w, int64_t E) {
  float acc = 0.0f;
  for (int64_t e = 0; e < E; ++e) acc = fmaf(q[e], w[e], acc);
  return acc;
}

// The range [lo, hi] of each plane's projections over a chunk's valid queries, one block per
// (pair, chunk) = block bh chunks + chunk, a thread per query. Shared: bits x kHashChunk floats.
struct RangeKernel {
  static constexpr bool kUsesBarrier = true;
  const float* Q;       // (B H N, E)
  const float* planes;  // (bits, E)
  const int32_t* lengths;
  float *lo, *hi;  // (B H chunks, bits)
  int64_t H, N, E, chunks;
  int bits;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t bh = t.block_idx().x / chunks, chunk = t.block_idx().x % chunks;
    const int64_t i0 = chunk * kHashChunk, Nv = valid_queries(lengths, bh, H, N);
    if (i0 >= Nv) return;  // no valid query here (the same for the whole block)
    const int n = static_cast<int>(Nv - i0 < kHashChunk ? Nv - i0 : kHashChunk);
    const unsigned tid = t.thread_idx().x;
    float* p = t.shared<float>();  // p[k kHashChunk + r]
    if (static_cast<int>(tid) < n) {
      const float* q = Q + (bh * N + i0 + tid) * E;
      for (int k = 0; k < bits; ++k) p[k * kHashChunk + tid] = projection(q, planes + k * E, E);
    }
    t.sync();
    for (int k = static_cast<int>(tid); k < bits; k += static_cast<int>(t.block_dim().x)) {
      float l = p[k * kHashChunk], h = l;
      for (int r = 1; r < n; ++r) {
        const float x = p[k * kHashChunk + r];
        l = x < l ? x : l;
        h = h < x ? x : h;
      }
      lo[t.block_idx().x * bits + k] = l;
      hi[t.block_idx().x * bits + k] = h;
    }
  }
};

// The codes, one block per (pair, chunk), a thread per query: each plane's threshold from the
// pair's chunk ranges (thresholds in shared memory), then bit k set where the projection passes
// threshold k; 0 for padded queries.
struct CodeKernel {
  static constexpr bool kUsesBarrier = true;
  const float* Q;
  const float* planes;
  const int32_t* lengths;
  const float *lo, *hi;
  uint64_t* codes;  // (B H N)
  int64_t H, N, E, chunks;
  int bits;
  uint64_t seed;
  PhiloxOffset threshold_base;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t bh = t.block_idx().x / chunks, chunk = t.block_idx().x % chunks;
    const uint64_t thresholds = threshold_base.get();
    const int64_t i0 = chunk * kHashChunk, Nv = valid_queries(lengths, bh, H, N);
    const unsigned tid = t.thread_idx().x;
    float* threshold = t.shared<float>();
    const int64_t live_chunks = (Nv + kHashChunk - 1) / kHashChunk;  // those with valid queries
    for (int k = static_cast<int>(tid); k < bits && Nv > 0; k += static_cast<int>(t.block_dim().x)) {
      const int64_t at = bh * chunks * bits + k;
      float l = lo[at], h = hi[at];
      for (int64_t c = 1; c < live_chunks; ++c) {
        l = math::Minimum{}(l, lo[at + c * bits]);
        h = math::Maximum{}(h, hi[at + c * bits]);
      }
      const float u = uint_to_unit(philox4x32(seed, thresholds + uint64_t(bh * bits + k)).v[0]);
      threshold[k] = math::clustering_threshold(l, h, u);
    }
    t.sync();
    const int64_t i = i0 + tid;
    if (i >= N) return;
    uint64_t code = 0;
    if (i < Nv) {
      const float* q = Q + (bh * N + i) * E;
      for (int k = 0; k < bits; ++k)
        if (projection(q, planes + k * E, E) > threshold[k]) code |= uint64_t{1} << k;
    }
    codes[bh * N + i] = code;
  }
};

// ---- seeding ----

// The inclusive prefix sum of v over the warp's lanes (by lane), and in total the warp's sum:
// five shuffle rounds of a hypercube scan.
CLUSTR_DEVICE uint64_t warp_prefix(const Thread& t, uint64_t v, uint64_t& total) {
  const unsigned lane = t.thread_idx().x % 32;
  uint64_t prefix = v;
  total = v;
  for (unsigned m = 1; m < 32; m *= 2) {
    const uint64_t other = t.shfl_xor(total, m);
    if (lane & m) prefix += other;
    total += other;
  }
  return prefix;
}

// k-means++ seeding (clustering.h), one block per (b, h). Shared: 32 uint64 (the warps' sums)
// and the pick (warp, x, the new centroid, the seeded count).
struct SeedKernel {
  static constexpr bool kUsesBarrier = true;
  const uint64_t* codes;  // (B H N)
  const int32_t* lengths;
  int32_t* dist;          // (B H N): scratch
  uint64_t* centroids;    // (B H C)
  int32_t* active;        // (B H)
  int64_t H, N;
  int C;
  uint64_t seed;
  PhiloxOffset seed_base;
  struct Pick {
    int64_t warp;  // -1: no draw (every code is a centroid already)
    uint64_t x, centroid;
    int32_t seeded;
  };
  CLUSTR_DEVICE uint64_t draw(uint64_t block) const {
    const Philox4 r = philox4x32(seed, block);
    return (uint64_t{r.v[0]} << 32) | r.v[1];
  }
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, lane = tid % 32, w = tid / 32;
    const unsigned warps = t.block_dim().x / 32;
    const int64_t bh = t.block_idx().x, Nv = valid_queries(lengths, bh, H, N);
    const uint64_t* code = codes + bh * N;
    int32_t* d = dist + bh * N;
    uint64_t* cent = centroids + bh * C;
    uint64_t* sums = t.shared<uint64_t>();
    Pick* pick = reinterpret_cast<Pick*>(sums + 32);
    const uint64_t base = seed_base.get() + static_cast<uint64_t>(bh * C);
    for (int c = static_cast<int>(tid); c < C; c += static_cast<int>(t.block_dim().x)) cent[c] = 0;
    if (Nv == 0) {  // the same for the whole block
      if (tid == 0) active[bh] = 0;
      return;
    }
    // The warp's span of the codes, [s0, s1), a multiple of 32 long.
    const int64_t span = ((Nv + warps - 1) / warps + 31) / 32 * 32;
    const int64_t s0 = w * span < Nv ? w * span : Nv, s1 = s0 + span < Nv ? s0 + span : Nv;
    if (tid == 0) {
      pick->centroid = code[draw(base) % static_cast<uint64_t>(Nv)];
      pick->seeded = 1;
    }
    t.sync();  // the zeros and the first centroid before anything reads them
    if (tid == 0) cent[0] = pick->centroid;
    for (int j = 1; j < C; ++j) {
      const uint64_t c = pick->centroid;
      uint64_t sum = 0;
      for (int64_t i = s0 + lane; i < s1; i += 32) {
        int32_t x = math::popcount64(code[i] ^ c);
        if (j > 1 && d[i] < x) x = d[i];
        d[i] = x;
        sum += static_cast<uint64_t>(x) * static_cast<uint64_t>(x);
      }
      sum = warp_reduce(t, sum, AddU64{});
      if (lane == 0) sums[w] = sum;
      t.sync();
      if (w == 0) {  // the warp whose running sum passes the draw
        const uint64_t mine = lane < warps ? sums[lane] : 0;
        uint64_t total = 0;
        const uint64_t upto = warp_prefix(t, mine, total);
        if (total == 0) {  // one writer: lane 0 when there is no draw, else the chosen lane
          if (lane == 0) pick->warp = -1;
        } else {
          const uint64_t x = draw(base + static_cast<uint64_t>(j)) % total;
          if (upto - mine <= x && x < upto) {
            pick->warp = lane;
            pick->x = x - (upto - mine);
          }
        }
      }
      t.sync();
      if (pick->warp < 0) break;  // the same for the whole block
      if (static_cast<int64_t>(w) == pick->warp) {  // that warp walks its span to the code
        uint64_t x = pick->x;
        for (int64_t i0 = s0;; i0 += 32) {
          const int64_t i = i0 + lane;
          const uint64_t v = i < s1 ? static_cast<uint64_t>(d[i]) * static_cast<uint64_t>(d[i]) : 0;
          uint64_t chunk = 0;
          const uint64_t upto = warp_prefix(t, v, chunk);
          if (x < chunk) {  // the same for the whole warp
            if (upto - v <= x && x < upto) {  // d > 0: a code not seeded before
              cent[j] = code[i];
              pick->centroid = code[i];
              pick->seeded = j + 1;
            }
            break;
          }
          x -= chunk;
        }
      }
      t.sync();  // the new centroid before the next draw
    }
    if (tid == 0) active[bh] = pick->seeded;
  }
};

// ---- Lloyd ----

// Assigns queries [i0, i1) of a pair (those of this thread: i0 + tid, i0 + tid + nt, ...) to
// the nearest of the `act` centroids in shared memory `cent`, ties to the lowest index; returns
// how many changed (every one in the first round).
CLUSTR_DEVICE int64_t assign(const Thread& t, const uint64_t* code, int32_t* a, int64_t i0,
                             int64_t i1, const uint64_t* cent, int act, bool first) {
  int64_t changed = 0;
  for (int64_t i = i0 + t.thread_idx().x; i < i1; i += t.block_dim().x) {
    const uint64_t x = code[i];
    int best = 0, best_d = math::popcount64(x ^ cent[0]);
    for (int c = 1; c < act; ++c) {
      const int dist = math::popcount64(x ^ cent[c]);
      if (dist < best_d) best = c, best_d = dist;
    }
    if (first || a[i] != best) ++changed, a[i] = best;
  }
  return changed;
}

// For clusters [c0, c0 + n): tally[(c - c0) (bits + 1) + k] = the members among queries
// [i0, i1) (this thread's, as assign's) with bit k set, and [.. + bits] their number (shared
// integer atomics: exact in any order). Ends with a barrier.
CLUSTR_DEVICE void tally(const Thread& t, const uint64_t* code, const int32_t* a, int64_t i0,
                         int64_t i1, int c0, int n, int bits, int32_t* tally) {
  const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
  const int row = bits + 1;
  for (int x = static_cast<int>(tid); x < n * row; x += static_cast<int>(nt)) tally[x] = 0;
  t.sync();
  for (int64_t i = i0 + tid; i < i1; i += nt) {
    const int c = a[i] - c0;  // this thread's own assignment: no barrier needed
    if (c < 0 || c >= n) continue;
    int32_t* r = tally + c * row;
    const uint64_t x = code[i];
    for (int k = 0; k < bits; ++k)
      if ((x >> k) & 1u) atomic_add(r + k, 1);
    atomic_add(r + bits, 1);
  }
  t.sync();
}

// The majority vote of one cluster from its counts row (members at [bits]): a bit set by more
// than half of the members is set, by fewer cleared, a tie kept (and an empty cluster kept).
template <class Row>
CLUSTR_DEVICE uint64_t vote(uint64_t centroid, const Row& row, int bits) {
  const int64_t members = row(bits);
  uint64_t set = 0, clear = 0;
  for (int k = 0; k < bits; ++k) {
    const int64_t twice = 2 * row(k);
    set |= static_cast<uint64_t>(twice > members) << k;
    clear |= static_cast<uint64_t>(twice < members) << k;
  }
  return (centroid | set) & ~clear;
}

// All of a pair's rounds in one block (the pair's queries fit one chunk). Shared: the
// reduction (block_dim int64), the centroids (C uint64), the tally of up to `tile` clusters.
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

  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t bh = t.block_idx().x, Nv = valid_queries(lengths, bh, H, N);
    const uint64_t* code = codes + bh * N;
    uint64_t* cent_g = centroids + bh * C;
    int32_t* a = assignment + bh * N;
    int64_t* reduce = t.shared<int64_t>();
    uint64_t* cent = reinterpret_cast<uint64_t*>(reduce + nt);
    int32_t* counts_s = reinterpret_cast<int32_t*>(cent + C);
    const int act = Nv > 0 ? active[bh] : 0;
    for (int64_t i = Nv + tid; i < N; i += nt) a[i] = -1;
    for (int c = static_cast<int>(tid); c < C; c += static_cast<int>(nt)) cent[c] = cent_g[c];
    t.sync();
    for (int round = 0; Nv > 0; ++round) {  // Nv is the same for the whole block
      int64_t changed = assign(t, code, a, 0, Nv, cent, act, round == 0);
      changed = block_reduce(t, changed, reduce, AddI64{});  // also the barrier after assign
      if (round == iterations || (round > 0 && changed == 0)) break;
      for (int c0 = 0; c0 < act; c0 += tile) {
        const int n = act - c0 < tile ? act - c0 : tile;
        tally(t, code, a, 0, Nv, c0, n, bits, counts_s);
        for (int c = static_cast<int>(tid); c < n; c += static_cast<int>(nt)) {
          const int32_t* r = counts_s + c * (bits + 1);
          cent[c0 + c] = vote(cent[c0 + c], [&](int k) { return int64_t{r[k]}; }, bits);
        }
        t.sync();  // the tally read, and the new centroids written, before the next use
      }
    }
    for (int c0 = 0; c0 < C; c0 += tile) {
      const int n = C - c0 < tile ? C - c0 : tile;
      tally(t, code, a, 0, Nv, c0, n, bits, counts_s);
      for (int c = static_cast<int>(tid); c < n; c += static_cast<int>(nt))
        counts[bh * C + c0 + c] = counts_s[c * (bits + 1) + bits];
      t.sync();  // the tally read before the next pass clears it
    }
    for (int c = static_cast<int>(tid); c < C; c += static_cast<int>(nt)) cent_g[c] = cent[c];
  }
};

// One round's assign and tally over all chunks of all pairs, one block per (pair, chunk) =
// block bh chunks + chunk: the chunk's queries, its number of changes (changed_part) and its
// counts of every cluster (tally_part (B H chunks, C, bits + 1)). Shared: the reduction, the
// pair's centroids, the tally of `tile` clusters. A pair whose loop has ended (state) is
// skipped; in the first round, padded queries get -1.
struct AssignKernel {
  static constexpr bool kUsesBarrier = true;
  const uint64_t* codes;
  const int32_t* lengths;
  const int32_t* active;
  const uint64_t* centroids;
  int32_t* assignment;
  const int32_t* state;     // (B H): 1 once the pair's loop has ended
  int64_t* changed_part;    // (B H chunks)
  int32_t* tally_part;      // (B H chunks, C, bits + 1)
  int64_t H, N, chunks;
  int C, bits, tile, round;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t bh = t.block_idx().x / chunks, chunk = t.block_idx().x % chunks;
    const int64_t Nv = valid_queries(lengths, bh, H, N);
    const int64_t i0 = chunk * kLloydChunk, i_end = i0 + kLloydChunk < N ? i0 + kLloydChunk : N;
    int32_t* a = assignment + bh * N;
    if (round == 0)
      for (int64_t i = (i0 > Nv ? i0 : Nv) + tid; i < i_end; i += nt) a[i] = -1;
    if (Nv == 0 || (round > 0 && state[bh] != 0)) return;  // the same for the whole block
    const int64_t i1 = i_end < Nv ? i_end : Nv;
    int64_t* reduce = t.shared<int64_t>();
    uint64_t* cent = reinterpret_cast<uint64_t*>(reduce + nt);
    int32_t* counts_s = reinterpret_cast<int32_t*>(cent + C);
    const int act = active[bh];
    for (int c = static_cast<int>(tid); c < act; c += static_cast<int>(nt))
      cent[c] = centroids[bh * C + c];
    t.sync();
    const int64_t changed = i0 < i1 ? assign(t, codes + bh * N, a, i0, i1, cent, act, round == 0)
                                    : 0;
    const int64_t total = block_reduce(t, changed, reduce, AddI64{});
    if (tid == 0) changed_part[t.block_idx().x] = total;
    const int row = bits + 1;
    int32_t* out = tally_part + t.block_idx().x * int64_t{C} * row;
    for (int c0 = 0; c0 < C; c0 += tile) {
      const int n = C - c0 < tile ? C - c0 : tile;
      tally(t, codes + bh * N, a, i0, i1, c0, n, bits, counts_s);
      for (int x = static_cast<int>(tid); x < n * row; x += static_cast<int>(nt))
        out[c0 * row + x] = counts_s[x];
      t.sync();  // the tally read before the next pass clears it
    }
  }
};

// One round's end, one block per pair: the chunks' changes and counts added (integers: any
// order); the pair's loop ends where the CPU's does (then counts are written), or each cluster
// takes its vote. Shared: the reduction.
struct VoteKernel {
  static constexpr bool kUsesBarrier = true;
  const int32_t* lengths;
  const int32_t* active;
  uint64_t* centroids;
  int32_t* counts;
  int32_t* state;
  const int64_t* changed_part;
  const int32_t* tally_part;
  int64_t H, N, chunks;
  int C, bits, iterations, round;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t bh = t.block_idx().x, Nv = valid_queries(lengths, bh, H, N);
    if (round > 0 && state[bh] != 0) return;  // the same for the whole block
    const int row = bits + 1;
    const int32_t* part = tally_part + bh * chunks * int64_t{C} * row;
    const int64_t stride = int64_t{C} * row;  // from one chunk's counts to the next's
    auto sum = [&](int c, int k) {
      int64_t s = 0;
      for (int64_t ch = 0; ch < chunks; ++ch) s += part[ch * stride + c * row + k];
      return s;
    };
    int64_t changed = 0;
    for (int64_t ch = tid; ch < chunks; ch += nt) changed += changed_part[bh * chunks + ch];
    changed = block_reduce(t, changed, t.shared<int64_t>(), AddI64{});
    const bool last = Nv == 0 || round == iterations || (round > 0 && changed == 0);
    if (last) {
      for (int c = static_cast<int>(tid); c < C; c += static_cast<int>(nt))
        counts[bh * C + c] = Nv == 0 ? 0 : static_cast<int32_t>(sum(c, bits));
    } else {
      const int act = active[bh];
      for (int c = static_cast<int>(tid); c < act; c += static_cast<int>(nt))
        centroids[bh * C + c] = vote(centroids[bh * C + c], [&](int k) { return sum(c, k); }, bits);
    }
    if (tid == 0) state[bh] = last ? 1 : 0;
  }
};

// Clusters whose counts fit beside `reserved` bytes in kMaxTally: all C, or a tile of them (at
// least one; with C in the thousands the centroids alone pass 48 KiB, and the launch asks for
// more).
int tally_tile(int C, int bits, size_t reserved) {
  const size_t row = static_cast<size_t>(bits + 1) * sizeof(int32_t);
  const size_t fit = reserved + row < kMaxTally ? (kMaxTally - reserved) / row : 1;
  return static_cast<int>(fit < static_cast<size_t>(C) ? fit : static_cast<size_t>(C));
}

}  // namespace

void cluster_hash(const ClusteringDims& d, const float* Q, const float* planes,
                  const int32_t* lengths, uint64_t seed, PhiloxOffset threshold_base,
                  uint64_t* codes) {
  const int64_t BH = d.B * d.H;
  if (BH * d.N == 0) return;
  require("cuda::cluster_hash");
  const int64_t chunks = (d.N + kHashChunk - 1) / kHashChunk;
  Scratch<float> lo(BH * chunks * d.bits), hi(BH * chunks * d.bits);
  const unsigned blocks = static_cast<unsigned>(BH * chunks);
  const RangeKernel ranges{Q, planes, lengths, lo.get(), hi.get(), d.H, d.N, d.E, chunks, d.bits};
  const CodeKernel code{Q, planes, lengths, lo.get(), hi.get(), codes, d.H, d.N, d.E,
                        chunks, d.bits, seed, threshold_base};
  const size_t range_shared = size_t(d.bits) * kHashChunk * sizeof(float);
  if (chunks == 1) {  // each pair's ranges from its own block: both in one launch
    launch("cuda::cluster_hash (ranges, codes)", {blocks}, {kHashChunk}, range_shared,
           InTurn<RangeKernel, CodeKernel>{ranges, code});
    return;
  }
  launch("cuda::cluster_hash (ranges)", {blocks}, {kHashChunk}, range_shared, ranges);
  launch("cuda::cluster_hash (codes)", {blocks}, {kHashChunk}, size_t(d.bits) * sizeof(float),
         code);
}

namespace {
constexpr size_t kSeedShared = 32 * sizeof(uint64_t) + sizeof(SeedKernel::Pick);
}  // namespace

void cluster_seed(const ClusteringDims& d, const uint64_t* codes, const int32_t* lengths,
                  uint64_t seed, PhiloxOffset seed_base, uint64_t* centroids, int32_t* active) {
  const int64_t BH = d.B * d.H;
  if (BH == 0) return;
  require("cuda::cluster_seed");
  Scratch<int32_t> dist(BH * d.N > 0 ? BH * d.N : 1);
  // A thread per two queries or more, from one warp to 32.
  unsigned threads = 32;
  while (threads < 1024 && threads * 4 <= d.N) threads *= 2;
  launch("cuda::cluster_seed", {static_cast<unsigned>(BH)}, {threads}, kSeedShared,
         SeedKernel{codes, lengths, dist.get(), centroids, active, d.H, d.N, d.C, seed,
                    seed_base});
}

namespace {

// The shared memory of a Lloyd block and the centroids' tile that fits beside it.
struct LloydShared {
  int tile;
  size_t bytes;
};
LloydShared lloyd_shared(const ClusteringDims& d) {
  const size_t reserved = kLloydThreads * sizeof(int64_t) + size_t(d.C) * sizeof(uint64_t);
  const int tile = tally_tile(d.C, d.bits, reserved);
  return {tile, reserved + size_t(tile) * (d.bits + 1) * sizeof(int32_t)};
}

}  // namespace

void cluster_seed_lloyd(const ClusteringDims& d, const uint64_t* codes, const int32_t* lengths,
                        uint64_t seed, PhiloxOffset seed_base, uint64_t* centroids,
                        int32_t* active, int32_t* assignment, int32_t* counts) {
  const int64_t BH = d.B * d.H;
  if (BH == 0) return;
  if (d.N > kLloydChunk) {
    cluster_seed(d, codes, lengths, seed, seed_base, centroids, active);
    return cluster_lloyd(d, codes, lengths, active, centroids, assignment, counts);
  }
  // Each pair's queries in one block for both: the seeding (its draws integer sums, the same at
  // any block size) on the Lloyd block's threads, then every round, in one launch.
  require("cuda::cluster_seed_lloyd");
  Scratch<int32_t> dist(BH * d.N > 0 ? BH * d.N : 1);
  const LloydShared sh = lloyd_shared(d);
  launch("cuda::cluster_seed_lloyd", {static_cast<unsigned>(BH)}, {kLloydThreads},
         std::max(kSeedShared, sh.bytes),
         InTurn<SeedKernel, LloydKernel>{
             {codes, lengths, dist.get(), centroids, active, d.H, d.N, d.C, seed, seed_base},
             {codes, lengths, active, centroids, assignment, counts, d.H, d.N, d.C, d.bits,
              d.iterations, sh.tile}});
}

void cluster_lloyd(const ClusteringDims& d, const uint64_t* codes, const int32_t* lengths,
                   const int32_t* active, uint64_t* centroids, int32_t* assignment,
                   int32_t* counts) {
  const int64_t BH = d.B * d.H;
  if (BH == 0) return;
  require("cuda::cluster_lloyd");
  const LloydShared sh = lloyd_shared(d);
  if (d.N <= kLloydChunk) {  // each pair's queries in one block: every round in one launch
    launch("cuda::cluster_lloyd", {static_cast<unsigned>(BH)}, {kLloydThreads}, sh.bytes,
           LloydKernel{codes, lengths, active, centroids, assignment, counts, d.H, d.N, d.C,
                       d.bits, d.iterations, sh.tile});
    return;
  }
  const int64_t chunks = (d.N + kLloydChunk - 1) / kLloydChunk;
  Scratch<int64_t> changed(BH * chunks);
  Scratch<int32_t> tallies(BH * chunks * d.C * (d.bits + 1)), state(BH);
  for (int round = 0; round <= d.iterations; ++round) {
    launch("cuda::cluster_lloyd (assign)", {static_cast<unsigned>(BH * chunks)}, {kLloydThreads},
           sh.bytes,
           AssignKernel{codes, lengths, active, centroids, assignment, state.get(), changed.get(),
                        tallies.get(), d.H, d.N, chunks, d.C, d.bits, sh.tile, round});
    launch("cuda::cluster_lloyd (vote)", {static_cast<unsigned>(BH)}, {kLloydThreads},
           kLloydThreads * sizeof(int64_t),
           VoteKernel{lengths, active, centroids, counts, state.get(), changed.get(),
                      tallies.get(), d.H, d.N, chunks, d.C, d.bits, d.iterations, round});
  }
}

}  // namespace clustr::cuda
