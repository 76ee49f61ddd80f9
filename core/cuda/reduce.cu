// CUDA reductions over the middle axis of x viewed as (outer, len, inner); the twins of
// core/cpu/reduce.cpp. (Softmax and log-softmax: core/cuda/softmax.cu.)
//
// A reduction over the last axis (inner == 1) is one block per row:
// its threads stride over the row, each keeping a partial result, and block_reduce
// (core/cuda/kernel.h) combines the partials in a fixed tree. A reduction over another axis
// (inner > 1) gives a block 32 neighbouring outputs and up to 16 lanes over the axis, whose
// partials a fixed tree combines (ColumnReduceKernel). Sums accumulate in double, as on the
// CPU, so the two backends differ only in the order of double additions, which almost never
// changes the rounded float. Max and min use the NaN-propagating math::Maximum /
// math::Minimum and are exact. Argmax combines (value, index) pairs with the CPU's rule
// (math::argmax_beats), so it gives the CPU's index exactly.
#include <cmath>
#include <cstdint>

#include "core/cuda/argmax.h"
#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "core/math.h"

namespace clustr::cuda {

namespace {

// The op's partial result over the elements xr[l * stride] of this thread's share, and the
// combination of two partial results: sums in double, max and min in float.
template <class T>
struct Partial;
template <>
struct Partial<double> {
  CLUSTR_DEVICE static double init(ReduceOp) { return 0.0; }
  CLUSTR_DEVICE static double add(ReduceOp, double acc, float v) { return acc + v; }
  CLUSTR_DEVICE static double combine(ReduceOp, double a, double b) { return a + b; }
};
template <>
struct Partial<float> {
  CLUSTR_DEVICE static float init(ReduceOp op) { return op == ReduceOp::max ? -INFINITY : INFINITY; }
  CLUSTR_DEVICE static float add(ReduceOp op, float acc, float v) {
    return op == ReduceOp::max ? math::Maximum{}(acc, v) : math::Minimum{}(acc, v);
  }
  CLUSTR_DEVICE static float combine(ReduceOp op, float a, float b) { return add(op, a, b); }
};

CLUSTR_DEVICE float finish(ReduceOp op, double r, int64_t len) {
  return static_cast<float>(op == ReduceOp::mean ? r / static_cast<double>(len) : r);
}
CLUSTR_DEVICE float finish(ReduceOp, float r, int64_t) { return r; }

// inner == 1, a reduction over contiguous rows: y[o] = op over l of x[o, l]. One block per row;
// its threads stride over the row (coalesced) and block_reduce combines their partials.
template <class T>
struct RowReduceKernel {
  static constexpr bool kUsesBarrier = true;
  ReduceOp op;
  const float* x;
  float* y;
  int64_t rows, len;
  struct Combine {
    ReduceOp op;
    CLUSTR_DEVICE T operator()(T a, T b) const { return Partial<T>::combine(op, a, b); }
  };
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    for (int64_t r = t.block_idx().x; r < rows; r += t.grid_dim().x) {
      const float* xr = x + r * len;
      T acc = Partial<T>::init(op);
      for (int64_t l = tid; l < len; l += nt) acc = Partial<T>::add(op, acc, xr[l]);
      const T total = block_reduce(t, acc, t.shared<T>(), Combine{op});
      if (tid == 0) y[r] = finish(op, total, len);
    }
  }
};

// inner > 1, a reduction over a strided axis: y[o, i] = op over l of x[o, l, i]. A block takes
// kColumnTile neighbouring columns i of one o (threadIdx.x, so each row read is coalesced) and
// block_dim().y lanes over l (a power of two): lane r combines l = r, r + Y, r + 2Y, ... in
// order, its next four loads in flight before it adds them, and a fixed tree over the lanes in
// shared memory combines the lanes' partials. Blocks stride over the (o, tile) pairs. A thread
// per output looping over the whole axis, as before, left a bias gradient (2048 rows, 192 to
// 768 outputs) waiting on one load at a time: 0.45 ms on an H100, most of a copy-task step.
constexpr unsigned kColumnTile = 32;
inline unsigned column_lanes(int64_t len) {
  unsigned y = 1;
  while (y < 16 && y < len) y *= 2;
  return y;
}

template <class T>
struct ColumnReduceKernel {
  static constexpr bool kUsesBarrier = true;
  ReduceOp op;
  const float* x;
  float* y;
  int64_t outer, len, inner, tiles;  // tiles: ceil(inner / kColumnTile)
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned c = t.thread_idx().x, lane = t.thread_idx().y, lanes = t.block_dim().y;
    T* partial = t.shared<T>();  // (lanes, kColumnTile)
    for (int64_t b = t.block_idx().x; b < outer * tiles; b += t.grid_dim().x) {
      const int64_t o = b / tiles, i = (b - o * tiles) * kColumnTile + c;
      T acc = Partial<T>::init(op);
      if (i < inner) {
        const float* xc = x + o * len * inner + i;
        const int64_t step = static_cast<int64_t>(lanes) * inner;
        int64_t l = lane;
        for (; l + 3 * lanes < len; l += 4 * lanes) {
          const float* p = xc + l * inner;
          const float v0 = p[0], v1 = p[step], v2 = p[2 * step], v3 = p[3 * step];
          acc = Partial<T>::add(op, acc, v0);
          acc = Partial<T>::add(op, acc, v1);
          acc = Partial<T>::add(op, acc, v2);
          acc = Partial<T>::add(op, acc, v3);
        }
        for (; l < len; l += lanes) acc = Partial<T>::add(op, acc, xc[l * inner]);
      }
      partial[lane * kColumnTile + c] = acc;
      t.sync();
      for (unsigned s = lanes / 2; s > 0; s /= 2) {
        if (lane < s)
          partial[lane * kColumnTile + c] = Partial<T>::combine(
              op, partial[lane * kColumnTile + c], partial[(lane + s) * kColumnTile + c]);
        t.sync();
      }
      if (lane == 0 && i < inner) y[o * inner + i] = finish(op, partial[c], len);
      t.sync();  // the partials are read before the next tile's overwrite them
    }
  }
};

template <class T>
void launch_reduce(ReduceOp op, const float* x, float* y, int64_t outer, int64_t len,
                   int64_t inner) {
  if (inner == 1) {
    const unsigned threads = row_threads(len);
    launch("cuda::reduce (rows)", {row_blocks(outer)}, {threads}, threads * sizeof(T),
           RowReduceKernel<T>{op, x, y, outer, len});
  } else {
    const int64_t tiles = (inner + kColumnTile - 1) / kColumnTile;
    const unsigned lanes = column_lanes(len);
    launch("cuda::reduce (columns)", {row_blocks(outer * tiles)}, {kColumnTile, lanes},
           kColumnTile * lanes * sizeof(T),
           ColumnReduceKernel<T>{op, x, y, outer, len, inner, tiles});
  }
}

// inner == 1: y[o] = argmax over l of x[o, l]; one block per row (core/cuda/argmax.h).
struct RowArgmaxKernel {
  static constexpr bool kUsesBarrier = true;
  const float* x;
  int32_t* y;
  int64_t rows, len;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t r = t.block_idx().x; r < rows; r += t.grid_dim().x) {
      const int32_t best = block_argmax(t, x + r * len, len, t.shared<ArgmaxPartial>());
      if (t.thread_idx().x == 0) y[r] = best;
    }
  }
};

// inner > 1: y[o, i] = argmax over l of x[o, l, i]; one thread per output, scanning l in order
// exactly as the CPU does.
struct ColumnArgmaxKernel {
  static constexpr bool kUsesBarrier = false;
  const float* x;
  int32_t* y;
  int64_t outer, len, inner;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t out = global_x(t); out < outer * inner; out += grid_stride_x(t)) {
      const int64_t o = out / inner, i = out - o * inner;
      const float* xc = x + o * len * inner + i;
      float best = xc[0];
      int32_t at = 0;
      for (int64_t l = 1; l < len; ++l) {
        const float v = xc[l * inner];
        if (math::argmax_beats(v, best)) best = v, at = static_cast<int32_t>(l);
      }
      y[out] = at;
    }
  }
};

}  // namespace

void reduce(ReduceOp op, const float* x, float* y, int64_t outer, int64_t len, int64_t inner) {
  const int64_t outputs = outer * inner;
  if (outputs == 0) return;
  require("cuda::reduce");
  CLUSTR_CHECK(len > 0 || op == ReduceOp::sum, "cuda::reduce: an empty axis has no ",
               op == ReduceOp::max ? "max" : op == ReduceOp::min ? "min" : "mean");
  if (op == ReduceOp::sum || op == ReduceOp::mean)
    launch_reduce<double>(op, x, y, outer, len, inner);
  else
    launch_reduce<float>(op, x, y, outer, len, inner);
}

namespace {

struct AddInt64 {
  CLUSTR_HD int64_t operator()(int64_t a, int64_t b) const { return a + b; }
};

// One block: each thread counts its share, block_reduce adds the counts.
struct CountEqualKernel {
  static constexpr bool kUsesBarrier = true;
  const int32_t *a, *b;
  int32_t ignore;
  int64_t n;
  float* y;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    int64_t count = 0;
    for (int64_t i = t.thread_idx().x; i < n; i += t.block_dim().x)
      count += b[i] != ignore && a[i] == b[i] ? 1 : 0;
    count = block_reduce(t, count, t.shared<int64_t>(), AddInt64{});
    if (t.thread_idx().x == 0) *y = static_cast<float>(count);
  }
};

}  // namespace

void count_equal(const int32_t* a, const int32_t* b, int32_t ignore, int64_t n, float* y) {
  require("cuda::count_equal");
  const unsigned threads = 256;
  launch("cuda::count_equal", {1}, {threads}, threads * sizeof(int64_t),
         CountEqualKernel{a, b, ignore, n, y});
}

// x (outer, len, inner) -> y (outer, inner) i32, the first index of the maximum; len >= 1 and
// below 2^31 (checked by the front door).
void argmax(const float* x, int32_t* y, int64_t outer, int64_t len, int64_t inner) {
  if (outer * inner == 0) return;
  require("cuda::argmax");
  CLUSTR_CHECK(len > 0 && len < INT32_MAX, "cuda::argmax: expected an axis of 1 to ",
               INT32_MAX - 1, " elements, got ", len);
  if (inner == 1) {
    const unsigned threads = row_threads(len);
    launch("cuda::argmax (rows)", {row_blocks(outer)}, {threads}, threads * sizeof(ArgmaxPartial),
           RowArgmaxKernel{x, y, outer, len});
  } else {
    launch("cuda::argmax (columns)", {elementwise_blocks(outer * inner)}, {kElementwiseThreads}, 0,
           ColumnArgmaxKernel{x, y, outer, len, inner});
  }
}

}  // namespace clustr::cuda
