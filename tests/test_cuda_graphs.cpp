// CUDA graphs (core/cuda/cuda.h's Graph): a piece of work captured once and replayed gives what
// running it gives, on inputs refilled in place between replays; its scratch comes from the
// graph's pool and replays allocate nothing; what a graph cannot hold (a host read, a copy from
// the host, a synchronization, a host random draw) is refused during capture with an error that
// names it, and the stream is usable after. Part of the test_cuda program (tests/test_cuda.cpp
// has its main): on a GPU or the emulated device.
#include <doctest/doctest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "check.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"

using clustr::Device;
using clustr::DType;
using clustr::Tensor;
namespace cuda = clustr::cuda;

namespace {

// y = relu(x W + b) * 2 + exp(x W) summed over rows: elementwise kernels, a cuBLAS product, a
// reduction and temporaries in between (each freed before the next is made).
Tensor body(const Tensor& x, const Tensor& W, const Tensor& b) {
  const Tensor h = clustr::matmul(x, W);
  const Tensor r = clustr::mul(clustr::relu(clustr::add(h, b)), 2.0f);
  return clustr::sum(clustr::add(r, clustr::exp(clustr::mul(h, 0.1f))), 0);
}

std::vector<float> values(int64_t n, uint32_t seed) {
  return clustr::test::random_values(n, seed, -1.0f, 1.0f);
}

}  // namespace

TEST_CASE("cuda graphs: a captured body replays as it runs, on inputs refilled in place") {
  if (!cuda::available()) return;
  const Tensor W = Tensor::from_vector(values(16 * 8, 1), {16, 8}, Device::cuda);
  const Tensor b = Tensor::from_vector(values(8, 2), {8}, Device::cuda);
  Tensor x = Tensor::empty({5, 16}, DType::f32, Device::cuda);  // the graph's input
  Tensor y = Tensor::empty({8}, DType::f32, Device::cuda);      // and its output
  cuda::Stream side;
  cuda::StreamGuard on_side(side);
  x.copy_from(Tensor::from_vector(values(5 * 16, 3), {5, 16}));  // before capture: a real copy
  cuda::Graph graph;
  const cuda::LaunchCounts before = cuda::launch_counts();
  graph.capture([&] { y.copy_from(body(x, W, b)); });
  const cuda::LaunchCounts captured = cuda::launch_counts();
  CHECK(graph.captured());
  CHECK(graph.pool_bytes() > 0);  // the temporaries' blocks
  CHECK(captured.kernels == before.kernels);  // recorded, not launched
  CHECK(captured.blas == before.blas);
  for (uint32_t round = 0; round < 3; ++round) {
    CAPTURE(round);
    const Tensor xh = Tensor::from_vector(values(5 * 16, 10 + round), {5, 16});
    x.copy_from(xh);
    const int64_t allocations = clustr::memory_stats(Device::cuda).allocations;
    graph.replay();
    CHECK(clustr::memory_stats(Device::cuda).allocations == allocations);  // nothing new
    const std::vector<float> expected = body(xh.to(Device::cuda), W, b).to_vector();
    CHECK(y.to_vector() == expected);  // the same kernels in the same order: the same bits
  }
  CHECK(cuda::launch_counts().graphs == captured.graphs + 3);
}

TEST_CASE("cuda graphs: a host read, a host copy, a synchronization or a host random draw in the "
          "body is refused, naming it, and the stream works after") {
  if (!cuda::available()) return;
  cuda::Stream side;
  cuda::StreamGuard on_side(side);
  Tensor x = Tensor::zeros({4}, DType::f32, Device::cuda);
  const int64_t live = clustr::memory_stats(Device::cuda).live_bytes;
  auto refused = [&](const char* what, const std::function<void()>& f, const char* names) {
    CAPTURE(what);
    cuda::Graph graph;
    CHECK_THROWS_WITH_AS(graph.capture(f), doctest::Contains(names), clustr::Error);
    CHECK_FALSE(graph.captured());
  };
  refused("to_vector()", [&] { (void)clustr::add(x, 1.0f).to_vector(); },
          "a host read of device memory");
  refused("to the device", [&] { (void)Tensor::zeros({3}).to(Device::cuda); },
          "a copy from host memory");
  refused("synchronize", [&] { cuda::synchronize(); }, "the host waits for the device");
  clustr::Generator gen(1);
  refused("a random draw", [&] { (void)gen.next_u32(); }, "random draw from the host");
  // The stream and the allocator work as before, and the failed captures kept no memory.
  CHECK(clustr::add(x, 2.0f).to_vector() == std::vector<float>(4, 2.0f));
  CHECK(clustr::memory_stats(Device::cuda).live_bytes == live);
  cuda::Graph graph;  // and a capture after them succeeds
  Tensor y = Tensor::empty({4}, DType::f32, Device::cuda);
  graph.capture([&] { y.copy_from(clustr::add(x, 3.0f)); });
  graph.replay();
  CHECK(y.to_vector() == std::vector<float>(4, 3.0f));
}

TEST_CASE("cuda graphs: the legacy default stream cannot capture; a destroyed graph gives its "
          "pool back") {
  if (!cuda::available()) return;
  cuda::Graph on_default;
  CHECK_THROWS_WITH_AS(on_default.capture([] {}), doctest::Contains("legacy default stream"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(on_default.replay(), doctest::Contains("nothing was captured"),
                       clustr::Error);
  cuda::Stream side;
  cuda::StreamGuard on_side(side);
  const Tensor x = Tensor::from_vector(values(64, 5), {64}, Device::cuda);
  const size_t cached = cuda::cached_bytes();
  {
    cuda::Graph graph;
    Tensor y = Tensor::empty({64}, DType::f32, Device::cuda);
    graph.capture([&] { y.copy_from(clustr::exp(clustr::mul(x, 2.0f))); });
    CHECK(graph.pool_bytes() > 0);
    graph.replay();
  }
  CHECK(cuda::cached_bytes() > cached);  // the pool's free blocks are the cache's now
}

TEST_CASE("cuda graphs: dropout reads a stream offset from device memory as it reads a value; a "
          "CPU kernel refuses one") {
  if (!cuda::available()) return;
  const Tensor x = Tensor::from_vector(values(1000, 91), {10, 100});
  const uint64_t offset = 123457;
  const Tensor expected = clustr::dropout_apply(x, 0.3f, 77, clustr::PhiloxOffset(offset));
  // The offset's 8 bytes as two i32 words on the device (what a DrawPlan's slot holds).
  const Tensor slot = Tensor::from_int_vector(
      {static_cast<int32_t>(offset & 0xffffffffu), static_cast<int32_t>(offset >> 32)}, {2},
      Device::cuda);
  const clustr::PhiloxOffset at(reinterpret_cast<const uint64_t*>(slot.i32()), 0);
  const Tensor got = clustr::dropout_apply(x.to(Device::cuda), 0.3f, 77, at);
  CHECK(got.to_vector() == expected.to_vector());
  CHECK(got.to_vector() != clustr::dropout_apply(x, 0.3f, 77, clustr::PhiloxOffset(0)).to_vector());
  CHECK_ERROR(clustr::dropout_apply(x, 0.3f, 77, at), "dropout", "offset in device memory",
              "CPU kernel");
}

TEST_CASE("cuda graphs: graphs captured to share a pool take its free blocks before new ones, "
          "replay in turn as they run, and the pool outlives the graph it was made for") {
  if (!cuda::available()) return;
  const Tensor W = Tensor::from_vector(values(16 * 8, 1), {16, 8}, Device::cuda);
  const Tensor b = Tensor::from_vector(values(8, 2), {8}, Device::cuda);
  // Two shapes of input, a graph each; their outputs outside the pool. The second's
  // temporaries are larger: it needs blocks of other sizes besides the ones it can reuse.
  const int64_t R = 64;
  Tensor x5 = Tensor::empty({5, 16}, DType::f32, Device::cuda);
  Tensor xr = Tensor::empty({R, 16}, DType::f32, Device::cuda);
  Tensor y5 = Tensor::empty({8}, DType::f32, Device::cuda);
  Tensor yr = Tensor::empty({8}, DType::f32, Device::cuda);
  cuda::Stream side;
  cuda::StreamGuard on_side(side);
  cuda::Graph empty;
  auto first = std::make_unique<cuda::Graph>();
  CHECK_THROWS_WITH_AS(first->capture([&] { y5.copy_from(body(x5, W, b)); }, &empty),
                       doctest::Contains("holds no capture"), clustr::Error);
  first->capture([&] { y5.copy_from(body(x5, W, b)); });
  const size_t one = first->pool_bytes();
  cuda::Graph alone;  // the second body in a pool of its own, for its size
  alone.capture([&] { yr.copy_from(body(xr, W, b)); });
  cuda::Graph second;
  second.capture([&] { yr.copy_from(body(xr, W, b)); }, first.get());
  // One pool, grown by what the first body's free blocks could not serve.
  CHECK(second.pool_bytes() == first->pool_bytes());
  CHECK(second.pool_bytes() > one);
  CHECK(second.pool_bytes() < one + alone.pool_bytes());
  for (uint32_t round = 0; round < 2; ++round) {
    CAPTURE(round);
    const Tensor h5 = Tensor::from_vector(values(5 * 16, 20 + round), {5, 16});
    const Tensor hr = Tensor::from_vector(values(R * 16, 30 + round), {R, 16});
    x5.copy_from(h5);
    xr.copy_from(hr);
    first->replay();
    second.replay();
    CHECK(y5.to_vector() == body(h5.to(Device::cuda), W, b).to_vector());
    CHECK(yr.to_vector() == body(hr.to(Device::cuda), W, b).to_vector());
  }
  const size_t shared = second.pool_bytes();
  first.reset();  // the pool stays while the second holds it
  CHECK(second.pool_bytes() == shared);
  const Tensor hr = Tensor::from_vector(values(R * 16, 40), {R, 16});
  xr.copy_from(hr);
  second.replay();
  CHECK(yr.to_vector() == body(hr.to(Device::cuda), W, b).to_vector());
}
