// CUDA kernels of the shape ops (broadcast_to, sum_to, slice, slice_add, concat); the twins of
// core/cpu/shape_ops.cpp, same arguments (device pointers). Copies move 4-byte words, so the
// same kernel serves f32 and i32.
//
// The axis ops view a tensor around `axis` as (outer, len, inner):
//   outer = prod(shape[:axis]), len = shape[axis], inner = prod(shape[axis+1:]).
// slice, slice_add and concat are copies (or adds) of `rows` runs of `width` words between two
// pitches: one thread per word, each written by one thread, so the result is the CPU's bit for
// bit. sum_to runs cuda::reduce over the same stages as cpu::sum_to.
#include <cstdint>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/scratch.h"
#include "core/cuda/strided.h"
#include "core/error.h"

namespace clustr::cuda {

namespace {

constexpr int kMaxRank = 8;  // axes left after collapsing; more: an error that says so

// dst[r * dst_pitch + c] = (or +=, with Add) src[r * src_pitch + c], r < rows, c < width.
template <class T, bool Add>
struct RowsKernel {
  static constexpr bool kUsesBarrier = false;
  const T* src;
  int64_t src_pitch;
  T* dst;
  int64_t dst_pitch, rows, width;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t e = global_x(t); e < rows * width; e += grid_stride_x(t)) {
      const int64_t r = e / width, c = e - r * width;
      if (Add)
        dst[r * dst_pitch + c] += src[r * src_pitch + c];
      else
        dst[r * dst_pitch + c] = src[r * src_pitch + c];
    }
  }
};

template <bool Add, class T>
void rows_op(const char* name, const T* src, int64_t src_pitch, T* dst, int64_t dst_pitch,
             int64_t rows, int64_t width) {
  const int64_t total = rows * width;
  if (total == 0) return;
  launch(name, {elementwise_blocks(total)}, {kElementwiseThreads}, 0,
         RowsKernel<T, Add>{src, src_pitch, dst, dst_pitch, rows, width});
}

// out (n) = x read through the output's axes with strides (0 repeats x along an axis).
using BroadcastKernel = StridedCopyKernel<kMaxRank>;

// Runs of x's axes, size-1 axes dropped, neighbours of the same kind (kept or summed) merged:
// the stages of cpu::sum_to.
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

// x (strided by x_strides) -> out (out_shape), row-major. Output axes of size 1 are dropped and
// neighbours merged where x steps through them as one, as on the CPU.
void broadcast_to(const uint32_t* x, const int64_t* x_strides, int rank, const int64_t* out_shape,
                  uint32_t* out) {
  int64_t total = 1;
  for (int a = 0; a < rank; ++a) total *= out_shape[a];
  if (total == 0) return;
  require("cuda::broadcast_to");
  std::vector<int64_t> shape, stride;
  for (int i = 0; i < rank; ++i) {
    if (out_shape[i] == 1) continue;
    if (!shape.empty() && stride.back() == x_strides[i] * out_shape[i]) {
      shape.back() *= out_shape[i];
      stride.back() = x_strides[i];
    } else {
      shape.push_back(out_shape[i]);
      stride.push_back(x_strides[i]);
    }
  }
  CLUSTR_CHECK(shape.size() <= static_cast<size_t>(kMaxRank), "cuda::broadcast_to: the "
               "broadcast of rank ", rank, " does not reduce to ", kMaxRank, " or fewer axes (",
               shape.size(), " remain); reshape first");
  BroadcastKernel k{x, out, total, static_cast<int>(shape.size()), {}, {}};
  for (size_t i = 0; i < shape.size(); ++i) k.shape[i] = shape[i], k.stride[i] = stride[i];
  launch("cuda::broadcast_to", {elementwise_blocks(total)}, {kElementwiseThreads}, 0, k);
}

// x (x_shape) -> y (x_shape with the summed axes set to 1) (=). The summed axes form
// alternating groups with the kept ones; each group is one cuda::reduce over (outer, len,
// inner), innermost group first, through scratch buffers when there are several.
void sum_to(const float* x, int rank, const int64_t* x_shape, const uint8_t* keep, float* y) {
  int64_t total = 1, out_n = 1;
  for (int a = 0; a < rank; ++a) {
    total *= x_shape[a];
    if (keep[a]) out_n *= x_shape[a];
  }
  if (out_n == 0) return;
  require("cuda::sum_to");
  if (total == 0) {  // a summed axis of size 0: every sum is empty
    fill_f32(y, 0.0f, out_n);
    return;
  }
  std::vector<Group> g = group_axes(rank, x_shape, keep);
  int64_t summed = 0;
  for (const Group& e : g) summed += e.keep ? 0 : 1;
  if (summed == 0) {
    copy_d2d(y, x, static_cast<size_t>(total) * sizeof(float));
    return;
  }
  // Each stage's output is smaller than its input (the summed group has more than one
  // element), so two buffers of the first stage's output size hold every intermediate.
  int64_t first_out = 1;
  {
    size_t k = g.size() - 1;
    while (g[k].keep) --k;
    first_out = total / g[k].size;
  }
  Scratch<float> buf0(summed > 1 ? first_out : 0), buf1(summed > 2 ? first_out : 0);
  float* bufs[2] = {buf0.get(), buf1.get()};
  const float* cur = x;
  for (int64_t stage = 0; stage < summed; ++stage) {
    size_t k = g.size() - 1;  // the innermost summed group
    while (g[k].keep) --k;
    int64_t outer = 1, inner = 1;
    for (size_t i = 0; i < k; ++i) outer *= g[i].size;
    for (size_t i = k + 1; i < g.size(); ++i) inner *= g[i].size;
    float* next = stage + 1 < summed ? bufs[stage % 2] : y;
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

// x (outer, len, inner) -> y (outer, length, inner) (=).
void slice(const uint32_t* x, int64_t outer, int64_t len, int64_t inner, int64_t start,
           int64_t length, uint32_t* y) {
  require("cuda::slice");
  rows_op<false>("cuda::slice", x + start * inner, len * inner, y, length * inner, outer,
                 length * inner);
}

// dst (outer, len, inner)[:, start:start+length, :] += src (outer, length, inner).
void slice_add(float* dst, int64_t outer, int64_t len, int64_t inner, int64_t start,
               const float* src, int64_t length) {
  require("cuda::slice_add");
  rows_op<true>("cuda::slice_add", src, length * inner, dst + start * inner, len * inner, outer,
                length * inner);
}

namespace {

// Up to kPieces pieces of an axis in one launch (concat and split): piece k holds columns
// [begin[k], begin[k + 1]) of the group's `width` columns of each of the `rows` rows of the
// whole (its rows `pitch` words apart, the group starting at `whole`), and is itself (rows,
// begin[k + 1] - begin[k]). One thread per word of the group, each word written by one thread:
// the result is the CPU's bit for bit.
constexpr int kPieces = 8;
struct Pieces {
  uint32_t* ptr[kPieces];  // split: null for a piece not wanted
  int64_t begin[kPieces + 1];
  int n;
};

template <bool Split>
struct PiecesKernel {
  static constexpr bool kUsesBarrier = false;
  Pieces p;
  uint32_t* whole;
  int64_t pitch, rows, width;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t e = global_x(t); e < rows * width; e += grid_stride_x(t)) {
      const int64_t r = e / width, c = e - r * width;
      int k = 0;
      while (k + 1 < p.n && c >= p.begin[k + 1]) ++k;
      const int64_t w = p.begin[k + 1] - p.begin[k];
      uint32_t* piece = p.ptr[k];
      if (Split) {
        if (piece) piece[r * w + (c - p.begin[k])] = whole[r * pitch + c];
      } else {
        whole[r * pitch + c] = piece[r * w + (c - p.begin[k])];
      }
    }
  }
};

// The n pieces of ptrs (lens along the axis) and the whole (outer, sum(lens), inner), in
// launches of kPieces pieces.
template <bool Split>
void pieces_op(const char* name, int n, uint32_t* const* ptrs, const int64_t* lens, int64_t outer,
               int64_t inner, uint32_t* whole) {
  int64_t L = 0;
  for (int k = 0; k < n; ++k) L += lens[k];
  const int64_t width = L * inner;
  if (outer * width == 0) return;
  int64_t off = 0;
  for (int first = 0; first < n; first += kPieces) {
    Pieces p{};
    p.n = n - first < kPieces ? n - first : kPieces;
    p.begin[0] = 0;
    for (int k = 0; k < p.n; ++k) {
      p.ptr[k] = ptrs[first + k];
      p.begin[k + 1] = p.begin[k] + lens[first + k] * inner;
    }
    // The group's columns [off, off + group) of each row of the whole.
    const int64_t group = p.begin[p.n];
    if (group > 0)
      launch(name, {elementwise_blocks(outer * group)}, {kElementwiseThreads}, 0,
             PiecesKernel<Split>{p, whole + off, width, outer, group});
    off += group;
  }
}

}  // namespace

// xs[k] (outer, lens[k], inner) -> y (outer, sum(lens), inner) (=); xs is a host array of n
// device pointers; one launch per 8 pieces.
void concat(int n, const uint32_t* const* xs, const int64_t* lens, int64_t outer, int64_t inner,
            uint32_t* y) {
  require("cuda::concat");
  std::vector<uint32_t*> ptrs(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) ptrs[k] = const_cast<uint32_t*>(xs[k]);  // read only
  pieces_op<false>("cuda::concat", n, ptrs.data(), lens, outer, inner, y);
}

// x (outer, sum(lens), inner) -> ys[k] (outer, lens[k], inner) (=) for the non-null ys[k]; one
// launch per 8 pieces.
void split(const uint32_t* x, int64_t outer, int64_t inner, int n, const int64_t* lens,
           uint32_t* const* ys) {
  require("cuda::split");
  pieces_op<true>("cuda::split", n, ys, lens, outer, inner, const_cast<uint32_t*>(x));
}

}  // namespace clustr::cuda
