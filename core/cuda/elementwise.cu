// CUDA element-wise kernels: binary ops over broadcast strides, ops with a scalar, unary ops
// and axpy; the twins of core/cpu/elementwise.cpp. Each output element is computed by one
// thread with the formula from core/math.h, so both backends compute the same function.
#include <cstdint>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "core/math.h"

namespace clustr::cuda {

namespace {

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
  throw Error(detail::cat("cuda::binary: unknown BinaryOp value ", static_cast<int>(op)));
}

template <class Fn>
void with_unary(UnaryOp op, Fn&& fn) {
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
  throw Error(detail::cat("cuda::unary: unknown UnaryOp value ", static_cast<int>(op)));
}

// The broadcast problem with size-1 axes dropped and adjacent axes merged wherever both inputs
// step through them as one (as core/cpu/elementwise.cpp does), passed to the kernel by value.
// Same-shape inputs collapse to one axis; kMaxRank axes are left only by shapes that alternate
// broadcast and non-broadcast axes more often than any model does.
constexpr int kMaxRank = 8;
struct Collapsed {
  int rank = 0;
  int64_t shape[kMaxRank], sa[kMaxRank], sb[kMaxRank];
};

Collapsed collapse(int rank, const int64_t* shape, const int64_t* sa, const int64_t* sb) {
  std::vector<int64_t> s, a, b;
  for (int i = 0; i < rank; ++i) {
    if (shape[i] == 1) continue;
    if (!s.empty() && a.back() == sa[i] * shape[i] && b.back() == sb[i] * shape[i]) {
      s.back() *= shape[i];
      a.back() = sa[i];
      b.back() = sb[i];
    } else {
      s.push_back(shape[i]);
      a.push_back(sa[i]);
      b.push_back(sb[i]);
    }
  }
  CLUSTR_CHECK(s.size() <= static_cast<size_t>(kMaxRank), "cuda::binary: the broadcast of rank ",
               rank, " does not reduce to ", kMaxRank, " or fewer axes (", s.size(),
               " remain); reshape the operands");
  Collapsed c;
  c.rank = static_cast<int>(s.size());
  for (int i = 0; i < c.rank; ++i) {
    c.shape[i] = s[i];
    c.sa[i] = a[i];
    c.sb[i] = b[i];
  }
  return c;
}

// out (n) = f(a[offset_a(i)], b[offset_b(i)]): each thread turns its linear index into the
// offsets of the two inputs, innermost axis first.
template <class F>
struct BinaryKernel {
  static constexpr bool kUsesBarrier = false;
  F f;
  const float* a;
  const float* b;
  float* out;
  int64_t n;
  Collapsed c;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) {
      int64_t rem = i, oa = 0, ob = 0;
      for (int d = c.rank - 1; d >= 0; --d) {
        const int64_t idx = rem % c.shape[d];
        rem /= c.shape[d];
        oa += idx * c.sa[d];
        ob += idx * c.sb[d];
      }
      out[i] = f(a[oa], b[ob]);
    }
  }
};

template <class F>
struct ScalarKernel {  // out = f(a, s)
  static constexpr bool kUsesBarrier = false;
  F f;
  const float* a;
  float s;
  float* out;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) out[i] = f(a[i], s);
  }
};

template <class F>
struct UnaryKernel {  // y = f(x)
  static constexpr bool kUsesBarrier = false;
  F f;
  const float* x;
  float* y;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) y[i] = f(x[i]);
  }
};

struct AxpyKernel {  // dst += alpha * src
  static constexpr bool kUsesBarrier = false;
  float alpha;
  const float* src;
  float* dst;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) dst[i] += alpha * src[i];
  }
};

Dim3 grid_for(int64_t n) { return {elementwise_blocks(n)}; }
constexpr Dim3 kBlock{kElementwiseThreads};

}  // namespace

void binary(BinaryOp op, int rank, const int64_t* out_shape, const float* a,
            const int64_t* a_strides, const float* b, const int64_t* b_strides, float* out) {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= out_shape[i];
  if (n == 0) return;
  require("cuda::binary");
  const Collapsed c = collapse(rank, out_shape, a_strides, b_strides);
  with_binary(op, [&](auto f) {
    launch("cuda::binary", grid_for(n), kBlock, 0, BinaryKernel<decltype(f)>{f, a, b, out, n, c});
  });
}

void binary_scalar(BinaryOp op, const float* a, float s, float* out, int64_t n) {
  if (n == 0) return;
  require("cuda::binary_scalar");
  with_binary(op, [&](auto f) {
    launch("cuda::binary_scalar", grid_for(n), kBlock, 0,
           ScalarKernel<decltype(f)>{f, a, s, out, n});
  });
}

void unary(UnaryOp op, const float* x, float* y, int64_t n) {
  if (n == 0) return;
  require("cuda::unary");
  with_unary(op, [&](auto f) {
    launch("cuda::unary", grid_for(n), kBlock, 0, UnaryKernel<decltype(f)>{f, x, y, n});
  });
}

void axpy(float alpha, const float* src, float* dst, int64_t n) {
  if (n == 0) return;
  require("cuda::axpy");
  launch("cuda::axpy", grid_for(n), kBlock, 0, AxpyKernel{alpha, src, dst, n});
}

}  // namespace clustr::cuda
