// CTC loss (layers/ctc.h), decoding and error rates (layers/ctc_decode.h), and the log helpers
// of core/math.h they rely on.
//
// The loss is checked four ways: against PyTorch fixtures (tests/fixtures/make_ctc_fixtures.py:
// every reduction, zero_infinity, padded and concatenated targets, repeats, empty and
// impossible targets, a non-zero blank, a 300-frame batch), against brute force over every
// alignment of small problems, on hand-computable cases (a single forced path; uniform outputs
// where the loss is -ln(number of paths * V^-T)), and by gradcheck; then batched == one at a
// time, the same at 1 and 2 threads, padded == concatenated targets, and the errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "check.h"
#include "core/math.h"
#include "core/safetensors.h"
#include "layers/ctc.h"
#include "layers/ctc_decode.h"

#ifndef CLUSTR_FIXTURE_DIR
#error "CLUSTR_FIXTURE_DIR must name the folder of the reference fixtures (tests/CMakeLists.txt)"
#endif

using namespace clustr;
using namespace clustr::test;

namespace {

// The (B, T, V) log-softmax of logits, in double.
std::vector<double> log_softmax_ref(const std::vector<float>& x, int64_t rows, int64_t V) {
  std::vector<double> lp(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < V; ++c) m = std::max(m, double(x[r * V + c]));
    for (int64_t c = 0; c < V; ++c) s += std::exp(double(x[r * V + c]) - m);
    for (int64_t c = 0; c < V; ++c) lp[r * V + c] = double(x[r * V + c]) - m - std::log(s);
  }
  return lp;
}

LabelSequence collapse(const std::vector<int32_t>& path, int blank) {
  LabelSequence out;
  for (size_t t = 0; t < path.size(); ++t)
    if (path[t] != blank && (t == 0 || path[t] != path[t - 1])) out.push_back(path[t]);
  return out;
}

// p(labelling | frames) for every labelling, summing all V^T paths: lp (T, V) in double.
std::map<LabelSequence, double> brute_force(const std::vector<double>& lp, int64_t T, int64_t V,
                                            int blank) {
  std::map<LabelSequence, double> p;
  std::vector<int32_t> path(static_cast<size_t>(T), 0);
  for (;;) {
    double lsum = 0;
    for (int64_t t = 0; t < T; ++t) lsum += lp[t * V + path[t]];
    p[collapse(path, blank)] += std::exp(lsum);
    int64_t t = 0;  // next path: count in base V
    while (t < T && ++path[t] == V) path[t++] = 0;
    if (t == T) break;
  }
  return p;
}

// The loss of one utterance with reduction none (and no gradient).
float loss_of(const Tensor& logits, const std::vector<int32_t>& labels, int blank = 0) {
  const int32_t T = static_cast<int32_t>(logits.size(1));
  CtcOptions o;
  o.blank = blank;
  o.reduction = CtcReduction::none;
  return ctc_loss(Variable(logits), ints({T}), ints(labels),
                  ints({static_cast<int32_t>(labels.size())}), o)
      .loss.item();
}

std::vector<float> slice_utterance(const Tensor& x, int64_t b, int64_t frames) {
  const int64_t T = x.size(1), V = x.size(2);
  std::vector<float> all = x.to_vector();
  return std::vector<float>(all.begin() + b * T * V, all.begin() + (b * T + frames) * V);
}

// Units in the last place between a float and the exact value.
double ulps(float got, double exact) {
  const float e = static_cast<float>(exact);
  const double ulp = std::fabs(double(std::nextafter(e, INFINITY)) - double(e));
  return std::fabs(double(got) - exact) / ulp;
}

}  // namespace

// ---- core/math.h: log and log-add-exp --------------------------------------------------------

TEST_CASE("math::log is within 2 ulp of the exact log over the whole float range") {
  double worst = 0;
  float worst_x = 0;
  // Every 97th float from the smallest subnormal up to FLT_MAX (about 22 million values).
  for (uint32_t bits = 1; bits < 0x7f800000u; bits += 97) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    const double u = ulps(math::log(x), std::log(double(x)));
    if (u > worst) worst = u, worst_x = x;
  }
  INFO("worst at x = " << worst_x);
  CHECK(worst <= 2.0);
  CHECK(math::log(1.0f) == 0.0f);
  CHECK(math::log(0.0f) == -INFINITY);
  CHECK(math::log(-0.0f) == -INFINITY);
  CHECK(math::log(INFINITY) == INFINITY);
  CHECK(std::isnan(math::log(-1.0f)));
  CHECK(std::isnan(math::log(-INFINITY)));
  CHECK(std::isnan(math::log(NAN)));
}

TEST_CASE("math::log_add_exp of two and three terms") {
  const std::vector<float> v = {-INFINITY, -1e30f, -300.0f, -87.5f, -3.25f, 0.0f,
                                0.5f,      2.0f,   40.0f,   88.0f,  1e30f};
  double worst = 0;
  for (float a : v)
    for (float b : v) {
      const double m = std::max(double(a), double(b));
      const double exact2 =
          m == -INFINITY ? -INFINITY : m + std::log(std::exp(a - m) + std::exp(b - m));
      const float got2 = math::log_add_exp(a, b);
      if (std::isinf(exact2)) {
        CHECK(got2 == float(exact2));
      } else {
        worst = std::max(worst, std::fabs(got2 - exact2) / std::max(1.0, std::fabs(exact2)));
      }
      for (float c : v) {
        const double m3 = std::max(m, double(c));
        const double exact3 =
            m3 == -INFINITY ? -INFINITY
                            : m3 + std::log(std::exp(a - m3) + std::exp(b - m3) + std::exp(c - m3));
        const float got3 = math::log_add_exp(a, b, c);
        if (std::isinf(exact3)) {
          CHECK(got3 == float(exact3));
        } else {
          worst = std::max(worst, std::fabs(got3 - exact3) / std::max(1.0, std::fabs(exact3)));
        }
      }
    }
  // Relative to max(1, |result|): the error of a log-space value is what matters.
  CHECK(worst < 3e-7);
  CHECK(std::isnan(math::log_add_exp(NAN, 1.0f)));
  CHECK(std::isnan(math::log_add_exp(1.0f, NAN, 0.0f)));
}

// ---- the loss against PyTorch ----------------------------------------------------------------

namespace {

// Every fixture file tests/fixtures/make_ctc_fixtures.py writes; the directory must hold
// exactly these.
const std::vector<std::string> kCtcFixtures = {
    "none-basic", "mean-padded", "sum-concat", "repeats", "empty-targets",
    "empty-targets-none", "impossible-none", "impossible-sum", "zero-infinity-mean",
    "zero-infinity-none", "blank-last", "blank-middle", "tight", "peaked", "long"};

std::string ctc_fixture_path(const std::string& name) {
  return std::string(CLUSTR_FIXTURE_DIR) + "/ctc/" + name + ".safetensors";
}

CtcReduction reduction_named(const std::string& s) {
  if (s == "none") return CtcReduction::none;
  if (s == "sum") return CtcReduction::sum;
  if (s == "mean") return CtcReduction::mean;
  throw Error("unknown reduction " + s);
}

}  // namespace

TEST_CASE("ctc fixtures: the directory holds exactly the listed files") {
  std::set<std::string> present, listed;
  for (const auto& e :
       std::filesystem::directory_iterator(std::string(CLUSTR_FIXTURE_DIR) + "/ctc"))
    if (e.path().extension() == ".safetensors") present.insert(e.path().stem().string());
  listed.insert(kCtcFixtures.begin(), kCtcFixtures.end());
  CHECK(present == listed);
}

// Tolerances: the references are exact to half a float32 ulp. Our losses sum the per-frame
// shifts of the log-alphas in double and were within 2 float ulps of the reference (rtol 1e-7
// passed) even at 300 frames (loss ~1000). The gradient is softmax minus posteriors, each
// O(1): the worst difference was 1.4e-6 on the 300-frame case (a fifth of its tolerance),
// 3.6e-7 elsewhere. PyTorch's own float32 gradient misses this tolerance by 19x on the
// 300-frame case (its log-alphas reach -1000, where a float step is 6e-5) and by 1.5x on the
// peaked one, and passes the others; make_ctc_fixtures.py prints these figures.
TEST_CASE("ctc_loss matches PyTorch's ctc_loss (loss and gradient)") {
  for (const std::string& name : kCtcFixtures) {
    SUBCASE(name.c_str()) {
      const SafetensorsFile f = load_safetensors(ctc_fixture_path(name));
      CtcOptions o;
      o.blank = std::stoi(f.meta("blank"));
      o.reduction = reduction_named(f.meta("reduction"));
      o.zero_infinity = f.meta("zero_infinity") == "true";
      Variable x(f.get("logits").clone(), true);
      CtcLoss r = ctc_loss(x, f.get("input_lengths"), f.get("targets"), f.get("target_lengths"), o);
      r.loss.backward(f.get("dout"));
      CHECK(r.loss.shape() == f.get("out").shape());
      CHECK_CLOSE(r.loss.data().to_vector(), f.get("out").to_vector(), 1e-5, 1e-6);
      CHECK_CLOSE(x.grad().to_vector(), f.get("grad").to_vector(), 1e-6, 2e-5);
      // The impossible count, from the lengths: PyTorch's per-utterance losses are +inf there.
      int64_t inf = 0;
      for (float v : r.per_utterance.to_vector()) inf += v == INFINITY;
      CHECK(r.impossible == inf);
      for (float g : x.grad().to_vector()) REQUIRE(std::isfinite(g));
    }
  }
}

TEST_CASE("ctc fixtures cover impossible utterances, with and without zero_infinity") {
  int64_t with = 0, without = 0;
  for (const std::string& name : kCtcFixtures) {
    const SafetensorsFile f = load_safetensors(ctc_fixture_path(name));
    CtcOptions o;
    o.blank = std::stoi(f.meta("blank"));
    o.reduction = reduction_named(f.meta("reduction"));
    o.zero_infinity = f.meta("zero_infinity") == "true";
    const CtcLoss r = ctc_loss(Variable(f.get("logits")), f.get("input_lengths"), f.get("targets"),
                               f.get("target_lengths"), o);
    (o.zero_infinity ? with : without) += r.impossible;
  }
  CHECK(with >= 2);
  CHECK(without >= 3);
}

// ---- brute force and hand-computable cases -------------------------------------------------

TEST_CASE("ctc_loss equals -ln of the summed probability of every alignment (brute force)") {
  struct Case {
    int64_t T, V;
    std::vector<int32_t> labels;
    int blank;
  };
  const std::vector<Case> cases = {
      {6, 3, {1, 2}, 0},    {6, 3, {1, 1}, 0}, {7, 4, {3, 1, 3}, 0},    {5, 3, {}, 0},
      {6, 4, {0, 0, 1}, 2}, {4, 3, {2, 2}, 0}, {8, 3, {1, 2, 1, 2}, 0}, {3, 3, {1, 1}, 0}};
  uint32_t seed = 100;
  for (const Case& k : cases) {
    const Tensor x = random_tensor({1, k.T, k.V}, seed++, -2.0f, 2.0f);
    const auto p = brute_force(log_softmax_ref(x.to_vector(), k.T, k.V), k.T, k.V, k.blank);
    const double expected = -std::log(p.at(k.labels));
    const float got = loss_of(x, k.labels, k.blank);
    INFO("T=" << k.T << " V=" << k.V << " U=" << k.labels.size());
    CHECK(std::fabs(got - expected) <= 2e-6 * std::max(1.0, std::fabs(expected)));
  }
}

TEST_CASE("ctc_loss of uniform outputs is -ln(number of alignments * V^-T)") {
  // T = 3, target "1", V = 3: the 1s form one non-empty block, 3 + 2 + 1 = 6 alignments.
  CHECK(loss_of(Tensor::zeros({1, 3, 3}), {1}) ==
        doctest::Approx(std::log(27.0 / 6.0)).epsilon(1e-6));
  // Counted by brute force on the collapsed paths for longer cases.
  for (auto [T, labels] : std::vector<std::pair<int64_t, std::vector<int32_t>>>{
           {7, {1, 2, 2}}, {8, {1, 2, 3}}, {6, {}}, {9, {3, 3, 3}}}) {
    const int64_t V = 4;
    int64_t count = 0;
    std::vector<int32_t> path(static_cast<size_t>(T), 0);
    for (;;) {
      count += collapse(path, 0) == labels;
      int64_t t = 0;
      while (t < T && ++path[t] == V) path[t++] = 0;
      if (t == T) break;
    }
    const double expected = -std::log(double(count)) + double(T) * std::log(double(V));
    INFO("T=" << T << " paths=" << count);
    CHECK(loss_of(Tensor::zeros({1, T, V}), labels) == doctest::Approx(expected).epsilon(1e-6));
  }
}

TEST_CASE(
    "ctc_loss with a single possible alignment is that path's -ln p, gradient softmax - onehot") {
  struct Case {
    int64_t T;
    std::vector<int32_t> labels, path;
  };
  // "1 1" in 3 frames must be 1 _ 1; "1 2 3" in 3 frames is 1 2 3.
  for (const Case& k : {Case{3, {1, 1}, {1, 0, 1}}, Case{3, {1, 2, 3}, {1, 2, 3}},
                        Case{5, {2, 2, 2}, {2, 0, 2, 0, 2}}}) {
    const int64_t V = 4;
    const Tensor x = random_tensor({1, k.T, V}, 7);
    const std::vector<double> lp = log_softmax_ref(x.to_vector(), k.T, V);
    double expected = 0;
    std::vector<float> grad(static_cast<size_t>(k.T * V));
    for (int64_t t = 0; t < k.T; ++t) {
      expected -= lp[t * V + k.path[t]];
      for (int64_t c = 0; c < V; ++c)
        grad[t * V + c] = static_cast<float>(std::exp(lp[t * V + c]) - (c == k.path[t]));
    }
    Variable v(x.clone(), true);
    CtcOptions o;
    o.reduction = CtcReduction::sum;
    const CtcLoss r = ctc_loss(v, ints({static_cast<int32_t>(k.T)}), ints(k.labels),
                               ints({static_cast<int32_t>(k.labels.size())}), o);
    r.loss.backward();
    CHECK(r.loss.item() == doctest::Approx(expected).epsilon(1e-6));
    CHECK_CLOSE(v.grad().to_vector(), grad, 1e-6, 1e-5);
  }
}

// ---- gradients ---------------------------------------------------------------------------------

TEST_CASE("gradcheck of ctc_loss for each reduction, with padded frames and an empty target") {
  const Tensor x = random_tensor({3, 7, 4}, 21, -1.5f, 1.5f);
  const Tensor il = ints({7, 5, 4}), tl = ints({3, 2, 0});
  const Tensor tg = ints({1, 2, 2, 3, 1});
  for (CtcReduction red : {CtcReduction::none, CtcReduction::sum, CtcReduction::mean}) {
    CtcOptions o;
    o.reduction = red;
    check_grad(std::string("ctc_loss reduction ") + to_string(red),
               [&](const std::vector<Variable>& v) { return ctc_loss(v[0], il, tg, tl, o).loss; },
               {x});
  }
  CtcOptions o;
  o.blank = 3;
  check_grad("ctc_loss blank 3",
             [&](const std::vector<Variable>& v) {
               return ctc_loss(v[0], il, ints({1, 2, 2, 0, 1}), tl, o).loss;
             },
             {x});
}

TEST_CASE("ctc_loss gradient is 0 on padded frames and sums to 0 over the classes of a frame") {
  const Tensor x = random_tensor({2, 12, 5}, 31);
  Variable v(x.clone(), true);
  CtcOptions o;
  o.reduction = CtcReduction::sum;
  ctc_loss(v, ints({12, 7}), ints({1, 2, 3, 4, 4}), ints({3, 2}), o).loss.backward();
  const std::vector<float> g = v.grad().to_vector();
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 12; ++t) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < 5; ++c)
        s += g[(b * 12 + t) * 5 + c], a += std::fabs(g[(b * 12 + t) * 5 + c]);
      CHECK(std::fabs(s) < 1e-6);
      if (b == 1 && t >= 7) CHECK(a == 0.0);
      if (b == 0 || t < 7) CHECK(a > 0.0);
    }
}

// ---- batching, threads, layouts --------------------------------------------------------------

TEST_CASE("ctc_loss of a batch equals each utterance alone, bit for bit, at 1 and 2 threads") {
  // Large enough for the parallel path (layers/ctc.cpp runs small batches on one thread).
  const int64_t B = 5, T = 200, V = 40;
  const Tensor x = random_tensor({B, T, V}, 41, -3.0f, 3.0f);
  const std::vector<int32_t> il = {200, 141, 200, 57, 133}, tl = {60, 4, 0, 20, 1};
  std::vector<std::vector<int32_t>> labels;
  std::vector<int32_t> flat;
  const std::vector<float> draw = random_values(100, 42, 1.0f, float(V));
  for (int64_t b = 0, k = 0; b < B; ++b) {
    labels.emplace_back();
    for (int32_t i = 0; i < tl[b]; ++i, ++k) {
      // Every fourth label repeats the previous one.
      const int32_t label = i % 4 == 3 ? labels[b].back() : int32_t(draw[k]);
      labels[b].push_back(label);
      flat.push_back(label);
    }
  }
  CtcOptions o;
  o.reduction = CtcReduction::none;

  auto run = [&](int threads) {
    ThreadCount tc(threads);
    Variable v(x.clone(), true);
    CtcLoss r = ctc_loss(v, ints(il), ints(flat), ints(tl), o);
    r.loss.backward(Tensor::full({B}, 1.0f));
    return std::make_pair(r.loss.data().to_vector(), v.grad().to_vector());
  };
  const auto one = run(1), two = run(2);
  CHECK(one.first == two.first);
  CHECK(one.second == two.second);

  for (int64_t b = 0; b < B; ++b) {
    const Tensor xb = Tensor::from_vector(slice_utterance(x, b, il[b]), {1, il[b], V});
    Variable v(xb, true);
    CtcLoss r = ctc_loss(v, ints({il[b]}), ints(labels[b]), ints({tl[b]}), o);
    r.loss.backward(Tensor::full({1}, 1.0f));
    CHECK(r.loss.item() == one.first[b]);
    const std::vector<float> g = v.grad().to_vector();
    const std::vector<float> gb(one.second.begin() + b * T * V,
                                one.second.begin() + (b * T + il[b]) * V);
    CHECK(g == gb);
  }
}

TEST_CASE("padded and concatenated targets give the same loss and gradient") {
  const Tensor x = random_tensor({3, 20, 6}, 51);
  const Tensor il = ints({20, 18, 9}), tl = ints({4, 0, 3});
  const Tensor concatenated = ints({1, 2, 3, 4, 5, 5, 1});
  const Tensor padded = Tensor::from_int_vector({1, 2, 3, 4, 99, 99, 99, 99, 5, 5, 1, -7}, {3, 4});
  auto run = [&](const Tensor& tg) {
    Variable v(x.clone(), true);
    ctc_loss(v, il, tg, tl).loss.backward();
    return v.grad().to_vector();
  };
  CHECK(run(concatenated) == run(padded));
  CHECK(ctc_loss(Variable(x), il, concatenated, tl).loss.item() ==
        ctc_loss(Variable(x), il, padded, tl).loss.item());
}

TEST_CASE("ctc_loss without grad mode records nothing and gives the same loss") {
  const Tensor x = random_tensor({2, 10, 4}, 61);
  const Tensor il = ints({10, 8}), tg = ints({1, 2, 3, 3}), tl = ints({2, 2});
  Variable v(x, true);
  const float with = ctc_loss(v, il, tg, tl).loss.item();
  NoGradGuard guard;
  const CtcLoss r = ctc_loss(v, il, tg, tl);
  CHECK(!r.loss.requires_grad());
  CHECK(r.loss.item() == with);
}

// ---- impossible alignments and edge cases -----------------------------------------------------

TEST_CASE("impossible alignments give +inf (or 0 with zero_infinity), a zero gradient, no NaN") {
  // Utterance 1's "2 2 3" needs 4 frames (a blank between the 2s) but has 3; utterance 2 has
  // no frames and a non-empty target; utterance 3 has neither frames nor labels (loss 0).
  const Tensor x = random_tensor({4, 6, 4}, 71);
  const Tensor il = ints({6, 3, 0, 0}), tl = ints({2, 3, 1, 0});
  const Tensor tg = ints({1, 2, 2, 2, 3, 1});
  for (bool zero_infinity : {false, true})
    for (CtcReduction red : {CtcReduction::none, CtcReduction::sum, CtcReduction::mean}) {
      CtcOptions o;
      o.reduction = red;
      o.zero_infinity = zero_infinity;
      Variable v(x.clone(), true);
      const CtcLoss r = ctc_loss(v, il, tg, tl, o);
      CHECK(r.impossible == 2);
      const std::vector<float> per = r.per_utterance.to_vector();
      CHECK(std::isfinite(per[0]));
      CHECK(per[1] == INFINITY);
      CHECK(per[2] == INFINITY);
      CHECK(per[3] == 0.0f);  // no frames, empty target: probability 1
      const std::vector<float> loss = r.loss.data().to_vector();
      if (red == CtcReduction::none) {
        CHECK(loss[1] == (zero_infinity ? 0.0f : INFINITY));
        CHECK(loss[0] == per[0]);
      } else {
        if (zero_infinity)  // mean: utterance 0's loss / its 2 labels / 4 utterances
          CHECK(loss[0] == doctest::Approx(red == CtcReduction::sum ? per[0] : per[0] / 2 / 4));
        else
          CHECK(loss[0] == INFINITY);
      }
      r.loss.backward(Tensor::full(r.loss.shape(), 1.0f));
      const std::vector<float> g = v.grad().to_vector();
      for (size_t i = 0; i < g.size(); ++i) {
        REQUIRE(std::isfinite(g[i]));
        if (i >= 24) CHECK(g[i] == 0.0f);  // utterances 1-3
      }
    }
}

TEST_CASE("NaN logits give a NaN loss and gradient for that utterance only") {
  std::vector<float> v = random_values(2 * 5 * 3, 72);
  v[3 * 3 + 1] = NAN;  // utterance 0, frame 3
  Variable x(Tensor::from_vector(v, {2, 5, 3}), true);
  CtcOptions o;
  o.reduction = CtcReduction::none;
  const CtcLoss r = ctc_loss(x, ints({5, 5}), ints({1, 2, 1}), ints({2, 1}), o);
  CHECK(r.impossible == 0);
  const std::vector<float> per = r.per_utterance.to_vector();
  CHECK(std::isnan(per[0]));
  CHECK(std::isfinite(per[1]));
  r.loss.backward(Tensor::full({2}, 1.0f));
  const std::vector<float> g = x.grad().to_vector();
  for (size_t i = 0; i < g.size(); ++i) CHECK(std::isnan(g[i]) == (i < 15));
}

// ---- validation
// -----------------------------------------------------------------------------------

TEST_CASE("ctc_loss rejects bad inputs with clear errors") {
  const Tensor x = random_tensor({2, 5, 4}, 81);
  const Tensor il = ints({5, 4}), tl = ints({2, 1}), tg = ints({1, 2, 3});
  auto loss = [&](const Tensor& xx, const Tensor& i, const Tensor& t, const Tensor& l,
                  int blank = 0) {
    CtcOptions o;
    o.blank = blank;
    return ctc_loss(Variable(xx), i, t, l, o);
  };
  CHECK_ERROR(loss(x, il, ints({1, 4, 3}), tl), "ctc_loss", "label 4", "utterance 0", "position 1",
              "outside the 4 classes");
  CHECK_ERROR(loss(x, il, ints({1, 2, -1}), tl), "label -1", "utterance 1", "position 0");
  CHECK_ERROR(loss(x, il, ints({1, 0, 3}), tl), "label 0", "is the blank");
  CHECK_ERROR(loss(x, il, ints({1, 2, 3}), tl, 3), "label 3", "utterance 1", "is the blank");
  CHECK_ERROR(loss(x, ints({5, 6}), tg, tl), "input_lengths[1] = 6", "outside [0, T = 5]");
  CHECK_ERROR(loss(x, ints({-1, 5}), tg, tl), "input_lengths[0] = -1");
  CHECK_ERROR(loss(x, ints({5}), tg, tl), "input_lengths i32 (2)");
  CHECK_ERROR(loss(x, il, tg, ints({2, -1})), "target_lengths[1] = -1", "negative");
  CHECK_ERROR(loss(x, il, tg, ints({2, 2})), "concatenated targets", "sum(target_lengths) = 4");
  CHECK_ERROR(loss(x, il, Tensor::from_int_vector({1, 2, 3, 1}, {2, 2}), ints({3, 1})),
              "target_lengths[0] = 3", "exceeds the padded target length 2");
  CHECK_ERROR(loss(x, il, Tensor::from_vector({1, 2, 3}, {3}), tl), "targets i32");
  CHECK_ERROR(loss(x.reshape({10, 4}), il, tg, tl), "logits f32 (B, T, V)");
  CHECK_ERROR(loss(x, il, tg, tl, 4), "blank = 4", "outside the 4 classes");
  CHECK_ERROR(loss(x, il, tg, tl, -1), "blank = -1");
  CHECK_ERROR(loss(x, il, Tensor::from_int_vector({1, 2, 3}, {3, 1}), tl), "targets i32");
}

// ---- decoding ---------------------------------------------------------------------------------

namespace {

// Logits (1, T, V) whose frame t puts log-probability ~0 on path[t] and `rest` elsewhere.
Tensor peaked(const std::vector<int32_t>& path, int64_t V, float rest = -5.0f) {
  const int64_t T = static_cast<int64_t>(path.size());
  std::vector<float> v(static_cast<size_t>(T * V), rest);
  for (int64_t t = 0; t < T; ++t) v[t * V + path[t]] = 0.0f;
  return Tensor::from_vector(v, {1, T, V});
}

}  // namespace

TEST_CASE("greedy decoding merges repeats, then drops blanks") {
  const Tensor x = peaked({0, 1, 1, 0, 1, 2, 2, 0, 0, 3, 1}, 4);
  CHECK(ctc_greedy_decode(x, ints({11})).at(0) == LabelSequence{1, 1, 2, 3, 1});
  CHECK(ctc_greedy_decode(x, ints({6})).at(0) == LabelSequence{1, 1, 2});
  CHECK(ctc_greedy_decode(x, ints({0})).at(0).empty());
  // Blank 2: now class 0 is a label and 2 separates nothing.
  CHECK(ctc_greedy_decode(x, ints({11}), 2).at(0) == LabelSequence{0, 1, 0, 1, 0, 3, 1});
}

TEST_CASE("beam search with beam 1 equals greedy decoding on confident frames") {
  const int64_t B = 6, T = 50, V = 7;
  std::vector<float> v = random_values(B * T * V, 91, -1.0f, 1.0f);
  // Frame (b, t) puts 4 more on a random class: its probability is above 1/2.
  const std::vector<float> pick = random_values(B * T, 92, 0.0f, float(V));
  for (int64_t r = 0; r < B * T; ++r) v[r * V + std::min<int64_t>(V - 1, int64_t(pick[r]))] += 4.0f;
  const Tensor x = Tensor::from_vector(v, {B, T, V});
  const Tensor il = ints({50, 49, 31, 1, 0, 50});
  const auto greedy = ctc_greedy_decode(x, il);
  const auto beam = ctc_beam_search(x, il, 1);
  for (int64_t b = 0; b < B; ++b) CHECK(beam[b].labels == greedy[b]);
}

TEST_CASE("beam search with a wide beam finds the most probable labelling (brute force)") {
  // Two frames of p(blank) = 0.6, p(a) = 0.4: greedy says "" (0.36), but "a" has
  // 0.4 * 0.4 + 2 * 0.4 * 0.6 = 0.64.
  const float lb = std::log(0.6f), la = std::log(0.4f);
  const Tensor two = Tensor::from_vector({lb, la, lb, la}, {1, 2, 2});
  CHECK(ctc_greedy_decode(two, ints({2})).at(0).empty());
  const CtcHypothesis h = ctc_beam_search(two, ints({2}), 2).at(0);
  CHECK(h.labels == LabelSequence{1});
  CHECK(h.log_prob == doctest::Approx(std::log(0.64)).epsilon(1e-6));

  // Random small problems: a beam that never prunes gives the exact best labelling and its
  // probability, which is also exp(-ctc_loss).
  for (uint32_t seed = 0; seed < 6; ++seed) {
    const int64_t T = 6, V = 3;
    const Tensor x = random_tensor({1, T, V}, 200 + seed, -1.5f, 1.5f);
    const auto p = brute_force(log_softmax_ref(x.to_vector(), T, V), T, V, 0);
    auto best = std::max_element(p.begin(), p.end(),
                                 [](const auto& a, const auto& b) { return a.second < b.second; });
    const CtcHypothesis hyp = ctc_beam_search(x, ints({int32_t(T)}), 1000).at(0);
    CHECK(hyp.labels == best->first);
    CHECK(hyp.log_prob == doctest::Approx(std::log(best->second)).epsilon(1e-5));
    CHECK(-loss_of(x, hyp.labels) == doctest::Approx(hyp.log_prob).epsilon(1e-5));
  }
}

TEST_CASE("decoders reject bad inputs") {
  const Tensor x = random_tensor({2, 5, 4}, 1);
  CHECK_ERROR(ctc_greedy_decode(x, ints({5, 6})), "ctc_greedy_decode", "input_lengths[1] = 6");
  CHECK_ERROR(ctc_greedy_decode(x, ints({5})), "input_lengths i32 (2)");
  CHECK_ERROR(ctc_beam_search(x, ints({5, 5}), 0), "beam_width >= 1");
  CHECK_ERROR(ctc_beam_search(x, ints({5, 5}), 4, 4), "blank = 4");
  CHECK_ERROR(ctc_beam_search(x.reshape({10, 4}), ints({5, 5}), 4), "logits f32 (B, T, V)");
}

// ---- edit distance and error rates ------------------------------------------------------------

TEST_CASE("edit distance on hand cases") {
  // kitten -> sitting: 2 substitutions and 1 insertion.
  const LabelSequence kitten = {10, 8, 19, 19, 4, 13}, sitting = {18, 8, 19, 19, 8, 13, 6};
  CHECK(edit_distance(kitten, sitting) == 3);
  CHECK(edit_distance(sitting, kitten) == 3);
  CHECK(edit_distance({}, {}) == 0);
  CHECK(edit_distance({1, 2, 3}, {}) == 3);
  CHECK(edit_distance({}, {1, 2}) == 2);
  CHECK(edit_distance({1, 2, 3}, {1, 2, 3}) == 0);
  CHECK(edit_distance({1, 2, 3}, {3, 2, 1}) == 2);
  CHECK(edit_distance({1, 2, 3, 4}, {2, 3, 4, 5}) == 2);  // drop the 1, add the 5
}

TEST_CASE("the error rate sums edits and reference lengths over the corpus") {
  // Per utterance 1/1 and 0/9 would average to 0.5; the corpus rate is 1/10.
  const std::vector<LabelSequence> refs = {{1}, {1, 2, 3, 4, 5, 6, 7, 8, 9}};
  const std::vector<LabelSequence> hyps = {{2}, {1, 2, 3, 4, 5, 6, 7, 8, 9}};
  CHECK(error_rate(refs, hyps) == doctest::Approx(0.1));
  ErrorRate r;
  r.add(refs[0], hyps[0]);
  r.add(std::vector<LabelSequence>{refs[1]}, std::vector<LabelSequence>{hyps[1]});
  CHECK(r.edits == 1);
  CHECK(r.reference_length == 10);
  CHECK(r.rate() == doctest::Approx(0.1));
  CHECK(ErrorRate{}.rate() == 0.0);
  CHECK(error_rate({{}}, {{1}}) == INFINITY);
  CHECK_ERROR(error_rate(refs, {{1}}), "2 references but 1 hypotheses");
}

TEST_CASE("target_sequences reads padded and concatenated targets") {
  const Tensor tl = ints({2, 0, 3});
  const std::vector<LabelSequence> want = {{1, 2}, {}, {3, 4, 5}};
  CHECK(target_sequences(ints({1, 2, 3, 4, 5}), tl) == want);
  CHECK(target_sequences(Tensor::from_int_vector({1, 2, -1, 9, 9, 9, 3, 4, 5}, {3, 3}), tl) ==
        want);
  CHECK_ERROR(target_sequences(Tensor::from_int_vector({1, 2, 3, 4}, {2, 2}), ints({3, 1})),
              "target_lengths[0] = 3");
  CHECK_ERROR(target_sequences(ints({1, 2}), tl), "does not fit");
}
