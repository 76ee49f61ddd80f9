// Full attention (layers/attention/full.h) on the device against the CPU, through the front
// doors: forward out and logsumexp, backward dQ, dK, dV, on awkward shapes (B, H, N, S, E, M):
// sizes 1, 17, 129, N != S, E != M, N not a multiple of the device's query block and several
// blocks; key lengths (0, partial, full), causal, dropout (the same seed gives the same mask on
// both devices), the fused qkv variant, the differentiable op through autograd, and a bound on
// the device memory that forward + backward take (no N x S matrix). Part of the test_cuda
// program (tests/test_cuda.cpp has its main): run on a GPU or on the emulated device, skipped
// elsewhere.
//
// Tolerance: the products' sums run in another order on the device (cuBLAS, a tree over the
// block for the row sums) than on the CPU (cpu::gemm, 16 lanes), so each row of a result is
// compared with a relative tolerance (kRowTol) of its scale: its largest element, but at least a
// tenth of the whole tensor's, since a row can cancel (the first row of causal attention sees
// one key, so its dQ is 0 in exact arithmetic and a rounding error of its terms in practice).
// Rows that see no key (padded queries, sequences of length 0) must be exactly 0 on the device,
// their logsumexp -inf, as on the cpu.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "check.h"
#include "cuda_check.h"
#include "core/cuda/cuda.h"
#include "core/tensor.h"
#include "layers/attention/full.h"
#include "layers/attention/oracle_top.h"

using clustr::Device;
using clustr::FullAttentionOptions;
using clustr::Tensor;
using clustr::Variable;
using clustr::test::on;
using clustr::test::random_tensor;

namespace {

constexpr double kRowTol = 2e-5;

struct Case {
  int64_t B = 1, H = 1, N = 1, S = 1, E = 1, M = 1;
  std::vector<int32_t> lengths;  // empty: no key mask
  FullAttentionOptions options;
};

std::string name_of(const Case& c) {
  std::ostringstream os;
  os << "(B, H, N, S, E, M) = (" << c.B << ", " << c.H << ", " << c.N << ", " << c.S << ", "
     << c.E << ", " << c.M << ")";
  if (!c.lengths.empty()) {
    os << " lengths {";
    for (size_t i = 0; i < c.lengths.size(); ++i) os << (i ? ", " : "") << c.lengths[i];
    os << "}";
  }
  if (c.options.causal) os << " causal";
  if (c.options.dropout > 0) os << " dropout " << c.options.dropout;
  return os.str();
}

// actual (device) against expected (cpu), viewed as rows of `width`: each element within kRowTol
// times its row's scale (above); -inf must match. Prints the worst element on failure.
void check_rows(const char* what, const std::vector<float>& actual,
                const std::vector<float>& expected, int64_t width) {
  clustr::test::check_rows(what, actual, expected, width, kRowTol,
                           clustr::test::ZeroRows::scaled);
}

struct Inputs {
  Tensor Q, K, V, dO, lengths;  // on the cpu
};
Inputs make_inputs(const Case& c, uint32_t seed) {
  Inputs in;
  in.Q = random_tensor({c.B, c.H, c.N, c.E}, seed);
  in.K = random_tensor({c.B, c.H, c.S, c.E}, seed + 1);
  in.V = random_tensor({c.B, c.H, c.S, c.M}, seed + 2);
  in.dO = random_tensor({c.B, c.H, c.N, c.M}, seed + 3);
  if (!c.lengths.empty()) in.lengths = Tensor::from_int_vector(c.lengths, {c.B});
  return in;
}

struct Result {
  std::vector<float> out, lse, dQ, dK, dV;
};
Result run(const Case& c, const Inputs& in, Device dev) {
  const Tensor Q = on(in.Q, dev), K = on(in.K, dev), V = on(in.V, dev), L = on(in.lengths, dev);
  const clustr::FullAttentionOutput f = clustr::full_attention_forward(Q, K, V, L, c.options);
  const clustr::FullAttentionGrads g = clustr::full_attention_backward(
      on(in.dO, dev), Q, K, V, f.out, f.logsumexp, L, c.options);
  CHECK(f.out.device() == dev);
  CHECK(g.dK.device() == dev);
  return {f.out.to_vector(), f.logsumexp.to_vector(), g.dQ.to_vector(), g.dK.to_vector(),
          g.dV.to_vector()};
}

void check_case(const Case& c, uint32_t seed) {
  INFO(name_of(c));
  const Inputs in = make_inputs(c, seed);
  const Result cpu = run(c, in, Device::cpu), dev = run(c, in, Device::cuda);
  check_rows("out", dev.out, cpu.out, c.M);
  check_rows("logsumexp", dev.lse, cpu.lse, c.N);
  check_rows("dQ", dev.dQ, cpu.dQ, c.E);
  check_rows("dK", dev.dK, cpu.dK, c.E);
  check_rows("dV", dev.dV, cpu.dV, c.M);
  // Rows that see no key: exactly 0 (out, dQ) and -inf.
  int64_t wrong = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t L = c.lengths.empty() ? c.S : c.lengths[b];
    const int64_t first = L == 0 ? 0 : (!c.lengths.empty() && c.N == c.S) ? L : c.N;
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t i = first; i < c.N; ++i) {
        const int64_t row = (b * c.H + h) * c.N + i;
        wrong += dev.lse[row] != -INFINITY;
        for (int64_t m = 0; m < c.M; ++m) wrong += dev.out[row * c.M + m] != 0.0f;
        for (int64_t e = 0; e < c.E; ++e) wrong += dev.dQ[row * c.E + e] != 0.0f;
      }
  }
  CHECK_MESSAGE(wrong == 0, wrong << " elements of rows that see no key are not 0 / -inf");
}

Case make_case(int64_t B, int64_t H, int64_t N, int64_t S, int64_t E, int64_t M,
               std::vector<int32_t> lengths = {}, bool causal = false, float dropout = 0.0f) {
  Case c{B, H, N, S, E, M, std::move(lengths), {}};
  c.options.causal = causal;
  c.options.dropout = dropout;
  c.options.seed = 1234;
  c.options.offset = 77;
  return c;
}

}  // namespace

TEST_CASE("cuda attention: forward and backward match the cpu on awkward shapes") {
  check_case(make_case(1, 1, 1, 1, 1, 1), 1);
  check_case(make_case(2, 3, 17, 17, 8, 8), 2);
  check_case(make_case(1, 2, 129, 65, 16, 32), 3);
  check_case(make_case(2, 1, 3, 129, 5, 3), 4);
  Case t = make_case(1, 2, 17, 9, 4, 6);
  t.options.temperature = 0.7f;
  check_case(t, 5);
}

TEST_CASE("cuda attention: key lengths (0, partial, full) with padded queries, and causal") {
  check_case(make_case(3, 2, 17, 17, 8, 8, {17, 5, 0}), 11);
  check_case(make_case(2, 2, 17, 23, 4, 3, {0, 23}), 12);  // N != S: no query padding
  check_case(make_case(2, 3, 33, 33, 8, 5, {}, true), 13);
  check_case(make_case(3, 2, 33, 33, 8, 5, {33, 1, 20}, true), 14);
  check_case(make_case(1, 1, 1, 1, 1, 1, {0}, true), 15);
  // Runs of equal lengths share their products and launches (cuda/full.cu): runs with padded
  // rows, with no key at all, and a run ended by another length.
  check_case(make_case(7, 2, 17, 17, 8, 8, {5, 5, 17, 17, 17, 0, 0}), 16);
  check_case(make_case(4, 2, 33, 33, 8, 5, {20, 20, 20, 33}, true), 17);
}

TEST_CASE("cuda attention: the launches of a step do not grow with the batch when the lengths "
          "are equal") {
  clustr::cuda::LaunchCounts per_batch[2];
  const int64_t batches[2] = {2, 8};
  for (int i = 0; i < 2; ++i) {
    const int64_t B = batches[i];
    const Case c = make_case(B, 2, 40, 40, 8, 8, std::vector<int32_t>(size_t(B), 31), true);
    const Inputs in = make_inputs(c, 18);
    const clustr::cuda::LaunchCounts before = clustr::cuda::launch_counts();
    run(c, in, Device::cuda);
    const clustr::cuda::LaunchCounts after = clustr::cuda::launch_counts();
    per_batch[i] = {after.kernels - before.kernels, after.blas - before.blas};
  }
  INFO("batch 2: " << per_batch[0].kernels << " + " << per_batch[0].blas << ", batch 8: "
                   << per_batch[1].kernels << " + " << per_batch[1].blas);
  CHECK(per_batch[1].kernels == per_batch[0].kernels);
  CHECK(per_batch[1].blas == per_batch[0].blas);
  CHECK(per_batch[0].blas > 0);
}

TEST_CASE("cuda attention: several query blocks, N not a multiple of the block") {
  check_case(make_case(1, 2, 300, 300, 16, 16, {277}, true), 21);
  check_case(make_case(2, 1, 300, 170, 8, 12, {170, 99}), 22);
}

TEST_CASE("cuda attention: dropout draws the cpu's mask from the same seed") {
  check_case(make_case(2, 2, 17, 19, 4, 3, {19, 11}, false, 0.3f), 31);
  check_case(make_case(1, 2, 260, 260, 8, 8, {250}, true, 0.3f), 32);
  check_case(make_case(2, 1, 5, 130, 3, 4, {}, false, 0.3f), 33);
  check_case(make_case(3, 2, 150, 150, 4, 4, {140, 140, 140}, true, 0.3f), 35);  // one run
  // Another seed gives another mask.
  Case c = make_case(1, 1, 9, 9, 4, 4, {}, false, 0.3f);
  const Inputs in = make_inputs(c, 34);
  const Result a = run(c, in, Device::cuda);
  c.options.seed = 1235;
  CHECK(a.out != run(c, in, Device::cuda).out);
}

TEST_CASE("cuda attention: the fused qkv variant matches the cpu") {
  struct QkvCase {
    int64_t B, N, H, E;
    std::vector<int32_t> lengths;
    bool causal;
    float dropout;
  };
  for (const QkvCase& q : {QkvCase{1, 1, 1, 1, {}, false, 0.0f},
                           QkvCase{2, 37, 3, 8, {37, 20}, true, 0.3f},
                           QkvCase{2, 150, 2, 4, {0, 140}, false, 0.0f}}) {
    CAPTURE(q.B);
    CAPTURE(q.N);
    CAPTURE(q.H);
    CAPTURE(q.E);
    FullAttentionOptions o;
    o.causal = q.causal;
    o.dropout = q.dropout;
    o.seed = 99;
    o.offset = 5;
    const int64_t D = q.H * q.E;
    const Tensor qkv = random_tensor({q.B, q.N, 3 * D}, 41);
    const Tensor dout = random_tensor({q.B, q.N, D}, 42);
    const Tensor L = q.lengths.empty() ? Tensor() : Tensor::from_int_vector(q.lengths, {q.B});
    std::vector<float> out[2], lse[2], dqkv[2];
    for (int k = 0; k < 2; ++k) {
      const Device dev = k == 0 ? Device::cpu : Device::cuda;
      const Tensor x = qkv.to(dev), l = on(L, dev);
      const clustr::FullAttentionOutput f = clustr::full_attention_qkv_forward(x, q.H, l, o);
      const Tensor g =
          clustr::full_attention_qkv_backward(dout.to(dev), x, q.H, f.out, f.logsumexp, l, o);
      CHECK(g.device() == dev);
      CHECK(g.shape() == qkv.shape());
      out[k] = f.out.to_vector();
      lse[k] = f.logsumexp.to_vector();
      dqkv[k] = g.to_vector();
    }
    check_rows("out", out[1], out[0], q.E);
    check_rows("logsumexp", lse[1], lse[0], q.N);
    check_rows("dqkv", dqkv[1], dqkv[0], q.E);
  }
}

TEST_CASE("cuda attention: the differentiable op runs backward on the device") {
  const Case c = make_case(2, 2, 21, 21, 8, 6, {21, 13}, true, 0.3f);
  const Inputs in = make_inputs(c, 51);
  const Result cpu = run(c, in, Device::cpu);
  Variable Q(in.Q.to(Device::cuda), true), K(in.K.to(Device::cuda), true),
      V(in.V.to(Device::cuda), true);
  const Variable out = clustr::full_attention(Q, K, V, in.lengths.to(Device::cuda), c.options);
  CHECK(out.data().device() == Device::cuda);
  out.backward(in.dO.to(Device::cuda));
  REQUIRE(Q.grad().defined());
  CHECK(Q.grad().device() == Device::cuda);
  check_rows("out", out.data().to_vector(), cpu.out, c.M);
  check_rows("dQ", Q.grad().to_vector(), cpu.dQ, c.E);
  check_rows("dK", K.grad().to_vector(), cpu.dK, c.E);
  check_rows("dV", V.grad().to_vector(), cpu.dV, c.M);
}

TEST_CASE("cuda attention: forward + backward memory stays far below one N x S matrix") {
  // One head, N = S = 1024: its N x S matrix alone would take 4 MiB. The inputs, outputs and
  // gradients take 8 x 1024 x 8 floats (0.25 MiB); the score blocks are bounded by the device's
  // query block (128 rows of 1024 keys, two of them in backward: 1 MiB).
  const Case c = make_case(1, 1, 1024, 1024, 8, 8, {}, true);
  const Inputs in = make_inputs(c, 61);
  const Tensor Q = in.Q.to(Device::cuda), K = in.K.to(Device::cuda), V = in.V.to(Device::cuda),
               dO = in.dO.to(Device::cuda);
  clustr::reset_peak_memory(Device::cuda);
  const int64_t before = clustr::memory_stats(Device::cuda).live_bytes;
  {
    const clustr::FullAttentionOutput f =
        clustr::full_attention_forward(Q, K, V, Tensor(), c.options);
    const clustr::FullAttentionGrads g =
        clustr::full_attention_backward(dO, Q, K, V, f.out, f.logsumexp, Tensor(), c.options);
    CHECK(std::isfinite(g.dQ.to_vector()[0]));
  }
  const int64_t used = clustr::memory_stats(Device::cuda).peak_bytes - before;
  const int64_t matrix = c.N * c.S * int64_t(sizeof(float));
  INFO("peak device memory over the inputs: " << used << " bytes; one N x S matrix: " << matrix);
  CHECK(used < matrix / 3);
  CHECK(clustr::memory_stats(Device::cuda).live_bytes == before);
}

TEST_CASE("cuda attention: oracle-top on device tensors equals the cpu's, and stays there") {
  // Evaluated on a host copy (layers/attention/oracle_top.h): the same bits either way.
  const Tensor Q = random_tensor({2, 3, 11, 8}, 71), K = random_tensor({2, 3, 11, 8}, 72);
  const Tensor V = random_tensor({2, 3, 11, 5}, 73);
  const Tensor lengths = Tensor::from_int_vector({11, 7}, {2});
  clustr::test::compare_devices(
      [](const clustr::test::Inputs& x) {
        return clustr::oracle_top_attention(Variable(x[0]), Variable(x[1]), Variable(x[2]), x[3],
                                            3)
            .data();
      },
      {Q, K, V, lengths}, 0);
}
