// Streams and events (core/cuda/cuda.h): the current stream of each host thread and its guard,
// ops on a stream against the cpu, an event ordering a producer on one stream before a
// consumer on another, the allocator's free lists per stream, and the errors. On a GPU the
// streams run concurrently; in emulation every call has finished when it returns, so there
// the ordering tests check the results and the calls (the emulator checks every stream and
// event handle), not the timing. In a GPU build this file is compiled by nvcc (it has
// kernels; LANGUAGE CUDA in tests/CMakeLists.txt). Part of the test_cuda program
// (tests/test_cuda.cpp has its main); empty in a build without the CUDA backend.
#include <doctest/doctest.h>

#if defined(CLUSTR_WITH_CUDA)

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "cuda_check.h"

using clustr::Device;
using clustr::DType;
using clustr::Tensor;
namespace cuda = clustr::cuda;
using cuda::Thread;

namespace {

// The producer's value for element i: `rounds` dependent steps of a 32-bit LCG from i, top 24
// bits (exact in a float). Many rounds make the producer slow on a GPU, so that a consumer that
// did not wait for it would read its output before it is written.
constexpr uint32_t kLcgA = 1664525u, kLcgC = 1013904223u;
CLUSTR_HD float lcg_value(uint32_t i, int rounds) {
  uint32_t x = i;
  for (int k = 0; k < rounds; ++k) x = x * kLcgA + kLcgC;
  return static_cast<float>(x >> 8);
}

// y (n) = lcg_value(i, rounds).
struct ProduceKernel {
  static constexpr bool kUsesBarrier = false;
  float* y;
  int64_t n;
  int rounds;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = cuda::global_x(t); i < n; i += cuda::grid_stride_x(t))
      y[i] = lcg_value(static_cast<uint32_t>(i), rounds);
  }
};

// out (n) = y + 1.
struct ConsumeKernel {
  static constexpr bool kUsesBarrier = false;
  const float* y;
  float* out;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = cuda::global_x(t); i < n; i += cuda::grid_stride_x(t)) out[i] = y[i] + 1.0f;
  }
};

// Every thread adds 1 to one counter.
struct CountKernel {
  static constexpr bool kUsesBarrier = false;
  float* counter;
  CLUSTR_DEVICE void operator()(const Thread&) const { cuda::atomic_add(counter, 1.0f); }
};

std::vector<float> values(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t x = seed;
  for (float& e : v) {
    x = x * 1664525u + 1013904223u;
    e = static_cast<float>(x >> 8) / 8388608.0f - 1.0f;  // in [-1, 1)
  }
  return v;
}

// softmax(relu(X W + b)) for X (R, K), W (K, N), b (N): a cuBLAS GEMM, broadcast and unary
// element-wise kernels and a row softmax, on the device of the inputs, on the current stream.
std::vector<float> small_net(const Tensor& X, const Tensor& W, const Tensor& b) {
  return clustr::softmax(clustr::relu(clustr::add(clustr::matmul(X, W), b))).to_vector();
}

struct NetInputs {
  int64_t R = 17, K = 33, N = 9;
  Tensor X = Tensor::from_vector(values(R * K, 1), {R, K});
  Tensor W = Tensor::from_vector(values(K * N, 2), {K, N});
  Tensor b = Tensor::from_vector(values(N, 3), {N});
};

}  // namespace

TEST_CASE("cuda streams: a guard makes a stream current on its host thread and restores the "
          "previous one") {
  CHECK(cuda::current_stream() == cuda::kDefaultStream);
  cuda::Stream a, b;
  CHECK(a.handle() != cuda::kDefaultStream);
  CHECK(a.handle() != b.handle());
  {
    cuda::StreamGuard on_a(a);
    CHECK(cuda::current_stream() == a.handle());
    {
      cuda::StreamGuard on_b(b);
      CHECK(cuda::current_stream() == b.handle());
      {
        cuda::StreamGuard on_default(cuda::kDefaultStream);
        CHECK(cuda::current_stream() == cuda::kDefaultStream);
      }
      CHECK(cuda::current_stream() == b.handle());
      {
        cuda::StreamGuard on_a_again(a.handle());  // by handle, nested in a guard of another
        CHECK(cuda::current_stream() == a.handle());
      }
      CHECK(cuda::current_stream() == b.handle());
    }
    CHECK(cuda::current_stream() == a.handle());

    // Another host thread has its own current stream: the default one, whatever this thread's.
    cuda::StreamHandle seen = a.handle();
    std::vector<float> computed;
    std::string error;
    std::thread other([&] {
      try {
        seen = cuda::current_stream();
        computed = Tensor::full({5}, 3.0f, Device::cuda).to_vector();
      } catch (const clustr::Error& e) {
        error = e.what();
      }
    });
    other.join();
    CHECK(error == "");
    CHECK(seen == cuda::kDefaultStream);
    CHECK(computed == std::vector<float>(5, 3.0f));
    CHECK(cuda::current_stream() == a.handle());
  }
  CHECK(cuda::current_stream() == cuda::kDefaultStream);
}

TEST_CASE("cuda streams: ops on a stream give the default stream's results (GEMM, "
          "element-wise, softmax)") {
  const NetInputs in;
  const std::vector<float> expected = small_net(in.X, in.W, in.b);
  const std::vector<float> on_default =
      small_net(in.X.to(Device::cuda), in.W.to(Device::cuda), in.b.to(Device::cuda));
  std::vector<float> on_stream;
  cuda::Stream s;
  {
    cuda::StreamGuard guard(s);  // the copies, allocations, kernels and the read-back on s
    on_stream = small_net(in.X.to(Device::cuda), in.W.to(Device::cuda), in.b.to(Device::cuda));
  }
  // FP32 on both sides; the GEMM's sums over K = 33 products round differently from the cpu's.
  clustr::test::check_rows("default stream", on_default, expected, in.N, 1e-5,
                           clustr::test::ZeroRows::scaled);
  clustr::test::check_rows("stream", on_stream, expected, in.N, 1e-5,
                           clustr::test::ZeroRows::scaled);
  // The same kernels in the same order; cuBLAS may pick another algorithm per stream on a GPU.
  if (cuda::exact_numerics()) clustr::test::check_ulps(on_stream, on_default, 0);
}

TEST_CASE("cuda streams: host threads with a stream each run GEMMs at the same time") {
  const NetInputs in;
  const std::vector<float> expected = small_net(in.X, in.W, in.b);
  std::vector<std::vector<float>> results(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t)
    threads.emplace_back([&, t] {
      try {
        cuda::Stream s;
        cuda::StreamGuard guard(s);
        for (int rep = 0; rep < 3; ++rep)
          results[t] = small_net(in.X.to(Device::cuda), in.W.to(Device::cuda),
                                 in.b.to(Device::cuda));
      } catch (const clustr::Error& e) {
        errors[t] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  for (size_t t = 0; t < results.size(); ++t) {
    CAPTURE(t);
    CHECK(errors[t] == "");
    clustr::test::check_rows("thread", results[t], expected, in.N, 1e-5,
                             clustr::test::ZeroRows::scaled);
  }
}

TEST_CASE("cuda streams: an event orders a producer on one stream before a consumer on "
          "another") {
  // On a GPU 1M elements of 20000 dependent steps each: a fraction of a millisecond, long
  // enough for a consumer that did not wait to overtake the producer.
  const int64_t n = cuda::emulated() ? 4099 : int64_t(1) << 20;
  const int rounds = cuda::emulated() ? 7 : 20000;
  // The expected values from the composed map x -> A x + C of all the rounds, computed once.
  uint32_t A = 1, C = 0;
  for (int k = 0; k < rounds; ++k) A *= kLcgA, C = C * kLcgA + kLcgC;
  std::vector<float> expected(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    expected[static_cast<size_t>(i)] =
        static_cast<float>((A * static_cast<uint32_t>(i) + C) >> 8) + 1.0f;

  const cuda::Dim3 grid{cuda::elementwise_blocks(n)}, block{cuda::kElementwiseThreads};
  for (bool explicit_streams : {false, true}) {
    CAPTURE(explicit_streams);
    cuda::Stream producer, consumer;
    cuda::Event produced;
    // y is allocated on the producer's stream and read on the consumer's: it stays alive until
    // the consumer's stream has been synchronized (the allocator's rule, cuda.h).
    Tensor y, out;
    {
      cuda::StreamGuard guard(producer);
      y = Tensor::empty({n}, DType::f32, Device::cuda);
      cuda::launch("produce", grid, block, 0, ProduceKernel{y.f32(), n, rounds});
      if (explicit_streams)
        produced.record(producer);
      else
        produced.record();
    }
    std::vector<float> got;
    {
      cuda::StreamGuard guard(consumer);
      if (explicit_streams)
        produced.wait(consumer);
      else
        produced.wait();
      out = Tensor::empty({n}, DType::f32, Device::cuda);
      cuda::launch("consume", grid, block, 0, ConsumeKernel{y.f32(), out.f32(), n});
      got = out.to_vector();  // on the consumer's stream, which it synchronizes
    }
    clustr::test::check_ulps(got, expected, 0);
    produced.synchronize();
    CHECK(produced.query());
  }

  cuda::Event never_recorded;  // complete, as in CUDA
  CHECK(never_recorded.query());
  never_recorded.synchronize();
}

TEST_CASE("cuda streams: the allocator reuses a block only on the stream it was allocated on") {
  cuda::synchronize();
  cuda::empty_cache();
  REQUIRE(cuda::cached_bytes() == 0);
  const int64_t live_before = clustr::memory_stats(Device::cuda).live_bytes;
  const int64_t n = 3000;  // 12000 bytes: every block below is of one size class
  auto make = [&] { return Tensor::empty({n}, DType::f32, Device::cuda); };

  std::optional<cuda::Stream> a(std::in_place);
  void *freed_on_a = nullptr, *freed_on_default = nullptr;
  Tensor live_on_a;  // still allocated when `a` is destroyed
  {
    cuda::StreamGuard guard(*a);
    Tensor freed = make();
    live_on_a = make();
    freed_on_a = freed.raw();
    freed = Tensor();  // onto a's list
  }
  const size_t block = cuda::cached_bytes();
  CHECK(block >= 12000);
  CHECK(block < 16384);
  {
    Tensor t = make();  // the default stream may not take a's block
    freed_on_default = t.raw();
    CHECK(freed_on_default != freed_on_a);
    CHECK(freed_on_default != live_on_a.raw());
    CHECK(cuda::cached_bytes() == block);
  }
  CHECK(cuda::cached_bytes() == 2 * block);
  {
    cuda::StreamGuard guard(*a);
    Tensor t = make();  // a takes its own block back
    CHECK(t.raw() == freed_on_a);
    CHECK(cuda::cached_bytes() == block);
  }
  CHECK(cuda::cached_bytes() == 2 * block);

  // Destroying a: its cached block goes to the default stream, and so does its live block when
  // it is freed; nothing is given back to the driver, no list of a's remains.
  const cuda::StreamHandle destroyed = a->handle();
  a.reset();
  CHECK(cuda::cached_bytes() == 2 * block);
  CHECK_THROWS_WITH_AS(cuda::StreamGuard{destroyed},
                       doctest::Contains("is not that of a live cuda::Stream"), clustr::Error);
  void* const was_live = live_on_a.raw();
  live_on_a = Tensor();
  CHECK(cuda::cached_bytes() == 3 * block);
  {
    Tensor t1 = make(), t2 = make(), t3 = make();  // the default stream takes all three
    const std::set<void*> got{t1.raw(), t2.raw(), t3.raw()};
    const std::set<void*> want{freed_on_a, freed_on_default, was_live};
    CHECK(got == want);
    CHECK(cuda::cached_bytes() == 0);
  }
  {
    cuda::Stream c;  // a new stream starts with empty lists: a new block
    cuda::StreamGuard guard(c);
    Tensor t = make();
    CHECK(cuda::cached_bytes() == 3 * block);
  }
  CHECK(cuda::cached_bytes() == 4 * block);
  cuda::empty_cache();
  CHECK(cuda::cached_bytes() == 0);
  CHECK(clustr::memory_stats(Device::cuda).live_bytes == live_before);
}

TEST_CASE("cuda streams: a moved-from Stream or Event, or a destroyed current stream, is a "
          "clear error") {
  cuda::Stream a;
  cuda::Stream b(std::move(a));
  CHECK_THROWS_WITH_AS(a.synchronize(), doctest::Contains("moved from"), clustr::Error);
  CHECK_THROWS_WITH_AS(a.handle(), doctest::Contains("moved from"), clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::StreamGuard{a}, doctest::Contains("moved from"), clustr::Error);
  b.synchronize();
  a = std::move(b);  // a holds the stream again, b none
  a.synchronize();
  CHECK_THROWS_WITH_AS(b.synchronize(), doctest::Contains("moved from"), clustr::Error);
  CHECK(cuda::current_stream() == cuda::kDefaultStream);  // no failed guard changed it

  cuda::Event e;
  cuda::Event f(std::move(e));
  CHECK_THROWS_WITH_AS(e.record(), doctest::Contains("cuda::Event::record: this cuda::Event "
                                                     "was moved from"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(e.wait(a), doctest::Contains("moved from"), clustr::Error);
  CHECK_THROWS_WITH_AS(e.query(), doctest::Contains("moved from"), clustr::Error);
  f.record(a);
  f.wait();
  f.synchronize();
  CHECK_THROWS_WITH_AS(f.record(b), doctest::Contains("moved from"), clustr::Error);

  // A guard that outlives its Stream: work then fails with a clear error, and the guard still
  // restores the previous stream.
  Tensor src = Tensor::full({4}, 2.0f, Device::cuda), dst = Tensor::zeros({4}, DType::f32,
                                                                          Device::cuda);
  {
    std::optional<cuda::Stream> c(std::in_place);
    cuda::StreamGuard guard(*c);
    c.reset();
    CHECK_THROWS_WITH_AS(Tensor::empty({4}, DType::f32, Device::cuda),
                         doctest::Contains("the current stream"), clustr::Error);
    CHECK_THROWS_WITH_AS(Tensor::empty({4}, DType::f32, Device::cuda),
                         doctest::Contains("was destroyed"), clustr::Error);
    if (cuda::emulated()) {  // on a GPU, using a destroyed stream is undefined
      CHECK_THROWS_WITH_AS(cuda::launch("count", {1}, {4}, 0, CountKernel{dst.f32()}),
                           doctest::Contains("cudaErrorInvalidResourceHandle"), clustr::Error);
      CHECK_THROWS_WITH_AS(cuda::copy_d2d(dst.raw(), src.raw(), 16),
                           doctest::Contains("cudaErrorInvalidResourceHandle"), clustr::Error);
    }
  }
  CHECK(cuda::current_stream() == cuda::kDefaultStream);
  dst.copy_from(src);  // the device still works, and no stale error reaches this launch check
  cuda::launch("count", {1}, {4}, 0, CountKernel{dst.f32()});
  CHECK(dst.to_vector() == std::vector<float>{6.0f, 2.0f, 2.0f, 2.0f});
}

// The runtime API called directly, as runtime.cu calls it: the emulator refuses what a GPU's
// runtime would (cudaErrorInvalidResourceHandle for a destroyed or never-created handle).
TEST_CASE("cuda streams: the emulator checks stream and event handles") {
  if (!cuda::emulated()) return;  // a driver may reuse a destroyed handle's value
  cudaStream_t s = nullptr;
  cudaEvent_t e = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming) == cudaSuccess);
  CHECK(s != nullptr);
  CHECK(cudaEventRecord(e, s) == cudaSuccess);
  CHECK(cudaStreamWaitEvent(nullptr, e, 0) == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaSuccess);
  CHECK(cudaEventSynchronize(e) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(nullptr) == cudaSuccess);  // the legacy default stream
  CHECK(cudaGetLastError() == cudaSuccess);

  cudaStream_t bad_flags = nullptr;
  CHECK(cudaStreamCreateWithFlags(&bad_flags, 0x8) == cudaErrorInvalidValue);
  CHECK(cudaStreamWaitEvent(s, e, 0x8) == cudaErrorInvalidValue);
  CHECK(cudaEventRecord(reinterpret_cast<cudaEvent_t>(s), s) ==
        cudaErrorInvalidResourceHandle);  // a stream is no event
  CHECK(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(uintptr_t(0x40))) ==
        cudaErrorInvalidResourceHandle);  // never created
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);  // kept for the launch check

  Tensor dev = Tensor::zeros({4}, DType::f32, Device::cuda);
  std::vector<float> host(4, 1.0f);
  CHECK(cudaMemcpyAsync(host.data(), dev.f32(), 16, cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(host == std::vector<float>(4, 0.0f));
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublasSetStream(h, s) == CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f;
  CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 1, &one, dev.f32(), 2, dev.f32(), 1, &one,
                    dev.f32(), 2) == CUBLAS_STATUS_SUCCESS);

  REQUIRE(cudaStreamDestroy(s) == cudaSuccess);
  CHECK(cudaStreamSynchronize(s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamDestroy(s) == cudaErrorInvalidResourceHandle);  // twice
  CHECK(cudaEventRecord(e, s) == cudaErrorInvalidResourceHandle);
  CHECK(cudaStreamWaitEvent(s, e, 0) == cudaErrorInvalidResourceHandle);
  CHECK(cudaMemcpyAsync(host.data(), dev.f32(), 16, cudaMemcpyDeviceToHost, s) ==
        cudaErrorInvalidResourceHandle);
  CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 1, &one, dev.f32(), 2, dev.f32(), 1, &one,
                    dev.f32(), 2) == CUBLAS_STATUS_EXECUTION_FAILED);
  CHECK(cudaStreamDestroy(nullptr) == cudaErrorInvalidResourceHandle);
  REQUIRE(cudaEventDestroy(e) == cudaSuccess);
  CHECK(cudaEventQuery(e) == cudaErrorInvalidResourceHandle);
  CHECK(cudaEventDestroy(e) == cudaErrorInvalidResourceHandle);
  CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);  // the last failure, then cleared
  CHECK(cudaGetLastError() == cudaSuccess);
  cublasDestroy(h);

  // A new stream never gets a destroyed one's handle back.
  cudaStream_t again = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&again, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(again != s);
  CHECK(cudaStreamDestroy(again) == cudaSuccess);
}

#endif  // CLUSTR_WITH_CUDA
