// GEMM against the triple-loop reference: awkward sizes, every transpose combination, padded
// leading dimensions, alpha/beta, blocking boundaries, batches, thread-count independence.
#include <cmath>
#include <limits>
#include <string>
#include <tuple>

#include "check.h"
#include "core/cpu/gemm.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"

using namespace clustr;
using namespace clustr::test;

namespace {

std::vector<float> random_vector(int64_t n, uint64_t seed) {
  Tensor t = Tensor::empty({n});
  Generator gen(seed);
  uniform_(t, gen, -1.0f, 1.0f);
  return t.to_vector();
}

struct GemmCase {
  bool ta, tb;
  int64_t M, N, K, pad;
  float alpha, beta;
};

// Runs one case through cpu::gemm and gemm_reference on the same inputs; returns both C's.
std::pair<std::vector<float>, std::vector<float>> run_case(const GemmCase& c) {
  int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  std::vector<float> A = random_vector(std::max<int64_t>(1, a_rows * lda), 1);
  std::vector<float> B = random_vector(std::max<int64_t>(1, b_rows * ldb), 2);
  std::vector<float> C = random_vector(std::max<int64_t>(1, c.M * ldc), 3);
  std::vector<float> R = C;
  cpu::gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(),
            ldc);
  cpu::gemm_reference(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta,
                      R.data(), ldc);
  return {C, R};
}

std::string name(const GemmCase& c) {
  return detail::cat(c.ta ? "T" : "N", c.tb ? "T" : "N", " M=", c.M, " N=", c.N, " K=", c.K,
                     " pad=", c.pad, " alpha=", c.alpha, " beta=", c.beta);
}

// Float accumulation over K terms of size <= 1: the error grows at most like K * 2^-24 per
// unit of |a||b|; the bound below holds with margin for |A|, |B|, |C| <= 1.
double atol_for(int64_t K) { return 4e-7 * static_cast<double>(K + 4); }

}  // namespace

TEST_CASE("gemm matches the reference on awkward sizes, all transposes, padded ld") {
  const int64_t sizes[] = {1, 3, 17, 129};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t M : sizes)
        for (int64_t N : sizes)
          for (int64_t K : sizes) {
            GemmCase c{ta, tb, M, N, K, (M + N + K) % 3 == 0 ? 5 : 0, 1.0f, 0.0f};
            auto [got, ref] = run_case(c);
            INFO(name(c));
            CHECK_CLOSE(got, ref, atol_for(K), 1e-6);
          }
}

TEST_CASE("gemm rows that end in a narrow edge panel (M % 12 = 4 or 8, as attention's 64)") {
  // The edge panel runs a 4- or 8-row kernel on A in place when that covers it exactly.
  for (int64_t M : {4, 8, 16, 20, 64})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        GemmCase c{ta, tb, M, 70, 33, 0, 1.0f, 0.5f};
        auto [got, ref] = run_case(c);
        INFO(name(c));
        CHECK_CLOSE(got, ref, 2 * atol_for(33), 1e-6);
      }
}

TEST_CASE("gemm alpha and beta") {
  for (auto [alpha, beta] : {std::pair{0.5f, -1.5f}, std::pair{-2.0f, 1.0f}, std::pair{1.0f, 0.25f},
                             std::pair{0.0f, 0.5f}, std::pair{0.0f, 0.0f}}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        GemmCase c{ta, tb, 37, 45, 29, 3, alpha, beta};
        auto [got, ref] = run_case(c);
        INFO(name(c));
        CHECK_CLOSE(got, ref, 3 * atol_for(29), 1e-6);
      }
  }
}

TEST_CASE("gemm crosses every blocking boundary (K > 256, N > 512, M edges)") {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      GemmCase c{ta, tb, 301, 1100, 700, 1, 1.0f, 0.5f};
      auto [got, ref] = run_case(c);
      INFO(name(c));
      CHECK_CLOSE(got, ref, 2 * atol_for(700), 1e-6);
    }
}

TEST_CASE("gemm with beta == 0 never reads C (NaN in C does not leak)") {
  const int64_t M = 20, N = 40, K = 9;
  std::vector<float> A = random_vector(M * K, 4), B = random_vector(K * N, 5);
  std::vector<float> C(M * N, std::numeric_limits<float>::quiet_NaN()), R(M * N);
  cpu::gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  cpu::gemm_reference(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, R.data(), N);
  CHECK_CLOSE(C, R, atol_for(K), 1e-6);
}

TEST_CASE("gemm with K == 0 scales C by beta") {
  std::vector<float> C = {1, 2, 3, 4, 5, 6}, A(1), B(1);
  cpu::gemm(false, false, 2, 3, 0, 1.0f, A.data(), 1, B.data(), 3, 2.0f, C.data(), 3);
  CHECK(C == std::vector<float>{2, 4, 6, 8, 10, 12});
}

TEST_CASE("gemm results are identical at 1 and 2 threads") {
  const int64_t M = 333, N = 530, K = 300;
  std::vector<float> A = random_vector(M * K, 6), B = random_vector(N * K, 7);
  auto run = [&](int threads) {
    ThreadCount tc(threads);
    std::vector<float> C(M * N);
    cpu::gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
    return C;
  };
  CHECK(run(1) == run(2));
}

// The epilogue of gemm_fused, applied to a reference product R (M x N, row stride N).
void reference_epilogue(std::vector<float>& R, int64_t M, int64_t N, const cpu::GemmEpilogue& e) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float v = R[i * N + j];
      if (e.bias) v += e.bias[j];
      if (e.relu) v = v < 0.0f ? 0.0f : v;
      if (e.mask && !(e.mask[i * e.ldm + j] > 0.0f)) v = 0.0f;
      R[i * N + j] = v;
    }
}

TEST_CASE("gemm_fused: bias, ReLU and mask on every layout, across blocks and edges") {
  // K = 300 crosses a depth block (bias with the first, ReLU and mask with the last); M and N
  // leave partial tiles at both edges.
  const int64_t M = 37, N = 45, K = 300;
  const std::vector<float> bias = random_vector(N, 11), mask = random_vector(M * N, 12);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int variant = 0; variant < 4; ++variant) {
        cpu::GemmEpilogue e{};
        if (variant == 0 || variant == 3) e.bias = bias.data();
        if (variant == 1 || variant == 3) e.relu = true;
        if (variant >= 2) e.mask = mask.data(), e.ldm = N;
        const float beta = variant == 2 ? 0.5f : 0.0f;
        std::vector<float> A = random_vector(M * K, 13), B = random_vector(K * N, 14);
        std::vector<float> C = random_vector(M * N, 15), R = C;
        cpu::gemm_fused(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, beta,
                        C.data(), N, e);
        cpu::gemm_reference(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N,
                            beta, R.data(), N);
        reference_epilogue(R, M, N, e);
        INFO("ta=", ta, " tb=", tb, " variant ", variant);
        CHECK_CLOSE(C, R, 2 * atol_for(K), 1e-6);
      }
}

TEST_CASE("gemm_fused: ReLU keeps NaN as math::relu; the mask drops NaN entries") {
  // A 1 x 1 product per element: C = a * 1.
  const std::vector<float> a = {-2.0f, 0.5f, 3.0f, std::nanf("")};
  std::vector<float> one(1, 1.0f), C(4);
  cpu::GemmEpilogue relu{};
  relu.relu = true;
  cpu::gemm_fused(false, false, 4, 1, 1, 1.0f, a.data(), 1, one.data(), 1, 0.0f, C.data(), 1, relu);
  CHECK(C[0] == 0.0f);
  CHECK(C[1] == 0.5f);
  CHECK(C[2] == 3.0f);
  CHECK(std::isnan(C[3]));
  const std::vector<float> mask = {1.0f, 0.0f, -1.0f, std::nanf("")};
  cpu::GemmEpilogue masked{};
  masked.mask = mask.data();
  masked.ldm = 1;
  const std::vector<float> b = {5.0f, 6.0f, 7.0f, 8.0f};
  cpu::gemm_fused(false, false, 4, 1, 1, 1.0f, b.data(), 1, one.data(), 1, 0.0f, C.data(), 1,
                  masked);
  CHECK(C == std::vector<float>{5.0f, 0.0f, 0.0f, 0.0f});
}

TEST_CASE("gemm_fused: the row sums of op(A), with K == 0 and alpha == 0 too") {
  for (bool ta : {false, true})
    for (auto [M, K, alpha] : {std::tuple<int64_t, int64_t, float>{41, 600, 1.0f},
                               {13, 0, 1.0f}, {13, 7, 0.0f}}) {
      const int64_t N = 70;
      std::vector<float> A = random_vector(std::max<int64_t>(1, M * K), 16);
      std::vector<float> B = random_vector(std::max<int64_t>(1, K * N), 17), C(M * N);
      std::vector<float> sums(M, -1.0f);
      cpu::GemmEpilogue e{};
      e.a_row_sums = sums.data();
      cpu::gemm_fused(ta, false, M, N, K, alpha, A.data(), ta ? M : std::max<int64_t>(1, K),
                      B.data(), N, 0.0f, C.data(), N, e);
      std::vector<float> want(M);
      for (int64_t i = 0; i < M; ++i) {
        double s = 0;
        for (int64_t p = 0; p < K; ++p) s += ta ? A[p * M + i] : A[i * K + p];
        want[i] = static_cast<float>(s);
      }
      INFO("ta=", ta, " M=", M, " K=", K, " alpha=", alpha);
      CHECK_CLOSE(sums, want, 1e-5, 1e-6);
    }
}

TEST_CASE("gemm_fused results, row sums included, are identical at 1 and 2 threads") {
  // Tall (the threads split M) and wide (they split N, and one of them sums the rows).
  for (auto [M, N] : {std::pair<int64_t, int64_t>{333, 70}, {40, 530}}) {
    const int64_t K = 300;
    std::vector<float> A = random_vector(K * M, 18), B = random_vector(K * N, 19);
    const std::vector<float> bias = random_vector(N, 20);
    auto run = [&](int threads) {
      ThreadCount tc(threads);
      std::vector<float> C(M * N), sums(M);
      cpu::GemmEpilogue e{};
      e.bias = bias.data();
      e.relu = true;
      e.a_row_sums = sums.data();
      cpu::gemm_fused(true, false, M, N, K, 1.0f, A.data(), M, B.data(), N, 0.0f, C.data(), N,
                      e);
      C.insert(C.end(), sums.begin(), sums.end());
      return C;
    };
    INFO("M=", M, " N=", N);
    CHECK(run(1) == run(2));
  }
}

TEST_CASE("gemm_many gives each product exactly what gemm_fused gives, at 1 and 2 threads") {
  // A pair of equal size (a layer's dX and dW), a third product, and one with K = 0.
  const int64_t R = 150, in = 40, out = 35;
  const std::vector<float> dy = random_vector(R * out, 21), W = random_vector(out * in, 22);
  const std::vector<float> x = random_vector(R * in, 23), C0 = random_vector(17 * 9, 24);
  auto calls_for = [&](std::vector<float>& dx, std::vector<float>& dW, std::vector<float>& db,
                       std::vector<float>& c2, std::vector<float>& c3) {
    cpu::GemmEpilogue sums{};
    sums.a_row_sums = db.data();
    return std::vector<cpu::GemmCall>{
        {false, false, R, in, out, 1.0f, dy.data(), out, W.data(), in, 0.0f, dx.data(), in, {}},
        {true, false, out, in, R, 1.0f, dy.data(), out, x.data(), in, 0.0f, dW.data(), in, sums},
        {false, true, 17, 9, 40, 0.5f, x.data(), in, W.data(), in, 2.0f, c2.data(), 9, {}},
        {false, false, 17, 9, 0, 1.0f, x.data(), 1, W.data(), 9, 3.0f, c3.data(), 9, {}}};
  };
  auto run = [&](int threads, bool together) {
    ThreadCount tc(threads);
    std::vector<float> dx(R * in), dW(out * in), db(out), c2 = C0, c3 = C0;
    const std::vector<cpu::GemmCall> calls = calls_for(dx, dW, db, c2, c3);
    if (together) {
      cpu::gemm_many(calls.data(), static_cast<int>(calls.size()));
    } else {
      for (const cpu::GemmCall& g : calls)
        cpu::gemm_fused(g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, g.A, g.lda, g.B, g.ldb,
                        g.beta, g.C, g.ldc, g.epilogue);
    }
    for (const std::vector<float>* v : {&dW, &db, &c2, &c3})
      dx.insert(dx.end(), v->begin(), v->end());
    return dx;
  };
  const std::vector<float> want = run(1, false);
  CHECK(run(1, true) == want);
  CHECK(run(2, true) == want);
  CHECK(run(2, false) == want);
}

TEST_CASE("strided batched gemm equals one gemm per matrix") {
  // Small matrices (one per thread) and large ones (threads inside each product).
  for (auto [M, N, K, batch] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{17, 33, 9, 7},
                                {130, 150, 140, 3}}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
        int64_t sa = (ta ? K : M) * lda + 5, sb = (tb ? N : K) * ldb + 7, sc = M * ldc + 1;
        std::vector<float> A = random_vector(batch * sa, 8), B = random_vector(batch * sb, 9);
        std::vector<float> C = random_vector(batch * sc, 10), R = C;
        cpu::gemm_strided_batched(ta, tb, M, N, K, 0.5f, A.data(), lda, sa, B.data(), ldb, sb,
                                  -1.0f, C.data(), ldc, sc, batch);
        for (int64_t b = 0; b < batch; ++b)
          cpu::gemm_reference(ta, tb, M, N, K, 0.5f, A.data() + b * sa, lda, B.data() + b * sb,
                              ldb, -1.0f, R.data() + b * sc, ldc);
        INFO("batch ", batch, " M=", M, " N=", N, " K=", K, " ta=", ta, " tb=", tb);
        CHECK_CLOSE(C, R, 2 * atol_for(K), 1e-6);
      }
  }
}

TEST_CASE("matmul and gemm on tensors") {
  Tensor A = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor B = Tensor::from_vector({1, 0, 0, 1, 1, 1}, {3, 2});
  CHECK(matmul(A, B).to_vector() == std::vector<float>{4, 5, 10, 11});
  CHECK(matmul(A, A, false, true).to_vector() == std::vector<float>{14, 32, 32, 77});
  CHECK(matmul(A, A, true, false).shape() == Shape{3, 3});
  Tensor batch = Tensor::from_vector({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  CHECK(matmul(batch, batch).to_vector() == std::vector<float>{7, 10, 15, 22, 67, 78, 91, 106});
  Tensor C = Tensor::full({2, 2}, 1.0f);
  gemm(false, false, 2.0f, A, B, -1.0f, C);
  CHECK(C.to_vector() == std::vector<float>{7, 9, 19, 21});
}

TEST_CASE("gemm errors name the op and the shapes") {
  Tensor A = Tensor::zeros({2, 3}), B = Tensor::zeros({4, 5});
  CHECK_THROWS_WITH_AS(matmul(A, B), doctest::Contains("(2, 3)"), Error);
  CHECK_THROWS_WITH_AS(matmul(A, B), doctest::Contains("(4, 5)"), Error);
  CHECK_THROWS_WITH_AS(matmul(A, B), doctest::Contains("gemm: inner sizes differ"), Error);
  Tensor C = Tensor::zeros({3, 3});
  CHECK_THROWS_WITH_AS(gemm(false, false, 1.0f, A, Tensor::zeros({3, 2}), 0.0f, C),
                       doctest::Contains("C is (3, 3)"), Error);
  CHECK_THROWS_WITH_AS(matmul(A, Tensor::zeros({1, 3, 2})), doctest::Contains("matmul"), Error);
  CHECK_THROWS_WITH_AS(matmul(A, Tensor::zeros({3, 2}, DType::i32)), doctest::Contains("f32"), Error);
  std::vector<float> x(4);
  CHECK_THROWS_WITH_AS(cpu::gemm(false, false, 2, 2, 2, 1.0f, x.data(), 1, x.data(), 2, 0.0f,
                                 x.data(), 2),
                       doctest::Contains("lda=1"), Error);
  CHECK_THROWS_WITH_AS(cpu::gemm(false, false, -1, 2, 2, 1.0f, x.data(), 2, x.data(), 2, 0.0f,
                                 x.data(), 2),
                       doctest::Contains("M=-1"), Error);
}

TEST_CASE("the gemm kernel in use is named") {
  std::string k = cpu::gemm_kernel_name();
  CHECK((k == "avx512" || k == "avx2" || k == "generic"));
  MESSAGE("gemm kernel: " << k);
}
