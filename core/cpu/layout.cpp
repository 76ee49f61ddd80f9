// CPU layout kernels: permute (4-byte words, so f32 and i32 alike), gather_rows and
// scatter_add_rows. Permute and gather are copies, so their results cannot depend on the thread
// count; scatter_add gives every destination element to one thread, which adds the sources in
// index order.
#include <algorithm>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/cpu/kernels.h"
#include "core/permute_plan.h"

namespace clustr::cpu {

namespace {

constexpr int64_t kChunk = 16384;        // words per parallel work item
constexpr int64_t kParallelMin = 32768;  // fewer words than this: stay serial
constexpr int64_t kTile = 64;            // transpose tile: 64 x 64 words = 16 KiB, half of L1

// The output's innermost axis is the input's: copy contiguous blocks of L words. Output axes
// 0..r-2 are walked by an odometer with the input strides `src`.
void copy_blocks(const uint32_t* x, uint32_t* y, const std::vector<int64_t>& out_shape,
                 const std::vector<int64_t>& src, int64_t total) {
  const int r = static_cast<int>(out_shape.size());
  const int64_t L = out_shape[r - 1];
  const int64_t blocks = total / L;
  const int64_t per_item = std::max<int64_t>(1, kChunk / L);
  const int64_t items = (blocks + per_item - 1) / per_item;
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t b0 = item * per_item, b1 = std::min(blocks, b0 + per_item);
    std::vector<int64_t> idx(static_cast<size_t>(r), 0);
    int64_t off = 0;
    for (int64_t rem = b0, d = r - 2; d >= 0; --d) {
      idx[d] = rem % out_shape[d];
      rem /= out_shape[d];
      off += idx[d] * src[d];
    }
    for (int64_t b = b0; b < b1; ++b) {
      std::memcpy(y + b * L, x + off, static_cast<size_t>(L) * sizeof(uint32_t));
      for (int d = r - 2; d >= 0; --d) {
        off += src[d];
        if (++idx[d] < out_shape[d]) break;
        off -= src[d] * out_shape[d];
        idx[d] = 0;
      }
    }
  }
}

// The input's innermost axis (size M, input stride 1) lands on output axis k (stride dst_m);
// the output's innermost axis (size N, output stride 1) reads input stride src_n. Each
// (batch, M-tile, N-tile) is a small transpose that stays in L1; the other output axes form
// the batch, with input strides bsrc and output strides bdst.
void copy_tiles(const uint32_t* x, uint32_t* y, const std::vector<int64_t>& out_shape,
                const std::vector<int64_t>& src, const std::vector<int64_t>& dst, int k,
                int64_t total) {
  const int r = static_cast<int>(out_shape.size());
  const int64_t M = out_shape[k], N = out_shape[r - 1], dst_m = dst[k], src_n = src[r - 1];
  std::vector<int64_t> bshape, bsrc, bdst;
  for (int d = 0; d < r - 1; ++d)
    if (d != k) bshape.push_back(out_shape[d]), bsrc.push_back(src[d]), bdst.push_back(dst[d]);
  const int nb = static_cast<int>(bshape.size());
  const int64_t tm = (M + kTile - 1) / kTile, tn = (N + kTile - 1) / kTile;
  const int64_t items = total / (M * N) * tm * tn;
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t m0 = (item / tn % tm) * kTile, n0 = (item % tn) * kTile;
    const int64_t m1 = std::min(M, m0 + kTile), n1 = std::min(N, n0 + kTile);
    int64_t so = 0, doff = 0;
    for (int64_t rem = item / (tm * tn), d = nb - 1; d >= 0; --d) {
      const int64_t i = rem % bshape[d];
      rem /= bshape[d];
      so += i * bsrc[d];
      doff += i * bdst[d];
    }
    // Staged through buf so that every source and destination cache line is used in one go:
    // reading a column straight from x would keep kTile lines live whose addresses differ by
    // the row pitch, and with a power-of-two pitch they all fall in one L1 set and evict each
    // other (4096 x 1024 transposes ran 4x slower than 1000 x 1000 per element).
    uint32_t buf[kTile][kTile];
    for (int64_t n = n0; n < n1; ++n) {
      const uint32_t* xs = x + so + n * src_n;
      for (int64_t m = m0; m < m1; ++m) buf[n - n0][m - m0] = xs[m];
    }
    for (int64_t m = m0; m < m1; ++m) {
      uint32_t* yd = y + doff + m * dst_m;
      for (int64_t n = n0; n < n1; ++n) yd[n] = buf[n - n0][m - m0];
    }
  }
}

}  // namespace

// x (in_shape) -> y (in_shape[perm[0]], ..., in_shape[perm[rank-1]]), 4-byte words.
void permute(const uint32_t* x, uint32_t* y, int rank, const int64_t* in_shape, const int* perm) {
  int64_t total = 1;
  for (int a = 0; a < rank; ++a) total *= in_shape[a];
  if (total == 0) return;
  const detail::PermutePlan s = detail::simplify_permute(rank, in_shape, perm);
  const int r = static_cast<int>(s.shape.size());
  if (r <= 1) {  // the identity once simplified: one block
    std::memcpy(y, x, static_cast<size_t>(total) * sizeof(uint32_t));
    return;
  }
  // Per output axis: its size, its stride in the input, its stride in the output.
  const std::vector<int64_t> in_strides = contiguous_strides(s.shape);
  std::vector<int64_t> out_shape(r), src(r);
  for (int i = 0; i < r; ++i) out_shape[i] = s.shape[s.perm[i]], src[i] = in_strides[s.perm[i]];
  if (s.perm[r - 1] == r - 1) return copy_blocks(x, y, out_shape, src, total);
  const std::vector<int64_t> dst = contiguous_strides(out_shape);
  const int k = static_cast<int>(std::find(s.perm.begin(), s.perm.end(), r - 1) - s.perm.begin());
  copy_tiles(x, y, out_shape, src, dst, k, total);
}

// table (V, D), index (n) -> out (n, D), plus added[i mod P] (P, D) when added is not null.
// Indices were checked by the front door.
void gather_rows(const float* table, int64_t D, const int32_t* index, int64_t n,
                 const float* added, int64_t P, float* out) {
#pragma omp parallel for schedule(static) if (n * D >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float* row = table + static_cast<int64_t>(index[i]) * D;
    float* y = out + i * D;
    if (added == nullptr) {
      std::memcpy(y, row, static_cast<size_t>(D) * sizeof(float));
      continue;
    }
    const float* a = added + (i % P) * D;
    for (int64_t c = 0; c < D; ++c) y[c] = row[c] + a[c];
  }
}

// table (V, D) += rows of src (n, D) at index (n). Repeated indices are the point (a token that
// occurs twice gets both gradients), so threads cannot each take a range of i. Instead each
// thread owns a range of destination rows (or, when there are fewer rows than threads, of
// columns), scans every index in order and adds the ones it owns: no two threads write the
// same element, and each element receives its sources in index order whatever the thread count.
void scatter_add_rows(float* table, int64_t V, int64_t D, const int32_t* index, int64_t n,
                      const float* src) {
  [[maybe_unused]] const bool parallel = n * D >= kParallelMin;
#pragma omp parallel if (parallel)
  {
    int64_t t = 0, T = 1;
#ifdef _OPENMP
    t = omp_get_thread_num();
    T = omp_get_num_threads();
#endif
    const bool by_rows = V >= T;
    const int64_t extent = by_rows ? V : D;
    const int64_t lo = extent * t / T, hi = extent * (t + 1) / T;
    const int64_t c0 = by_rows ? 0 : lo, c1 = by_rows ? D : hi;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = index[i];
      if (by_rows && (row < lo || row >= hi)) continue;
      float* dst = table + row * D;
      const float* s = src + i * D;
      for (int64_t c = c0; c < c1; ++c) dst[c] += s[c];
    }
  }
}

}  // namespace clustr::cpu
