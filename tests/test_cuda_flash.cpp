// The tensor-core full attention (layers/attention/cuda/flash.h), which takes the head sizes 32,
// 64 and 128 on the device: forward and backward through the front doors (full.h), with bf16
// products, f32 ones (3xTF32) and TF32 ones, against the CPU's f32 kernels and the autograd
// reference (reference.h), on odd sizes (N of 1, 17, 129, 1000; N != S), key lengths (0,
// partial, full) with padded queries, causal, dropout, a temperature, every head size, and the
// fused qkv layout read and written in place; its launches (four for a bf16 forward + backward,
// three for f32, no cuBLAS call, whatever B, H and N); the same bits run after run; and the
// blocked kernels for the calls it does not take. Part of the test_cuda program
// (tests/test_cuda.cpp has its main): on a GPU or the emulated device.
//
// Tolerance of f32 products (kF32Tol): 3xTF32 forms each product to about 2^-21 of itself (the
// tails' product, and the tail's own rounding to TF32, are what it drops), and the sums are f32:
// a few 1e-6 of a row's scale, as the blocked kernels' cuBLAS products (test_cuda_attention's
// 2e-5). TF32 products (kTf32Tol): each operand rounded to 10 mantissa bits, 2^-11, twice per
// product and three products deep for the gradients: a few 2^-11 of a row's scale.
//
// Tolerance of bf16 products. The inputs are rounded to bf16 on the host first, so the device's own rounding of
// Q, K, V and dout changes nothing and the CPU computes, in f32, the attention of the very
// operands the tensor cores multiply. What is left is the rounding of the weights to bf16 before
// their products (each tile's exp(s - m) before P V; P^T and dS^T before dV, dK, dQ): a relative
// error of at most 2^-9 per weight, which a row's sum of up to S terms weighs by the weights
// themselves, so it stays a few 2^-9 of the row's scale (its largest element, at least a tenth
// of the tensor's): kOutTol for out and logsumexp, kGradTol for the gradients (whose dS also
// carries D = dout . out with out's error, and dQ, dK a second rounded product). The f32 sums
// add about 1e-6. Rows that see no key must be exactly 0 (and -inf).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "check.h"
#include "core/cuda/cuda.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "cuda_check.h"
#include "layers/attention/full.h"
#include "layers/attention/reference.h"

using clustr::Device;
using clustr::DType;
using clustr::FullAttentionOptions;
using clustr::Precision;
using clustr::Tensor;
using clustr::Variable;
using clustr::test::on;

namespace {

constexpr double kOutTol = 4.0 / 512, kGradTol = 8.0 / 512;
constexpr double kF32Tol = 2e-5, kTf32Tol = 8.0 / 2048;

// The products' arithmetic of a run: the cpu's f32, or the device's bf16, f32 (3xTF32) or TF32.
enum class Products { cpu, bf16, f32, tf32 };

// cuda::tf32() on for one scope.
class Tf32Scope {
 public:
  explicit Tf32Scope(bool on) : was_(clustr::cuda::tf32()) { clustr::cuda::set_tf32(on); }
  ~Tf32Scope() { clustr::cuda::set_tf32(was_); }
  Tf32Scope(const Tf32Scope&) = delete;
  Tf32Scope& operator=(const Tf32Scope&) = delete;

 private:
  bool was_;
};

struct Case {
  int64_t B = 1, H = 1, N = 1, S = 1, E = 32;
  std::vector<int32_t> lengths;  // empty: no key mask
  FullAttentionOptions options;
};

std::string name_of(const Case& c) {
  std::ostringstream os;
  os << "(B, H, N, S, E) = (" << c.B << ", " << c.H << ", " << c.N << ", " << c.S << ", " << c.E
     << ")";
  if (!c.lengths.empty()) {
    os << " lengths {";
    for (size_t i = 0; i < c.lengths.size(); ++i) os << (i ? ", " : "") << c.lengths[i];
    os << "}";
  }
  if (c.options.causal) os << " causal";
  if (c.options.dropout > 0) os << " dropout " << c.options.dropout;
  return os.str();
}

Case make_case(int64_t B, int64_t H, int64_t N, int64_t S, int64_t E,
               std::vector<int32_t> lengths = {}, bool causal = false, float dropout = 0.0f) {
  Case c{B, H, N, S, E, std::move(lengths), {}};
  c.options.causal = causal;
  c.options.dropout = dropout;
  c.options.seed = 4321;
  c.options.offset = 19;
  return c;
}

// x rounded to bf16 and back (on the cpu).
Tensor bf16_values(const Tensor& x) { return x.astype(DType::bf16).astype(DType::f32); }

struct Inputs {
  Tensor Q, K, V, dO, lengths;  // on the cpu
};
// Random inputs; with `rounded`, values exact in bf16 (for bf16 products).
Inputs make_inputs(const Case& c, uint32_t seed, bool rounded = true) {
  auto random_tensor = [&](const clustr::Shape& s, uint32_t k) {
    const Tensor x = clustr::test::random_tensor(s, k);
    return rounded ? bf16_values(x) : x;
  };
  Inputs in;
  in.Q = random_tensor({c.B, c.H, c.N, c.E}, seed);
  in.K = random_tensor({c.B, c.H, c.S, c.E}, seed + 1);
  in.V = random_tensor({c.B, c.H, c.S, c.E}, seed + 2);
  in.dO = random_tensor({c.B, c.H, c.N, c.E}, seed + 3);
  if (!c.lengths.empty()) in.lengths = Tensor::from_int_vector(c.lengths, {c.B});
  return in;
}

struct Result {
  std::vector<float> out, lse, dQ, dK, dV;
};
// Forward and backward with the given products: on the cpu, or on the device.
Result run(const Case& c, const Inputs& in, Products products) {
  FullAttentionOptions o = c.options;
  o.precision = products == Products::bf16 ? Precision::bf16 : Precision::fp32;
  const Device dev = products == Products::cpu ? Device::cpu : Device::cuda;
  const Tf32Scope tf32(products == Products::tf32);
  const Tensor Q = on(in.Q, dev), K = on(in.K, dev), V = on(in.V, dev), L = on(in.lengths, dev);
  const clustr::FullAttentionOutput f = clustr::full_attention_forward(Q, K, V, L, o);
  const clustr::FullAttentionGrads g =
      clustr::full_attention_backward(on(in.dO, dev), Q, K, V, f.out, f.logsumexp, L, o);
  return {f.out.to_vector(), f.logsumexp.to_vector(), g.dQ.to_vector(), g.dK.to_vector(),
          g.dV.to_vector()};
}

void check_rows(const char* what, const std::vector<float>& actual,
                const std::vector<float>& expected, int64_t width, double tol) {
  clustr::test::check_rows(what, actual, expected, width, tol, clustr::test::ZeroRows::scaled);
}

// The launches (kernels, cuBLAS calls) of f().
template <class F>
clustr::cuda::LaunchCounts launches_of(F f) {
  const clustr::cuda::LaunchCounts before = clustr::cuda::launch_counts();
  f();
  const clustr::cuda::LaunchCounts after = clustr::cuda::launch_counts();
  return {after.kernels - before.kernels, after.blas - before.blas};
}

// The case with the device's products (bf16 by default) against the cpu's f32.
void check_case(const Case& c, uint32_t seed, Products products = Products::bf16) {
  INFO(name_of(c));
  const std::string kind = products == Products::bf16  ? "bf16"
                           : products == Products::f32 ? "f32 (3xTF32)"
                                                       : "TF32";
  INFO("device products: " << kind);
  const Inputs in = make_inputs(c, seed, products == Products::bf16);
  const Result cpu = run(c, in, Products::cpu);
  Result dev;
  const clustr::cuda::LaunchCounts n = launches_of([&] { dev = run(c, in, products); });
  CHECK_MESSAGE(n.blas == 0, n.blas << " cuBLAS calls: the blocked kernels ran, not flash.cu");
  const uint64_t launches = products == Products::bf16 ? 4 : 3;
  CHECK_MESSAGE(n.kernels == launches, n.kernels << " launches for forward + backward");
  const double out_tol = products == Products::bf16   ? kOutTol
                         : products == Products::f32 ? kF32Tol
                                                     : kTf32Tol;
  const double grad_tol = products == Products::bf16 ? kGradTol : 2 * out_tol;
  check_rows("out", dev.out, cpu.out, c.E, out_tol);
  check_rows("logsumexp", dev.lse, cpu.lse, c.N, out_tol);
  check_rows("dQ", dev.dQ, cpu.dQ, c.E, grad_tol);
  check_rows("dK", dev.dK, cpu.dK, c.E, grad_tol);
  check_rows("dV", dev.dV, cpu.dV, c.E, grad_tol);
  // Rows that see no key: exactly 0 (out, dQ) and -inf.
  int64_t wrong = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t L = c.lengths.empty() ? c.S : c.lengths[b];
    const int64_t first = L == 0 ? 0 : (!c.lengths.empty() && c.N == c.S) ? L : c.N;
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = first; i < c.N; ++i) {
        const int64_t row = (b * c.H + h) * c.N + i;
        wrong += dev.lse[row] != -INFINITY;
        for (int64_t e = 0; e < c.E; ++e)
          wrong += dev.out[row * c.E + e] != 0.0f || dev.dQ[row * c.E + e] != 0.0f;
      }
  }
  CHECK_MESSAGE(wrong == 0, wrong << " elements of rows that see no key are not 0 / -inf");
}

}  // namespace

TEST_CASE("cuda flash: every head size against the cpu on odd sizes, N != S, and a temperature") {
  if (!clustr::cuda::available()) return;
  check_case(make_case(1, 1, 1, 1, 32), 1);
  check_case(make_case(2, 3, 17, 17, 32), 2);
  check_case(make_case(1, 2, 129, 65, 64), 3);
  check_case(make_case(2, 1, 3, 129, 128), 4);
  check_case(make_case(1, 1, 129, 129, 128), 5);
  Case t = make_case(1, 2, 70, 40, 64);
  t.options.temperature = 0.3f;
  check_case(t, 6);
}

TEST_CASE("cuda flash: key lengths (0, partial, full) with padded queries, and causal") {
  if (!clustr::cuda::available()) return;
  check_case(make_case(3, 2, 17, 17, 32, {17, 5, 0}), 11);
  check_case(make_case(2, 2, 17, 23, 64, {0, 23}), 12);  // N != S: no query padding
  check_case(make_case(2, 2, 150, 150, 32, {}, true), 13);
  check_case(make_case(3, 1, 140, 140, 64, {140, 1, 90}, true), 14);
  check_case(make_case(1, 1, 1, 1, 32, {0}, true), 15);
  check_case(make_case(1, 1, 100, 100, 128, {77}, true), 16);
}

TEST_CASE("cuda flash: dropout draws the cpu's mask from the same seed") {
  if (!clustr::cuda::available()) return;
  check_case(make_case(2, 2, 17, 19, 32, {19, 11}, false, 0.3f), 31);
  check_case(make_case(1, 1, 130, 130, 64, {121}, true, 0.2f), 32);
  check_case(make_case(1, 1, 5, 67, 128, {}, false, 0.5f), 33);
}

TEST_CASE("cuda flash: f32 products (3xTF32) agree with the cpu's f32; TF32 products within "
          "TF32's rounding") {
  if (!clustr::cuda::available()) return;
  for (Products products : {Products::f32, Products::tf32}) {
    check_case(make_case(2, 3, 17, 17, 32, {17, 9}), 91, products);
    check_case(make_case(1, 2, 129, 65, 64), 92, products);
    check_case(make_case(1, 1, 100, 100, 128, {77}, true), 93, products);
    check_case(make_case(2, 1, 70, 70, 64, {70, 33}, true, 0.2f), 94, products);
  }
}

TEST_CASE("cuda flash: a thousand positions, several query blocks and key tiles") {
  if (!clustr::cuda::available()) return;
  check_case(make_case(1, 1, 1000, 1000, 64, {}, true), 41);
  check_case(make_case(1, 1, 300, 300, 128, {}, true), 42, Products::f32);
}

TEST_CASE("cuda flash: uniform weights give the exact mean of the keys each row sees") {
  // K = 0: every score is 0, so each weight is 2^0 = 1 before normalising, exact in bf16, and out
  // is the mean of the values a row sees, summed in f32: a key too many or too few (a mask or a
  // tile boundary one off) moves it by about 1 / (keys seen), far past the sums' rounding.
  if (!clustr::cuda::available()) return;
  for (const Case& c : {make_case(2, 1, 300, 300, 64, {300, 233}, true),
                        make_case(1, 2, 129, 200, 32, {199}), make_case(1, 1, 65, 65, 128)}) {
    INFO(name_of(c));
    Inputs in = make_inputs(c, 51);
    in.K = Tensor::zeros(in.K.shape());
    const Result cpu = run(c, in, Products::cpu), dev = run(c, in, Products::bf16);
    check_rows("out", dev.out, cpu.out, c.E, 1e-5);
    check_rows("logsumexp", dev.lse, cpu.lse, c.N, 1e-6);
  }
}

TEST_CASE("cuda flash: four launches and no cuBLAS call whatever B, H and N; the same bits run "
          "after run") {
  if (!clustr::cuda::available()) return;
  for (const Case& c : {make_case(1, 1, 40, 40, 64), make_case(4, 3, 40, 40, 64),
                        make_case(2, 1, 140, 140, 64, {140, 100}, true, 0.1f)}) {
    INFO(name_of(c));
    const Inputs in = make_inputs(c, 61);
    Result a, b;
    const clustr::cuda::LaunchCounts n = launches_of([&] { a = run(c, in, Products::bf16); });
    CHECK(n.kernels == 4);
    CHECK(n.blas == 0);
    b = run(c, in, Products::bf16);
    CHECK(a.out == b.out);
    CHECK(a.dQ == b.dQ);
    CHECK(a.dK == b.dK);
    CHECK(a.dV == b.dV);
  }
}

TEST_CASE("cuda flash: the fused qkv layout is read and written in place") {
  if (!clustr::cuda::available()) return;
  const int64_t B = 2, N = 37, H = 3, E = 32, D = H * E;
  FullAttentionOptions o;
  o.causal = true;
  o.dropout = 0.2f;
  o.seed = 7;
  const Tensor qkv = bf16_values(clustr::test::random_tensor({B, N, 3 * D}, 71));
  const Tensor dout = bf16_values(clustr::test::random_tensor({B, N, D}, 72));
  const Tensor L = Tensor::from_int_vector({37, 20}, {B});
  std::vector<float> out[2], lse[2], dqkv[2];
  clustr::cuda::LaunchCounts n;
  for (int k = 0; k < 2; ++k) {
    const Device dev = k == 0 ? Device::cpu : Device::cuda;
    o.precision = k == 0 ? Precision::fp32 : Precision::bf16;
    const Tensor x = qkv.to(dev), l = L.to(dev);
    const auto body = [&] {
      const clustr::FullAttentionOutput f = clustr::full_attention_qkv_forward(x, H, l, o);
      const Tensor g =
          clustr::full_attention_qkv_backward(dout.to(dev), x, H, f.out, f.logsumexp, l, o);
      out[k] = f.out.to_vector();
      lse[k] = f.logsumexp.to_vector();
      dqkv[k] = g.to_vector();
    };
    if (k == 1)
      n = launches_of(body);
    else
      body();
  }
  CHECK_MESSAGE(n.kernels == 4, n.kernels << " launches: no permute either way");
  check_rows("out", out[1], out[0], E, kOutTol);
  check_rows("logsumexp", lse[1], lse[0], N, kOutTol);
  check_rows("dqkv", dqkv[1], dqkv[0], E, kGradTol);
}

TEST_CASE("cuda flash: the autograd reference agrees, and other head sizes take the blocked "
          "kernels") {
  if (!clustr::cuda::available()) return;
  const Case c = make_case(2, 1, 33, 33, 32, {33, 21}, true);
  const Inputs in = make_inputs(c, 81);
  Variable Q(in.Q, true), K(in.K, true), V(in.V, true);
  const Variable ref = clustr::full_attention_reference(Q, K, V, in.lengths, c.options);
  ref.backward(in.dO);
  const Result dev = run(c, in, Products::bf16);
  check_rows("out", dev.out, ref.data().to_vector(), c.E, kOutTol);
  check_rows("dQ", dev.dQ, Q.grad().to_vector(), c.E, kGradTol);
  check_rows("dK", dev.dK, K.grad().to_vector(), c.E, kGradTol);
  check_rows("dV", dev.dV, V.grad().to_vector(), c.E, kGradTol);
  // E = 16 (and fp32 products) go to cuBLAS's blocked kernels.
  const Case other = make_case(1, 1, 20, 20, 16);
  const Inputs oin = make_inputs(other, 82);
  CHECK(launches_of([&] { run(other, oin, Products::bf16); }).blas > 0);
}
