// The ops' CUDA kernels against their CPU twins through the front doors of core/ops.h:
// element-wise with broadcasting, reductions, softmax / log-softmax, dropout and matmul, on
// awkward shapes (1, 3, 17, 129, non-square, sizes that are not a multiple of any block size).
// Part of the test_cuda program (tests/test_cuda.cpp has its main): run on a GPU or on the
// emulated device, skipped elsewhere.
//
// Tolerances: element-wise ops and dropout compute the same formula (core/math.h) on one
// element, so they must agree bit for bit in emulation. On a GPU, nvcc fuses a * b + c into one
// rounding and CUDA's libm differs from glibc's by a few ulp, so the transcendental ops are
// allowed kGpuUlps there; IEEE operations (+ - * /, sqrt, max, min, abs, neg, relu) and the
// dropout mask stay exact. Reductions and softmax sum in double on both devices, in a different
// order, and are compared with a tolerance of a few float ulps.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "check.h"
#include "cuda_check.h"
#include "core/cuda/cuda.h"
#include "core/ops.h"
#include "core/tensor.h"

using clustr::Device;
using clustr::DType;
using clustr::Shape;
using clustr::Tensor;
using clustr::test::check_ulps;
using clustr::test::compare_devices;
using clustr::test::Inputs;
using clustr::test::random_values;
namespace cuda = clustr::cuda;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Transcendental formulas: exact in emulation, a few ulp on a GPU.
int64_t transcendental_ulps() { return cuda::exact_numerics() ? 0 : 8; }

// Random values with the special ones planted every few elements: +-0, +-inf, NaN, a subnormal,
// and large values that overflow exp.
std::vector<float> with_specials(int64_t n, uint32_t seed) {
  std::vector<float> v = random_values(n, seed, -3.0f, 3.0f);
  const float specials[] = {0.0f, -0.0f, kInf, -kInf, kNaN, 1e-40f, 100.0f, -100.0f, 1.0f};
  for (size_t i = 0; i < v.size(); i += 7) v[i] = specials[(i / 7) % 9];
  return v;
}

Tensor cpu_tensor(const std::vector<float>& v, const Shape& s) { return Tensor::from_vector(v, s); }

}  // namespace

TEST_CASE("cuda ops: binary ops with broadcasting match the cpu bit for bit") {
  struct Pair {
    Shape a, b;
  };
  const Pair pairs[] = {{{1}, {1}},           {{3}, {3}},           {{17}, {1}},
                        {{1}, {129}},         {{129}, {129}},       {{17, 1}, {1, 129}},
                        {{129, 17}, {17}},    {{3, 17, 129}, {17, 1}}, {{2, 3, 1, 5}, {3, 4, 1}},
                        {{}, {5}},            {{0, 3}, {3}},        {{4, 1, 3, 1, 2}, {1, 5, 1, 7, 1}}};
  const clustr::BinaryOp ops[] = {clustr::BinaryOp::add, clustr::BinaryOp::sub,
                                  clustr::BinaryOp::mul, clustr::BinaryOp::div,
                                  clustr::BinaryOp::maximum, clustr::BinaryOp::minimum};
  uint32_t seed = 1;
  for (const Pair& p : pairs) {
    Tensor a = cpu_tensor(with_specials(clustr::numel(p.a), seed++), p.a);
    Tensor b = cpu_tensor(with_specials(clustr::numel(p.b), seed++), p.b);
    for (clustr::BinaryOp op : ops) {
      CAPTURE(clustr::to_string(p.a));
      CAPTURE(clustr::to_string(p.b));
      CAPTURE(clustr::op_name(op));
      compare_devices([&](const Inputs& x) { return clustr::binary(op, x[0], x[1]); }, {a, b}, 0);
    }
  }
}

TEST_CASE("cuda ops: ops with a scalar and add_ match the cpu") {
  for (int64_t n : {1, 3, 17, 129, 1000, 100003}) {
    CAPTURE(n);
    Tensor a = cpu_tensor(with_specials(n, 7), {n});
    compare_devices([](const Inputs& x) { return clustr::add(x[0], 0.25f); }, {a}, 0);
    compare_devices([](const Inputs& x) { return clustr::mul(x[0], -3.0f); }, {a}, 0);
    compare_devices(
        [](const Inputs& x) { return clustr::binary_scalar(clustr::BinaryOp::div, x[0], 7.0f); },
        {a}, 0);

    Tensor src = cpu_tensor(random_values(n, 8), {n});
    Tensor dst = cpu_tensor(random_values(n, 9), {n});
    Tensor ddst = dst.to(Device::cuda);
    clustr::add_(dst, src, -0.5f);
    clustr::add_(ddst, src.to(Device::cuda), -0.5f);
    // dst + alpha * src: a GPU may fuse it into one rounding.
    if (cuda::exact_numerics())
      check_ulps(ddst.to_vector(), dst.to_vector(), 0);
    else
      CHECK_CLOSE(ddst.to_vector(), dst.to_vector(), 1e-6, 1e-6);
  }
}

TEST_CASE("cuda ops: unary ops match the cpu, special values included") {
  const clustr::UnaryOp exact[] = {clustr::UnaryOp::neg, clustr::UnaryOp::sqrt,
                                   clustr::UnaryOp::abs, clustr::UnaryOp::relu};
  const clustr::UnaryOp transcendental[] = {clustr::UnaryOp::exp, clustr::UnaryOp::log,
                                            clustr::UnaryOp::gelu, clustr::UnaryOp::tanh,
                                            clustr::UnaryOp::sigmoid};
  for (int64_t n : {1, 3, 17, 129, 100003}) {
    Tensor x = cpu_tensor(with_specials(n, 11), {n});
    CAPTURE(n);
    for (clustr::UnaryOp op : exact) {
      CAPTURE(clustr::op_name(op));
      compare_devices([&](const Inputs& v) { return clustr::unary(op, v[0]); }, {x}, 0);
    }
    for (clustr::UnaryOp op : transcendental) {
      CAPTURE(clustr::op_name(op));
      compare_devices([&](const Inputs& v) { return clustr::unary(op, v[0]); }, {x},
                      transcendental_ulps());
    }
  }
  Tensor m = cpu_tensor(random_values(17 * 3, 12), {17, 3});  // a non-vector shape is kept
  CHECK(clustr::gelu(m.to(Device::cuda)).shape() == Shape{17, 3});
}

TEST_CASE("cuda ops: reductions over every axis match the cpu") {
  const Shape shapes[] = {{1}, {3}, {129}, {17, 129}, {129, 17}, {3, 17, 129}, {2, 1, 5},
                          {1000}, {3, 1000}, {2, 301, 40}};
  const clustr::ReduceOp ops[] = {clustr::ReduceOp::sum, clustr::ReduceOp::mean,
                                  clustr::ReduceOp::max, clustr::ReduceOp::min};
  uint32_t seed = 30;
  for (const Shape& s : shapes) {
    Tensor x = cpu_tensor(random_values(clustr::numel(s), seed++), s);
    Tensor dx = x.to(Device::cuda);
    for (int axis = -1; axis < static_cast<int>(s.size()); ++axis) {
      for (size_t o = 0; o < std::size(ops); ++o) {
        const clustr::ReduceOp op = ops[o];
        // keepdim only reshapes (the same launch): each axis takes it with one op in turn.
        for (bool keepdim : {false, true}) {
          if (keepdim && o != static_cast<size_t>(axis + 1) % std::size(ops)) continue;
          CAPTURE(clustr::to_string(s));
          CAPTURE(axis);
          CAPTURE(static_cast<int>(op));
          CAPTURE(keepdim);
          Tensor expected = clustr::reduce(op, x, axis, keepdim);
          Tensor got = clustr::reduce(op, dx, axis, keepdim);
          CHECK(got.shape() == expected.shape());
          if (op == clustr::ReduceOp::max || op == clustr::ReduceOp::min)
            check_ulps(got.to_vector(), expected.to_vector(), 0);
          else
            CHECK_CLOSE(got.to_vector(), expected.to_vector(), 1e-6, 1e-6);
        }
      }
    }
  }
}

TEST_CASE("cuda ops: reductions propagate NaN, sum over an empty axis is 0, sum_all") {
  std::vector<float> v = random_values(3 * 17, 40);
  v[20] = kNaN;  // row 1
  Tensor x = cpu_tensor(v, {3, 17});
  Tensor dx = x.to(Device::cuda);
  for (clustr::ReduceOp op : {clustr::ReduceOp::max, clustr::ReduceOp::min})
    check_ulps(clustr::reduce(op, dx, 1).to_vector(), clustr::reduce(op, x, 1).to_vector(), 0);
  CHECK_CLOSE(clustr::sum(dx, 1).to_vector(), clustr::sum(x, 1).to_vector(), 1e-6, 1e-6);
  CHECK(std::isnan(clustr::sum(dx, 1).to_vector()[1]));
  // Down the columns (axis 0: the NaN is in column 3), where lanes of a block take turns.
  for (clustr::ReduceOp op : {clustr::ReduceOp::max, clustr::ReduceOp::min})
    check_ulps(clustr::reduce(op, dx, 0).to_vector(), clustr::reduce(op, x, 0).to_vector(), 0);
  const std::vector<float> column_sums = clustr::sum(dx, 0).to_vector();
  for (size_t c = 0; c < column_sums.size(); ++c)
    CHECK_MESSAGE(std::isnan(column_sums[c]) == (c == 3), "column " << c << ": " << column_sums[c]);

  Tensor empty = Tensor::zeros({4, 0}, DType::f32, Device::cuda);
  CHECK(clustr::sum(empty, 1).to_vector() == std::vector<float>(4, 0.0f));
  CHECK(clustr::sum_all(empty).item() == 0.0f);

  for (int64_t n : {1, 17, 100003}) {
    CAPTURE(n);
    Tensor big = cpu_tensor(random_values(n, 41), {n});
    CHECK_CLOSE(std::vector<float>{clustr::sum_all(big.to(Device::cuda)).item()},
                std::vector<float>{clustr::sum_all(big).item()}, 1e-5, 1e-6);
  }
}

TEST_CASE("cuda ops: softmax and log-softmax match the cpu, masked rows included") {
  const Shape shapes[] = {{1}, {1, 1}, {3, 17}, {17, 129}, {129, 3}, {2, 3, 1000}, {5, 257}};
  uint32_t seed = 50;
  for (const Shape& s : shapes) {
    std::vector<float> v = random_values(clustr::numel(s), seed++, -8.0f, 8.0f);
    const int64_t cols = s.back(), rows = clustr::numel(s) / cols;
    for (int64_t j = 0; j < cols; j += 3) v[j] = -kInf;  // a partly masked first row
    if (rows > 2) {
      for (int64_t j = 0; j < cols; ++j) v[cols + j] = -kInf;  // a fully masked row
      v[2 * cols + cols / 2] = kNaN;                             // a row holding NaN
    }
    Tensor x = cpu_tensor(v, s);
    Tensor dx = x.to(Device::cuda);
    CAPTURE(clustr::to_string(s));
    CHECK_CLOSE(clustr::softmax(dx).to_vector(), clustr::softmax(x).to_vector(), 1e-7, 1e-6);
    CHECK_CLOSE(clustr::log_softmax(dx).to_vector(), clustr::log_softmax(x).to_vector(), 1e-6,
                1e-6);
  }
}

TEST_CASE("cuda ops: the dropout mask equals the cpu's for the same seed and offset") {
  for (int64_t n : {1, 3, 17, 129, 1000, 100003}) {
    std::vector<float> v = with_specials(n, 60);
    Tensor x = cpu_tensor(v, {n});
    Tensor dx = x.to(Device::cuda);
    for (float p : {0.0f, 0.1f, 0.5f, 0.9f}) {
      for (uint64_t offset : {uint64_t(0), uint64_t(5), (uint64_t(1) << 33) + 3}) {
        CAPTURE(n);
        CAPTURE(p);
        CAPTURE(offset);
        Tensor expected = clustr::dropout_apply(x, p, 1234, offset);
        Tensor got = clustr::dropout_apply(dx, p, 1234, offset);
        check_ulps(got.to_vector(), expected.to_vector(), 0);
      }
    }
  }
  // A different offset gives a different mask (the test above would pass for any fixed mask).
  Tensor ones = Tensor::full({1000}, 1.0f, Device::cuda);
  CHECK(clustr::dropout_apply(ones, 0.5f, 1, 0).to_vector() !=
        clustr::dropout_apply(ones, 0.5f, 1, 250).to_vector());
}

TEST_CASE("cuda ops: matmul on the device matches the cpu for every transpose pair") {
  struct Size {
    int64_t batch, M, N, K;
  };
  const Size sizes[] = {{0, 1, 1, 1}, {0, 17, 129, 3}, {0, 129, 17, 65}, {3, 17, 5, 9},
                        {2, 1, 129, 17}};
  uint32_t seed = 70;
  for (const Size& z : sizes) {
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      Shape sa = ta ? Shape{z.K, z.M} : Shape{z.M, z.K};
      Shape sb = tb ? Shape{z.N, z.K} : Shape{z.K, z.N};
      if (z.batch > 0) {
        sa.insert(sa.begin(), z.batch);
        sb.insert(sb.begin(), z.batch);
      }
      Tensor A = cpu_tensor(random_values(clustr::numel(sa), seed++), sa);
      Tensor B = cpu_tensor(random_values(clustr::numel(sb), seed++), sb);
      CAPTURE(clustr::to_string(sa));
      CAPTURE(clustr::to_string(sb));
      CAPTURE(ta);
      CAPTURE(tb);
      Tensor expected = clustr::matmul(A, B, ta, tb);
      Tensor got = clustr::matmul(A.to(Device::cuda), B.to(Device::cuda), ta, tb);
      CHECK(got.shape() == expected.shape());
      CHECK_CLOSE(got.to_vector(), expected.to_vector(), 1e-5, 1e-5);
    }
  }
}

TEST_CASE("cuda ops: the allocator's peak counts the largest live set") {
  cuda::synchronize();
  clustr::reset_peak_memory(Device::cuda);
  const clustr::MemoryStats s0 = clustr::memory_stats(Device::cuda);
  CHECK(s0.peak_bytes == s0.live_bytes);
  {
    Tensor a = Tensor::zeros({1000}, DType::f32, Device::cuda);        // 4000 bytes
    {
      Tensor b = Tensor::zeros({17, 129}, DType::f32, Device::cuda);   // 8772 bytes
      Tensor c = clustr::softmax(b);                                   // 8772 more
      CHECK(clustr::memory_stats(Device::cuda).live_bytes == s0.live_bytes + 4000 + 2 * 8772);
    }
    const clustr::MemoryStats s1 = clustr::memory_stats(Device::cuda);
    CHECK(s1.live_bytes == s0.live_bytes + 4000);
    CHECK(s1.peak_bytes == s0.live_bytes + 4000 + 2 * 8772);
    clustr::reset_peak_memory(Device::cuda);
    CHECK(clustr::memory_stats(Device::cuda).peak_bytes == s1.live_bytes);
  }
  CHECK(clustr::memory_stats(Device::cuda).live_bytes == s0.live_bytes);
  CHECK(clustr::memory_stats(Device::cuda).peak_bytes == s0.live_bytes + 4000);
}
