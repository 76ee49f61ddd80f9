// GEMM against the triple-loop reference: awkward sizes, every transpose combination, padded
// leading dimensions, alpha/beta, blocking boundaries, batches, thread-count independence.
#include <cmath>
#include <limits>
#include <string>

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
