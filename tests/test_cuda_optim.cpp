// The optimizers and clip_grad_norm on CUDA parameters against the same steps on the cpu:
// every optimizer configuration (SGD plain, with momentum, Nesterov and weight decay; Adam and
// AdamW; R-Adam through both of its branches; L2 and decoupled weight decay) over 12 steps with
// identical random gradients on parameters of shapes (1), (17) and (129, 3), comparing the
// parameters and the state after every step; the global norm and the clipped gradients; state
// saved from and loaded into device optimizers; parameters on both devices in one optimizer.
// Part of the test_cuda program (tests/test_cuda.cpp has its main).
//
// Tolerances: each element runs the same float formula (optim/update_math.h) on both devices, so
// in emulation they agree bit for bit. On a GPU nvcc fuses a * b + c into one rounding; each
// step can then move a value by about an ulp of the numbers it combines, and the differences
// carry over into later steps, so there the check allows kGpuUlps ulps of the tensor's largest
// magnitude. The norm sums the same double squares (exact products of floats) in another order
// (blocks on the device, the same on a GPU and in emulation); n eps_double bounds the relative
// difference by 1e-11 for 1e5 squares, and rounding errors that cancel leave about
// sqrt(n) eps_double, so it is compared within 1e-12.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "check.h"
#include "core/cuda/cuda.h"
#include "core/tensor.h"
#include "cuda_check.h"
#include "optim/optimizer.h"

using namespace clustr;
using namespace clustr::optim;

namespace {

// optim/cuda/update.h's kTensorsPerLaunch (that header's namespace cuda would clash with core's
// here): the parameters one multi-tensor launch holds.
constexpr int kPerLaunch = 48;

constexpr int kSteps = 12;      // R-Adam (beta2 0.999) rectifies from step 6
constexpr int64_t kGpuUlps = 32;  // ulps of a tensor's largest magnitude, after 12 steps

// actual (device) equals expected (cpu): bit for bit with the emulator's exact numerics,
// otherwise (a GPU, which fuses multiply-adds) within kGpuUlps ulps of the largest |expected|,
// or of `floor` when that is larger: a sum of terms that cancel is off by ulps of its terms.
void check_same(const std::vector<float>& actual, const std::vector<float>& expected,
                float floor = 0.0f) {
  if (cuda::exact_numerics()) return test::check_ulps(actual, expected, 0);
  float scale = floor;
  for (float e : expected) scale = std::max(scale, std::fabs(e));
  const double tol = kGpuUlps * double(FLT_EPSILON) * scale;
  CHECK_CLOSE(actual, expected, tol, 0.0);
}

// Sets p's gradient to g, copied to p's device (the leaf's own backward).
void set_grad(Variable p, const Tensor& g) {
  p.zero_grad();
  p.backward(g.to(p.device()));
}

const std::vector<Shape> kShapes{{1}, {17}, {129, 3}};

// Parameters "a", "b", "c" of kShapes with the same random values, on `devices[i]`.
NamedParameters make_params(const std::vector<Device>& devices) {
  NamedParameters ps;
  const char* names[] = {"a", "b", "c"};
  for (size_t i = 0; i < kShapes.size(); ++i)
    ps.emplace_back(names[i],
                    Variable(test::random_tensor(kShapes[i], 10 + uint32_t(i)).to(devices[i]),
                             true));
  return ps;
}
NamedParameters make_params(Device d) { return make_params({d, d, d}); }

// The gradients of step t (1-based), one per parameter, on the cpu.
std::vector<Tensor> grads_of(int t) {
  std::vector<Tensor> g;
  for (size_t i = 0; i < kShapes.size(); ++i)
    g.push_back(test::random_tensor(kShapes[i], 1000 * uint32_t(t) + uint32_t(i)));
  return g;
}

void set_grads(const NamedParameters& ps, int t) {
  const std::vector<Tensor> g = grads_of(t);
  for (size_t i = 0; i < ps.size(); ++i) set_grad(ps[i].second, g[i]);
}

bool is_first_moment(const std::string& name) {
  return name.find("exp_avg") != std::string::npos &&
         name.find("exp_avg_sq") == std::string::npos;
}

// Both state dicts hold the same names, step counts and (within check_same) values; every
// tensor of a state dict is on the cpu, whatever the parameters' device.
void check_same_state(const Optimizer& device_opt, const Optimizer& cpu_opt) {
  const auto got = device_opt.state_dict(), want = cpu_opt.state_dict();
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    CAPTURE(want[k].first);
    CHECK(got[k].first == want[k].first);
    CHECK(got[k].second.device() == Device::cpu);
    CHECK(got[k].second.shape() == want[k].second.shape());
    if (want[k].second.dtype() == DType::i32)
      CHECK(got[k].second.to_int_vector() == want[k].second.to_int_vector());
    else  // the first moment sums (1 - beta1) g = 0.1 g of gradients in [-1, 1] that cancel
      check_same(got[k].second.to_vector(), want[k].second.to_vector(),
                 is_first_moment(want[k].first) ? 0.1f : 0.0f);
  }
}

struct Config {
  const char* name;
  std::function<std::unique_ptr<Optimizer>(NamedParameters)> make;
};

AdamOptions adam_options(float weight_decay, WeightDecay decay) {
  AdamOptions o;
  o.lr = 0.01f;
  o.weight_decay = weight_decay;
  o.decay = decay;
  return o;
}

std::vector<Config> configs() {
  auto sgd = [](SgdOptions o) {
    return [o](NamedParameters ps) { return std::make_unique<Sgd>(std::move(ps), o); };
  };
  auto adam = [](float wd, WeightDecay decay) {
    return [=](NamedParameters ps) {
      return std::make_unique<Adam>(std::move(ps), adam_options(wd, decay));
    };
  };
  auto radam = [](float wd, WeightDecay decay) {
    return [=](NamedParameters ps) {
      return std::make_unique<RAdam>(std::move(ps), adam_options(wd, decay));
    };
  };
  return {
      {"sgd", sgd({0.1f})},
      {"sgd weight decay", sgd({0.1f, 0.0f, false, 0.01f})},
      {"sgd momentum", sgd({0.1f, 0.9f})},
      {"sgd momentum weight decay", sgd({0.1f, 0.9f, false, 0.01f})},
      {"sgd nesterov weight decay", sgd({0.1f, 0.9f, true, 0.01f})},
      {"adam", adam(0.0f, WeightDecay::l2)},
      {"adam l2", adam(0.1f, WeightDecay::l2)},
      {"adam decoupled", adam(0.1f, WeightDecay::decoupled)},
      {"adamw",
       [](NamedParameters ps) { return std::make_unique<AdamW>(std::move(ps), adamw_defaults()); }},
      {"radam", radam(0.0f, WeightDecay::l2)},
      {"radam l2", radam(0.1f, WeightDecay::l2)},
      {"radam decoupled", radam(0.1f, WeightDecay::decoupled)},
  };
}

std::vector<float> data_of(const Variable& p) { return p.data().to_vector(); }

}  // namespace

TEST_CASE("cuda optim: every optimizer takes the cpu's steps on device parameters") {
  for (const Config& c : configs()) {
    CAPTURE(c.name);
    const NamedParameters cpu_ps = make_params(Device::cpu), dev_ps = make_params(Device::cuda);
    auto cpu_opt = c.make(cpu_ps);
    auto dev_opt = c.make(dev_ps);
    for (int t = 1; t <= kSteps; ++t) {
      CAPTURE(t);
      set_grads(cpu_ps, t);
      set_grads(dev_ps, t);
      cpu_opt->step();
      dev_opt->step();
      for (size_t i = 0; i < cpu_ps.size(); ++i) {
        CAPTURE(cpu_ps[i].first);
        CHECK(dev_ps[i].second.device() == Device::cuda);
        check_same(data_of(dev_ps[i].second), data_of(cpu_ps[i].second));
      }
      check_same_state(*dev_opt, *cpu_opt);
    }
    // The parameters moved: a comparison of two untouched copies would pass too.
    CHECK(data_of(dev_ps[2].second) != test::random_tensor(kShapes[2], 12).to_vector());
  }
  // R-Adam's 12 steps took both branches.
  CHECK(radam_rho(0.999, 5) <= 5.0);
  CHECK(radam_rho(0.999, kSteps) > 5.0);
}

TEST_CASE("cuda optim: a step updates all parameters in a few launches (multi-tensor)") {
  // 2 K + 1 parameters (K = kTensorsPerLaunch, what one launch holds), one of which gets no
  // gradient at the first step and so runs a step behind: each step is one launch per K
  // parameters of each run of parameters at the same step number. SGD without momentum has no
  // state to allocate (the zero-fill of new state would be kernels of its own).
  const int kParams = 2 * kPerLaunch + 1, kLagging = 10;
  NamedParameters ps[2];
  for (int d = 0; d < 2; ++d)
    for (int i = 0; i < kParams; ++i)
      ps[d].emplace_back("p" + std::to_string(i),
                         Variable(test::random_tensor({1 + 7 * i}, 500 + uint32_t(i))
                                      .to(d == 0 ? Device::cpu : Device::cuda),
                                  true));
  Sgd cpu_opt(ps[0], SgdOptions{0.1f}), dev_opt(ps[1], SgdOptions{0.1f});
  for (int t = 1; t <= 2; ++t) {
    CAPTURE(t);
    for (int d = 0; d < 2; ++d)
      for (int i = 0; i < kParams; ++i) {
        Variable p = ps[d][size_t(i)].second;
        if (t == 1 && i == kLagging) {
          p.zero_grad();
          continue;
        }
        set_grad(p, test::random_tensor({1 + 7 * i}, 900 + 100 * uint32_t(t) + uint32_t(i)));
      }
    cpu_opt.step();
    const cuda::LaunchCounts before = cuda::launch_counts();
    dev_opt.step();
    const uint64_t launches = cuda::launch_counts().kernels - before.kernels;
    // Step 1: one run of 2 K parameters (2 launches). Step 2: p0-p9 at step 2, p10 at step 1,
    // the other 2 K - 10 at step 2: 1 + 1 + 2 launches.
    CHECK(launches == (t == 1 ? 2u : 4u));
    for (int i = 0; i < kParams; ++i) {
      CAPTURE(i);
      check_same(data_of(ps[1][size_t(i)].second), data_of(ps[0][size_t(i)].second));
    }
  }
}

TEST_CASE("cuda optim: state is allocated on the parameters' device") {
  const NamedParameters ps = make_params(Device::cuda);
  Adam opt(ps, AdamOptions{});
  set_grads(ps, 1);
  cuda::synchronize();
  const MemoryStats dev0 = memory_stats(Device::cuda), cpu0 = memory_stats(Device::cpu);
  opt.step();
  int64_t elements = 0;
  for (const Shape& s : kShapes) elements += numel(s);
  // exp_avg and exp_avg_sq of every parameter, nothing on the host.
  CHECK(memory_stats(Device::cuda).live_bytes == dev0.live_bytes + 2 * 4 * elements);
  CHECK(memory_stats(Device::cpu).live_bytes == cpu0.live_bytes);
}

TEST_CASE("cuda optim: clip_grad_norm on device gradients matches the cpu") {
  // (0): an empty gradient adds nothing; (100003): more elements than the 256 blocks' threads.
  const std::vector<Shape> shapes{{1}, {17}, {0}, {129, 3}, {100003}};
  for (double max_norm : {1.0, 1e6}) {
    CAPTURE(max_norm);
    std::vector<Variable> cpu_ps, dev_ps;
    for (size_t i = 0; i < shapes.size(); ++i) {
      Tensor g = test::random_tensor(shapes[i], 200 + uint32_t(i));
      cpu_ps.emplace_back(Tensor::zeros(shapes[i]), true);
      dev_ps.emplace_back(Tensor::zeros(shapes[i], DType::f32, Device::cuda), true);
      set_grad(cpu_ps.back(), g);
      set_grad(dev_ps.back(), g);
    }
    dev_ps.emplace_back(Tensor::zeros({5}, DType::f32, Device::cuda), true);  // no gradient
    std::vector<std::vector<float>> before;
    for (const Variable& p : dev_ps)
      if (p.grad().defined()) before.push_back(p.grad().to_vector());

    const double cpu_norm = clip_grad_norm(cpu_ps, max_norm);
    const double dev_norm = clip_grad_norm(dev_ps, max_norm);
    CHECK(std::fabs(dev_norm - cpu_norm) <= 1e-12 * cpu_norm);
    CHECK_FALSE(dev_ps.back().grad().defined());
    const double coef = max_norm / (dev_norm + 1e-6);
    REQUIRE((coef < 1.0) == (max_norm == 1.0));  // the first clips, the second does not
    for (size_t i = 0; i < shapes.size(); ++i) {
      CAPTURE(i);
      const std::vector<float> got = dev_ps[i].grad().to_vector();
      // Exactly the gradient times the float factor (one multiplication, on any device)...
      std::vector<float> want = before[i];
      if (coef < 1.0)
        for (float& x : want) x *= static_cast<float>(coef);
      test::check_ulps(got, want, 0);
      // ...which is the cpu's, within an ulp should the norms round to different factors.
      test::check_ulps(got, cpu_ps[i].grad().to_vector(), 1);
    }
  }
}

TEST_CASE("cuda optim: clip_grad_norm sums and scales many device gradients in few launches") {
  // K + 6 gradients (and an empty one; K = kTensorsPerLaunch): a sum-of-squares launch per K,
  // a scaling launch per K.
  std::vector<Variable> cpu_ps, dev_ps;
  const int n = kPerLaunch + 6;
  for (int i = 0; i <= n; ++i) {
    const Shape s{i == n ? 0 : 1 + 37 * i};
    Tensor g = test::random_tensor(s, 700 + uint32_t(i));
    cpu_ps.emplace_back(Tensor::zeros(s), true);
    dev_ps.emplace_back(Tensor::zeros(s, DType::f32, Device::cuda), true);
    set_grad(cpu_ps.back(), g);
    set_grad(dev_ps.back(), g);
  }
  for (double max_norm : {1e9, 0.5}) {
    CAPTURE(max_norm);
    const cuda::LaunchCounts before = cuda::launch_counts();
    const double dev_norm = clip_grad_norm(dev_ps, max_norm);
    const uint64_t launches = cuda::launch_counts().kernels - before.kernels;
    const double cpu_norm = clip_grad_norm(cpu_ps, max_norm);
    CHECK(std::fabs(dev_norm - cpu_norm) <= 1e-12 * cpu_norm);
    CHECK(launches == (max_norm == 0.5 ? 4u : 2u));  // 2 sums (+ 2 scalings when it clips)
    for (size_t i = 0; i < dev_ps.size(); ++i) {
      CAPTURE(i);
      test::check_ulps(dev_ps[i].grad().to_vector(), cpu_ps[i].grad().to_vector(), 1);
    }
  }
}

TEST_CASE("cuda optim: clip_grad_norm is deterministic, mixes devices and passes NaN through") {
  Variable a(test::random_tensor({100003}, 300).to(Device::cuda), true);
  Variable b(test::random_tensor({129, 3}, 301), true);  // cpu
  set_grad(a, test::random_tensor({100003}, 302));
  set_grad(b, test::random_tensor({129, 3}, 303));
  const double n1 = clip_grad_norm({a, b}, 1e9), n2 = clip_grad_norm({a, b}, 1e9);
  CHECK(n1 == n2);  // the same bits: block sums added in a fixed order

  Variable a_cpu(Tensor::zeros({100003}), true), b_cpu(Tensor::zeros({129, 3}), true);
  set_grad(a_cpu, a.grad().to(Device::cpu));
  set_grad(b_cpu, b.grad());
  CHECK(std::fabs(n1 - clip_grad_norm({a_cpu, b_cpu}, 1e9)) <= 1e-12 * n1);
  const std::vector<float> a0 = a.grad().to_vector(), b0 = b.grad().to_vector();
  clip_grad_norm({a, b}, 0.5);
  const float c = static_cast<float>(0.5 / (n1 + 1e-6));
  std::vector<float> a_want = a0, b_want = b0;
  for (float& x : a_want) x *= c;
  for (float& x : b_want) x *= c;
  test::check_ulps(a.grad().to_vector(), a_want, 0);
  test::check_ulps(b.grad().to_vector(), b_want, 0);

  std::vector<float> g = test::random_values(17, 304);
  g[9] = NAN;
  Variable n(Tensor::zeros({17}, DType::f32, Device::cuda), true);
  set_grad(n, Tensor::from_vector(g, {17}));
  CHECK(std::isnan(clip_grad_norm({n}, 1.0)));
  test::check_ulps(n.grad().to_vector(), g, 0);  // a NaN norm scales nothing
}

TEST_CASE("cuda optim: device state saves and loads, on either device, and continues alike") {
  for (const Config& c : configs()) {
    CAPTURE(c.name);
    const NamedParameters ps = make_params(Device::cuda);
    auto opt = c.make(ps);
    for (int t = 1; t <= 4; ++t) {
      set_grads(ps, t);
      opt->step();
    }
    opt->set_lr(opt->lr() * 0.5f);
    const auto saved = opt->state_dict();
    for (const auto& kv : saved) CHECK(kv.second.device() == Device::cpu);
    const std::map<std::string, Tensor> state(saved.begin(), saved.end());
    std::map<std::string, Tensor> state_on_device;  // a state map may hold device tensors too
    for (const auto& kv : state) state_on_device[kv.first] = kv.second.to(Device::cuda);

    // Copies of the parameters on the device and on the cpu, restored from the state.
    auto copy_params = [&](Device d) {
      NamedParameters out;
      for (const auto& [name, p] : ps) out.emplace_back(name, Variable(p.data().to(d), true));
      return out;
    };
    const NamedParameters dev2 = copy_params(Device::cuda), dev3 = copy_params(Device::cuda),
                          cpu2 = copy_params(Device::cpu);
    auto opt_dev2 = c.make(dev2), opt_dev3 = c.make(dev3), opt_cpu2 = c.make(cpu2);
    opt_dev2->load_state_dict(state);
    opt_dev3->load_state_dict(state_on_device);
    opt_cpu2->load_state_dict(state);
    CHECK(opt_dev2->step_count() == 4);
    CHECK(opt_dev2->lr() == opt->lr());
    check_same_state(*opt_dev2, *opt);
    check_same_state(*opt_dev3, *opt);

    for (int t = 5; t <= 8; ++t) {
      CAPTURE(t);
      for (const NamedParameters* p : {&ps, &dev2, &dev3, &cpu2}) set_grads(*p, t);
      for (Optimizer* o : {opt.get(), opt_dev2.get(), opt_dev3.get(), opt_cpu2.get()}) o->step();
      for (size_t i = 0; i < ps.size(); ++i) {
        CAPTURE(ps[i].first);
        CHECK(data_of(dev2[i].second) == data_of(ps[i].second));  // same device: same bits
        CHECK(data_of(dev3[i].second) == data_of(ps[i].second));
        check_same(data_of(ps[i].second), data_of(cpu2[i].second));
      }
      check_same_state(*opt, *opt_cpu2);
    }
  }
}

TEST_CASE("cuda optim: parameters on both devices in one optimizer") {
  for (const Config& c : configs()) {
    CAPTURE(c.name);
    const NamedParameters cpu_ps = make_params(Device::cpu);
    const NamedParameters mixed = make_params({Device::cuda, Device::cpu, Device::cuda});
    auto cpu_opt = c.make(cpu_ps);
    auto mixed_opt = c.make(mixed);
    for (int t = 1; t <= kSteps; ++t) {
      CAPTURE(t);
      set_grads(cpu_ps, t);
      set_grads(mixed, t);
      if (t % 4 == 1) {  // clipped now and then (each clip is slow on the emulated device)
        const double cpu_norm = clip_grad_norm(cpu_ps, 2.0);
        const double mixed_norm = clip_grad_norm(mixed, 2.0);
        CHECK(std::fabs(mixed_norm - cpu_norm) <= 1e-12 * cpu_norm);
      }
      cpu_opt->step();
      mixed_opt->step();
      for (size_t i = 0; i < cpu_ps.size(); ++i) {
        CAPTURE(cpu_ps[i].first);
        CHECK(mixed[i].second.device() == (i == 1 ? Device::cpu : Device::cuda));
        check_same(data_of(mixed[i].second), data_of(cpu_ps[i].second));
      }
      check_same_state(*mixed_opt, *cpu_opt);
    }
  }
}

TEST_CASE("cuda optim: a gradient on another device than its parameter is refused by name") {
  const NamedParameters ps = make_params(Device::cuda);
  Adam opt(ps, AdamOptions{});
  set_grads(ps, 1);
  const std::vector<float> before = data_of(ps[0].second);
  ps[1].second.impl()->grad = grads_of(1)[1];  // on the cpu, the parameter on the device
  CHECK_ERROR(opt.step(), "Adam", "gradient of 'b'", "shape and device", "on cuda, got f32",
              "on cpu");
  CHECK(opt.step_count() == 0);
  CHECK(data_of(ps[0].second) == before);  // nothing was updated
}
