// Clustered attention for a fixed clustering (layers/attention/clustered.h, the paper's eq. 3-6):
// one query per cluster equals full attention (values and gradients); the plain reference
// (layers/attention/reference.h) for random assignments with padded queries, empty clusters and
// sequences without keys over sizes 1, 3, 17, 129 with N != S and E != M; gradcheck; padding
// invariance (NaN in padded keys and values changes nothing); identical results at 1 and 2
// threads, also for one sequence and one head with many clusters (the work shared inside the
// pair); attention dropout (the reference with the documented mask, p = 0 is no dropout, none
// in evaluation, gradcheck with a fixed mask, the mean over many masks, thread independence);
// the attention() dispatcher and MultiHeadAttention end to end; argument errors.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "attention_cases.h"
#include "check.h"
#include "core/random.h"
#include "layers/attention/attention.h"
#include "layers/attention/clustered.h"
#include "layers/attention/clustering.h"
#include "layers/attention/full.h"
#include "layers/attention/reference.h"
#include "layers/multihead_attention.h"

using namespace clustr;
using namespace clustr::test;

namespace {

using Case = AttentionCase;
using Inputs = AttentionInputs;
using Result = AttentionResult;

// The plain reference of eq. 3-6 (layers/attention/reference.h), its gradients from autograd.
Result reference(const Case& c, const Inputs& in, const ClusteredDropout& drop = {}) {
  return autograd_result(in, [&](const Variable& Q, const Variable& K, const Variable& V) {
    return clustered_attention_reference(Q, K, V, in.lengths, in.assignment, c.C, c.temperature,
                                         drop);
  });
}

Result run(const Case& c, const Inputs& in, const ClusteredDropout& drop = {}) {
  const ClusteredAttentionOutput f = clustered_attention_forward(
      in.Q, in.K, in.V, in.lengths, in.assignment, c.C, c.temperature, drop);
  const ClusteredAttentionGrads g = clustered_attention_backward(
      in.dO, in.K, in.V, in.lengths, in.assignment, f, c.temperature);
  return {f.out.to_vector(), g.dQ.to_vector(), g.dK.to_vector(), g.dV.to_vector()};
}

Case make_case(int64_t B, int64_t H, int64_t N, int64_t S, int64_t E, int64_t M, int64_t C,
               std::vector<int32_t> lengths = {}) {
  Case c;
  c.B = B, c.H = H, c.N = N, c.S = S, c.E = E, c.M = M, c.C = C;
  c.lengths = std::move(lengths);
  return c;
}

}  // namespace

TEST_CASE("clustered attention: one query per cluster is full attention, values and gradients") {
  // eq. 4-5 with singleton clusters: Qc_i = Q_i, so Ac is full attention's A (eq. 1-2).
  for (const Case& c : {make_case(2, 2, 17, 17, 5, 3, 17, {17, 9}), make_case(1, 3, 3, 3, 4, 7, 3),
                        make_case(2, 1, 129, 129, 8, 16, 129, {129, 40})}) {
    INFO(name_of(c));
    Inputs in = make_attention_inputs(c, 7);
    std::vector<int32_t> a(static_cast<size_t>(c.B * c.H * c.N));
    for (int64_t bh = 0; bh < c.B * c.H; ++bh)
      for (int64_t i = 0; i < c.N; ++i)  // padded queries (self-attention) have no cluster
        a[bh * c.N + i] = c.lengths.empty() || i < c.lengths[bh / c.H] ? int32_t(i) : -1;
    in.assignment = Tensor::from_int_vector(a, {c.B, c.H, c.N});
    const Result r = run(c, in);
    const FullAttentionOutput f = full_attention_forward(in.Q, in.K, in.V, in.lengths, {});
    const FullAttentionGrads g =
        full_attention_backward(in.dO, in.Q, in.K, in.V, f.out, f.logsumexp, in.lengths, {});
    CHECK_CLOSE(r.out, f.out.to_vector(), 2e-6, 2e-5);
    CHECK_CLOSE(r.dQ, g.dQ.to_vector(), 1e-5, 1e-4);
    CHECK_CLOSE(r.dK, g.dK.to_vector(), 1e-5, 1e-4);
    CHECK_CLOSE(r.dV, g.dV.to_vector(), 1e-5, 1e-4);
  }
}

TEST_CASE("clustered attention: matches the plain reference (padding, empty clusters)") {
  uint32_t seed = 100;
  for (const Case& c :
       {make_case(1, 1, 1, 1, 1, 1, 1), make_case(2, 3, 3, 17, 5, 3, 4, {17, 1}),
        make_case(1, 2, 17, 3, 4, 7, 3), make_case(2, 1, 129, 129, 8, 16, 10, {129, 0}),
        make_case(1, 1, 3, 129, 17, 1, 5), make_case(2, 2, 129, 17, 3, 5, 129, {17, 6}),
        make_case(1, 2, 17, 129, 16, 8, 1, {70})}) {
    INFO(name_of(c));
    const Inputs in = make_attention_inputs(c, seed += 10);
    const Result r = run(c, in), e = reference(c, in);
    CHECK_CLOSE(r.out, e.out, 2e-6, 2e-5);
    CHECK_CLOSE(r.dQ, e.dQ, 1e-5, 1e-4);
    CHECK_CLOSE(r.dK, e.dK, 1e-5, 1e-4);
    CHECK_CLOSE(r.dV, e.dV, 1e-5, 1e-4);
  }
  // A temperature other than 1/sqrt(E).
  Case c = make_case(1, 2, 17, 19, 4, 3, 4, {11});
  c.temperature = 0.7f;
  const Inputs in = make_attention_inputs(c, 5);
  const Result r = run(c, in), e = reference(c, in);
  CHECK_CLOSE(r.out, e.out, 2e-6, 2e-5);
  CHECK_CLOSE(r.dQ, e.dQ, 1e-5, 1e-4);
  CHECK_CLOSE(r.dK, e.dK, 1e-5, 1e-4);
}

TEST_CASE("clustered attention: forward outputs hold the centroids, weights and counts") {
  const Case c = make_case(1, 1, 4, 3, 2, 2, 3, {2});
  Inputs in = make_attention_inputs(c, 9);
  in.assignment = Tensor::from_int_vector({1, -1, 1, 0}, {1, 1, 4});
  const ClusteredAttentionOutput f =
      clustered_attention_forward(in.Q, in.K, in.V, in.lengths, in.assignment, 3);
  const std::vector<float> q = in.Q.to_vector(), qc = f.centroids.to_vector(),
                           w = f.weights.to_vector();
  CHECK(f.counts.to_int_vector() == std::vector<int32_t>{1, 2, 0});
  CHECK(qc[0] == q[6]);  // cluster 0 = query 3
  CHECK(qc[2] == doctest::Approx((q[0] + q[4]) / 2));
  CHECK(qc[4] == 0.0f);  // empty cluster
  for (int j = 0; j < 2; ++j) {  // rows sum to 1 over the 2 valid keys; the masked key is 0
    CHECK(w[j * 3] + w[j * 3 + 1] == doctest::Approx(1.0f));
    CHECK(w[j * 3 + 2] == 0.0f);
  }
  CHECK(w[6] == 0.0f);
  CHECK(w[7] == 0.0f);
  CHECK(w[8] == 0.0f);
}

TEST_CASE("clustered attention: gradcheck of Q, K and V for a fixed assignment") {
  const Case c = make_case(2, 2, 6, 5, 3, 2, 4, {5, 3});
  Inputs in = make_attention_inputs(c, 31);
  // Every case at once: cluster 3 empty, padded queries (-1), singleton and shared clusters.
  in.assignment = Tensor::from_int_vector(
      {0, 1, 0, 2, -1, 1, 2, 2, 2, 0, -1, -1, 0, 0, 1, 1, 2, 0, 1, -1, 0, 0, 0, 2}, {2, 2, 6});
  const Tensor assignment = in.assignment, lengths = in.lengths;
  check_grad(
      "key lengths, padded queries, empty cluster",
      [&](const std::vector<Variable>& x) {
        return clustered_attention(x[0], x[1], x[2], lengths, assignment, 4);
      },
      {in.Q, in.K, in.V});
  check_grad(
      "no lengths, temperature 0.6",
      [&](const std::vector<Variable>& x) {
        return clustered_attention(x[0], x[1], x[2], {}, assignment, 4, 0.6f);
      },
      {in.Q, in.K, in.V});
}

TEST_CASE("clustered attention: padded keys and values change nothing, even NaN") {
  const Case c = make_case(2, 2, 9, 7, 4, 3, 3, {5, 2});
  const Inputs in = make_attention_inputs(c, 41);
  Inputs nan = in;
  nan.K = in.K.clone();
  nan.V = in.V.clone();
  float* k = nan.K.f32();
  float* v = nan.V.f32();
  for (int64_t bh = 0; bh < c.B * c.H; ++bh)
    for (int64_t s = c.lengths[bh / c.H]; s < c.S; ++s) {
      for (int64_t e = 0; e < c.E; ++e) k[(bh * c.S + s) * c.E + e] = NAN;
      for (int64_t m = 0; m < c.M; ++m) v[(bh * c.S + s) * c.M + m] = 1e30f;
    }
  const Result a = run(c, in), b = run(c, nan);
  CHECK(a.out == b.out);
  CHECK(a.dQ == b.dQ);
  CHECK(a.dK == b.dK);
  CHECK(a.dV == b.dV);
  for (int64_t bh = 0; bh < c.B * c.H; ++bh)  // and masked keys get no gradient
    for (int64_t s = c.lengths[bh / c.H]; s < c.S; ++s)
      CHECK(a.dK[(bh * c.S + s) * c.E] == 0.0f);
}

TEST_CASE("clustered attention: identical results at 1 and 2 threads") {
  const Case c = make_case(3, 2, 65, 40, 8, 6, 5, {40, 17, 33});
  const Inputs in = make_attention_inputs(c, 51);
  check_thread_independent([&] { return run(c, in); });
}

TEST_CASE("clustered attention: one sequence, one head, many clusters: shared by the threads") {
  // B = H = 1: with 2 threads every step of the pair is shared (centroids and sums by cluster,
  // products by the GEMM's threads, softmax rows, query rows); results must equal 1 thread's
  // bit for bit and the plain reference.
  for (const Case& c :
       {make_case(1, 1, 700, 900, 16, 12, 150, {850}), make_case(1, 1, 1500, 1500, 8, 8, 400),
        make_case(1, 1, 64, 2000, 4, 3, 70)}) {
    INFO(name_of(c));
    const Inputs in = make_attention_inputs(c, 81);
    check_thread_independent([&] { return run(c, in); });
    const Result r = run(c, in), e = reference(c, in);
    CHECK_CLOSE(r.out, e.out, 2e-6, 2e-5);
    CHECK_CLOSE(r.dQ, e.dQ, 1e-5, 1e-4);
    CHECK_CLOSE(r.dK, e.dK, 1e-5, 1e-4);
    CHECK_CLOSE(r.dV, e.dV, 1e-5, 1e-4);
  }
}

TEST_CASE("clustered attention dropout: the documented mask on Ac, shared by a cluster") {
  const ClusteredDropout drop{0.3f, 77, 1000};
  uint32_t seed = 500;
  for (const Case& c :
       {make_case(2, 3, 17, 19, 5, 3, 4, {19, 7}), make_case(1, 1, 129, 129, 8, 6, 10),
        make_case(1, 1, 600, 500, 8, 4, 90, {480})}) {
    INFO(name_of(c));
    const Inputs in = make_attention_inputs(c, seed += 10);
    const Result r = run(c, in, drop), e = reference(c, in, drop);
    CHECK_CLOSE(r.out, e.out, 2e-6, 2e-5);
    CHECK_CLOSE(r.dQ, e.dQ, 1e-5, 1e-4);
    CHECK_CLOSE(r.dK, e.dK, 1e-5, 1e-4);
    CHECK_CLOSE(r.dV, e.dV, 1e-5, 1e-4);
    CHECK(r.out != run(c, in).out);  // the mask does something
    // Members of one cluster share the mask, so their rows are still equal.
    const std::vector<int32_t> a = in.assignment.to_int_vector();
    for (int64_t i = 1; i < c.N; ++i)
      if (a[i] >= 0 && a[i] == a[0])
        for (int64_t m = 0; m < c.M; ++m) CHECK(r.out[i * c.M + m] == r.out[m]);
    check_thread_independent([&] { return run(c, in, drop); });
  }
  // p = 0 is no dropout, whatever the stream.
  const Case c = make_case(2, 2, 20, 20, 4, 4, 3, {20, 11});
  const Inputs in = make_attention_inputs(c, 3);
  const Result none = run(c, in), zero = run(c, in, {0.0f, 5, 9});
  CHECK(none.out == zero.out);
  CHECK(none.dQ == zero.dQ);
  CHECK(none.dK == zero.dK);
  CHECK(none.dV == zero.dV);
  // Another stream, another mask.
  CHECK(run(c, in, drop).out != run(c, in, {0.3f, 78, 1000}).out);
  CHECK(run(c, in, drop).out != run(c, in, {0.3f, 77, 1001}).out);
}

TEST_CASE("clustered attention dropout: gradcheck with a fixed mask") {
  const Case c = make_case(2, 2, 6, 5, 3, 2, 4, {5, 3});
  const Inputs in = make_attention_inputs(c, 31);
  const Tensor assignment = Tensor::from_int_vector(
      {0, 1, 0, 2, -1, 1, 2, 2, 2, 0, -1, -1, 0, 0, 1, 1, 2, 0, 1, -1, 0, 0, 0, 2}, {2, 2, 6});
  const Tensor lengths = in.lengths;
  check_grad(
      "dropout 0.4, the same mask in every evaluation",
      [&](const std::vector<Variable>& x) {
        return clustered_attention(x[0], x[1], x[2], lengths, assignment, 4, 0.0f,
                                   {0.4f, 123, 7});
      },
      {in.Q, in.K, in.V});
}

TEST_CASE("clustered attention dropout: the mean over many masks is the output without dropout") {
  // Inverted dropout keeps the expectation: E[Ac D / (1 - p)] = Ac. Values in [0.5, 1.5] keep
  // every output near 1, so a wrong scale (say 1 instead of 1 / (1 - p), 30% low) cannot pass.
  // Each output is a sum over 6 keys of weights ~1/6: its standard deviation under p = 0.3 is
  // about 0.3, so the mean of 2000 masks is within about 0.007 (5 sigma: 0.035).
  const Case c = make_case(1, 2, 8, 6, 4, 3, 3);
  Inputs in = make_attention_inputs(c, 11);
  in.V = random_tensor({c.B, c.H, c.S, c.M}, 12, 0.5f, 1.5f);
  const std::vector<float> expected = run(c, in).out;
  std::vector<double> mean(expected.size(), 0.0);
  const int masks = 2000;
  ThreadCount one(1);  // a statistical check: 2000 small calls, faster on one thread
  for (int s = 0; s < masks; ++s) {
    const std::vector<float> out =
        clustered_attention_forward(in.Q, in.K, in.V, {}, in.assignment, c.C, 0.0f,
                                    {0.3f, 1000 + uint64_t(s), 0})
            .out.to_vector();
    for (size_t x = 0; x < out.size(); ++x) mean[x] += out[x] / double(masks);
  }
  std::vector<float> m(mean.begin(), mean.end());
  CHECK_CLOSE(m, expected, 0.035, 0.0);
}

TEST_CASE("attention(): clustered = cluster_queries then clustered_attention") {
  const Case c = make_case(2, 2, 24, 24, 6, 4, 1, {24, 15});
  const Inputs in = make_attention_inputs(c, 61);
  AttentionConfig config;
  config.type = AttentionType::clustered;
  config.clusters = 5;
  config.bits = 16;
  config.iterations = 4;
  Generator gen(9), same(9);
  const Variable Q(in.Q, true), K(in.K, true), V(in.V, true);
  const Variable out = attention(config, Q, K, V, in.lengths, gen, false);
  const Clustering cl = cluster_queries(in.Q, in.lengths, {5, 16, 4}, same);
  CHECK(gen.offset() == same.offset());
  const std::vector<int32_t> a = cl.assignment.to_int_vector();
  for (int64_t bh = 0; bh < 4; ++bh)  // padded queries have no cluster
    for (int64_t i = c.lengths[bh / 2]; i < c.N; ++i) CHECK(a[bh * c.N + i] == -1);
  CHECK(out.data().to_vector() ==
        clustered_attention_forward(in.Q, in.K, in.V, in.lengths, cl.assignment, 5).out.to_vector());
  sum_all(out * Variable(in.dO)).backward();
  CHECK(Q.grad().shape() == in.Q.shape());
  CHECK(V.grad().shape() == in.V.shape());

  // Refusal: causal.
  AttentionConfig causal = config;
  causal.causal = true;
  CHECK_ERROR(attention(causal, Q, K, V, in.lengths, gen, false), "causal", "clustered");
}

TEST_CASE("attention(): clustered dropout in training only, its mask reserved after clustering") {
  const Case c = make_case(2, 2, 24, 24, 6, 4, 1, {24, 15});
  const Inputs in = make_attention_inputs(c, 62);
  AttentionConfig config;
  config.type = AttentionType::clustered;
  config.clusters = 5;
  config.bits = 16;
  config.iterations = 4;
  config.dropout = 0.25f;
  const Variable Q(in.Q, true), K(in.K, true), V(in.V, true);
  // Evaluation: no dropout, and the generator advances by the clustering's draws only.
  Generator gen(9), same(9);
  const Variable eval = attention(config, Q, K, V, in.lengths, gen, false);
  const Clustering cl = cluster_queries(in.Q, in.lengths, {5, 16, 4}, same);
  CHECK(gen.offset() == same.offset());
  CHECK(eval.data().to_vector() ==
        clustered_attention_forward(in.Q, in.K, in.V, in.lengths, cl.assignment, 5)
            .out.to_vector());
  // Training: the clustering's draws, then the mask's blocks.
  Generator train(9), expect(9);
  const Variable out = attention(config, Q, K, V, in.lengths, train, true);
  const Clustering cl2 = cluster_queries(in.Q, in.lengths, {5, 16, 4}, expect);
  const uint64_t offset = expect.reserve(clustered_attention_dropout_blocks(in.Q, in.K, 5));
  CHECK(train.offset() == expect.offset());
  CHECK(clustered_attention_dropout_blocks(in.Q, in.K, 5) == uint64_t(2 * 2 * 5 * 24 + 3) / 4);
  const std::vector<float> dropped = out.data().to_vector();
  CHECK(dropped == clustered_attention_forward(in.Q, in.K, in.V, in.lengths, cl2.assignment, 5,
                                               0.0f, {0.25f, 9, offset})
                       .out.to_vector());
  CHECK(dropped != eval.data().to_vector());
  sum_all(out * Variable(in.dO)).backward();
  for (float g : Q.grad().to_vector()) CHECK(std::isfinite(g));
  // dropout 0 in training is no dropout.
  AttentionConfig none = config;
  none.dropout = 0.0f;
  Generator g0(9);
  CHECK(attention(none, Q, K, V, in.lengths, g0, true).data().to_vector() ==
        eval.data().to_vector());
}

TEST_CASE("MultiHeadAttention with clustered attention runs forward and backward") {
  Generator gen(3);
  AttentionConfig config;
  config.type = AttentionType::clustered;
  config.clusters = 3;
  config.bits = 8;
  config.iterations = 3;
  MultiHeadAttention mha(12, 3, config, gen);
  const Variable x(random_tensor({2, 7, 12}, 71), true);
  const Tensor lengths = Tensor::from_int_vector({7, 4}, {2});
  const Variable y = mha.forward(x, lengths, gen);
  CHECK(y.data().shape() == Shape{2, 7, 12});
  sum_all(y * y).backward();
  for (const Variable& p : mha.parameters()) {
    REQUIRE(p.grad().defined());
    for (float g : p.grad().to_vector()) CHECK(std::isfinite(g));
  }
  for (float g : x.grad().to_vector()) REQUIRE(std::isfinite(g));
}

TEST_CASE("clustered attention: argument errors name the op, the argument and the shapes") {
  const Tensor Q = random_tensor({2, 3, 4, 5}, 1), K = random_tensor({2, 3, 6, 5}, 2),
               V = random_tensor({2, 3, 6, 7}, 3);
  const Tensor a = Tensor::zeros({2, 3, 4}, DType::i32);
  const char* op = "clustered_attention";
  CHECK_ERROR(clustered_attention_forward(random_tensor({2, 3, 4}, 1), K, V, {}, a, 2), op,
              "Q of shape (B, H, N, E)", "(2, 3, 4)");
  CHECK_ERROR(clustered_attention_forward(Q, random_tensor({2, 3, 6, 4}, 2), V, {}, a, 2), op,
              "K of shape (B, H, S, E) = (2, 3, S, 5)");
  CHECK_ERROR(clustered_attention_forward(Q, K, random_tensor({2, 3, 5, 7}, 3), {}, a, 2), op,
              "V of shape (B, H, S, M) = (2, 3, 6, M)");
  CHECK_ERROR(clustered_attention_forward(Q, K, V, {}, Tensor::zeros({2, 3, 5}, DType::i32), 2),
              op, "assignment of shape (B, H, N) = (2, 3, 4)");
  CHECK_ERROR(clustered_attention_forward(Q, K, V, {}, Tensor::zeros({2, 3, 4}), 2), op,
              "assignment", "i32");
  CHECK_ERROR(clustered_attention_forward(Q, K, V, {}, a, 0), op, "clusters >= 1", "0");
  std::vector<int32_t> bad(24, 0);
  bad[17] = 2;
  CHECK_ERROR(clustered_attention_forward(Q, K, V, {}, Tensor::from_int_vector(bad, {2, 3, 4}), 2),
              op, "assignment value 2 at (1, 1, 1)", "[-1, C = 2)");
  bad[17] = -2;
  CHECK_ERROR(clustered_attention_forward(Q, K, V, {}, Tensor::from_int_vector(bad, {2, 3, 4}), 2),
              op, "assignment value -2");
  CHECK_ERROR(clustered_attention_forward(Q, K, V, Tensor::from_int_vector({6, 7}, {2}), a, 2),
              op, "lengths[1] = 7", "[0, S = 6]");
  CHECK_ERROR(clustered_attention_forward(Q, K, V, Tensor::from_int_vector({6}, {1}), a, 2), op,
              "lengths of shape (2,)");
  CHECK_ERROR(clustered_attention_forward(Q, K, V, {}, a, 2, NAN), op, "finite temperature");
  CHECK_ERROR(clustered_attention_forward(Q, K, V, {}, a, 2, 0.0f, {1.0f, 0, 0}), op,
              "dropout probability in [0, 1)", "got 1");
  CHECK_ERROR(clustered_attention_forward(Q, K, V, {}, a, 2, 0.0f, {-0.5f, 0, 0}), op,
              "dropout probability");
  const ClusteredAttentionOutput f = clustered_attention_forward(Q, K, V, {}, a, 2);
  CHECK_ERROR(clustered_attention_backward(random_tensor({2, 3, 4, 5}, 4), K, V, {}, a, f),
              "clustered_attention_backward", "dout", "(2, 3, 4, 7)");
  ClusteredAttentionOutput wrong = f;
  wrong.centroids = random_tensor({2, 3, 2, 4}, 5);
  CHECK_ERROR(clustered_attention_backward(f.out, K, V, {}, a, wrong),
              "clustered_attention_backward", "centroids", "(2, 3, 2, 5)");
}
