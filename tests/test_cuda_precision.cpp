// The bf16 precision policy (core/precision.h) on the CUDA device against the CPU: matmul,
// the linear layer's forward and backward, the feed-forward block's backward, full attention
// forward and backward, the clustered types, and one encoder layer's training step. Part of the
// test_cuda program (tests/test_cuda.cpp has its main).
//
// Tolerances:
// - products: both devices multiply the same bf16 values exactly and add the products in f32
//   in different orders, so they agree as f32 GEMMs do (test_cuda_fused.cpp: inputs in [-2, 2],
//   K <= 129: 2e-5 absolute + 1e-5 relative); on a GPU, tensor cores may add in a wider or
//   narrower internal format, so four times that;
// - full attention: the CPU rounds the weights P to bf16 before normalising them (its online
//   softmax), the device after; each rounding moves a weight by at most u = 2^-8 of itself, so
//   the outputs agree within 2u of their scale, row by row (check_rows);
// - the clustered types: the CPU and the device round the same centroids, keys and weights Ac
//   (f32 values that agree to f32 noise, so a weight may round to the other neighbour, u of
//   itself), as full attention: outputs within 2u of their scale, gradients within 4u;
// - the encoder layer: every gradient within 4u of its scale, row by row.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_cases.h"
#include "autograd/ops.h"
#include "check.h"
#include "core/cuda/cuda.h"
#include "core/ops.h"
#include "core/precision.h"
#include "core/random.h"
#include "cuda_check.h"
#include "layers/attention/clustered.h"
#include "layers/attention/full.h"
#include "layers/attention/improved_clustered.h"
#include "layers/encoder.h"

using namespace clustr;
using clustr::test::check_rows;
using clustr::test::random_tensor;
using clustr::test::ZeroRows;

namespace {

constexpr double kU = 1.0 / 256;  // bf16's unit roundoff, 2^-8

Tensor dev(const Tensor& t) { return t.defined() ? t.to(Device::cuda) : t; }

double gemm_scale() { return cuda::exact_numerics() ? 1.0 : 4.0; }

void check_product(const char* what, const Tensor& got, const Tensor& expected) {
  INFO(what);
  REQUIRE(got.defined() == expected.defined());
  if (!expected.defined()) return;
  CHECK(got.device() == Device::cuda);
  CHECK(got.shape() == expected.shape());
  CHECK_CLOSE(got.to_vector(), expected.to_vector(), 2e-5 * gemm_scale(), 1e-5 * gemm_scale());
}

// The largest |a - b| over the elements (a device's bf16 result against its f32 one).
double max_diff(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to_vector(), y = b.to_vector();
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, double(std::fabs(x[i] - y[i])));
  return d;
}

}  // namespace

TEST_CASE("cuda bf16 policy: matmul of f32 and bf16 operands matches the CPU, rank 2 and 3") {
  for (int rank : {2, 3})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t M = 17, N = 33, K = 129, batch = 3;
        auto shape = [&](int64_t r, int64_t c) {
          return rank == 2 ? Shape{r, c} : Shape{batch, r, c};
        };
        const Tensor A = random_tensor(ta ? shape(K, M) : shape(M, K), 1);
        const Tensor B = random_tensor(tb ? shape(N, K) : shape(K, N), 2);
        INFO("rank ", rank, " ta=", ta, " tb=", tb);
        const Tensor cpu = matmul(A, B, ta, tb, Precision::bf16);
        check_product("f32 operands, bf16 policy", matmul(dev(A), dev(B), ta, tb, Precision::bf16),
                      cpu);
        check_product("bf16 operands",
                      matmul(dev(A).astype(DType::bf16), dev(B).astype(DType::bf16), ta, tb), cpu);
        check_product("mixed operands", matmul(dev(A), dev(B).astype(DType::bf16), ta, tb), cpu);
        // Not the f32 product.
        CHECK(max_diff(matmul(dev(A), dev(B), ta, tb, Precision::bf16),
                       matmul(dev(A), dev(B), ta, tb)) > 1e-3);
      }
}

TEST_CASE("cuda bf16 policy: linear forward and backward, the feed-forward backward") {
  const int64_t R = 37, in = 24, out = 19, F = 40;
  const Tensor x = random_tensor({R, in}, 3), W = random_tensor({out, in}, 4);
  const Tensor b = random_tensor({out}, 5), dy = random_tensor({R, out}, 6);
  for (bool relu : {false, true}) {
    INFO("relu ", relu);
    check_product("linear_forward", linear_forward(dev(x), dev(W), dev(b), relu, Precision::bf16),
                  linear_forward(x, W, b, relu, Precision::bf16));
  }
  const LinearGrads g = linear_backward(dev(dy), dev(x), dev(W), true, true, true,
                                        Precision::bf16);
  const LinearGrads c = linear_backward(dy, x, W, true, true, true, Precision::bf16);
  check_product("dx", g.dx, c.dx);
  check_product("dW", g.dW, c.dW);
  check_product("db", g.db, c.db);
  const Tensor W1 = random_tensor({F, in}, 7), b1 = random_tensor({F}, 8);
  const Tensor W2 = random_tensor({out, F}, 9);
  // The hidden layer stored in bf16 (as the bf16 policy stores it) and in f32.
  const Tensor H16 = linear_forward(x, W1, b1, true, Precision::bf16, DType::bf16);
  const Tensor H16_dev = linear_forward(dev(x), dev(W1), dev(b1), true, Precision::bf16,
                                        DType::bf16);
  CHECK(H16_dev.dtype() == DType::bf16);
  check_product("linear_forward, bf16 result", H16_dev.astype(DType::f32),
                H16.astype(DType::f32));
  for (DType hidden : {DType::f32, DType::bf16}) {
    INFO("H ", to_string(hidden));
    const Tensor H = hidden == DType::bf16 ? H16 : linear_forward(x, W1, b1, true,
                                                                  Precision::bf16);
    const FeedForwardGrads fg = feed_forward_relu_backward(dev(dy), dev(x), dev(W1), dev(W2),
                                                           dev(H), {}, Precision::bf16);
    const FeedForwardGrads fc = feed_forward_relu_backward(dy, x, W1, W2, H, {}, Precision::bf16);
    check_product("ff dx", fg.dx, fc.dx);
    check_product("ff dW1", fg.dW1, fc.dW1);
    check_product("ff db1", fg.db1, fc.db1);
    check_product("ff dW2", fg.dW2, fc.dW2);
    check_product("ff db2", fg.db2, fc.db2);
  }
}

TEST_CASE("cuda bf16 policy: full attention forward and backward match the CPU") {
  const int64_t B = 2, H = 3, N = 45, E = 16;
  const Tensor Q = random_tensor({B, H, N, E}, 10), K = random_tensor({B, H, N, E}, 11);
  const Tensor V = random_tensor({B, H, N, E}, 12), dout = random_tensor({B, H, N, E}, 13);
  const Tensor lengths = Tensor::from_int_vector({45, 30}, {B});
  for (bool causal : {false, true}) {
    INFO("causal ", causal);
    FullAttentionOptions o;
    o.causal = causal;
    o.precision = Precision::bf16;
    const FullAttentionOutput c = full_attention_forward(Q, K, V, lengths, o);
    const FullAttentionOutput g = full_attention_forward(dev(Q), dev(K), dev(V), dev(lengths), o);
    check_rows("out", g.out.to_vector(), c.out.to_vector(), E, 2 * kU, ZeroRows::exact);
    const FullAttentionGrads gc =
        full_attention_backward(dout, Q, K, V, c.out, c.logsumexp, lengths, o);
    const FullAttentionGrads gg = full_attention_backward(
        dev(dout), dev(Q), dev(K), dev(V), g.out, g.logsumexp, dev(lengths), o);
    // Row 0 of a causal dQ is 0 in exact arithmetic (the first query sees one key, whose
    // weight is 1, so dS = dP - D = 0): the CPU gets 0 exactly (D from the tile), the device
    // the difference of two terms of size |dO| |V| rounded differently (D = dO . O in f32, dP
    // from the rounded dO and V), bf16 noise of those terms. Those rows are left out here.
    std::vector<float> dq_dev = gg.dQ.to_vector(), dq_cpu = gc.dQ.to_vector();
    if (causal)
      for (int64_t bh = 0; bh < B * H; ++bh)
        for (int64_t e = 0; e < E; ++e) dq_dev[bh * N * E + e] = dq_cpu[bh * N * E + e] = 0.0f;
    check_rows("dQ", dq_dev, dq_cpu, E, 4 * kU, ZeroRows::exact);
    check_rows("dK", gg.dK.to_vector(), gc.dK.to_vector(), E, 4 * kU, ZeroRows::exact);
    check_rows("dV", gg.dV.to_vector(), gc.dV.to_vector(), E, 4 * kU, ZeroRows::exact);
    // The device's bf16 output is not its f32 one.
    FullAttentionOptions f32 = o;
    f32.precision = Precision::fp32;
    CHECK(max_diff(g.out, full_attention_forward(dev(Q), dev(K), dev(V), dev(lengths), f32).out) >
          1e-4);
  }
}

TEST_CASE("cuda bf16 policy: clustered and improved-clustered attention match the CPU") {
  const test::AttentionCase c{2, 3, 45, 45, 16, 16, 6, 8, {45, 30}};
  const test::AttentionInputs in = test::make_attention_inputs(c, 40);
  for (bool improved : {false, true}) {
    INFO(std::string(improved ? "improved-clustered" : "clustered"));
    // out, dQ, dK, dV and (improved) the top-k sets, in the given precision on device d.
    auto run = [&](Device d, Precision p) {
      const Tensor Q = in.Q.to(d), K = in.K.to(d), V = in.V.to(d), L = in.lengths.to(d),
                   A = in.assignment.to(d), dO = in.dO.to(d);
      if (improved) {
        const ImprovedClusteredAttentionOutput f = improved_clustered_attention_forward(
            Q, K, V, L, A, c.C, c.k, 0.0f, {}, p);
        const ImprovedClusteredAttentionGrads g =
            improved_clustered_attention_backward(dO, Q, K, V, L, A, f);
        return std::make_pair(std::vector<Tensor>{f.out, g.dQ, g.dK, g.dV},
                              f.topk.to_int_vector());
      }
      const ClusteredAttentionOutput f =
          clustered_attention_forward(Q, K, V, L, A, c.C, 0.0f, {}, p);
      const ClusteredAttentionGrads g = clustered_attention_backward(dO, K, V, L, A, f);
      return std::make_pair(std::vector<Tensor>{f.out, g.dQ, g.dK, g.dV},
                            std::vector<int32_t>{});
    };
    const auto cpu = run(Device::cpu, Precision::bf16), gpu = run(Device::cuda, Precision::bf16);
    if (improved) CHECK(gpu.second == cpu.second);  // the top-k sets
    const char* names[] = {"out", "dQ", "dK", "dV"};
    for (int i = 0; i < 4; ++i)
      check_rows(names[i], gpu.first[i].to_vector(), cpu.first[i].to_vector(), c.E,
                 (i == 0 ? 2 : 4) * kU, ZeroRows::exact);
    // The device's bf16 output is not its f32 one.
    CHECK(max_diff(gpu.first[0], run(Device::cuda, Precision::fp32).first[0]) > 1e-4);
  }
}

TEST_CASE("cuda bf16 policy: an encoder layer's training step matches the CPU") {
  const int64_t B = 2, N = 20, D = 32, H = 4, F = 64;
  for (bool full : {true, false}) {
    INFO(std::string(full ? "full attention" : "clustered attention"));
    AttentionConfig a;
    if (!full) {
      a.type = AttentionType::clustered;
      a.clusters = 4;
    }
    Generator init(3);
    EncoderLayer cpu_layer(D, H, F, a, 0.0f, Activation::relu, false, init);
    Generator init2(3);
    EncoderLayer dev_layer(D, H, F, a, 0.0f, Activation::relu, false, init2);
    dev_layer.to(Device::cuda);
    const Tensor x0 = random_tensor({B, N, D}, 14), g0 = random_tensor({B, N, D}, 15);
    auto step = [&](EncoderLayer& layer, Device d) {
      Variable x(x0.to(d), true);
      const PrecisionScope s(Precision::bf16);
      Generator g(5);
      const Variable y = layer.forward(x, Tensor(), g);
      y.backward(g0.to(d));
      std::vector<Tensor> out = {y.data(), x.grad()};
      for (const auto& [name, v] : layer.named_parameters()) out.push_back(v.grad());
      return out;
    };
    const std::vector<Tensor> c = step(cpu_layer, Device::cpu), g = step(dev_layer, Device::cuda);
    const auto names = cpu_layer.named_parameters();
    for (size_t i = 0; i < c.size(); ++i) {
      const std::string what = i == 0 ? "y" : i == 1 ? "dx" : names[i - 2].first;
      if (what == "attention.key.bias") continue;  // zero in exact arithmetic: noise only
      INFO(what);
      check_rows(what.c_str(), g[i].to_vector(), c[i].to_vector(), c[i].shape().back(), 4 * kU,
                 ZeroRows::scaled);
    }
  }
}
