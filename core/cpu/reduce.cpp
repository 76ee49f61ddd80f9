// CPU reductions over the middle axis of x viewed as (outer, len, inner).
//
// Determinism: every output element is reduced by one thread in a fixed order, or, for a few
// very long rows, as fixed-size blocks whose partial results are combined in block order. The
// block size is a constant, so the serial and the parallel path do the same floating-point
// operations and the result does not depend on the thread count.
//
// Sums accumulate in double: a float running sum over 10^6 elements loses about three
// significant digits, and the cost is hidden behind the memory traffic.
//
// Sums over a long middle axis with few outputs (a bias gradient: (1, R, D) -> (D)) cut that
// axis into blocks of kRowBlock, so that every thread gets work; the blocks' partial sums are
// added in block order. The tile sum is compiled for AVX-512, AVX2 and plain x86-64
// (target_clones), the same additions in the same order in each.
#include <algorithm>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/cpu/kernels.h"
#include "core/cpu/row_clones.h"
#include "core/math.h"

namespace clustr::cpu {

namespace {

constexpr int kLanes = 8;              // independent accumulators in a row sum (ILP, SIMD)
constexpr int64_t kBlock = 4096;       // elements per partial result of a contiguous row
constexpr int64_t kInnerTile = 64;     // output columns reduced together when inner > 1
constexpr int64_t kRowBlock = 256;     // rows of the middle axis per partial sum when inner > 1
constexpr int64_t kParallelMin = 32768;  // fewer input elements than this: stay serial

int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// max or min (f = math::Maximum or Minimum) of x[0..n), n >= 1, in kLanes independent
// lanes: one running extreme would be a chain of dependent compare-and-selects.
template <class F>
float lanes_extreme(F f, const float* x, int64_t n) {
  float m[kLanes];
  for (int k = 0; k < kLanes; ++k) m[k] = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) m[k] = f(m[k], x[i + k]);
  for (; i < n; ++i) m[0] = f(m[0], x[i]);
  for (int k = 1; k < kLanes; ++k) m[0] = f(m[0], m[k]);
  return m[0];
}

// Reduction of x[0..n), n <= kBlock, in a fixed order. For sum: kLanes running sums combined
// pairwise; for max/min the order does not matter except that any NaN wins.
double block_reduce(ReduceOp op, const float* x, int64_t n) {
  if (op == ReduceOp::max) return lanes_extreme(math::Maximum{}, x, n);
  if (op == ReduceOp::min) return lanes_extreme(math::Minimum{}, x, n);
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += x[i + k];
  for (int k = 0; i < n; ++i, ++k) acc[k] += x[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Folds block partial b into the running result r.
double combine(ReduceOp op, double r, double b) {
  if (op == ReduceOp::max) return math::Maximum{}(static_cast<float>(r), static_cast<float>(b));
  if (op == ReduceOp::min) return math::Minimum{}(static_cast<float>(r), static_cast<float>(b));
  return r + b;
}

// Reduction of a contiguous row x[0..len) (len >= 1 for max/min): blocks of kBlock, combined in
// order. With `parallel`, the blocks are reduced by all threads; the result is bit-identical.
double row_reduce(ReduceOp op, const float* x, int64_t len, bool parallel) {
  if (len == 0) return 0.0;  // sum of nothing; the front door rejects the other ops
  const int64_t blocks = (len + kBlock - 1) / kBlock;
  auto block = [&](int64_t b) {
    return block_reduce(op, x + b * kBlock, std::min(kBlock, len - b * kBlock));
  };
  double r = 0.0;
  if (!parallel) {
    r = block(0);
    for (int64_t b = 1; b < blocks; ++b) r = combine(op, r, block(b));
    return r;
  }
  std::vector<double> part(static_cast<size_t>(blocks));
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) part[b] = block(b);
  r = part[0];
  for (int64_t b = 1; b < blocks; ++b) r = combine(op, r, part[b]);
  return r;
}

float finish(ReduceOp op, double r, int64_t len) {
  return static_cast<float>(op == ReduceOp::mean ? r / static_cast<double>(len) : r);
}

// acc[j] = sum over l < len of x[l * inner + j], j < w (w <= kInnerTile), in double.
CLUSTR_ROW_CLONES
void tile_sum(const float* x, int64_t len, int64_t inner, int64_t w, double* acc) {
  for (int64_t j = 0; j < w; ++j) acc[j] = 0.0;
  for (int64_t l = 0; l < len; ++l)
    for (int64_t j = 0; j < w; ++j) acc[j] += x[l * inner + j];
}

// inner > 1: y[o, i0 .. i0+w) reduced over l, tile by tile, so that each step reads w
// consecutive floats of one (o, l) row instead of striding by inner.
void reduce_strided(ReduceOp op, const float* x, float* y, int64_t outer, int64_t len,
                    int64_t inner) {
  const int64_t tiles = (inner + kInnerTile - 1) / kInnerTile;
  [[maybe_unused]] const bool parallel = outer * len * inner >= kParallelMin;
  if (op == ReduceOp::sum || op == ReduceOp::mean) {
    // Task (o, tile, block) sums rows [block * kRowBlock, ...) of its tile into its partial.
    const int64_t blocks = std::max<int64_t>(1, (len + kRowBlock - 1) / kRowBlock);
    std::vector<double> partial(static_cast<size_t>(outer * tiles * blocks * kInnerTile));
#pragma omp parallel if (parallel)
    {
#pragma omp for schedule(static)
      for (int64_t t = 0; t < outer * tiles * blocks; ++t) {
        const int64_t o = t / (tiles * blocks), tile = t / blocks % tiles, blk = t % blocks;
        const int64_t i0 = tile * kInnerTile, l0 = blk * kRowBlock;
        tile_sum(x + (o * len + l0) * inner + i0, std::min(kRowBlock, len - l0), inner,
                 std::min(kInnerTile, inner - i0), partial.data() + t * kInnerTile);
      }
#pragma omp for schedule(static)
      for (int64_t t = 0; t < outer * tiles; ++t) {
        const int64_t i0 = (t % tiles) * kInnerTile, w = std::min(kInnerTile, inner - i0);
        const double* p = partial.data() + t * blocks * kInnerTile;
        for (int64_t j = 0; j < w; ++j) {
          double acc = p[j];
          for (int64_t blk = 1; blk < blocks; ++blk) acc += p[blk * kInnerTile + j];
          y[(t / tiles) * inner + i0 + j] = finish(op, acc, len);
        }
      }
    }
    return;
  }
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < outer * tiles; ++t) {
    const int64_t o = t / tiles, i0 = (t % tiles) * kInnerTile;
    const int64_t w = std::min(kInnerTile, inner - i0);
    const float* xo = x + o * len * inner + i0;
    float* yo = y + o * inner + i0;
    float m[kInnerTile];
    for (int64_t j = 0; j < w; ++j) m[j] = xo[j];
    for (int64_t l = 1; l < len; ++l) {
      const float* xl = xo + l * inner;
      if (op == ReduceOp::max)
        for (int64_t j = 0; j < w; ++j) m[j] = math::Maximum{}(m[j], xl[j]);
      else
        for (int64_t j = 0; j < w; ++j) m[j] = math::Minimum{}(m[j], xl[j]);
    }
    for (int64_t j = 0; j < w; ++j) yo[j] = m[j];
  }
}

// Argmax update (math::argmax_beats, shared with the CUDA kernel).
inline bool beats(float v, float best) { return math::argmax_beats(v, best); }

}  // namespace

// x (outer, len, inner) -> y (outer, inner). len may be 0 only for sum (gives 0).
void reduce(ReduceOp op, const float* x, float* y, int64_t outer, int64_t len, int64_t inner) {
  if (outer == 0 || inner == 0) return;
  if (inner > 1) return reduce_strided(op, x, y, outer, len, inner);
  // Contiguous rows. Few long rows: split each row into blocks across threads; otherwise one
  // thread per row. Both paths give the same bits (see row_reduce).
  const bool big = outer * len >= kParallelMin;
  if (big && outer < max_threads() && len >= 2 * kBlock) {
    for (int64_t o = 0; o < outer; ++o)
      y[o] = finish(op, row_reduce(op, x + o * len, len, true), len);
    return;
  }
#pragma omp parallel for schedule(static) if (big)
  for (int64_t o = 0; o < outer; ++o)
    y[o] = finish(op, row_reduce(op, x + o * len, len, false), len);
}

// x (outer, len, inner) -> y (outer, inner) i32: the first index of the maximum; len >= 1.
void count_equal(const int32_t* a, const int32_t* b, int32_t ignore, int64_t n, float* y) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += b[i] != ignore && a[i] == b[i];
  *y = static_cast<float>(count);
}

void argmax(const float* x, int32_t* y, int64_t outer, int64_t len, int64_t inner) {
  if (outer == 0 || inner == 0) return;
  const int64_t tiles = (inner + kInnerTile - 1) / kInnerTile;
#pragma omp parallel for schedule(static) if (outer * len * inner >= kParallelMin)
  for (int64_t t = 0; t < outer * tiles; ++t) {
    const int64_t o = t / tiles, i0 = (t % tiles) * kInnerTile;
    const int64_t w = std::min(kInnerTile, inner - i0);
    const float* xo = x + o * len * inner + i0;
    float best[kInnerTile];
    int32_t at[kInnerTile];
    for (int64_t j = 0; j < w; ++j) best[j] = xo[j], at[j] = 0;
    for (int64_t l = 1; l < len; ++l) {
      const float* xl = xo + l * inner;
      for (int64_t j = 0; j < w; ++j)
        if (beats(xl[j], best[j])) best[j] = xl[j], at[j] = static_cast<int32_t>(l);
    }
    for (int64_t j = 0; j < w; ++j) y[o * inner + i0 + j] = at[j];
  }
}

}  // namespace clustr::cpu
