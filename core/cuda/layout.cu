// CUDA layout kernels: permute (4-byte words, so f32 and i32 alike), gather_rows and
// scatter_add_rows; the twins of core/cpu/layout.cpp.
//
// Legend: V table rows (vocabulary), D columns (model width), n indices; for a transpose M and
// N the sizes of the input's and the output's innermost axes.
//
// permute simplifies the problem as the CPU does (core/permute_plan.h). When the innermost axis
// stays innermost, every thread copies one element and both sides are read and written in
// contiguous runs. When it moves, a plain copy would read or write with a large stride, so each
// block transposes kTile x kTile tiles through shared memory: it reads a tile along the input's
// rows and writes it along the output's rows.
//
// scatter_add_rows is deterministic and adds in the CPU's order, without atomics: the indices
// are grouped by destination row on the device, stably (see the kernels below; nothing is read
// back, so a step that must not wait for the host can use it), and each destination row is
// then given to one block whose threads add, column by column, the source rows in index order.
// An element therefore receives the same float additions in the same order as on the CPU, so
// the two agree bit for bit and a run is reproducible; atomic_add would add repeated tokens in
// whatever order the threads arrive.
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/scratch.h"
#include "core/cuda/strided.h"
#include "core/error.h"
#include "core/permute_plan.h"
#include "core/shape.h"

namespace clustr::cuda {

namespace {

constexpr int kMaxRank = 8;  // axes left after simplification; more: an error that says so
constexpr unsigned kTile = 32;
constexpr unsigned kTileRows = 8;  // a block of kTile x kTileRows threads moves a tile

// y (n) = x read through the output's axes: y[i] = x[sum_d idx_d(i) * src[d]].
using PermuteKernel = StridedCopyKernel<kMaxRank>;

// The input's innermost axis (size M, input stride 1) lands on an output axis of stride dst_m;
// the output's innermost axis (size N, output stride 1) reads input stride src_n. The other
// output axes form the batch (sizes bshape, input strides bsrc, output strides bdst). Work item
// = (batch, M tile, N tile); each block loops over items, so the barriers are reached by every
// thread of it.
struct TransposeTilesKernel {
  static constexpr bool kUsesBarrier = true;
  const uint32_t* x;
  uint32_t* y;
  int64_t M, N, dst_m, src_n, tm, tn, items;
  int nb;
  int64_t bshape[kMaxRank], bsrc[kMaxRank], bdst[kMaxRank];
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    uint32_t* tile = t.shared<uint32_t>();  // kTile x (kTile + 1): the pad avoids bank conflicts
    const unsigned tx = t.thread_idx().x, ty = t.thread_idx().y, ny = t.block_dim().y;
    for (int64_t item = t.block_idx().x; item < items; item += t.grid_dim().x) {
      const int64_t m0 = (item / tn % tm) * kTile, n0 = (item % tn) * kTile;
      int64_t so = 0, doff = 0;
      for (int64_t rem = item / (tm * tn), d = nb - 1; d >= 0; --d) {
        const int64_t i = rem % bshape[d];
        rem /= bshape[d];
        so += i * bsrc[d];
        doff += i * bdst[d];
      }
      for (unsigned k = ty; k < kTile; k += ny) {  // input row n0 + k, along m
        const int64_t n = n0 + k, m = m0 + tx;
        if (n < N && m < M) tile[k * (kTile + 1) + tx] = x[so + n * src_n + m];
      }
      t.sync();
      for (unsigned k = ty; k < kTile; k += ny) {  // output row m0 + k, along n
        const int64_t m = m0 + k, n = n0 + tx;
        if (n < N && m < M) y[doff + m * dst_m + n] = tile[tx * (kTile + 1) + k];
      }
      t.sync();  // the tile is read before the next item overwrites it
    }
  }
};

// out (n, D) = table[index[i], :]; a row whose index is outside [0, V) (possible only when the
// front door's check was deferred to the device) is NaN, and nothing outside the table is read.
struct GatherRowsKernel {
  static constexpr bool kUsesBarrier = false;
  const float* table;
  int64_t V, D;
  const int32_t* index;
  int64_t n;
  const float* added;  // (P, D) or null
  int64_t P;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t e = global_x(t); e < n * D; e += grid_stride_x(t)) {
      const int64_t i = e / D, c = e - i * D;
      const int64_t v = index[i];
      const float x = v >= 0 && v < V ? table[v * D + c] : NAN;
      out[e] = added ? x + added[(i % P) * D + c] : x;
    }
  }
};

// scatter_add_rows groups the n indices by destination row on the device, stably (within a row
// in index order), in three launches, then adds:
//   1. count: the indices in chunks of kScatterChunk, a block per chunk. Each index's rank
//      among the equal indices before it in its chunk, and, written by the first of them, how
//      many the chunk holds: counts (V, chunks), row-major, so that
//   2. scan: one block's exclusive sum over counts in that order gives where each (row, chunk)
//      group starts, i.e. rows in order, and within a row the chunks in order;
//   3. place: order[start(row, chunk) + rank] = i;
//   4. add: a block per destination row adds its sources in order, as the CPU does.
// Indices outside [0, V) (a check deferred to the device) are left out.
constexpr int64_t kScatterChunk = 1024;
constexpr unsigned kScatterThreads = 256;

CLUSTR_DEVICE bool in_table(int32_t v, int64_t V) { return v >= 0 && v < V; }

struct ScatterCountKernel {
  static constexpr bool kUsesBarrier = true;
  const int32_t* index;
  int64_t n, V, chunks;
  int32_t* counts;  // (V, chunks)
  int32_t* rank;    // (n)
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    int32_t* keys = t.shared<int32_t>();  // kScatterChunk
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    for (int64_t c = t.block_idx().x; c < chunks; c += t.grid_dim().x) {
      const int64_t begin = c * kScatterChunk;
      const int64_t len = n - begin < kScatterChunk ? n - begin : kScatterChunk;
      for (int64_t v = tid; v < V; v += nt) counts[v * chunks + c] = 0;
      for (int64_t k = tid; k < len; k += nt) keys[k] = index[begin + k];
      t.sync();  // the zeros and the keys are in place for every thread of the block
      for (int64_t k = tid; k < len; k += nt) {
        const int32_t key = keys[k];
        if (!in_table(key, V)) continue;
        int32_t before = 0, total = 0;
        for (int64_t j = 0; j < len; ++j) {
          const int32_t same = keys[j] == key ? 1 : 0;
          before += j < k ? same : 0;
          total += same;
        }
        rank[begin + k] = before;
        if (before == 0) counts[key * chunks + c] = total;
      }
      t.sync();  // the keys are read before the next chunk overwrites them
    }
  }
};

// counts (m) -> their exclusive sums, in place, and counts[m] = the total. One block: each
// thread sums its contiguous span, the spans' sums are scanned, then each thread writes its
// span's.
struct ScatterScanKernel {
  static constexpr bool kUsesBarrier = true;
  int32_t* counts;
  int64_t m;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const Span s = block_span(t, m);
    int mine = 0;
    for (int64_t k = s.begin; k < s.end; ++k) mine += counts[k];
    int before = block_exclusive_sum(t, mine, t.shared<int>());
    for (int64_t k = s.begin; k < s.end; ++k) {
      const int c = counts[k];
      counts[k] = before;
      before += c;
    }
    if (t.thread_idx().x == t.block_dim().x - 1) counts[m] = before;
  }
};

struct ScatterPlaceKernel {
  static constexpr bool kUsesBarrier = false;
  const int32_t* index;
  const int32_t* starts;  // the scanned counts
  const int32_t* rank;
  int64_t n, V, chunks;
  int32_t* order;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) {
      const int32_t key = index[i];
      if (!in_table(key, V)) continue;
      order[starts[key * chunks + i / kScatterChunk] + rank[i]] = static_cast<int32_t>(i);
    }
  }
};

// table[v, c] += src[order[k], c] for k in row v's range of order, k increasing: the sources in
// index order. A block per row (rows without sources are skipped), its threads over the
// columns.
struct ScatterAddKernel {
  static constexpr bool kUsesBarrier = false;
  float* table;
  int64_t V, D, chunks;
  const float* src;
  const int32_t* starts;  // (V * chunks + 1)
  const int32_t* order;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t v = t.block_idx().x; v < V; v += t.grid_dim().x) {
      const int64_t begin = starts[v * chunks], end = starts[(v + 1) * chunks];
      if (begin == end) continue;
      float* dst = table + v * D;
      for (int64_t c = t.thread_idx().x; c < D; c += t.block_dim().x) {
        // In k order, as the CPU adds them; four rows' loads in flight before their additions
        // (a row that occurs thousands of times, as a small vocabulary's do, was otherwise one
        // load's latency per occurrence).
        float acc = dst[c];
        int64_t k = begin;
        for (; k + 3 < end; k += 4) {
          const float v0 = src[order[k] * D + c], v1 = src[order[k + 1] * D + c];
          const float v2 = src[order[k + 2] * D + c], v3 = src[order[k + 3] * D + c];
          acc += v0;
          acc += v1;
          acc += v2;
          acc += v3;
        }
        for (; k < end; ++k) acc += src[order[k] * D + c];
        dst[c] = acc;
      }
    }
  }
};

void check_rank(size_t r, int rank) {
  CLUSTR_CHECK(r <= static_cast<size_t>(kMaxRank), "cuda::permute: the permutation of rank ",
               rank, " does not reduce to ", kMaxRank, " or fewer axes (", r,
               " remain); permute in two steps");
}

}  // namespace

// x (in_shape) -> y (in_shape[perm[0]], ..., in_shape[perm[rank-1]]), 4-byte words.
void permute(const uint32_t* x, uint32_t* y, int rank, const int64_t* in_shape, const int* perm) {
  int64_t total = 1;
  for (int a = 0; a < rank; ++a) total *= in_shape[a];
  if (total == 0) return;
  require("cuda::permute");
  const detail::PermutePlan s = detail::simplify_permute(rank, in_shape, perm);
  const int r = static_cast<int>(s.shape.size());
  if (r <= 1) {  // the identity once simplified: one block
    copy_d2d(y, x, static_cast<size_t>(total) * sizeof(uint32_t));
    return;
  }
  check_rank(s.shape.size(), rank);
  // Per output axis: its size, its stride in the input, its stride in the output.
  const std::vector<int64_t> in_strides = contiguous_strides(s.shape);
  std::vector<int64_t> out_shape(r), src(r);
  for (int i = 0; i < r; ++i) out_shape[i] = s.shape[s.perm[i]], src[i] = in_strides[s.perm[i]];
  if (s.perm[r - 1] == r - 1) {
    PermuteKernel k{x, y, total, r, {}, {}};
    for (int i = 0; i < r; ++i) k.shape[i] = out_shape[i], k.stride[i] = src[i];
    launch("cuda::permute", {elementwise_blocks(total)}, {kElementwiseThreads}, 0, k);
    return;
  }
  const std::vector<int64_t> dst = contiguous_strides(out_shape);
  int kpos = 0;
  while (s.perm[kpos] != r - 1) ++kpos;
  TransposeTilesKernel k{x, y, out_shape[kpos], out_shape[r - 1], dst[kpos], src[r - 1],
                         0, 0, 0, 0, {}, {}, {}};
  for (int d = 0; d < r - 1; ++d) {
    if (d == kpos) continue;
    k.bshape[k.nb] = out_shape[d], k.bsrc[k.nb] = src[d], k.bdst[k.nb] = dst[d];
    ++k.nb;
  }
  k.tm = (k.M + kTile - 1) / kTile;
  k.tn = (k.N + kTile - 1) / kTile;
  k.items = total / (k.M * k.N) * k.tm * k.tn;
  const unsigned blocks = row_blocks(k.items);  // a tile per block, up to the block cap
  launch("cuda::permute (tiles)", {blocks}, {kTile, kTileRows},
         kTile * (kTile + 1) * sizeof(uint32_t), k);
}

// table (V, D), index (n) -> out (n, D) (=). Indices were checked by the front door (on the
// device, when deferred: a bad one gives a NaN row).
void gather_rows(const float* table, int64_t V, int64_t D, const int32_t* index, int64_t n,
                 const float* added, int64_t P, float* out) {
  if (n * D == 0) return;
  require("cuda::gather_rows");
  launch("cuda::gather_rows", {elementwise_blocks(n * D)}, {kElementwiseThreads}, 0,
         GatherRowsKernel{table, V, D, index, n, added, P, out});
}

// A small table's sums in one pass: a block per row v (threads over the columns) walks every
// index in order and adds the rows that point at v, from 0 (the CPU's order and bits).
struct ScatterSumScanKernel {
  static constexpr bool kUsesBarrier = false;
  float* table;
  int64_t V, D;
  const float* src;
  const int32_t* index;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t v = t.block_idx().x; v < V; v += t.grid_dim().x)
      for (int64_t c = t.thread_idx().x; c < D; c += t.block_dim().x) {
        float acc = 0.0f;
        for (int64_t i = 0; i < n; ++i)
          if (index[i] == v) acc += src[i * D + c];
        table[v * D + c] = acc;
      }
  }
};

// table (V, D) += rows of src (n, D) at index (n) (accumulated). Indices were checked by the
// front door (on the device, when deferred: a bad one is left out).
void scatter_add_rows(float* table, int64_t V, int64_t D, const int32_t* index, int64_t n,
                      const float* src) {
  if (n * D == 0) return;
  require("cuda::scatter_add_rows");
  CLUSTR_CHECK(n <= INT32_MAX && V <= INT32_MAX, "cuda::scatter_add_rows: ", n, " indices into ",
               V, " rows; at most ", INT32_MAX, " of each");
  const int64_t chunks = (n + kScatterChunk - 1) / kScatterChunk, m = V * chunks;
  // counts, then the starts (m + 1), rank (n), order (n).
  Scratch<int32_t> work(m + 1 + 2 * n);
  int32_t* const counts = work.get();
  int32_t* const rank = counts + m + 1;
  int32_t* const order = rank + n;
  launch("cuda::scatter_add_rows (count)", {row_blocks(chunks)}, {kScatterThreads},
         kScatterChunk * sizeof(int32_t), ScatterCountKernel{index, n, V, chunks, counts, rank});
  launch("cuda::scatter_add_rows (scan)", {1}, {1024}, 1024 * sizeof(int),
         ScatterScanKernel{counts, m});
  launch("cuda::scatter_add_rows (place)", {elementwise_blocks(n)}, {kElementwiseThreads}, 0,
         ScatterPlaceKernel{index, counts, rank, n, V, chunks, order});
  launch("cuda::scatter_add_rows (add)", {row_blocks(V)}, {row_threads(D)}, 0,
         ScatterAddKernel{table, V, D, chunks, src, counts, order});
}

void scatter_sum_rows(float* table, int64_t V, int64_t D, const int32_t* index, int64_t n,
                      const float* src) {
  if (V * D == 0) return;
  require("cuda::scatter_sum_rows");
  constexpr int64_t kScanLimit = int64_t{1} << 20;  // V n: the index reads of the one pass
  if (V * n > kScanLimit) {
    fill_f32(table, 0.0f, V * D);
    return scatter_add_rows(table, V, D, index, n, src);
  }
  launch("cuda::scatter_sum_rows", {row_blocks(V)}, {row_threads(D)}, 0,
         ScatterSumScanKernel{table, V, D, src, index, n});
}

}  // namespace clustr::cuda
