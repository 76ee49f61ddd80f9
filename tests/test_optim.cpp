// Optimizers (optim/optimizer.h): PyTorch 1.13 trajectories replayed step by step
// (tests/fixtures/optim/, written by tests/fixtures/make_optim_fixtures.py), R-Adam's decoupled
// weight decay and reduce-on-plateau against their definitions, clipping, checkpoint state round
// trips, and error messages.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "check.h"
#include "core/safetensors.h"
#include "optim/optimizer.h"

#ifndef CLUSTR_FIXTURE_DIR
#error "CLUSTR_FIXTURE_DIR must name the folder of the reference fixtures (tests/CMakeLists.txt)"
#endif

using namespace clustr;
using namespace clustr::optim;

namespace {

// The references are float64 trajectories rounded once; a float32 replay drifts by a few ulps
// per step (12 steps, |p| ~ 1), well inside these.
constexpr double kAtol = 1e-6, kRtol = 1e-5;

// Sets p's gradient to g (as a backward of sum(p * g) would leave it).
void set_grad(Variable p, const Tensor& g) {  // p shares its leaf
  p.zero_grad();
  sum_all(mul(p, Variable(g))).backward();
}

std::vector<float> vec(const Tensor& t) { return t.to_vector(); }

float meta_float(const SafetensorsFile& f, const std::string& key) {
  return std::stof(f.meta(key));
}

std::unique_ptr<Optimizer> make_from_metadata(const SafetensorsFile& f, NamedParameters params) {
  const std::string kind = f.meta("optimizer");
  if (kind == "sgd") {
    SgdOptions o;
    o.lr = meta_float(f, "lr");
    o.momentum = meta_float(f, "momentum");
    o.nesterov = f.meta("nesterov") == "true";
    o.weight_decay = meta_float(f, "weight_decay");
    return std::make_unique<Sgd>(std::move(params), o);
  }
  AdamOptions o;
  o.lr = meta_float(f, "lr");
  const std::string betas = f.meta("betas");
  o.beta1 = std::stof(betas.substr(0, betas.find(',')));
  o.beta2 = std::stof(betas.substr(betas.find(',') + 1));
  o.eps = meta_float(f, "eps");
  o.weight_decay = meta_float(f, "weight_decay");
  if (kind == "adam") return std::make_unique<Adam>(std::move(params), o);
  if (kind == "adamw") return std::make_unique<AdamW>(std::move(params), o);
  REQUIRE_MESSAGE(kind == "radam", f.path, ": unknown optimizer ", kind);
  return std::make_unique<RAdam>(std::move(params), o);  // L2 decay, as PyTorch 1.13
}

void replay(const std::string& name) {
  INFO("fixture ", name);
  const SafetensorsFile f =
      load_safetensors(std::string(CLUSTR_FIXTURE_DIR) + "/optim/" + name + ".safetensors");
  const int steps = std::stoi(f.meta("steps"));
  const bool clip = f.meta("clip") != "none";
  NamedParameters params;
  for (int i = 0; i < 2; ++i)
    params.emplace_back("p" + std::to_string(i),
                        Variable(f.get("p" + std::to_string(i) + ".init").clone(), true));
  auto opt = make_from_metadata(f, params);
  for (int k = 1; k <= steps; ++k) {
    INFO("step ", k);
    const std::string ks = std::to_string(k);
    for (int i = 0; i < 2; ++i)
      set_grad(params[i].second, f.get("p" + std::to_string(i) + ".grad." + ks));
    if (clip) {
      const double norm = clip_grad_norm(params, std::stod(f.meta("clip")));
      CHECK_CLOSE(std::vector<float>{static_cast<float>(norm)}, vec(f.get("norm." + ks)), 0.0,
                  1e-6);
    }
    opt->step();
    for (int i = 0; i < 2; ++i)
      CHECK_CLOSE(vec(params[i].second.data()), vec(f.get("p" + std::to_string(i) + ".step." + ks)),
                  kAtol, kRtol);
  }
  CHECK(opt->step_count() == steps);
}

}  // namespace

TEST_CASE("optim: PyTorch 1.13 trajectories, with and without clip_grad_norm_") {
  for (const char* c : {"sgd_momentum", "sgd_nesterov", "adam", "adamw", "radam", "radam_wd"})
    for (const char* clip : {"-noclip", "-clip"}) replay(std::string(c) + clip);
}

TEST_CASE("optim: R-Adam passes through both branches in the fixtures' 12 steps") {
  // beta2 = 0.999: rho_t <= 5 for t <= 5 (momentum step), > 5 from t = 6 (rectified).
  for (int t = 1; t <= 5; ++t) CHECK(radam_rho(0.999, t) <= 5.0);
  for (int t = 6; t <= 12; ++t) CHECK(radam_rho(0.999, t) > 5.0);
  // rho_t -> t for beta2 -> 1; and the limit rho_inf.
  CHECK(radam_rho(0.999, 1) == doctest::Approx(1.0).epsilon(1e-3));
  CHECK(radam_rho(0.999, 100000) == doctest::Approx(1999.0).epsilon(1e-9));
}

TEST_CASE("optim: R-Adam with decoupled weight decay follows its definition") {
  const Shape shape{7};
  Variable p(test::random_tensor(shape, 11), true);
  AdamOptions o;
  o.lr = 0.05f;
  o.weight_decay = 0.1f;
  o.decay = WeightDecay::decoupled;
  RAdam opt({{"w", p}}, o);
  // The definition in double: p *= 1 - lr wd; then R-Adam on the plain gradient.
  const std::vector<float> p0 = p.data().to_vector();
  std::vector<double> ref(p0.begin(), p0.end());
  std::vector<double> m(7, 0.0), v(7, 0.0);
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8, lr = 0.05, wd = 0.1;
  const double rho_inf = 2 / (1 - b2) - 1;
  for (int t = 1; t <= 12; ++t) {
    const Tensor g = test::random_tensor(shape, 100 + t);
    set_grad(p, g);
    opt.step();
    const std::vector<float> gv = g.to_vector();
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    const double rho = rho_inf - 2 * t * std::pow(b2, t) / bc2;
    for (size_t i = 0; i < ref.size(); ++i) {
      ref[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * gv[i];
      v[i] = b2 * v[i] + (1 - b2) * double(gv[i]) * gv[i];
      const double mhat = m[i] / bc1;
      if (rho > 5) {
        const double r = std::sqrt((rho - 4) * (rho - 2) * rho_inf /
                                   ((rho_inf - 4) * (rho_inf - 2) * rho));
        ref[i] -= lr * mhat * r * std::sqrt(bc2) / (std::sqrt(v[i]) + eps);
      } else {
        ref[i] -= lr * mhat;
      }
    }
    INFO("step ", t);
    CHECK_CLOSE(p.data().to_vector(), std::vector<float>(ref.begin(), ref.end()), kAtol, kRtol);
  }
}

TEST_CASE("optim: parameters without a gradient are skipped and get no state") {
  Variable a(test::random_tensor({3}, 1), true), b(test::random_tensor({2}, 2), true);
  const std::vector<float> b0 = b.data().to_vector();
  Adam opt({{"a", a}, {"b", b}}, AdamOptions{});
  set_grad(a, test::random_tensor({3}, 3));
  opt.step();
  CHECK(b.data().to_vector() == b0);
  bool has_b = false;
  for (const auto& kv : opt.state_dict()) has_b |= kv.first.rfind("optimizer.b.", 0) == 0;
  CHECK_FALSE(has_b);
  opt.zero_grad();
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("optim: clip_grad_norm leaves small gradients alone and scales large ones") {
  Variable a(Tensor::zeros({2}), true), b(Tensor::zeros({1}), true), c(Tensor::zeros({1}), true);
  set_grad(a, Tensor::from_vector({3.0f, 0.0f}, {2}));
  set_grad(b, Tensor::from_vector({4.0f}, {1}));
  CHECK(clip_grad_norm({a, b, c}, 10.0) == 5.0);  // c has no gradient: skipped
  CHECK(a.grad().to_vector() == std::vector<float>{3.0f, 0.0f});
  CHECK(clip_grad_norm({a, b}, 1.0) == 5.0);
  const float coef = static_cast<float>(1.0 / (5.0 + 1e-6));
  CHECK(a.grad().to_vector() == std::vector<float>{3.0f * coef, 0.0f});
  CHECK(b.grad().to_vector() == std::vector<float>{4.0f * coef});
}

TEST_CASE("optim: state save and load, then continuing gives identical steps") {
  for (int kind = 0; kind < 3; ++kind) {
    INFO("kind ", kind);
    auto make = [&](const NamedParameters& ps) -> std::unique_ptr<Optimizer> {
      if (kind == 0) return std::make_unique<Sgd>(ps, SgdOptions{0.1f, 0.9f, true, 0.01f});
      AdamOptions o;
      o.lr = 0.01f;
      if (kind == 1) return std::make_unique<AdamW>(ps, o);
      return std::make_unique<RAdam>(ps, o);
    };
    Variable w(test::random_tensor({3, 4}, 5), true), bias(test::random_tensor({4}, 6), true);
    NamedParameters ps{{"w", w}, {"bias", bias}};
    auto opt = make(ps);
    auto grads = [](int t) {
      return std::make_pair(test::random_tensor({3, 4}, 50 + t), test::random_tensor({4}, 80 + t));
    };
    for (int t = 0; t < 4; ++t) {
      set_grad(w, grads(t).first);
      set_grad(bias, grads(t).second);
      opt->step();
    }
    opt->set_lr(opt->lr() * 0.5f);
    const auto saved = opt->state_dict();
    std::map<std::string, Tensor> state(saved.begin(), saved.end());
    if (kind > 0) {
      REQUIRE(state.count("optimizer.w.exp_avg"));
      CHECK(state.at("optimizer.w.exp_avg_sq").shape() == Shape{3, 4});
    }
    CHECK(state.at("optimizer.step").to_int_vector() == std::vector<int32_t>{4});
    // A second model from the same values, restored from the state.
    Variable w2(w.data().clone(), true), bias2(bias.data().clone(), true);
    NamedParameters ps2{{"w", w2}, {"bias", bias2}};
    auto opt2 = make(ps2);
    opt2->load_state_dict(state);
    CHECK(opt2->step_count() == 4);
    CHECK(opt2->lr() == opt->lr());
    for (int t = 4; t < 8; ++t) {
      for (auto* p : {&ps, &ps2}) {
        set_grad((*p)[0].second, grads(t).first);
        set_grad((*p)[1].second, grads(t).second);
      }
      opt->step();
      opt2->step();
      CHECK(w2.data().to_vector() == w.data().to_vector());
      CHECK(bias2.data().to_vector() == bias.data().to_vector());
    }
    // Bad states are refused with the name at fault.
    auto bad = state;
    bad["optimizer.nope.exp_avg"] = Tensor::zeros({1});
    CHECK_ERROR(opt2->load_state_dict(bad), "unexpected state tensor", "optimizer.nope.exp_avg");
    if (kind > 0) {
      bad = state;
      bad["optimizer.w.exp_avg"] = Tensor::zeros({4, 3});
      CHECK_ERROR(opt2->load_state_dict(bad), "optimizer.w.exp_avg", "(3, 4)", "got f32 (4, 3)");
      bad = state;
      bad.erase("optimizer.w.exp_avg_sq");
      CHECK_ERROR(opt2->load_state_dict(bad), "missing", "optimizer.w.exp_avg_sq");
    }
    bad = state;
    bad.erase("optimizer.step");
    CHECK_ERROR(opt2->load_state_dict(bad), "missing", "optimizer.step");
  }
}

TEST_CASE("optim: learning-rate schedules") {
  CHECK(ConstantLr{0.3f}.lr_at(0) == 0.3f);
  CHECK(ConstantLr{0.3f}.lr_at(1000) == 0.3f);
  LinearWarmupLr warm(1.0f, 4);
  CHECK(warm.lr_at(0) == 0.25f);
  CHECK(warm.lr_at(1) == 0.5f);
  CHECK(warm.lr_at(3) == 1.0f);
  CHECK(warm.lr_at(100) == 1.0f);
  CHECK_ERROR(LinearWarmupLr(1.0f, 0), "LinearWarmupLr", "warmup_steps", ">= 1");
}

TEST_CASE("optim: reduce-on-plateau follows PyTorch's definition") {
  Variable p(Tensor::zeros({1}), true);
  Sgd opt({p}, SgdOptions{1.0f});
  PlateauOptions o;
  o.factor = 0.5;
  o.patience = 2;
  o.cooldown = 1;
  o.min_lr = 0.2;
  ReduceLrOnPlateau sched(o);
  // By hand: best starts at +inf; an epoch improves when loss < best * (1 - 1e-4).
  //  epoch loss     best    bad  cooldown  lr
  //  1     1.0      1.0     0    0         1
  //  2     0.99995  1.0     1    0         1     (within the relative threshold: not better)
  //  3     1.2      1.0     2    0         1
  //  4     1.1      1.0     3->0 1         0.5   (3 > patience 2: reduce, start cooldown)
  //  5     1.3      1.0     1->0 0         0.5   (cooldown swallows the bad epoch)
  //  6     1.3      1.0     1    0         0.5
  //  7     0.5      0.5     0    0         0.5
  //  8..10 0.6      0.5     1,2,3->0 1     0.25
  //  11    0.6      0.5     0 (cooldown)   0.25
  //  12..14 0.6     0.5     1,2,3->0       0.2   (max(0.125, min_lr))
  //  15..17 0.6                            0.2   (16: cooldown; 17: 1 bad)
  //  18,19 0.6      0.5     2,3->0         0.2   (0.2 - 0.2 <= 1e-8: no change)
  const std::vector<double> losses{1.0, 0.99995, 1.2, 1.1, 1.3, 1.3, 0.5, 0.6, 0.6, 0.6,
                                   0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6};
  const std::vector<float> lrs{1, 1, 1, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.25f,
                               0.25f, 0.25f, 0.25f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f, 0.2f};
  const std::vector<bool> reduced{false, false, false, true, false, false, false, false, false,
                                  true, false, false, false, true, false, false, false, false,
                                  false};
  for (size_t e = 0; e < losses.size(); ++e) {
    INFO("epoch ", e + 1);
    CHECK(sched.step(losses[e], opt) == reduced[e]);
    CHECK(opt.lr() == lrs[e]);
  }
  CHECK(sched.best() == 0.5);
  CHECK_ERROR(ReduceLrOnPlateau(PlateauOptions{1.0}), "ReduceLrOnPlateau", "factor", "(0, 1)");
  CHECK_ERROR(ReduceLrOnPlateau(PlateauOptions{0.5, -1}), "patience", ">= 0");
}

TEST_CASE("optim: bad hyperparameters are refused with clear messages") {
  Variable p(Tensor::zeros({2}), true);
  auto adam = [&](AdamOptions o) { return RAdam({{"w", p}}, o); };
  AdamOptions o;
  o.lr = -1.0f;
  CHECK_ERROR(adam(o), "RAdam", "lr must be", ">= 0", "-1");
  o = AdamOptions{};
  o.beta1 = 1.0f;
  CHECK_ERROR(adam(o), "RAdam", "beta1 must be in [0, 1)", "got 1");
  o = AdamOptions{};
  o.beta2 = -0.1f;
  CHECK_ERROR(adam(o), "RAdam", "beta2 must be in [0, 1)");
  o = AdamOptions{};
  o.eps = 0.0f;
  CHECK_ERROR(adam(o), "RAdam", "eps must be > 0");
  o = AdamOptions{};
  o.weight_decay = -0.5f;
  CHECK_ERROR(Adam({{"w", p}}, o), "Adam", "weight_decay must be >= 0");
  CHECK_ERROR(Sgd({p}, SgdOptions{0.1f, 1.0f}), "SGD", "momentum must be in [0, 1)");
  CHECK_ERROR(Sgd({p}, SgdOptions{0.1f, 0.0f, true}), "SGD", "nesterov needs momentum > 0");
  Sgd sgd({p}, SgdOptions{0.1f});
  CHECK_ERROR(sgd.set_lr(NAN), "SGD", "lr must be");
  CHECK_ERROR(Adam({{"w", p}, {"w", p}}, AdamOptions{}), "Adam", "'w' appears twice");
  CHECK_ERROR(clip_grad_norm({p}, 0.0), "clip_grad_norm", "max_norm", "> 0");
  Variable q(Tensor::zeros({2}), true);
  CHECK_ERROR(Sgd({sum_all(mul(q, q))}, SgdOptions{}), "SGD", "not a leaf");
}
