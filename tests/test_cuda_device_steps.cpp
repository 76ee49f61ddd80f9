// Steps decided on the device (optim/optimizer.h's DeviceSteps) against the eager loop on the
// same device: forward, backward, the gradient norm (clipped or measured), a step skipped when
// the loss or the norm is not finite, and the update with the schedule's learning rate. Queued
// one by one and replayed from a captured graph, they leave the parameters, the optimizer state,
// the step count and the learning rate bit for bit where the eager loop leaves them, and their
// records hold the eager loop's losses and norms. Part of the test_cuda program
// (tests/test_cuda.cpp has its main): on a GPU or the emulated device.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "check.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "layers/linear.h"
#include "optim/optimizer.h"

using clustr::Device;
using clustr::DType;
using clustr::Tensor;
using clustr::Variable;
namespace cuda = clustr::cuda;
namespace optim = clustr::optim;

namespace {

constexpr int64_t kRows = 8, kIn = 5, kHidden = 6, kClasses = 3;
constexpr int kSteps = 7;
constexpr int kBadStep = 3;  // its input holds an infinity: a NaN loss, a skipped step

// A two-layer classifier on the device, its optimizer, and the step's fixed input tensors.
struct Setup {
  clustr::Linear l1, l2;
  std::unique_ptr<optim::Optimizer> opt;
  Tensor x = Tensor::empty({kRows, kIn}, DType::f32, Device::cuda);
  Tensor target = Tensor::empty({kRows}, DType::i32, Device::cuda);
  Tensor loss = Tensor::empty({}, DType::f32, Device::cuda);
  Tensor correct = Tensor::empty({}, DType::f32, Device::cuda);

  Setup(clustr::Generator init, const std::string& kind)
      : l1(kIn, kHidden, true, init), l2(kHidden, kClasses, true, init) {
    l1.to(Device::cuda);
    l2.to(Device::cuda);
    optim::NamedParameters params = l1.named_parameters();
    for (const auto& np : l2.named_parameters()) params.emplace_back("l2." + np.first, np.second);
    if (kind == "radam") opt = std::make_unique<optim::RAdam>(params, optim::AdamOptions{});
    if (kind == "adamw") opt = std::make_unique<optim::AdamW>(params, optim::adamw_defaults());
    if (kind == "sgd")
      opt = std::make_unique<optim::Sgd>(params, optim::SgdOptions{0.05f, 0.9f, true, 0.01f});
  }
  // The inputs of step k (the same for every setup).
  void fill(int k) {
    std::vector<float> xv = clustr::test::random_values(kRows * kIn, 50 + k, -2.0f, 2.0f);
    if (k == kBadStep) xv[7] = INFINITY;
    std::vector<int32_t> tv(kRows);
    for (int64_t i = 0; i < kRows; ++i) tv[i] = static_cast<int32_t>((i * 7 + k) % kClasses);
    x.copy_from(Tensor::from_vector(xv, {kRows, kIn}));
    target.copy_from(Tensor::from_int_vector(tv, {kRows}));
  }
  void forward_backward() {
    opt->zero_grad();
    const Variable h = clustr::relu(l1.forward(Variable(x)));
    const Variable logits = l2.forward(h);
    const Variable l = clustr::cross_entropy(logits, target, Tensor(), -100);
    l.backward();
    loss.copy_from(l.data());
    correct.copy_from(clustr::count_equal(clustr::argmax(logits.data(), -1), target, -100));
  }
  std::vector<std::vector<float>> state() const {
    std::vector<std::vector<float>> out;
    for (const auto& np : opt->parameters()) out.push_back(np.second.data().to_vector());
    for (const auto& kv : opt->state_dict()) {
      if (kv.second.dtype() == DType::f32) {
        out.push_back(kv.second.to_vector());
        continue;
      }
      for (int32_t v : kv.second.to_int_vector()) out.push_back({float(v)});
    }
    return out;
  }
};

float lr_at(int64_t done) { return 1e-2f * float(done + 1) / 4.0f; }  // a warm-up

}  // namespace

TEST_CASE("device steps: queued one by one and replayed from a graph, they match the eager "
          "loop bit for bit, skipped step included") {
  if (!cuda::available()) return;
  for (const char* kind : {"radam", "adamw", "sgd"}) {
    for (float clip : {0.0f, 0.5f}) {
      CAPTURE(kind);
      CAPTURE(clip);
      // Eager: the apps' loop (a non-finite loss skips backward, a non-finite norm the update).
      Setup eager(clustr::Generator(3), kind);
      std::vector<float> losses, corrects;
      std::vector<double> norms;
      std::vector<std::vector<std::vector<float>>> grads;  // each step's, clipped
      for (int k = 0; k < kSteps; ++k) {
        eager.opt->set_lr(lr_at(eager.opt->step_count()));
        eager.fill(k);
        eager.forward_backward();
        losses.push_back(eager.loss.item());
        corrects.push_back(eager.correct.item());
        double norm = NAN;
        if (std::isfinite(losses.back())) {
          std::vector<Variable> ps;
          for (const auto& np : eager.opt->parameters()) ps.push_back(np.second);
          norm = clip > 0 ? optim::clip_grad_norm(ps, clip) : optim::grad_norm(ps);
          if (std::isfinite(norm)) eager.opt->step();
        }
        norms.push_back(norm);
        grads.emplace_back();
        for (const auto& np : eager.opt->parameters())
          grads.back().push_back(np.second.grad().to_vector());
      }
      REQUIRE(eager.opt->step_count() == kSteps - 1);

      for (bool graphed : {false, true}) {
        CAPTURE(graphed);
        Setup dev(clustr::Generator(3), kind);
        cuda::Stream side;
        cuda::StreamGuard on_side(side);
        optim::DeviceSteps steps(*dev.opt, clip, kSteps);
        cuda::Graph graph;
        if (graphed) {
          dev.fill(0);
          dev.forward_backward();  // warm-up, no update
          graph.capture([&] {
            dev.forward_backward();
            steps.queue_step(dev.loss, {dev.correct});
          });
        }
        steps.prepare(lr_at);
        for (int k = 0; k < kSteps; ++k) {
          dev.fill(k);
          if (graphed) {
            graph.replay();
          } else {
            dev.forward_backward();
            const cuda::LaunchCounts before = cuda::launch_counts();
            steps.queue_step(dev.loss, {dev.correct});
            // The norm's sums with the decision in their last block, then the update (which
            // applies the clip scale): two launches.
            CHECK(cuda::launch_counts().kernels - before.kernels == 2u);
          }
          if (k == kBadStep) continue;  // a skipped step leaves its gradients as they came
          // The step's gradients, left clipped as clip_grad_norm leaves them.
          for (size_t i = 0; i < grads[k].size(); ++i)
            CHECK(dev.opt->parameters()[i].second.grad().to_vector() == grads[k][i]);
        }
        const std::vector<optim::math::StepRecord> records = steps.collect();
        REQUIRE(records.size() == size_t(kSteps));
        for (int k = 0; k < kSteps; ++k) {
          CAPTURE(k);
          CHECK(bool(records[k].skipped) == (k == kBadStep));
          CHECK(records[k].extra[0] == corrects[k]);
          CHECK(records[k].extra[1] == 0.0f);
          if (k == kBadStep) continue;
          CHECK(records[k].loss == losses[k]);
          CHECK(records[k].norm == norms[k]);
        }
        CHECK(dev.opt->step_count() == eager.opt->step_count());
        CHECK(dev.opt->lr() == eager.opt->lr());
        CHECK(dev.state() == eager.state());
      }
    }
  }
}

TEST_CASE("count_equal: the positions where two i32 tensors agree, ignored ones left out, the "
          "same on both devices") {
  if (!cuda::available()) return;
  std::vector<int32_t> a(3000), b(3000);
  clustr::Generator g(9);
  int64_t want = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<int32_t>(g.next_u32() % 4);
    b[i] = i % 5 == 0 ? -100 : static_cast<int32_t>(g.next_u32() % 4);
    if (i == 10) a[i] = b[i] = -100;  // equal, but ignored
    want += b[i] != -100 && a[i] == b[i];
  }
  const Tensor ha = Tensor::from_int_vector(a, {3000}), hb = Tensor::from_int_vector(b, {3000});
  CHECK(clustr::count_equal(ha, hb, -100).item() == float(want));
  CHECK(clustr::count_equal(ha.to(Device::cuda), hb.to(Device::cuda), -100).item() ==
        float(want));
  CHECK_THROWS_WITH_AS(clustr::count_equal(ha, hb.reshape({1000, 3}), -100),
                       doctest::Contains("expected a and b of one shape"), clustr::Error);
}

TEST_CASE("device steps: more steps than the window, or a step outside one, make no update "
          "and are reported; misuse is named") {
  if (!cuda::available()) return;
  Setup s(clustr::Generator(4), "radam");
  cuda::Stream side;
  cuda::StreamGuard on_side(side);
  optim::DeviceSteps steps(*s.opt, 0.0f, 2);
  s.fill(0);
  s.forward_backward();
  CHECK_THROWS_WITH_AS(steps.queue_step(s.loss), doctest::Contains("no window was prepared"),
                       clustr::Error);
  cuda::Graph graph;
  graph.capture([&] { steps.queue_step(s.loss); });
  steps.prepare(lr_at);
  for (int k = 0; k < 3; ++k) graph.replay();
  CHECK_THROWS_WITH_AS(steps.collect(), doctest::Contains("more steps were queued than the "
                                                          "window of 2"),
                       clustr::Error);
  CHECK(s.opt->step_count() == 2);  // the two it held were made
  const std::vector<float> weights = s.l1.named_parameters()[0].second.data().to_vector();
  graph.replay();  // after collect(): outside a window
  CHECK(s.l1.named_parameters()[0].second.data().to_vector() == weights);  // no update
  CHECK_THROWS_WITH_AS(steps.prepare(lr_at), doctest::Contains("outside a prepared window"),
                       clustr::Error);
  steps.prepare(lr_at);  // reported once; the window opens
  graph.replay();
  CHECK(steps.collect().size() == 1);
  CHECK(s.opt->step_count() == 3);
  steps.prepare(lr_at);
  s.opt->zero_grad();
  CHECK_THROWS_WITH_AS(steps.queue_step(s.loss), doctest::Contains("has no gradient"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(steps.queue_step(Tensor::zeros({1}, DType::f32, Device::cuda)),
                       doctest::Contains("expected the loss as an f32 scalar"), clustr::Error);
  s.forward_backward();
  CHECK_THROWS_WITH_AS(steps.queue_step(s.loss, {s.loss, s.loss, s.loss}),
                       doctest::Contains("3 extra values; a record holds 2"), clustr::Error);
}
