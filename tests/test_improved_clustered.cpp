// Improved clustered attention for a fixed clustering (layers/attention/improved_clustered.h,
// the paper's eq. 9-11): topk >= S is full attention (values and gradients); the plain
// reference (layers/attention/reference.h) over sizes 1, 3, 17, 129 with N != S, E != M, empty
// clusters, padded queries and k > valid keys, and over widths and k around the per-cluster
// loops' 16-lane vectors; gradcheck (with the gradient through m_j and the
// non-top-k Ac_j) where the top-k sets are stable; Proposition 2 through the analysis matrix;
// identical results at 1 and 2 threads, also for one sequence and one head with many clusters
// (the work shared inside the pair); attention dropout (the reference with the documented
// masks, p = 0 is no dropout, none in evaluation, gradcheck with fixed masks, the mean over
// many masks, thread independence); the attention() dispatcher; argument errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "attention_cases.h"
#include "check.h"
#include "core/random.h"
#include "layers/attention/attention.h"
#include "layers/attention/clustering.h"
#include "layers/attention/full.h"
#include "layers/attention/improved_clustered.h"
#include "layers/attention/reference.h"

using namespace clustr;
using namespace clustr::test;

namespace {

using Case = AttentionCase;
using Inputs = AttentionInputs;
using Result = AttentionResult;

Case make_case(int64_t B, int64_t H, int64_t N, int64_t S, int64_t E, int64_t M, int64_t C,
               int64_t k, std::vector<int32_t> lengths = {}) {
  Case c;
  c.B = B, c.H = H, c.N = N, c.S = S, c.E = E, c.M = M, c.C = C, c.k = k;
  c.lengths = std::move(lengths);
  return c;
}

Result run(const Case& c, const Inputs& in, ImprovedClusteredAttentionOutput* saved = nullptr,
           const ClusteredDropout& drop = {}) {
  ImprovedClusteredAttentionOutput f = improved_clustered_attention_forward(
      in.Q, in.K, in.V, in.lengths, in.assignment, c.C, c.k, c.temperature, drop);
  const ImprovedClusteredAttentionGrads g = improved_clustered_attention_backward(
      in.dO, in.Q, in.K, in.V, in.lengths, in.assignment, f, c.temperature);
  Result r{f.out.to_vector(), g.dQ.to_vector(), g.dK.to_vector(), g.dV.to_vector()};
  if (saved) *saved = std::move(f);
  return r;
}

// The plain reference of eq. 9-11 (layers/attention/reference.h) for the op's top-k sets, its
// gradients from autograd. First checks that each set holds the min(k, L) keys of largest weight
// in the op's own Ac (eq. 9; none for an empty cluster).
Result reference(const Case& c, const Inputs& in, const ImprovedClusteredAttentionOutput& f,
                 const ClusteredDropout& drop = {}) {
  const std::vector<int32_t> tk = f.topk.to_int_vector(), count = f.counts.to_int_vector();
  const std::vector<float> w = f.weights.to_vector();
  const int64_t S = c.S, kw = f.topk.size(3);
  for (int64_t pj = 0; pj < c.B * c.H * c.C; ++pj) {
    const int64_t L = c.lengths.empty() ? S : c.lengths[pj / (c.H * c.C)];
    std::vector<bool> in_t(static_cast<size_t>(S), false);
    int64_t size = 0;
    for (int64_t x = 0; x < kw && tk[pj * kw + x] >= 0; ++x) in_t[tk[pj * kw + x]] = true, ++size;
    REQUIRE(size == (count[pj] == 0 ? 0 : std::min(c.k, L)));
    float lowest_in = INFINITY, highest_out = -INFINITY;
    for (int64_t l = 0; l < L; ++l)
      (in_t[l] ? lowest_in = std::min(lowest_in, w[pj * S + l])
               : highest_out = std::max(highest_out, w[pj * S + l]));
    if (size > 0) CHECK(lowest_in >= highest_out);
  }
  return autograd_result(in, [&](const Variable& Q, const Variable& K, const Variable& V) {
    return improved_clustered_attention_reference(Q, K, V, in.lengths, in.assignment, c.C, c.k,
                                                  c.temperature, f.topk, drop);
  });
}

// Every query of every (b, h) in cluster i % C, padded queries (i >= lengths[b], N == S) -1.
Tensor round_robin(const Case& c) {
  std::vector<int32_t> a(static_cast<size_t>(c.B * c.H * c.N));
  for (int64_t bh = 0; bh < c.B * c.H; ++bh)
    for (int64_t i = 0; i < c.N; ++i)
      a[bh * c.N + i] = c.lengths.empty() || i < c.lengths[bh / c.H] ? int32_t(i % c.C) : -1;
  return Tensor::from_int_vector(a, {c.B, c.H, c.N});
}

}  // namespace

TEST_CASE("improved clustered attention: topk >= S is full attention, values and gradients") {
  // With T_j = every valid key, m_j = 1 and eq. 11 is the exact softmax whatever the clusters;
  // the centroid path carries dAc = dm_j on every key, which the softmax backward cancels.
  for (const Case& c : {make_case(2, 2, 17, 17, 5, 3, 4, 17, {17, 9}),
                        make_case(1, 3, 3, 3, 4, 7, 2, 50),
                        make_case(2, 1, 129, 129, 8, 16, 7, 129, {129, 40})}) {
    INFO(name_of(c));
    Inputs in = make_attention_inputs(c, 7);
    in.assignment = round_robin(c);
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

TEST_CASE("improved clustered attention: matches the plain reference (padding, empty clusters)") {
  uint32_t seed = 100;
  for (const Case& c :
       {make_case(1, 1, 1, 1, 1, 1, 1, 1), make_case(2, 3, 3, 17, 5, 3, 4, 2, {17, 1}),
        make_case(1, 2, 17, 3, 4, 7, 3, 5), make_case(2, 1, 129, 129, 8, 16, 10, 32, {129, 0}),
        make_case(1, 1, 3, 129, 17, 1, 5, 3), make_case(2, 2, 129, 17, 3, 5, 129, 4, {17, 6}),
        make_case(1, 2, 17, 129, 16, 8, 1, 100, {70}), make_case(1, 1, 17, 17, 4, 4, 3, 1),
        // the per-cluster products' 32- and 16-column vectors and their edges (E, M, k of
        // 20, 24, 18 and 32, 40, 40), and the 16 x 16 blocks of the transposed gathers
        make_case(1, 2, 40, 40, 20, 24, 3, 18), make_case(1, 1, 64, 64, 32, 40, 2, 40)}) {
    INFO(name_of(c));
    const Inputs in = make_attention_inputs(c, seed += 10);
    ImprovedClusteredAttentionOutput f;
    const Result r = run(c, in, &f);
    CHECK(f.topk.shape() == (Shape{c.B, c.H, c.C, std::min(c.k, c.S)}));
    const Result e = reference(c, in, f);
    CHECK_CLOSE(r.out, e.out, 2e-6, 2e-5);
    CHECK_CLOSE(r.dQ, e.dQ, 1e-5, 1e-4);
    CHECK_CLOSE(r.dK, e.dK, 1e-5, 1e-4);
    CHECK_CLOSE(r.dV, e.dV, 1e-5, 1e-4);
  }
  Case c = make_case(1, 2, 17, 19, 4, 3, 4, 3, {11});  // a temperature other than 1/sqrt(E)
  c.temperature = 0.7f;
  const Inputs in = make_attention_inputs(c, 5);
  ImprovedClusteredAttentionOutput f;
  const Result r = run(c, in, &f), e = reference(c, in, f);
  CHECK_CLOSE(r.out, e.out, 2e-6, 2e-5);
  CHECK_CLOSE(r.dQ, e.dQ, 1e-5, 1e-4);
  CHECK_CLOSE(r.dK, e.dK, 1e-5, 1e-4);
}

TEST_CASE("improved clustered attention: top-k sets, mass and ties") {
  // One cluster, two identical keys: the tie goes to the lower index; masked keys never enter.
  Inputs in;
  in.Q = Tensor::from_vector({1.0f, 0.0f}, {1, 1, 1, 2});
  in.K = Tensor::from_vector({0.0f, 0.0f, 2.0f, 0.0f, 2.0f, 0.0f, 9.0f, 0.0f}, {1, 1, 4, 2});
  in.V = random_tensor({1, 1, 4, 2}, 3);
  in.assignment = Tensor::zeros({1, 1, 1}, DType::i32);
  in.lengths = Tensor::from_int_vector({3}, {1});
  const auto f =
      improved_clustered_attention_forward(in.Q, in.K, in.V, in.lengths, in.assignment, 1, 1);
  CHECK(f.topk.to_int_vector() == std::vector<int32_t>{1});
  const std::vector<float> w = f.weights.to_vector();
  CHECK(f.mass.to_vector()[0] == w[1]);
  const auto g =
      improved_clustered_attention_forward(in.Q, in.K, in.V, in.lengths, in.assignment, 1, 5);
  CHECK(g.topk.to_int_vector() == std::vector<int32_t>{0, 1, 2, -1});  // k > L valid keys
  CHECK(g.mass.to_vector()[0] == doctest::Approx(1.0f));
}

TEST_CASE("improved clustered attention: top-k sets of short and long rows, ties included") {
  // Against a full sort of each row of Ac by (weight descending, index ascending): rows of up
  // to 512 valid keys take the bitwise search, longer ones the candidate pass (S = 700 and
  // 1500, with a shorter sequence beside). Every fourth key repeats the one before it, so
  // equal weights compete for the last places of T; k from 1 to past L.
  for (int64_t S : {40, 300, 700, 1500})
    for (int64_t k : {1, 7, 32, 100, 2000}) {
      const int64_t B = 2, H = 1, N = 24, E = 4, C = 5;
      const Case c = make_case(B, H, N, S, E, 2, C, k, {int32_t(S), int32_t(S * 2 / 3)});
      Inputs in = make_attention_inputs(c, 41);
      float* K = in.K.f32();
      for (int64_t r = 0; r < B * H * S; ++r)
        if (r % 4 == 3) std::copy(K + (r - 1) * E, K + r * E, K + r * E);
      const auto f = improved_clustered_attention_forward(in.Q, in.K, in.V, in.lengths,
                                                          in.assignment, C, k);
      const int64_t kw = f.topk.size(3);
      const std::vector<int32_t> tk = f.topk.to_int_vector(), a = in.assignment.to_int_vector();
      const std::vector<float> w = f.weights.to_vector(), mass = f.mass.to_vector();
      int64_t wrong = 0, ties = 0;
      for (int64_t bh = 0; bh < B * H; ++bh)
        for (int64_t j = 0; j < C; ++j) {
          const int64_t L = c.lengths[bh / H];
          const float* row = w.data() + (bh * C + j) * S;
          const bool empty = std::count(a.begin() + bh * N, a.begin() + (bh + 1) * N, j) == 0;
          std::vector<int32_t> order(static_cast<size_t>(L));
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(),
                           [&](int32_t x, int32_t y) { return row[x] > row[y]; });
          const int64_t kk = empty ? 0 : std::min(k, L);
          if (kk > 0 && kk < L && row[order[kk - 1]] == row[order[kk]]) ++ties;
          std::vector<int32_t> want(order.begin(), order.begin() + kk);
          std::sort(want.begin(), want.end());
          float m = 0.0f;
          for (int32_t l : want) m += row[l];
          want.resize(static_cast<size_t>(kw), -1);
          const std::vector<int32_t> got(tk.begin() + (bh * C + j) * kw,
                                         tk.begin() + (bh * C + j + 1) * kw);
          if (got != want || mass[bh * C + j] != m) ++wrong;
        }
      INFO("S=", S, " k=", k, ": ", wrong, " rows wrong, ", ties, " ties at the edge of T");
      CHECK(wrong == 0);
      if (k == 7) CHECK(ties > 0);  // the repeated keys do meet at the edge of T
    }
}

namespace {

// Inputs for the gradchecks (the case and assignment below): central differences move one
// element by +-eps = 1e-2; the gradient is that of the fixed T_j only if no such move changes a
// T_j. Returns the inputs of the first seed whose sets are stable under every such move
// (checked element by element).
const Case kGradCase = make_case(2, 2, 6, 5, 3, 2, 4, 2, {5, 3});
Tensor grad_assignment() {
  return Tensor::from_int_vector(
      {0, 1, 0, 2, -1, 1, 2, 2, 2, 0, -1, -1, 0, 0, 1, 1, 2, 0, 1, -1, 0, 0, 0, 2}, {2, 2, 6});
}
Inputs stable_inputs(const Tensor& lengths) {
  const Case& c = kGradCase;
  const Tensor assignment = grad_assignment();
  auto topk_of = [&](const Tensor& Q, const Tensor& K) {
    return improved_clustered_attention_forward(Q, K, K.clone(), lengths, assignment, c.C, c.k)
        .topk.to_int_vector();
  };
  auto stable = [&](const Inputs& in) {
    const std::vector<int32_t> base = topk_of(in.Q, in.K);
    for (int which = 0; which < 2; ++which)
      for (int64_t x = 0; x < (which ? in.K : in.Q).numel(); ++x)
        for (float eps : {-1e-2f, 1e-2f}) {
          Tensor Q = in.Q.clone(), K = in.K.clone();
          (which ? K : Q).f32()[x] += eps;
          if (topk_of(Q, K) != base) return false;
        }
    return true;
  };
  for (uint32_t seed = 31;; seed += 10) {
    REQUIRE(seed < 31 + 10 * 50);
    Inputs in = make_attention_inputs(c, seed);
    if (stable(in)) {
      INFO("seed ", seed);
      return in;
    }
  }
}

}  // namespace

TEST_CASE("improved clustered attention: gradcheck of Q, K and V with stable top-k sets") {
  // k < L so that m_j < 1 and the gradient through m_j and the non-top-k Ac_j is exercised.
  const Case& c = kGradCase;
  const Tensor assignment = grad_assignment();
  for (const bool with_lengths : {true, false}) {
    const Tensor lengths = with_lengths ? Tensor::from_int_vector(c.lengths, {2}) : Tensor();
    const Inputs in = stable_inputs(lengths);
    INFO(std::string(with_lengths ? "with lengths" : "without lengths"));
    check_grad(
        "fixed assignment, stable top-k sets",
        [&](const std::vector<Variable>& x) {
          return improved_clustered_attention(x[0], x[1], x[2], lengths, assignment, 4, c.k,
                                              with_lengths ? 0.0f : 0.8f);
        },
        {in.Q, in.K, in.V});
  }
}

TEST_CASE("improved clustered attention: Proposition 2, L1 error never above clustered's") {
  auto check_prop2 = [](const Case& c, const Inputs& in) {
    const Tensor full = attention_matrix(AttentionType::full, in.Q, in.K, in.lengths,
                                         in.assignment, c.C, c.k);
    const Tensor cl = attention_matrix(AttentionType::clustered, in.Q, in.K, in.lengths,
                                       in.assignment, c.C, c.k);
    const Tensor im = attention_matrix(AttentionType::improved_clustered, in.Q, in.K,
                                       in.lengths, in.assignment, c.C, c.k);
    const std::vector<float> f = full.to_vector(), a = cl.to_vector(), b = im.to_vector();
    const std::vector<int32_t> asg = in.assignment.to_int_vector();
    int64_t strict = 0;
    for (int64_t row = 0; row < c.B * c.H * c.N; ++row) {
      if (asg[row] < 0) continue;
      double ec = 0, ei = 0;
      for (int64_t l = 0; l < c.S; ++l) {
        ec += std::fabs(double(a[row * c.S + l]) - f[row * c.S + l]);
        ei += std::fabs(double(b[row * c.S + l]) - f[row * c.S + l]);
      }
      CHECK_MESSAGE(ei <= ec + 1e-6, "row ", row, ": improved ", ei, " > clustered ", ec);
      strict += ei < ec - 1e-3;
    }
    // The improvement is real, not only "not worse"; with k = 1 the exact softmax over one key
    // is 1, so both rows coincide and the errors are equal.
    if (c.k > 1) CHECK(strict > 0);
    // The analysis matrix is what the op applies: out = A V.
    const std::vector<float> out = improved_clustered_attention_forward(
        in.Q, in.K, in.V, in.lengths, in.assignment, c.C, c.k).out.to_vector();
    const std::vector<float> V = in.V.to_vector();
    std::vector<float> av(out.size(), 0.0f);
    for (int64_t row = 0; row < c.B * c.H * c.N; ++row)
      for (int64_t m = 0; m < c.M; ++m) {
        double s = 0;
        for (int64_t l = 0; l < c.S; ++l)
          s += double(b[row * c.S + l]) * V[(row / c.N * c.S + l) * c.M + m];
        av[row * c.M + m] = static_cast<float>(s);
      }
    CHECK_CLOSE(out, av, 2e-6, 2e-5);
  };
  uint32_t seed = 300;
  for (const Case& c : {make_case(2, 2, 40, 33, 6, 3, 5, 4, {33, 20}),
                        make_case(1, 3, 17, 17, 4, 2, 3, 1), make_case(1, 1, 64, 50, 8, 2, 8, 10)}) {
    INFO(name_of(c));
    check_prop2(c, make_attention_inputs(c, seed += 10));
  }
  // Structured: 4 groups of similar queries around far-apart directions and a few dominant
  // keys, the regime clustering is made for; round-robin clusters mix the groups on purpose.
  const Case c = make_case(1, 2, 32, 24, 4, 2, 4, 3);
  Inputs in = make_attention_inputs(c, 77);
  std::vector<float> q = random_values(c.B * c.H * c.N * c.E, 78, -0.2f, 0.2f);
  for (int64_t row = 0; row < c.B * c.H * c.N; ++row) q[row * c.E + row % 4] += 3.0f;
  in.Q = Tensor::from_vector(q, in.Q.shape());
  std::vector<float> k = random_values(c.B * c.H * c.S * c.E, 79, -0.5f, 0.5f);
  for (int64_t s = 0; s < c.B * c.H * c.S; s += 5) k[s * c.E + s % 4] += 4.0f;
  in.K = Tensor::from_vector(k, in.K.shape());
  for (const Tensor& a : {round_robin(c), in.assignment}) {
    in.assignment = a;
    check_prop2(c, in);
  }
}

TEST_CASE("improved clustered attention: identical results at 1 and 2 threads") {
  const Case c = make_case(3, 2, 65, 40, 8, 6, 5, 7, {40, 17, 33});
  const Inputs in = make_attention_inputs(c, 51);
  check_thread_independent([&] { return run(c, in); });
}

TEST_CASE("improved clustered attention: one sequence, one head, many clusters: shared") {
  // B = H = 1: with 2 threads the top-k selections, the members' softmax and the dK, dV slots
  // are shared cluster by cluster (overlapping top-k sets: many clusters, few keys); results
  // must equal 1 thread's bit for bit and the plain reference.
  for (const Case& c : {make_case(1, 1, 700, 300, 16, 12, 150, 9, {280}),
                        make_case(1, 1, 1500, 1500, 8, 8, 300, 32),
                        make_case(1, 1, 64, 2000, 4, 3, 70, 40)}) {
    INFO(name_of(c));
    const Inputs in = make_attention_inputs(c, 81);
    check_thread_independent([&] { return run(c, in); });
    ImprovedClusteredAttentionOutput f;
    const Result r = run(c, in, &f);
    const Result e = reference(c, in, f);
    CHECK_CLOSE(r.out, e.out, 2e-6, 2e-5);
    CHECK_CLOSE(r.dQ, e.dQ, 1e-5, 1e-4);
    CHECK_CLOSE(r.dK, e.dK, 1e-5, 1e-4);
    CHECK_CLOSE(r.dV, e.dV, 1e-5, 1e-4);
  }
}

TEST_CASE("improved clustered attention dropout: the documented masks, top-k and remainder") {
  const ClusteredDropout drop{0.3f, 77, 1000};
  uint32_t seed = 500;
  for (const Case& c : {make_case(2, 3, 17, 19, 5, 3, 4, 3, {19, 7}),
                        make_case(1, 1, 129, 129, 8, 6, 10, 20),
                        make_case(1, 1, 600, 500, 8, 4, 90, 16, {480}),
                        make_case(1, 2, 9, 5, 3, 2, 3, 8, {4})}) {  // k > L: no remainder
    INFO(name_of(c));
    const Inputs in = make_attention_inputs(c, seed += 10);
    ImprovedClusteredAttentionOutput f;
    const Result r = run(c, in, &f, drop);
    const Result e = reference(c, in, f, drop);
    CHECK_CLOSE(r.out, e.out, 2e-6, 2e-5);
    CHECK_CLOSE(r.dQ, e.dQ, 1e-5, 1e-4);
    CHECK_CLOSE(r.dK, e.dK, 1e-5, 1e-4);
    CHECK_CLOSE(r.dV, e.dV, 1e-5, 1e-4);
    // The top-k sets and masses are those without dropout.
    ImprovedClusteredAttentionOutput plain;
    const Result none = run(c, in, &plain);
    CHECK(f.topk.to_int_vector() == plain.topk.to_int_vector());
    CHECK(f.mass.to_vector() == plain.mass.to_vector());
    CHECK(r.out != none.out);
    check_thread_independent([&] { return run(c, in, nullptr, drop); });
  }
  const Case c = make_case(2, 2, 20, 20, 4, 4, 3, 5, {20, 11});
  const Inputs in = make_attention_inputs(c, 3);
  const Result none = run(c, in), zero = run(c, in, nullptr, {0.0f, 5, 9});
  CHECK(none.out == zero.out);
  CHECK(none.dQ == zero.dQ);
  CHECK(none.dK == zero.dK);
  CHECK(none.dV == zero.dV);
  CHECK(run(c, in, nullptr, drop).out != run(c, in, nullptr, {0.3f, 77, 1001}).out);
}

TEST_CASE("improved clustered attention dropout: gradcheck with fixed masks") {
  const Case& c = kGradCase;
  const Tensor assignment = grad_assignment();
  const Tensor lengths = Tensor::from_int_vector(c.lengths, {2});
  const Inputs in = stable_inputs(lengths);
  for (float p : {0.3f, 0.6f}) {
    INFO("p = ", p);
    check_grad(
        "dropout with the same masks in every evaluation",
        [&](const std::vector<Variable>& x) {
          return improved_clustered_attention(x[0], x[1], x[2], lengths, assignment, 4, c.k, 0.0f,
                                              {p, 321, 5});
        },
        {in.Q, in.K, in.V});
  }
}

TEST_CASE("improved clustered attention dropout: the mean over many masks is the output") {
  // As for clustered attention: values in [0.5, 1.5], outputs near 1, 2000 masks; both masks
  // (top-k slots and the remainder) take part (k = 3 of 6 keys).
  const Case c = make_case(1, 2, 8, 6, 4, 3, 3, 3);
  Inputs in = make_attention_inputs(c, 11);
  in.V = random_tensor({c.B, c.H, c.S, c.M}, 12, 0.5f, 1.5f);
  const std::vector<float> expected = run(c, in).out;
  std::vector<double> mean(expected.size(), 0.0);
  const int masks = 2000;
  ThreadCount one(1);  // a statistical check: 2000 small calls, faster on one thread
  for (int s = 0; s < masks; ++s) {
    const std::vector<float> out =
        improved_clustered_attention_forward(in.Q, in.K, in.V, {}, in.assignment, c.C, c.k, 0.0f,
                                             {0.3f, 1000 + uint64_t(s), 0})
            .out.to_vector();
    for (size_t x = 0; x < out.size(); ++x) mean[x] += out[x] / double(masks);
  }
  std::vector<float> m(mean.begin(), mean.end());
  CHECK_CLOSE(m, expected, 0.035, 0.0);
}

TEST_CASE("attention(): improved-clustered = cluster_queries then improved_clustered_attention") {
  const Case c = make_case(2, 2, 24, 24, 6, 4, 1, 1, {24, 15});
  const Inputs in = make_attention_inputs(c, 61);
  AttentionConfig config;
  config.type = AttentionType::improved_clustered;
  config.clusters = 5;
  config.topk = 6;
  config.bits = 16;
  config.iterations = 4;
  Generator gen(9), same(9);
  const Variable Q(in.Q, true), K(in.K, true), V(in.V, true);
  const Variable out = attention(config, Q, K, V, in.lengths, gen, false);
  const Clustering cl = cluster_queries(in.Q, in.lengths, {5, 16, 4}, same);
  CHECK(gen.offset() == same.offset());
  CHECK(out.data().to_vector() == improved_clustered_attention_forward(
                                      in.Q, in.K, in.V, in.lengths, cl.assignment, 5, 6)
                                      .out.to_vector());
  sum_all(out * Variable(in.dO)).backward();
  CHECK(Q.grad().shape() == in.Q.shape());
  CHECK(K.grad().shape() == in.K.shape());
  CHECK(V.grad().shape() == in.V.shape());
  // Refusal as for clustered: causal (AttentionConfig).
  AttentionConfig causal = config;
  causal.causal = true;
  CHECK_ERROR(attention(causal, Q, K, V, in.lengths, gen, false), "causal", "improved-clustered");
  // Dropout: none in evaluation; in training the masks' blocks come after the clustering's.
  AttentionConfig dropout = config;
  dropout.dropout = 0.2f;
  Generator e1(9), t1(9), expect(9);
  CHECK(attention(dropout, Q, K, V, in.lengths, e1, false).data().to_vector() ==
        out.data().to_vector());
  const Variable trained = attention(dropout, Q, K, V, in.lengths, t1, true);
  const Clustering cl2 = cluster_queries(in.Q, in.lengths, {5, 16, 4}, expect);
  const uint64_t offset =
      expect.reserve(improved_clustered_attention_dropout_blocks(in.Q, in.K, 5, 6));
  CHECK(t1.offset() == expect.offset());
  CHECK(improved_clustered_attention_dropout_blocks(in.Q, in.K, 5, 6) ==
        uint64_t(2 * 2 * 5 * 24 + 2 * 2 * 24 * 6 + 3) / 4);
  CHECK(trained.data().to_vector() ==
        improved_clustered_attention_forward(in.Q, in.K, in.V, in.lengths, cl2.assignment, 5, 6,
                                             0.0f, {0.2f, 9, offset})
            .out.to_vector());
  CHECK(trained.data().to_vector() != out.data().to_vector());
}

TEST_CASE("improved clustered attention: argument errors name the op, the argument and values") {
  const Tensor Q = random_tensor({2, 3, 4, 5}, 1), K = random_tensor({2, 3, 6, 5}, 2),
               V = random_tensor({2, 3, 6, 7}, 3);
  const Tensor a = Tensor::zeros({2, 3, 4}, DType::i32);
  const char* op = "improved_clustered_attention";
  CHECK_ERROR(improved_clustered_attention_forward(Q, K, V, {}, a, 2, 0), op, "topk >= 1", "0");
  CHECK_ERROR(improved_clustered_attention_forward(Q, K, V, {}, a, 2, -3), op, "topk >= 1");
  CHECK_ERROR(improved_clustered_attention_forward(Q, K, V, {}, a, 0, 2), op, "clusters >= 1");
  CHECK_ERROR(improved_clustered_attention_forward(Q, K, V, {}, a, 2, 2, 0.0f, {1.5f, 0, 0}), op,
              "dropout probability in [0, 1)", "got 1.5");
  std::vector<int32_t> bad(24, 0);
  bad[17] = 2;
  CHECK_ERROR(improved_clustered_attention_forward(Q, K, V, {}, Tensor::from_int_vector(bad, {2, 3, 4}), 2, 2),
              op, "assignment value 2 at (1, 1, 1)", "[-1, C = 2)");
  CHECK_ERROR(improved_clustered_attention_forward(Q, random_tensor({2, 3, 6, 4}, 2), V, {}, a, 2, 2),
              op, "K of shape (B, H, S, E) = (2, 3, S, 5)");
  CHECK_ERROR(improved_clustered_attention_forward(Q, K, V, Tensor::from_int_vector({6, 7}, {2}), a, 2, 2),
              op, "lengths[1] = 7");
  CHECK_ERROR(improved_clustered_attention_forward(Q, K, V, {}, Tensor::zeros({2, 3, 4}), 2, 2),
              op, "assignment", "i32");
  const ImprovedClusteredAttentionOutput f = improved_clustered_attention_forward(Q, K, V, {}, a, 2, 2);
  CHECK_ERROR(improved_clustered_attention_backward(random_tensor({2, 3, 4, 5}, 4), Q, K, V, {}, a, f),
              "improved_clustered_attention_backward", "dout", "(2, 3, 4, 7)");
  ImprovedClusteredAttentionOutput wrong = f;
  wrong.mass = random_tensor({2, 3, 3}, 5);
  CHECK_ERROR(improved_clustered_attention_backward(f.out, Q, K, V, {}, a, wrong),
              "improved_clustered_attention_backward", "mass", "(2, 3, 2)");
}
