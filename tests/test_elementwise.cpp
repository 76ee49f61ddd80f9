// Element-wise ops against plain double loops: every BinaryOp and UnaryOp, NumPy broadcasting
// (size-1 axes on either side, rank differences, shape ()), the collapsed and chunked kernel
// paths, thread-count independence, and the error messages.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <vector>

#include "check.h"
#include "core/math.h"
#include "core/ops.h"

using namespace clustr;
using namespace clustr::test;

namespace {

double ref_binary(BinaryOp op, double a, double b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::maximum: return a > b ? a : b;
    case BinaryOp::minimum: return a < b ? a : b;
  }
  return NAN;
}

double ref_unary(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::neg: return -x;
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::abs: return std::fabs(x);
    case UnaryOp::relu: return x > 0 ? x : 0.0;
    case UnaryOp::gelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case UnaryOp::tanh: return std::tanh(x);
    case UnaryOp::sigmoid: return 1.0 / (1.0 + std::exp(-x));
  }
  return NAN;
}

const BinaryOp kBinaryOps[] = {BinaryOp::add,     BinaryOp::sub,    BinaryOp::mul,
                               BinaryOp::div,     BinaryOp::maximum, BinaryOp::minimum};
const UnaryOp kUnaryOps[] = {UnaryOp::neg,  UnaryOp::exp,  UnaryOp::log,
                             UnaryOp::sqrt, UnaryOp::abs,  UnaryOp::relu,
                             UnaryOp::gelu, UnaryOp::tanh, UnaryOp::sigmoid};

// The broadcast of a (sa) op b (sb) by explicit index arithmetic: for each output index, the
// index into each input is the output index with broadcast axes set to 0.
std::vector<float> ref_broadcast(BinaryOp op, const std::vector<float>& a, const Shape& sa,
                                 const std::vector<float>& b, const Shape& sb, Shape* out_shape) {
  const size_t r = std::max(sa.size(), sb.size());
  Shape pa(r - sa.size(), 1), pb(r - sb.size(), 1), out(r);
  pa.insert(pa.end(), sa.begin(), sa.end());
  pb.insert(pb.end(), sb.begin(), sb.end());
  for (size_t d = 0; d < r; ++d) out[d] = pa[d] == 1 ? pb[d] : pa[d];
  *out_shape = out;
  std::vector<float> y(static_cast<size_t>(numel(out)));
  for (int64_t i = 0; i < numel(out); ++i) {
    int64_t rem = i, ia = 0, ib = 0, ma = 1, mb = 1;
    for (size_t d = r; d-- > 0;) {
      const int64_t k = rem % out[d];
      rem /= out[d];
      ia += (pa[d] == 1 ? 0 : k) * ma;
      ib += (pb[d] == 1 ? 0 : k) * mb;
      ma *= pa[d];
      mb *= pb[d];
    }
    y[i] = static_cast<float>(ref_binary(op, a[ia], b[ib]));
  }
  return y;
}

// For float inputs the double result of + - * / rounds to the correctly rounded float result,
// so the kernels must match the reference exactly.
void check_broadcast(const Shape& sa, const Shape& sb, uint32_t seed) {
  const std::vector<float> va = random_values(numel(sa), seed);
  // b away from 0 so that div stays well scaled
  std::vector<float> vb = random_values(numel(sb), seed + 1, 0.5f, 3.0f);
  for (size_t i = 0; i < vb.size(); i += 2) vb[i] = -vb[i];
  // Empty inputs come from zeros(): from_vector of an empty vector trips UBSan in tensor.cpp
  // (memcpy from a null pointer), which is not what this test is about.
  auto make = [](const std::vector<float>& v, const Shape& s) {
    return v.empty() ? Tensor::zeros(s) : Tensor::from_vector(v, s);
  };
  const Tensor a = make(va, sa), b = make(vb, sb);
  for (BinaryOp op : kBinaryOps) {
    Shape want_shape;
    const std::vector<float> want = ref_broadcast(op, va, sa, vb, sb, &want_shape);
    const Tensor y = binary(op, a, b);
    INFO("a ", to_string(sa), " b ", to_string(sb), " op ", static_cast<int>(op));
    CHECK(y.shape() == want_shape);
    CHECK_CLOSE(y.to_vector(), want, 0.0, 0.0);
  }
}

}  // namespace

TEST_CASE("binary ops on equal shapes match plain loops exactly") {
  check_broadcast({3, 4, 5}, {3, 4, 5}, 1);
  check_broadcast({1}, {1}, 2);
  check_broadcast({}, {}, 3);
  check_broadcast({70000}, {70000}, 4);  // parallel, several chunks of one row
}

TEST_CASE("binary ops broadcast with NumPy rules") {
  check_broadcast({2, 1, 4}, {3, 1}, 10);     // size-1 axes on both sides, rank difference
  check_broadcast({3, 1}, {2, 1, 4}, 11);     // the same, swapped
  check_broadcast({1}, {5, 4}, 12);
  check_broadcast({5, 4}, {1}, 13);
  check_broadcast({}, {2, 3}, 14);            // scalar-shaped
  check_broadcast({2, 3}, {}, 15);
  check_broadcast({4, 1}, {1, 5}, 16);        // outer product
  check_broadcast({3, 1, 5}, {1, 4, 1}, 17);  // inner axis contiguous on one side only
  check_broadcast({2, 3, 4, 5}, {3, 1, 5}, 18);
  check_broadcast({2, 3, 4, 5}, {2, 3, 1, 1}, 19);  // inner block broadcast (stride 0)
  check_broadcast({0, 3}, {1, 3}, 20);        // empty result
  check_broadcast({7, 1, 300}, {1, 50, 1}, 21);  // parallel, many short rows
  check_broadcast({2, 40000}, {40000}, 22);   // parallel, long rows split into chunks
  check_broadcast({40000, 2}, {40000, 1}, 23);
}

TEST_CASE("binary ops name the op and both shapes when shapes do not broadcast") {
  const Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({4});
  CHECK_ERROR(add(a, b), "add", "(2, 3)", "(4,)");
  CHECK_ERROR(mul(b, a), "mul", "(2, 3)", "(4,)");
  CHECK_ERROR(maximum(Tensor::zeros({2, 3, 4}), Tensor::zeros({3, 3})), "maximum", "(2, 3, 4)",
              "(3, 3)");
}

TEST_CASE("maximum and minimum propagate NaN") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor a = Tensor::from_vector(std::vector<float>{nan, 1.0f, 2.0f}, {3});
  const Tensor b = Tensor::from_vector(std::vector<float>{0.0f, nan, 3.0f}, {3});
  for (const Tensor& y : {maximum(a, b), minimum(a, b)}) {
    const std::vector<float> v = y.to_vector();
    CHECK(std::isnan(v[0]));
    CHECK(std::isnan(v[1]));
  }
  CHECK(maximum(a, b).to_vector()[2] == 3.0f);
  CHECK(minimum(a, b).to_vector()[2] == 2.0f);
}

TEST_CASE("binary_scalar matches plain loops exactly for every op") {
  const std::vector<float> v = random_values(37, 30);
  const Tensor a = Tensor::from_vector(v, {37});
  for (float s : {-1.75f, 0.3f, 2.0f}) {
    for (BinaryOp op : kBinaryOps) {
      std::vector<float> want(v.size());
      for (size_t i = 0; i < v.size(); ++i) want[i] = static_cast<float>(ref_binary(op, v[i], s));
      CHECK_CLOSE(binary_scalar(op, a, s).to_vector(), want, 0.0, 0.0);
    }
    std::vector<float> sum(v.size()), prod(v.size());
    for (size_t i = 0; i < v.size(); ++i) sum[i] = v[i] + s, prod[i] = v[i] * s;
    CHECK_CLOSE(add(a, s).to_vector(), sum, 0.0, 0.0);
    CHECK_CLOSE(mul(a, s).to_vector(), prod, 0.0, 0.0);
  }
}

TEST_CASE("unary ops match double loops") {
  std::vector<float> v = random_values(1000, 40, -6.0f, 6.0f);
  for (float x : {0.0f, -0.5f, 0.5f, 1e-8f, -1e-8f, 15.0f, -15.0f}) v.push_back(x);
  std::vector<float> pos = random_values(1000, 41, 1e-4f, 50.0f);  // domain of log and sqrt
  for (UnaryOp op : kUnaryOps) {
    const std::vector<float>& in = (op == UnaryOp::log || op == UnaryOp::sqrt) ? pos : v;
    std::vector<float> want(in.size());
    for (size_t i = 0; i < in.size(); ++i) want[i] = static_cast<float>(ref_unary(op, in[i]));
    const Tensor y = unary(op, Tensor::from_vector(in, {static_cast<int64_t>(in.size())}));
    INFO("op ", static_cast<int>(op));
    // neg, abs, relu are exact; sqrt is correctly rounded; the others are libm-accurate.
    const bool exact = op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::relu ||
                       op == UnaryOp::sqrt;
    CHECK_CLOSE(y.to_vector(), want, exact ? 0.0 : 1e-6, exact ? 0.0 : 1e-6);
  }
  // The named wrappers call the same kernels.
  const Tensor x = Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
  CHECK(neg(x).to_vector() == unary(UnaryOp::neg, x).to_vector());
  CHECK(exp(x).to_vector() == unary(UnaryOp::exp, x).to_vector());
  CHECK(relu(x).to_vector() == unary(UnaryOp::relu, x).to_vector());
  CHECK(gelu(x).to_vector() == unary(UnaryOp::gelu, x).to_vector());
  CHECK(tanh(x).to_vector() == unary(UnaryOp::tanh, x).to_vector());
  const Tensor p = Tensor::from_vector(pos, {static_cast<int64_t>(pos.size())});
  CHECK(log(p).to_vector() == unary(UnaryOp::log, p).to_vector());
  CHECK(sqrt(p).to_vector() == unary(UnaryOp::sqrt, p).to_vector());
}

TEST_CASE("sigmoid and gelu stay finite and saturate for large |x|") {
  const std::vector<float> x = {-1000.0f, -80.0f, -30.0f, 30.0f, 100.0f, 1000.0f};
  const Tensor t = Tensor::from_vector(x, {6});
  const std::vector<float> s = unary(UnaryOp::sigmoid, t).to_vector();
  const std::vector<float> g = gelu(t).to_vector();
  for (size_t i = 0; i < x.size(); ++i) {
    CHECK(std::isfinite(s[i]));
    CHECK(std::isfinite(g[i]));
  }
  CHECK(s[0] == 0.0f);
  CHECK(s[5] == 1.0f);
  // sigmoid(-80) = e^-80 / (1 + e^-80) ~ 1.8e-35, a normal float: the e^x / (1 + e^x) branch
  // keeps it where 1 / (1 + e^80) would still work but 1 / (1 + e^1000) would be 1 / inf.
  CHECK_CLOSE(std::vector<float>{s[1]}, std::vector<float>{std::exp(-80.0f)}, 0.0, 1e-6);
  CHECK(g[0] == 0.0f);
  CHECK(g[5] == 1000.0f);
  CHECK(g[4] == 100.0f);
}

namespace {

// Distance in units in the last place between two finite floats of the same sign, or 0/1 for
// the limits: the ulp bound below is only meaningful between neighbours on the float line.
int64_t ulp_distance(float a, float b) {
  if (a == b) return 0;
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if ((ia < 0) != (ib < 0)) return std::numeric_limits<int64_t>::max();
  return std::llabs(static_cast<int64_t>(ia) - ib);
}

// Every 4093rd bit pattern: about a million floats of every sign and exponent, NaNs included.
std::vector<float> float_sweep() {
  std::vector<float> v;
  for (uint64_t b = 0; b < (1ull << 32); b += 4093) {
    const uint32_t u = static_cast<uint32_t>(b);
    float f;
    std::memcpy(&f, &u, 4);
    v.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 88.72283f, 88.7228394f, 89.0f, -87.33654f, -103.9f, -104.0f,
                  -110.0f, 1e-30f, -1e-30f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity()})
    v.push_back(f);
  return v;
}

// Max ulp error of op over the sweep against double math rounded once to float; NaN in gives
// NaN out, and limits (inf, 0) must match.
void check_ulp(UnaryOp op, int64_t max_ulp) {
  const std::vector<float> x = float_sweep();
  const std::vector<float> y =
      unary(op, Tensor::from_vector(x, {static_cast<int64_t>(x.size())})).to_vector();
  int64_t worst = 0, bad_special = 0;
  float worst_x = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = static_cast<float>(ref_unary(op, x[i]));
    if (std::isnan(want) || std::isnan(y[i])) {
      bad_special += std::isnan(want) != std::isnan(y[i]);
      continue;
    }
    const int64_t d = ulp_distance(y[i], want);
    if (d > worst) worst = d, worst_x = x[i];
  }
  INFO("op ", static_cast<int>(op), " worst ", worst, " ulp at x = ", worst_x);
  CHECK(worst <= max_ulp);
  CHECK(bad_special == 0);
}

}  // namespace

TEST_CASE("exp and sigmoid are within 2 ulp over the whole float range") {
  // exp is a polynomial of our own (core/math.h) so that loops over it vectorise; an
  // exhaustive run over all 2^32 floats found at most 1 ulp.
  check_ulp(UnaryOp::exp, 2);
  check_ulp(UnaryOp::sigmoid, 3);
}

TEST_CASE("erfc (GELU's) is within 7 ulp of double erfc wherever it is a normal float") {
  // math::erfc is branch-free so that GELU's loops vectorise (core/math.h); libm's erfcf is
  // within 1 ulp but one scalar call per element. Every float of [-11, 11] that the sweep holds
  // (about 0.5 M; worst 5 ulp, at x = 0.813), and the limits. A denser run (every 97th float of
  // [-12, 12]) found at most 6 ulp, at x = 0.822, where the fit's terms cancel most.
  int64_t worst = 0;
  float worst_x = 0;
  for (float x : float_sweep()) {
    if (!(std::fabs(x) <= 11.0f)) continue;
    const double want = std::erfc(static_cast<double>(x));
    if (want < std::numeric_limits<float>::min()) continue;
    const int64_t d = ulp_distance(math::erfc(x), static_cast<float>(want));
    if (d > worst) worst = d, worst_x = x;
  }
  INFO("worst ", worst, " ulp at x = ", worst_x);
  CHECK(worst <= 7);
  CHECK(math::erfc(std::numeric_limits<float>::infinity()) == 0.0f);
  CHECK(math::erfc(-std::numeric_limits<float>::infinity()) == 2.0f);
  CHECK(math::erfc(0.0f) == 1.0f);
  CHECK(std::isnan(math::erfc(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("GELU's row loops give math::gelu's bits: its multiply-adds are fused alike everywhere") {
  // erfc's multiply-adds are written fused (math::FusedMulAdd): one instruction in the row
  // loops' AVX-512 and AVX2 clones, a libm call in this file (built for plain x86-64), and on
  // the device; all round once, so every one gives the same bits. Its derivative too.
  std::vector<float> xs;
  for (float x : float_sweep())
    if (std::fabs(x) <= 20.0f) xs.push_back(x);
  const Tensor x = Tensor::from_vector(xs, {static_cast<int64_t>(xs.size())});
  const std::vector<float> y = gelu(x).to_vector();
  const std::vector<float> dy = unary_backward(UnaryOp::gelu, x, Tensor(),
                                               Tensor::full(x.shape(), 1.0f))
                                    .to_vector();
  int64_t differ = 0, differ_grad = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    differ += math::bits_of(y[i]) != math::bits_of(math::gelu(xs[i]));
    differ_grad += math::bits_of(dy[i]) != math::bits_of(math::gelu_grad(xs[i]));
  }
  INFO(xs.size(), " values");
  CHECK(differ == 0);
  CHECK(differ_grad == 0);
}

TEST_CASE("relu lets NaN through") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = Tensor::from_vector(std::vector<float>{nan, -1.0f}, {2});
  const std::vector<float> y = relu(x).to_vector();
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == 0.0f);
}

TEST_CASE("add_ accumulates alpha * src in place") {
  const std::vector<float> d0 = random_values(50, 50), s = random_values(50, 51);
  Tensor dst = Tensor::from_vector(d0, {5, 10});
  const Tensor src = Tensor::from_vector(s, {5, 10});
  add_(dst, src, -0.5f);
  add_(dst, src);
  std::vector<float> want(d0.size());
  for (size_t i = 0; i < d0.size(); ++i) {
    want[i] = d0[i] + -0.5f * s[i];
    want[i] = want[i] + 1.0f * s[i];
  }
  CHECK_CLOSE(dst.to_vector(), want, 0.0, 0.0);

  Tensor view = dst.rows(1, 3);  // a view: writes land in dst's storage
  add_(view, Tensor::full({2, 10}, 1.0f));
  CHECK(dst.to_vector()[10] == want[10] + 1.0f);
  CHECK(dst.to_vector()[0] == want[0]);
}

TEST_CASE("add_ requires equal shapes and names both") {
  Tensor dst = Tensor::zeros({2, 3});
  CHECK_ERROR(add_(dst, Tensor::zeros({3, 2})), "add_", "(2, 3)", "(3, 2)");
  CHECK_ERROR(add_(dst, Tensor::zeros({3})), "add_", "(2, 3)", "(3,)");
}

TEST_CASE("element-wise ops reject bad dtypes and undefined tensors") {
  const Tensor ints = Tensor::from_int_vector(std::vector<int32_t>{1, 2}, {2});
  const Tensor f = Tensor::zeros({2});
  CHECK_ERROR(exp(ints), "exp", "f32", "i32 (2,)");
  CHECK_ERROR(add(f, ints), "add", "i32 (2,)");
  CHECK_ERROR(add(ints, 1.0f), "add", "i32 (2,)");
  CHECK_ERROR(relu(Tensor()), "relu", "undefined");
  Tensor undefined;
  CHECK_ERROR(add_(undefined, f), "add_", "undefined");
}

TEST_CASE("element-wise results do not depend on the thread count") {
  const Tensor a = random_tensor({9, 1, 3000}, 60), b = random_tensor({1, 11, 3000}, 61);
  const Tensor x = random_tensor({100000}, 62);
  std::vector<std::vector<float>> one, two;
  for (int threads : {1, 2}) {
    ThreadCount tc(threads);
    auto& out = threads == 1 ? one : two;
    out.push_back(div(a, b).to_vector());
    out.push_back(gelu(x).to_vector());
    out.push_back(binary_scalar(BinaryOp::maximum, x, 0.25f).to_vector());
    Tensor acc = x.clone();
    add_(acc, x, 0.3f);
    out.push_back(acc.to_vector());
  }
  for (size_t i = 0; i < one.size(); ++i) CHECK(one[i] == two[i]);
}
