// Query clustering (layers/attention/clustering.h) and clustered attention (clustered.h) on the
// device against the CPU, through the front doors: the same seed gives the same assignment and
// counts (integers: exact equality), at 1 and 2 host threads, on awkward shapes (N = 1, 3, 17,
// 129, 300; C = 1, C > N; key lengths with padded queries, a sequence of length 0; identical
// queries); clustered attention forward and backward for a given assignment (empty clusters,
// padded queries, N != S, E != M, lengths), with dropout (the same seed gives the same mask),
// and attention() with the clustered type through autograd; improved-clustered attention
// (eq. 9-11) the same way, with the top-k sets compared exactly (k = 1, k below the valid keys,
// k >= S, which must also equal full attention). Part of the test_cuda program
// (tests/test_cuda.cpp has its main): run on a GPU or on the emulated device, skipped elsewhere.
//
// Tolerance: the centroids are sums over members in query order on both devices and must agree
// bit for bit; the products' sums run in another order on the device (cuBLAS, a tree over the
// block for the row sums), so the other results are compared row by row with a relative
// tolerance (kRowTol) of the row's scale (its largest element, at least a tenth of the
// tensor's). Zero rows (padded queries, empty clusters, masked keys) must be exactly 0.
//
// The integer results (hash codes and so assignments, top-k sets) come from products too: a
// projection next to its threshold, or two keys' weights next to each other at the top-k
// boundary, may fall either way in another summation order (a GPU's cuBLAS, the GPU-like
// emulation). Each case asserts its margin instead: the same results on the cpu from inputs
// perturbed by kMarginRel = 2^-18 (relative, per element, random signs: a product of E terms
// moves by about 2^-18 sqrt(E / 3) of its terms' size, some 50 times the 2^-24 sqrt(E) that
// another order of summation typically gives), twice; inputs with a near tie fail that check
// (choose others) rather than the comparison on some GPU only. 2^-14 already flagged one case
// (improved-clustered, seed 74): near ties at a top-k boundary are not rare. Exact ties that the inputs are built to have (identical queries,
// repeated keys) stay exact: their copies get the same perturbation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "check.h"
#include "cuda_check.h"
#include "core/cuda/cuda.h"
#include "core/parallel.h"
#include "core/random.h"
#include "core/tensor.h"
#include "layers/attention/attention.h"
#include "layers/attention/clustered.h"
#include "layers/attention/clustering.h"
#include "layers/attention/cuda/clustered.h"
#include "layers/attention/full.h"
#include "layers/attention/improved_clustered.h"

using clustr::Device;
using clustr::Tensor;
using clustr::Variable;
using clustr::test::on;
using clustr::test::random_tensor;

namespace {

constexpr double kRowTol = 2e-5;
constexpr float kMarginRel = 1.0f / 262144.0f;  // 2^-18

// v (rows of `width`) with each element x scaled by (1 + kMarginRel u), u uniform in [-1, 1]
// from `seed`; row r takes the noise of row noise_row(r), so copies of a row stay copies.
template <class RowMap>
Tensor perturbed(const Tensor& t, int64_t width, uint32_t seed, RowMap noise_row) {
  std::vector<float> v = t.to_vector();
  const std::vector<float> u =
      clustr::test::random_values(static_cast<int64_t>(v.size()), seed, -1.0f, 1.0f);
  for (size_t i = 0; i < v.size(); ++i) {
    const size_t r = i / size_t(width), e = i % size_t(width);
    v[i] *= 1.0f + kMarginRel * u[size_t(noise_row(int64_t(r))) * size_t(width) + e];
  }
  return Tensor::from_vector(v, t.shape());
}

// actual (device) against expected (cpu) in rows of `width`: each element within kRowTol of
// its row's scale; an expected 0 of an all-zero row must be exactly 0. Prints the worst.
void check_rows(const char* what, const std::vector<float>& actual,
                const std::vector<float>& expected, int64_t width) {
  clustr::test::check_rows(what, actual, expected, width, kRowTol,
                           clustr::test::ZeroRows::exact);
}

// ---- clustering ---------------------------------------------------------------------------

struct ClusterCase {
  int64_t B, H, N, E;
  int C, bits, iterations;
  std::vector<int32_t> lengths;  // empty: none
  bool identical = false;        // every query of a pair the same
};

void check_clustering(const ClusterCase& c, uint32_t seed) {
  INFO("(B, H, N, E) = (" << c.B << ", " << c.H << ", " << c.N << ", " << c.E << "), C = " << c.C
                          << ", bits = " << c.bits << ", L = " << c.iterations
                          << std::string(c.lengths.empty() ? "" : ", lengths")
                          << std::string(c.identical ? ", identical" : ""));
  Tensor Q = random_tensor({c.B, c.H, c.N, c.E}, seed);
  if (c.identical) {
    std::vector<float> q = Q.to_vector();
    for (int64_t bh = 0; bh < c.B * c.H; ++bh)
      for (int64_t i = 1; i < c.N; ++i)
        for (int64_t e = 0; e < c.E; ++e) q[(bh * c.N + i) * c.E + e] = q[bh * c.N * c.E + e];
    Q = Tensor::from_vector(q, Q.shape());
  }
  const Tensor L = c.lengths.empty() ? Tensor() : Tensor::from_int_vector(c.lengths, {c.B});
  const clustr::ClusteringOptions o{c.C, c.bits, c.iterations};
  clustr::Generator g_cpu(seed + 100);
  const clustr::Clustering cpu = clustr::cluster_queries(Q, L, o, g_cpu);
  for (uint32_t m = 0; m < 2; ++m) {  // the margin (see the top)
    const Tensor Qm = perturbed(Q, c.E, seed + 200 + m, [&](int64_t r) {
      return c.identical ? r / c.N * c.N : r;  // identical queries: one noise per pair
    });
    clustr::Generator g(seed + 100);
    const clustr::Clustering near = clustr::cluster_queries(Qm, L, o, g);
    REQUIRE_MESSAGE(near.assignment.to_int_vector() == cpu.assignment.to_int_vector(),
                    "a hash projection of these inputs lies within " << kMarginRel
                    << " (relative) of its threshold: choose other inputs");
  }
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    clustr::ThreadCountScope scope(threads);
    clustr::Generator g_dev(seed + 100);
    const clustr::Clustering dev =
        clustr::cluster_queries(Q.to(Device::cuda), on(L, Device::cuda), o, g_dev);
    CHECK(dev.assignment.device() == Device::cuda);
    CHECK(dev.counts.device() == Device::cuda);
    CHECK(dev.assignment.to_int_vector() == cpu.assignment.to_int_vector());
    CHECK(dev.counts.to_int_vector() == cpu.counts.to_int_vector());
    CHECK(g_dev.offset() == g_cpu.offset());
  }
}

// ---- clustered attention ------------------------------------------------------------------

struct AttnCase {
  int64_t B, H, N, S, E, M, C;
  std::vector<int32_t> lengths;  // empty: none
  float dropout = 0.0f;
  float temperature = 0.0f;
};

struct Inputs {
  Tensor Q, K, V, dO, lengths, assignment;  // on the cpu
};

// Assignment: valid queries spread over clusters 0 .. C - 2 (C - 1 stays empty when C > 1),
// padded queries (N == S with lengths, i >= L) -1.
Inputs make_inputs(const AttnCase& c, uint32_t seed) {
  Inputs in;
  in.Q = random_tensor({c.B, c.H, c.N, c.E}, seed);
  in.K = random_tensor({c.B, c.H, c.S, c.E}, seed + 1);
  in.V = random_tensor({c.B, c.H, c.S, c.M}, seed + 2);
  in.dO = random_tensor({c.B, c.H, c.N, c.M}, seed + 3);
  if (!c.lengths.empty()) in.lengths = Tensor::from_int_vector(c.lengths, {c.B});
  const std::vector<float> r = clustr::test::random_values(c.B * c.H * c.N, seed + 4, 0.0f, 1.0f);
  std::vector<int32_t> a(r.size());
  const int64_t used = c.C > 1 ? c.C - 1 : 1;
  for (int64_t bh = 0; bh < c.B * c.H; ++bh)
    for (int64_t i = 0; i < c.N; ++i) {
      const size_t x = static_cast<size_t>(bh * c.N + i);
      const bool padded = !c.lengths.empty() && c.N == c.S && i >= c.lengths[bh / c.H];
      a[x] = padded ? -1 : std::min<int32_t>(static_cast<int32_t>(r[x] * used), used - 1);
    }
  in.assignment = Tensor::from_int_vector(a, {c.B, c.H, c.N});
  return in;
}

// f() with the checks of device values deferred (cuda::DeferredChecks): the clustered types
// then read the lengths on the device only and size their products for all S keys.
template <class F>
auto deferred(F f) {
  clustr::cuda::DeferredChecks scope;
  return f();
}

struct Result {
  std::vector<float> out, weights, centroids, dQ, dK, dV;
  std::vector<int32_t> counts;
};
Result run(const AttnCase& c, const Inputs& in, Device dev) {
  const Tensor Q = on(in.Q, dev), K = on(in.K, dev), V = on(in.V, dev), L = on(in.lengths, dev),
               A = on(in.assignment, dev);
  clustr::ClusteredDropout drop;
  drop.p = c.dropout;
  drop.seed = 4321;
  drop.offset = 9;
  const clustr::ClusteredAttentionOutput f =
      clustr::clustered_attention_forward(Q, K, V, L, A, c.C, c.temperature, drop);
  const clustr::ClusteredAttentionGrads g =
      clustr::clustered_attention_backward(on(in.dO, dev), K, V, L, A, f, c.temperature);
  CHECK(f.out.device() == dev);
  CHECK(g.dQ.device() == dev);
  CHECK(g.dV.device() == dev);
  return {f.out.to_vector(), f.weights.to_vector(), f.centroids.to_vector(), g.dQ.to_vector(),
          g.dK.to_vector(),  g.dV.to_vector(),      f.counts.to_int_vector()};
}

void check_attention(const AttnCase& c, uint32_t seed) {
  INFO("(B, H, N, S, E, M, C) = (" << c.B << ", " << c.H << ", " << c.N << ", " << c.S << ", "
                                   << c.E << ", " << c.M << ", " << c.C << ")"
                                   << std::string(c.lengths.empty() ? "" : " lengths")
                                   << " dropout " << c.dropout);
  const Inputs in = make_inputs(c, seed);
  const Result cpu = run(c, in, Device::cpu);
  // With lengths, again with them read on the device only, as in a CUDA graph's capture.
  for (const bool lengths_on_device : {false, true}) {
    if (lengths_on_device && c.lengths.empty()) break;
    CAPTURE(lengths_on_device);
    const Result dev = lengths_on_device ? deferred([&] { return run(c, in, Device::cuda); })
                                         : run(c, in, Device::cuda);
    CHECK(dev.counts == cpu.counts);
    CHECK(dev.centroids == cpu.centroids);  // member sums in query order on both devices
    check_rows("out", dev.out, cpu.out, c.M);
    check_rows("weights", dev.weights, cpu.weights, c.S);
    check_rows("dQ", dev.dQ, cpu.dQ, c.E);
    check_rows("dK", dev.dK, cpu.dK, c.E);
    check_rows("dV", dev.dV, cpu.dV, c.M);
  }
}

// ---- improved clustered attention ---------------------------------------------------------

struct ImprovedResult {
  std::vector<float> out, weights, centroids, mass, dQ, dK, dV;
  std::vector<int32_t> counts, topk;
};
ImprovedResult run_improved(const AttnCase& c, int64_t topk, const Inputs& in, Device dev) {
  const Tensor Q = on(in.Q, dev), K = on(in.K, dev), V = on(in.V, dev), L = on(in.lengths, dev),
               A = on(in.assignment, dev);
  clustr::ClusteredDropout drop;
  drop.p = c.dropout;
  drop.seed = 8765;
  drop.offset = 3;
  const clustr::ImprovedClusteredAttentionOutput f = clustr::improved_clustered_attention_forward(
      Q, K, V, L, A, c.C, topk, c.temperature, drop);
  const clustr::ImprovedClusteredAttentionGrads g = clustr::improved_clustered_attention_backward(
      on(in.dO, dev), Q, K, V, L, A, f, c.temperature);
  CHECK(f.out.device() == dev);
  CHECK(f.topk.device() == dev);
  CHECK(g.dK.device() == dev);
  return {f.out.to_vector(),  f.weights.to_vector(), f.centroids.to_vector(),
          f.mass.to_vector(), g.dQ.to_vector(),      g.dK.to_vector(),
          g.dV.to_vector(),   f.counts.to_int_vector(), f.topk.to_int_vector()};
}

// repeats > 0: the keys cycle through their first `repeats` rows, so Ac has exact ties across
// the top-k boundary (broken towards the lower key index on both devices).
void check_improved(const AttnCase& c, int64_t topk, uint32_t seed, int64_t repeats = 0) {
  INFO("(B, H, N, S, E, M, C) = (" << c.B << ", " << c.H << ", " << c.N << ", " << c.S << ", "
                                   << c.E << ", " << c.M << ", " << c.C << "), k = " << topk
                                   << std::string(c.lengths.empty() ? "" : " lengths")
                                   << " dropout "
                                   << c.dropout);
  Inputs in = make_inputs(c, seed);
  if (repeats > 0) {
    std::vector<float> k = in.K.to_vector();
    for (int64_t bh = 0; bh < c.B * c.H; ++bh)
      for (int64_t l = repeats; l < c.S; ++l)
        for (int64_t e = 0; e < c.E; ++e)
          k[(bh * c.S + l) * c.E + e] = k[(bh * c.S + l % repeats) * c.E + e];
    in.K = Tensor::from_vector(k, in.K.shape());
  }
  const ImprovedResult cpu = run_improved(c, topk, in, Device::cpu);
  for (uint32_t m = 0; m < 2; ++m) {  // the margin (see the top)
    Inputs near = in;
    near.K = perturbed(in.K, c.E, seed + 300 + m, [&](int64_t r) {
      return repeats > 0 ? r / c.S * c.S + r % c.S % repeats : r;  // repeated keys stay alike
    });
    REQUIRE_MESSAGE(run_improved(c, topk, near, Device::cpu).topk == cpu.topk,
                    "two keys' weights of these inputs lie within " << kMarginRel
                    << " (relative) of each other at a top-k boundary: choose other inputs");
  }
  // With lengths, again with them read on the device only, as in a CUDA graph's capture.
  for (const bool lengths_on_device : {false, true}) {
    if (lengths_on_device && c.lengths.empty()) break;
    CAPTURE(lengths_on_device);
    const ImprovedResult dev =
        lengths_on_device ? deferred([&] { return run_improved(c, topk, in, Device::cuda); })
                          : run_improved(c, topk, in, Device::cuda);
    CHECK(dev.counts == cpu.counts);
    CHECK(dev.centroids == cpu.centroids);  // member sums in query order on both devices
    CHECK(dev.topk == cpu.topk);            // the same rule on (nearly) the same Ac
    check_rows("weights", dev.weights, cpu.weights, c.S);
    check_rows("mass", dev.mass, cpu.mass, c.C);
    check_rows("out", dev.out, cpu.out, c.M);
    check_rows("dQ", dev.dQ, cpu.dQ, c.E);
    check_rows("dK", dev.dK, cpu.dK, c.E);
    check_rows("dV", dev.dV, cpu.dV, c.M);
  }
}

// attention() with `config` (its type, and topk where it has one) on the cpu and on the device
// from the same inputs (seeds seed to seed + 3) and generator: forward and backward run on each
// device and agree within check_rows.
void check_attention_api(clustr::AttentionConfig config, uint32_t seed) {
  config.clusters = 6;
  config.bits = 31;
  config.iterations = 5;
  config.dropout = 0.2f;
  const int64_t B = 2, H = 2, N = 29, E = 8;
  const Tensor q = random_tensor({B, H, N, E}, seed), k = random_tensor({B, H, N, E}, seed + 1),
               v = random_tensor({B, H, N, E}, seed + 2),
               dO = random_tensor({B, H, N, E}, seed + 3);
  const Tensor L = Tensor::from_int_vector({29, 17}, {B});
  std::vector<float> out[2], dq[2], dk[2], dv[2];
  for (int x = 0; x < 2; ++x) {
    const Device dev = x == 0 ? Device::cpu : Device::cuda;
    Variable Q(q.to(dev), true), K(k.to(dev), true), V(v.to(dev), true);
    clustr::Generator gen(7);
    const Variable o = clustr::attention(config, Q, K, V, L.to(dev), gen, /*training=*/true);
    CHECK(o.data().device() == dev);
    o.backward(dO.to(dev));
    REQUIRE(Q.grad().defined());
    CHECK(Q.grad().device() == dev);
    out[x] = o.data().to_vector();
    dq[x] = Q.grad().to_vector();
    dk[x] = K.grad().to_vector();
    dv[x] = V.grad().to_vector();
  }
  check_rows("out", out[1], out[0], E);
  check_rows("dQ", dq[1], dq[0], E);
  check_rows("dK", dk[1], dk[0], E);
  check_rows("dV", dv[1], dv[0], E);
}

}  // namespace

TEST_CASE("cuda clustering: the same seed gives the cpu's assignment on awkward shapes") {
  check_clustering({1, 1, 1, 1, 1, 63, 10, {}}, 1);
  check_clustering({1, 2, 3, 4, 5, 63, 10, {}}, 2);           // C > N
  check_clustering({3, 2, 17, 8, 4, 31, 10, {17, 5, 0}}, 3);  // padded queries, a length 0
  check_clustering({1, 2, 129, 16, 8, 63, 10, {}}, 4);
  check_clustering({2, 1, 300, 8, 20, 63, 10, {300, 251}}, 5);
  check_clustering({2, 2, 129, 5, 1, 16, 3, {}}, 6);          // C = 1
  check_clustering({1, 1, 300, 8, 25, 7, 0, {}}, 7);          // few bits: ties; L = 0
  check_clustering({2, 1, 17, 6, 4, 63, 10, {17, 9}, true}, 8);  // identical queries
  // More clusters than one pass of the device's shared-memory tally holds (177 at 63 bits).
  check_clustering({2, 1, 600, 8, 200, 63, 10, {600, 450}}, 9);
}

TEST_CASE("cuda clustering: past one block's chunk of queries, Lloyd's rounds run over many "
          "blocks, and the seeding over many warps, with the cpu's result") {
  // N > 1024 (cuda/clustering.cu's kLloydChunk): a round is an assign + tally launch over every
  // chunk of every pair and a vote launch per pair; the seeding's block has up to 32 warps.
  check_clustering({2, 1, 2100, 8, 30, 63, 10, {2100, 1500}}, 21);
  check_clustering({1, 1, 1100, 8, 200, 63, 3, {}}, 22);  // the tally in passes of 177
  check_clustering({1, 1, 1030, 4, 12, 7, 0, {}}, 23);    // few bits, L = 0: assign only
}

TEST_CASE("cuda clustering: the launches do not grow with B, H or N") {
  // Hashing 1 (a pair's queries in one chunk of 128) or 2 (past it); seeding and Lloyd 1 (a
  // pair's queries in one block of 1024), or seeding 1 and Lloyd 2 a round (past it).
  auto launches = [](int64_t B, int64_t H, int64_t N, int iterations) {
    const Tensor Q = random_tensor({B, H, N, 4}, 31).to(Device::cuda);
    clustr::Generator g(5);
    const clustr::cuda::LaunchCounts before = clustr::cuda::launch_counts();
    clustr::cluster_queries(Q, Tensor(), {10, 63, iterations}, g);
    const clustr::cuda::LaunchCounts after = clustr::cuda::launch_counts();
    CHECK(after.blas == before.blas);
    return after.kernels - before.kernels;
  };
  CHECK(launches(1, 1, 50, 10) == 2);
  CHECK(launches(3, 2, 128, 10) == 2);
  CHECK(launches(1, 1, 129, 10) == 3);
  CHECK(launches(3, 2, 1024, 10) == 3);
  CHECK(launches(1, 1, 1100, 10) == launches(2, 2, 2100, 10));
  CHECK(launches(1, 1, 1100, 10) <= 3 + 2 * 11);
}

TEST_CASE("cuda clustered attention: forward and backward match the cpu") {
  check_attention({1, 1, 1, 1, 1, 1, 1, {}}, 11);
  check_attention({2, 3, 17, 17, 8, 8, 4, {}}, 12);
  check_attention({1, 2, 129, 65, 16, 32, 9, {}}, 13);   // N != S, E != M
  check_attention({2, 1, 3, 129, 5, 3, 6, {}}, 14);      // C > N
  AttnCase t{1, 2, 17, 9, 4, 6, 3, {}};
  t.temperature = 0.7f;
  check_attention(t, 15);
}

TEST_CASE("cuda grouping: the cpu's count, start and order on both paths, and the values "
          "outside [-1, C) counted per pair") {
  // (B, H, N, C): one launch up to kGroupInBlock queries and clusters, three past it.
  struct Case {
    int64_t B, H, N, C;
  };
  const int64_t big = clustr::cuda::kGroupInBlock + 3;
  uint32_t seed = 600;
  for (const Case& c : {Case{1, 1, 1, 1}, Case{2, 3, 17, 4}, Case{1, 2, 300, 301},
                        Case{2, 1, clustr::cuda::kGroupInBlock, 9}, Case{1, 2, big, 7},
                        Case{1, 1, 40, big}}) {
    CAPTURE(c.N);
    CAPTURE(c.C);
    const int64_t BH = c.B * c.H, n = BH * c.N;
    std::vector<float> u = clustr::test::random_values(n, seed++, 0.0f, 1.0f);
    std::vector<int32_t> a(static_cast<size_t>(n));
    std::vector<int32_t> outside(static_cast<size_t>(BH), 0);
    for (int64_t i = 0; i < n; ++i) {  // mostly in [0, C), some -1, a few just out of range
      const float x = u[static_cast<size_t>(i)];
      a[i] = x < 0.1f ? -1 : x > 0.98f ? static_cast<int32_t>(c.C) : x > 0.97f ? -2
           : static_cast<int32_t>(x * static_cast<float>(c.C)) % static_cast<int32_t>(c.C);
      if (a[i] < -1 || a[i] >= c.C) ++outside[static_cast<size_t>(i / c.N)];
    }
    // The cpu's arrays (clustered_common.h's group()), out-of-range values in no cluster.
    std::vector<int32_t> count(static_cast<size_t>(BH * c.C), 0),
        start(static_cast<size_t>(BH * (c.C + 1)), 0), order(static_cast<size_t>(n), 0);
    for (int64_t p = 0; p < BH; ++p) {
      auto in_range = [&](int64_t i) { return a[p * c.N + i] >= 0 && a[p * c.N + i] < c.C; };
      for (int64_t i = 0; i < c.N; ++i)
        if (in_range(i)) ++count[p * c.C + a[p * c.N + i]];
      for (int64_t j = 0; j < c.C; ++j)
        start[p * (c.C + 1) + j + 1] = start[p * (c.C + 1) + j] + count[p * c.C + j];
      std::vector<int32_t> at(start.begin() + p * (c.C + 1), start.begin() + p * (c.C + 1) + c.C);
      for (int64_t i = 0; i < c.N; ++i)
        if (in_range(i)) order[p * c.N + at[a[p * c.N + i]]++] = static_cast<int32_t>(i);
    }
    const Tensor assignment = Tensor::from_int_vector(a, {n}).to(Device::cuda);
    const Tensor d_count = Tensor::empty({BH * (c.C + 1)}, clustr::DType::i32, Device::cuda);
    const Tensor d_start = Tensor::empty({BH * (c.C + 1)}, clustr::DType::i32, Device::cuda);
    const Tensor d_order = Tensor::empty({n}, clustr::DType::i32, Device::cuda);
    clustr::cuda::group_members({c.B, c.H, c.N, c.N, 1, 1, c.C}, assignment.i32(),
                                d_count.i32(), d_start.i32(), d_order.i32());
    const std::vector<int32_t> got_count = d_count.to_int_vector();
    CHECK(std::vector<int32_t>(got_count.begin(), got_count.begin() + BH * c.C) == count);
    CHECK(std::vector<int32_t>(got_count.begin() + BH * c.C, got_count.end()) == outside);
    CHECK(d_start.to_int_vector() == start);
    CHECK(d_order.to_int_vector() == order);
  }
}

TEST_CASE("cuda clustered types: a bad device assignment is named, checked on the device") {
  // The check runs on the device (one integer comes back); a bad value is then found on a copy.
  const Tensor q = clustr::test::random_tensor({1, 2, 5, 3}, 91).to(Device::cuda);
  Tensor a = Tensor::from_int_vector({0, 1, -1, 2, 0, 1, 0, 3, 0, 0}, {1, 2, 5});
  CHECK_ERROR(clustr::clustered_attention_forward(q, q, q, Tensor(), a.to(Device::cuda), 3),
              "clustered_attention", "assignment value 3 at (0, 1, 2)", "outside [-1, C = 3)");
  CHECK_ERROR(clustr::improved_clustered_attention_forward(q, q, q, Tensor(), a.to(Device::cuda),
                                                           3, 2),
              "improved_clustered_attention", "assignment value 3 at (0, 1, 2)");
  a = Tensor::from_int_vector({0, 1, -1, 2, 0, 1, 0, 2, 0, -2}, {1, 2, 5});
  CHECK_ERROR(clustr::clustered_attention_forward(q, q, q, Tensor(), a.to(Device::cuda), 3),
              "assignment value -2 at (0, 1, 4)");
}

TEST_CASE("cuda clustered attention: key lengths, padded queries and empty clusters") {
  check_attention({3, 2, 17, 17, 8, 5, 5, {17, 6, 0}}, 21);  // padded queries, a length 0
  check_attention({2, 2, 17, 23, 4, 3, 3, {0, 11}}, 22);     // N != S: no padded query
  check_attention({2, 1, 300, 300, 8, 12, 16, {300, 199}}, 23);
}

TEST_CASE("cuda clustered attention: dropout draws the cpu's mask from the same seed") {
  AttnCase c{2, 2, 17, 19, 4, 3, 5, {19, 11}};
  c.dropout = 0.3f;
  check_attention(c, 31);
  AttnCase d{1, 2, 129, 129, 8, 8, 7, {120}};
  d.dropout = 0.3f;
  check_attention(d, 32);
}

TEST_CASE("cuda clustered attention: attention() with the clustered type runs backward on the device") {
  clustr::AttentionConfig config;
  config.type = clustr::AttentionType::clustered;
  check_attention_api(config, 41);
}

TEST_CASE("cuda improved clustered attention: forward and backward match the cpu") {
  check_improved({1, 1, 1, 1, 1, 1, 1, {}}, 1, 61);
  check_improved({2, 3, 3, 5, 4, 4, 2, {}}, 1, 62);      // k = 1
  check_improved({2, 3, 17, 17, 8, 8, 4, {}}, 5, 63);    // k < S, an empty cluster
  check_improved({1, 2, 129, 65, 16, 32, 9, {}}, 7, 64); // N != S, E != M
  check_improved({2, 1, 3, 129, 5, 3, 6, {}}, 32, 65);   // C > N: empty clusters
  check_improved({1, 2, 17, 9, 4, 6, 3, {}}, 9, 66);     // k = S
  check_improved({1, 2, 17, 9, 4, 6, 3, {}}, 40, 67);    // k > S
  AttnCase t{1, 2, 17, 23, 4, 6, 3, {}};
  t.temperature = 0.7f;
  check_improved(t, 4, 68);
  // More than 32 clusters (the key gradients look them up 32 at a time), and top-k rows too
  // wide for shared memory (cuda/improved_clustered.cu's kStageBytes: read in place).
  check_improved({1, 2, 150, 120, 8, 8, 40, {}}, 6, 75);
  check_improved({1, 1, 60, 300, 40, 40, 5, {}}, 300, 76);
}

TEST_CASE("cuda improved clustered attention: ties in Ac pick the cpu's keys") {
  check_improved({2, 2, 17, 23, 4, 5, 4, {}}, 4, 69, 3);        // 3 distinct keys, k = 4
  check_improved({2, 1, 33, 40, 6, 3, 5, {40, 29}}, 7, 70, 5);  // with lengths
}

TEST_CASE("cuda improved clustered attention: key lengths, padded queries and empty clusters") {
  check_improved({3, 2, 17, 17, 8, 5, 5, {17, 6, 0}}, 4, 71);  // padded queries, a length 0
  check_improved({3, 2, 17, 17, 8, 5, 5, {17, 6, 0}}, 8, 72);  // k >= L for the second
  check_improved({2, 2, 17, 23, 4, 3, 3, {0, 11}}, 2, 73);     // N != S: no padded query
  check_improved({2, 1, 129, 129, 8, 12, 16, {129, 100}}, 16, 74);
}

TEST_CASE("cuda improved clustered attention: dropout draws the cpu's masks from the same seed") {
  AttnCase c{2, 2, 17, 19, 4, 3, 5, {19, 11}};
  c.dropout = 0.3f;
  check_improved(c, 3, 81);
  check_improved(c, 19, 82);  // k >= S: no remainder
  AttnCase d{1, 2, 129, 129, 8, 8, 7, {120}};
  d.dropout = 0.3f;
  check_improved(d, 10, 83);
}

TEST_CASE("cuda improved clustered attention: k >= the valid keys is full attention") {
  const AttnCase c{2, 2, 17, 23, 8, 5, 4, {23, 11}};
  const Inputs in = make_inputs(c, 91);
  const Tensor Q = in.Q.to(Device::cuda), K = in.K.to(Device::cuda), V = in.V.to(Device::cuda),
               L = in.lengths.to(Device::cuda), dO = in.dO.to(Device::cuda);
  const clustr::ImprovedClusteredAttentionOutput f = clustr::improved_clustered_attention_forward(
      Q, K, V, L, in.assignment.to(Device::cuda), c.C, c.S);
  const clustr::ImprovedClusteredAttentionGrads g = clustr::improved_clustered_attention_backward(
      dO, Q, K, V, L, in.assignment.to(Device::cuda), f);
  const clustr::FullAttentionOptions o;
  const clustr::FullAttentionOutput full = clustr::full_attention_forward(Q, K, V, L, o);
  const clustr::FullAttentionGrads fg =
      clustr::full_attention_backward(dO, Q, K, V, full.out, full.logsumexp, L, o);
  for (float m : f.mass.to_vector()) CHECK((m == 0.0f || std::fabs(m - 1.0f) < 1e-6f));
  check_rows("out", f.out.to_vector(), full.out.to_vector(), c.M);
  check_rows("dQ", g.dQ.to_vector(), fg.dQ.to_vector(), c.E);
  check_rows("dK", g.dK.to_vector(), fg.dK.to_vector(), c.E);
  check_rows("dV", g.dV.to_vector(), fg.dV.to_vector(), c.M);
}

TEST_CASE("cuda improved clustered attention: attention() runs backward on the device") {
  clustr::AttentionConfig config;
  config.type = clustr::AttentionType::improved_clustered;
  config.topk = 7;
  check_attention_api(config, 101);
}

TEST_CASE("cuda improved clustered attention: attention_matrix() stays on the cpu") {
  const Tensor x = random_tensor({1, 1, 5, 4}, 111).to(Device::cuda);
  const Tensor a = Tensor::zeros({1, 1, 5}, clustr::DType::i32, Device::cuda);
  CHECK_THROWS_WITH_AS(clustr::attention_matrix(clustr::AttentionType::improved_clustered, x, x,
                                                Tensor(), a, 1, 2),
                       doctest::Contains("no CUDA kernel"), clustr::Error);
}

TEST_CASE("cuda clustered types: the launches of a forward + backward do not grow with B, H or "
          "N") {
  // The clustering, the member sums, the softmax rows and the products (one batched call for all
  // pairs without lengths): a fixed number whatever the shape, past one Lloyd block's chunk.
  for (clustr::AttentionType type :
       {clustr::AttentionType::clustered, clustr::AttentionType::improved_clustered}) {
    clustr::AttentionConfig config;
    config.type = type;
    config.clusters = 8;
    config.bits = 15;
    config.iterations = 3;
    config.topk = 4;
    auto launches = [&](int64_t B, int64_t H, int64_t N) {
      const Tensor q = random_tensor({B, H, N, 4}, 51).to(Device::cuda);
      Variable Q(q, true), K(q, true), V(q, true);
      clustr::Generator gen(3);
      const clustr::cuda::LaunchCounts before = clustr::cuda::launch_counts();
      clustr::attention(config, Q, K, V, Tensor(), gen, /*training=*/true).backward(q);
      const clustr::cuda::LaunchCounts after = clustr::cuda::launch_counts();
      return std::vector<uint64_t>{after.kernels - before.kernels, after.blas - before.blas};
    };
    CAPTURE(static_cast<int>(type));
    CHECK(launches(1, 1, 1030) == launches(2, 2, 1100));
  }
}

TEST_CASE("cuda clustered types: backward reuses the forward's grouping of the queries (the same "
          "bits, and neither the grouping's launches nor the assignment's check again)") {
  if (!clustr::cuda::available()) return;
  const int64_t B = 2, H = 2, N = 17, E = 4, C = 3;
  auto dev = [](const Tensor& t) { return t.to(Device::cuda); };
  const Tensor q = dev(random_tensor({B, H, N, E}, 501));
  const Tensor k = dev(random_tensor({B, H, N, E}, 502));
  const Tensor v = dev(random_tensor({B, H, N, E}, 503));
  const Tensor dout = dev(random_tensor({B, H, N, E}, 504));
  std::vector<int32_t> a(static_cast<size_t>(B * H * N));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>((i * 7) % C);
  const Tensor assignment = dev(Tensor::from_int_vector(a, {B, H, N}));
  const Tensor lengths = dev(Tensor::from_int_vector({17, 11}, {B}));
  auto launches = [] { return clustr::cuda::launch_counts().kernels; };
  {
    const clustr::ClusteredAttentionOutput f =
        clustr::clustered_attention_forward(q, k, v, lengths, assignment, C);
    REQUIRE(f.start.defined());
    REQUIRE(f.order.defined());
    clustr::ClusteredAttentionOutput regroup = f;
    regroup.start = regroup.order = Tensor();
    const auto l0 = launches();
    const clustr::ClusteredAttentionGrads g =
        clustr::clustered_attention_backward(dout, k, v, lengths, assignment, f);
    const auto l1 = launches();
    const clustr::ClusteredAttentionGrads h =
        clustr::clustered_attention_backward(dout, k, v, lengths, assignment, regroup);
    const auto l2 = launches();
    CHECK(g.dQ.to_vector() == h.dQ.to_vector());
    CHECK(g.dK.to_vector() == h.dK.to_vector());
    CHECK(g.dV.to_vector() == h.dV.to_vector());
    // Grouping: one kernel at this size, which also counts the assignment's values outside
    // [-1, C) for its check.
    CHECK(l2 - l1 == (l1 - l0) + 1);
  }
  {
    const clustr::ImprovedClusteredAttentionOutput f =
        clustr::improved_clustered_attention_forward(q, k, v, lengths, assignment, C, 5);
    REQUIRE(f.start.defined());
    clustr::ImprovedClusteredAttentionOutput regroup = f;
    regroup.start = regroup.order = Tensor();
    const auto l0 = launches();
    const clustr::ImprovedClusteredAttentionGrads g =
        clustr::improved_clustered_attention_backward(dout, q, k, v, lengths, assignment, f);
    const auto l1 = launches();
    const clustr::ImprovedClusteredAttentionGrads h =
        clustr::improved_clustered_attention_backward(dout, q, k, v, lengths, assignment, regroup);
    const auto l2 = launches();
    CHECK(g.dQ.to_vector() == h.dQ.to_vector());
    CHECK(g.dK.to_vector() == h.dK.to_vector());
    CHECK(g.dV.to_vector() == h.dV.to_vector());
    CHECK(l2 - l1 == (l1 - l0) + 1);
  }
}
