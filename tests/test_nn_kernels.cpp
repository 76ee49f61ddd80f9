// The nn kernels against plain double loops: unary derivatives, softmax / log-softmax backward,
// layer norm forward and backward (constant rows, rows of 1e4 + noise, sizes 1, 3, 17, 129),
// cross-entropy (logits of 1e4, ignored rows, weights, every row ignored), dropout (the exact
// Philox mask on the vector and portable paths, its statistics, reproducibility), thread-count independence and error messages.
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "check.h"
#include "core/cpu/nn.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/philox.h"

using namespace clustr;
using namespace clustr::test;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kPi = 3.14159265358979323846;

Tensor vec(const std::vector<float>& v, const Shape& s) { return Tensor::from_vector(v, s); }

// f'(x) in double.
double ref_derivative(UnaryOp op, double x) {
  switch (op) {
    case UnaryOp::neg: return -1;
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return 1 / x;
    case UnaryOp::sqrt: return 0.5 / std::sqrt(x);
    case UnaryOp::abs: return x > 0 ? 1 : (x < 0 ? -1 : 0);
    case UnaryOp::relu: return x > 0 ? 1 : 0;
    case UnaryOp::gelu:
      return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * kPi);
    case UnaryOp::tanh: return 1 - std::tanh(x) * std::tanh(x);
    case UnaryOp::sigmoid: {
      const double s = 1 / (1 + std::exp(-x));
      return s * (1 - s);
    }
  }
  return NAN;
}

const UnaryOp kUnaryOps[] = {UnaryOp::neg,  UnaryOp::exp,  UnaryOp::log,
                             UnaryOp::sqrt, UnaryOp::abs,  UnaryOp::relu,
                             UnaryOp::gelu, UnaryOp::tanh, UnaryOp::sigmoid};

// Layer norm of x (R, D) in double, from the float inputs: y, mean, rstd and, given dy, the
// exact gradients.
struct RefLayerNorm {
  std::vector<float> y, mean, rstd, dx, dgamma, dbeta;
};
RefLayerNorm ref_layer_norm(const std::vector<float>& x, const std::vector<float>& gamma,
                            const std::vector<float>& beta, const std::vector<float>& dy,
                            double eps, int64_t R, int64_t D) {
  RefLayerNorm r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  std::vector<double> dg(D, 0.0), db(D, 0.0);
  for (int64_t i = 0; i < R; ++i) {
    const float* xr = x.data() + i * D;
    const float* gr = dy.data() + i * D;
    double mu = 0, var = 0;
    for (int64_t j = 0; j < D; ++j) mu += xr[j];
    mu /= D;
    for (int64_t j = 0; j < D; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= D;
    const double rs = 1 / std::sqrt(var + eps);
    r.mean.push_back(static_cast<float>(mu));
    r.rstd.push_back(static_cast<float>(rs));
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < D; ++j) {
      const double xhat = (xr[j] - mu) * rs, g = double(gr[j]) * gamma[j];
      r.y[i * D + j] = static_cast<float>(xhat * gamma[j] + beta[j]);
      mg += g / D;
      mgx += g * xhat / D;
      dg[j] += gr[j] * xhat;
      db[j] += gr[j];
    }
    for (int64_t j = 0; j < D; ++j) {
      const double xhat = (xr[j] - mu) * rs, g = double(gr[j]) * gamma[j];
      r.dx[i * D + j] = static_cast<float>(rs * (g - mg - xhat * mgx));
    }
  }
  for (int64_t j = 0; j < D; ++j)
    r.dgamma.push_back(static_cast<float>(dg[j])), r.dbeta.push_back(static_cast<float>(db[j]));
  return r;
}

// Runs layer norm forward and backward on x (R, D) and compares with the double reference.
void check_layer_norm(const std::vector<float>& x, int64_t R, int64_t D, uint32_t seed,
                      double tol) {
  INFO("R ", R, " D ", D);
  const std::vector<float> gamma = random_values(D, seed + 1, 0.5f, 1.5f);
  const std::vector<float> beta = random_values(D, seed + 2);
  const std::vector<float> dy = random_values(R * D, seed + 3);
  const float eps = 1e-5f;
  const RefLayerNorm want = ref_layer_norm(x, gamma, beta, dy, eps, R, D);
  const Tensor X = vec(x, {R, D}), G = vec(gamma, {D});
  const LayerNormOutput out = layer_norm(X, G, vec(beta, {D}), eps);
  CHECK_CLOSE(out.y.to_vector(), want.y, tol, tol);
  CHECK_CLOSE(out.mean.to_vector(), want.mean, 0.0, 1e-7);
  CHECK_CLOSE(out.rstd.to_vector(), want.rstd, 0.0, 1e-6);
  const LayerNormGrads g = layer_norm_backward(vec(dy, {R, D}), X, out.mean, out.rstd, G);
  CHECK_CLOSE(g.dx.to_vector(), want.dx, tol, tol);
  CHECK_CLOSE(g.dgamma.to_vector(), want.dgamma, tol, tol);
  CHECK_CLOSE(g.dbeta.to_vector(), want.dbeta, tol, tol);
}

// Cross-entropy in double: loss, logsumexp, total weight and dlogits for upstream dloss.
struct RefCrossEntropy {
  std::vector<float> loss, lse, dlogits;
  double total_weight = 0;
};
RefCrossEntropy ref_cross_entropy(const std::vector<float>& z, const std::vector<int32_t>& t,
                                  const std::vector<float>& w, int ignore, Reduction red,
                                  double dloss, int64_t R, int64_t V) {
  RefCrossEntropy r;
  double sum = 0;
  std::vector<double> lse(R), weight(R);
  for (int64_t i = 0; i < R; ++i) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, double(z[i * V + j]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(z[i * V + j] - m);
    lse[i] = m + std::log(s);
    r.lse.push_back(static_cast<float>(lse[i]));
    weight[i] = t[i] == ignore ? 0.0 : (w.empty() ? 1.0 : w[i]);
    r.total_weight += weight[i];
    if (weight[i] > 0) sum += weight[i] * (lse[i] - z[i * V + t[i]]);
  }
  const double norm = red == Reduction::mean ? r.total_weight : 1.0;
  r.loss = {static_cast<float>(norm > 0 ? sum / norm : 0.0)};
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(z[i * V + j] - lse[i]) - (j == t[i] ? 1 : 0);
      r.dlogits.push_back(norm > 0 ? static_cast<float>(dloss * weight[i] / norm * p) : 0.0f);
    }
  return r;
}

void check_cross_entropy(const std::vector<float>& z, const std::vector<int32_t>& t,
                         const std::vector<float>& w, int ignore, Reduction red, int64_t R,
                         int64_t V, double grad_rtol = 2e-6) {
  INFO("R ", R, " V ", V, " weights ", !w.empty(), " sum ", red == Reduction::sum);
  const double dloss = 0.75;
  const RefCrossEntropy want = ref_cross_entropy(z, t, w, ignore, red, dloss, R, V);
  const Tensor Z = vec(z, {R, V}), T = Tensor::from_int_vector(t, {R});
  const Tensor W = w.empty() ? Tensor() : vec(w, {R});
  const CrossEntropyOutput out = cross_entropy(Z, T, W, ignore, red);
  CHECK(out.loss.shape() == Shape{});
  CHECK_CLOSE(out.loss.to_vector(), want.loss, 1e-6, 1e-6);
  CHECK_CLOSE(out.logsumexp.to_vector(), want.lse, 0.0, 1e-6);
  CHECK(out.weight_sum.item() == doctest::Approx(want.total_weight).epsilon(1e-6));
  const Tensor d = cross_entropy_backward(Tensor::scalar(float(dloss)), Z, T, W, out.logsumexp,
                                          out.loss_scale, ignore);
  CHECK_CLOSE(d.to_vector(), want.dlogits, 1e-7, grad_rtol);
}

std::vector<int32_t> random_targets(int64_t R, int64_t V, uint32_t seed) {
  std::vector<int32_t> t;
  for (float u : random_values(R, seed, 0.0f, 1.0f))
    t.push_back(std::min<int32_t>(static_cast<int32_t>(u * V), static_cast<int32_t>(V - 1)));
  return t;
}

}  // namespace

TEST_CASE("unary_backward matches the derivatives in double") {
  std::vector<float> x = random_values(1000, 1, -6.0f, 6.0f);
  for (float v : {0.0f, -0.5f, 0.5f, 12.0f, -12.0f}) x.push_back(v);
  const std::vector<float> pos = random_values(1005, 2, 1e-3f, 50.0f);  // log, sqrt
  const std::vector<float> dy = random_values(1005, 3);
  const Tensor DY = vec(dy, {1005});
  for (UnaryOp op : kUnaryOps) {
    INFO("op ", static_cast<int>(op));
    const std::vector<float>& in = (op == UnaryOp::log || op == UnaryOp::sqrt) ? pos : x;
    const Tensor X = vec(in, {1005});
    const Tensor Y = unary(op, X);
    std::vector<float> want;
    for (size_t i = 0; i < in.size(); ++i)
      want.push_back(static_cast<float>(dy[i] * ref_derivative(op, in[i])));
    // Formulas from y (1 - y^2, y (1 - y)) lose y's rounding (6e-8) in absolute terms.
    CHECK_CLOSE(unary_backward(op, X, Y, DY).to_vector(), want, 3e-7, 2e-6);
  }
}

TEST_CASE("unary_backward needs only the tensor the derivative reads") {
  const Tensor x = vec({-1.0f, 0.0f, 2.0f}, {3}), dy = vec({1.0f, 1.0f, 1.0f}, {3});
  CHECK(unary_backward(UnaryOp::relu, x, Tensor(), dy).to_vector() ==
        std::vector<float>{0.0f, 0.0f, 1.0f});
  CHECK(unary_backward(UnaryOp::abs, x, Tensor(), dy).to_vector() ==
        std::vector<float>{-1.0f, 0.0f, 1.0f});
  CHECK(unary_backward(UnaryOp::exp, Tensor(), exp(x), dy).to_vector() == exp(x).to_vector());
  CHECK(unary_backward(UnaryOp::neg, Tensor(), Tensor(), dy).to_vector() ==
        std::vector<float>{-1.0f, -1.0f, -1.0f});
  CHECK_ERROR(unary_backward(UnaryOp::exp, x, Tensor(), dy), "exp_backward",
              "y is an undefined tensor");
  CHECK_ERROR(unary_backward(UnaryOp::gelu, Tensor(), x, dy), "gelu_backward",
              "x is an undefined tensor");
  CHECK_ERROR(unary_backward(UnaryOp::relu, vec({1, 2}, {2}), Tensor(), dy), "relu_backward",
              "expected x of shape (3,)", "(2,)");
}

TEST_CASE("gelu's derivative saturates to 0 and 1 without NaN") {
  const Tensor x = vec({-1000.0f, -40.0f, 40.0f, 1000.0f}, {4});
  const std::vector<float> d =
      unary_backward(UnaryOp::gelu, x, Tensor(), Tensor::full({4}, 1.0f)).to_vector();
  CHECK(d == std::vector<float>{0.0f, 0.0f, 1.0f, 1.0f});
}

TEST_CASE("softmax and log_softmax backward match double loops") {
  for (const Shape& s : {Shape{1, 1}, Shape{3, 17}, Shape{5, 129}, Shape{2, 3, 7}}) {
    for (float scale : {1.0f, 1e4f}) {
      INFO("shape ", to_string(s), " scale ", scale);
      const Tensor x = random_tensor(s, 11, -scale, scale);
      const std::vector<float> dy = random_values(numel(s), 12);
      const int64_t C = s.back(), rows = numel(s) / C;
      for (bool log : {false, true}) {
        const std::vector<float> y = (log ? log_softmax(x) : softmax(x)).to_vector();
        std::vector<float> want(y.size());
        for (int64_t r = 0; r < rows; ++r) {
          double sum = 0;
          for (int64_t j = 0; j < C; ++j) sum += log ? dy[r * C + j] : dy[r * C + j] * y[r * C + j];
          for (int64_t j = 0; j < C; ++j) {
            const double yj = y[r * C + j], gj = dy[r * C + j];
            want[r * C + j] = static_cast<float>(log ? gj - std::exp(yj) * sum : yj * (gj - sum));
          }
        }
        const Tensor Y = vec(y, s), DY = vec(dy, s);
        const Tensor dx = log ? log_softmax_backward(Y, DY) : softmax_backward(Y, DY);
        CHECK(dx.shape() == s);
        CHECK_CLOSE(dx.to_vector(), want, 2e-7, 2e-6);
      }
    }
  }
}

TEST_CASE("log_softmax backward of a masked row passes dy at -inf entries, no NaN") {
  const Tensor x = vec({-kInf, 1.0f, 2.0f, -kInf, -kInf, -kInf}, {2, 3});
  const Tensor dy = vec({0.5f, 1.0f, -1.0f, 0.25f, 0.5f, 1.0f}, {2, 3});
  const std::vector<float> dx = log_softmax_backward(log_softmax(x), dy).to_vector();
  for (float v : dx) CHECK(std::isfinite(v));
  CHECK(dx[0] == 0.5f);
  const std::vector<float> ds = softmax_backward(softmax(x), dy).to_vector();
  CHECK(ds[0] == 0.0f);
  CHECK(ds[3] == 0.0f);
}

TEST_CASE("layer_norm forward and backward match double loops") {
  for (int64_t D : {1, 3, 17, 129})
    for (int64_t R : {1, 5, 70}) check_layer_norm(random_values(R * D, 21, -3, 3), R, D, 22, 5e-6);
}

TEST_CASE("layer_norm of constant rows: var 0 gives y = beta and finite gradients") {
  const int64_t R = 3, D = 17;
  std::vector<float> x;
  for (int64_t i = 0; i < R * D; ++i) x.push_back(i < D ? 0.0f : (i < 2 * D ? 7.5f : -1e4f));
  check_layer_norm(x, R, D, 31, 2e-5);  // rstd = 1/sqrt(eps) = 316 scales dx up
  const LayerNormOutput out = layer_norm(vec(x, {R, D}), Tensor::full({D}, 2.0f),
                                         Tensor::full({D}, 0.25f), 1e-5f);
  for (float v : out.y.to_vector()) CHECK(v == 0.25f);
}

TEST_CASE("layer_norm of rows 1e4 + small noise keeps the noise's precision") {
  // E[x^2] - E[x]^2 in float would lose everything here, and so would centring on the float
  // rounding of the mean (off by up to 5e-4) for noise of 0.05.
  const int64_t R = 8, D = 129;
  for (float noise : {1.0f, 0.05f}) {
    INFO("noise ", noise);
    std::vector<float> x = random_values(R * D, 41, -noise, noise);
    for (float& v : x) v += 1e4f;
    check_layer_norm(x, R, D, 42, 1e-5);
  }
}

TEST_CASE("layer_norm results do not depend on the thread count") {
  const int64_t R = 300, D = 96;  // R * D above the parallel threshold
  const Tensor x = random_tensor({R, D}, 51), dy = random_tensor({R, D}, 52);
  const Tensor gamma = random_tensor({D}, 53), beta = random_tensor({D}, 54);
  std::vector<std::vector<float>> runs[2];
  for (int threads : {1, 2}) {
    ThreadCount tc(threads);
    const LayerNormOutput out = layer_norm(x, gamma, beta, 1e-5f);
    const LayerNormGrads g = layer_norm_backward(dy, x, out.mean, out.rstd, gamma);
    runs[threads - 1] = {out.y.to_vector(), out.rstd.to_vector(), g.dx.to_vector(),
                         g.dgamma.to_vector(), g.dbeta.to_vector()};
  }
  CHECK(runs[0] == runs[1]);
}

TEST_CASE("layer_norm rejects bad shapes and names them") {
  const Tensor x = Tensor::zeros({2, 8}), g = Tensor::zeros({8});
  CHECK_ERROR(layer_norm(x, Tensor::zeros({7}), g, 1e-5f), "layer_norm",
              "expected gamma of shape (8,)", "(7,)");
  CHECK_ERROR(layer_norm(Tensor::zeros({2, 0}), Tensor::zeros({0}), Tensor::zeros({0}), 1e-5f),
              "layer_norm", "empty");
  CHECK_ERROR(layer_norm(x, g, g, -1.0f), "layer_norm", "eps");
  const LayerNormOutput out = layer_norm(x, g, g, 1e-5f);
  CHECK(out.mean.shape() == Shape{2});
  CHECK_ERROR(layer_norm_backward(Tensor::zeros({2, 7}), x, out.mean, out.rstd, g),
              "layer_norm_backward", "expected dy of shape (2, 8)");
  CHECK_ERROR(layer_norm_backward(x, x, Tensor::zeros({3}), out.rstd, g), "layer_norm_backward",
              "expected mean of shape (2,)");
}

TEST_CASE("cross_entropy matches double loops, with and without weights") {
  for (int64_t V : {1, 3, 17, 129}) {
    for (int64_t R : {1, 6}) {
      const std::vector<float> z = random_values(R * V, 61, -4, 4);
      const std::vector<int32_t> t = random_targets(R, V, 62);
      const std::vector<float> w = random_values(R, 63, 0.1f, 2.0f);
      for (Reduction red : {Reduction::mean, Reduction::sum}) {
        check_cross_entropy(z, t, {}, -100, red, R, V);
        check_cross_entropy(z, t, w, -100, red, R, V);
      }
    }
  }
}

TEST_CASE("cross_entropy of logits of 1e4 does not overflow") {
  const int64_t R = 4, V = 50;
  const std::vector<float> z = random_values(R * V, 71, -1e4f, 1e4f);
  const std::vector<int32_t> t = random_targets(R, V, 72);
  check_cross_entropy(z, t, {}, -100, Reduction::mean, R, V);
  // Every logit 1e4 + small: the loss is about log(V), and stays accurate (it is computed as
  // (max - x_t) + log(sum)). The gradient exp(x - logsumexp) inherits the float rounding of
  // logsumexp ~ 1e4 (half an ulp, 4.9e-4) as a relative error.
  std::vector<float> flat = random_values(R * V, 73, 1e4f, 1e4f + 0.01f);
  check_cross_entropy(flat, t, {}, -100, Reduction::sum, R, V, 1e-3);
}

TEST_CASE("cross_entropy with all but one row ignored is that row's loss") {
  const int64_t R = 5, V = 7;
  const std::vector<float> z = random_values(R * V, 81, -3, 3);
  const std::vector<int32_t> t = {-1, -1, 4, -1, -1};
  const std::vector<float> w = {9.0f, 9.0f, 2.0f, 9.0f, 9.0f};
  for (Reduction red : {Reduction::mean, Reduction::sum}) {
    check_cross_entropy(z, t, {}, -1, red, R, V);
    check_cross_entropy(z, t, w, -1, red, R, V);
  }
  const CrossEntropyOutput out = cross_entropy(vec(z, {R, V}), Tensor::from_int_vector(t, {R}),
                                               vec(w, {R}), -1, Reduction::mean);
  CHECK(out.weight_sum.item() == 2.0f);
  CHECK(out.loss_scale.item() == 0.5f);
  const std::vector<float> row2(z.begin() + 2 * V, z.begin() + 3 * V);
  const CrossEntropyOutput one = cross_entropy(vec(row2, {1, V}), Tensor::from_int_vector({4}, {1}),
                                               Tensor(), -1, Reduction::mean);
  CHECK(out.loss.item() == doctest::Approx(one.loss.item()).epsilon(1e-6));
}

TEST_CASE("cross_entropy with every row ignored or weighted 0 gives loss 0 and zero gradients") {
  const int64_t R = 3, V = 4;
  const Tensor z = random_tensor({R, V}, 91);
  const Tensor ignored = Tensor::from_int_vector({-100, -100, -100}, {R});
  const Tensor some = Tensor::from_int_vector({0, 1, 2}, {R});
  struct Case {
    Tensor target, weight;
  };
  for (const Case& c : {Case{ignored, Tensor()}, Case{some, Tensor::zeros({R})}}) {
    for (Reduction red : {Reduction::mean, Reduction::sum}) {
      const CrossEntropyOutput out = cross_entropy(z, c.target, c.weight, -100, red);
      CHECK(out.loss.item() == 0.0f);
      CHECK(out.weight_sum.item() == 0.0f);
      const Tensor d = cross_entropy_backward(Tensor::scalar(1.0f), z, c.target, c.weight,
                                              out.logsumexp, out.loss_scale, -100);
      for (float v : d.to_vector()) CHECK(v == 0.0f);
    }
  }
}

TEST_CASE("cross_entropy results do not depend on the thread count") {
  const int64_t R = 64, V = 512;
  const Tensor z = random_tensor({R, V}, 101, -5, 5);
  const Tensor t = Tensor::from_int_vector(random_targets(R, V, 102), {R});
  const Tensor w = random_tensor({R}, 103, 0, 1);
  std::vector<std::vector<float>> runs[2];
  for (int threads : {1, 2}) {
    ThreadCount tc(threads);
    const CrossEntropyOutput out = cross_entropy(z, t, w, -100, Reduction::mean);
    const Tensor d = cross_entropy_backward(Tensor::scalar(1.0f), z, t, w, out.logsumexp,
                                            out.loss_scale, -100);
    runs[threads - 1] = {out.loss.to_vector(), out.logsumexp.to_vector(), d.to_vector()};
  }
  CHECK(runs[0] == runs[1]);
}

TEST_CASE("cross_entropy rejects bad targets, weights and shapes") {
  const Tensor z = Tensor::zeros({3, 5});
  const Tensor t = Tensor::from_int_vector({0, 1, 2}, {3});
  CHECK_ERROR(cross_entropy(z, Tensor::from_int_vector({0, 5, 1}, {3}), Tensor(), -100,
                            Reduction::mean),
              "cross_entropy", "target[1] = 5", "[0, 5)", "ignore_index (-100)");
  CHECK_ERROR(cross_entropy(z, Tensor::from_int_vector({0, -1, 1}, {3}), Tensor(), -100,
                            Reduction::mean),
              "target[1] = -1");
  CHECK_ERROR(cross_entropy(z, t, vec({1, -0.5f, 1}, {3}), -100, Reduction::mean),
              "cross_entropy", "weight[1] = -0.5");
  CHECK_ERROR(cross_entropy(z, Tensor::from_int_vector({0, 1}, {2}), Tensor(), -100,
                            Reduction::mean),
              "cross_entropy", "expected target of shape (3,)", "(2,)");
  CHECK_ERROR(cross_entropy(z, Tensor::zeros({3}), Tensor(), -100, Reduction::mean),
              "cross_entropy", "expected target to be i32");
  CHECK_ERROR(cross_entropy(Tensor::zeros({5}), t, Tensor(), -100, Reduction::mean),
              "cross_entropy", "expected logits of shape (R, V)");
  CHECK_ERROR(cross_entropy(z, t, Tensor::zeros({2}), -100, Reduction::mean),
              "expected weight of shape (3,)");
  const CrossEntropyOutput out = cross_entropy(z, t, Tensor(), -100, Reduction::mean);
  CHECK_ERROR(cross_entropy_backward(Tensor::zeros({1}), z, t, Tensor(), out.logsumexp,
                                     out.loss_scale, -100),
              "cross_entropy_backward", "expected dloss of shape ()");
  CHECK_ERROR(cross_entropy_backward(Tensor::scalar(1.0f), z, t, Tensor(), out.logsumexp,
                                     Tensor::zeros({1}), -100),
              "cross_entropy_backward", "expected loss_scale of shape ()");
}

TEST_CASE("dropout uses the Philox mask: keep when uint_to_unit(word) >= p, scale 1/(1-p)") {
  const float p = 0.3f;
  // Sizes around the vector path's step of 128 elements and its work items of 4096, a seed
  // with both halves set, and an offset whose low word wraps inside a group of 16 blocks.
  for (const auto& [seed, offset] : {std::pair<uint64_t, uint64_t>{77, 5},
                                     {0x0123456789ABCDEFull, (uint64_t(1) << 32) - 9}}) {
    for (int64_t n : {1, 3, 4, 17, 127, 128, 129, 255, 4096 + 77, 70001}) {
      INFO("seed ", seed, ", offset ", offset, ", n ", n);
      const std::vector<float> x = random_values(n, 111);
      std::vector<float> want;
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t bits = philox4x32(seed, offset + uint64_t(i / 4)).v[i % 4];
        want.push_back(uint_to_unit(bits) >= p ? x[i] * (1.0f / (1.0f - p)) : 0.0f);
      }
      CHECK_CLOSE(dropout_apply(vec(x, {n}), p, seed, offset).to_vector(), want, 0.0, 0.0);
      std::vector<float> portable(static_cast<size_t>(n));
      cpu::dropout_portable(x.data(), p, seed, offset, portable.data(), n);
      CHECK_CLOSE(portable, want, 0.0, 0.0);
    }
  }
  const uint64_t seed = 77, offset = 5;
  const Tensor x = random_tensor({2, 9}, 112);
  CHECK(dropout_apply(x, 0.0f, seed, offset).to_vector() == x.to_vector());
  CHECK(dropout_apply(x, p, seed, offset).to_vector() ==
        dropout_apply(x, p, seed, offset).to_vector());
  CHECK(dropout_apply(x, p, seed, offset + 5).to_vector() !=
        dropout_apply(x, p, seed, offset).to_vector());
  // A dropped element is 0 even when x is inf.
  const std::vector<float> y = dropout_apply(Tensor::full({64}, kInf), 0.5f, 1, 0).to_vector();
  int zeros = 0;
  for (float v : y) {
    zeros += v == 0.0f;
    CHECK((v == 0.0f || v == kInf));
  }
  CHECK(zeros > 0);
}

TEST_CASE("dropout keeps a fraction 1 - p, preserves the mean, and ignores the thread count") {
  const int64_t n = 200003;
  const Tensor ones = Tensor::full({n}, 1.0f);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    INFO("p ", p);
    std::vector<float> runs[2];
    for (int threads : {1, 2}) {
      ThreadCount tc(threads);
      runs[threads - 1] = dropout_apply(ones, p, 2024, 3).to_vector();
    }
    CHECK(runs[0] == runs[1]);
    double kept = 0, sum = 0;
    for (float v : runs[0]) kept += v != 0.0f, sum += v;
    // Binomial standard error sqrt(p (1 - p) / n); allow 5 of them.
    const double se = std::sqrt(p * (1.0 - p) / n);
    CHECK(std::fabs(kept / n - (1.0 - p)) < 5 * se);
    CHECK(std::fabs(sum / n - 1.0) < 5 * se / (1.0 - p) + 1e-6);
  }
  CHECK_ERROR(dropout_apply(ones, 1.0f, 0, 0), "dropout", "[0, 1)", "got 1");
  CHECK_ERROR(dropout_apply(ones, -0.1f, 0, 0), "dropout", "got -0.1");
  CHECK_ERROR(dropout_apply(ones, NAN, 0, 0), "dropout", "[0, 1)");
}

TEST_CASE("softmax_backward rejects mismatched shapes") {
  CHECK_ERROR(softmax_backward(Tensor::zeros({2, 3}), Tensor::zeros({3, 2})), "softmax_backward",
              "expected dy of shape (2, 3)", "(3, 2)");
  CHECK_ERROR(log_softmax_backward(Tensor::zeros({}), Tensor::zeros({})), "log_softmax_backward",
              "at least one axis");
}

// ---- the fused ops of the transformer layers (core/ops_fused.cpp) ----------------------------

TEST_CASE("add_layer_norm is layer_norm of the sum, forward and backward, bit for bit") {
  for (auto [R, D] : {std::pair<int64_t, int64_t>{1, 1}, {5, 7}, {70, 192}}) {
    const Tensor a = random_tensor({R, D}, 30), b = random_tensor({R, D}, 31);
    const Tensor gamma = random_tensor({D}, 32, 0.5f, 1.5f), beta = random_tensor({D}, 33);
    const Tensor dy = random_tensor({R, D}, 34);
    const Tensor sum = add(a, b);
    const LayerNormOutput want = layer_norm(sum, gamma, beta, 1e-5f);
    const LayerNormOutput got = add_layer_norm(a, b, gamma, beta, 1e-5f);
    INFO("R ", R, " D ", D);
    CHECK(got.y.to_vector() == want.y.to_vector());
    CHECK(got.mean.to_vector() == want.mean.to_vector());
    CHECK(got.rstd.to_vector() == want.rstd.to_vector());
    const LayerNormGrads gw = layer_norm_backward(dy, sum, want.mean, want.rstd, gamma);
    const LayerNormGrads gg = add_layer_norm_backward(dy, a, b, got.mean, got.rstd, gamma);
    CHECK(gg.dx.to_vector() == gw.dx.to_vector());
    CHECK(gg.dgamma.to_vector() == gw.dgamma.to_vector());
    CHECK(gg.dbeta.to_vector() == gw.dbeta.to_vector());
  }
  CHECK_ERROR(add_layer_norm(Tensor::zeros({2, 3}), Tensor::zeros({3, 2}), Tensor::zeros({3}),
                             Tensor::zeros({3}), 1e-5f),
              "add_layer_norm", "(2, 3)", "(3, 2)");
}

TEST_CASE("linear_forward, linear_backward and feed_forward_relu_backward against plain ops") {
  const int64_t R = 29, in = 40, out = 35;
  const Tensor x = random_tensor({R, in}, 40), W = random_tensor({out, in}, 41);
  const Tensor b = random_tensor({out}, 42), dy = random_tensor({R, out}, 43);
  // Forward: x W^T + b, then ReLU. The bias goes in with the product's store: the same bits as
  // adding it afterwards.
  const Tensor pre = add(matmul(x, W, false, true), b);
  CHECK(linear_forward(x, W, b).to_vector() == pre.to_vector());
  CHECK(linear_forward(x, W, b, true).to_vector() == relu(pre).to_vector());
  CHECK(linear_forward(x, W, Tensor()).to_vector() == matmul(x, W, false, true).to_vector());
  // Backward: db comes out of dW's GEMM, summed in double.
  const LinearGrads g = linear_backward(dy, x, W, true, true, true);
  CHECK(g.dx.to_vector() == matmul(dy, W).to_vector());
  CHECK(g.dW.to_vector() == matmul(dy, x, true, false).to_vector());
  CHECK_CLOSE(g.db.to_vector(), sum(dy, 0).to_vector(), 1e-6, 1e-6);
  const LinearGrads only_db = linear_backward(dy, Tensor(), Tensor(), false, false, true);
  CHECK(!only_db.dx.defined());
  CHECK(!only_db.dW.defined());
  CHECK_CLOSE(only_db.db.to_vector(), sum(dy, 0).to_vector(), 1e-6, 1e-6);
  // The feed-forward block z = h W2^T + b2 after h = relu(pre): ReLU's gradient is the mask of
  // the product dz W2, and every product is the plain one.
  const Tensor h = relu(pre), W2 = random_tensor({11, out}, 44), dz = random_tensor({R, 11}, 45);
  const FeedForwardGrads f = feed_forward_relu_backward(dz, x, W, W2, h, FeedForwardNeeds{});
  const Tensor dp = unary_backward(UnaryOp::relu, pre, Tensor(), matmul(dz, W2));
  CHECK(f.dW2.to_vector() == matmul(dz, h, true, false).to_vector());
  CHECK_CLOSE(f.db2.to_vector(), sum(dz, 0).to_vector(), 1e-6, 1e-6);
  CHECK(f.dx.to_vector() == matmul(dp, W).to_vector());
  CHECK(f.dW1.to_vector() == matmul(dp, x, true, false).to_vector());
  CHECK_CLOSE(f.db1.to_vector(), sum(dp, 0).to_vector(), 1e-6, 1e-6);
  FeedForwardNeeds only_dw2;
  only_dw2.dx = only_dw2.dW1 = only_dw2.db1 = only_dw2.db2 = false;
  const FeedForwardGrads f2 = feed_forward_relu_backward(dz, x, W, W2, h, only_dw2);
  CHECK(f2.dW2.to_vector() == f.dW2.to_vector());
  CHECK((!f2.dx.defined() && !f2.dW1.defined() && !f2.db1.defined() && !f2.db2.defined()));
  CHECK_ERROR(linear_forward(x, W, Tensor::zeros({out + 1})), "linear_forward", "b of shape");
  CHECK_ERROR(feed_forward_relu_backward(dz, x, W, W2, Tensor::zeros({R, out + 1}),
                                         FeedForwardNeeds{}),
              "feed_forward_relu_backward", "H (29, 35)");
}
