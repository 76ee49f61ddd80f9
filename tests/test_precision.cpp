// The bf16 precision policy (core/precision.h) on the CPU: the setting and its scopes, each op
// of the policy against its f32 result, the products' precision recorded by autograd nodes,
// full attention, the clustered types and an encoder layer's gradients in bf16 against f32.
//
// Tolerances come from bf16's 8-bit significand: rounding to nearest changes a value by at most
// u = 2^-8 of itself, so a product of two rounded operands is within 2u + u^2 of the exact
// one, and a sum of products sum_k a_k b_k moves by at most (2u + u^2) sum_k |a_k b_k|. The
// float32 sums add K 2^-24 sum_k |a_k b_k| on each side. The element-wise bounds below are those,
// computed from |A| |B|; where the rounded operands are given to an f32 op instead, only the f32
// terms remain.
#include <cmath>
#include <thread>
#include <utility>
#include <vector>

#include "attention_cases.h"
#include "autograd/ops.h"
#include "check.h"
#include "core/bf16.h"
#include "core/ops.h"
#include "core/precision.h"
#include "core/random.h"
#include "layers/attention/clustered.h"
#include "layers/attention/full.h"
#include "layers/attention/improved_clustered.h"
#include "layers/encoder.h"

using namespace clustr;
using namespace clustr::test;

namespace {

constexpr double kU = 1.0 / 256;  // bf16's unit roundoff, 2^-8

// x with every element rounded to bf16 and back (f32).
Tensor rounded(const Tensor& x) { return x.astype(DType::bf16).astype(DType::f32); }

Tensor abs_of(const Tensor& x) { return unary(UnaryOp::abs, x); }

// Per element: |actual - expected| <= tol. On failure, the count and the worst element.
void check_within(const std::vector<float>& actual, const std::vector<float>& expected,
                  const std::vector<float>& tol, const char* what) {
  REQUIRE(actual.size() == expected.size());
  REQUIRE(tol.size() == expected.size());
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::fabs(double(actual[i]) - expected[i]);
    if (!(err <= tol[i])) {
      ++bad;
      const double ratio = std::isnan(err) ? INFINITY : err / std::max(1e-30, double(tol[i]));
      if (worst < 0 || ratio > worst_ratio) worst = int64_t(i), worst_ratio = ratio;
    }
  }
  CHECK_MESSAGE(bad == 0, std::string(what) << ": " << bad << " of " << actual.size()
                               << " elements outside their bound; worst at " << worst << ": "
                               << (worst >= 0 ? actual[worst] : 0.0f) << " vs "
                               << (worst >= 0 ? expected[worst] : 0.0f) << ", bound "
                               << (worst >= 0 ? tol[worst] : 0.0f));
}

// The bound of a product computed with bf16 operands against the f32 one: (2u + u^2 +
// 2 K 2^-24) |A| |B| per element (absA_absB holds |A| |B|), plus a floor for zeros.
std::vector<float> bf16_bound(const Tensor& absA_absB, int64_t K) {
  std::vector<float> t = absA_absB.to_vector();
  const double f = 2 * kU + kU * kU + 2.0 * double(K) * std::ldexp(1.0, -24);
  for (float& v : t) v = float(f * v * 1.0001 + 1e-30);
  return t;
}
// The bound of the same products with the same rounded operands summed in another order.
std::vector<float> f32_bound(const Tensor& absA_absB, int64_t K) {
  std::vector<float> t = absA_absB.to_vector();
  const double f = 2.0 * double(K + 2) * std::ldexp(1.0, -24);
  for (float& v : t) v = float(f * v + 1e-30);
  return t;
}

// The largest |a - b| over the elements, relative to the largest |b|.
double max_rel(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  double d = 0, m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    d = std::max(d, std::fabs(double(x[i]) - y[i]));
    m = std::max(m, std::fabs(double(y[i])));
  }
  return d / std::max(m, 1e-30);
}

// ||a - b|| / ||b|| over all elements.
double norm_rel(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  double d = 0, n = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    d += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    n += double(y[i]) * y[i];
  }
  return std::sqrt(d / std::max(n, 1e-300));
}

// sum_j w_j x_j and sum_j w_j |x_j| over j < n, with w_j = p[j] / total and x_j = x[j ld]:
// a weighted column of V and its magnitude.
std::pair<double, double> weighted_column(const std::vector<double>& p, double total,
                                          const float* x, int64_t ld, int64_t n) {
  double sum = 0, mag = 0;
  for (int64_t j = 0; j < n; ++j) {
    sum += p[j] / total * x[j * ld];
    mag += p[j] / total * std::fabs(x[j * ld]);
  }
  return {sum, mag};
}

// ||a - b|| / ||b||, for vectors.
double norm_rel(const std::vector<float>& x, const std::vector<float>& y) {
  return norm_rel(Tensor::from_vector(x, {int64_t(x.size())}),
                  Tensor::from_vector(y, {int64_t(y.size())}));
}

}  // namespace

TEST_CASE("precision: names, parsing, nested scopes, one setting per thread") {
  CHECK(parse_precision("fp32") == Precision::fp32);
  CHECK(parse_precision("bf16") == Precision::bf16);
  CHECK(std::string(to_string(Precision::bf16)) == "bf16");
  CHECK_ERROR(parse_precision("fp16"), "unknown precision 'fp16'", "fp32 or bf16");
  CHECK(current_precision() == Precision::fp32);
  {
    PrecisionScope outer(Precision::bf16);
    CHECK(current_precision() == Precision::bf16);
    Precision other = Precision::bf16;
    std::thread([&] { other = current_precision(); }).join();
    CHECK(other == Precision::fp32);  // another thread keeps its own
    {
      PrecisionScope inner(Precision::fp32);
      CHECK(current_precision() == Precision::fp32);
    }
    CHECK(current_precision() == Precision::bf16);
  }
  CHECK(current_precision() == Precision::fp32);
}

TEST_CASE("precision: matmul in bf16 is the product of the rounded operands, on every layout") {
  for (int rank : {2, 3})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t M = 37, N = 29, K = 71, batch = rank == 3 ? 3 : 1;
        auto shape = [&](int64_t r, int64_t c) {
          return rank == 2 ? Shape{r, c} : Shape{batch, r, c};
        };
        const Tensor A = random_tensor(ta ? shape(K, M) : shape(M, K), 1);
        const Tensor B = random_tensor(tb ? shape(N, K) : shape(K, N), 2);
        INFO("rank ", rank, " ta=", ta, " tb=", tb);
        const Tensor got = matmul(A, B, ta, tb, Precision::bf16);
        // The same as the product of bf16 tensors (the same kernel on the same bf16 values).
        CHECK(got.to_vector() ==
              matmul(A.astype(DType::bf16), B.astype(DType::bf16), ta, tb).to_vector());
        const Tensor mag = matmul(abs_of(A), abs_of(B), ta, tb);
        check_within(got.to_vector(), matmul(rounded(A), rounded(B), ta, tb).to_vector(),
                     f32_bound(mag, K), "against f32 on rounded operands");
        const Tensor f32 = matmul(A, B, ta, tb);
        check_within(got.to_vector(), f32.to_vector(), bf16_bound(mag, K), "against f32");
        // And it is not the f32 product: bf16 rounding shows far above f32 noise.
        CHECK(max_rel(got, f32) > 1e-4);
      }
}

TEST_CASE("precision: linear forward and backward in bf16 against f32") {
  const int64_t R = 75, in = 48, out = 33;
  const Tensor x = random_tensor({R, in}, 3), W = random_tensor({out, in}, 4);
  const Tensor b = random_tensor({out}, 5), dy = random_tensor({R, out}, 6);
  for (bool relu : {false, true}) {
    INFO("relu ", relu);
    const Tensor y = linear_forward(x, W, b, relu, Precision::bf16);
    const Tensor mag = add(matmul(abs_of(x), abs_of(W), false, true), abs_of(b));
    Tensor want = linear_forward(rounded(x), rounded(W), b, relu);
    check_within(y.to_vector(), want.to_vector(), f32_bound(mag, in), "y vs rounded");
    check_within(y.to_vector(), linear_forward(x, W, b, relu).to_vector(), bf16_bound(mag, in),
                 "y vs f32");
  }
  const LinearGrads g = linear_backward(dy, x, W, true, true, true, Precision::bf16);
  const LinearGrads r = linear_backward(rounded(dy), rounded(x), rounded(W), true, true, true);
  const LinearGrads f = linear_backward(dy, x, W, true, true, true);
  const Tensor mag_dx = matmul(abs_of(dy), abs_of(W)), mag_dw = matmul(abs_of(dy), abs_of(x), true);
  check_within(g.dx.to_vector(), r.dx.to_vector(), f32_bound(mag_dx, out), "dx vs rounded");
  check_within(g.dx.to_vector(), f.dx.to_vector(), bf16_bound(mag_dx, out), "dx vs f32");
  check_within(g.dW.to_vector(), r.dW.to_vector(), f32_bound(mag_dw, R), "dW vs rounded");
  check_within(g.dW.to_vector(), f.dW.to_vector(), bf16_bound(mag_dw, R), "dW vs f32");
  // The bias gradient is a sum of dy's f32 values, not a product: f32 in both precisions.
  CHECK(g.db.to_vector() == f.db.to_vector());
  CHECK(max_rel(g.dW, f.dW) > 1e-4);
}

TEST_CASE("precision: linear_forward stores a bf16 result as its f32 result rounded") {
  const Tensor x = random_tensor({45, 24}, 31), W = random_tensor({70, 24}, 32);
  const Tensor b = random_tensor({70}, 33), W2 = random_tensor({20, 70}, 34);
  for (bool relu : {false, true}) {
    INFO("relu ", relu);
    const Tensor y = linear_forward(x, W, b, relu, Precision::bf16);
    const Tensor y16 = linear_forward(x, W, b, relu, Precision::bf16, DType::bf16);
    CHECK(y16.dtype() == DType::bf16);
    CHECK(y16.shape() == y.shape());
    CHECK(y16.astype(DType::f32).to_vector() == rounded(y).to_vector());
    // A bf16 x is read as it is: the same result as its f32 copy under the bf16 policy.
    CHECK(linear_forward(y16, W2, {}, false, Precision::fp32).to_vector() ==
          linear_forward(y16.astype(DType::f32), W2, {}, false, Precision::bf16).to_vector());
  }
  CHECK_ERROR(linear_forward(x, W, b, false, Precision::fp32, DType::bf16), "linear_forward",
              "bf16 in the bf16 precision");
  CHECK_ERROR(linear_forward(x, W, b, false, Precision::bf16, DType::i32), "linear_forward",
              "got i32");
}

TEST_CASE("precision: the feed-forward block's backward in bf16 against its f32 chain") {
  const int64_t R = 40, D = 24, F = 56;
  const Tensor x = random_tensor({R, D}, 7), W1 = random_tensor({F, D}, 8);
  const Tensor b1 = random_tensor({F}, 9), W2 = random_tensor({D, F}, 10);
  const Tensor dy = random_tensor({R, D}, 11);
  const Tensor H = linear_forward(x, W1, b1, true, Precision::bf16);
  const FeedForwardGrads g = feed_forward_relu_backward(dy, x, W1, W2, H, {}, Precision::bf16);
  // The chain in f32 on the rounded operands: dP = (dy W2) [H > 0] is rounded again where it
  // enters dx = dP W1 and dW1 = dP^T x.
  const Tensor dP = mul(matmul(rounded(dy), rounded(W2)), unary_backward(UnaryOp::relu, H, {},
                        Tensor::full({R, F}, 1.0f)));
  const Tensor dx = matmul(rounded(dP), rounded(W1)), dW1 = matmul(rounded(dP), rounded(x), true);
  const Tensor dW2 = matmul(rounded(dy), rounded(H), true);
  check_within(g.dW2.to_vector(), dW2.to_vector(),
               f32_bound(matmul(abs_of(dy), abs_of(H), true), R), "dW2");
  check_within(g.dx.to_vector(), dx.to_vector(), f32_bound(matmul(abs_of(dP), abs_of(W1)), F),
               "dx");
  check_within(g.dW1.to_vector(), dW1.to_vector(),
               f32_bound(matmul(abs_of(dP), abs_of(x), true), R), "dW1");
  // db2 sums dy's rows: f32 in both precisions. db1 sums dP's rows, and dP, a bf16 product,
  // is stored in bf16: each term within one rounding (u |dP|) of the f32 chain's, plus the f32
  // error of the product and of the sum.
  const FeedForwardGrads f = feed_forward_relu_backward(dy, x, W1, W2, H, {});
  CHECK(g.db2.to_vector() == f.db2.to_vector());
  const Tensor mag_dp = mul(matmul(abs_of(dy), abs_of(W2)), unary_backward(UnaryOp::relu, H, {},
                            Tensor::full({R, F}, 1.0f)));
  std::vector<float> db1_bound = sum(mag_dp, 0).to_vector();
  const double per_term = kU * 1.0001 + 2.0 * double(D + R + 2) * std::ldexp(1.0, -24);
  for (float& b : db1_bound) b = float(b * per_term);
  check_within(g.db1.to_vector(), sum(rounded(dP), 0).to_vector(), db1_bound, "db1");
  // The bf16 dP shows: the sums of the unrounded dP are off by far more than f32 noise.
  CHECK(max_rel(g.db1, sum(dP, 0)) > 1e-5);
}

TEST_CASE("precision: autograd nodes compute backward in their forward's precision") {
  const Tensor x0 = random_tensor({6, 20}, 12), w0 = random_tensor({15, 20}, 13);
  const Tensor b0 = random_tensor({15}, 14), g0 = random_tensor({6, 15}, 15);
  for (const char* op : {"linear", "matmul", "feed_forward_relu"}) {
    const std::string name = op;
    auto grads = [&](Precision forward, Precision backward) {
      Variable x(x0.clone(), true), w(w0.clone(), true), b(b0.clone(), true);
      Variable w2(random_tensor({15, 15}, 16), true), b2(random_tensor({15}, 17), true);
      Variable y;
      {
        PrecisionScope s(forward);
        y = name == "linear"   ? linear(x, w, b)
            : name == "matmul" ? matmul(x, w, false, true)
                               : feed_forward_relu(x, w, b, w2, b2);
      }
      PrecisionScope s(backward);
      y.backward(g0);
      std::vector<float> all = x.grad().to_vector();
      for (float e : w.grad().to_vector()) all.push_back(e);
      return all;
    };
    INFO(name);
    const std::vector<float> bf16 = grads(Precision::bf16, Precision::bf16);
    CHECK(grads(Precision::bf16, Precision::fp32) == bf16);
    CHECK(grads(Precision::fp32, Precision::bf16) == grads(Precision::fp32, Precision::fp32));
    CHECK(grads(Precision::fp32, Precision::fp32) != bf16);
  }
}

TEST_CASE("precision: full attention's output in bf16 within the bound of its rounded products") {
  // out = softmax(t Q K^T) V with Q, K, V and the weights P rounded: against the same in
  // double from the rounded Q, K, V and exact P, each element of out is within u sum_j P_ij
  // |V_jc| (P's rounding) plus f32 noise.
  const int64_t B = 2, H = 2, N = 37, S = 37, E = 16;
  const Tensor Q = random_tensor({B, H, N, E}, 16), K = random_tensor({B, H, S, E}, 17);
  const Tensor V = random_tensor({B, H, S, E}, 18);
  FullAttentionOptions o;
  o.precision = Precision::bf16;
  const FullAttentionOutput got = full_attention_forward(Q, K, V, {}, o);
  const std::vector<float> q = rounded(Q).to_vector(), k = rounded(K).to_vector(),
                           v = rounded(V).to_vector();
  std::vector<float> want(got.out.numel()), tol(got.out.numel());
  const double t = 1.0 / std::sqrt(double(E));
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < N; ++i) {
      std::vector<double> p(S);
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < S; ++j) {
        double s = 0;
        for (int64_t e = 0; e < E; ++e) s += double(q[(bh * N + i) * E + e]) * k[(bh * S + j) * E + e];
        p[j] = t * s;
        mx = std::max(mx, p[j]);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int64_t c = 0; c < E; ++c) {
        const auto [o_ic, mag] = weighted_column(p, sum, v.data() + bh * S * E + c, E, S);
        want[(bh * N + i) * E + c] = float(o_ic);
        // P's rounding, the scores' f32 sums (E terms of t |q| |k| <= 4 t each, through exp:
        // a relative change of P up to E 2^-23 4 t), and the f32 sums of P V.
        tol[(bh * N + i) * E + c] =
            float((kU + 4.0 * E * t * std::ldexp(1.0, -23) + 2.0 * S * std::ldexp(1.0, -24)) *
                      mag * 1.01 + 1e-7);
      }
    }
  check_within(got.out.to_vector(), want, tol, "attention output");
  CHECK(max_rel(got.out, full_attention_forward(Q, K, V, {}, FullAttentionOptions{}).out) > 1e-4);
}

TEST_CASE("precision: an encoder layer's gradients in bf16 against f32") {
  // Each gradient of the layer passes through a few chained products (the output projection,
  // attention, Q/K/V, two feed-forward GEMMs), each adding at most 2u relative error per term
  // (u = 2^-8) before the terms' signs average some of it out: a normwise relative error of a
  // few u. Measured: 0.3u to 1.6u; the bound is 4u = 1.6%.
  const int64_t B = 2, N = 24, D = 32, H = 4, F = 64;
  Generator gen(3);
  EncoderLayer layer(D, H, F, AttentionConfig{}, 0.0f, Activation::relu, false, gen);
  const Tensor x0 = random_tensor({B, N, D}, 19), g0 = random_tensor({B, N, D}, 20);
  auto run = [&](Precision p) {
    layer.zero_grad();
    Variable x(x0.clone(), true);
    {
      PrecisionScope s(p);
      Generator g(5);
      layer.forward(x, Tensor(), g).backward(g0);
    }
    std::vector<Tensor> grads = {x.grad()};
    for (const auto& [name, v] : layer.named_parameters()) grads.push_back(v.grad().clone());
    return grads;
  };
  const std::vector<Tensor> f32 = run(Precision::fp32), bf16 = run(Precision::bf16);
  const auto params = layer.named_parameters();
  double worst = 0;
  for (size_t i = 0; i < f32.size(); ++i) {
    const std::string name = i == 0 ? std::string("x") : params[i - 1].first;
    const double e = norm_rel(bf16[i], f32[i]);
    INFO("gradient of ", name, ": ||bf16 - f32|| / ||f32|| = ", e);
    if (name == "attention.key.bias") {
      // Zero in exact arithmetic (a key bias adds q . b to a whole row of scores, which the
      // softmax ignores): only rounding noise, far below the other gradients, in both.
      auto max_abs = [](const Tensor& t) {
        double m = 0;
        for (float v : t.to_vector()) m = std::max(m, double(std::fabs(v)));
        return m;
      };
      CHECK(max_abs(bf16[i]) < 1e-3 * max_abs(f32[0]));
      continue;
    }
    worst = std::max(worst, e);
    CHECK(e < 4 * kU);
    // Every gradient but norm2's bias (the sum of the output gradient) passes through a bf16
    // product.
    if (name != "norm2.bias") CHECK(e > 1e-6);
  }
  MESSAGE("encoder layer, worst normwise relative gradient difference bf16 vs f32: " << worst);
}

TEST_CASE("precision: clustered attention in bf16: Ac and out within the bounds of their rounded "
          "products") {
  // Ac = softmax(t Qc K^T) from the centroids and keys rounded to bf16: against the same in
  // double, each score is off by the f32 sums of its E products only, (E + 2) 2^-24 t sum_e
  // |qc_e k_e|, which moves a weight by at most about twice that relative to itself. Unrounded
  // operands would put the scores off by up to 2u of that sum, far outside. out = Ac V, with Ac
  // and V rounded: within u sum_l Ac_l |V_l| (Ac's rounding) plus the same f32 terms.
  const test::AttentionCase c{2, 2, 37, 37, 16, 16, 5, 1, {37, 30}};
  const test::AttentionInputs in = test::make_attention_inputs(c, 60);
  const ClusteredAttentionOutput got = clustered_attention_forward(
      in.Q, in.K, in.V, in.lengths, in.assignment, c.C, 0.0f, {}, Precision::bf16);
  CHECK(got.precision == Precision::bf16);
  const std::vector<float> qc = rounded(got.centroids).to_vector(), k = rounded(in.K).to_vector(),
                           v = rounded(in.V).to_vector(), ac = got.weights.to_vector();
  const std::vector<int32_t> count = got.counts.to_int_vector(),
                             a = in.assignment.to_int_vector();
  std::vector<float> want_ac(ac.size(), 0.0f), tol_ac(ac.size(), 0.0f);
  std::vector<float> out = got.out.to_vector(), want(out.size(), 0.0f), tol(out.size(), 0.0f);
  const int64_t E = c.E, S = c.S, C = c.C, N = c.N, M = c.M;
  const double t = 1.0 / std::sqrt(double(E)), f32 = std::ldexp(1.0, -24);
  for (int64_t bh = 0; bh < c.B * c.H; ++bh) {
    const int64_t L = c.lengths[bh / c.H];
    for (int64_t j = 0; j < C; ++j) {
      if (count[bh * C + j] == 0) continue;
      std::vector<double> p(L);
      double mx = -INFINITY, sum = 0, score_err = 0;
      for (int64_t l = 0; l < L; ++l) {
        double s = 0, mag = 0;
        for (int64_t e = 0; e < E; ++e) {
          const double x = double(qc[(bh * C + j) * E + e]) * k[(bh * S + l) * E + e];
          s += x;
          mag += std::fabs(x);
        }
        p[l] = t * s;
        mx = std::max(mx, p[l]);
        score_err = std::max(score_err, (E + 2) * f32 * t * mag);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      // A weight's relative error: the scores', the exponential's and the normalising sum's.
      const double rel = 2.2 * score_err + (L + 8) * 2 * f32;
      for (int64_t l = 0; l < L; ++l) {
        want_ac[(bh * C + j) * S + l] = float(p[l] / sum);
        tol_ac[(bh * C + j) * S + l] = float(rel * p[l] / sum * 1.01 + 1e-12);
      }
      for (int64_t i = 0; i < N; ++i) {
        if (a[bh * N + i] != j) continue;
        for (int64_t m = 0; m < M; ++m) {
          const auto [o, mag] = weighted_column(p, sum, v.data() + bh * S * M + m, M, L);
          want[(bh * N + i) * M + m] = float(o);
          tol[(bh * N + i) * M + m] = float((kU + rel + 2.0 * L * f32) * mag * 1.01 + 1e-7);
        }
      }
    }
  }
  check_within(ac, want_ac, tol_ac, "clustered Ac");
  check_within(out, want, tol, "clustered output");
  CHECK(max_rel(got.out, clustered_attention_forward(in.Q, in.K, in.V, in.lengths,
                                                     in.assignment, c.C)
                             .out) > 1e-4);
}

TEST_CASE("precision: the clustered types in bf16: gradients against f32, the precision kept "
          "for backward, the same bits at 1 and 2 threads") {
  // The C x S products are bf16 (clustered.h); the gradients pass through two or three of them,
  // each adding at most 2u relative error per term: normwise within 4u of f32, as the encoder
  // layer's below.
  const test::AttentionCase c{2, 3, 40, 40, 16, 16, 6, 8, {40, 25}};
  const test::AttentionInputs in = test::make_attention_inputs(c, 70);
  for (bool improved : {false, true}) {
    INFO(std::string(improved ? "improved-clustered" : "clustered"));
    auto run = [&](Precision forward, Precision backward) {
      Variable Q(in.Q, true), K(in.K, true), V(in.V, true), out;
      {
        PrecisionScope s(forward);
        out = improved ? improved_clustered_attention(Q, K, V, in.lengths, in.assignment, c.C,
                                                      c.k)
                       : clustered_attention(Q, K, V, in.lengths, in.assignment, c.C);
      }
      PrecisionScope s(backward);
      out.backward(in.dO);
      return test::AttentionResult{out.data().to_vector(), Q.grad().to_vector(),
                                   K.grad().to_vector(), V.grad().to_vector()};
    };
    const test::AttentionResult bf16 = run(Precision::bf16, Precision::bf16),
                                f32 = run(Precision::fp32, Precision::fp32);
    // The node keeps the forward's precision for backward: the tensor-level pair in bf16 gives
    // the same bits, whatever this thread's setting is when backward runs.
    test::AttentionResult direct;
    if (improved) {
      const ImprovedClusteredAttentionOutput f = improved_clustered_attention_forward(
          in.Q, in.K, in.V, in.lengths, in.assignment, c.C, c.k, 0.0f, {}, Precision::bf16);
      const ImprovedClusteredAttentionGrads g = improved_clustered_attention_backward(
          in.dO, in.Q, in.K, in.V, in.lengths, in.assignment, f);
      direct = {f.out.to_vector(), g.dQ.to_vector(), g.dK.to_vector(), g.dV.to_vector()};
    } else {
      const ClusteredAttentionOutput f = clustered_attention_forward(
          in.Q, in.K, in.V, in.lengths, in.assignment, c.C, 0.0f, {}, Precision::bf16);
      const ClusteredAttentionGrads g =
          clustered_attention_backward(in.dO, in.K, in.V, in.lengths, in.assignment, f);
      direct = {f.out.to_vector(), g.dQ.to_vector(), g.dK.to_vector(), g.dV.to_vector()};
    }
    for (const test::AttentionResult& r : {bf16, run(Precision::bf16, Precision::fp32)}) {
      CHECK(r.out == direct.out);
      CHECK(r.dQ == direct.dQ);
      CHECK(r.dK == direct.dK);
      CHECK(r.dV == direct.dV);
    }
    const std::vector<float>* pairs[][2] = {
        {&bf16.out, &f32.out}, {&bf16.dQ, &f32.dQ}, {&bf16.dK, &f32.dK}, {&bf16.dV, &f32.dV}};
    for (const auto& pr : pairs) {
      const double e = norm_rel(*pr[0], *pr[1]);
      INFO("||bf16 - f32|| / ||f32|| = ", e);
      CHECK(e < 4 * kU);
      CHECK(e > 1e-6);
    }
    test::check_thread_independent([&] { return run(Precision::bf16, Precision::bf16); });
  }
}
