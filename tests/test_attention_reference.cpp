// The plain references of layers/attention/reference.h against the fused ops (full.h,
// clustered.h, improved_clustered.h): the output and the gradients of Q, K and V over sizes 1,
// 3, 17 and 33 with N != S and E != M, padded keys and queries, empty clusters, a sequence
// without keys and causal masks; the references against each other where the paper says they
// agree (one query per cluster is full attention; k >= L makes improved-clustered attention
// full attention); full attention's dropout mask; the references' own top-k sets; argument
// errors.
#include "attention_cases.h"
#include "autograd/ops.h"
#include "check.h"
#include "layers/attention/full.h"
#include "layers/attention/improved_clustered.h"
#include "layers/attention/reference.h"

namespace {

using clustr::Tensor;
using clustr::Variable;
using clustr::test::AttentionCase;
using clustr::test::AttentionInputs;
using clustr::test::AttentionResult;
using clustr::test::make_attention_inputs;
using clustr::test::name_of;

template <class F>
AttentionResult run(F f, const AttentionInputs& in) {
  return clustr::test::autograd_result(in, f);
}

// Both sides sum in float32 in other orders: a few units of rounding on values of order 1 (the
// worst difference seen over these cases was 8e-7).
void check_same(const AttentionResult& got, const AttentionResult& want) {
  constexpr double atol = 3e-6, rtol = 3e-5;
  INFO("out");
  CHECK_CLOSE(got.out, want.out, atol, rtol);
  INFO("dQ");
  CHECK_CLOSE(got.dQ, want.dQ, atol, rtol);
  INFO("dK");
  CHECK_CLOSE(got.dK, want.dK, atol, rtol);
  INFO("dV");
  CHECK_CLOSE(got.dV, want.dV, atol, rtol);
}

AttentionCase make_case(int64_t B, int64_t H, int64_t N, int64_t S, int64_t E, int64_t M,
                        int64_t C, int64_t k, std::vector<int32_t> lengths = {}) {
  AttentionCase c;
  c.B = B, c.H = H, c.N = N, c.S = S, c.E = E, c.M = M, c.C = C, c.k = k;
  c.lengths = std::move(lengths);
  return c;
}

// Sizes 1, 3, 17, 33; N != S, E != M; lengths with a padded tail and a sequence without keys.
std::vector<AttentionCase> cases() {
  return {make_case(1, 1, 1, 1, 1, 1, 1, 1),
          make_case(2, 3, 3, 17, 4, 5, 3, 2),
          make_case(2, 2, 17, 17, 8, 3, 5, 4, {17, 9}),
          make_case(3, 1, 33, 17, 3, 8, 7, 5, {17, 0, 6}),
          make_case(1, 2, 17, 33, 5, 4, 4, 40)};  // k past S
}

}  // namespace

TEST_CASE("attention reference: full attention is the fused op, with masks and causal") {
  for (const AttentionCase& c : cases())
    for (bool causal : {false, true}) {
      if (causal && c.N != c.S) continue;
      INFO(name_of(c), causal ? " causal" : "");
      const AttentionInputs in = make_attention_inputs(c, 11);
      clustr::FullAttentionOptions o;
      o.causal = causal;
      const AttentionResult fused = run(
          [&](const Variable& Q, const Variable& K, const Variable& V) {
            return clustr::full_attention(Q, K, V, in.lengths, o);
          },
          in);
      const AttentionResult reference = run(
          [&](const Variable& Q, const Variable& K, const Variable& V) {
            return clustr::full_attention_reference(Q, K, V, in.lengths, o);
          },
          in);
      check_same(fused, reference);
    }
}

TEST_CASE("attention reference: full attention's dropout mask is the fused op's") {
  // (The clustered types' masks: test_clustered_attention.cpp, test_improved_clustered.cpp.)
  for (const AttentionCase& c : {make_case(2, 2, 17, 17, 8, 3, 1, 1, {17, 9}),
                                 make_case(1, 3, 5, 33, 4, 6, 1, 1)}) {
    INFO(name_of(c));
    const AttentionInputs in = make_attention_inputs(c, 15);
    clustr::FullAttentionOptions o;
    o.dropout = 0.3f, o.seed = 99, o.offset = 12;
    o.causal = c.N == c.S;
    const AttentionResult fused = run(
        [&](const Variable& Q, const Variable& K, const Variable& V) {
          return clustr::full_attention(Q, K, V, in.lengths, o);
        },
        in);
    const AttentionResult reference = run(
        [&](const Variable& Q, const Variable& K, const Variable& V) {
          return clustr::full_attention_reference(Q, K, V, in.lengths, o);
        },
        in);
    check_same(fused, reference);
  }
}

TEST_CASE("attention reference: clustered attention is the fused op") {
  for (const AttentionCase& c : cases()) {
    INFO(name_of(c));
    const AttentionInputs in = make_attention_inputs(c, 21);
    const AttentionResult fused = run(
        [&](const Variable& Q, const Variable& K, const Variable& V) {
          return clustr::clustered_attention(Q, K, V, in.lengths, in.assignment, c.C);
        },
        in);
    const AttentionResult reference = run(
        [&](const Variable& Q, const Variable& K, const Variable& V) {
          return clustr::clustered_attention_reference(Q, K, V, in.lengths, in.assignment, c.C);
        },
        in);
    check_same(fused, reference);
  }
}

TEST_CASE("attention reference: improved-clustered attention is the fused op") {
  for (const AttentionCase& c : cases()) {
    INFO(name_of(c));
    const AttentionInputs in = make_attention_inputs(c, 31);
    // The fused op's top-k sets, so that a near-tie that the two sides round differently
    // cannot pick different keys.
    const Tensor sets = clustr::improved_clustered_attention_forward(
                            in.Q, in.K, in.V, in.lengths, in.assignment, c.C, c.k)
                            .topk;
    const AttentionResult fused = run(
        [&](const Variable& Q, const Variable& K, const Variable& V) {
          return clustr::improved_clustered_attention(Q, K, V, in.lengths, in.assignment, c.C,
                                                      c.k);
        },
        in);
    const AttentionResult reference = run(
        [&](const Variable& Q, const Variable& K, const Variable& V) {
          return clustr::improved_clustered_attention_reference(Q, K, V, in.lengths,
                                                                in.assignment, c.C, c.k, 0.0f,
                                                                sets);
        },
        in);
    check_same(fused, reference);
    // These random inputs have no near-ties: the reference's own sets are the same.
    const AttentionResult own = run(
        [&](const Variable& Q, const Variable& K, const Variable& V) {
          return clustr::improved_clustered_attention_reference(Q, K, V, in.lengths,
                                                                in.assignment, c.C, c.k);
        },
        in);
    check_same(own, reference);
  }
}

TEST_CASE("attention reference: one query per cluster, or k >= L, is full attention") {
  const AttentionCase c = make_case(2, 2, 17, 17, 6, 5, 17, 17, {17, 8});
  AttentionInputs in = make_attention_inputs(c, 41);
  // Query i alone in cluster i; the padded queries of the second sequence in no cluster.
  std::vector<int32_t> a(static_cast<size_t>(c.B * c.H * c.N));
  for (int64_t p = 0; p < c.B * c.H; ++p)
    for (int64_t i = 0; i < c.N; ++i) a[p * c.N + i] = i < c.lengths[p / c.H] ? int32_t(i) : -1;
  in.assignment = Tensor::from_int_vector(a, {c.B, c.H, c.N});
  const AttentionResult full = run(
      [&](const Variable& Q, const Variable& K, const Variable& V) {
        return clustr::full_attention_reference(Q, K, V, in.lengths);
      },
      in);
  INFO("clustered, one query per cluster");
  check_same(run(
                 [&](const Variable& Q, const Variable& K, const Variable& V) {
                   return clustr::clustered_attention_reference(Q, K, V, in.lengths,
                                                                in.assignment, c.C);
                 },
                 in),
             full);
  // k >= L with two queries per cluster: each query's own softmax over every valid key.
  for (int32_t& x : a) x = x < 0 ? -1 : x / 2;
  in.assignment = Tensor::from_int_vector(a, {c.B, c.H, c.N});
  INFO("improved-clustered, k >= L");
  check_same(run(
                 [&](const Variable& Q, const Variable& K, const Variable& V) {
                   return clustr::improved_clustered_attention_reference(
                       Q, K, V, in.lengths, in.assignment, c.C, c.S);
                 },
                 in),
             full);
}

TEST_CASE("attention reference: argument errors name the reference and what was expected") {
  const AttentionCase c = make_case(2, 1, 3, 4, 2, 2, 2, 1, {4, 2});
  const AttentionInputs in = make_attention_inputs(c, 51);
  const Variable Q(in.Q), K(in.K), V(in.V);
  clustr::FullAttentionOptions causal;
  causal.causal = true;
  CHECK_ERROR(clustr::full_attention_reference(Q, K, V, in.lengths, causal),
              "full_attention_reference", "causal attention needs N == S");
  CHECK_ERROR(clustr::full_attention_reference(K, Q, V, in.lengths),
              "full_attention_reference", "V (B, H, S, M)");
  const Tensor a = Tensor::from_int_vector({0, 1, -1, 0, 0, 1}, {2, 1, 3});
  CHECK_ERROR(clustr::clustered_attention_reference(Q, K, V, in.lengths, a, 1),
              "clustered_attention_reference", "assignment value 1", "outside [-1, C = 1)");
  CHECK_ERROR(clustr::improved_clustered_attention_reference(Q, K, V, in.lengths,
                                                             in.assignment, c.C, 0),
              "improved_clustered_attention_reference", "topk >= 1");
  // Key 3 in a set of the first sequence, which has 2 valid keys.
  const Tensor sets = Tensor::from_int_vector({3, -1, 0, -1}, {2, 1, 2, 1});
  CHECK_ERROR(clustr::improved_clustered_attention_reference(
                  Q, K, V, Tensor::from_int_vector({2, 2}, {2}), in.assignment, c.C, 1, 0.0f,
                  sets),
              "improved_clustered_attention_reference", "topk_sets value 3");
}
