// CPU element-wise kernels: binary ops over broadcast strides, ops with a scalar, unary ops and
// axpy. Each output element is computed by one thread with the formula from core/math.h, so
// results never depend on the thread count.
#include <algorithm>
#include <vector>

#include "core/cpu/kernels.h"
#include "core/cpu/row_clones.h"
#include "core/math.h"

namespace clustr::cpu {

namespace {

// Elements per parallel work item: large enough that scheduling costs nothing, small enough
// that two threads share a (2, 20000) problem. Below kParallelMin a parallel region costs more
// than the loop.
constexpr int64_t kChunk = 16384;
constexpr int64_t kParallelMin = 32768;

// Calls fn(functor) with the functor for op; the kernels are templates over it so the loop body
// inlines and vectorises.
template <class Fn>
void with_binary(BinaryOp op, Fn&& fn) {
  switch (op) {
    case BinaryOp::add: return fn(math::Add{});
    case BinaryOp::sub: return fn(math::Sub{});
    case BinaryOp::mul: return fn(math::Mul{});
    case BinaryOp::div: return fn(math::Div{});
    case BinaryOp::maximum: return fn(math::Maximum{});
    case BinaryOp::minimum: return fn(math::Minimum{});
  }
}

template <class Fn>
[[gnu::always_inline]] inline void with_unary(UnaryOp op, Fn&& fn) {
  switch (op) {
    case UnaryOp::neg: return fn(math::Neg{});
    case UnaryOp::exp: return fn(math::Exp{});
    case UnaryOp::log: return fn(math::Log{});
    case UnaryOp::sqrt: return fn(math::Sqrt{});
    case UnaryOp::abs: return fn(math::Abs{});
    case UnaryOp::relu: return fn(math::Relu{});
    case UnaryOp::gelu: return fn(math::Gelu{});
    case UnaryOp::tanh: return fn(math::Tanh{});
    case UnaryOp::sigmoid: return fn(math::Sigmoid{});
  }
}

// The broadcast problem with size-1 axes dropped and adjacent axes merged wherever both inputs
// step through them as one (stride[outer] == stride[inner] * size[inner], true of contiguous
// runs and of runs of broadcast 0-strides alike). Same-shape inputs collapse to one axis.
struct Collapsed {
  std::vector<int64_t> shape, sa, sb;
};

Collapsed collapse(int rank, const int64_t* shape, const int64_t* sa, const int64_t* sb) {
  Collapsed c;
  for (int i = 0; i < rank; ++i) {
    if (shape[i] == 1) continue;
    if (!c.shape.empty() && c.sa.back() == sa[i] * shape[i] && c.sb.back() == sb[i] * shape[i]) {
      c.shape.back() *= shape[i];
      c.sa.back() = sa[i];
      c.sb.back() = sb[i];
    } else {
      c.shape.push_back(shape[i]);
      c.sa.push_back(sa[i]);
      c.sb.push_back(sb[i]);
    }
  }
  return c;
}

// out[j] = f(a[j * sa], b[j * sb]), j < n, with the common stride patterns as tight loops.
template <class F>
inline void binary_row(F f, const float* a, int64_t sa, const float* b, int64_t sb, float* out,
                       int64_t n) {
  if (sa == 1 && sb == 1) {
    for (int64_t j = 0; j < n; ++j) out[j] = f(a[j], b[j]);
  } else if (sa == 1 && sb == 0) {
    const float bv = *b;
    for (int64_t j = 0; j < n; ++j) out[j] = f(a[j], bv);
  } else if (sa == 0 && sb == 1) {
    const float av = *a;
    for (int64_t j = 0; j < n; ++j) out[j] = f(av, b[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) out[j] = f(a[j * sa], b[j * sb]);
  }
}

// The collapsed problem is (rows, n): rows = product of all but the innermost axis. Work items
// are blocks of whole rows (short rows) or pieces of one row (long rows); each item finds its
// first row's offsets once, then steps an odometer over the outer axes.
template <class F>
void binary_collapsed(F f, const Collapsed& c, const float* a, const float* b, float* out) {
  const int r = static_cast<int>(c.shape.size());
  if (r == 0) {  // every axis had size 1: a single element
    out[0] = f(a[0], b[0]);
    return;
  }
  const int64_t n = c.shape[r - 1], sa = c.sa[r - 1], sb = c.sb[r - 1];
  int64_t rows = 1;
  for (int d = 0; d < r - 1; ++d) rows *= c.shape[d];
  const int64_t cols_per_item = std::min(n, kChunk);
  const int64_t col_items = (n + cols_per_item - 1) / cols_per_item;
  const int64_t rows_per_item = std::max<int64_t>(1, kChunk / n);
  const int64_t row_items = (rows + rows_per_item - 1) / rows_per_item;
  const int64_t items = row_items * col_items;

#pragma omp parallel for schedule(static) if (rows * n >= kParallelMin)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t r0 = (item / col_items) * rows_per_item;
    const int64_t r1 = std::min(rows, r0 + rows_per_item);
    const int64_t c0 = (item % col_items) * cols_per_item;
    const int64_t len = std::min(cols_per_item, n - c0);
    // Multi-index of row r0 over the outer axes, and its input offsets.
    std::vector<int64_t> idx(static_cast<size_t>(r), 0);
    int64_t oa = 0, ob = 0;
    for (int64_t rem = r0, d = r - 2; d >= 0; --d) {
      idx[d] = rem % c.shape[d];
      rem /= c.shape[d];
      oa += idx[d] * c.sa[d];
      ob += idx[d] * c.sb[d];
    }
    for (int64_t row = r0; row < r1; ++row) {
      binary_row(f, a + oa + c0 * sa, sa, b + ob + c0 * sb, sb, out + row * n + c0, len);
      for (int d = r - 2; d >= 0; --d) {  // odometer step to the next row
        oa += c.sa[d];
        ob += c.sb[d];
        if (++idx[d] < c.shape[d]) break;
        oa -= c.sa[d] * c.shape[d];
        ob -= c.sb[d] * c.shape[d];
        idx[d] = 0;
      }
    }
  }
}

}  // namespace

void binary(BinaryOp op, int rank, const int64_t* out_shape, const float* a,
            const int64_t* a_strides, const float* b, const int64_t* b_strides, float* out) {
  for (int i = 0; i < rank; ++i)
    if (out_shape[i] == 0) return;
  const Collapsed c = collapse(rank, out_shape, a_strides, b_strides);
  with_binary(op, [&](auto f) { binary_collapsed(f, c, a, b, out); });
}

void binary_scalar(BinaryOp op, const float* a, float s, float* out, int64_t n) {
  with_binary(op, [&](auto f) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], s);
  });
}

namespace {

// y = f(x) over a contiguous span, compiled per instruction set (row_clones.h): the library is
// built for plain x86-64, where GELU's erfc and the exps run four lanes at a time; the AVX-512
// clone runs sixteen. Without contraction every clone rounds alike.
CLUSTR_ROW_CLONES_NO_CONTRACT
void unary_span(UnaryOp op, const float* x, float* y, int64_t n) {
  with_unary(op, [&](auto f) __attribute__((always_inline)) {
    for (int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
  });
}

}  // namespace

void unary(UnaryOp op, const float* x, float* y, int64_t n) {
  const int64_t items = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t i0 = item * kChunk;
    unary_span(op, x + i0, y + i0, std::min(kChunk, n - i0));
  }
}

void axpy(float alpha, const float* src, float* dst, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) dst[i] += alpha * src[i];
}

}  // namespace clustr::cpu
