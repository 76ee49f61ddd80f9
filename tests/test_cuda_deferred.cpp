// Checks deferred to the device (core/cuda/cuda.h's DeferredChecks) and the ops a step that
// does not wait for the host is made of: inside a scope, or while a graph is captured, an index,
// a class target, a weight or a sequence length that is out of range is found by a kernel and
// reported by raise_device_errors() with the op, the element and the range, while the kernels
// stay inside their tensors (a NaN result, never a read elsewhere); the embedding's backward
// groups its indices on the device, in the CPU's order; and a transformer's forward and backward
// with full attention and cross-entropy capture into a graph whose replays give what running it
// gives. Part of the test_cuda program (tests/test_cuda.cpp has its main): on a GPU or the
// emulated device.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "check.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "layers/attention/full.h"
#include "layers/embedding.h"
#include "layers/encoder.h"
#include "layers/linear.h"

using clustr::Device;
using clustr::DType;
using clustr::Tensor;
using clustr::Variable;
namespace cuda = clustr::cuda;

namespace {

// raise_device_errors() throws a clustr::Error whose message holds every one of `parts`.
void check_raised(const std::vector<std::string>& parts) {
  try {
    cuda::raise_device_errors();
    FAIL("raise_device_errors() did not throw");
  } catch (const clustr::Error& e) {
    const std::string what = e.what();
    for (const std::string& p : parts) {
      INFO("message: ", what);
      CHECK(what.find(p) != std::string::npos);
    }
  }
  CHECK_NOTHROW(cuda::raise_device_errors());  // reported once
}

Tensor ints(const std::vector<int32_t>& v, const clustr::Shape& shape) {
  return Tensor::from_int_vector(v, shape, Device::cuda);
}

}  // namespace

TEST_CASE("deferred checks: a bad index, target, weight or length is reported by "
          "raise_device_errors, and the kernels keep within their tensors") {
  if (!cuda::available()) return;
  const Tensor table = Tensor::from_vector(clustr::test::random_values(5 * 4, 1), {5, 4},
                                           Device::cuda);
  // Outside a scope the check is the host's, at the call.
  CHECK_THROWS_WITH_AS(clustr::gather_rows(table, ints({0, 7}, {2})),
                       doctest::Contains("index[1] = 7 is outside [0, 5)"), clustr::Error);
  cuda::DeferredChecks deferred;
  CHECK(cuda::deferring_checks());
  CHECK_NOTHROW(cuda::raise_device_errors());  // nothing recorded yet

  const std::vector<float> rows = clustr::gather_rows(table, ints({1, 2, 9, 0}, {4})).to_vector();
  for (int c = 0; c < 4; ++c) CHECK(std::isnan(rows[2 * 4 + c]));  // the bad row: NaN
  CHECK(rows[0] == table.to_vector()[4]);                            // the good ones as asked
  check_raised({"gather_rows", "index[2] = 9", "outside [0, 5)", "checked on the device"});

  // The first failure is kept: the later one does not replace it.
  (void)clustr::gather_rows(table, ints({-1, 0}, {2}));
  (void)clustr::gather_rows(table, ints({0, 5}, {2}));
  check_raised({"index[0] = -1"});

  const Tensor logits = Tensor::from_vector(clustr::test::random_values(3 * 4, 2), {3, 4},
                                            Device::cuda);
  const clustr::CrossEntropyOutput ce = clustr::cross_entropy(
      logits, ints({0, 9, -100}, {3}), Tensor(), -100, clustr::Reduction::mean);
  CHECK(std::isnan(ce.loss.item()));  // the bad row makes the loss NaN, read from nothing
  check_raised({"cross_entropy", "target[1] = 9", "outside [0, 4)", "is not -100"});
  const Tensor weight = Tensor::from_vector({1.0f, 1.0f, -2.0f}, {3}, Device::cuda);
  (void)clustr::cross_entropy(logits, ints({0, 1, 2}, {3}), weight, -100,
                              clustr::Reduction::mean);
  check_raised({"cross_entropy", "weight[2] = -2", "is not >= 0"});

  // Full attention on the tensor cores reads the lengths on the device (head width 32).
  const int64_t B = 2, N = 8, H = 2, E = 32;
  const Tensor qkv = Tensor::from_vector(clustr::test::random_values(B * N * 3 * H * E, 3),
                                         {B, N, 3 * H * E}, Device::cuda);
  const clustr::FullAttentionOutput r =
      clustr::full_attention_qkv_forward(qkv, H, ints({99, 4}, {B}), {});
  const std::vector<float> out = r.out.to_vector();
  for (float v : out) REQUIRE(std::isfinite(v));  // clamped to N: nothing read past the rows
  check_raised({"full_attention_qkv", "lengths[0] = 99", "outside [0, 9)"});
}

TEST_CASE("deferred checks: the embedding's backward groups its indices on the device in the "
          "cpu's order, bit for bit; a bad index is left out") {
  if (!cuda::available()) return;
  struct Case {
    int64_t V, n, D;
  };
  // Chunks of 1024 indices: one, several with a last partial one; few rows (each repeated
  // hundreds of times) and many (most untouched).
  for (const Case& c : {Case{7, 300, 5}, Case{7, 3000, 33}, Case{5000, 2500, 3}}) {
    CAPTURE(c.V);
    CAPTURE(c.n);
    std::vector<int32_t> idx(static_cast<size_t>(c.n));
    clustr::Generator gen(static_cast<uint64_t>(c.V * 7 + c.n));
    for (int32_t& i : idx) i = static_cast<int32_t>(gen.next_u32() % static_cast<uint32_t>(c.V));
    const std::vector<float> src = clustr::test::random_values(c.n * c.D, 4);
    const std::vector<float> start = clustr::test::random_values(c.V * c.D, 5);
    Tensor cpu = Tensor::from_vector(start, {c.V, c.D});
    clustr::scatter_add_rows_(cpu, Tensor::from_int_vector(idx, {c.n}),
                              Tensor::from_vector(src, {c.n, c.D}));
    Tensor dev = Tensor::from_vector(start, {c.V, c.D}, Device::cuda);
    clustr::scatter_add_rows_(dev, ints(idx, {c.n}),
                              Tensor::from_vector(src, {c.n, c.D}, Device::cuda));
    CHECK(dev.to_vector() == cpu.to_vector());
  }
  cuda::DeferredChecks deferred;
  Tensor dev = Tensor::zeros({3, 2}, DType::f32, Device::cuda);
  clustr::scatter_add_rows_(dev, ints({1, 3, 1}, {3}),
                            Tensor::from_vector({1, 2, 10, 20, 100, 200}, {3, 2}, Device::cuda));
  CHECK(dev.to_vector() == std::vector<float>{0, 0, 101, 202, 0, 0});
  check_raised({"scatter_add_rows_", "index[1] = 3", "outside [0, 3)"});
}

TEST_CASE("deferred checks: a transformer's forward and backward with full attention and "
          "cross-entropy capture into a graph; replays give the eager step's loss and "
          "gradients, and a bad target in a replay is reported") {
  if (!cuda::available()) return;
  const int64_t B = 3, N = 10, V = 6, D = 64, H = 2;
  clustr::Generator init(7);
  clustr::Embedding embedding(V, D, init);
  clustr::PositionalEncoding position(D);
  clustr::AttentionConfig attention;  // full, no dropout
  clustr::Encoder encoder(2, D, H, 96, attention, 0.0f, clustr::Activation::relu, false, init);
  clustr::Linear output(D, V, true, init);
  std::vector<Variable> params;
  for (clustr::Module* m : std::vector<clustr::Module*>{&embedding, &encoder, &output}) {
    m->to(Device::cuda);
    for (const Variable& p : m->parameters()) params.push_back(p);
  }
  // The step's inputs and outputs live in fixed device tensors, refilled between replays.
  Tensor input = Tensor::empty({B, N}, DType::i32, Device::cuda);
  Tensor target = Tensor::empty({B, N}, DType::i32, Device::cuda);
  Tensor lengths = Tensor::empty({B}, DType::i32, Device::cuda);
  Tensor loss = Tensor::empty({}, DType::f32, Device::cuda);
  clustr::Generator gen(8);  // draws nothing: no dropout, full attention
  auto step = [&] {
    for (Variable& p : params) p.zero_grad();
    const Variable x = position.forward(embedding.forward(input));
    const Variable logits = output.forward(encoder.forward(x, lengths, gen));
    const Variable l = clustr::cross_entropy(logits, target, Tensor(), -100);
    l.backward();
    loss.copy_from(l.data());
  };
  auto fill = [&](uint32_t round, bool bad) {
    std::vector<int32_t> in(B * N), tg(B * N);
    clustr::Generator g(100 + round);
    for (int64_t i = 0; i < B * N; ++i) {
      in[i] = static_cast<int32_t>(g.next_u32() % V);
      tg[i] = i % 3 == 0 ? -100 : static_cast<int32_t>(g.next_u32() % V);
    }
    if (bad) tg[4] = V + 2;
    input.copy_from(Tensor::from_int_vector(in, {B, N}));
    target.copy_from(Tensor::from_int_vector(tg, {B, N}));
    lengths.copy_from(Tensor::from_int_vector({int32_t(N), int32_t(N - 3 - round % 2), 5}, {B}));
  };
  auto values_of = [](const std::vector<Tensor>& ts) {
    std::vector<std::vector<float>> v;
    for (const Tensor& t : ts) v.push_back(t.to_vector());
    return v;
  };
  auto grads = [&] {
    std::vector<Tensor> g;
    for (const Variable& p : params) g.push_back(p.grad());
    return g;
  };
  cuda::Stream side;
  cuda::StreamGuard on_side(side);
  cuda::DeferredChecks deferred;  // before the capture: it makes the record the kernels write
  fill(0, false);
  step();  // warm-up: the positional table, cuBLAS, the allocator's blocks
  cuda::Graph graph;
  const int64_t launched = cuda::launch_counts().kernels;
  graph.capture(step);
  CHECK(cuda::launch_counts().kernels == launched);  // recorded, not launched
  // The gradients the capture made live in the graph's pool: each replay rewrites them.
  const std::vector<Tensor> captured = grads();
  for (uint32_t round = 1; round <= 2; ++round) {
    CAPTURE(round);
    fill(round, false);
    step();  // eager, the same kernels in the same order
    const float eager_loss = loss.item();
    const std::vector<std::vector<float>> eager = values_of(grads());
    fill(round, false);
    graph.replay();
    CHECK(loss.item() == eager_loss);
    CHECK(values_of(captured) == eager);
    CHECK_NOTHROW(cuda::raise_device_errors());
  }
  fill(3, true);
  graph.replay();
  CHECK(std::isnan(loss.item()));
  check_raised({"cross_entropy", "target[4] = 8", "outside [0, 6)"});
}

TEST_CASE("draw plans: the draws noted while recording are made by fill() in order, from the "
          "generator, as the step would draw them; a plan too small says so") {
  if (!cuda::available()) return;
  clustr::Generator recorded(5), eager(5);
  clustr::DrawPlan plan(64, Device::cuda);
  recorded.record_into(&plan);
  CHECK(recorded.recording() == &plan);
  const Tensor planes = clustr::normal_device({3, 4}, recorded, Device::cuda);
  const clustr::PhiloxOffset offset = clustr::reserve_device(recorded, 10);
  const Tensor more = clustr::normal_device({5}, recorded, Device::cuda, 1.0f, 2.0f);
  recorded.record_into(nullptr);
  CHECK(recorded.offset() == 0);  // recording draws nothing
  CHECK(offset.at != nullptr);
  CHECK(plan.words() == 12 + 2 + 5);  // the 64-bit offset at an even word
  // What the step draws when it runs without a graph, from a generator in the same state.
  const std::vector<float> want_planes =
      clustr::normal_device({3, 4}, eager, Device::cuda).to_vector();
  const clustr::PhiloxOffset want_offset = clustr::reserve_device(eager, 10);
  const std::vector<float> want_more =
      clustr::normal_device({5}, eager, Device::cuda, 1.0f, 2.0f).to_vector();
  CHECK(want_offset.at == nullptr);
  std::vector<float> host(static_cast<size_t>(plan.words()));
  plan.fill(recorded, host.data());
  CHECK(recorded.offset() == eager.offset());
  plan.memory().rows(0, plan.words()).copy_from(Tensor::from_vector(host, {plan.words()}));
  CHECK(planes.to_vector() == want_planes);  // the recorded tensors read the plan's memory
  CHECK(more.to_vector() == want_more);
  uint64_t got_offset = 0;
  std::memcpy(&got_offset, host.data() + 12, sizeof got_offset);
  CHECK(got_offset == want_offset.value);

  clustr::DrawPlan small(4, Device::cuda);
  recorded.record_into(&small);
  CHECK_THROWS_WITH_AS(clustr::normal_device({5}, recorded, Device::cuda),
                       doctest::Contains("need more than the plan's 4 words"), clustr::Error);
  recorded.record_into(nullptr);
}
