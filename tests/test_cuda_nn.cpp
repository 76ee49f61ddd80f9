// The nn, layout and shape ops' CUDA kernels against their CPU twins through the front doors of
// core/ops.h: the unary derivatives, softmax / log-softmax backward, layer norm forward and
// backward, cross-entropy forward and backward, permute / transpose, gather_rows and
// scatter_add_rows_, broadcast_to, sum_to, slice, slice_add_ and concat, on awkward shapes (1, 3,
// 17, 129, non-square, sizes that are not a multiple of any block size, masked rows, ignored
// rows, zero weights), and the errors a bad input on a device tensor gets. Part of the test_cuda
// program (tests/test_cuda.cpp has its main): run on a GPU or on the emulated device, skipped
// elsewhere.
//
// Tolerances:
// - copies (permute, gather, slice, concat, broadcast) and scatter_add_rows_ (whose device
//   kernel adds each element's sources in the CPU's order, without atomics) are bit for bit;
// - the unary derivatives compute the same formula (core/math.h) on one element: bit for bit in
//   emulation; on a GPU, where nvcc fuses multiply-adds and CUDA's libm differs from glibc's, a
//   few ulp;
// - row sums (softmax backward, layer norm, cross-entropy) are taken in double on both devices
//   in a different order, so a rounded float may differ by an ulp; what follows from it is
//   compared with a small relative tolerance. dgamma and dbeta add the same terms in the same
//   order on both devices.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "check.h"
#include "cuda_check.h"
#include "core/cpu/nn.h"
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
using clustr::test::Tolerance;
namespace cuda = clustr::cuda;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A formula on one element: bit for bit in emulation. On a GPU (fused multiply-adds, CUDA's
// libm) within a small relative tolerance rather than a few ulps: a derivative that cancels
// (gelu's cdf + x pdf, softmax - 1 at the target) turns a few ulps of a term into many of the
// result.
Tolerance formula() { return cuda::exact_numerics() ? Tolerance(0) : Tolerance::close(1e-6, 1e-5); }

// CHECK_CLOSE's atol and rtol.
Tolerance close(double atol, double rtol) { return Tolerance::close(atol, rtol); }

Tensor on_cpu(const std::vector<float>& v, const Shape& s) { return Tensor::from_vector(v, s); }
Tensor on_device(const Tensor& t) { return t.to(Device::cuda); }

// n random ints in [lo, hi), reproducible from the seed.
std::vector<int32_t> random_ints(int64_t n, uint32_t seed, int32_t lo, int32_t hi) {
  std::vector<float> u = random_values(n, seed, 0.0f, 1.0f);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = std::min(hi - 1, lo + static_cast<int32_t>(u[i] * static_cast<float>(hi - lo)));
  return v;
}

// The same op on both devices must throw the same message, but for the device in describe().
template <class F>
void check_same_error(F on, Device bad_device, const std::string& must_contain) {
  const std::string cpu_msg = clustr::test::error_of([&] { on(Device::cpu); });
  std::string dev_msg = clustr::test::error_of([&] { on(bad_device); });
  CHECK_MESSAGE(dev_msg.find(must_contain) != std::string::npos, "error message: " << dev_msg);
  for (size_t at; (at = dev_msg.find("on cuda")) != std::string::npos;)
    dev_msg.replace(at, 7, "on cpu");
  CHECK(dev_msg == cpu_msg);
}

}  // namespace

TEST_CASE("cuda nn: unary derivatives match the cpu, from x or y alone") {
  const clustr::UnaryOp ops[] = {clustr::UnaryOp::neg,  clustr::UnaryOp::exp,
                                 clustr::UnaryOp::log,  clustr::UnaryOp::sqrt,
                                 clustr::UnaryOp::abs,  clustr::UnaryOp::relu,
                                 clustr::UnaryOp::gelu, clustr::UnaryOp::tanh,
                                 clustr::UnaryOp::sigmoid};
  for (int64_t n : {1, 3, 17, 129, 100003}) {
    std::vector<float> xv = random_values(n, 100, -3.0f, 3.0f);
    const float specials[] = {0.0f, -0.0f, kInf, -kInf, kNaN, 1e-40f, 30.0f, -30.0f};
    for (size_t i = 0; i < xv.size(); i += 5) xv[i] = specials[(i / 5) % 8];
    Tensor x = on_cpu(xv, {n});
    Tensor dy = on_cpu(random_values(n, 101), {n});
    for (clustr::UnaryOp op : ops) {
      CAPTURE(n);
      CAPTURE(clustr::op_name(op));
      Tensor y = clustr::unary(op, x);
      const clustr::cpu::UnaryGradInputs need = clustr::cpu::unary_grad_inputs(op);
      // One IEEE operation (or none): exact on any device.
      const bool exact = op == clustr::UnaryOp::neg || op == clustr::UnaryOp::abs ||
                         op == clustr::UnaryOp::relu || op == clustr::UnaryOp::exp ||
                         op == clustr::UnaryOp::log;
      const Tolerance tol = exact ? Tolerance(0) : formula();
      // From x and y, and from only the input the derivative reads (the other undefined).
      const auto r = compare_devices(
          [&](const Inputs& v) {
            return Inputs{clustr::unary_backward(op, v[0], v[1], v[2]),
                          clustr::unary_backward(op, need.x ? v[0] : Tensor(),
                                                 need.y ? v[1] : Tensor(), v[2])};
          },
          {x, y, dy}, {{"from x and y", tol}, {"from one", tol}});
      // The cpu's from one is its from x and y, so the device's from one is held to that too.
      check_ulps(r.cpu[1].to_vector(), r.cpu[0].to_vector(), 0);
    }
  }
  Tensor m = on_cpu(random_values(17 * 3, 102), {17, 3});  // a non-vector shape is kept
  Tensor dm = on_device(m);
  CHECK(clustr::unary_backward(clustr::UnaryOp::relu, dm, Tensor(), dm).shape() == Shape{17, 3});
}

TEST_CASE("cuda nn: softmax and log-softmax backward match the cpu, masked rows included") {
  const Shape shapes[] = {{1}, {1, 1}, {3, 17}, {17, 129}, {129, 3}, {2, 3, 1000}, {5, 257}};
  uint32_t seed = 110;
  for (const Shape& s : shapes) {
    std::vector<float> v = random_values(clustr::numel(s), seed++, -8.0f, 8.0f);
    const int64_t cols = s.back(), rows = clustr::numel(s) / cols;
    for (int64_t j = 0; j < cols; j += 3) v[j] = -kInf;  // a partly masked first row
    if (rows > 2)
      for (int64_t j = 0; j < cols; ++j) v[cols + j] = -kInf;  // a fully masked row
    Tensor x = on_cpu(v, s);
    Tensor dy = on_cpu(random_values(clustr::numel(s), seed++), s);
    CAPTURE(clustr::to_string(s));
    Tensor y = clustr::softmax(x), ly = clustr::log_softmax(x);
    // An ulp of the row sum s, or of dy - exp(y) s fused on a GPU, is about 1e-7 of |dy| <= 2.
    compare_devices([](const Inputs& in) { return clustr::softmax_backward(in[0], in[1]); },
                    {y, dy}, close(1e-6, 1e-6));
    compare_devices([](const Inputs& in) { return clustr::log_softmax_backward(in[0], in[1]); },
                    {ly, dy}, close(1e-6, 1e-6));
  }
}

TEST_CASE("cuda nn: layer norm forward and backward match the cpu") {
  // Widths 1, 3, 17, 129, 1000; row counts on both sides of the 64 row groups of dgamma.
  const Shape shapes[] = {{1, 1},  {3, 1},   {1, 17},     {17, 129}, {129, 3},
                          {300, 17}, {1000, 3}, {2, 3, 257}, {5, 1000}, {0, 5}};
  uint32_t seed = 120;
  for (const Shape& s : shapes) {
    const int64_t D = s.back();
    std::vector<float> xv = random_values(clustr::numel(s), seed++, -3.0f, 3.0f);
    // Every third row sits at 1e4 + small noise: the centring must happen in double.
    for (int64_t r = 0; r * D < static_cast<int64_t>(xv.size()); r += 3)
      for (int64_t j = 0; j < D; ++j) xv[r * D + j] = 1e4f + 1e-2f * xv[r * D + j];
    Tensor x = on_cpu(xv, s);
    Tensor gamma = on_cpu(random_values(D, seed++, 0.5f, 1.5f), {D});
    Tensor beta = on_cpu(random_values(D, seed++), {D});
    Tensor dy = on_cpu(random_values(clustr::numel(s), seed++), s);
    CAPTURE(clustr::to_string(s));
    const Inputs e = compare_devices(
                         [](const Inputs& v) {
                           const clustr::LayerNormOutput o = clustr::layer_norm(v[0], v[1], v[2],
                                                                                1e-5f);
                           return Inputs{o.y, o.mean, o.rstd};
                         },
                         {x, gamma, beta},
                         {{"y", close(1e-6, 1e-6)}, {"mean", 1}, {"rstd", 1}})
                         .cpu;
    // The device's backward reads the cpu's saved mean and rstd, so that only backward differs.
    compare_devices(
        [](const Inputs& v) {
          const clustr::LayerNormGrads g = clustr::layer_norm_backward(v[0], v[1], v[2], v[3],
                                                                       v[4]);
          return Inputs{g.dx, g.dgamma, g.dbeta};
        },
        {dy, x, e[1], e[2], gamma},
        {{"dx", close(1e-5, 1e-5)}, {"dgamma", close(1e-6, 1e-6)}, {"dbeta", close(1e-6, 1e-6)}});
  }
}

TEST_CASE("cuda nn: cross-entropy forward and backward match the cpu") {
  struct Case {
    int64_t R, V;
    bool weighted;
    int ignore_index;
  };
  const Case cases[] = {{1, 1, false, -100}, {3, 17, true, -100},   {17, 129, false, -100},
                        {129, 3, true, -100}, {5, 1000, true, 0},   {70, 33, false, 2},
                        {300, 17, true, -100}};
  uint32_t seed = 140;
  for (const Case& c : cases) {
    std::vector<float> lv = random_values(c.R * c.V, seed++, -6.0f, 6.0f);
    std::vector<int32_t> tv = random_ints(c.R, seed++, 0, static_cast<int32_t>(c.V));
    std::vector<float> wv = random_values(c.R, seed++, 0.0f, 2.0f);
    for (int64_t r = 1; r < c.R; r += 4) tv[r] = c.ignore_index;  // ignored rows
    for (int64_t r = 2; r < c.R; r += 5) wv[r] = 0.0f;             // rows weighted 0
    if (c.R > 2) {
      // A fully masked row: inf loss, which weight 0 (or being ignored) must keep out.
      for (int64_t j = 0; j < c.V; ++j) lv[2 * c.V + j] = -kInf;
      if (!c.weighted) tv[2] = c.ignore_index;
    }
    Tensor logits = on_cpu(lv, {c.R, c.V});
    Tensor target = Tensor::from_int_vector(tv, {c.R});
    Tensor weight = c.weighted ? on_cpu(wv, {c.R}) : Tensor();
    for (clustr::Reduction red : {clustr::Reduction::mean, clustr::Reduction::sum}) {
      CAPTURE(c.R);
      CAPTURE(c.V);
      CAPTURE(c.weighted);
      CAPTURE(c.ignore_index);
      CAPTURE(static_cast<int>(red));
      std::vector<clustr::CrossEntropyOutput> out;  // the cpu's, then the device's
      compare_devices(
          [&](const Inputs& v) {
            out.push_back(clustr::cross_entropy(v[0], v[1], v[2], c.ignore_index, red));
            return Inputs{out.back().loss, out.back().logsumexp};
          },
          {logits, target, weight},
          {{"loss", close(1e-6, 1e-6)}, {"logsumexp", close(1e-6, 1e-6)}});
      REQUIRE(out.size() == 2);
      const clustr::CrossEntropyOutput& e = out[0];
      CHECK(out[1].weight_sum.item() == doctest::Approx(e.weight_sum.item()).epsilon(1e-6));
      CHECK(out[1].loss_scale.item() == doctest::Approx(e.loss_scale.item()).epsilon(1e-6));

      // The cpu's logsumexp and loss scale, so that only backward differs.
      compare_devices(
          [&](const Inputs& v) {
            return clustr::cross_entropy_backward(v[0], v[1], v[2], v[3], v[4], v[5],
                                                  c.ignore_index);
          },
          {Tensor::scalar(0.75f), logits, target, weight, e.logsumexp, e.loss_scale}, formula());
    }
  }
  // The predictions found in the loss's pass: argmax's index on both devices, ties (logits
  // rounded to integers) and NaN included, and the same loss as without them.
  for (const Case& c : cases) {
    CAPTURE(c.R);
    CAPTURE(c.V);
    std::vector<float> lv = random_values(c.R * c.V, seed++, -3.0f, 3.0f);
    for (float& x : lv) x = std::round(x);
    if (c.R > 1) lv[static_cast<size_t>(c.V + c.V / 2)] = kNaN;  // row 1, ignored below
    const Tensor logits = on_cpu(lv, {c.R, c.V});
    std::vector<int32_t> tv = random_ints(c.R, seed++, 0, static_cast<int32_t>(c.V));
    for (int64_t r = 1; r < c.R; r += 4) tv[r] = c.ignore_index;
    const Tensor target = Tensor::from_int_vector(tv, {c.R});
    const std::vector<int32_t> want = clustr::argmax(logits, -1).to_int_vector();
    for (Device d : {Device::cpu, Device::cuda}) {
      CAPTURE(static_cast<int>(d));
      const clustr::CrossEntropyOutput with = clustr::cross_entropy(
          logits.to(d), target.to(d), Tensor(), c.ignore_index, clustr::Reduction::mean, true);
      const clustr::CrossEntropyOutput without = clustr::cross_entropy(
          logits.to(d), target.to(d), Tensor(), c.ignore_index, clustr::Reduction::mean);
      CHECK(with.predictions.to_int_vector() == want);
      CHECK_FALSE(without.predictions.defined());
      CHECK(with.loss.to_vector() == without.loss.to_vector());
    }
  }
  // Every row ignored: mean is 0, and so is the gradient.
  Tensor logits = on_device(on_cpu(random_values(12, 150), {3, 4}));
  Tensor target = Tensor::from_int_vector({-100, -100, -100}, {3}, Device::cuda);
  const clustr::CrossEntropyOutput g =
      clustr::cross_entropy(logits, target, Tensor(), -100, clustr::Reduction::mean);
  CHECK(g.loss.item() == 0.0f);
  CHECK(g.weight_sum.item() == 0.0f);
  CHECK(g.loss_scale.item() == 0.0f);
  CHECK(clustr::cross_entropy_backward(Tensor::scalar(1.0f, Device::cuda), logits, target,
                                       Tensor(), g.logsumexp, g.loss_scale, -100)
            .to_vector() == std::vector<float>(12, 0.0f));
}

TEST_CASE("cuda layout: permute and transpose match the cpu bit for bit, f32 and i32") {
  struct Case {
    Shape s;
    std::vector<int> perm;
  };
  std::vector<Case> cases = {{{1}, {0}},
                             {{3, 17}, {1, 0}},
                             {{17, 129}, {1, 0}},
                             {{129, 3}, {1, 0}},
                             {{33, 65}, {1, 0}},
                             {{2, 129, 17}, {0, 2, 1}},
                             {{4, 1, 3, 1, 2}, {4, 2, 0, 3, 1}},
                             {{3, 5, 7, 2}, {0, 2, 1, 3}},  // inner axis kept: block copies
                             {{1, 1, 5}, {2, 1, 0}},
                             {{0, 3}, {1, 0}}};
  std::vector<int> p = {0, 1, 2, 3};  // every permutation of a (2, 3, 5, 7) tensor
  do cases.push_back({{2, 3, 5, 7}, p});
  while (std::next_permutation(p.begin(), p.end()));
  uint32_t seed = 160;
  for (const Case& c : cases) {
    CAPTURE(clustr::to_string(c.s));
    CAPTURE(c.perm.size() > 0 ? c.perm[0] : -1);
    Tensor x = on_cpu(random_values(clustr::numel(c.s), seed++), c.s);
    std::vector<int32_t> iv(static_cast<size_t>(x.numel()));
    std::iota(iv.begin(), iv.end(), -7);
    Tensor xi = Tensor::from_int_vector(iv, c.s);
    for (const Tensor& t : {x, xi})  // f32 to 0 ulps, i32 exactly
      compare_devices([&](const Inputs& v) { return clustr::permute(v[0], c.perm); }, {t}, 0);
  }
  Tensor x = on_cpu(random_values(3 * 17 * 129, seed++), {3, 17, 129});
  compare_devices([](const Inputs& v) { return clustr::transpose(v[0], 0, 2); }, {x}, 0);
  compare_devices([](const Inputs& v) { return clustr::transpose(v[0], -1, -2); }, {x}, 0);
}

TEST_CASE("cuda layout: gather_rows, scatter_add_rows_ and scatter_sum_rows match the cpu bit "
          "for bit") {
  struct Case {
    int64_t V, D;
    Shape index;
  };
  const Case cases[] = {{1, 1, {1}},  {17, 3, {3, 4}}, {129, 17, {200}}, {5, 129, {2, 9}},
                        {3, 1000, {17}}, {4, 5, {}},    {6, 7, {0}}};
  uint32_t seed = 180;
  for (const Case& c : cases) {
    CAPTURE(c.V);
    CAPTURE(c.D);
    CAPTURE(clustr::to_string(c.index));
    // Indices from a small range, so most rows repeat (a token that occurs many times).
    const int32_t hi = static_cast<int32_t>(std::min<int64_t>(c.V, 4));
    Tensor index = Tensor::from_int_vector(random_ints(clustr::numel(c.index), seed++, 0, hi),
                                           c.index);
    Tensor table = on_cpu(random_values(c.V * c.D, seed++), {c.V, c.D});
    compare_devices([](const Inputs& v) { return clustr::gather_rows(v[0], v[1]); },
                    {table, index}, 0);
    if (!c.index.empty()) {  // with rows added (a positional encoding), the same bits
      Tensor added = on_cpu(random_values(c.index.back() * c.D, seed++), {c.index.back(), c.D});
      compare_devices(
          [](const Inputs& v) { return clustr::gather_rows(v[0], v[1], v[2]); },
          {table, index, added}, 0);
    }

    Shape src_shape = c.index;
    src_shape.push_back(c.D);
    Tensor src = on_cpu(random_values(clustr::numel(src_shape), seed++), src_shape);
    compare_devices(
        [](const Inputs& v) {
          Tensor t = v[0].clone();
          clustr::scatter_add_rows_(t, v[1], v[2]);
          return t;
        },
        {table, index, src}, 0);
    // From zero (an embedding's gradient): one pass over the indices per row on the device.
    compare_devices([&](const Inputs& v) { return clustr::scatter_sum_rows(c.V, v[0], v[1]); },
                    {index, src}, 0);
  }
  // A table past the one-pass limit (V n > 2^20) takes the fill and the grouping: the same bits.
  const int64_t V = 1100, n = 1000, D = 3;
  const Tensor index = Tensor::from_int_vector(random_ints(n, 190, 0, 7), {n});
  const Tensor src = on_cpu(random_values(n * D, 191), {n, D});
  compare_devices([&](const Inputs& v) { return clustr::scatter_sum_rows(V, v[0], v[1]); },
                  {index, src}, 0);
}

TEST_CASE("cuda shape ops: broadcast_to, sum_to, slice, slice_add_ and concat match the cpu") {
  struct Pair {
    Shape small, big;
  };
  const Pair pairs[] = {{{1}, {129}},         {{3}, {17, 3}},        {{17, 1}, {17, 129}},
                        {{1, 129}, {3, 129}}, {{2, 1, 5}, {3, 2, 4, 5}}, {{}, {3, 17}},
                        {{1, 1}, {1, 1}},     {{3, 1, 1}, {3, 0, 2}}};
  uint32_t seed = 200;
  for (const Pair& p : pairs) {
    CAPTURE(clustr::to_string(p.small));
    CAPTURE(clustr::to_string(p.big));
    Tensor x = on_cpu(random_values(clustr::numel(p.small), seed++), p.small);
    compare_devices([&](const Inputs& v) { return clustr::broadcast_to(v[0], p.big); }, {x}, 0);
    Tensor big = on_cpu(random_values(clustr::numel(p.big), seed++), p.big);
    compare_devices([&](const Inputs& v) { return clustr::sum_to(v[0], p.small); }, {big},
                    close(1e-6, 1e-6));
  }
  Tensor xi = Tensor::from_int_vector({1, 2, 3}, {3});
  CHECK(clustr::broadcast_to(on_device(xi), {2, 3}).to_int_vector() ==
        std::vector<int32_t>{1, 2, 3, 1, 2, 3});

  const Shape shapes[] = {{129}, {17, 129}, {3, 17, 5}, {1, 3}};
  for (const Shape& s : shapes) {
    Tensor x = on_cpu(random_values(clustr::numel(s), seed++), s);
    for (int axis = 0; axis < static_cast<int>(s.size()); ++axis) {
      const int64_t len = s[axis];
      for (int64_t start : {int64_t(0), len / 3}) {
        for (int64_t length : {int64_t(1), len - start, int64_t(0)}) {
          CAPTURE(clustr::to_string(s));
          CAPTURE(axis);
          CAPTURE(start);
          CAPTURE(length);
          Tensor acc = on_cpu(random_values(clustr::numel(s), seed++), s);
          // The slice, and acc with it added back where it came from (each device its own).
          compare_devices(
              [&](const Inputs& v) {
                Tensor part = clustr::slice(v[0], axis, start, length), sum = v[1].clone();
                clustr::slice_add_(sum, axis, start, part);
                return Inputs{part, sum};
              },
              {x, acc}, {{"slice", 0}, {"slice_add_", 0}});
        }
      }
      // Three pieces of different lengths joined along the axis.
      Shape s1 = s, s2 = s;
      s1[axis] = 1;
      s2[axis] = 2 * len + 1;
      Inputs parts = {x, on_cpu(random_values(clustr::numel(s1), seed++), s1),
                      on_cpu(random_values(clustr::numel(s2), seed++), s2)};
      CAPTURE(clustr::to_string(s));
      CAPTURE(axis);
      compare_devices([&](const Inputs& v) { return clustr::concat(v, axis); }, parts, 0);
      // And apart again, the middle piece not wanted.
      const std::vector<int64_t> lens = {s[axis], 1, 2 * len + 1};
      compare_devices(
          [&](const Inputs& v) {
            Inputs out = clustr::split(clustr::concat(v, axis), axis, lens, {true, false, true});
            out.erase(out.begin() + 1);
            return out;
          },
          parts, {{"piece 0", 0}, {"piece 2", 0}});
    }
  }
  // Nineteen pieces (three launches of up to eight), of 0 to 3 columns, joined and split.
  {
    Inputs pieces;
    std::vector<int64_t> lens;
    for (int k = 0; k < 19; ++k) {
      lens.push_back(k % 4);
      pieces.push_back(on_cpu(random_values(5 * (k % 4), 700 + k), {5, k % 4}));
    }
    compare_devices([&](const Inputs& v) { return clustr::concat(v, 1); }, pieces, 0);
    const Tensor whole = clustr::concat(pieces, 1);
    const std::vector<Tensor> back = clustr::split(on_device(whole), 1, lens);
    for (int k = 0; k < 19; ++k) CHECK(back[k].to_vector() == pieces[k].to_vector());
  }
  Tensor a = Tensor::from_int_vector({1, 2}, {2, 1}), b = Tensor::from_int_vector({3, 4}, {2, 1});
  CHECK(clustr::concat({on_device(a), on_device(b)}, 1).to_int_vector() ==
        std::vector<int32_t>{1, 3, 2, 4});
}

TEST_CASE("cuda nn: scratch memory of the device ops goes back to the allocator") {
  Tensor x = on_device(on_cpu(random_values(300 * 17, 220), {300, 17}));
  Tensor gamma = Tensor::full({17}, 1.0f, Device::cuda);
  Tensor beta = Tensor::zeros({17}, DType::f32, Device::cuda);
  Tensor target = Tensor::from_int_vector(random_ints(300, 221, 0, 17), {300}, Device::cuda);
  Tensor table = Tensor::zeros({5, 17}, DType::f32, Device::cuda);
  Tensor index = Tensor::from_int_vector(random_ints(300, 222, 0, 5), {300}, Device::cuda);
  const int64_t before = clustr::memory_stats(Device::cuda).live_bytes;
  {
    const clustr::LayerNormOutput o = clustr::layer_norm(x, gamma, beta, 1e-5f);
    const clustr::LayerNormGrads g = clustr::layer_norm_backward(x, x, o.mean, o.rstd, gamma);
    const clustr::CrossEntropyOutput ce =
        clustr::cross_entropy(x, target, Tensor(), -100, clustr::Reduction::mean);
    clustr::scatter_add_rows_(table, index, x);
    Tensor s = clustr::sum_to(clustr::broadcast_to(x, {2, 300, 17}), {17});
  }
  CHECK(clustr::memory_stats(Device::cuda).live_bytes == before);
}

TEST_CASE("cuda nn: a bad input on a device tensor gets the cpu's error") {
  // A target outside [0, V): the front door reads the targets from a host copy.
  check_same_error(
      [](Device d) {
        Tensor logits = Tensor::zeros({3, 4}, DType::f32, d);
        Tensor target = Tensor::from_int_vector({1, 7, 0}, {3}, d);
        clustr::cross_entropy(logits, target, Tensor(), -100, clustr::Reduction::mean);
      },
      Device::cuda, "cross_entropy: target[1] = 7 is outside [0, 4)");
  check_same_error(
      [](Device d) {
        Tensor logits = Tensor::zeros({3, 4}, DType::f32, d);
        Tensor target = Tensor::from_int_vector({1, 2, 0}, {3}, d);
        Tensor weight = Tensor::from_vector({1.0f, 0.5f, -1.0f}, {3}, d);
        clustr::cross_entropy(logits, target, weight, -100, clustr::Reduction::sum);
      },
      Device::cuda, "weight[2] = -1 is not >= 0");
  check_same_error(
      [](Device d) {
        Tensor table = Tensor::zeros({5, 3}, DType::f32, d);
        Tensor index = Tensor::from_int_vector({0, 4, 5, 1}, {2, 2}, d);
        clustr::gather_rows(table, index);
      },
      Device::cuda, "gather_rows: index[1, 0] = 5 is outside [0, 5)");
  check_same_error(
      [](Device d) {
        Tensor table = Tensor::zeros({5, 3}, DType::f32, d);
        Tensor index = Tensor::from_int_vector({-1}, {1}, d);
        clustr::scatter_add_rows_(table, index, Tensor::zeros({1, 3}, DType::f32, d));
      },
      Device::cuda, "scatter_add_rows_: index[0] = -1 is outside [0, 5)");
  check_same_error(
      [](Device d) {
        Tensor x = Tensor::zeros({2, 5}, DType::f32, d);
        clustr::layer_norm(x, Tensor::zeros({4}, DType::f32, d), Tensor::zeros({5}, DType::f32, d),
                           1e-5f);
      },
      Device::cuda, "layer_norm: expected gamma of shape (5,)");
  check_same_error(
      [](Device d) { clustr::permute(Tensor::zeros({2, 3}, DType::f32, d), {0, 0}); },
      Device::cuda, "is not a permutation");
  check_same_error(
      [](Device d) { clustr::slice(Tensor::zeros({2, 3}, DType::f32, d), 1, 2, 2); },
      Device::cuda, "slice: elements [2, 4) along axis 1 are not within [0, 3)");
  // Mixed devices are refused, not copied behind the caller's back.
  Tensor logits = Tensor::zeros({3, 4}, DType::f32, Device::cuda);
  CHECK_ERROR(clustr::cross_entropy(logits, Tensor::from_int_vector({0, 1, 2}, {3}), Tensor(),
                                    -100, clustr::Reduction::mean),
              "cross_entropy", "different devices");
  CHECK_ERROR(clustr::softmax_backward(logits, Tensor::zeros({3, 4})), "softmax_backward",
              "different devices");
  // A permutation that keeps more than 8 axes after merging is refused on the device, clearly.
  Tensor many = Tensor::zeros(Shape(9, 2), DType::f32, Device::cuda);
  CHECK_ERROR(clustr::permute(many, {8, 7, 6, 5, 4, 3, 2, 1, 0}), "cuda::permute",
              "8 or fewer axes");
}
