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
// scatter_add_rows is deterministic and adds in the CPU's order, without atomics: the index is
// copied to the host (the front door has just copied it there for its range check; it is n
// numbers, small next to the n x D rows) and sorted by destination row, stably, and each
// destination row is then given to one block whose threads add, column by column, the source
// rows in index order. An element therefore receives the same float additions in the same order
// as on the CPU, so the two agree bit for bit and a run is reproducible; atomic_add would add
// repeated tokens in whatever order the threads arrive.
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

// out (n, D) = table[index[i], :].
struct GatherRowsKernel {
  static constexpr bool kUsesBarrier = false;
  const float* table;
  int64_t D;
  const int32_t* index;
  int64_t n;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t e = global_x(t); e < n * D; e += grid_stride_x(t)) {
      const int64_t i = e / D, c = e - i * D;
      out[e] = table[static_cast<int64_t>(index[i]) * D + c];
    }
  }
};

// For each touched destination row u (rows[u]): table[rows[u], c] += src[order[k], c] for k in
// [starts[u], starts[u + 1]), k increasing, i.e. the sources in index order. One block per row,
// its threads over the columns.
struct ScatterAddRowsKernel {
  static constexpr bool kUsesBarrier = false;
  float* table;
  int64_t D;
  const float* src;
  const int64_t* order;
  const int64_t* rows;
  const int64_t* starts;
  int64_t U;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t u = t.block_idx().x; u < U; u += t.grid_dim().x) {
      float* dst = table + rows[u] * D;
      for (int64_t c = t.thread_idx().x; c < D; c += t.block_dim().x) {
        // In k order, as the CPU adds them; four rows' loads in flight before their additions
        // (a row that occurs thousands of times, as a small vocabulary's do, was otherwise one
        // load's latency per occurrence).
        float acc = dst[c];
        const int64_t end = starts[u + 1];
        int64_t k = starts[u];
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

// table (V, D), index (n) -> out (n, D) (=). Indices were checked by the front door.
void gather_rows(const float* table, int64_t D, const int32_t* index, int64_t n, float* out) {
  if (n * D == 0) return;
  require("cuda::gather_rows");
  launch("cuda::gather_rows", {elementwise_blocks(n * D)}, {kElementwiseThreads}, 0,
         GatherRowsKernel{table, D, index, n, out});
}

// table (V, D) += rows of src (n, D) at index (n) (accumulated). Indices were checked by the
// front door.
void scatter_add_rows(float* table, int64_t V, int64_t D, const int32_t* index, int64_t n,
                      const float* src) {
  if (n * D == 0) return;
  require("cuda::scatter_add_rows");
  std::vector<int32_t> idx(static_cast<size_t>(n));
  copy_d2h(idx.data(), index, idx.size() * sizeof(int32_t));
  // A stable counting sort by destination row: order lists i by row, and by i within a row.
  std::vector<int64_t> next(static_cast<size_t>(V) + 1, 0);
  for (int32_t v : idx) ++next[static_cast<size_t>(v) + 1];
  for (int64_t v = 0; v < V; ++v) next[v + 1] += next[v];
  // plan = order (n), then the touched rows (U), then their starts in order (U + 1).
  std::vector<int64_t> plan(static_cast<size_t>(n));
  std::vector<int64_t> rows, starts;
  for (int64_t v = 0; v < V; ++v)
    if (next[v + 1] > next[v]) rows.push_back(v), starts.push_back(next[v]);
  starts.push_back(n);
  for (int64_t i = 0; i < n; ++i) plan[next[idx[i]]++] = i;
  const int64_t U = static_cast<int64_t>(rows.size());
  plan.insert(plan.end(), rows.begin(), rows.end());
  plan.insert(plan.end(), starts.begin(), starts.end());
  Scratch<int64_t> dplan(static_cast<int64_t>(plan.size()));
  copy_h2d(dplan.get(), plan.data(), plan.size() * sizeof(int64_t));
  const unsigned threads = row_threads(D);
  launch("cuda::scatter_add_rows", {row_blocks(U)}, {threads}, 0,
         ScatterAddRowsKernel{table, D, src, dplan.get(), dplan.get() + n, dplan.get() + n + U,
                              U});
}

}  // namespace clustr::cuda
