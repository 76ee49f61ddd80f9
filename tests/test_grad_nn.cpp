// Gradients of the differentiable nn ops (autograd/ops_nn.cpp) against finite differences
// (gradcheck), with inputs kept away from kinks, plus what finite differences cannot show well:
// softmax and log-softmax at logits of 1e4, cross-entropy with all but one position ignored
// (and with all ignored), and dropout's gradient being exactly its mask / (1 - p).
#include <cmath>
#include <limits>
#include <functional>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "check.h"
#include "core/philox.h"

using namespace clustr;
using namespace clustr::test;

namespace {

using Fn = std::function<Variable(const std::vector<Variable>&)>;

// gradcheck with the default tolerances; the case is named by the function's expression.
#define CHECK_GRAD(f, inputs) clustr::test::check_grad(#f, (f), (inputs))

// Values with |x| in [0.2, 2]: at least 0.2 from relu's and abs's kink, far beyond eps = 0.01.
Tensor away_from_zero(const Shape& s, uint32_t seed) {
  std::vector<float> v = random_values(numel(s), seed, -1.8f, 1.8f);
  for (float& x : v) x += x < 0 ? -0.2f : 0.2f;
  return Tensor::from_vector(v, s);
}

// The gradient of x for y = f(x) with upstream gradient w.
std::vector<float> grad_of(const std::function<Variable(const Variable&)>& f, const Tensor& x,
                           const Tensor& w) {
  Variable v(x.clone(), true);
  f(v).backward(w);
  return v.grad().to_vector();
}

}  // namespace

TEST_CASE("gradcheck of exp, tanh, sigmoid and gelu") {
  const Tensor x = random_tensor({3, 4}, 1);
  for (auto op : {+[](const Variable& v) { return exp(v); },
                  +[](const Variable& v) { return tanh(v); },
                  +[](const Variable& v) { return sigmoid(v); },
                  +[](const Variable& v) { return gelu(v); }}) {
    CHECK_GRAD(Fn([op](const std::vector<Variable>& v) { return op(v[0]); }),
               std::vector<Tensor>{x});
  }
}

TEST_CASE("gradcheck of log and sqrt on positive inputs") {
  const Tensor x = random_tensor({2, 5}, 2, 0.5f, 3.0f);
  CHECK_GRAD(Fn([](const std::vector<Variable>& v) { return log(v[0]); }),
             std::vector<Tensor>{x});
  CHECK_GRAD(Fn([](const std::vector<Variable>& v) { return sqrt(v[0]); }),
             std::vector<Tensor>{x});
}

TEST_CASE("gradcheck of relu away from 0") {
  CHECK_GRAD(Fn([](const std::vector<Variable>& v) { return relu(v[0]); }),
             std::vector<Tensor>{away_from_zero({4, 6}, 3)});
}

TEST_CASE("gradcheck of softmax and log_softmax over the last axis") {
  const Tensor x = random_tensor({2, 3, 5}, 4);
  CHECK_GRAD(Fn([](const std::vector<Variable>& v) { return softmax(v[0]); }),
             std::vector<Tensor>{x});
  CHECK_GRAD(Fn([](const std::vector<Variable>& v) { return log_softmax(v[0]); }),
             std::vector<Tensor>{x});
}

TEST_CASE("softmax and log_softmax gradients at logits of 1e4 equal those at the shifted logits") {
  // Softmax is shift-invariant, so its gradient at 1e4 + x is its gradient at x. x is taken as
  // (1e4 + x) - 1e4 (exact) so that both see the same float values.
  std::vector<float> big = random_values(24, 5, -3, 3), small(24);
  for (size_t i = 0; i < big.size(); ++i) big[i] += 1e4f, small[i] = big[i] - 1e4f;
  const Tensor xb = Tensor::from_vector(big, {4, 6}), xs = Tensor::from_vector(small, {4, 6});
  const Tensor w = random_tensor({4, 6}, 6);
  for (bool use_log : {false, true}) {
    INFO("log ", use_log);
    auto f = [use_log](const Variable& v) { return use_log ? log_softmax(v) : softmax(v); };
    CHECK_CLOSE(grad_of(f, xb, w), grad_of(f, xs, w), 1e-6, 1e-5);
  }
  CHECK_GRAD(Fn([](const std::vector<Variable>& v) { return log_softmax(v[0]); }),
             std::vector<Tensor>{xb});
  // Logits spread over +-1e4: the softmax is one-hot and every gradient finite.
  const Tensor spread = random_tensor({4, 6}, 7, -1e4f, 1e4f);
  for (float g : grad_of([](const Variable& v) { return log_softmax(v); }, spread, w))
    CHECK(std::isfinite(g));
}

TEST_CASE("gradcheck of layer_norm in x, gamma and beta") {
  const Tensor x = random_tensor({2, 3, 6}, 8);
  const Tensor gamma = random_tensor({6}, 9, 0.5f, 1.5f), beta = random_tensor({6}, 10);
  CHECK_GRAD(Fn([](const std::vector<Variable>& v) { return layer_norm(v[0], v[1], v[2]); }),
             (std::vector<Tensor>{x, gamma, beta}));
  // Rows of 1e4 + noise: the gradient is that of the noise alone.
  std::vector<float> big = random_values(18, 11, -1, 1);
  for (float& b : big) b += 1e4f;
  CHECK_GRAD(Fn([](const std::vector<Variable>& v) { return layer_norm(v[0], v[1], v[2]); }),
             (std::vector<Tensor>{Tensor::from_vector(big, {3, 6}), gamma, beta}));
}

TEST_CASE("gradcheck of cross_entropy over (..., V) logits, with weights and ignored targets") {
  const Tensor logits = random_tensor({2, 3, 5}, 12);
  const Tensor target = Tensor::from_int_vector({0, 4, -100, 2, 1, 3}, {2, 3});
  const Tensor weight = random_tensor({2, 3}, 13, 0.2f, 2.0f);
  for (Reduction red : {Reduction::mean, Reduction::sum}) {
    for (bool weighted : {false, true}) {
      INFO("sum ", red == Reduction::sum, " weighted ", weighted);
      const Tensor w = weighted ? weight : Tensor();
      CHECK_GRAD(Fn([&](const std::vector<Variable>& v) {
                   return cross_entropy(v[0], target, w, -100, red);
                 }),
                 std::vector<Tensor>{logits});
    }
  }
}

TEST_CASE("cross_entropy with all but one position ignored: only that row has a gradient") {
  const int64_t V = 6;
  const Tensor logits = random_tensor({4, V}, 14);
  const Tensor target = Tensor::from_int_vector({-1, -1, 3, -1}, {4});
  Variable z(logits.clone(), true);
  Variable loss = cross_entropy(z, target, Tensor(), -1);
  loss.backward();
  // loss = logsumexp(row 2) - row2[3], d/dz = softmax(row 2) - onehot(3).
  const std::vector<float> v = logits.to_vector(), g = z.grad().to_vector();
  double m = -INFINITY, s = 0;
  for (int64_t j = 0; j < V; ++j) m = std::max(m, double(v[2 * V + j]));
  for (int64_t j = 0; j < V; ++j) s += std::exp(v[2 * V + j] - m);
  std::vector<float> want(4 * V, 0.0f);
  for (int64_t j = 0; j < V; ++j)
    want[2 * V + j] = static_cast<float>(std::exp(v[2 * V + j] - m) / s - (j == 3 ? 1 : 0));
  CHECK(loss.item() == doctest::Approx(m + std::log(s) - v[2 * V + 3]).epsilon(1e-6));
  CHECK_CLOSE(g, want, 1e-7, 1e-5);
  CHECK_GRAD(Fn([&](const std::vector<Variable>& x) {
               return cross_entropy(x[0], target, Tensor(), -1);
             }),
             std::vector<Tensor>{logits});
}

TEST_CASE("cross_entropy with every position ignored: loss 0, gradient 0, no NaN") {
  Variable z(random_tensor({2, 2, 3}, 15), true);
  Variable loss = cross_entropy(z, Tensor::from_int_vector({-100, -100, -100, -100}, {2, 2}));
  CHECK(loss.item() == 0.0f);
  loss.backward();
  for (float g : z.grad().to_vector()) CHECK(g == 0.0f);
}

TEST_CASE("cross_entropy of one logit vector (V) and a scalar target") {
  const Tensor logits = random_tensor({5}, 20);
  const Tensor target = Tensor::from_int_vector({2}, {});
  CHECK(cross_entropy(Variable(logits), target).item() ==
        cross_entropy(Variable(logits.reshape({1, 5})), target.reshape({1})).item());
  CHECK_GRAD(Fn([&](const std::vector<Variable>& v) { return cross_entropy(v[0], target); }),
             std::vector<Tensor>{logits});
}

TEST_CASE("cross_entropy finds each position's argmax in the loss's pass") {
  // Logits (2, 3, 5) of a few integer values (ties), one row with a NaN (an ignored one, so
  // that the loss stays finite), one all equal.
  std::vector<float> lv = random_values(30, 95, -2.0f, 2.0f);
  for (float& x : lv) x = std::round(x);
  lv[12] = std::numeric_limits<float>::quiet_NaN();
  for (int j = 20; j < 25; ++j) lv[j] = 1.0f;
  const Tensor logits = Tensor::from_vector(lv, {2, 3, 5});
  const Tensor target = Tensor::from_int_vector({0, 4, -100, 2, 1, 3}, {2, 3});
  Tensor predictions;
  const Variable loss = cross_entropy(Variable(logits, true), target, Tensor(), -100,
                                      Reduction::mean, &predictions);
  CHECK(predictions.shape() == (Shape{2, 3}));
  CHECK(predictions.to_int_vector() == argmax(logits, -1).to_int_vector());
  CHECK(predictions.to_int_vector()[2] == 2);  // the NaN
  CHECK(predictions.to_int_vector()[4] == 0);  // the first of equals
  CHECK(loss.data().item() == cross_entropy(Variable(logits), target).data().item());
}

TEST_CASE("cross_entropy names the shapes when target does not match the logits") {
  Variable z(Tensor::zeros({2, 3, 5}), true);
  CHECK_ERROR(cross_entropy(z, Tensor::from_int_vector({0, 1}, {2})), "cross_entropy",
              "expected target of shape (2, 3)", "(2,)");
  CHECK_ERROR(cross_entropy(z, Tensor::from_int_vector({0, 1, 0, 1, 0, 1}, {2, 3}),
                            Tensor::zeros({6})),
              "cross_entropy", "expected weight of shape (2, 3)");
}

TEST_CASE("dropout's gradient is its mask / (1 - p) applied to the upstream gradient") {
  const float p = 0.4f;
  const Tensor x = away_from_zero({5, 7}, 16), w = random_tensor({5, 7}, 17);
  Generator gen(99);
  gen.reserve(3);  // start at a non-zero offset
  const uint64_t offset = gen.offset();
  Variable v(x.clone(), true);
  Variable y = dropout(v, p, gen);
  CHECK(gen.offset() == offset + dropout_blocks(35));
  y.backward(w);
  const std::vector<float> xv = x.to_vector(), yv = y.data().to_vector(), wv = w.to_vector();
  const std::vector<float> g = v.grad().to_vector();
  const float scale = 1.0f / (1.0f - p);
  for (size_t i = 0; i < xv.size(); ++i) {
    const uint32_t bits = philox4x32(99, offset + i / 4).v[i % 4];
    const bool keep = uint_to_unit(bits) >= p;
    CHECK(yv[i] == (keep ? xv[i] * scale : 0.0f));
    CHECK(g[i] == (keep ? wv[i] * scale : 0.0f));
  }
  // A fresh generator per call gives the same mask each time, so finite differences apply.
  CHECK_GRAD(Fn([p](const std::vector<Variable>& in) {
               Generator g2(5);
               return dropout(in[0], p, g2);
             }),
             std::vector<Tensor>{x});
}

TEST_CASE("dropout in evaluation or with p = 0 returns x itself and draws nothing") {
  Variable x(random_tensor({3, 3}, 18), true);
  Generator gen(1);
  CHECK(dropout(x, 0.5f, gen, false).impl() == x.impl());
  CHECK(dropout(x, 0.0f, gen).impl() == x.impl());
  CHECK(gen.offset() == 0);
  CHECK_ERROR(dropout(x, 1.0f, gen, false), "dropout", "[0, 1)");
}

TEST_CASE("nn ops record nothing under NoGradGuard and keep leaves' flags") {
  Variable x(random_tensor({2, 4}, 19), true);
  NoGradGuard guard;
  for (const Variable& y : {exp(x), relu(x), softmax(x), log_softmax(x), gelu(x)})
    CHECK(!y.requires_grad());
}

TEST_CASE("gradcheck of the fused feed_forward_relu and add_layer_norm") {
  // Pre-activations away from ReLU's kink: x and W1 small, b1 of size >= 0.2 (sign mixed).
  const Tensor x = random_tensor({2, 3, 4}, 50, -0.1f, 0.1f);
  const Tensor w1 = random_tensor({5, 4}, 51, -0.1f, 0.1f), b1 = away_from_zero({5}, 52);
  const Tensor w2 = random_tensor({3, 5}, 53), b2 = random_tensor({3}, 54);
  CHECK_GRAD(Fn([](const std::vector<Variable>& v) {
               return feed_forward_relu(v[0], v[1], v[2], v[3], v[4]);
             }),
             (std::vector<Tensor>{x, w1, b1, w2, b2}));
  const Tensor a = random_tensor({2, 3, 6}, 55), b = random_tensor({2, 3, 6}, 56);
  const Tensor gamma = random_tensor({6}, 57, 0.5f, 1.5f), beta = random_tensor({6}, 58);
  CHECK_GRAD(Fn([](const std::vector<Variable>& v) {
               return add_layer_norm(v[0], v[1], v[2], v[3]);
             }),
             (std::vector<Tensor>{a, b, gamma, beta}));
}

TEST_CASE("feed_forward_relu and add_layer_norm equal the chains of single ops") {
  const Tensor x = random_tensor({3, 5, 8}, 60), dout = random_tensor({3, 5, 8}, 61);
  const Tensor w1 = random_tensor({16, 8}, 62, -0.5f, 0.5f), b1 = random_tensor({16}, 63);
  const Tensor w2 = random_tensor({8, 16}, 64, -0.5f, 0.5f), b2 = random_tensor({8}, 65);
  const Tensor gamma = random_tensor({8}, 66, 0.5f, 1.5f), beta = random_tensor({8}, 67);
  // out = add_layer_norm(h, ff(h)), fused or composed, h = 2 x; every input gets a gradient.
  // h's two gradients meet at a node: the fused block adds its own into the layer norm's (which
  // is also its g), the composed chain's first linear into the sum of the add's.
  auto run = [&](bool fused) {
    std::vector<Variable> v;
    for (const Tensor& t : {x, w1, b1, w2, b2, gamma, beta}) v.emplace_back(t.clone(), true);
    const Variable h = v[0] * 2.0f;
    Variable y = fused ? add_layer_norm(h, feed_forward_relu(h, v[1], v[2], v[3], v[4]),
                                        v[5], v[6])
                       : layer_norm(h + linear(relu(linear(h, v[1], v[2])), v[3], v[4]),
                                    v[5], v[6]);
    y.backward(dout);
    std::vector<std::vector<float>> r{y.data().to_vector()};
    for (const Variable& p : v) r.push_back(p.grad().to_vector());
    return r;
  };
  const auto fused = run(true), plain = run(false);
  // The forward does the same operations; db1 and db2 are summed in another order.
  CHECK(fused[0] == plain[0]);
  for (size_t i = 1; i < fused.size(); ++i) {
    INFO("gradient of input ", i - 1);
    CHECK_CLOSE(fused[i], plain[i], 1e-6, 1e-5);
  }
}
