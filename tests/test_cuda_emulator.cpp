// What the emulated device checks beyond what a kernel computes (core/cuda/emulation.h): each
// check is shown catching a planted bug that the plain emulator let through. Emulation only:
// on a GPU these bugs are undefined behaviour or silent, so the file is empty there. Part of
// the test_cuda program (tests/test_cuda.cpp has its main).
#include <doctest/doctest.h>

#if defined(CLUSTR_CUDA_EMULATION)

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "core/tensor.h"

using clustr::Device;
using clustr::DType;
using clustr::Tensor;
namespace cuda = clustr::cuda;
namespace emu = clustr::cuda::emulation;
using cuda::Thread;

namespace {

// Runs a test's launches under one schedule, then puts the previous one back.
class ScheduleScope {
 public:
  explicit ScheduleScope(emu::Schedule s) : saved_(emu::current_schedule()) {
    emu::set_schedule(s);
  }
  ~ScheduleScope() { emu::set_schedule(saved_); }
  ScheduleScope(const ScheduleScope&) = delete;
  ScheduleScope& operator=(const ScheduleScope&) = delete;

 private:
  emu::Schedule saved_;
};

const emu::Schedule kForward{emu::Order::forward, 0}, kReverse{emu::Order::reverse, 0};

// Planted bug, no barrier at all: thread i publishes i + 1 in shared memory and reads its lower
// neighbour's slot at once. Run in thread order, each neighbour has already written.
struct NeighbourNoBarrier {
  static constexpr bool kUsesBarrier = false;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    float* s = t.shared<float>();
    const unsigned i = t.thread_idx().x;
    s[i] = static_cast<float>(i + 1);
    out[i] = i == 0 ? s[0] : s[i - 1];
  }
};

// Planted bug, a deleted barrier: two phases through shared memory, the second t.sync() gone.
// The last thread sums what the others wrote in phase 2; in thread order they all have.
struct DeletedBarrier {
  static constexpr bool kUsesBarrier = true;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    float* s = t.shared<float>();
    const unsigned i = t.thread_idx().x, n = t.block_dim().x;
    s[i] = static_cast<float>(i);
    t.sync();
    s[n + i] = 2.0f * s[n - 1 - i];
    // t.sync();  <- deleted
    if (i == n - 1) {
      float sum = 0.0f;
      for (unsigned j = 0; j < n; ++j) sum += s[n + j];
      out[0] = sum;
    }
  }
};

// Planted bugs in shuffles: lane 5 leaves before the warp's shuffle, or the block is not made
// of whole warps (undefined on a GPU: a hang, or values from lanes that do not exist).
struct ShuffleLaneMissing {
  static constexpr bool kUsesBarrier = true;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned i = t.thread_idx().x;
    if (i % 32 == 5) return;
    out[i] = t.shfl_xor(static_cast<float>(i), 1);
  }
};
struct ShufflePartialWarp {
  static constexpr bool kUsesBarrier = true;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    out[t.thread_idx().x] = t.shfl_xor(1.0f, 1);
  }
};

// Planted bug: even threads wait at one barrier, odd threads at another (undefined on a GPU,
// where it may hang or let threads pass each other's barrier).
struct TwoBarriers {
  static constexpr bool kUsesBarrier = true;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned i = t.thread_idx().x;
    if (i % 2 == 0) {
      t.sync();
      out[i] = 1.0f;
    } else {
      t.sync();
      out[i] = 2.0f;
    }
  }
};

// out[i] = a[i] * b[i] + c[i] in one expression: nvcc contracts it into one fused multiply-add.
struct MulAdd {
  static constexpr bool kUsesBarrier = false;
  const float *a, *b, *c;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned i = t.thread_idx().x;
    out[i] = a[i] * b[i] + c[i];
  }
};

// Correct: each thread reads a slot another thread wrote before the barrier.
struct Mirror {
  static constexpr bool kUsesBarrier = true;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    float* sh = t.shared<float>();
    const unsigned i = t.thread_idx().x, m = t.block_dim().x, b = t.block_idx().x;
    sh[i] = static_cast<float>(b * 1000 + i);
    t.sync();
    out[b * m + i] = sh[m - 1 - i];
  }
};

std::vector<float> run_neighbour(unsigned n) {
  Tensor out = Tensor::zeros({n}, DType::f32, Device::cuda);
  cuda::launch("neighbour", {1}, {n}, n * sizeof(float), NeighbourNoBarrier{out.f32()});
  return out.to_vector();
}

float run_deleted_barrier(unsigned n) {
  Tensor out = Tensor::zeros({1}, DType::f32, Device::cuda);
  cuda::launch("deleted barrier", {1}, {n}, 2 * n * sizeof(float), DeletedBarrier{out.f32()});
  return out.item();
}

bool any_nan(const std::vector<float>& v) {
  for (float x : v)
    if (std::isnan(x)) return true;
  return false;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

}  // namespace

TEST_CASE("cuda emulator: a schedule is forward, reverse or random[:SEED]; anything else is a "
          "clear error") {
  CHECK(emu::parse_schedule("forward").order == emu::Order::forward);
  CHECK(emu::parse_schedule("reverse").order == emu::Order::reverse);
  const emu::Schedule r = emu::parse_schedule("random");
  CHECK((r.order == emu::Order::random && r.seed == 1));
  const emu::Schedule r7 = emu::parse_schedule("random:18446744073709551615");
  CHECK((r7.order == emu::Order::random && r7.seed == 18446744073709551615ull));
  for (const char* bad : {"", "Forward", "random:", "random:-1", "random:1x",
                          "random:18446744073709551616", "backwards"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(emu::parse_schedule(bad),
                         doctest::Contains("expected forward, reverse, random or random:SEED"),
                         clustr::Error);
  }
}

TEST_CASE("cuda emulator: a missing barrier that thread order hides is caught under the reverse "
          "and random schedules") {
#if defined(__SANITIZE_THREAD__)
  return;  // ThreadSanitizer reports these planted races in any order (cuda_emulator_race_*)
#endif
  constexpr unsigned n = 32;
  {
    ScheduleScope s(kForward);
    // The planted bugs pass unnoticed in thread order: what the plain emulator did.
    const std::vector<float> v = run_neighbour(n);
    CHECK(!any_nan(v));
    CHECK(v[n - 1] == static_cast<float>(n - 1));
    CHECK(run_deleted_barrier(n) == static_cast<float>(n * (n - 1)));
  }
  {
    ScheduleScope s(kReverse);
    CHECK(!cuda::exact_numerics());  // atomic additions in another order
    const std::vector<float> v = run_neighbour(n);
    CHECK(any_nan(v));  // thread i ran before thread i - 1 wrote its slot
    CHECK(std::isnan(run_deleted_barrier(n)));
  }
  // A random order hides the deleted barrier when the summing thread happens to run last (1 in
  // n per launch; the permutation depends on the launch's number in the process): four launches
  // per seed, one of which must show it.
  for (uint64_t seed : {1u, 2u, 3u}) {
    CAPTURE(seed);
    ScheduleScope s(emu::Schedule{emu::Order::random, seed});
    CHECK(any_nan(run_neighbour(n)));
    bool caught = false;
    for (int launch = 0; launch < 4; ++launch) caught |= std::isnan(run_deleted_barrier(n));
    CHECK(caught);
  }
}

TEST_CASE("cuda emulator: correct kernels compute the same under every schedule") {
  constexpr unsigned n = 45, blocks = 7;
  std::vector<float> want;
  for (emu::Schedule sched : {kForward, kReverse, emu::Schedule{emu::Order::random, 5}}) {
    ScheduleScope s(sched);
    CAPTURE(emu::order_name(sched.order));
    Tensor out = Tensor::zeros({blocks * n}, DType::f32, Device::cuda);
    cuda::launch("mirror", {blocks}, {n}, n * sizeof(float), Mirror{out.f32()});
    const std::vector<float> got = out.to_vector();
    if (want.empty()) {
      for (unsigned b = 0; b < blocks; ++b)
        for (unsigned i = 0; i < n; ++i) want.push_back(static_cast<float>(b * 1000 + n - 1 - i));
    }
    CHECK(got == want);
  }
}

TEST_CASE("cuda emulator: threads of a block waiting at different t.sync() calls are reported") {
  Tensor out = Tensor::zeros({8}, DType::f32, Device::cuda);
  CHECK_THROWS_WITH_AS(cuda::launch("two barriers", {1}, {8}, 0, TwoBarriers{out.f32()}),
                       doctest::Contains("every thread of a block must wait at the same barrier"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::launch("two barriers", {1}, {8}, 0, TwoBarriers{out.f32()}),
                       doctest::Contains("test_cuda_emulator.cpp:"), clustr::Error);
  Tensor m = Tensor::zeros({4}, DType::f32, Device::cuda);  // the device still works
  cuda::launch("mirror", {1}, {4}, 4 * sizeof(float), Mirror{m.f32()});
  CHECK(m.to_vector() == std::vector<float>{3.0f, 2.0f, 1.0f, 0.0f});
}

TEST_CASE("cuda emulator: a shuffle missing a lane, or in a block of part of a warp, is "
          "reported") {
  Tensor out = Tensor::zeros({64}, DType::f32, Device::cuda);
  CHECK_THROWS_WITH_AS(cuda::launch("lane missing", {1}, {64}, 0, ShuffleLaneMissing{out.f32()}),
                       doctest::Contains("lane 5 has returned; every lane of a warp must take "
                                         "part in each shuffle"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::launch("partial warp", {1}, {48}, 0, ShufflePartialWarp{out.f32()}),
                       doctest::Contains("a shuffle needs whole warps of 32 lanes"),
                       clustr::Error);
  cuda::launch("whole warps", {1}, {64}, 0, ShufflePartialWarp{out.f32()});  // still works
  CHECK(out.to_vector()[63] == 1.0f);
}

TEST_CASE("cuda emulator: fresh and reused device memory reads as NaN, not as zeros or the "
          "previous owner's values") {
  constexpr int64_t n = 1000;
  {
    Tensor t = Tensor::empty({n}, DType::f32, Device::cuda);
    for (float v : t.to_vector()) REQUIRE(bits(v) == 0xffffffffu);
  }
  const void* first = nullptr;
  {
    Tensor t = Tensor::full({n}, 3.0f, Device::cuda);
    first = t.raw();
    CHECK(t.to_vector()[n - 1] == 3.0f);
  }
  Tensor again = Tensor::empty({n}, DType::f32, Device::cuda);
  REQUIRE(again.raw() == first);  // the allocator handed the same block out again
  for (float v : again.to_vector()) REQUIRE(bits(v) == 0xffffffffu);
}

TEST_CASE("cuda emulator: a freed block reads as NaN at once, before it is handed out again "
          "(a CUDA graph replay that kept a freed tensor's address sees the poison)") {
  constexpr int64_t n = 1000;
  const void* freed = nullptr;
  {
    Tensor t = Tensor::full({n}, 3.0f, Device::cuda);
    freed = t.raw();
  }
  std::vector<float> host(n, 0.0f);
  REQUIRE(cudaMemcpyAsync(host.data(), freed, n * sizeof(float), cudaMemcpyDeviceToHost) ==
          cudaSuccess);  // the block is the allocator's cache now, still device memory
  for (float v : host) REQUIRE(bits(v) == 0xffffffffu);
}

TEST_CASE("cuda emulator: a product that reads memory nothing wrote fails and names the element") {
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  Tensor a = Tensor::full({3, 4}, 1.0f, Device::cuda);
  Tensor b = Tensor::empty({4, 2}, DType::f32, Device::cuda);  // fresh: poisoned
  Tensor c = Tensor::empty({3, 2}, DType::f32, Device::cuda);
  const float one = 1.0f, zero = 0.0f;
  // Column-major 3 x 2 = (3 x 4)(4 x 2), a and b read as stored, ld = rows.
  auto gemm = [&](float beta) {
    return cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 3, 2, 4, &one, a.f32(), 3, b.f32(), 4, &beta,
                       c.f32(), 3);
  };
  CHECK(gemm(0.0f) == CUBLAS_STATUS_EXECUTION_FAILED);  // planted: all of b unwritten
  b = Tensor::full({4, 2}, 0.5f, Device::cuda);
  CHECK(gemm(0.0f) == CUBLAS_STATUS_SUCCESS);  // c is written, not read, with beta = 0
  CHECK(c.to_vector() == std::vector<float>(6, 2.0f));
  Tensor fresh = Tensor::empty({3, 2}, DType::f32, Device::cuda);
  c = fresh;
  CHECK(gemm(1.0f) == CUBLAS_STATUS_EXECUTION_FAILED);  // beta != 0 reads c
  // One unwritten element is enough, and only the elements the product reads count: a leading
  // dimension's gap may hold anything.
  std::vector<float> host(4 * 2, 0.5f);
  Tensor part = Tensor::empty({8}, DType::f32, Device::cuda);
  REQUIRE(cudaMemcpyAsync(part.f32(), host.data(), 7 * sizeof(float), cudaMemcpyHostToDevice) ==
          cudaSuccess);  // element 7 stays poisoned
  CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 3, 2, 4, &one, a.f32(), 3, part.f32(), 4, &zero,
                    c.f32(), 3) == CUBLAS_STATUS_EXECUTION_FAILED);
  CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 3, 1, 4, &one, a.f32(), 3, part.f32(), 4, &zero,
                    c.f32(), 3) == CUBLAS_STATUS_SUCCESS);  // the first column of b only
  cudaGetLastError();
  cublasDestroy(h);
}

TEST_CASE("cuda emulator: a copy from pinned memory is queued; the host may write the buffer "
          "again once it has waited for an event after the copy, for the stream or the device") {
  constexpr int64_t n = 1000;
  cuda::Stream side;
  cuda::StreamGuard on_side(side);
  cuda::PinnedBuffer staging(n * sizeof(float));
  REQUIRE(staging.bytes() == n * sizeof(float));
  auto* host = static_cast<float*>(staging.data());
  Tensor d = Tensor::empty({n}, DType::f32, Device::cuda);
  cuda::Event copied;
  for (int wait = 0; wait < 3; ++wait) {  // an event, the stream, the device
    CAPTURE(wait);
    for (int64_t i = 0; i < n; ++i) host[i] = float(i + wait);
    cuda::copy_h2d_async(d.f32(), host, n * sizeof(float));
    copied.record();
    if (wait == 0) copied.synchronize();
    if (wait == 1) side.synchronize();
    if (wait == 2) cuda::synchronize();
    host[0] = -1.0f;  // after the wait: the copy has run, the buffer is the host's again
    const std::vector<float> got = d.to_vector();
    CHECK(got[0] == float(wait));
    CHECK(got[n - 1] == float(n - 1 + wait));
  }
  // A copy from host memory cannot be part of a graph.
  cuda::Graph graph;
  CHECK_THROWS_WITH_AS(graph.capture([&] { cuda::copy_h2d_async(d.f32(), host, 4); }),
                       doctest::Contains("a copy from host memory"), clustr::Error);
}

// The planted bug ends the process (a fault, named by the emulator), so ctest runs this case
// alone (cuda_emulator_pinned_write_before_wait in tests/CMakeLists.txt) and checks the message
// and the signal; the program skips it otherwise.
TEST_CASE("cuda emulator: host code writing pinned memory before waiting for its copy is stopped "
          "and named" *
          doctest::skip()) {
  cuda::PinnedBuffer staging(64);
  Tensor d = Tensor::empty({16}, DType::f32, Device::cuda);
  cuda::copy_h2d_async(d.f32(), staging.data(), 64);
  volatile float* host = static_cast<float*>(staging.data());
  host[3] = 1.0f;  // planted bug: on a GPU the copy may not have run yet
  FAIL("the host wrote pinned memory a queued copy reads");
}

// The planted bug ends the process (a fault, named by the emulator), so ctest runs this case
// alone (cuda_emulator_host_read_of_device_memory in tests/CMakeLists.txt) and checks the
// message and the signal; the program skips it otherwise.
TEST_CASE("cuda emulator: host code reading device memory is stopped and named" *
          doctest::skip()) {
  const Tensor t = Tensor::full({16}, 2.0f, Device::cuda);
  const float before = t.to_vector()[3];  // through a copy: fine
  CHECK(before == 2.0f);
  const volatile float* p = t.f32();
  const float x = p[3];  // planted bug: a host read of device memory
  FAIL("the host read device memory and got " << x);
}

// Planted races for a ThreadSanitizer build (-DCLUSTR_TSAN=ON), where ctest runs each alone
// and expects ThreadSanitizer's report (cuda_emulator_race_* in tests/CMakeLists.txt): without
// it they compute plausible numbers in every schedule, so the program skips them otherwise.
struct SharedSlotRace {  // every thread writes one shared slot, unsynchronised
  static constexpr bool kUsesBarrier = true;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    float* s = t.shared<float>();
    s[0] = static_cast<float>(t.thread_idx().x);
    t.sync();
    if (t.thread_idx().x == 0) out[0] = s[0];
  }
};
struct BlocksRace {  // thread 0 of every block adds to one counter without an atomic
  static constexpr bool kUsesBarrier = false;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    if (t.thread_idx().x == 0) out[0] += 1.0f;
  }
};

// Planted bug for AddressSanitizer: each thread reads one past the end of an array on its
// fiber's stack, after a barrier (the index comes from the host, so the compiler cannot see it).
struct StackOverflowAfterBarrier {
  static constexpr bool kUsesBarrier = true;
  float* out;
  int index;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    float local[4];
    for (int i = 0; i < 4; ++i) local[i] = static_cast<float>(t.thread_idx().x + i);
    t.sync();
    float* volatile p = local;  // UBSan cannot see through it: AddressSanitizer's catch
    out[t.thread_idx().x] = p[index];
  }
};

TEST_CASE("cuda emulator: a stack overflow after a barrier (planted)" * doctest::skip()) {
  Tensor out = Tensor::zeros({8}, DType::f32, Device::cuda);
  cuda::launch("in bounds", {1}, {8}, 0, StackOverflowAfterBarrier{out.f32(), 3});
  CHECK(out.to_vector()[7] == 10.0f);
  cuda::launch("one past the end", {1}, {8}, 0, StackOverflowAfterBarrier{out.f32(), 4});
}

TEST_CASE("cuda emulator: a race in shared memory (planted)" * doctest::skip()) {
  Tensor out = Tensor::zeros({1}, DType::f32, Device::cuda);
  cuda::launch("shared slot race", {1}, {8}, sizeof(float), SharedSlotRace{out.f32()});
  CHECK(out.item() >= 0.0f);
}

TEST_CASE("cuda emulator: a deleted barrier (planted)" * doctest::skip()) {
  ScheduleScope s(kForward);  // the order that hides it from the NaN check
  CHECK(run_deleted_barrier(8) == 56.0f);
}

TEST_CASE("cuda emulator: a race between blocks (planted)" * doctest::skip()) {
  Tensor out = Tensor::zeros({1}, DType::f32, Device::cuda);
  cuda::launch("blocks race", {4}, {2}, 0, BlocksRace{out.f32()});
  CHECK(out.item() == 4.0f);  // right in emulation, whatever the order: blocks run one by one
}

TEST_CASE("cuda emulator: device memory is reachable through copies, kernels and cuBLAS only, "
          "and a kernel's work on it is visible afterwards") {
  Tensor t = Tensor::full({1000}, 1.5f, Device::cuda);  // a fill kernel
  const Tensor u = clustr::add(t, t);                   // another kernel
  const Tensor w = clustr::matmul(Tensor::full({1, 1000}, 1.0f, Device::cuda),
                                  Tensor::full({1000, 1}, 0.5f, Device::cuda));  // cuBLAS
  CHECK(u.to_vector()[999] == 3.0f);
  CHECK(w.item() == 500.0f);
  CHECK(emu::device_bytes_in_use() > 0);
}

TEST_CASE("cuda emulator: an overlapping device-to-device copy is refused") {
  Tensor dev = Tensor::zeros({16}, DType::f32, Device::cuda);
  float* p = dev.f32();
  CHECK(cudaMemcpyAsync(p + 4, p, 32, cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(p, p + 7, 32, cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(p, p, 4, cudaMemcpyDeviceToDevice) == cudaErrorInvalidValue);
  cudaGetLastError();
  CHECK(cudaMemcpyAsync(p + 8, p, 32, cudaMemcpyDeviceToDevice) == cudaSuccess);  // adjacent
}

TEST_CASE("cuda emulator: the numerics configuration decides contraction and the GEMM's order") {
  ScheduleScope s(kForward);  // exact_numerics() is false under any other
  // a b + c with a b = 1 + 2^-11 + 2^-24 exactly: rounded first, the 2^-24 is lost (a tie,
  // to even); fused, the sum keeps it.
  const float a = 1.0f + std::ldexp(1.0f, -12), b = a, c = -1.0f;
  const Tensor ta = Tensor::from_vector({a}, {1}).to(Device::cuda);
  const Tensor tb = Tensor::from_vector({b}, {1}).to(Device::cuda);
  const Tensor tc = Tensor::from_vector({c}, {1}).to(Device::cuda);
  Tensor out = Tensor::zeros({1}, DType::f32, Device::cuda);
  cuda::launch("mul add", {1}, {1}, 0, MulAdd{ta.f32(), tb.f32(), tc.f32(), out.f32()});
  const float fused = std::fma(a, b, c);
  volatile float product = a * b;  // rounded to float before the addition
  const float separate = product + c;
  REQUIRE(fused != separate);
  // A sum whose order matters: 2^24 + 1 + 1 + ... in order of k loses every 1; in four partial
  // sums (k mod 4) the three other sums keep theirs.
  std::vector<float> x(16, 1.0f);
  x[0] = 16777216.0f;  // 2^24
  const Tensor row = Tensor::from_vector(x, {1, 16}).to(Device::cuda);
  const Tensor ones = Tensor::full({16, 1}, 1.0f, Device::cuda);
  const float sum = clustr::matmul(row, ones).item();
#if defined(CLUSTR_EMULATION_GPU_NUMERICS)
  CHECK(!cuda::exact_numerics());
  CHECK(out.item() == fused);
  CHECK(sum == 16777216.0f + 12.0f);  // partial sums 2^24 (+3 lost), 4, 4, 4
#else
  CHECK(cuda::exact_numerics());
  CHECK(out.item() == separate);
  CHECK(sum == 16777216.0f);
#endif
}

#endif  // CLUSTR_CUDA_EMULATION
