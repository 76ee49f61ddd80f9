// The bf16 GEMM (core/cpu/gemm_bf16.h), every kernel this machine can run (AMX, AVX512-BF16,
// generic), against the reference that rounds the operands to bf16 and accumulates in double:
// awkward sizes, every transpose pair, bf16, float32 and mixed operands, padded leading
// dimensions, alpha/beta, blocking boundaries, the epilogue, batches, gemm_bf16_many, rounding
// of float32 operands (nearest even, ties, NaN, inf, subnormals), thread-count independence,
// and a C (and the epilogue's mask) stored in bf16.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

#include "check.h"
#include "core/bf16.h"
#include "core/cpu/gemm_bf16.h"
#include "core/error.h"

using namespace clustr;
using namespace clustr::test;

namespace {

// Runs the body of a test once for each kernel this machine supports, then restores the
// automatic choice.
struct KernelScope {
  explicit KernelScope(const char* name) { cpu::set_gemm_bf16_kernel(name); }
  ~KernelScope() { cpu::set_gemm_bf16_kernel(nullptr); }
};

template <class F>
void for_each_kernel(F f) {
  for (const char* k : cpu::gemm_bf16_kernels()) {
    KernelScope scope(k);
    INFO("kernel ", std::string(k));
    f(k);
  }
}

// An operand's storage: float values, and their bf16 patterns when the operand is bf16.
struct Matrix {
  std::vector<float> f;
  std::vector<uint16_t> h;
  cpu::Operand type;
  const void* data() const {
    return type == cpu::Operand::f32 ? static_cast<const void*>(f.data())
                                     : static_cast<const void*>(h.data());
  }
};

Matrix make_matrix(int64_t n, uint32_t seed, cpu::Operand type) {
  Matrix m{random_values(std::max<int64_t>(1, n), seed, -1.0f, 1.0f), {}, type};
  if (type == cpu::Operand::bf16)
    for (float v : m.f) m.h.push_back(float_to_bf16(v));
  return m;
}

const char* type_name(cpu::Operand t) { return t == cpu::Operand::f32 ? "f32" : "bf16"; }

struct Case {
  bool ta, tb;
  int64_t M, N, K, pad;
  float alpha, beta;
  cpu::Operand a_type = cpu::Operand::bf16, b_type = cpu::Operand::bf16;
};

std::string name(const Case& c) {
  return detail::cat(c.ta ? "T" : "N", c.tb ? "T" : "N", " M=", c.M, " N=", c.N, " K=", c.K,
                     " pad=", c.pad, " alpha=", c.alpha, " beta=", c.beta, " A ",
                     type_name(c.a_type), " B ", type_name(c.b_type));
}

// Float accumulation of K products of size <= 1 (the reference is exact on the same bf16
// values): the error is float32 rounding of the partial sums only, well inside this bound for
// |A|, |B|, |C| <= 1. A kernel that read an operand unrounded, or rounded it another way, is off
// by about 2^-9 per product and fails it.
double atol_for(int64_t K) { return 4e-7 * static_cast<double>(K + 4); }

// Runs one case through gemm_bf16_call and gemm_bf16_reference; returns both C's.
std::pair<std::vector<float>, std::vector<float>> run_case(const Case& c,
                                                           const cpu::GemmEpilogue& e = {}) {
  const int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  const int64_t lda = a_cols + c.pad, ldb = b_cols + c.pad, ldc = c.N + c.pad;
  const Matrix A = make_matrix(a_rows * lda, 1, c.a_type), B = make_matrix(b_rows * ldb, 2, c.b_type);
  std::vector<float> C = random_values(std::max<int64_t>(1, c.M * ldc), 3, -1.0f, 1.0f), R = C;
  cpu::GemmBf16Call call{c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), c.a_type, lda,
                         B.data(), c.b_type, ldb, c.beta, C.data(), ldc, e, nullptr, nullptr};
  cpu::gemm_bf16_call(call);
  call.C = R.data();
  call.epilogue.a_row_sums = nullptr;  // the kernel's row sums stay for the caller to check
  cpu::gemm_bf16_reference(call);
  return {C, R};
}

}  // namespace

TEST_CASE("gemm_bf16: the kernels this machine runs") {
  const std::vector<const char*> kernels = cpu::gemm_bf16_kernels();
  REQUIRE(!kernels.empty());
  CHECK(std::string(kernels.back()) == "generic");
  std::string list;
  for (const char* k : kernels) list += std::string(list.empty() ? "" : ", ") + k;
  MESSAGE("bf16 GEMM kernels on this machine: " << list << "; in use: "
                                                << std::string(cpu::gemm_bf16_kernel_name()));
  // The automatic choice is the best one, unless CLUSTR_GEMM_KERNEL names another.
  const char* forced = std::getenv("CLUSTR_GEMM_KERNEL");
  if (!forced || !*forced) CHECK(std::string(cpu::gemm_bf16_kernel_name()) == kernels.front());
}

TEST_CASE("gemm_bf16: CLUSTR_GEMM_KERNEL picks the bf16 kernel it names") {
  // ctest runs this suite again with CLUSTR_GEMM_KERNEL=avx2,generic (tests/CMakeLists.txt).
  const char* forced = std::getenv("CLUSTR_GEMM_KERNEL");
  if (!forced || std::strstr(forced, "generic") == nullptr) return;
  CHECK(std::string(cpu::gemm_bf16_kernel_name()) == "generic");
}

TEST_CASE("gemm_bf16 matches the reference on awkward sizes, all transposes, all operand types") {
  const int64_t sizes[] = {1, 3, 17, 129};
  const std::pair<cpu::Operand, cpu::Operand> types[] = {
      {cpu::Operand::bf16, cpu::Operand::bf16},
      {cpu::Operand::f32, cpu::Operand::f32},
      {cpu::Operand::f32, cpu::Operand::bf16}};
  for_each_kernel([&](const char*) {
    for (auto [at, bt] : types)
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (int64_t M : sizes)
            for (int64_t N : sizes)
              for (int64_t K : sizes) {
                Case c{ta, tb, M, N, K, (M + N + K) % 3 == 0 ? 5 : 0, 1.0f, 0.0f, at, bt};
                auto [got, ref] = run_case(c);
                INFO(name(c));
                CHECK_CLOSE(got, ref, atol_for(K), 1e-6);
              }
  });
}

TEST_CASE("gemm_bf16 reads bf16 rows of A in place when K is whole tiles, packing the rest") {
  // K a multiple of 32 (one depth block, and two of 544 at K = 1088), M with a partial last
  // kernel block (packed) or none, padded lda, both layouts of B. M = 58 and 250 end their last
  // 64-row chunk with a block of one whole rowgroup and one partial one. N = 530 at K = 1088
  // takes two B blocks (of at most 480 columns at a depth of 544), which the in-place rows and
  // the packed partial block meet in turn.
  for_each_kernel([&](const char*) {
    for (int64_t K : {32, 64, 256, 1088})
      for (int64_t M : {16, 45, 58, 70, 129, 250})
        for (int64_t N : {int64_t{37}, int64_t{530}})
          for (bool tb : {false, true}) {
            if (N > 37 && (K < 1088 || M < 58)) continue;  // only where N takes two blocks
            Case c{false, tb, M, N, K, 3, 1.0f, 0.5f, cpu::Operand::bf16,
                   tb ? cpu::Operand::bf16 : cpu::Operand::f32};
            auto [got, ref] = run_case(c);
            INFO(name(c));
            CHECK_CLOSE(got, ref, 2 * atol_for(K), 1e-6);
          }
  });
}

TEST_CASE("gemm_bf16 alpha and beta, and a beta of 0 never reads C") {
  for_each_kernel([&](const char*) {
    for (auto [alpha, beta] : {std::pair{0.5f, -1.5f}, std::pair{-2.0f, 1.0f},
                               std::pair{1.0f, 1.0f}, std::pair{1.0f, 0.25f},
                               std::pair{0.0f, 0.5f}, std::pair{0.0f, 0.0f}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          Case c{ta, tb, 37, 45, 29, 3, alpha, beta, cpu::Operand::f32, cpu::Operand::bf16};
          auto [got, ref] = run_case(c);
          INFO(name(c));
          CHECK_CLOSE(got, ref, 3 * atol_for(29), 1e-6);
        }
    const int64_t M = 20, N = 40, K = 9;
    const Matrix A = make_matrix(M * K, 4, cpu::Operand::bf16);
    const Matrix B = make_matrix(K * N, 5, cpu::Operand::bf16);
    std::vector<float> C(M * N, std::numeric_limits<float>::quiet_NaN()), R(M * N);
    cpu::gemm_bf16(false, false, M, N, K, 1.0f, A.h.data(), K, B.h.data(), N, 0.0f, C.data(), N);
    cpu::gemm_bf16_reference({false, false, M, N, K, 1.0f, A.h.data(), cpu::Operand::bf16, K,
                              B.h.data(), cpu::Operand::bf16, N, 0.0f, R.data(), N, {},
                              nullptr, nullptr});
    CHECK_CLOSE(C, R, atol_for(K), 1e-6);
    std::vector<float> S = {1, 2, 3, 4, 5, 6};
    cpu::gemm_bf16(false, false, 2, 3, 0, 1.0f, A.h.data(), 1, B.h.data(), 3, 2.0f, S.data(), 3);
    CHECK(S == std::vector<float>{2, 4, 6, 8, 10, 12});
  });
}

TEST_CASE("gemm_bf16 crosses every blocking boundary (K > 256, N past a B block, M edges)") {
  // K = 700: with A transposed three depth blocks of 256, 256, 188 (a last tile of 28 values),
  // else one of 704; N = 1100 columns of a deep B block exceed 512 KiB, so the columns come in
  // two or four blocks; M = 101 ends in a block of 5 rows. On one thread the rectangle's 101
  // rows are two chunks of op(A), packed as the first B block meets them and kept for the
  // others. The reference (the slow part) runs once per layout.
  const int64_t M = 101, N = 1100, K = 700;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 1, ldc = N + 1;
      const Matrix A = make_matrix((ta ? K : M) * lda, 51, cpu::Operand::f32);
      const Matrix B = make_matrix((tb ? N : K) * ldb, 52, cpu::Operand::f32);
      const std::vector<float> C0 = random_values(M * ldc, 53, -1.0f, 1.0f);
      std::vector<float> R = C0;
      cpu::GemmBf16Call call{ta, tb, M, N, K, 1.0f, A.data(), A.type, lda, B.data(), B.type,
                             ldb, 0.5f, R.data(), ldc, {}, nullptr, nullptr};
      cpu::gemm_bf16_reference(call);
      for_each_kernel([&](const char*) {
        for (int threads : {1, 2}) {
          ThreadCount t(threads);
          std::vector<float> C = C0;
          call.C = C.data();
          cpu::gemm_bf16_call(call);
          INFO("ta=", ta, " tb=", tb, " threads=", threads);
          CHECK_CLOSE(C, R, 2 * atol_for(K), 1e-6);
        }
      });
    }
}

TEST_CASE("gemm_bf16 epilogue: bias, ReLU, mask and row sums, on every layout") {
  // K = 300 spans two depth blocks (bias with the first, ReLU and mask with the last); M and N
  // leave partial tiles at both edges, and the full 32 x 32 blocks take the kernels' fast
  // stores where they apply (bias alone), the slow ones elsewhere.
  const int64_t M = 77, N = 45, K = 300;
  const std::vector<float> bias = random_values(N, 11), mask = random_values(M * N, 12);
  for_each_kernel([&](const char*) {
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int variant = 0; variant < 6; ++variant) {
          cpu::GemmEpilogue e{};
          if (variant == 0 || variant == 3) e.bias = bias.data();
          if (variant == 1 || variant == 3) e.relu = true;
          if (variant >= 2 && variant <= 3) e.mask = mask.data(), e.ldm = N;
          std::vector<float> sums(M, -7.0f), want_sums(M, -9.0f);
          if (variant >= 4) e.a_row_sums = sums.data();
          // Variant 5: a bf16 A (its row sums add the stored bf16 values, 8 rows at a time in
          // the AVX-512 kernels' vector path, M = 77 leaving 5 rows to the scalar loop).
          const cpu::Operand a_type = variant == 5 ? cpu::Operand::bf16 : cpu::Operand::f32;
          Case c{ta, tb, M, N, K, 0, 1.0f, variant == 2 ? 0.5f : 0.0f, a_type,
                 cpu::Operand::f32};
          auto [got, ref] = run_case(c, e);
          INFO(name(c), " variant ", variant);
          CHECK_CLOSE(got, ref, 2 * atol_for(K), 1e-6);
          if (variant >= 4) {
            // The row sums of op(A) add up its values as stored, in double, in order of k.
            const Matrix A = make_matrix(M * K, 1, a_type);
            for (int64_t i = 0; i < M; ++i) {
              double s = 0;
              for (int64_t p = 0; p < K; ++p) {
                const int64_t idx = ta ? p * M + i : i * K + p;
                s += a_type == cpu::Operand::f32 ? A.f[idx] : bf16_to_float(A.h[idx]);
              }
              want_sums[i] = static_cast<float>(s);
            }
            if (variant == 5)
              CHECK(sums == want_sums);  // the same additions in the same order
            else
              CHECK_CLOSE(sums, want_sums, 1e-5, 1e-6);
          }
        }
  });
}

TEST_CASE("gemm_bf16 rounds float32 operands to nearest even as it reads them") {
  // C = A (M x 1) times 1: each result is its A value as the kernel read it. The values sit on
  // ties (kept bit even and odd), just off them, at a carry into the exponent and at the top of
  // the range, and are NaN and infinities.
  const float values[] = {1.00390625f,             // 1 + 2^-8: a tie, rounds down to 1
                          1.01171875f,             // 1 + 3 * 2^-8: a tie, rounds up
                          1.0039063f,              // just above the tie: up
                          1.0039062f,              // just below: down
                          -1.01171875f,            // negative tie: away from zero when odd
                          1.99609375f,             // 2 - 2^-8: a tie that carries to 2
                          3.3961e38f,              // rounds past the largest bf16 to inf
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          1e-39f,                  // a float32 subnormal: read as zero
                          -1e-39f,
                          123.456f,
                          std::numeric_limits<float>::quiet_NaN()};
  const int64_t M = sizeof values / sizeof values[0];
  const float one = 1.0f;
  for_each_kernel([&](const char*) {
    for (bool ta : {false, true}) {
      std::vector<float> C(M, -1.0f);
      cpu::gemm_bf16_call({ta, false, M, 1, 1, 1.0f, values, cpu::Operand::f32, ta ? M : 1, &one,
                           cpu::Operand::f32, 1, 0.0f, C.data(), 1, {}, nullptr, nullptr});
      for (int64_t i = 0; i < M; ++i) {
        INFO("value ", values[i], " ta=", ta, " got ", C[i]);
        if (std::isnan(values[i])) {
          CHECK(std::isnan(C[i]));
        } else if (std::fpclassify(values[i]) == FP_SUBNORMAL) {
          CHECK(C[i] == 0.0f);
        } else {
          CHECK(C[i] == round_to_bf16(values[i]));
        }
      }
    }
  });
}

TEST_CASE("gemm_bf16 on float32 operands equals it on the same operands rounded to bf16") {
  // Packing rounds in vector code on AVX512-BF16 machines and in scalar code elsewhere; both
  // must give core/bf16.h's bits, so the results are identical, not just close.
  const int64_t M = 70, N = 50, K = 90;
  for_each_kernel([&](const char*) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const Matrix Af = make_matrix(M * K, 31, cpu::Operand::f32);
        const Matrix Bf = make_matrix(K * N, 32, cpu::Operand::f32);
        std::vector<uint16_t> Ah, Bh;
        for (float v : Af.f) Ah.push_back(float_to_bf16(v));
        for (float v : Bf.f) Bh.push_back(float_to_bf16(v));
        std::vector<float> C1(M * N), C2(M * N);
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        cpu::gemm_bf16_call({ta, tb, M, N, K, 1.0f, Af.f.data(), cpu::Operand::f32, lda,
                             Bf.f.data(), cpu::Operand::f32, ldb, 0.0f, C1.data(), N, {},
                             nullptr, nullptr});
        cpu::gemm_bf16(ta, tb, M, N, K, 1.0f, Ah.data(), lda, Bh.data(), ldb, 0.0f, C2.data(), N);
        INFO("ta=", ta, " tb=", tb);
        CHECK(C1 == C2);
      }
  });
}

TEST_CASE("gemm_bf16 propagates NaN and infinity from the operands") {
  const int64_t M = 40, N = 40, K = 40;
  for_each_kernel([&](const char*) {
    Matrix A = make_matrix(M * K, 41, cpu::Operand::f32);
    const Matrix B = make_matrix(K * N, 42, cpu::Operand::f32);
    A.f[3 * K + 5] = std::numeric_limits<float>::quiet_NaN();   // row 3
    A.f[20 * K + 7] = std::numeric_limits<float>::infinity();  // row 20
    std::vector<float> C(M * N);
    cpu::gemm_bf16_call({false, false, M, N, K, 1.0f, A.f.data(), cpu::Operand::f32, K,
                         B.f.data(), cpu::Operand::f32, N, 0.0f, C.data(), N, {}, nullptr,
                         nullptr});
    for (int64_t j = 0; j < N; ++j) {
      INFO("column ", j);
      CHECK(std::isnan(C[3 * N + j]));
      CHECK((std::isinf(C[20 * N + j]) || std::isnan(C[20 * N + j])));
      CHECK(std::isfinite(C[4 * N + j]));
    }
  });
}

TEST_CASE("gemm_bf16 results are identical at 1, 2 and 3 threads") {
  // Tall (the threads split M) and wide (they split N, and one of them sums the rows).
  for_each_kernel([&](const char*) {
    for (auto [M, N] : {std::pair<int64_t, int64_t>{333, 70}, {40, 530}}) {
      const int64_t K = 300;
      const Matrix A = make_matrix(K * M, 18, cpu::Operand::f32);
      const Matrix B = make_matrix(K * N, 19, cpu::Operand::bf16);
      const std::vector<float> bias = random_values(N, 20);
      auto run = [&](int threads) {
        ThreadCount tc(threads);
        std::vector<float> C(M * N), sums(M);
        cpu::GemmEpilogue e{};
        e.bias = bias.data();
        e.relu = true;
        e.a_row_sums = sums.data();
        cpu::gemm_bf16_call({true, false, M, N, K, 1.0f, A.data(), A.type, M, B.data(), B.type,
                             N, 0.0f, C.data(), N, e, nullptr, nullptr});
        C.insert(C.end(), sums.begin(), sums.end());
        return C;
      };
      INFO("M=", M, " N=", N);
      const std::vector<float> one = run(1);
      CHECK(run(2) == one);
      CHECK(run(3) == one);
    }
  });
}

TEST_CASE("gemm_bf16_many gives each product exactly what gemm_bf16_call gives") {
  const int64_t R = 150, in = 40, out = 35;
  const Matrix dy = make_matrix(R * out, 21, cpu::Operand::f32);
  const Matrix W = make_matrix(out * in, 22, cpu::Operand::bf16);
  const Matrix x = make_matrix(R * in, 23, cpu::Operand::f32);
  const std::vector<float> C0 = random_values(17 * 9, 24);
  for_each_kernel([&](const char*) {
    auto run = [&](int threads, bool together) {
      ThreadCount tc(threads);
      std::vector<float> dx(R * in), dW(out * in), db(out), c2 = C0, c3 = C0;
      cpu::GemmEpilogue sums{};
      sums.a_row_sums = db.data();
      const std::vector<cpu::GemmBf16Call> calls = {
          {false, false, R, in, out, 1.0f, dy.data(), dy.type, out, W.data(), W.type, in, 0.0f,
           dx.data(), in, {}, nullptr, nullptr},
          {true, false, out, in, R, 1.0f, dy.data(), dy.type, out, x.data(), x.type, in, 0.0f,
           dW.data(), in, sums, nullptr, nullptr},
          {false, true, 17, 9, 40, 0.5f, x.data(), x.type, in, W.data(), W.type, in, 2.0f,
           c2.data(), 9, {}, nullptr, nullptr},
          {false, false, 17, 9, 0, 1.0f, x.data(), x.type, 1, W.data(), W.type, 9, 3.0f,
           c3.data(), 9, {}, nullptr, nullptr}};
      if (together)
        cpu::gemm_bf16_many(calls.data(), static_cast<int>(calls.size()));
      else
        for (const cpu::GemmBf16Call& g : calls) cpu::gemm_bf16_call(g);
      for (const std::vector<float>* v : {&dW, &db, &c2, &c3})
        dx.insert(dx.end(), v->begin(), v->end());
      return dx;
    };
    const std::vector<float> want = run(1, false);
    CHECK(run(1, true) == want);
    CHECK(run(2, true) == want);
    CHECK(run(2, false) == want);
  });
}

TEST_CASE("gemm_bf16_strided_batched equals the reference per matrix, stride 0 included") {
  for_each_kernel([&](const char*) {
    for (auto [M, N, K, batch] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{17, 33, 9, 7},
                                  {130, 150, 140, 3}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const int64_t lda = (ta ? M : K) + 2, ldb = (tb ? K : N) + 1, ldc = N + 3;
          const int64_t sa = (ta ? K : M) * lda + 5, sc = M * ldc + 1;
          const int64_t sb = batch == 3 ? 0 : (tb ? N : K) * ldb + 7;  // one B for every product
          const Matrix A = make_matrix(batch * sa, 8, cpu::Operand::bf16);
          const Matrix B = make_matrix(std::max<int64_t>(1, batch * sb) + (tb ? N : K) * ldb, 9,
                                       cpu::Operand::f32);
          std::vector<float> C = random_values(batch * sc, 10), R = C;
          cpu::gemm_bf16_strided_batched(ta, tb, M, N, K, 0.5f, A.data(), A.type, lda, sa,
                                         B.data(), B.type, ldb, sb, -1.0f, C.data(), ldc, sc,
                                         batch);
          for (int64_t b = 0; b < batch; ++b)
            cpu::gemm_bf16_reference({ta, tb, M, N, K, 0.5f, A.h.data() + b * sa, A.type, lda,
                                      B.f.data() + b * sb, B.type, ldb, -1.0f, R.data() + b * sc,
                                      ldc, {}, nullptr, nullptr});
          INFO("batch ", batch, " M=", M, " N=", N, " K=", K, " ta=", ta, " tb=", tb);
          CHECK_CLOSE(C, R, 2 * atol_for(K), 1e-6);
        }
  });
}

std::string hex16(uint16_t h) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%04x", static_cast<unsigned>(h));
  return buf;
}

// C rounded to bf16 as the GEMM stores it (vcvtneps2bf16: nearest even, subnormals to zero).
uint16_t stored_bf16(float v) {
  return float_to_bf16(std::fpclassify(v) == FP_SUBNORMAL ? v * 0.0f : v);
}

TEST_CASE("gemm_bf16 with a bf16 C stores its float32 result rounded, epilogue included") {
  // Each case runs twice, into a float32 C and into a bf16 C (with the mask in float32 and in
  // bf16, the same values): the bf16 C must be the float32 one rounded, bit for bit, and the
  // padding past N in each row untouched. K = 300 with A transposed and K = 1100 are deeper
  // than one depth block of the kernels (computed in float32, then rounded); M, N leave
  // partial tiles; 64 x 64 is whole AMX tiles.
  struct Shape3 {
    int64_t M, N, K;
  };
  const Shape3 shapes[] = {{77, 45, 300}, {64, 64, 192}, {33, 17, 1100}, {1, 1, 1}};
  const uint16_t kSentinel = 0x7bad;
  for_each_kernel([&](const char*) {
    for (const Shape3& sh : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (int variant = 0; variant < 3; ++variant) {
            const int64_t M = sh.M, N = sh.N, K = sh.K, ldc = N + 3;
            const Matrix A = make_matrix(M * K, 61, cpu::Operand::f32);
            const Matrix B = make_matrix(K * N, 62, cpu::Operand::bf16);
            const std::vector<float> bias = random_values(N, 63);
            std::vector<uint16_t> mask_h;
            for (float v : random_values(M * ldc, 64)) mask_h.push_back(float_to_bf16(v));
            mask_h[0] = 0x0001;  // the smallest positive subnormal: > 0, so it keeps C
            std::vector<float> mask_f;
            for (uint16_t h : mask_h) mask_f.push_back(bf16_to_float(h));
            cpu::GemmEpilogue e{};
            if (variant == 1) e.bias = bias.data(), e.relu = true;
            if (variant == 2) e.ldm = ldc;
            std::vector<float> Cf(M * ldc, 5.0f);
            std::vector<uint16_t> Cb(M * ldc, kSentinel), Rb(M * ldc, kSentinel);
            cpu::GemmBf16Call call{ta, tb, M, N, K, variant == 2 ? 0.5f : 1.0f, A.data(), A.type,
                                   ta ? M : K, B.data(), B.type, tb ? K : N, 0.0f, Cf.data(),
                                   ldc, e, nullptr, nullptr};
            if (variant == 2) call.epilogue.mask = mask_f.data();
            cpu::gemm_bf16_call(call);
            call.C = nullptr;
            call.C_bf16 = Cb.data();
            if (variant == 2) call.epilogue.mask = nullptr, call.mask_bf16 = mask_h.data();
            cpu::gemm_bf16_call(call);
            call.C_bf16 = Rb.data();
            cpu::gemm_bf16_reference(call);
            INFO("M=", M, " N=", N, " K=", K, " ta=", ta, " tb=", tb, " variant ", variant);
            int64_t wrong = 0, first = -1, far = 0;
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < ldc; ++j) {
                const int64_t at = i * ldc + j;
                const uint16_t want = j < N ? stored_bf16(Cf[at]) : kSentinel;
                if (Cb[at] != want && wrong++ == 0) first = at;
                // The reference sums in double: at most one bf16 step from the kernel's sum.
                if (j < N && std::abs(bf16_to_float(Rb[at]) - bf16_to_float(Cb[at])) >
                                 std::abs(bf16_to_float(Cb[at])) / 128 + 1e-6f)
                  ++far;
              }
            INFO("first difference at ", first, ": got ", hex16(first < 0 ? 0 : Cb[first]),
                 " want ",
                 hex16(first < 0 ? 0 : (first % ldc < N ? stored_bf16(Cf[first]) : kSentinel)));
            CHECK(wrong == 0);
            CHECK(far == 0);
          }
  });
}

TEST_CASE("gemm_bf16 with a bf16 C: K == 0 stores the rounded epilogue, gemm_bf16_many agrees") {
  const std::vector<float> bias = {1.0f / 3.0f, -2.0f, 1e-39f};
  std::vector<uint16_t> C(3, 0x7bad);
  const float a = 0.0f;
  cpu::GemmEpilogue e{};
  e.bias = bias.data();
  cpu::gemm_bf16_call({false, false, 1, 3, 0, 1.0f, &a, cpu::Operand::f32, 1, &a,
                       cpu::Operand::f32, 3, 0.0f, nullptr, 3, e, C.data(), nullptr});
  CHECK(C[0] == float_to_bf16(1.0f / 3.0f));
  CHECK(C[1] == float_to_bf16(-2.0f));
  CHECK(C[2] == 0);  // a subnormal result is stored as zero, as the kernels store it
  // In gemm_bf16_many, a deep bf16 product (run on its own) next to a plain one.
  for_each_kernel([&](const char*) {
    const int64_t M = 40, N = 24, K = 1100;
    const Matrix A = make_matrix(M * K, 71, cpu::Operand::f32);
    const Matrix B = make_matrix(K * N, 72, cpu::Operand::f32);
    std::vector<uint16_t> one(M * N), two(M * N), many1(M * N), many2(M * N);
    cpu::GemmBf16Call calls[2] = {
        {false, false, M, N, K, 1.0f, A.data(), A.type, K, B.data(), B.type, N, 0.0f, nullptr,
         N, {}, one.data(), nullptr},
        {false, false, M, N, 64, 1.0f, A.data(), A.type, K, B.data(), B.type, N, 0.0f, nullptr,
         N, {}, two.data(), nullptr}};
    cpu::gemm_bf16_call(calls[0]);
    cpu::gemm_bf16_call(calls[1]);
    calls[0].C_bf16 = many1.data();
    calls[1].C_bf16 = many2.data();
    cpu::gemm_bf16_many(calls, 2);
    CHECK(many1 == one);
    CHECK(many2 == two);
  });
}

TEST_CASE("gemm_bf16 errors name the problem") {
  std::vector<uint16_t> x(4);
  std::vector<float> c(4);
  CHECK_THROWS_WITH_AS(cpu::gemm_bf16(false, false, 2, 2, 2, 1.0f, x.data(), 1, x.data(), 2, 0.0f,
                                      c.data(), 2),
                       doctest::Contains("lda=1"), Error);
  CHECK_THROWS_WITH_AS(cpu::gemm_bf16(false, false, -1, 2, 2, 1.0f, x.data(), 2, x.data(), 2,
                                      0.0f, c.data(), 2),
                       doctest::Contains("M=-1"), Error);
  CHECK_THROWS_WITH_AS(cpu::gemm_bf16(false, false, 2, 2, 2, 1.0f, nullptr, 2, x.data(), 2, 0.0f,
                                      c.data(), 2),
                       doctest::Contains("null A or B"), Error);
  CHECK_THROWS_WITH_AS(cpu::set_gemm_bf16_kernel("sse"), doctest::Contains("unknown kernel 'sse'"),
                       Error);
  std::vector<uint16_t> h(4);
  const float one = 1.0f;
  CHECK_THROWS_WITH_AS(cpu::gemm_bf16_call({false, false, 2, 2, 2, 1.0f, x.data(),
                                            cpu::Operand::bf16, 2, x.data(), cpu::Operand::bf16,
                                            2, 1.0f, nullptr, 2, {}, h.data(), nullptr}),
                       doctest::Contains("beta must be 0"), Error);
  CHECK_THROWS_WITH_AS(cpu::gemm_bf16_call({false, false, 2, 2, 2, 1.0f, x.data(),
                                            cpu::Operand::bf16, 2, x.data(), cpu::Operand::bf16,
                                            2, 0.0f, c.data(), 2, {}, h.data(), nullptr}),
                       doctest::Contains("not both"), Error);
  cpu::GemmEpilogue both{};
  both.mask = &one;
  both.ldm = 2;
  CHECK_THROWS_WITH_AS(cpu::gemm_bf16_call({false, false, 2, 2, 2, 1.0f, x.data(),
                                            cpu::Operand::bf16, 2, x.data(), cpu::Operand::bf16,
                                            2, 0.0f, c.data(), 2, both, nullptr, h.data()}),
                       doctest::Contains("mask in float32 or in bf16"), Error);
  bool amx = false;
  for (const char* k : cpu::gemm_bf16_kernels()) amx = amx || std::string(k) == "amx";
  if (!amx)
    CHECK_THROWS_WITH_AS(cpu::set_gemm_bf16_kernel("amx"), doctest::Contains("does not support"),
                         Error);
}
