// CPU kernels of the shape ops. broadcast_to, slice and concat are copies and slice_add adds
// one source element to each destination element, so none of them can depend on the thread
// count. sum_to reduces with cpu::reduce, one axis group at a time, which sums every output
// element in a fixed order (see core/cpu/reduce.cpp).
#include "core/cpu/shape_ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu/kernels.h"

namespace clustr::cpu {

namespace {

constexpr int64_t kChunk = 16384;  // words per parallel work item
// Fewer words than this: stay serial. A copy is bound by memory, which one thread nearly
// saturates, while a parallel region's fork and join (waking the other thread) costs about as
// much as copying 100 KB; a layer's weights (D x D = 147 KB for D = 192) are copied serially.
constexpr int64_t kParallelMin = 262144;

// For r < rows, c < width: dst[r * dst_pitch + c] = src[r * src_pitch + c], or += with Add.
// The rows x width words are cut into chunks of kChunk words, so that one long row and many
// short ones are both shared among the threads.
template <bool Add, class T>
void rows_op(const T* src, int64_t src_pitch, T* dst, int64_t dst_pitch, int64_t rows,
             int64_t width) {
  const int64_t total = rows * width;
  if (total == 0) return;
  const int64_t items = (total + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t j1 = std::min(total, (item + 1) * kChunk);
    int64_t j = item * kChunk, r = j / width, c = j % width;
    while (j < j1) {
      const int64_t n = std::min(width - c, j1 - j);
      const T* s = src + r * src_pitch + c;
      T* d = dst + r * dst_pitch + c;
      if constexpr (Add) {
        for (int64_t k = 0; k < n; ++k) d[k] += s[k];
      } else {
        std::memcpy(d, s, static_cast<size_t>(n) * sizeof(T));
      }
      j += n;
      ++r;
      c = 0;
    }
  }
}

// Output axes with size-1 axes dropped and neighbours merged where x steps through them as one
// (x_stride[outer] == x_stride[inner] * size[inner]: contiguous runs and runs of 0-strides).
struct Collapsed {
  std::vector<int64_t> shape, stride;
};

Collapsed collapse(int rank, const int64_t* shape, const int64_t* stride) {
  Collapsed c;
  for (int i = 0; i < rank; ++i) {
    if (shape[i] == 1) continue;
    if (!c.shape.empty() && c.stride.back() == stride[i] * shape[i]) {
      c.shape.back() *= shape[i];
      c.stride.back() = stride[i];
    } else {
      c.shape.push_back(shape[i]);
      c.stride.push_back(stride[i]);
    }
  }
  return c;
}

// Runs of x's axes, size-1 axes dropped, neighbours of the same kind (kept or summed) merged.
struct Group {
  int64_t size;
  bool keep;
};

std::vector<Group> group_axes(int rank, const int64_t* shape, const uint8_t* keep) {
  std::vector<Group> g;
  for (int i = 0; i < rank; ++i) {
    if (shape[i] == 1) continue;
    const bool k = keep[i] != 0;
    if (!g.empty() && g.back().keep == k)
      g.back().size *= shape[i];
    else
      g.push_back({shape[i], k});
  }
  return g;
}

}  // namespace

// x (strided by x_strides) -> out (out_shape), row-major.
void broadcast_to(const uint32_t* x, const int64_t* x_strides, int rank, const int64_t* out_shape,
                  uint32_t* out) {
  int64_t total = 1;
  for (int a = 0; a < rank; ++a) total *= out_shape[a];
  if (total == 0) return;
  const Collapsed c = collapse(rank, out_shape, x_strides);
  if (c.shape.empty()) {  // one element
    out[0] = x[0];
    return;
  }
  // Output rows of L words, walked by an odometer over the collapsed axes 0..r-2.
  const int r = static_cast<int>(c.shape.size());
  const int64_t L = c.shape[r - 1], sL = c.stride[r - 1];
  const int64_t rows = total / L;
  const int64_t per_item = std::max<int64_t>(1, kChunk / L);
  const int64_t items = (rows + per_item - 1) / per_item;
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t r0 = item * per_item, r1 = std::min(rows, r0 + per_item);
    std::vector<int64_t> idx(static_cast<size_t>(r), 0);
    int64_t off = 0;
    for (int64_t rem = r0, d = r - 2; d >= 0; --d) {
      idx[d] = rem % c.shape[d];
      rem /= c.shape[d];
      off += idx[d] * c.stride[d];
    }
    for (int64_t row = r0; row < r1; ++row) {
      uint32_t* y = out + row * L;
      if (sL == 1)
        std::memcpy(y, x + off, static_cast<size_t>(L) * sizeof(uint32_t));
      else if (sL == 0)
        std::fill(y, y + L, x[off]);
      else
        for (int64_t j = 0; j < L; ++j) y[j] = x[off + j * sL];
      for (int d = r - 2; d >= 0; --d) {
        off += c.stride[d];
        if (++idx[d] < c.shape[d]) break;
        off -= c.stride[d] * c.shape[d];
        idx[d] = 0;
      }
    }
  }
}

// x (x_shape) -> y (x_shape with the summed axes set to 1). The summed axes form alternating
// groups with the kept ones; each group is one cpu::reduce over (outer, len, inner), innermost
// group first, through scratch buffers when there are several.
void sum_to(const float* x, int rank, const int64_t* x_shape, const uint8_t* keep, float* y) {
  int64_t total = 1, out_n = 1;
  for (int a = 0; a < rank; ++a) {
    total *= x_shape[a];
    if (keep[a]) out_n *= x_shape[a];
  }
  if (out_n == 0) return;
  if (total == 0) {  // a summed axis of size 0: every sum is empty
    std::fill(y, y + out_n, 0.0f);
    return;
  }
  std::vector<Group> g = group_axes(rank, x_shape, keep);
  const auto summed = std::count_if(g.begin(), g.end(), [](const Group& e) { return !e.keep; });
  if (summed == 0) {
    std::memcpy(y, x, static_cast<size_t>(total) * sizeof(float));
    return;
  }
  std::vector<float> scratch[2];
  const float* cur = x;
  for (int64_t stage = 0; stage < summed; ++stage) {
    size_t k = g.size() - 1;  // the innermost summed group
    while (g[k].keep) --k;
    int64_t outer = 1, inner = 1;
    for (size_t i = 0; i < k; ++i) outer *= g[i].size;
    for (size_t i = k + 1; i < g.size(); ++i) inner *= g[i].size;
    float* next = y;
    if (stage + 1 < summed) {
      std::vector<float>& buf = scratch[stage % 2];
      buf.resize(static_cast<size_t>(outer * inner));
      next = buf.data();
    }
    reduce(ReduceOp::sum, cur, next, outer, g[k].size, inner);
    cur = next;
    // Drop group k; its kept neighbours become one run.
    const auto at = g.begin() + static_cast<std::ptrdiff_t>(k);
    if (k > 0 && k + 1 < g.size()) {
      g[k - 1].size *= g[k + 1].size;
      g.erase(at, at + 2);
    } else {
      g.erase(at);
    }
  }
}

// x (outer, len, inner) -> y (outer, length, inner).
void slice(const uint32_t* x, int64_t outer, int64_t len, int64_t inner, int64_t start,
           int64_t length, uint32_t* y) {
  rows_op<false>(x + start * inner, len * inner, y, length * inner, outer, length * inner);
}

// dst (outer, len, inner)[:, start:start+length, :] += src (outer, length, inner).
void slice_add(float* dst, int64_t outer, int64_t len, int64_t inner, int64_t start,
               const float* src, int64_t length) {
  rows_op<true>(src, length * inner, dst + start * inner, len * inner, outer, length * inner);
}

// xs[k] (outer, lens[k], inner) -> y (outer, sum(lens), inner).
void concat(int n, const uint32_t* const* xs, const int64_t* lens, int64_t outer, int64_t inner,
            uint32_t* y) {
  int64_t L = 0;
  for (int k = 0; k < n; ++k) L += lens[k];
  int64_t off = 0;
  for (int k = 0; k < n; ++k) {
    rows_op<false>(xs[k], lens[k] * inner, y + off * inner, L * inner, outer, lens[k] * inner);
    off += lens[k];
  }
}

// x (outer, sum(lens), inner) -> ys[k] (outer, lens[k], inner), the non-null ones.
void split(const uint32_t* x, int64_t outer, int64_t inner, int n, const int64_t* lens,
           uint32_t* const* ys) {
  int64_t L = 0;
  for (int k = 0; k < n; ++k) L += lens[k];
  int64_t off = 0;
  for (int k = 0; k < n; ++k) {
    if (ys[k])
      rows_op<false>(x + off * inner, L * inner, ys[k], lens[k] * inner, outer, lens[k] * inner);
    off += lens[k];
  }
}

}  // namespace clustr::cpu
