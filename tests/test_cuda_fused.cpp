// The fused ops of the transformer layers (core/ops_fused.cpp), argmax and the CTC loss on the
// CUDA device against the CPU, through the front doors and the autograd ops: linear forward
// (bias present or absent, ReLU on or off) and backward, the ReLU feed-forward block's
// backward, layer norm of a residual sum, argmax ties and NaN over either kind of axis, and
// ctc_loss with varied lengths, repeated labels and impossible alignments. Shapes 1, 3, 17, 129
// and non-square. Part of the test_cuda program (tests/test_cuda.cpp has its main).
//
// Tolerances:
// - GEMMs: cuBLAS and the CPU's blocked kernel add the K products in different orders; with
//   inputs in [-2, 2] and K <= 129 the results agree within 2e-5 absolute + 1e-5 relative;
// - layer norm of a sum: the sum is the same float on both devices, so the rest is the layer
//   norm tolerance of test_cuda_nn.cpp (row sums in double, summed in another order);
// - argmax returns the same index bit for bit (the CPU's tie and NaN rule, exactly);
// - CTC: the device kernel runs the CPU's recursions with the same float formulas, so in
//   emulation the losses are the CPU's bit for bit and the gradients differ only through the
//   sums of each frame's posteriors (at most 2U + 1 = 13 terms here, below 1), added in another
//   order: their reciprocal moves by a few ulp, each gradient by a few ulp of 1 (3e-7
//   absolute); backward's scaling is the CPU's float products. On a GPU the contracted
//   multiply-adds of the recursions' exp and log polynomials move every alpha and beta by an
//   ulp or so a frame: 1e-5 relative on the losses, 2e-5 absolute on the gradients.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "check.h"
#include "core/cuda/cuda.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "cuda_check.h"
#include "layers/ctc.h"
#include "layers/cuda/ctc.h"
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/module.h"

#if defined(CLUSTR_CUDA_EMULATION)
#include "core/cuda/kernel.h"  // the emulator's controls
#endif

using clustr::Device;
using clustr::DType;
using clustr::Shape;
using clustr::Tensor;
using clustr::Variable;
using clustr::test::check_ints;
using clustr::test::check_output;
using clustr::test::check_ulps;
using clustr::test::compare_devices;
using clustr::test::Inputs;
using clustr::test::ints;
using clustr::test::random_tensor;
using clustr::test::random_values;
using clustr::test::Tolerance;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Tensor dev(const Tensor& t) { return t.defined() ? t.to(Device::cuda) : t; }

// A device result (moved to the host) against the cpu's, both defined or both undefined.
void check_gemm_close(const char* what, const Tensor& got, const Tensor& expected) {
  INFO(what);
  REQUIRE(got.defined() == expected.defined());
  if (!expected.defined()) return;
  CHECK(got.device() == Device::cuda);
  CHECK(got.shape() == expected.shape());
  CHECK_CLOSE(got.to_vector(), expected.to_vector(), 2e-5, 1e-5);
}

// check_gemm_close's tolerance, for compare_devices.
const Tolerance kGemm = Tolerance::close(2e-5, 1e-5);

// (R, in, out) of the linear layers: sizes 1, 3, 17, 129, non-square, and empty R.
struct LinearShape {
  int64_t R, in, out;
};
const LinearShape kLinearShapes[] = {{1, 1, 1},    {3, 17, 5},  {17, 129, 3}, {129, 3, 17},
                                     {5, 129, 129}, {130, 7, 1}, {0, 4, 3}};

}  // namespace

TEST_CASE("cuda fused: linear_forward matches the cpu, bias present or absent, ReLU on or off") {
  uint32_t seed = 500;
  for (const LinearShape& s : kLinearShapes) {
    const Tensor x = random_tensor({s.R, s.in}, seed++);
    const Tensor W = random_tensor({s.out, s.in}, seed++);
    const Tensor b = random_tensor({s.out}, seed++);
    for (bool with_bias : {true, false})
      for (bool relu : {false, true}) {
        CAPTURE(s.R);
        CAPTURE(s.in);
        CAPTURE(s.out);
        CAPTURE(with_bias);
        CAPTURE(relu);
        const Tensor bias = with_bias ? b : Tensor();
        const auto r = compare_devices(
            [&](const Inputs& v) { return clustr::linear_forward(v[0], v[1], v[2], relu); },
            {x, W, bias}, kGemm);
        if (relu) {  // exactly 0 where the cpu clamped a clearly negative value
          const std::vector<float> gv = r.device.to_vector(), ev = r.cpu.to_vector();
          for (size_t i = 0; i < ev.size(); ++i)
            if (ev[i] == 0.0f && gv[i] != 0.0f) CHECK_MESSAGE(std::fabs(gv[i]) < 1e-4f, i);
        }
      }
  }
}

TEST_CASE("cuda fused: ReLU of linear_forward keeps NaN and clamps -inf, as on the cpu") {
  // x W^T with one NaN and one -inf row: the epilogue sees them as the CPU's does.
  const Tensor x = Tensor::from_vector({1, 2, kNaN, 0, -kInf, 1}, {3, 2});
  const Tensor W = Tensor::from_vector({1, 1, 2, 0.5f}, {2, 2});
  const Tensor b = Tensor::from_vector({-1, 1}, {2});
  const auto r = compare_devices(
      [](const Inputs& v) { return clustr::linear_forward(v[0], v[1], v[2], true); }, {x, W, b}, 0);
  const std::vector<float> g = r.device.to_vector();
  CHECK(std::isnan(g[2]));
  CHECK(g[4] == 0.0f);
}

TEST_CASE("cuda fused: linear_backward matches the cpu for every combination of gradients") {
  uint32_t seed = 600;
  for (const LinearShape& s : kLinearShapes) {
    const Tensor x = random_tensor({s.R, s.in}, seed++);
    const Tensor W = random_tensor({s.out, s.in}, seed++);
    const Tensor dy = random_tensor({s.R, s.out}, seed++);
    for (int mask = 1; mask < 8; ++mask) {
      const bool need_dx = mask & 1, need_dW = mask & 2, need_db = mask & 4;
      CAPTURE(s.R);
      CAPTURE(s.in);
      CAPTURE(s.out);
      CAPTURE(mask);
      compare_devices(
          [&](const Inputs& v) {
            const clustr::LinearGrads g =
                clustr::linear_backward(v[0], v[1], v[2], need_dx, need_dW, need_db);
            return Inputs{g.dx, g.dW, g.db};
          },
          {dy, x, W}, {{"dx", kGemm}, {"dW", kGemm}, {"db", kGemm}});
    }
  }
}

#if defined(CLUSTR_CUDA_EMULATION)
namespace {

// Makes the emulated cuBLASLt offer no algorithm while it lives, so that the fused ops take
// their composed path (the GPU's cuBLASLt may have none for a product).
class NoLtAlgorithms {
 public:
  NoLtAlgorithms() { clustr::cuda::emulation::set_lt_algorithms(false); }
  ~NoLtAlgorithms() { clustr::cuda::emulation::set_lt_algorithms(true); }
  NoLtAlgorithms(const NoLtAlgorithms&) = delete;
  NoLtAlgorithms& operator=(const NoLtAlgorithms&) = delete;
};

}  // namespace

TEST_CASE("cuda fused: cuBLASLt's epilogues give the composed ops' results in one call") {
  // Each device op twice: with cuBLASLt's epilogue (bias, ReLU and the bias gradient inside the
  // product's one call) and composed (the product, then a kernel). The product is the same
  // emulated loop both ways, and the bias and ReLU are the same float operations on it, so the
  // forward and dW agree bit for bit. db's column sums are added in another order (the
  // epilogue in order of k, the reduction kernel in its tree): within 1e-6 of the sums' scale.
  // In the bf16 precision a float dy's sums are a pass of their own either way (the product
  // reads dy rounded); a bf16 dy's come out of the product.
  struct Case {
    clustr::Precision precision;
    DType dy_type;
  };
  const Case cases[] = {{clustr::Precision::fp32, DType::f32},
                        {clustr::Precision::bf16, DType::f32},
                        {clustr::Precision::bf16, DType::bf16}};
  uint32_t seed = 650;
  const LinearShape shapes[] = {{1, 1, 1}, {3, 17, 5}, {17, 129, 3}, {130, 7, 1}};
  for (const LinearShape& s : shapes) {
    const Tensor x = dev(random_tensor({s.R, s.in}, seed++));
    const Tensor W = dev(random_tensor({s.out, s.in}, seed++));
    const Tensor b = dev(random_tensor({s.out}, seed++));
    const Tensor dy32 = dev(random_tensor({s.R, s.out}, seed++));
    for (const Case& c : cases)
      for (bool relu : {false, true}) {
        const clustr::Precision p = c.precision;
        const Tensor dy = dy32.astype(c.dy_type);
        CAPTURE(s.R);
        CAPTURE(s.in);
        CAPTURE(s.out);
        CAPTURE(std::string(clustr::to_string(p)));
        CAPTURE(std::string(clustr::to_string(c.dy_type)));
        CAPTURE(relu);
        const clustr::cuda::LaunchCounts c0 = clustr::cuda::launch_counts();
        const Tensor fused = clustr::linear_forward(x, W, b, relu, p);
        const clustr::LinearGrads gf = clustr::linear_backward(dy, x, W, false, true, true, p);
        const clustr::cuda::LaunchCounts c1 = clustr::cuda::launch_counts();
        Tensor composed;
        clustr::LinearGrads gc;
        {
          const NoLtAlgorithms none;
          composed = clustr::linear_forward(x, W, b, relu, p);
          gc = clustr::linear_backward(dy, x, W, false, true, true, p);
        }
        const clustr::cuda::LaunchCounts c2 = clustr::cuda::launch_counts();
        // Two products either way; composed, the epilogue pass, and the column sums (a bf16
        // dy widened first) where the product could have made them (the operands' roundings
        // the same both ways).
        const bool sums_fused = !(p == clustr::Precision::bf16 && c.dy_type == DType::f32);
        const uint64_t sum_launches = c.dy_type == DType::bf16 ? 2 : 1;
        CHECK(c1.blas - c0.blas == 2);
        CHECK(c2.blas - c1.blas == 2);
        CHECK((c2.kernels - c1.kernels) - (c1.kernels - c0.kernels) ==
              1 + (sums_fused ? sum_launches : 0));
        check_ulps(fused.to_vector(), composed.to_vector(), 0);
        check_ulps(gf.dW.to_vector(), gc.dW.to_vector(), 0);
        double scale = 0.0;
        for (float v : dy.astype(DType::f32).to_vector()) scale += std::fabs(v);
        CHECK_CLOSE(gf.db.to_vector(), gc.db.to_vector(), 1e-6 * scale / s.out + 1e-7, 0.0);
      }
  }
}

TEST_CASE("cuda fused: the feed-forward backward's db2 from dW2's product, and composed") {
  const int64_t R = 17, D = 5, F = 129, D_out = 7;
  uint32_t seed = 690;
  const Tensor x = dev(random_tensor({R, D}, seed++));
  const Tensor W1 = dev(random_tensor({F, D}, seed++));
  const Tensor b1 = dev(random_tensor({F}, seed++));
  const Tensor W2 = dev(random_tensor({D_out, F}, seed++));
  const Tensor dy = dev(random_tensor({R, D_out}, seed++));
  const Tensor H = clustr::linear_forward(x, W1, b1, true);
  const clustr::FeedForwardGrads f = clustr::feed_forward_relu_backward(dy, x, W1, W2, H, {});
  clustr::FeedForwardGrads c;
  {
    const NoLtAlgorithms none;
    c = clustr::feed_forward_relu_backward(dy, x, W1, W2, H, {});
  }
  check_ulps(f.dx.to_vector(), c.dx.to_vector(), 0);
  check_ulps(f.dW1.to_vector(), c.dW1.to_vector(), 0);
  check_ulps(f.dW2.to_vector(), c.dW2.to_vector(), 0);
  CHECK_CLOSE(f.db1.to_vector(), c.db1.to_vector(), 1e-5, 1e-6);
  CHECK_CLOSE(f.db2.to_vector(), c.db2.to_vector(), 1e-5, 1e-6);
}
#endif

TEST_CASE("cuda fused: feed_forward_relu_backward matches the cpu, all or some gradients") {
  // (R, D, F, D_out)
  const int64_t shapes[][4] = {{1, 1, 1, 1},   {3, 17, 5, 3},   {17, 3, 129, 17},
                               {129, 17, 3, 1}, {5, 129, 17, 7}, {0, 3, 4, 3}};
  uint32_t seed = 700;
  for (const auto& s : shapes) {
    const int64_t R = s[0], D = s[1], F = s[2], D_out = s[3];
    const Tensor x = random_tensor({R, D}, seed++);
    const Tensor W1 = random_tensor({F, D}, seed++);
    const Tensor b1 = random_tensor({F}, seed++);
    const Tensor W2 = random_tensor({D_out, F}, seed++);
    const Tensor dy = random_tensor({R, D_out}, seed++);
    // The same H on both devices, so that the ReLU mask is the same.
    const Tensor H = clustr::linear_forward(x, W1, b1, true);
    clustr::FeedForwardNeeds subsets[4];
    subsets[1].dW2 = subsets[1].db2 = false;           // only the first layer's
    subsets[2].dx = subsets[2].dW1 = subsets[2].db1 = false;  // only the second layer's
    subsets[3] = {true, false, false, false, true};    // dx and db2
    for (const clustr::FeedForwardNeeds& need : subsets) {
      CAPTURE(R);
      CAPTURE(D);
      CAPTURE(F);
      CAPTURE(D_out);
      CAPTURE(need.dx);
      CAPTURE(need.dW2);
      compare_devices(
          [&](const Inputs& v) {
            const clustr::FeedForwardGrads g =
                clustr::feed_forward_relu_backward(v[0], v[1], v[2], v[3], v[4], need);
            return Inputs{g.dx, g.dW1, g.db1, g.dW2, g.db2};
          },
          {dy, x, W1, W2, H},
          {{"dx", kGemm}, {"dW1", kGemm}, {"db1", kGemm}, {"dW2", kGemm}, {"db2", kGemm}});
    }
  }
}

TEST_CASE("cuda fused: add_layer_norm forward and backward match the cpu") {
  const Shape shapes[] = {{1, 1}, {3, 1}, {1, 17}, {17, 129}, {129, 3}, {300, 17}, {2, 3, 257},
                          {0, 5}};
  uint32_t seed = 800;
  for (const Shape& s : shapes) {
    const int64_t D = s.back();
    std::vector<float> av = random_values(clustr::numel(s), seed++, -3.0f, 3.0f);
    // Every third row of the sum sits at 1e4 + small noise: the centring must happen in double.
    for (int64_t r = 0; r * D < static_cast<int64_t>(av.size()); r += 3)
      for (int64_t j = 0; j < D; ++j) av[r * D + j] = 1e4f + 1e-2f * av[r * D + j];
    const Tensor a = Tensor::from_vector(av, s);
    const Tensor b = random_tensor(s, seed++, -1e-2f, 1e-2f);
    const Tensor gamma = random_tensor({D}, seed++, 0.5f, 1.5f);
    const Tensor beta = random_tensor({D}, seed++);
    const Tensor dy = random_tensor(s, seed++);
    CAPTURE(clustr::to_string(s));
    const Inputs e =
        compare_devices(
            [](const Inputs& v) {
              const clustr::LayerNormOutput o =
                  clustr::add_layer_norm(v[0], v[1], v[2], v[3], 1e-5f);
              return Inputs{o.y, o.mean, o.rstd};
            },
            {a, b, gamma, beta}, {{"y", Tolerance::close(1e-6, 1e-6)}, {"mean", 1}, {"rstd", 1}})
            .cpu;
    const Tensor &mean = e[1], &rstd = e[2];

    // dx = rstd (dy gamma - mean(dy gamma) - xhat mean(dy gamma xhat)) cancels to 0 when D = 1:
    // where the device fuses multiply-adds (a GPU, the GPU-like emulation) what is left is the
    // rounding of the terms, up to a few ulps of rstd |dy gamma| (rstd is 316 for D = 1).
    double dx_atol = 1e-5;
    if (!clustr::cuda::exact_numerics()) {
      const std::vector<float> rv = rstd.to_vector(), dyv = dy.to_vector(), gv = gamma.to_vector();
      double scale = 0.0;
      for (size_t i = 0; i < dyv.size(); ++i)
        scale = std::max(scale, double(rv[i / size_t(D)]) *
                                    std::fabs(double(dyv[i]) * gv[i % size_t(D)]));
      dx_atol = std::max(dx_atol, 32.0 * FLT_EPSILON * scale);
    }
    // The device's backward reads the cpu's saved mean and rstd, so that only backward differs.
    compare_devices(
        [](const Inputs& v) {
          const clustr::LayerNormGrads g =
              clustr::add_layer_norm_backward(v[0], v[1], v[2], v[3], v[4], v[5]);
          return Inputs{g.dx, g.dgamma, g.dbeta};
        },
        {dy, a, b, mean, rstd, gamma},
        {{"dx", Tolerance::close(dx_atol, 1e-5)},
         {"dgamma", Tolerance::close(1e-6, 1e-6)},
         {"dbeta", Tolerance::close(1e-6, 1e-6)}});
  }
}

TEST_CASE("cuda fused: the autograd ops give the cpu's gradients on device variables") {
  // y = add_layer_norm(linear(x), feed_forward_relu(x)): every fused node, and linear with and
  // without its bias. x (B, N, D), W1 (F, D), W2 (D_out, F), Wl (D_out, D).
  const int64_t B = 3, N = 17, D = 5, F = 129, D_out = 3;
  uint32_t seed = 900;
  // Braced initialisers are evaluated in order, so the seeds are too.
  const Inputs values = {random_tensor({B, N, D}, seed++),
                           random_tensor({F, D}, seed++),
                           random_tensor({F}, seed++),
                           random_tensor({D_out, F}, seed++),
                           random_tensor({D_out}, seed++),
                           random_tensor({D_out, D}, seed++),
                           random_tensor({D_out}, seed++),
                           random_tensor({D_out}, seed++, 0.5f, 1.5f),
                           random_tensor({D_out}, seed++)};
  const char* names[] = {"x", "W1", "b1", "W2", "b2", "Wl", "bl", "gamma", "beta"};
  const Tensor dy = random_tensor({B, N, D_out}, seed++);
  std::vector<clustr::test::Output> grads;  // each value's gradient, named
  for (const char* name : names) grads.push_back({name, kGemm});
  Inputs inputs = values;
  inputs.push_back(dy);
  for (bool linear_bias : {true, false}) {
    CAPTURE(linear_bias);
    compare_devices(
        [&](const Inputs& in) {
          std::vector<Variable> v;  // the values (copies of in, so that each run starts afresh)
          for (size_t i = 0; i + 1 < in.size(); ++i) v.emplace_back(in[i].clone(), true);
          // x's gradients meet at a node (h), so that the products add into their sum.
          const Variable h = v[0] * 2.0f;
          const Variable a = clustr::linear(h, v[5], linear_bias ? v[6] : Variable());
          const Variable f = clustr::feed_forward_relu(h, v[1], v[2], v[3], v[4]);
          const Variable y = clustr::add_layer_norm(a, f, v[7], v[8], 1e-5f);
          CHECK(y.device() == in.back().device());
          y.backward(in.back());
          Inputs g;
          for (const Variable& p : v) g.push_back(p.grad());
          return g;
        },
        inputs, grads);
  }
}

TEST_CASE("cuda autograd: backward() starts from a kept 1, which no gradient shares") {
  // The leaf takes a copy of the seed each time (1 + 1); writing into its gradient afterwards
  // must not reach the seed of the next backward.
  Variable x(Tensor::full({}, 3.0f, Device::cuda), true);
  x.backward();
  x.backward();
  CHECK(x.grad().item() == 2.0f);
  Tensor g = x.grad();
  g.fill(7.0f);
  Variable y(Tensor::full({1, 1}, 2.0f, Device::cuda), true);
  clustr::mul(y, 3.0f).backward();
  CHECK(y.grad().to_vector() == std::vector<float>{3.0f});
}

TEST_CASE("cuda fused: inputs on two devices are refused with the op's name") {
  const Tensor x = Tensor::zeros({2, 3}, DType::f32, Device::cuda);
  const Tensor W = Tensor::zeros({4, 3});
  CHECK_ERROR(clustr::linear_forward(x, W, Tensor()), "linear_forward", "different devices");
  CHECK_ERROR(clustr::linear_forward(x, dev(W), Tensor::zeros({4})), "linear_forward",
              "different devices");
  const Tensor dy = Tensor::zeros({2, 4}, DType::f32, Device::cuda);
  CHECK_ERROR(clustr::linear_backward(dy, x, W, true, true, true), "linear_backward",
              "different devices");
  CHECK_ERROR(clustr::add_layer_norm(x, Tensor::zeros({2, 3}), Tensor::zeros({3}),
                                     Tensor::zeros({3}), 1e-5f),
              "add_layer_norm", "different devices");
}

// ---- argmax ------------------------------------------------------------------------------------

TEST_CASE("cuda argmax: the cpu's index over either kind of axis, ties and NaN included") {
  // Values from {-1, 0, 1} so that most rows have ties; some rows all equal, all -inf, with
  // NaN early or late, and -0 before +0.
  const Shape shapes[] = {{1, 1},    {3, 1},     {1, 17},  {17, 129}, {129, 3},
                          {3, 1000}, {2, 3, 17}, {4, 300, 5}, {2, 1, 3}};
  uint32_t seed = 1000;
  for (const Shape& s : shapes) {
    std::vector<float> v = random_values(clustr::numel(s), seed++, -1.5f, 1.5f);
    for (float& f : v) f = std::round(f);
    const int64_t n = static_cast<int64_t>(v.size());
    if (n > 40) {
      v[n / 2] = kNaN;
      v[n / 2 + 7] = kNaN;
      v[n - 1] = kNaN;
      for (int64_t i = 3; i < 20; ++i) v[i] = -kInf;
      v[21] = -0.0f;
      v[22] = 0.0f;
      v[n / 3] = 7.0f;
      v[n / 3 + 5] = 7.0f;
    }
    const Tensor x = Tensor::from_vector(v, s);
    for (int axis = 0; axis < x.rank(); ++axis)
      for (bool keepdim : {false, true}) {
        CAPTURE(clustr::to_string(s));
        CAPTURE(axis);
        compare_devices(
            [&](const Inputs& in) {
              const Tensor index = clustr::argmax(in[0], axis, keepdim);
              CHECK(index.dtype() == DType::i32);
              return index;
            },
            {x}, 0);
      }
  }
}

TEST_CASE("cuda argmax: hand cases of the tie and NaN rule") {
  // Rows of 300 (more than one block of threads' first pass): the first maximum, the first
  // NaN, index 0 for a row of -inf, and -0 / +0 counted equal.
  const int64_t L = 300;
  std::vector<float> v(static_cast<size_t>(5 * L), 0.0f);
  v[0 * L + 299] = 3.0f, v[0 * L + 44] = 3.0f, v[0 * L + 257] = 3.0f;
  v[1 * L + 280] = kNaN, v[1 * L + 10] = 9.0f, v[1 * L + 290] = kNaN;
  for (int64_t j = 0; j < L; ++j) v[2 * L + j] = -kInf;
  v[3 * L + 0] = -0.0f;
  v[4 * L + 256] = 1.0f, v[4 * L + 0] = kNaN;
  const Tensor x = Tensor::from_vector(v, {5, L});
  const std::vector<int32_t> want = {44, 280, 0, 0, 0};
  check_ints(clustr::argmax(x, 1).to_int_vector(), want);
  check_ints(clustr::argmax(dev(x), 1).to_int_vector(), want);
  // The same along axis 0 of the transpose.
  const Tensor xt = clustr::transpose(x, 0, 1);
  check_ints(clustr::argmax(dev(xt), 0).to_int_vector(), want);
}

// ---- CTC loss ----------------------------------------------------------------------------------

namespace {
Tolerance ctc_loss_tolerance() {
  return clustr::cuda::exact_numerics() ? Tolerance(0) : Tolerance::close(1e-5, 1e-5);
}
Tolerance ctc_grad_tolerance() {
  return clustr::cuda::exact_numerics() ? Tolerance::close(3e-7, 1e-6)
                                        : Tolerance::close(2e-5, 1e-5);
}
}  // namespace

TEST_CASE("cuda ctc: loss and gradient on the device equal the cpu's") {
  // B = 5, T = 17, C = 6: varied input lengths (one 0 with an empty target), repeated labels
  // (which need a blank between them), and utterance 3 impossible (4 labels with 2 repeats in
  // 5 frames).
  const int64_t B = 5, T = 17, C = 6;
  const Tensor x = random_tensor({B, T, C}, 1100, -3.0f, 3.0f);
  const Tensor il = ints({17, 9, 0, 5, 13});
  const Tensor tl = ints({3, 4, 0, 4, 2});
  const Tensor tg = ints({1, 2, 2, 5, 5, 5, 1, 3, 3, 3, 3, 4, 4});  // concatenated
  for (auto reduction : {clustr::CtcReduction::none, clustr::CtcReduction::sum,
                         clustr::CtcReduction::mean})
    for (bool zero_infinity : {true, false})
      for (bool lengths_on_device : {false, true}) {
        CAPTURE(clustr::to_string(reduction));
        CAPTURE(zero_infinity);
        CAPTURE(lengths_on_device);
        clustr::CtcOptions o;
        o.reduction = reduction;
        o.zero_infinity = zero_infinity;
        // The loss for each utterance, the loss, and x's gradient: absent where the loss is inf.
        const bool finite = zero_infinity || reduction == clustr::CtcReduction::none;
        compare_devices(
            [&](const Inputs& v) {  // v: x, then il, tg and tl (used on the device or not)
              const Variable xv(v[0], true);
              const clustr::CtcLoss l = lengths_on_device
                                            ? clustr::ctc_loss(xv, v[1], v[2], v[3], o)
                                            : clustr::ctc_loss(xv, il, tg, tl, o);
              CHECK(l.impossible == 1);
              // A gradient other than 1, so that backward's scaling is exercised.
              if (finite) l.loss.backward(Tensor::full(l.loss.shape(), 0.75f, v[0].device()));
              return Inputs{l.per_utterance, l.loss.data(), finite ? xv.grad() : Tensor()};
            },
            {x, il, tg, tl},
            {{"per_utterance", ctc_loss_tolerance()},
             {"loss", ctc_loss_tolerance()},
             {"x's gradient", ctc_grad_tolerance()}});
      }
}

TEST_CASE("cuda ctc: ctc_loss_forward on device logits, padded targets, NaN logits") {
  const int64_t B = 3, T = 129, C = 17;
  std::vector<float> xv = random_values(B * T * C, 1200, -4.0f, 4.0f);
  xv[2 * T * C + 5] = kNaN;  // utterance 2 only
  const Tensor x = Tensor::from_vector(xv, {B, T, C});
  const Tensor il = ints({129, 100, 64});
  // Padded (B, 6): 5, 2 and 6 labels.
  const Tensor padded = Tensor::from_int_vector(
      {3, 3, 3, 1, 16, 0, 2, 2, 0, 0, 0, 0, 7, 8, 7, 8, 9, 9}, {B, 6});
  const Tensor tl = ints({5, 2, 6});
  // The logits on the device; the lengths and targets stay on the host.
  const auto r = compare_devices(
      [&](const Inputs& v) {
        const clustr::CtcOutput o = clustr::ctc_loss_forward(v[0], il, padded, tl, 0, true);
        return Inputs{o.loss, o.grad};
      },
      {x}, {{"loss", ctc_loss_tolerance()}, {"grad", ctc_grad_tolerance()}});
  const std::vector<float> g_loss = r.device[0].to_vector();
  CHECK(std::isnan(g_loss[2]));
  CHECK(std::isfinite(g_loss[0]));
  const clustr::CtcOutput n = clustr::ctc_loss_forward(dev(x), il, padded, tl, 0, false);
  CHECK(!n.grad.defined());
  check_ulps(n.loss.to_vector(), r.device[0].to_vector(), 0);  // with or without the gradient
}

TEST_CASE("cuda ctc: long utterances, a blank other than 0, labels that recur apart") {
  // T = 300 frames (utterance 1 padded to 211), V = 31 with the blank last, 60 and 45 labels
  // drawn from 5 classes (each class recurs many times, near and far: the device's chains of
  // positions per class), the third target a single label repeated (a blank between each).
  const int64_t B = 3, T = 300, V = 31, U0 = 60, U1 = 45, U2 = 7;
  const Tensor x = random_tensor({B, T, V}, 1400, -5.0f, 5.0f);
  std::vector<int32_t> labels;
  uint32_t h = 12345;
  for (int64_t k = 0; k < U0 + U1; ++k) {
    h = h * 1664525u + 1013904223u;
    labels.push_back(static_cast<int32_t>((h >> 24) % 5) * 3);
  }
  for (int64_t k = 0; k < U2; ++k) labels.push_back(7);
  const Tensor tg = Tensor::from_int_vector(labels, {U0 + U1 + U2});
  const Tensor il = ints({300, 211, 20}), tl = ints({U0, U1, U2});
  for (auto reduction : {clustr::CtcReduction::none, clustr::CtcReduction::mean}) {
    CAPTURE(clustr::to_string(reduction));
    clustr::CtcOptions o;
    o.blank = static_cast<int>(V - 1);
    o.reduction = reduction;
    compare_devices(
        [&](const Inputs& v) {
          const Variable xv(v[0], true);
          const clustr::CtcLoss l = clustr::ctc_loss(xv, il, tg, tl, o);
          CHECK(l.impossible == 0);
          l.loss.backward(Tensor::full(l.loss.shape(), 1.5f, v[0].device()));
          return Inputs{l.per_utterance, l.loss.data(), xv.grad()};
        },
        {x},
        {{"per_utterance", ctc_loss_tolerance()},
         {"loss", ctc_loss_tolerance()},
         {"x's gradient", ctc_grad_tolerance()}});
  }
}

TEST_CASE("cuda ctc: logits of -inf: the loss is +inf, counted impossible on the cpu only") {
  // Utterance 0's target needs class 2, whose logit is -inf in every frame: no alignment has a
  // nonzero probability although the target fits. Utterance 1 is ordinary.
  const int64_t B = 2, T = 6, V = 4;
  std::vector<float> v = random_values(B * T * V, 1500, -2.0f, 2.0f);
  for (int64_t t = 0; t < T; ++t) v[static_cast<size_t>(t * V + 2)] = -kInf;
  const Tensor x = Tensor::from_vector(v, {B, T, V});
  const Tensor il = ints({6, 6}), tl = ints({2, 2}), tg = ints({1, 2, 3, 1});
  clustr::CtcOptions o;
  o.reduction = clustr::CtcReduction::none;
  const clustr::CtcLoss cpu = clustr::ctc_loss(Variable(x, true), il, tg, tl, o);
  const Variable xd(dev(x), true);
  const clustr::CtcLoss gpu = clustr::ctc_loss(xd, il, tg, tl, o);
  CHECK(cpu.impossible == 1);
  CHECK(gpu.impossible == 0);
  const std::vector<float> lc = cpu.per_utterance.to_vector(), lg = gpu.per_utterance.to_vector();
  CHECK(lc[0] == kInf);
  CHECK(lg[0] == kInf);
  check_output(gpu.per_utterance, cpu.per_utterance, ctc_loss_tolerance());
  gpu.loss.backward(Tensor::full({B}, 1.0f, Device::cuda));
  const std::vector<float> g = xd.grad().to_vector();
  for (int64_t i = 0; i < T * V; ++i) REQUIRE(g[static_cast<size_t>(i)] == 0.0f);
}

TEST_CASE("cuda ctc: bad inputs on the device get the cpu's errors") {
  const Tensor x = dev(random_tensor({2, 5, 4}, 1300));
  const Tensor il = ints({5, 4}), tl = ints({2, 1});
  CHECK_ERROR(clustr::ctc_loss(Variable(x), il, dev(ints({1, 4, 3})), tl), "ctc_loss", "label 4",
              "utterance 0", "position 1");
  CHECK_ERROR(clustr::ctc_loss(Variable(x), dev(ints({5, 6})), ints({1, 2, 3}), tl),
              "input_lengths[1] = 6", "outside [0, T = 5]");
  CHECK_ERROR(clustr::ctc_loss(Variable(x), il, ints({1, 2, 3}), dev(ints({2, 2}))),
              "concatenated targets", "sum(target_lengths) = 4");
  // A target longer than the kernel's rows fit in shared memory: refused before any launch.
  const int64_t U = clustr::cuda::kCtcMaxLabels + 1;
  const Tensor long_x = dev(random_tensor({1, U, 3}, 1310));
  const Tensor long_target = Tensor::from_int_vector(std::vector<int32_t>(U, 1), {U});
  CHECK_ERROR(clustr::ctc_loss(Variable(long_x), ints({static_cast<int32_t>(U)}), long_target,
                               ints({static_cast<int32_t>(U)})),
              "ctc_loss", "4001 labels", "longer than the CUDA kernel takes", "on the cpu");
}

// ---- layers on the device ----------------------------------------------------------------------

namespace {

// The layers of a training step without attention: embedding, positional encoding, dropout,
// a GELU feed-forward block with dropout, a fused ReLU one, the residual layer norm, the
// output projection and cross-entropy. Built from one seed, so two copies start equal.
struct Stack : clustr::Module {
  std::shared_ptr<clustr::Embedding> embed;
  std::shared_ptr<clustr::Dropout> drop;
  std::shared_ptr<clustr::FeedForward> gelu_ff, relu_ff;
  std::shared_ptr<clustr::LayerNorm> norm;
  std::shared_ptr<clustr::Linear> out;
  clustr::PositionalEncoding position{5};
  explicit Stack(clustr::Generator& gen) {
    using clustr::Activation;
    embed = register_module("embed", std::make_shared<clustr::Embedding>(11, 5, gen));
    drop = register_module("drop", std::make_shared<clustr::Dropout>(0.25f));
    gelu_ff = register_module(
        "gelu_ff", std::make_shared<clustr::FeedForward>(5, 17, Activation::gelu, 0.25f, gen));
    relu_ff = register_module(
        "relu_ff", std::make_shared<clustr::FeedForward>(5, 3, Activation::relu, 0.0f, gen));
    norm = register_module("norm", std::make_shared<clustr::LayerNorm>(5));
    out = register_module("out", std::make_shared<clustr::Linear>(5, 11, true, gen));
  }
  // index i32 (B, N) -> loss ().
  Variable loss(const Tensor& index, const Tensor& target, clustr::Generator& gen) const {
    Variable x = drop->forward(position.forward(embed->forward(index)), gen);  // (B, N, 5)
    x = x + gelu_ff->forward(x, gen);
    x = norm->forward(x, relu_ff->forward(x, gen));
    return clustr::cross_entropy(out->forward(x), target);  // (B, N, 11) against (B, N)
  }
};

}  // namespace

TEST_CASE("cuda fused: a model moved to the device gets the cpu's loss and gradients") {
  clustr::Generator init_cpu(31), init_dev(31);
  Stack on_cpu(init_cpu), on_dev(init_dev);
  on_dev.to(Device::cuda);
  for (const auto& p : on_dev.named_parameters()) {
    CAPTURE(p.first);
    CHECK(p.second.device() == Device::cuda);
    CHECK(p.second.requires_grad());
  }
  std::vector<int32_t> idx(3 * 17), tgt(3 * 17);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t(i * 7 % 11), tgt[i] = int32_t(i % 11);
  const Tensor index = Tensor::from_int_vector(idx, {3, 17});
  const Tensor target = Tensor::from_int_vector(tgt, {3, 17});
  clustr::Generator drop_cpu(5), drop_dev(5);
  const Variable le = on_cpu.loss(index, target, drop_cpu);
  const Variable lg = on_dev.loss(dev(index), dev(target), drop_dev);
  CHECK(lg.device() == Device::cuda);
  CHECK_CLOSE(lg.data().to_vector(), le.data().to_vector(), 1e-6, 1e-5);
  le.backward();
  lg.backward();
  const auto pe = on_cpu.named_parameters(), pg = on_dev.named_parameters();
  REQUIRE(pe.size() == pg.size());
  for (size_t i = 0; i < pe.size(); ++i)
    check_gemm_close(pe[i].first.c_str(), pg[i].second.grad(), pe[i].second.grad());
}
