// Query clustering for clustered attention: hashing and Hamming K-means (clustering.h gives the
// contract, the choices and the random stream layout; the paper's sec. 3.2.2).
//
// Legend: B batch, H heads, N queries, E per-head dim, C clusters, Nv valid queries of one (b, h)
// (= lengths[b], or N); bits (hash bits, the planes) and iterations (Lloyd rounds) as words.
#include "layers/attention/clustering.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "core/error.h"
#include "core/cpu/gemm.h"
#include "core/cuda/cuda.h"
#include "core/math.h"
#include "core/ops_check.h"
#include "core/parallel.h"
#include "core/philox.h"
#include "layers/attention/cuda/clustering.h"

namespace clustr {

namespace {

// With fewer (b, h) pairs than threads, one pair's loops are shared instead, once N is large
// enough to pay for a parallel region per step.
constexpr int64_t kInnerMinN = 256;
// Queries per piece of the loops over queries (seeding, assign, update).
constexpr int64_t kChunk = 1024;
// Seeding is C sequential steps of Nv popcounts each: shared among threads only when a step is
// long enough (about 10 us) to pay for the region and its barrier, which on a busy host can
// cost far more than the step.
constexpr int64_t kSeedInnerMinNv = 8192;

struct Sizes {
  int64_t B, H, N, E;
  int C, bits, iterations;
};

uint64_t draw_u64(uint64_t seed, uint64_t counter) {
  Philox4 r = philox4x32(seed, counter);
  return (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scratch that the tensor allocator counts (so memory figures include it): n floats, or n
// 64-bit words carved from an i32 tensor of 2n.
float* scratch_f32(Tensor& holder, int64_t n) {
  holder = Tensor::empty({n + 1});
  return holder.f32();
}
uint64_t* scratch_u64(Tensor& holder, int64_t n) {
  holder = Tensor::empty({2 * n + 2}, DType::i32);
  return static_cast<uint64_t*>(holder.raw());
}

// Everything random one (b, h) needs: the shared planes and the first counter block of its
// thresholds and of its seeding draws.
struct Draws {
  const float* planes;  // (bits, E)
  uint64_t seed, threshold_base, seed_base;
};
// The same draws as the device reads them (their offsets maybe in device memory: DrawPlan).
struct DeviceDraws {
  uint64_t seed;
  PhiloxOffset threshold_base, seed_base;
};

// codes[i] for the Nv valid queries q (Nv, E) (sec. 3.2.2 hashing, bias as in clustering.h).
// The projections P = q planes^T (Nv, bits) come from one GEMM (each element is computed the same
// way whatever the thread count); then each plane's range [lo_k, hi_k] gives its threshold and
// the bits are set against it. min and max are exact, so the ranges do not depend on how the
// queries are shared among threads.
void hash_queries(const float* q, int64_t Nv, const Sizes& s, const Draws& r, bool inner,
                  uint64_t* codes) {
  if (Nv == 0) return;
  const int bits = s.bits;
  Tensor proj_holder;
  float* proj = scratch_f32(proj_holder, Nv * bits);
  {
    // Inside the caller's parallel loop over (b, h) this runs on one thread; with `inner` the
    // GEMM itself uses every thread.
    ThreadCountScope threads(inner ? num_threads() : 1);
    cpu::gemm(false, true, Nv, bits, s.E, 1.0f, q, s.E, r.planes, s.E, 0.0f, proj, bits);
  }
  std::vector<float> lo(proj, proj + bits), hi = lo;
#pragma omp parallel if (inner)
  {
    std::vector<float> my_lo = lo, my_hi = hi;
#pragma omp for schedule(static) nowait
    for (int64_t i = 1; i < Nv; ++i) {
      const float* p = proj + i * bits;
      for (int k = 0; k < bits; ++k)
        my_lo[k] = std::min(my_lo[k], p[k]), my_hi[k] = std::max(my_hi[k], p[k]);
    }
#pragma omp critical(clustr_hash_range)
    for (int k = 0; k < bits; ++k)
      lo[k] = std::min(lo[k], my_lo[k]), hi[k] = std::max(hi[k], my_hi[k]);
  }
  std::vector<float> threshold(static_cast<size_t>(bits));
  for (int k = 0; k < bits; ++k) {
    float u = uint_to_unit(philox4x32(r.seed, r.threshold_base + static_cast<uint64_t>(k)).v[0]);
    threshold[static_cast<size_t>(k)] = math::clustering_threshold(lo[k], hi[k], u);
  }
#pragma omp parallel for schedule(static) if (inner)
  for (int64_t i = 0; i < Nv; ++i) {
    const float* p = proj + i * bits;
    uint64_t code = 0;  // without a branch: each bit is a coin flip that no predictor learns
    for (int k = 0; k < bits; ++k)
      code |= static_cast<uint64_t>(p[k] > threshold[static_cast<size_t>(k)]) << k;
    codes[i] = code;
  }
}

// Seeding step for codes [i0, i1): dist[i] = the Hamming distance to the nearest centroid so
// far (c the newest; `first`: c is the only one); returns the sum of dist^2 (an integer).
__attribute__((always_inline)) inline uint64_t nearer_range(const uint64_t* codes, int64_t i0,
                                                            int64_t i1, uint64_t c, bool first,
                                                            int32_t* dist) {
  uint64_t total = 0;
  for (int64_t i = i0; i < i1; ++i) {
    int32_t d = __builtin_popcountll(codes[i] ^ c);
    if (!first && dist[i] < d) d = dist[i];
    dist[i] = d;
    total += static_cast<uint64_t>(d * d);
  }
  return total;
}

// Nearest of the `active` centroids for codes [i0, i1), ties to the lowest index; returns how
// many assignments changed.
__attribute__((always_inline)) inline int64_t nearest_range(const uint64_t* codes, int64_t i0,
                                                            int64_t i1, const uint64_t* centroids,
                                                            int active, int32_t* a) {
  int64_t changed = 0;
  for (int64_t i = i0; i < i1; ++i) {
    int best = 0, best_d = __builtin_popcountll(codes[i] ^ centroids[0]);
    for (int c = 1; c < active; ++c) {
      int d = __builtin_popcountll(codes[i] ^ centroids[c]);
      if (d < best_d) best = c, best_d = d;
    }
    if (a[i] != best) ++changed, a[i] = best;
  }
  return changed;
}

// Bit b of byte x, as 8 counters to add: kByteBits.v[x][b].
struct ByteBits {
  int32_t v[256][8];
  ByteBits() {
    for (int x = 0; x < 256; ++x)
      for (int b = 0; b < 8; ++b) v[x][b] = (x >> b) & 1;
  }
};
const ByteBits kByteBits;

// The update step's counters of one cluster: one per bit of a code, then its members.
constexpr int kCountRow = 65;

// The K-means' hot spots: the two Hamming-distance loops above and the update step's bit count
// (count_generic below). They come in versions chosen at run time, as the GEMM kernels are:
// "avx512", AVX-512 with VPOPCNTQ (Zen 4, Xeons from Ice Lake on), eight distances to a vector
// and 16 bits of a code added to 16 counters under a mask; "popcnt", the POPCNT instruction
// (every x86-64 CPU since about 2008); "generic", portable code, where each popcount is a
// library call. CLUSTR_HAMMING_KERNEL forces one that the CPU has (the tests run each). All
// give the same integers.
struct HammingKernel {
  const char* name;
  uint64_t (*nearer)(const uint64_t*, int64_t, int64_t, uint64_t, bool, int32_t*);
  int64_t (*nearest)(const uint64_t*, int64_t, int64_t, const uint64_t*, int, int32_t*);
  void (*count)(const uint64_t*, int64_t, int64_t, const int32_t*, int32_t*);
};

uint64_t nearer_generic(const uint64_t* codes, int64_t i0, int64_t i1, uint64_t c, bool first,
                        int32_t* dist) {
  return nearer_range(codes, i0, i1, c, first, dist);
}
int64_t nearest_generic(const uint64_t* codes, int64_t i0, int64_t i1,
                        const uint64_t* centroids, int active, int32_t* a) {
  return nearest_range(codes, i0, i1, centroids, active, a);
}
// Adds codes [i0, i1) to the counters (kCountRow each) of their clusters a[i] in counts: a
// byte of a code at a time, 8 counters from the table.
void count_generic(const uint64_t* codes, int64_t i0, int64_t i1, const int32_t* a,
                   int32_t* counts) {
  for (int64_t i = i0; i < i1; ++i) {
    int32_t* row = counts + static_cast<int64_t>(a[i]) * kCountRow;
    const uint64_t x = codes[i];
    for (int byte = 0; byte < 8; ++byte) {
      const int32_t* bits = kByteBits.v[(x >> (8 * byte)) & 255u];
      for (int b = 0; b < 8; ++b) row[8 * byte + b] += bits[b];
    }
    ++row[64];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define CLUSTR_HAMMING_X86 1
__attribute__((target("popcnt"))) uint64_t nearer_popcnt(const uint64_t* codes, int64_t i0,
                                                         int64_t i1, uint64_t c, bool first,
                                                         int32_t* dist) {
  return nearer_range(codes, i0, i1, c, first, dist);
}
__attribute__((target("popcnt"))) int64_t nearest_popcnt(const uint64_t* codes, int64_t i0,
                                                         int64_t i1, const uint64_t* centroids,
                                                         int active, int32_t* a) {
  return nearest_range(codes, i0, i1, centroids, active, a);
}

// GCC 12 reports the reduction intrinsics' internal undefined vectors as (maybe) uninitialized
// (a known false positive of its headers; see gemm_driver.h's transpose16).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define CLUSTR_TARGET_VPOPCNT __attribute__((target("avx512f,avx512vpopcntdq,popcnt")))
// The compiler vectorises this one (eight codes to a vector).
CLUSTR_TARGET_VPOPCNT uint64_t nearer_avx512(const uint64_t* codes, int64_t i0, int64_t i1,
                                             uint64_t c, bool first, int32_t* dist) {
  return nearer_range(codes, i0, i1, c, first, dist);
}
// One code against eight centroids at a time: lane l keeps the nearest of centroids l, l + 8,
// ... (a strictly smaller distance replaces it, so a tie keeps the lower index); then the least
// distance over the lanes, and the lowest centroid among the lanes that have it.
CLUSTR_TARGET_VPOPCNT int64_t nearest_avx512(const uint64_t* codes, int64_t i0, int64_t i1,
                                             const uint64_t* centroids, int active, int32_t* a) {
  const __m512i lanes = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i beyond = _mm512_set1_epi64(65);  // above any distance between 64-bit codes
  int64_t changed = 0;
  for (int64_t i = i0; i < i1; ++i) {
    const __m512i x = _mm512_set1_epi64(static_cast<long long>(codes[i]));
    __m512i best_d = beyond, best_c = _mm512_setzero_si512();
    for (int c0 = 0; c0 < active; c0 += 8) {
      const int n = std::min(8, active - c0);
      const __mmask8 m = static_cast<__mmask8>((1u << n) - 1);
      const __m512i d =
          _mm512_popcnt_epi64(_mm512_xor_si512(x, _mm512_maskz_loadu_epi64(m, centroids + c0)));
      const __mmask8 nearer = _mm512_mask_cmplt_epu64_mask(m, d, best_d);
      best_d = _mm512_mask_mov_epi64(best_d, nearer, d);
      best_c =
          _mm512_mask_mov_epi64(best_c, nearer, _mm512_add_epi64(lanes, _mm512_set1_epi64(c0)));
    }
    const uint64_t least = _mm512_reduce_min_epu64(best_d);
    const __mmask8 at =
        _mm512_cmpeq_epu64_mask(best_d, _mm512_set1_epi64(static_cast<long long>(least)));
    const int best = static_cast<int>(_mm512_mask_reduce_min_epu64(at, best_c));
    if (a[i] != best) ++changed, a[i] = best;
  }
  return changed;
}
// Bits 16 q .. 16 q + 15 of a code as a mask: +1 on those counters that it sets.
CLUSTR_TARGET_VPOPCNT void count_avx512(const uint64_t* codes, int64_t i0, int64_t i1,
                                        const int32_t* a, int32_t* counts) {
  const __m512i one = _mm512_set1_epi32(1);
  for (int64_t i = i0; i < i1; ++i) {
    int32_t* row = counts + static_cast<int64_t>(a[i]) * kCountRow;
    const uint64_t x = codes[i];
    for (int q = 0; q < 4; ++q) {
      const __mmask16 bits = static_cast<__mmask16>(x >> (16 * q));
      const __m512i r = _mm512_loadu_si512(row + 16 * q);
      _mm512_storeu_si512(row + 16 * q, _mm512_mask_add_epi32(r, bits, r, one));
    }
    ++row[64];
  }
}
#undef CLUSTR_TARGET_VPOPCNT
#pragma GCC diagnostic pop
#endif

const HammingKernel& hamming_kernel() {
  static const HammingKernel chosen = [] {
    std::vector<std::pair<HammingKernel, bool>> kernels;  // the kernel, whether this CPU has it
#ifdef CLUSTR_HAMMING_X86
    kernels.push_back({{"avx512", nearer_avx512, nearest_avx512, count_avx512},
                       __builtin_cpu_supports("avx512f") &&
                           __builtin_cpu_supports("avx512vpopcntdq")});
    kernels.push_back({{"popcnt", nearer_popcnt, nearest_popcnt, count_generic},
                       __builtin_cpu_supports("popcnt") != 0});
#endif
    kernels.push_back({{"generic", nearer_generic, nearest_generic, count_generic}, true});
    const char* forced = std::getenv("CLUSTR_HAMMING_KERNEL");
    if (forced && *forced) {
      std::string names;
      for (const auto& [k, has] : kernels) {
        if (std::strcmp(forced, k.name) != 0) {
          names += names.empty() ? k.name : std::string(", ") + k.name;
          continue;
        }
        CLUSTR_CHECK(has, "cluster_queries: CLUSTR_HAMMING_KERNEL=", forced,
                     " asks for a kernel this CPU does not support");
        return k;
      }
      throw Error(detail::cat("cluster_queries: CLUSTR_HAMMING_KERNEL=", forced,
                              " names an unknown kernel (known here: ", names, ")"));
    }
    for (const auto& [k, has] : kernels)
      if (has) return k;
    return kernels.back().first;
  }();
  return chosen;
}

uint64_t nearer(const uint64_t* codes, int64_t i0, int64_t i1, uint64_t c, bool first,
                int32_t* dist) {
  return hamming_kernel().nearer(codes, i0, i1, c, first, dist);
}

int64_t nearest(const uint64_t* codes, int64_t i0, int64_t i1, const uint64_t* centroids,
                int active, int32_t* a) {
  return hamming_kernel().nearest(codes, i0, i1, centroids, active, a);
}

// k-means++ seeding in Hamming distance (clustering.h); returns the number of seeded
// centroids, <= C. The d^2 weights are integers, so their sums are exact in any order; each
// chunk of kChunk queries keeps its own sum, so the draw is found by a walk over the chunk sums
// and then inside one chunk.
int seed_centroids(const uint64_t* codes, int64_t Nv, const Sizes& s, const Draws& r,
                   [[maybe_unused]] bool inner, int32_t* dist,
                   std::vector<uint64_t>& centroids) {
  const int64_t chunks = ceil_div(Nv, kChunk);
  std::vector<uint64_t> part(static_cast<size_t>(chunks));
  int64_t first = static_cast<int64_t>(draw_u64(r.seed, r.seed_base) % static_cast<uint64_t>(Nv));
  centroids[0] = codes[first];
  int seeded = 1;
  for (int j = 1; j < s.C; ++j) {
    const uint64_t c = centroids[static_cast<size_t>(j - 1)];
#pragma omp parallel for schedule(static) if (inner && Nv >= kSeedInnerMinNv)
    for (int64_t ch = 0; ch < chunks; ++ch)
      part[static_cast<size_t>(ch)] =
          nearer(codes, ch * kChunk, std::min(Nv, (ch + 1) * kChunk), c, j == 1, dist);
    uint64_t total = 0;
    for (uint64_t x : part) total += x;
    if (total == 0) break;  // every code is already a centroid
    uint64_t x = draw_u64(r.seed, r.seed_base + static_cast<uint64_t>(j)) % total;
    int64_t ch = 0;
    while (x >= part[static_cast<size_t>(ch)]) x -= part[static_cast<size_t>(ch++)];
    int64_t pick = ch * kChunk;
    for (uint64_t acc = 0;; ++pick) {
      acc += static_cast<uint64_t>(dist[pick] * dist[pick]);
      if (x < acc) break;
    }
    centroids[static_cast<size_t>(j)] = codes[pick];  // d > 0: a code not seeded before
    seeded = j + 1;
  }
  return seeded;
}

// Assign step: nearest of the `active` centroids, ties to the lowest index. Returns how many
// assignments changed.
int64_t assign(const uint64_t* codes, int64_t Nv, const std::vector<uint64_t>& centroids,
               int active, [[maybe_unused]] bool inner, int32_t* a) {
  const int64_t chunks = ceil_div(Nv, kChunk);
  int64_t changed = 0;
#pragma omp parallel for schedule(static) reduction(+ : changed) if (inner)
  for (int64_t ch = 0; ch < chunks; ++ch)
    changed += nearest(codes, ch * kChunk, std::min(Nv, (ch + 1) * kChunk), centroids.data(),
                       active, a);
  return changed;
}

// Update step: majority vote per bit, ties (and empty clusters) keep the previous bit. The
// members and the set bits of each cluster are integer counts, so each thread counts its own
// share of the queries (HammingKernel::count) and the shares are added in any order with the
// same result.
void update(const uint64_t* codes, int64_t Nv, const int32_t* a, const Sizes& s, int active,
            [[maybe_unused]] bool inner, std::vector<uint64_t>& centroids) {
  std::vector<int64_t> ones(static_cast<size_t>(active) * kCountRow, 0);
  const int64_t chunks = ceil_div(Nv, kChunk);
#pragma omp parallel if (inner)
  {
    std::vector<int32_t> mine(static_cast<size_t>(active) * kCountRow, 0);
#pragma omp for schedule(static) nowait
    for (int64_t ch = 0; ch < chunks; ++ch)
      hamming_kernel().count(codes, ch * kChunk, std::min(Nv, (ch + 1) * kChunk), a,
                             mine.data());
#pragma omp critical(clustr_update_counts)
    for (size_t x = 0; x < ones.size(); ++x) ones[x] += mine[x];
  }
  for (int c = 0; c < active; ++c) {
    const int64_t* row = ones.data() + static_cast<size_t>(c) * kCountRow;
    const int64_t m = row[64];
    uint64_t set = 0, clear = 0;  // without a branch, as in hash_queries
    for (int k = 0; k < s.bits; ++k) {
      set |= static_cast<uint64_t>(2 * row[k] > m) << k;
      clear |= static_cast<uint64_t>(2 * row[k] < m) << k;
    }
    uint64_t& cent = centroids[static_cast<size_t>(c)];
    cent = (cent | set) & ~clear;
  }
}

// One (b, h): q (N, E) with Nv valid rows -> a (N), counts (C), both overwritten.
void cluster_one(const float* q, int64_t Nv, const Sizes& s, const Draws& r, bool inner,
                 int32_t* a, int32_t* counts) {
  std::fill(a, a + s.N, -1);
  std::fill(counts, counts + s.C, 0);
  if (Nv == 0) return;
  Tensor codes_holder, dist_holder;
  uint64_t* codes = scratch_u64(codes_holder, Nv);
  hash_queries(q, Nv, s, r, inner, codes);
  std::vector<uint64_t> centroids(static_cast<size_t>(s.C), 0);
  dist_holder = Tensor::empty({Nv}, DType::i32);
  const int active = seed_centroids(codes, Nv, s, r, inner, dist_holder.i32(), centroids);
  dist_holder = Tensor();
  for (int round = 0;; ++round) {
    int64_t changed = assign(codes, Nv, centroids, active, inner, a);
    if (round == s.iterations || (round > 0 && changed == 0)) break;
    update(codes, Nv, a, s, active, inner, centroids);
  }
  for (int64_t i = 0; i < Nv; ++i) ++counts[a[i]];
}

Sizes check_inputs(const char* op, const Tensor& Q, const Tensor& lengths,
                   const ClusteringOptions& o) {
  detail::check_f32(op, "Q", Q);
  CLUSTR_CHECK(Q.rank() == 4, op, ": expected Q of shape (B, H, N, E), got ", describe(Q));
  Sizes s{Q.size(0), Q.size(1), Q.size(2), Q.size(3), o.clusters, o.bits, o.iterations};
  CLUSTR_CHECK(s.E >= 1, op, ": expected Q with E >= 1 (the last axis), got ", describe(Q));
  CLUSTR_CHECK(o.clusters >= 1, op, ": expected clusters >= 1, got ", o.clusters);
  CLUSTR_CHECK(o.bits >= 1 && o.bits <= 63, op, ": expected bits in [1, 63] (codes are 64-bit), got ",
               o.bits);
  CLUSTR_CHECK(o.iterations >= 0, op, ": expected iterations >= 0, got ", o.iterations);
  if (lengths.defined()) detail::check_lengths_deferrable(op, lengths, s.B, s.N, "N", "Q", Q);
  return s;
}

// The device path (cuda/clustering.h): hashing, seeding and Lloyd rounds as kernels, with the
// CPU's random stream (planes (bits, E) are the host's draw, copied; the thresholds' and the
// seeding's counters are the same blocks), so a seed gives the same clusters on both devices.
Clustering cluster_queries_cuda(const Tensor& Q, const Tensor& lengths, const Sizes& s,
                                const Tensor& planes_dev, const DeviceDraws& r) {
  const int64_t BH = s.B * s.H;
  const Device dev = Device::cuda;
  cuda::ClusteringDims d{s.B, s.H, s.N, s.E, s.C, s.bits, s.iterations};
  const int32_t* len_dev = lengths.defined() ? lengths.i32() : nullptr;
  Tensor codes_holder = Tensor::empty({2 * BH * s.N + 2}, DType::i32, dev);
  uint64_t* codes_dev = static_cast<uint64_t*>(codes_holder.raw());
  cuda::cluster_hash(d, Q.f32(), planes_dev.f32(), len_dev, r.seed, r.threshold_base, codes_dev);
  Tensor seeds_holder = Tensor::empty({2 * BH * s.C + 2}, DType::i32, dev);
  uint64_t* seeds_dev = static_cast<uint64_t*>(seeds_holder.raw());
  const Tensor active = Tensor::empty({BH}, DType::i32, dev);
  Clustering out;
  out.assignment = Tensor::empty({s.B, s.H, s.N}, DType::i32, dev);
  out.counts = Tensor::empty({s.B, s.H, s.C}, DType::i32, dev);
  cuda::cluster_seed_lloyd(d, codes_dev, len_dev, r.seed, r.seed_base, seeds_dev, active.i32(),
                           out.assignment.i32(), out.counts.i32());
  return out;
}

}  // namespace

const char* hamming_kernel_name() { return hamming_kernel().name; }

Clustering cluster_queries(const Tensor& Q, const Tensor& lengths,
                           const ClusteringOptions& options, Generator& gen) {
  const char* op = "cluster_queries";
  const Sizes s = check_inputs(op, Q, lengths, options);
  const int64_t BH = s.B * s.H;
  // The stream layout of clustering.h: planes, then thresholds, then seeding draws (on the
  // device as device draws, which a CUDA graph's replays draw again: core/random.h).
  if (Q.device() == Device::cuda) {
    const Tensor planes = normal_device({s.bits, s.E}, gen, Device::cuda);
    const uint64_t seed = gen.seed();
    const PhiloxOffset thresholds = reserve_device(gen, static_cast<uint64_t>(BH * s.bits));
    const PhiloxOffset seeds = reserve_device(gen, static_cast<uint64_t>(BH * s.C));
    return cluster_queries_cuda(Q, lengths, s, planes, {seed, thresholds, seeds});
  }
  Tensor planes = Tensor::empty({s.bits, s.E});
  normal_(planes, gen);
  Draws r{planes.f32(), gen.seed(), gen.reserve(static_cast<uint64_t>(BH * s.bits)),
          gen.reserve(static_cast<uint64_t>(BH * s.C))};
  hamming_kernel();  // chosen here: a bad CLUSTR_HAMMING_KERNEL throws outside the threads

  Clustering out;
  out.assignment = Tensor::empty({s.B, s.H, s.N}, DType::i32);
  out.counts = Tensor::empty({s.B, s.H, s.C}, DType::i32);
  const float* q = Q.f32();
  const int32_t* len = lengths.defined() ? lengths.i32() : nullptr;
  int32_t* a = out.assignment.i32();
  int32_t* counts = out.counts.i32();
  auto one = [&](int64_t bh, bool inner) {
    Draws d = r;
    d.threshold_base += static_cast<uint64_t>(bh * s.bits);
    d.seed_base += static_cast<uint64_t>(bh * s.C);
    const int64_t Nv = len ? len[bh / s.H] : s.N;
    cluster_one(q + bh * s.N * s.E, Nv, s, d, inner, a + bh * s.N, counts + bh * s.C);
  };
  if (BH >= num_threads() || s.N < kInnerMinN) {
#pragma omp parallel for schedule(dynamic)
    for (int64_t bh = 0; bh < BH; ++bh) one(bh, false);
  } else {
    for (int64_t bh = 0; bh < BH; ++bh) one(bh, true);
  }
  return out;
}

}  // namespace clustr
