// The CUDA backend's bf16 GEMMs (cuda::gemm_bf16, cuda::gemm_bf16_strided_batched: cuBLAS's
// cublasGemmEx with bf16 operands and float32 accumulation) and the TF32 mode of its float32
// GEMMs (cuda::set_tf32), against host references computed in double.
//
// bf16 data is made on the host with core/bf16.h and moved to the device as raw bytes
// (cuda::alloc, copy_h2d, copy_d2h). Each stored matrix is padded past its rows (a leading
// dimension larger than the row) and batches leave gaps between their matrices: the padding of
// A and B holds NaN, so a GEMM that read it would show, and the padding of C holds a sentinel
// that must come back unchanged (C is compared in full).
//
// Tolerances. A product of two bf16 values (8-bit significands), or of two TF32 values (11-bit),
// is exact in float32, so the only error is the float32 accumulation: at most about
// (K + 2) * 2^-24 * (|alpha| sum_l |a_l b_l| + |beta c|) for K products, then alpha and beta.
// The emulated device adds the products in float32 in order of k, so it is held to that bound;
// a GPU's tensor cores and split-K reductions add in other orders and may truncate partial
// sums, so there the bound is 4 * K * 2^-23 (K + 2 in place of K). With TF32 on, each float32
// operand is rounded to TF32 first: the emulated device rounds as cvt.rna.tf32.f32 (to nearest,
// ties away from zero) and is held to the accumulation bound around a reference that rounds the
// same way; a GPU's kernels may round otherwise or drop the low bits, one TF32 unit (2^-10
// relative) per operand, which its tolerance adds.
//
// Part of the test_cuda program (tests/test_cuda.cpp has its main).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <limits>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "core/cuda/cuda.h"
#include "core/error.h"

namespace cuda = clustr::cuda;

namespace {

constexpr float kSentinel = 1234.5f;   // C's padding: never written
constexpr uint16_t kBf16NaN = 0x7fc0;  // A's and B's padding: never read
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// n elements of T in device memory, owned; made from a host vector, read back whole.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : n_(host.size()) {
    REQUIRE(n_ > 0);
    p_ = static_cast<T*>(cuda::alloc(bytes()));
    cuda::copy_h2d(p_, host.data(), bytes());
  }
  ~DeviceArray() { cuda::free(p_, bytes()); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return p_; }
  std::vector<T> to_host() const {
    std::vector<T> h(n_);
    cuda::copy_d2h(h.data(), p_, bytes());
    return h;
  }

 private:
  size_t bytes() const { return n_ * sizeof(T); }
  size_t n_;
  T* p_ = nullptr;
};

// TF32 on for one scope, and off again at its end, also when a REQUIRE in between throws, so
// that the tests after it run in FP32.
class Tf32On {
 public:
  Tf32On() { cuda::set_tf32(true); }
  ~Tf32On() {
    try {
      cuda::set_tf32(false);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "could not switch TF32 off again: %s\n", e.what());
      std::abort();  // every later float32 GEMM of the program would run in TF32
    }
  }
  Tf32On(const Tf32On&) = delete;
  Tf32On& operator=(const Tf32On&) = delete;
};

bool gpu_rounding() { return !cuda::exact_numerics(); }

// The accumulation error bound per unit of |alpha| sum |a b| + |beta c| (see the top).
double accumulation_rel(int64_t K) {
  const double k = static_cast<double>(K + 2);
  return gpu_rounding() ? 4.0 * k * std::ldexp(1.0, -23) : 1.001 * k * std::ldexp(1.0, -24);
}

// What TF32 rounding may add on a GPU, relative to the same scale: one TF32 unit (2^-10) on each
// of the two operands of every product.
constexpr double kTf32OperandRel = 2.0 * 0.0009765625 * 1.01;

std::vector<float> random_values(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = clustr::float_to_bf16(v[i]);
  return h;
}

std::vector<float> widen(const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = clustr::bf16_to_float(h[i]);
  return v;
}

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// x rounded to TF32 (11 significant bits: 10 explicit mantissa bits) by `round_half`, one of
// std::round (to nearest, ties away from zero: the cvt.rna.tf32.f32 rounding), std::nearbyint
// (ties to even, the default rounding mode) and std::trunc (the low bits dropped). Written with
// frexp rather than with the bit trick of the emulator, so the two check each other. Finite x.
float tf32_round(float x, double (*round_half)(double)) {
  if (x == 0.0f || !std::isfinite(x)) return x;
  int e;
  std::frexp(x, &e);                     // |x| = m 2^e, m in [0.5, 1)
  const int q = std::max(e - 11, -136);  // the spacing of TF32 values there (subnormals: 2^-136)
  const double r = std::ldexp(round_half(std::ldexp(static_cast<double>(x), -q)), q);
  if (std::fabs(r) > std::numeric_limits<float>::max())  // rounded past the largest float
    return std::copysign(std::numeric_limits<float>::infinity(), x);
  return static_cast<float>(r);
}
float tf32_rna(float x) { return tf32_round(x, [](double v) { return std::round(v); }); }
float tf32_rne(float x) { return tf32_round(x, [](double v) { return std::nearbyint(v); }); }
float tf32_trunc(float x) { return tf32_round(x, [](double v) { return std::trunc(v); }); }

std::vector<float> rounded_rna(const std::vector<float>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = std::isnan(v[i]) ? v[i] : tf32_rna(v[i]);
  return r;
}

// One row-major (batched) product, as cuda::gemm_strided_batched takes it; a single product is a
// batch of one. Each stored matrix has `pad` elements past each row, and consecutive matrices of
// a batch are `gap` elements apart past the end of the previous one (stride 0 for a shared A or B).
struct Gemm {
  bool ta = false, tb = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f, beta = 0.0f;
  int64_t lda = 0, ldb = 0, ldc = 0, stride_a = 0, stride_b = 0, stride_c = 0, batch = 1;

  Gemm(bool ta_, bool tb_, int64_t M_, int64_t N_, int64_t K_, float alpha_, float beta_,
       int64_t pad = 0, int64_t batch_ = 1, int64_t gap = 0, bool shared_a = false,
       bool shared_b = false)
      : ta(ta_), tb(tb_), M(M_), N(N_), K(K_), alpha(alpha_), beta(beta_), batch(batch_) {
    lda = std::max<int64_t>(1, a_row() + pad);
    ldb = std::max<int64_t>(1, b_row() + pad);
    ldc = std::max<int64_t>(1, N + pad);
    if (batch > 1) {
      stride_a = shared_a ? 0 : a_rows() * lda + gap;
      stride_b = shared_b ? 0 : b_rows() * ldb + gap;
      stride_c = M * ldc + gap;
    }
  }
  int64_t a_rows() const { return ta ? K : M; }
  int64_t a_row() const { return ta ? M : K; }
  int64_t b_rows() const { return tb ? N : K; }
  int64_t b_row() const { return tb ? K : N; }
  size_t a_size() const { return static_cast<size_t>(stride_a * (batch - 1) + a_rows() * lda); }
  size_t b_size() const { return static_cast<size_t>(stride_b * (batch - 1) + b_rows() * ldb); }
  size_t c_size() const { return static_cast<size_t>(stride_c * (batch - 1) + M * ldc); }
  double a(const std::vector<float>& A, int64_t b, int64_t i, int64_t l) const {
    return A[static_cast<size_t>(b * stride_a + (ta ? l * lda + i : i * lda + l))];
  }
  double b(const std::vector<float>& B, int64_t bt, int64_t l, int64_t j) const {
    return B[static_cast<size_t>(bt * stride_b + (tb ? j * ldb + l : l * ldb + j))];
  }
};

// Every element of the stored matrices that is not part of a matrix (padding, gaps) set to
// `filler`; the others keep `values`.
template <class T>
std::vector<T> padded(std::vector<T> values, int64_t rows, int64_t row, int64_t ld,
                      int64_t stride, int64_t batch, T filler) {
  std::vector<char> inside(values.size(), 0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < row; ++c) inside[static_cast<size_t>(b * stride + r * ld + c)] = 1;
  for (size_t i = 0; i < values.size(); ++i)
    if (!inside[i]) values[i] = filler;
  return values;
}

// The result C should hold, from the operand values A and B (bf16 widened, or TF32-rounded)
// and C's initial contents: each element of a product alpha sum_l a b + beta c in double (a
// product of two floats is exact in double), beta c counting as 0 when beta == 0 (BLAS: C is not
// read) and the sum as 0 when alpha == 0 or K == 0 (A and B are not read); elements outside
// the matrices keep their value. `scale` is what each element's error scales with,
// |alpha| sum |a b| + |beta c| (0 outside the matrices: they must match exactly).
struct Expected {
  std::vector<double> value, scale;
};

Expected reference(const Gemm& g, const std::vector<float>& A, const std::vector<float>& B,
                   const std::vector<float>& C) {
  Expected e{std::vector<double>(C.begin(), C.end()), std::vector<double>(C.size(), 0.0)};
  const bool product = g.K > 0 && g.alpha != 0.0f;
  for (int64_t bt = 0; bt < g.batch; ++bt)
    for (int64_t i = 0; i < g.M; ++i)
      for (int64_t j = 0; j < g.N; ++j) {
        double sum = 0, abs_sum = 0;
        if (product)
          for (int64_t l = 0; l < g.K; ++l) {
            const double p = g.a(A, bt, i, l) * g.b(B, bt, l, j);
            sum += p;
            abs_sum += std::fabs(p);
          }
        const size_t ci = static_cast<size_t>(bt * g.stride_c + i * g.ldc + j);
        const double c = g.beta == 0.0f ? 0.0 : static_cast<double>(g.beta) * C[ci];
        e.value[ci] = g.alpha * sum + c;
        e.scale[ci] = std::fabs(static_cast<double>(g.alpha)) * abs_sum + std::fabs(c);
      }
  return e;
}

// Every element of `actual` within rel * scale of the reference (NaN only where the reference
// is NaN). On failure: how many are outside, and the worst, with where it is and its tolerance.
void check_result(const char* what, const Gemm& g, const std::vector<float>& actual,
                  const Expected& e, double rel) {
  REQUIRE(actual.size() == e.value.size());
  int64_t bad = 0;
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double x = actual[i], want = e.value[i];
    if (std::isnan(want) && std::isnan(x)) continue;
    const double err = std::fabs(x - want), tol = rel * e.scale[i];
    if (err <= tol) continue;
    ++bad;
    const double excess = tol > 0 && !std::isnan(err) ? err / tol : INFINITY;
    if (excess > worst_excess) worst = i, worst_excess = excess;
  }
  std::ostringstream os;
  os.precision(9);
  if (bad) {
    const int64_t at = static_cast<int64_t>(worst);
    const int64_t bt = g.stride_c > 0 ? at / g.stride_c : 0, in = at - bt * g.stride_c;
    os << what << ": " << bad << " of " << actual.size() << " elements of C outside tolerance; "
       << "worst at batch " << bt << ", row " << in / g.ldc << ", column " << in % g.ldc
       << ": device " << actual[worst] << ", reference " << e.value[worst] << ", error "
       << std::fabs(actual[worst] - e.value[worst]) << ", tolerance " << rel * e.scale[worst]
       << " (" << rel << " x |alpha| sum|a b| + |beta c| = " << e.scale[worst] << ", K = " << g.K
       << ")";
  }
  CHECK_MESSAGE(bad == 0, os.str());
}

// Random bf16 operands and a random C for g, padding filled as described at the top.
struct Bf16Data {
  std::vector<uint16_t> A, B;
  std::vector<float> C;
};

Bf16Data bf16_data(const Gemm& g, uint32_t seed) {
  Bf16Data d;
  d.A = padded(to_bf16(random_values(g.a_size(), seed)), g.a_rows(), g.a_row(), g.lda,
               g.stride_a, g.batch, kBf16NaN);
  d.B = padded(to_bf16(random_values(g.b_size(), seed + 1)), g.b_rows(), g.b_row(), g.ldb,
               g.stride_b, g.batch, kBf16NaN);
  d.C = padded(random_values(g.c_size(), seed + 2), g.M, g.N, g.ldc, g.stride_c, g.batch,
               kSentinel);
  return d;
}

// Runs g through gemm_bf16 (batch 1, unless `batched`) or gemm_bf16_strided_batched on the
// device and returns C.
std::vector<float> run_bf16(const Gemm& g, const Bf16Data& d, bool batched) {
  DeviceArray<uint16_t> A(d.A), B(d.B);
  DeviceArray<float> C(d.C);
  if (batched)
    cuda::gemm_bf16_strided_batched(g.ta, g.tb, g.M, g.N, g.K, g.alpha, A.get(), g.lda,
                                    g.stride_a, B.get(), g.ldb, g.stride_b, g.beta, C.get(),
                                    g.ldc, g.stride_c, g.batch);
  else
    cuda::gemm_bf16(g.ta, g.tb, g.M, g.N, g.K, g.alpha, A.get(), g.lda, B.get(), g.ldb, g.beta,
                    C.get(), g.ldc);
  return C.to_host();
}

void check_bf16(const Gemm& g, uint32_t seed, bool batched) {
  CAPTURE(g.ta);
  CAPTURE(g.tb);
  CAPTURE(g.M);
  CAPTURE(g.N);
  CAPTURE(g.K);
  CAPTURE(g.lda);
  CAPTURE(g.batch);
  const Bf16Data d = bf16_data(g, seed);
  const std::vector<float> C = run_bf16(g, d, batched);
  check_result(batched ? "gemm_bf16_strided_batched" : "gemm_bf16", g, C,
               reference(g, widen(d.A), widen(d.B), d.C), accumulation_rel(g.K));
}

// Runs g through the float32 GEMM (gemm, or gemm_strided_batched when `batched`) and returns C.
std::vector<float> run_f32(const Gemm& g, const std::vector<float>& A, const std::vector<float>& B,
                           const std::vector<float>& C0, bool batched) {
  DeviceArray<float> dA(A), dB(B), dC(C0);
  if (batched)
    cuda::gemm_strided_batched(g.ta, g.tb, g.M, g.N, g.K, g.alpha, dA.get(), g.lda, g.stride_a,
                               dB.get(), g.ldb, g.stride_b, g.beta, dC.get(), g.ldc, g.stride_c,
                               g.batch);
  else
    cuda::gemm(g.ta, g.tb, g.M, g.N, g.K, g.alpha, dA.get(), g.lda, dB.get(), g.ldb, g.beta,
               dC.get(), g.ldc);
  return dC.to_host();
}

// float32 values in [-2, 2) with every third one moved onto a tie of TF32 rounding (its low 13
// bits 0x1000: halfway between two TF32 values), where rounding to nearest even, away from zero
// and truncation disagree (to even and truncation agree when the last kept bit is even).
std::vector<float> tie_heavy(size_t n, uint32_t seed) {
  std::vector<float> v = random_values(n, seed, -2.0f, 2.0f);
  for (size_t i = 0; i < n; i += 3) v[i] = from_bits((bits(v[i]) & ~0x1fffu) | 0x1000u);
  return v;
}

// float32 values in [1, 2) just below a TF32 tie (low 13 bits 0x0fff): every TF32 rounding
// (nearest either way, or truncation) moves each one down by almost 2^-11, 2^-12 to 2^-11
// relative, so a sum of products of such operands in TF32 is smaller than the float32 one by
// 2^-11 to 2^-10 relative, everywhere.
std::vector<float> below_tie(size_t n, uint32_t seed) {
  std::vector<float> v = random_values(n, seed, 1.0f, 2.0f);
  for (float& x : v) x = from_bits((bits(x) & ~0x1fffu) | 0x0fffu);
  return v;
}

struct Shape {
  int64_t M, N, K;
};

}  // namespace

TEST_CASE("cuda bf16: gemm_bf16 matches the exact product of the bf16 values for every "
          "transpose pair, awkward shapes and padded leading dimensions") {
  const Shape shapes[] = {{1, 1, 1},    {3, 3, 3},    {17, 17, 17}, {129, 129, 129},
                          {17, 129, 3}, {129, 17, 65}, {1, 129, 17}, {3, 1, 129},
                          {5, 7, 1031}};  // a long accumulation: the tolerance grows with K
  uint32_t seed = 1000;
  for (const Shape& s : shapes)
    for (int t = 0; t < 4; ++t)
      for (int64_t pad : {0, 3}) {
        check_bf16(Gemm(t & 1, t & 2, s.M, s.N, s.K, 0.5f, -1.5f, pad), seed, false);
        seed += 3;
      }
  check_bf16(Gemm(false, true, 33, 20, 40, -2.0f, 1.0f, 1), seed, false);  // beta == 1
}

TEST_CASE("cuda bf16: gemm_bf16 follows the BLAS rules for beta == 0, alpha == 0, K == 0 and "
          "empty sizes") {
  // beta == 0 overwrites C without reading it: NaN in C must not survive.
  for (int t = 0; t < 4; ++t) {
    const Gemm g(t & 1, t & 2, 9, 6, 5, 1.0f, 0.0f, 2);
    CAPTURE(t);
    Bf16Data d = bf16_data(g, 70 + t);
    d.C = padded(std::vector<float>(g.c_size(), kNaN), g.M, g.N, g.ldc, 0, 1, kSentinel);
    check_result("gemm_bf16, beta == 0, NaN in C", g, run_bf16(g, d, false),
                 reference(g, widen(d.A), widen(d.B), d.C), accumulation_rel(g.K));
  }

  // alpha == 0: C = beta * C, A and B not read (NaN there does not reach C).
  {
    const Gemm g(false, false, 7, 4, 3, 0.0f, -0.5f, 1);
    Bf16Data d = bf16_data(g, 80);
    std::fill(d.A.begin(), d.A.end(), kBf16NaN);
    check_result("gemm_bf16, alpha == 0", g, run_bf16(g, d, false),
                 reference(g, widen(d.A), widen(d.B), d.C), 0.0);
  }

  // K == 0: C = beta * C, and no A or B is needed; beta == 0 with it writes zeros over NaN.
  for (float beta : {2.0f, 0.0f}) {
    CAPTURE(beta);
    const Gemm g(true, false, 5, 17, 0, 0.5f, beta, 1);
    std::vector<float> C0 = padded(random_values(g.c_size(), 81), g.M, g.N, g.ldc, 0, 1,
                                   kSentinel);
    if (beta == 0.0f) C0[0] = kNaN;
    DeviceArray<float> C(C0);
    cuda::gemm_bf16(g.ta, g.tb, g.M, g.N, g.K, g.alpha, nullptr, g.lda, nullptr, g.ldb, g.beta,
                    C.get(), g.ldc);
    check_result("gemm_bf16, K == 0", g, C.to_host(), reference(g, {}, {}, C0), 0.0);
  }

  // Empty results touch nothing, so no pointers are needed; nor does an empty batch.
  cuda::gemm_bf16(false, false, 0, 5, 3, 1.0f, nullptr, 3, nullptr, 5, 0.0f, nullptr, 5);
  cuda::gemm_bf16(true, true, 4, 0, 3, 1.0f, nullptr, 4, nullptr, 3, 0.0f, nullptr, 1);
  cuda::gemm_bf16_strided_batched(false, false, 4, 5, 3, 1.0f, nullptr, 3, 12, nullptr, 5, 15,
                                  0.0f, nullptr, 5, 20, 0);
}

TEST_CASE("cuda bf16: gemm_bf16_strided_batched matches per-matrix references, with stride 0 "
          "for A or B") {
  uint32_t seed = 2000;
  for (int t = 0; t < 4; ++t)
    for (int shared = 0; shared < 3; ++shared) {  // 1: stride_a == 0, 2: stride_b == 0
      CAPTURE(shared);
      check_bf16(Gemm(t & 1, t & 2, 17, 33, 9, 0.5f, -1.5f, 2, 3, 5, shared == 1, shared == 2),
                 seed, true);
      seed += 3;
    }
  check_bf16(Gemm(true, false, 65, 31, 129, -2.0f, 0.25f, 1, 5, 7), seed, true);
  check_bf16(Gemm(false, true, 1, 1, 1, 1.0f, 0.0f, 0, 4, 0), seed + 3, true);  // no gaps
  // A batch of one is gemm_bf16.
  const Gemm g(false, false, 12, 13, 14, 1.5f, 0.5f, 1);
  const Bf16Data d = bf16_data(g, seed + 6);
  CHECK(run_bf16(g, d, true) == run_bf16(g, d, false));
}

TEST_CASE("cuda bf16: gemm_bf16 on a stream other than the default gives the same result") {
  const Gemm g(true, true, 40, 24, 56, 1.0f, -1.0f, 2);
  const Bf16Data d = bf16_data(g, 3000);
  const std::vector<float> on_default = run_bf16(g, d, false);
  cuda::Stream side;
  std::vector<float> on_side;
  {
    cuda::StreamGuard guard(side);
    on_side = run_bf16(g, d, false);  // allocated, computed, read back and freed on `side`
  }
  CHECK(on_side == on_default);
}

// The messages about sizes and leading dimensions come from check_gemm_args (core/gemm_args.h),
// shared with the CPU GEMMs and cuda::gemm; the others are the CUDA GEMMs' own.
TEST_CASE("cuda bf16: gemm_bf16 rejects bad sizes, leading dimensions and strides with clear "
          "errors") {
  DeviceArray<uint16_t> ab(std::vector<uint16_t>(4096, 0));
  DeviceArray<float> c(std::vector<float>(4096, 0.0f));
  const uint16_t* p = ab.get();
  float* C = c.get();
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16(false, false, -1, 5, 6, 1.0f, p, 6, p, 5, 0.0f, C, 5),
                       doctest::Contains("cuda::gemm_bf16: sizes must be non-negative, got M=-1"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16(false, false, 4, 5, -6, 1.0f, p, 6, p, 5, 0.0f, C, 5),
                       doctest::Contains("K=-6"), clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16(false, false, 4, 5, 6, 1.0f, p, 5, p, 5, 0.0f, C, 5),
                       doctest::Contains("lda=5 is smaller than a row of A (6 elements)"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16(true, false, 4, 5, 6, 1.0f, p, 3, p, 5, 0.0f, C, 5),
                       doctest::Contains("lda=3 is smaller than a row of A^T (4 elements)"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16(false, true, 4, 5, 6, 1.0f, p, 6, p, 5, 0.0f, C, 5),
                       doctest::Contains("ldb=5 is smaller than a row of B^T (6 elements)"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16(false, false, 4, 5, 6, 1.0f, p, 6, p, 5, 0.0f, C, 4),
                       doctest::Contains("ldc=4 is smaller than a row of C (5 elements)"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16(false, false, 4, 5, 6, 1.0f, nullptr, 6, p, 5, 0.0f, C, 5),
                       doctest::Contains("null A or B for a 4 x 5 x 6 product"), clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16(false, false, int64_t(1) << 31, 1, 1, 1.0f, p, 1, p, 1,
                                       0.0f, C, 1),
                       doctest::Contains("M = 2147483648 exceeds cuBLAS's 32-bit limit"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16(false, false, 4, 5, 6, 1.0f, p, 6, p, 5, 0.0f, C,
                                       int64_t(1) << 32),
                       doctest::Contains("ldc = 4294967296 exceeds cuBLAS's 32-bit limit"),
                       clustr::Error);

  CHECK_THROWS_WITH_AS(cuda::gemm_bf16_strided_batched(false, false, 4, 5, 6, 1.0f, p, 6, 24, p,
                                                       5, 30, 0.0f, C, 5, 10, 2),
                       doctest::Contains("cuda::gemm_bf16_strided_batched: stride_c = 10 makes "
                                         "the 4 x 5 C matrices (ldc 5) of consecutive batch "
                                         "entries overlap; it must be at least 20"),
                       clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16_strided_batched(false, false, 4, 5, 6, 1.0f, p, 6, 24, p,
                                                       5, 30, 0.0f, C, 5, 20, -1),
                       doctest::Contains("negative batch count -1"), clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16_strided_batched(false, false, 4, 5, 6, 1.0f, p, 6, -24, p,
                                                       5, 30, 0.0f, C, 5, 20, 2),
                       doctest::Contains("negative stride (a -24, b 30, c 20)"), clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16_strided_batched(false, false, 4, 5, 6, 1.0f, p, 6, 24, p,
                                                       4, 30, 0.0f, C, 5, 20, 2),
                       doctest::Contains("cuda::gemm_bf16_strided_batched: ldb=4"), clustr::Error);
  CHECK_THROWS_WITH_AS(cuda::gemm_bf16_strided_batched(false, false, 4, 5, 6, 1.0f, p, 6, 24, p,
                                                       5, 30, 0.0f, C, 5, 20,
                                                       int64_t(1) << 31),
                       doctest::Contains("batch = 2147483648 exceeds cuBLAS's 32-bit limit"),
                       clustr::Error);
  // The float32 batched GEMM refuses overlapping C the same way (the checks are shared).
  CHECK_THROWS_WITH_AS(cuda::gemm_strided_batched(false, false, 4, 5, 6, 1.0f, C, 6, 24, C, 5,
                                                  30, 0.0f, C, 5, 19, 2),
                       doctest::Contains("cuda::gemm_strided_batched: stride_c = 19"),
                       clustr::Error);
}

TEST_CASE("cuda tf32: off by default; off, the float32 GEMMs compute in FP32") {
  CHECK_FALSE(cuda::tf32());
  // Operands just below a TF32 tie: TF32 would move every sum by 2^-11 to 2^-10 relative, far
  // outside the FP32 tolerance.
  uint32_t seed = 4000;
  for (int t = 0; t < 4; ++t) {
    for (const Shape& s : {Shape{17, 33, 65}, Shape{64, 64, 256}}) {
      const Gemm g(t & 1, t & 2, s.M, s.N, s.K, 0.5f, -1.5f, 1);
      CAPTURE(g.ta);
      CAPTURE(g.tb);
      CAPTURE(g.K);
      const std::vector<float> A = padded(below_tie(g.a_size(), seed), g.a_rows(), g.a_row(),
                                          g.lda, 0, 1, kNaN);
      const std::vector<float> B = padded(below_tie(g.b_size(), seed + 1), g.b_rows(),
                                          g.b_row(), g.ldb, 0, 1, kNaN);
      const std::vector<float> C0 = padded(random_values(g.c_size(), seed + 2), g.M, g.N, g.ldc,
                                           0, 1, kSentinel);
      seed += 3;
      const std::vector<float> before = run_f32(g, A, B, C0, false);
      check_result("gemm, TF32 off", g, before, reference(g, A, B, C0), accumulation_rel(g.K));
#if !defined(__FMA__)  // where the compiler may fuse a * b + c, the roundings are its choice
      if (cuda::exact_numerics()) {
        // The emulated device's FP32 arithmetic, as before TF32 existed: float products added
        // in float in order of k, then alpha and beta; bit for bit.
        std::vector<float> plain = C0;
        for (int64_t i = 0; i < g.M; ++i)
          for (int64_t j = 0; j < g.N; ++j) {
            float acc = 0.0f;
            for (int64_t l = 0; l < g.K; ++l)
              acc += static_cast<float>(g.a(A, 0, i, l)) * static_cast<float>(g.b(B, 0, l, j));
            float& c = plain[static_cast<size_t>(i * g.ldc + j)];
            c = g.alpha * acc + g.beta * c;
          }
        CHECK(before == plain);
      }
#endif
      {
        Tf32On on;
        CHECK(cuda::tf32());
      }
      CHECK_FALSE(cuda::tf32());
      CHECK(run_f32(g, A, B, C0, false) == before);  // switched on and off again: FP32 as before
    }
  }
}

TEST_CASE("cuda tf32: on, the float32 GEMMs read their operands as TF32") {
  Tf32On on;
  REQUIRE(cuda::tf32());

  // Against a reference from operands rounded to TF32 to nearest, ties away from zero (the
  // emulated device's rounding), on data with many exact ties, every transpose pair, batches.
  uint32_t seed = 5000;
  const Shape shapes[] = {{1, 1, 1}, {3, 17, 5}, {17, 17, 17}, {129, 65, 33}, {2, 3, 1031}};
  for (const Shape& s : shapes)
    for (int t = 0; t < 4; ++t)
      for (bool batched : {false, true}) {
        const Gemm g = batched ? Gemm(t & 1, t & 2, s.M, s.N, s.K, 0.5f, -1.5f, 2, 3, 4,
                                      t == 1, t == 2)
                               : Gemm(t & 1, t & 2, s.M, s.N, s.K, 0.5f, -1.5f, 1);
        CAPTURE(g.ta);
        CAPTURE(g.tb);
        CAPTURE(g.M);
        CAPTURE(g.N);
        CAPTURE(g.K);
        CAPTURE(batched);
        const std::vector<float> A = padded(tie_heavy(g.a_size(), seed), g.a_rows(), g.a_row(),
                                            g.lda, g.stride_a, g.batch, kNaN);
        const std::vector<float> B = padded(tie_heavy(g.b_size(), seed + 1), g.b_rows(),
                                            g.b_row(), g.ldb, g.stride_b, g.batch, kNaN);
        const std::vector<float> C0 = padded(random_values(g.c_size(), seed + 2), g.M, g.N,
                                             g.ldc, g.stride_c, g.batch, kSentinel);
        seed += 3;
        const double rel = accumulation_rel(g.K) + (gpu_rounding() ? kTf32OperandRel : 0.0);
        check_result(batched ? "gemm_strided_batched, TF32 on" : "gemm, TF32 on", g,
                     run_f32(g, A, B, C0, batched),
                     reference(g, rounded_rna(A), rounded_rna(B), C0), rel);
      }

  // The rounding of ties, one product at a time: C(1, n) = 1 * b. Halfway cases with an even
  // last kept bit tell rounding away from zero (up in magnitude) from rounding to even (down).
  {
    const float ties[] = {from_bits(0x3f801000u),  // 1 + 2^-11: away -> 1 + 2^-10, even -> 1
                          from_bits(0xbf801000u),  // its negative: away from zero is down
                          from_bits(0x3f803000u),  // 1 + 3 2^-11: both -> 1 + 2^-9
                          from_bits(0x40a05000u),  // 5.0390625, a tie of the exponent 2 range
                          from_bits(0x3f800fffu),  // just below a tie: down in every rounding
                          from_bits(0x3f801001u),  // just above a tie: up when rounding to nearest
                          from_bits(0x7f7fffffu),  // the largest float rounds up to infinity
                          0.0f};
    const int64_t n = static_cast<int64_t>(std::size(ties));
    const Gemm g(false, false, 1, n, 1, 1.0f, 0.0f);
    const std::vector<float> B(ties, ties + n);
    const std::vector<float> C = run_f32(g, {1.0f}, B, std::vector<float>(n, kNaN), false);
    for (int64_t j = 0; j < n; ++j) {
      const float b = B[static_cast<size_t>(j)], c = C[static_cast<size_t>(j)];
      CAPTURE(j);
      CAPTURE(b);
      CAPTURE(c);
      if (cuda::emulated()) {
        CHECK(c == tf32_rna(b));
      } else {  // some rounding to TF32, or none where cuBLAS chose an FP32 kernel
        CHECK((c == tf32_rna(b) || c == tf32_rne(b) || c == tf32_trunc(b) || c == b));
      }
    }
    if (cuda::emulated()) CHECK(std::isinf(C[6]));
  }

  // Demonstrably not FP32: operands just below a tie are rounded down by every TF32 rounding,
  // so on a product large enough for cuBLAS to pick tensor cores every element of C lies below
  // the FP32 product by 2^-11 to 2^-10 relative, far outside the FP32 tolerance, within TF32's.
  {
    const Gemm g(false, true, 256, 256, 256, 1.0f, 0.0f);
    const std::vector<float> A = below_tie(g.a_size(), 5500), B = below_tie(g.b_size(), 5501);
    const std::vector<float> C0(g.c_size(), 0.0f);
    const std::vector<float> C = run_f32(g, A, B, C0, false);
    const Expected fp32 = reference(g, A, B, C0);
    int64_t fp32_like = 0;
    for (size_t i = 0; i < C.size(); ++i)
      if (std::fabs(C[i] - fp32.value[i]) <= accumulation_rel(g.K) * fp32.scale[i])
        ++fp32_like;
    CHECK_MESSAGE(fp32_like == 0, fp32_like, " of ", C.size(),
                  " elements of C are as close to the FP32 product as FP32 arithmetic is");
    check_result("gemm, TF32 on, operands below a tie", g, C,
                 reference(g, rounded_rna(A), rounded_rna(B), C0),
                 accumulation_rel(g.K) + (gpu_rounding() ? kTf32OperandRel : 0.0));
  }

  // bf16 operands are exact in TF32: gemm_bf16 gives the same result with TF32 on and off.
  {
    const Gemm g(true, false, 33, 17, 129, 1.0f, 0.5f, 1);
    const Bf16Data d = bf16_data(g, 5600);
    const std::vector<float> with_tf32 = run_bf16(g, d, false);
    cuda::set_tf32(false);
    const std::vector<float> without = run_bf16(g, d, false);
    cuda::set_tf32(true);
    CHECK(with_tf32 == without);
  }
}

// set_tf32 changes the math mode of the handle every call shares under the lock the calls hold,
// so a GEMM running while another thread switches gives the FP32 or the TF32 result, bit for
// bit, never a mixture or an error.
TEST_CASE("cuda tf32: switching while another host thread multiplies") {
  const Gemm g(false, false, 48, 40, 64, 1.0f, 0.0f);
  const std::vector<float> A = below_tie(g.a_size(), 6000), B = below_tie(g.b_size(), 6001);
  const std::vector<float> C0(g.c_size(), 0.0f);
  const std::vector<float> fp32 = run_f32(g, A, B, C0, false);
  std::vector<float> tf32;
  {
    Tf32On on;
    tf32 = run_f32(g, A, B, C0, false);
  }
  REQUIRE(tf32 != fp32);

  Tf32On on;  // off again at the end, whatever the switching thread did last
  std::atomic<bool> stop{false};
  std::exception_ptr error;
  std::thread switcher([&] {
    try {
      for (bool mode = false; !stop; mode = !mode) cuda::set_tf32(mode);
    } catch (...) {
      error = std::current_exception();
    }
  });
  int64_t odd = 0;
  for (int i = 0; i < 40; ++i) {
    const std::vector<float> C = run_f32(g, A, B, C0, false);
    if (C != fp32 && C != tf32) ++odd;
  }
  stop = true;
  switcher.join();
  if (error) std::rethrow_exception(error);
  CHECK_MESSAGE(odd == 0, odd, " of 40 products were neither the FP32 nor the TF32 result");
}
