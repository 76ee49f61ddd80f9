// The launch abstraction (core/cuda/kernel.h) and the cuBLAS column-major semantics, checked
// with small kernels written here. In a GPU build this file is compiled by nvcc (LANGUAGE CUDA
// in tests/CMakeLists.txt), so the same tests run on the GPU and on the emulated device; the
// ones that check what only the emulator can (a divergent barrier, pointer checks) return early
// on a GPU. Part of the test_cuda program (tests/test_cuda.cpp has its main); empty in a build
// without the CUDA backend.
#include <doctest/doctest.h>

// Without the CUDA backend there is no kernel.h to compile against (the program skips anyway).
#if defined(CLUSTR_WITH_CUDA)

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "core/tensor.h"

using clustr::Device;
using clustr::DType;
using clustr::Tensor;
namespace cuda = clustr::cuda;
using cuda::Dim3;
using cuda::Thread;

// Every thread writes its index to shared memory, the block waits, then each reads its mirror
// image: without a real barrier a thread would read a slot not yet written (in emulation, the
// NaN bytes fresh shared memory holds).
struct ReverseKernel {
  static constexpr bool kUsesBarrier = true;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    float* s = t.shared<float>();
    const unsigned i = t.thread_idx().x, n = t.block_dim().x;
    s[i] = static_cast<float>(t.block_idx().x * 10000 + i);
    t.sync();
    out[t.block_idx().x * n + i] = s[n - 1 - i];
  }
};

struct AddFloat {
  CLUSTR_DEVICE float operator()(float a, float b) const { return a + b; }
};

// out[block] = sum over the block's threads of (block + 1) * thread, through block_reduce.
struct BlockSumKernel {
  static constexpr bool kUsesBarrier = true;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const float v = static_cast<float>((t.block_idx().x + 1) * t.thread_idx().x);
    const float r = cuda::block_reduce(t, v, t.shared<float>(), AddFloat{});
    if (t.thread_idx().x == 0) out[t.block_idx().x] = r;
  }
};

// Each block writes a part (its index + 1) and arrives; the last block to arrive adds every
// part in order into *total and counts itself in *lasts.
struct LastArrivalKernel {
  static constexpr bool kUsesBarrier = true;
  float* parts;
  float* total;
  int32_t* lasts;
  unsigned* counter;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned b = t.block_idx().x, blocks = t.grid_dim().x;
    if (t.thread_idx().x == 0) parts[b] = static_cast<float>(b + 1);
    if (!cuda::last_to_arrive(t, counter, blocks, t.shared<int>())) return;
    if (t.thread_idx().x != 0) return;
    float s = 0.0f;
    for (unsigned k = 0; k < blocks; ++k) s += parts[k];
    *total = s;
    cuda::atomic_add(lasts, 1);
  }
};

// Every thread of every block adds 1 to one counter; exact for counts below 2^24.
struct CountKernel {
  static constexpr bool kUsesBarrier = false;
  float* counter;
  CLUSTR_DEVICE void operator()(const Thread&) const { cuda::atomic_add(counter, 1.0f); }
};

// A 2-D grid of 3-D blocks writes each thread's coordinates to its own slot.
struct CoordKernel {
  static constexpr bool kUsesBarrier = false;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const Dim3 b = t.block_idx(), g = t.grid_dim(), th = t.thread_idx(), d = t.block_dim();
    const unsigned block = b.x + g.x * (b.y + g.y * b.z);
    const unsigned thread = th.x + d.x * (th.y + d.y * th.z);
    out[block * d.x * d.y * d.z + thread] =
        static_cast<float>(b.x * 1000000 + b.y * 10000 + th.x * 100 + th.y * 10 + th.z);
  }
};

// out[i] = the value of lane (lane ^ mask) for each mask in turn (out has blocks x threads x 5
// entries), and sums[i] = the warp's sum through warp_reduce (exact: small integers).
struct ShuffleKernel {
  static constexpr bool kUsesBarrier = true;
  float *out, *sums;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned n = t.block_dim().x, i = t.thread_idx().x, g = t.block_idx().x * n + i;
    const float v = static_cast<float>(g * 3 + 1);
    const unsigned masks[5] = {1, 2, 7, 16, 31};
    for (unsigned k = 0; k < 5; ++k) out[g * 5 + k] = t.shfl_xor(v, masks[k]);
    sums[g] = cuda::warp_reduce(t, v, AddFloat{});
  }
};

// Thread 0 returns early while the others wait at a barrier: undefined on a GPU, reported by
// the emulator.
struct DivergentKernel {
  static constexpr bool kUsesBarrier = true;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    if (t.thread_idx().x == 0) return;
    t.sync();
    out[t.thread_idx().x] = 1.0f;
  }
};

// Calls t.sync() although it declares no barrier.
struct UndeclaredBarrierKernel {
  static constexpr bool kUsesBarrier = false;
  CLUSTR_DEVICE void operator()(const Thread& t) const { t.sync(); }
};

TEST_CASE("cuda launch: t.sync() is a real barrier for awkward block sizes") {
  for (unsigned threads : {1u, 3u, 17u, 129u, 256u}) {
    CAPTURE(threads);
    const unsigned blocks = 3;
    Tensor out = Tensor::zeros({blocks * threads}, DType::f32, Device::cuda);
    cuda::launch("reverse", {blocks}, {threads}, threads * sizeof(float),
                 ReverseKernel{out.f32()});
    std::vector<float> expected;
    for (unsigned b = 0; b < blocks; ++b)
      for (unsigned i = 0; i < threads; ++i)
        expected.push_back(static_cast<float>(b * 10000 + (threads - 1 - i)));
    CHECK(out.to_vector() == expected);
  }
}

TEST_CASE("cuda launch: block_reduce sums over any block size") {
  for (unsigned threads : {1u, 2u, 3u, 17u, 32u, 129u, 1024u}) {
    CAPTURE(threads);
    const unsigned blocks = 5;
    Tensor out = Tensor::zeros({blocks}, DType::f32, Device::cuda);
    cuda::launch("block sum", {blocks}, {threads}, threads * sizeof(float),
                 BlockSumKernel{out.f32()});
    std::vector<float> expected;
    for (unsigned b = 0; b < blocks; ++b)
      expected.push_back(static_cast<float>((b + 1) * threads * (threads - 1) / 2));
    CHECK(out.to_vector() == expected);
  }
}

TEST_CASE("cuda launch: last_to_arrive picks one block, which sees every part, and leaves the "
          "counter at zero for the next launch, a graph's replays included") {
  Tensor parts = Tensor::zeros({300}, DType::f32, Device::cuda);
  Tensor total = Tensor::zeros({1}, DType::f32, Device::cuda);
  Tensor lasts = Tensor::zeros({1}, DType::i32, Device::cuda);
  auto run = [&](unsigned blocks, unsigned threads) {
    cuda::launch("last arrival", {blocks}, {threads}, sizeof(int),
                 LastArrivalKernel{parts.f32(), total.f32(), lasts.i32(),
                                   cuda::arrival_counters(1, "last arrival")});
  };
  int32_t launches = 0;
  for (unsigned blocks : {1u, 2u, 7u, 300u})
    for (unsigned threads : {1u, 33u, 64u})
      for (int again = 0; again < 2; ++again) {
        CAPTURE(blocks);
        CAPTURE(threads);
        run(blocks, threads);
        ++launches;
        CHECK(total.item() == static_cast<float>(blocks * (blocks + 1) / 2));
        CHECK(lasts.to_int_vector() == std::vector<int32_t>{launches});
      }
  // In a graph: its pool's own counters, back at zero after each replay.
  cuda::Stream side;
  cuda::StreamGuard on_side(side);
  cuda::Graph graph;
  graph.capture([&] { run(129, 32); });
  for (int replay = 0; replay < 3; ++replay) {
    total.fill(0.0f);
    graph.replay();
    ++launches;
    CHECK(total.item() == static_cast<float>(129 * 130 / 2));
    CHECK(lasts.to_int_vector() == std::vector<int32_t>{launches});
  }
  run(5, 32);  // the stream's own counters
  CHECK(total.item() == 15.0f);
  CHECK_THROWS_WITH_AS(cuda::arrival_counters(cuda::kArrivalCounters + 1, "many"),
                       doctest::Contains("many: needs 257 arrival counters"), clustr::Error);
}

TEST_CASE("cuda launch: warp shuffles exchange lane values and warp_reduce sums a warp") {
  for (unsigned threads : {32u, 64u, 256u}) {
    CAPTURE(threads);
    const unsigned blocks = 3, total = blocks * threads;
    Tensor out = Tensor::zeros({total * 5}, DType::f32, Device::cuda);
    Tensor sums = Tensor::zeros({total}, DType::f32, Device::cuda);
    cuda::launch("shuffle", {blocks}, {threads}, 0, ShuffleKernel{out.f32(), sums.f32()});
    const std::vector<float> o = out.to_vector(), sm = sums.to_vector();
    const unsigned masks[] = {1, 2, 7, 16, 31};
    for (unsigned g = 0; g < total; ++g) {
      const unsigned lane_base = g / 32 * 32;
      for (unsigned k = 0; k < 5; ++k) {
        const unsigned partner = lane_base + ((g % 32) ^ masks[k]);
        if (o[g * 5 + k] != static_cast<float>(partner * 3 + 1)) {
          FAIL_CHECK("thread " << g << ", mask " << masks[k] << ": got " << o[g * 5 + k]
                               << ", lane value " << partner * 3 + 1);
          break;
        }
      }
      float want = 0.0f;
      for (unsigned j = lane_base; j < lane_base + 32; ++j) want += static_cast<float>(j * 3 + 1);
      if (sm[g] != want) FAIL_CHECK("thread " << g << ": warp sum " << sm[g] << ", want " << want);
    }
  }
}

TEST_CASE("cuda launch: atomic_add counts every thread, 2-D grids and 3-D blocks index right") {
  Tensor counter = Tensor::zeros({1}, DType::f32, Device::cuda);
  cuda::launch("count", {129}, {17}, 0, CountKernel{counter.f32()});
  CHECK(counter.item() == 129.0f * 17.0f);

  const Dim3 grid{3, 2, 1}, block{4, 3, 2};
  Tensor out = Tensor::zeros({6 * 24}, DType::f32, Device::cuda);
  cuda::launch("coords", grid, block, 0, CoordKernel{out.f32()});
  std::vector<float> expected(6 * 24);
  for (unsigned by = 0; by < 2; ++by)
    for (unsigned bx = 0; bx < 3; ++bx)
      for (unsigned tz = 0; tz < 2; ++tz)
        for (unsigned ty = 0; ty < 3; ++ty)
          for (unsigned tx = 0; tx < 4; ++tx)
            expected[(bx + 3 * by) * 24 + tx + 4 * (ty + 3 * tz)] =
                static_cast<float>(bx * 1000000 + by * 10000 + tx * 100 + ty * 10 + tz);
  CHECK(out.to_vector() == expected);

  // An empty grid launches nothing.
  cuda::launch("count", {0}, {17}, 0, CountKernel{counter.f32()});
  CHECK(counter.item() == 129.0f * 17.0f);
}

TEST_CASE("cuda launch: launch_counts counts kernel launches and cuBLAS calls") {
  Tensor counter = Tensor::zeros({1}, DType::f32, Device::cuda);
  Tensor a = Tensor::zeros({4, 4}, DType::f32, Device::cuda), c = a.clone();  // (fills: kernels)
  const cuda::LaunchCounts before = cuda::launch_counts();
  cuda::launch("count", {3}, {5}, 0, CountKernel{counter.f32()});
  cuda::launch("count", {0}, {5}, 0, CountKernel{counter.f32()});  // empty: not launched
  cuda::launch("count", {1}, {1}, 0, CountKernel{counter.f32()});
  const cuda::LaunchCounts mid = cuda::launch_counts();
  CHECK(mid.kernels - before.kernels == 2);
  CHECK(mid.blas == before.blas);
  cuda::gemm(false, false, 4, 4, 4, 1.0f, a.f32(), 4, a.f32(), 4, 0.0f, c.f32(), 4);
  cuda::gemm_strided_batched(false, false, 2, 2, 2, 1.0f, a.f32(), 2, 4, a.f32(), 2, 4, 0.0f,
                             c.f32(), 2, 4, 3);
  const cuda::LaunchCounts after = cuda::launch_counts();
  CHECK(after.blas - mid.blas == 2);  // one cuBLAS call each, however many matrices
  CHECK(after.kernels == mid.kernels);
}

// In the suite provoked_cuda_errors: the CUDA error it provokes is what it checks, so
// compute-sanitizer (which reports every failed CUDA call) runs without it.
TEST_CASE("cuda launch: a configuration the GPU rejects is a clear error"
          * doctest::test_suite("provoked_cuda_errors")) {
  Tensor counter = Tensor::zeros({1}, DType::f32, Device::cuda);
  CHECK_THROWS_WITH_AS(cuda::launch("too wide", {1}, {2048}, 0, CountKernel{counter.f32()}),
                       doctest::Contains("too wide failed"), clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::launch("too much shared", {1}, {32}, size_t(1) << 20,
                                    CountKernel{counter.f32()}),
                       doctest::Contains("too much shared failed"), clustr::Error);
  cuda::launch("count", {1}, {32}, 0, CountKernel{counter.f32()});  // no stale error remains
  CHECK(counter.item() == 32.0f);
}

TEST_CASE("cuda launch: the emulator reports a divergent barrier and an undeclared one") {
  if (!cuda::emulated()) return;  // undefined behaviour on a GPU, not testable there
  Tensor out = Tensor::zeros({17}, DType::f32, Device::cuda);
  CHECK_THROWS_WITH_AS(cuda::launch("divergent", {2}, {17}, 0, DivergentKernel{out.f32()}),
                       doctest::Contains("some threads wait at t.sync() while others have "
                                         "returned"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::launch("undeclared", {1}, {4}, 0, UndeclaredBarrierKernel{}),
                       doctest::Contains("declares kUsesBarrier = false"), clustr::Error);
  Tensor counter = Tensor::zeros({1}, DType::f32, Device::cuda);  // the device still works
  cuda::launch("count", {2}, {3}, 0, CountKernel{counter.f32()});
  CHECK(counter.item() == 6.0f);
}

// cuBLAS called directly, with column-major data, against the textbook column-major loop: on a
// GPU this is the real cuBLAS, in emulation its host stand-in, so the two are held to the same
// contract (op N/T, m/n/k, padded leading dimensions, alpha/beta, strided batches).
TEST_CASE("cuda launch: cublasSgemm(StridedBatched) follows the column-major contract") {
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  const int m = 5, n = 3, k = 4, pad = 2, batch = 2;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    CAPTURE(ta);
    CAPTURE(tb);
    const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    const int lda = a_rows + pad, ldb = b_rows + pad, ldc = m + pad;
    const int sa = lda * a_cols, sb = ldb * b_cols, sc = ldc * n;
    std::vector<float> A(size_t(sa) * batch), B(size_t(sb) * batch), C(size_t(sc) * batch);
    for (size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(int(i * 7 % 11) - 5);
    for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(int(i * 5 % 13) - 6);
    for (size_t i = 0; i < C.size(); ++i) C[i] = static_cast<float>(int(i % 9) - 4);
    const float alpha = 0.5f, beta = -2.0f;
    std::vector<float> expected = C;
    for (int b = 0; b < batch; ++b)
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
          float acc = 0.0f;  // small integers and halves: exact in any order
          for (int l = 0; l < k; ++l) {
            const float a = ta ? A[b * sa + l + i * lda] : A[b * sa + i + l * lda];
            const float bv = tb ? B[b * sb + j + l * ldb] : B[b * sb + l + j * ldb];
            acc += a * bv;
          }
          float& c = expected[b * sc + i + j * ldc];
          c = alpha * acc + beta * c;
        }
    Tensor dA = Tensor::from_vector(A, {int64_t(A.size())}).to(Device::cuda);
    Tensor dB = Tensor::from_vector(B, {int64_t(B.size())}).to(Device::cuda);
    Tensor dC = Tensor::from_vector(C, {int64_t(C.size())}).to(Device::cuda);
    Tensor dC1 = dC.clone();
    const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    REQUIRE(cublasSgemmStridedBatched(h, oa, ob, m, n, k, &alpha, dA.f32(), lda, sa, dB.f32(),
                                      ldb, sb, &beta, dC.f32(), ldc, sc, batch) ==
            CUBLAS_STATUS_SUCCESS);
    CHECK(dC.to_vector() == expected);
    REQUIRE(cublasSgemm(h, oa, ob, m, n, k, &alpha, dA.f32(), lda, dB.f32(), ldb, &beta,
                        dC1.f32(), ldc) == CUBLAS_STATUS_SUCCESS);
    std::vector<float> first = dC1.to_vector(), want = C;
    std::copy(expected.begin(), expected.begin() + sc, want.begin());
    CHECK(first == want);  // the second matrix of C untouched
    // A leading dimension below the stored matrix's rows is refused.
    CHECK(cublasSgemm(h, oa, ob, m, n, k, &alpha, dA.f32(), a_rows - 1, dB.f32(), ldb, &beta,
                      dC1.f32(), ldc) == CUBLAS_STATUS_INVALID_VALUE);
  }
  cuda::synchronize();
  cublasDestroy(h);
}

namespace {

// A device copy of a host vector, freed at the end of the scope (raw memory: bf16 operands are
// moved as their bit patterns).
template <class T>
struct RawDevice {
  size_t bytes;
  T* p;
  explicit RawDevice(const std::vector<T>& host)
      : bytes(host.size() * sizeof(T)), p(static_cast<T*>(cuda::alloc(bytes))) {
    cuda::copy_h2d(p, host.data(), bytes);
  }
  ~RawDevice() { cuda::free(p, bytes); }
  std::vector<T> to_host() const {
    std::vector<T> h(bytes / sizeof(T));
    cuda::copy_d2h(h.data(), p, bytes);
    return h;
  }
};

}  // namespace

// cublasGemmEx with bf16 operands and float32 C, as cuda::gemm_bf16 calls it, against the
// textbook column-major loop (small integers, exact in bf16 and in any order of addition).
TEST_CASE("cuda launch: cublasGemmEx(StridedBatchedEx) with bf16 operands follows the "
          "column-major contract") {
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  const int m = 5, n = 3, k = 4, pad = 2, batch = 2;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    CAPTURE(ta);
    CAPTURE(tb);
    const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    const int lda = a_rows + pad, ldb = b_rows + pad, ldc = m + pad;
    const int sa = lda * a_cols, sb = ldb * b_cols, sc = ldc * n;
    std::vector<float> A(size_t(sa) * batch), B(size_t(sb) * batch), C(size_t(sc) * batch);
    for (size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(int(i * 7 % 11) - 5);
    for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(int(i * 5 % 13) - 6);
    for (size_t i = 0; i < C.size(); ++i) C[i] = static_cast<float>(int(i % 9) - 4);
    std::vector<uint16_t> A16(A.size()), B16(B.size());
    for (size_t i = 0; i < A.size(); ++i) A16[i] = clustr::float_to_bf16(A[i]);
    for (size_t i = 0; i < B.size(); ++i) B16[i] = clustr::float_to_bf16(B[i]);
    const float alpha = 0.5f, beta = -2.0f;
    std::vector<float> expected = C;
    for (int b = 0; b < batch; ++b)
      for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
          float acc = 0.0f;
          for (int l = 0; l < k; ++l) {
            const float a = ta ? A[b * sa + l + i * lda] : A[b * sa + i + l * lda];
            const float bv = tb ? B[b * sb + j + l * ldb] : B[b * sb + l + j * ldb];
            acc += a * bv;
          }
          float& c = expected[b * sc + i + j * ldc];
          c = alpha * acc + beta * c;
        }
    RawDevice<uint16_t> dA(A16), dB(B16);
    RawDevice<float> dC(C), dC1(C);
    const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    REQUIRE(cublasGemmStridedBatchedEx(h, oa, ob, m, n, k, &alpha, dA.p, CUDA_R_16BF, lda, sa,
                                       dB.p, CUDA_R_16BF, ldb, sb, &beta, dC.p, CUDA_R_32F, ldc,
                                       sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
            CUBLAS_STATUS_SUCCESS);
    CHECK(dC.to_host() == expected);
    REQUIRE(cublasGemmEx(h, oa, ob, m, n, k, &alpha, dA.p, CUDA_R_16BF, lda, dB.p, CUDA_R_16BF,
                         ldb, &beta, dC1.p, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    std::vector<float> want = C;
    std::copy(expected.begin(), expected.begin() + sc, want.begin());
    CHECK(dC1.to_host() == want);  // the second matrix of C untouched
    CHECK(cublasGemmEx(h, oa, ob, m, n, k, &alpha, dA.p, CUDA_R_16BF, a_rows - 1, dB.p,
                       CUDA_R_16BF, ldb, &beta, dC1.p, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                       CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  }
  cuda::synchronize();
  cublasDestroy(h);
}

// What the emulator does beyond the shared contract: it multiplies only the type combinations
// clustr uses, and it rounds float32 operands to TF32 (to nearest, ties away from zero) when
// the handle's math mode is CUBLAS_TF32_TENSOR_OP_MATH.
TEST_CASE("cuda launch: the emulated cublasGemmEx refuses other types; TF32 math mode rounds "
          "float32 operands") {
  if (!cuda::emulated()) return;  // a GPU's cuBLAS supports more, and rounds as its kernels do
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  RawDevice<float> a(std::vector<float>(16, 1.0f)), c(std::vector<float>(16, 0.0f));
  const float one = 1.0f, zero = 0.0f;
  auto ex = [&](cudaDataType at, cudaDataType bt, cudaDataType ct, cublasComputeType_t compute,
                cublasGemmAlgo_t algo) {
    return cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a.p, at, 2, a.p, bt, 2,
                        &zero, c.p, ct, 2, compute, algo);
  };
  CHECK(ex(CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(ex(CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP) ==
        CUBLAS_STATUS_SUCCESS);
  CHECK(ex(CUDA_R_16F, CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(ex(CUDA_R_16BF, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(ex(CUDA_R_16BF, CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(ex(CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC,
           CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(ex(CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32,
           CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(ex(CUDA_R_64F, CUDA_R_64F, CUDA_R_64F, CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(ex(CUDA_R_16BF, CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F,
           static_cast<cublasGemmAlgo_t>(5)) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasGemmEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a.p, CUDA_R_16BF, 2, a.p,
                     CUDA_R_16BF, 2, &zero, c.p, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_INITIALIZED);

  // 1 x 1 x 1 products 1 * b for a b halfway between two TF32 values (1 + 2^-11): rounded away
  // from zero to 1 + 2^-10 in TF32 math, kept in the default math. bf16 operands are exact.
  const float tie = 1.0f + 1.0f / 2048, up = 1.0f + 1.0f / 1024;
  RawDevice<float> b(std::vector<float>{tie, -tie});
  auto sgemm = [&](const float* B) {
    REQUIRE(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a.p, 1, B, 1, &zero, c.p, 1) ==
            CUBLAS_STATUS_SUCCESS);
    return c.to_host()[0];
  };
  auto sgemm_batched = [&] {  // both entries of b, one per batch entry
    REQUIRE(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a.p, 1, 0, b.p,
                                      1, 1, &zero, c.p, 1, 1, 2) == CUBLAS_STATUS_SUCCESS);
    const std::vector<float> r = c.to_host();
    return std::vector<float>(r.begin(), r.begin() + 2);
  };
  auto gemm_ex = [&] {
    REQUIRE(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a.p, CUDA_R_32F, 1, b.p,
                         CUDA_R_32F, 1, &zero, c.p, CUDA_R_32F, 1, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    return c.to_host()[0];
  };
  CHECK(sgemm(b.p) == tie);
  CHECK(gemm_ex() == tie);
  REQUIRE(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS);
  CHECK(sgemm(b.p) == up);
  CHECK(sgemm(b.p + 1) == -up);
  CHECK(sgemm_batched() == std::vector<float>{up, -up});
  CHECK(gemm_ex() == up);
  REQUIRE(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH) == CUBLAS_STATUS_SUCCESS);
  CHECK(sgemm_batched() == std::vector<float>{tie, -tie});
  cublasDestroy(h);
}

TEST_CASE("cuda launch: the emulator checks which side of a copy is device memory") {
  if (!cuda::emulated()) return;  // a GPU's unified addressing would accept some of these
  std::vector<float> host(16, 1.0f);
  Tensor dev = Tensor::zeros({16}, DType::f32, Device::cuda);
  CHECK(cudaMemcpyAsync(host.data(), host.data() + 8, 32, cudaMemcpyHostToDevice) ==
        cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(dev.f32(), dev.f32() + 8, 32, cudaMemcpyDeviceToHost) ==
        cudaErrorInvalidValue);
  CHECK(cudaMemcpyAsync(dev.f32(), host.data(), size_t(1) << 30, cudaMemcpyHostToDevice) ==
        cudaErrorInvalidValue);  // past the end of the device block (nothing is copied)
  cudaGetLastError();
  // cuBLAS refuses matrices outside device memory rather than reading the host heap.
  cublasHandle_t h = nullptr;
  REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
  const float one = 1.0f;
  CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, host.data(), 4, dev.f32(), 4,
                    &one, dev.f32(), 4) == CUBLAS_STATUS_EXECUTION_FAILED);
  cublasDestroy(h);
}

#endif  // CLUSTR_WITH_CUDA
