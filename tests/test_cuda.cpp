// The CUDA backend against the CPU: copies, fill, the caching allocator, and GEMM compared with
// cpu::gemm_reference over awkward shapes, every transpose pair and padded leading dimensions.
// The ops' kernels are in test_cuda_ops.cpp, the launch abstraction in test_cuda_launch.cpp,
// streams, events and the stream-aware allocator in test_cuda_streams.cpp.
//
// This program has its own main: it runs on a GPU, or on the emulated device of a
// -DCLUSTR_CUDA=EMULATE build; without either (or in a build without the CUDA backend) it
// prints why and exits 77, which ctest reports as skipped (SKIP_RETURN_CODE in
// tests/CMakeLists.txt), so a machine without a GPU never reports these tests as passed. With
// CLUSTR_REQUIRE_GPU=1 in the environment a missing GPU, or the emulated device, fails the run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "core/cpu/gemm.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/tensor.h"

using clustr::Device;
using clustr::DType;
using clustr::Tensor;
namespace cuda = clustr::cuda;

namespace {

std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

Tensor on_gpu(const std::vector<float>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, Device::cuda);
}

constexpr double kAtol = 1e-4, kRtol = 1e-4;  // FP32 on both sides (TF32 is off in cuBLAS)

// One GEMM on both backends. Each stored matrix is rows x ld with ld = row length + pad; the
// padding holds a sentinel that neither backend may change (C is compared in full).
void check_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad, float alpha,
                float beta, uint32_t seed) {
  CAPTURE(ta);
  CAPTURE(tb);
  CAPTURE(M);
  CAPTURE(N);
  CAPTURE(K);
  CAPTURE(pad);
  const int64_t a_rows = ta ? K : M, a_row = ta ? M : K;
  const int64_t b_rows = tb ? N : K, b_row = tb ? K : N;
  const int64_t lda = a_row + pad, ldb = b_row + pad, ldc = N + pad;
  std::vector<float> A = random_values(static_cast<size_t>(a_rows * lda), seed);
  std::vector<float> B = random_values(static_cast<size_t>(b_rows * ldb), seed + 1);
  std::vector<float> C = random_values(static_cast<size_t>(M * ldc), seed + 2);
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = N; c < ldc; ++c) C[static_cast<size_t>(r * ldc + c)] = 1234.5f;

  std::vector<float> expected = C;
  clustr::cpu::gemm_reference(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta,
                              expected.data(), ldc);
  Tensor dA = on_gpu(A), dB = on_gpu(B), dC = on_gpu(C);
  cuda::gemm(ta, tb, M, N, K, alpha, dA.f32(), lda, dB.f32(), ldb, beta, dC.f32(), ldc);
  CHECK_CLOSE(dC.to_vector(), expected, kAtol, kRtol);
}

}  // namespace

TEST_CASE("cuda: host -> device -> host round trip keeps f32 and i32 values") {
  std::vector<float> f = random_values(1000, 1);
  f[7] = std::numeric_limits<float>::infinity();
  Tensor host = Tensor::from_vector(f, {10, 100});
  Tensor dev = host.to(Device::cuda);
  CHECK(dev.device() == Device::cuda);
  CHECK(dev.shape() == host.shape());
  CHECK(dev.to_vector() == f);             // bit-exact: nothing but copies
  CHECK(dev.clone().to_vector() == f);     // device -> device
  CHECK(dev.rows(3, 5).to_vector() == std::vector<float>(f.begin() + 300, f.begin() + 500));

  std::vector<int32_t> i(777);
  for (size_t k = 0; k < i.size(); ++k) i[k] = static_cast<int32_t>(k * 2654435761u);
  Tensor di = Tensor::from_int_vector(i, {777}, Device::cuda);
  CHECK(di.dtype() == DType::i32);
  CHECK(di.to_int_vector() == i);
  CHECK(di.to(Device::cpu).to_int_vector() == i);

  Tensor empty = Tensor::empty({0, 4}, DType::f32, Device::cuda);  // no storage, no copies
  CHECK(empty.to_vector().empty());
}

TEST_CASE("cuda: fill writes every element, past one grid's worth") {
  const int64_t n = 5'000'003;  // more than the fill kernel's 4096 x 256 threads
  Tensor t = Tensor::full({n}, 2.5f, Device::cuda);
  std::vector<float> v = t.to_vector();
  CHECK(std::count(v.begin(), v.end(), 2.5f) == n);

  Tensor i = Tensor::zeros({3, 1001}, DType::i32, Device::cuda);
  CHECK(i.to_int_vector() == std::vector<int32_t>(3003, 0));
  i.rows(1, 2).fill(-7.0f);  // a view: only its row changes
  std::vector<int32_t> expected(3003, 0);
  std::fill(expected.begin() + 1001, expected.begin() + 2002, -7);
  CHECK(i.to_int_vector() == expected);

  cuda::fill_f32(nullptr, 1.0f, 0);  // n == 0 is a no-op, even with no destination
}

TEST_CASE("cuda: allocator counts live bytes and reuses freed blocks") {
  cuda::synchronize();
  cuda::empty_cache();
  CHECK(cuda::cached_bytes() == 0);
  const clustr::MemoryStats s0 = clustr::memory_stats(Device::cuda);
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1000}, DType::f32, Device::cuda);
    first = t.raw();
    const clustr::MemoryStats s1 = clustr::memory_stats(Device::cuda);
    CHECK(s1.live_bytes == s0.live_bytes + 4000);  // the requested size, not the rounded block
    CHECK(s1.allocations == s0.allocations + 1);
    CHECK(s1.peak_bytes >= s1.live_bytes);
    CHECK(cuda::cached_bytes() == 0);
  }
  CHECK(clustr::memory_stats(Device::cuda).live_bytes == s0.live_bytes);
  const size_t cached = cuda::cached_bytes();
  CHECK(cached >= 4000);  // the block was kept, rounded up
  CHECK(cached < 8192);
  {
    Tensor again = Tensor::empty({999}, DType::f32, Device::cuda);  // same size class
    CHECK(again.raw() == first);
    CHECK(cuda::cached_bytes() == 0);
    cuda::reset_peak();
    CHECK(clustr::memory_stats(Device::cuda).peak_bytes ==
          clustr::memory_stats(Device::cuda).live_bytes);
  }
  CHECK(cuda::cached_bytes() == cached);
  cuda::empty_cache();
  CHECK(cuda::cached_bytes() == 0);
  CHECK(clustr::memory_stats(Device::cuda).live_bytes == s0.live_bytes);
}

// In the suite provoked_cuda_errors: the CUDA error it provokes is what it checks, so
// compute-sanitizer (which reports every failed CUDA call) runs without it.
TEST_CASE("cuda: an impossible allocation throws a clear error and leaves the device usable"
          * doctest::test_suite("provoked_cuda_errors")) {
  const size_t huge = size_t(1) << 50;  // 1 PiB
  CHECK_THROWS_WITH_AS(cuda::alloc(huge), doctest::Contains("out of device memory"),
                       clustr::Error);
  Tensor t = Tensor::full({10}, 1.0f, Device::cuda);  // no stale error reaches the next launch
  CHECK(t.to_vector() == std::vector<float>(10, 1.0f));
}

TEST_CASE("cuda: gemm matches cpu::gemm_reference on awkward shapes, transposes and lds") {
  struct Size { int64_t M, N, K; };
  const Size sizes[] = {{1, 1, 1},   {3, 3, 3},    {17, 17, 17}, {129, 129, 129},
                        {17, 129, 3}, {129, 17, 65}, {1, 129, 17}, {3, 1, 129}};
  uint32_t seed = 100;
  for (const Size& s : sizes)
    for (int t = 0; t < 4; ++t)
      for (int64_t pad : {0, 3}) check_gemm(t & 1, t & 2, s.M, s.N, s.K, pad, 0.5f, -1.5f, seed++);
}

TEST_CASE("cuda: gemm follows the BLAS rules for beta == 0, alpha == 0 and empty sizes") {
  check_gemm(false, false, 17, 5, 3, 2, 1.0f, 1.0f, 7);   // plain accumulate
  check_gemm(true, false, 5, 17, 0, 1, 0.5f, -1.5f, 8);   // K == 0: C = beta * C
  check_gemm(false, true, 5, 17, 9, 1, 0.0f, 2.0f, 9);    // alpha == 0: C = beta * C

  // beta == 0 overwrites C without reading it: NaN in C must not survive (K > 0 and K == 0).
  for (int64_t K : {4, 0}) {
    CAPTURE(K);
    std::vector<float> A = random_values(static_cast<size_t>(6 * 4), 11);
    std::vector<float> B = random_values(static_cast<size_t>(4 * 5), 12);
    std::vector<float> expected(30, 0.0f);
    clustr::cpu::gemm_reference(false, false, 6, 5, K, 1.0f, A.data(), 4, B.data(), 5, 0.0f,
                                expected.data(), 5);
    Tensor dA = on_gpu(A), dB = on_gpu(B);
    Tensor dC = on_gpu(std::vector<float>(30, std::numeric_limits<float>::quiet_NaN()));
    cuda::gemm(false, false, 6, 5, K, 1.0f, dA.f32(), 4, dB.f32(), 5, 0.0f, dC.f32(), 5);
    CHECK_CLOSE(dC.to_vector(), expected, kAtol, kRtol);
  }

  // Empty results touch nothing, so no pointers are needed.
  cuda::gemm(false, false, 0, 5, 3, 1.0f, nullptr, 3, nullptr, 5, 0.0f, nullptr, 5);
  cuda::gemm(true, true, 4, 0, 3, 1.0f, nullptr, 4, nullptr, 3, 0.0f, nullptr, 1);
}

TEST_CASE("cuda: gemm_strided_batched matches per-matrix cpu::gemm_reference") {
  const int64_t batch = 3, M = 17, N = 33, K = 9, pad = 2, gap = 5;
  for (int t = 0; t < 4; ++t) {
    for (bool shared_a : {false, true}) {  // stride_a == 0: one A for every product
      const bool ta = t & 1, tb = t & 2;
      CAPTURE(ta);
      CAPTURE(tb);
      CAPTURE(shared_a);
      const int64_t lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
      const int64_t stride_a = shared_a ? 0 : (ta ? K : M) * lda + gap;
      const int64_t stride_b = (tb ? N : K) * ldb + gap, stride_c = M * ldc + gap;
      // Matrix b starts stride_x elements after matrix b-1 and spans rows x ld elements.
      auto span = [&](int64_t stride, int64_t rows, int64_t ld) {
        return static_cast<size_t>(stride * (batch - 1) + rows * ld);
      };
      std::vector<float> A = random_values(span(stride_a, ta ? K : M, lda), 21);
      std::vector<float> B = random_values(span(stride_b, tb ? N : K, ldb), 22);
      std::vector<float> C = random_values(span(stride_c, M, ldc), 23);
      std::vector<float> expected = C;
      for (int64_t b = 0; b < batch; ++b)
        clustr::cpu::gemm_reference(ta, tb, M, N, K, 0.5f, A.data() + b * stride_a, lda,
                                    B.data() + b * stride_b, ldb, -1.5f,
                                    expected.data() + b * stride_c, ldc);
      Tensor dA = on_gpu(A), dB = on_gpu(B), dC = on_gpu(C);
      cuda::gemm_strided_batched(ta, tb, M, N, K, 0.5f, dA.f32(), lda, stride_a, dB.f32(), ldb,
                                 stride_b, -1.5f, dC.f32(), ldc, stride_c, batch);
      CHECK_CLOSE(dC.to_vector(), expected, kAtol, kRtol);
    }
  }
}

// The leading-dimension messages come from check_gemm_args (core/gemm_args.h), shared with the
// CPU GEMM; the others are the CUDA backend's own.
TEST_CASE("cuda: gemm rejects bad leading dimensions and strides with clear errors") {
  Tensor buf = Tensor::zeros({4096}, DType::f32, Device::cuda);
  float* p = buf.f32();
  CHECK_THROWS_WITH_AS(cuda::gemm(false, false, 4, 5, 6, 1.0f, p, 5, p, 5, 0.0f, p, 5),
                       doctest::Contains("lda=5"), clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm(false, true, 4, 5, 6, 1.0f, p, 6, p, 5, 0.0f, p, 5),
                       doctest::Contains("ldb=5"), clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm(false, false, 4, 5, 6, 1.0f, p, 6, p, 5, 0.0f, p, 4),
                       doctest::Contains("ldc=4"), clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm(false, false, int64_t(1) << 31, 1, 1, 1.0f, p, 1, p, 1, 0.0f,
                                  p, 1),
                       doctest::Contains("32-bit"), clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_strided_batched(false, false, 4, 5, 6, 1.0f, p, 6, 24, p, 5,
                                                  30, 0.0f, p, 5, 10, 2),
                       doctest::Contains("overlap"), clustr::Error);
}

int main(int argc, char** argv) {
  // CLUSTR_REQUIRE_GPU=1 (scripts/gpu_check.sh): the run is meant for a real GPU, so a missing
  // or unusable one, or the emulated device, is a failure rather than a skip.
  const char* require = std::getenv("CLUSTR_REQUIRE_GPU");
  const bool require_gpu = require && *require && std::string(require) != "0";
  if (!cuda::available()) {
    if (require_gpu) {
      std::printf("cuda tests FAILED: CLUSTR_REQUIRE_GPU is set but there is no usable GPU: %s\n",
                  cuda::unavailable_reason().c_str());
      return 1;
    }
    std::printf("cuda tests skipped: %s\n", cuda::unavailable_reason().c_str());
    return 77;
  }
  if (require_gpu && cuda::emulated()) {
    std::printf("cuda tests FAILED: CLUSTR_REQUIRE_GPU is set but this build runs the emulated "
                "device (-DCLUSTR_CUDA=EMULATE), not a GPU\n");
    return 1;
  }
  std::printf("cuda tests run on %s\n",
              cuda::emulated() ? "the emulated device (kernels on host fibers, a host cuBLAS)"
                               : "the GPU");
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  return context.run();
}
