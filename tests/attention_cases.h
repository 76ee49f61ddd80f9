// Shapes and random inputs shared by the clustered and improved-clustered attention tests.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "autograd/variable.h"
#include "check.h"
#include "core/philox.h"
#include "core/tensor.h"
#include "layers/attention/clustered.h"

namespace clustr::test {

struct AttentionCase {
  int64_t B = 1, H = 1, N = 1, S = 1, E = 1, M = 1, C = 1, k = 1;  // k: improved-clustered only
  std::vector<int32_t> lengths;  // empty: no key mask
  float temperature = 0.0f;
};

struct AttentionInputs {
  Tensor Q, K, V, dO, lengths, assignment;
};

struct AttentionResult {
  std::vector<float> out, dQ, dK, dV;
};

// Random Q, K, V, dO; assignment uniform in [-1, C - 1) when C > 1, so cluster C - 1 is always
// empty and about 1 in C queries is padding (-1); with C == 1 every query is in cluster 0.
inline AttentionInputs make_attention_inputs(const AttentionCase& c, uint32_t seed) {
  AttentionInputs in;
  in.Q = random_tensor({c.B, c.H, c.N, c.E}, seed);
  in.K = random_tensor({c.B, c.H, c.S, c.E}, seed + 1);
  in.V = random_tensor({c.B, c.H, c.S, c.M}, seed + 2);
  in.dO = random_tensor({c.B, c.H, c.N, c.M}, seed + 3);
  if (!c.lengths.empty()) in.lengths = Tensor::from_int_vector(c.lengths, {c.B});
  std::mt19937 rng(seed + 4);
  std::uniform_int_distribution<int32_t> pick(c.C > 1 ? -1 : 0, c.C > 1 ? int32_t(c.C) - 2 : 0);
  std::vector<int32_t> a(static_cast<size_t>(c.B * c.H * c.N));
  for (int32_t& x : a) x = pick(rng);
  in.assignment = Tensor::from_int_vector(a, {c.B, c.H, c.N});
  return in;
}

// The output of f(Q, K, V), Variables of in's tensors that require grad, and the gradients of
// sum(dO * out) (zeros for an input the output does not reach): a differentiable op or one of
// layers/attention/reference.h's, run as a test compares them.
template <class F>
AttentionResult autograd_result(const AttentionInputs& in, F f) {
  Variable Q(in.Q, true), K(in.K, true), V(in.V, true);
  const Variable out = f(Q, K, V);
  out.backward(in.dO);
  auto grad = [](const Variable& x) {
    return x.grad().defined() ? x.grad().to_vector()
                              : std::vector<float>(static_cast<size_t>(x.numel()), 0.0f);
  };
  return {out.data().to_vector(), grad(Q), grad(K), grad(V)};
}

// What mask element idx of a clustered type's dropout stream (clustered.h) multiplies its weight
// by: 1 / (1 - p) when kept, 0 when dropped; 1 without dropout. Written from the documented
// definition, independently of the kernels.
inline double keep_factor(const ClusteredDropout& d, uint64_t idx) {
  if (d.p <= 0.0f) return 1.0;
  const Philox4 r = philox4x32(d.seed, d.offset.value + idx / 4);
  return uint_to_unit(r.v[idx % 4]) >= d.p ? 1.0 / (1.0 - double(d.p)) : 0.0;
}

inline std::string name_of(const AttentionCase& c) {
  return "B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " N=" + std::to_string(c.N) +
         " S=" + std::to_string(c.S) + " E=" + std::to_string(c.E) + " M=" + std::to_string(c.M) +
         " C=" + std::to_string(c.C) + " k=" + std::to_string(c.k) +
         (c.lengths.empty() ? "" : " with lengths");
}

// Runs `run()` (returning an AttentionResult) at 1 and at 2 threads; the results must be
// bit-identical. With one (b, h) pair, 2 threads share the pair's work (clusters, queries, keys)
// while 1 thread runs it alone, so this also compares the two ways the kernels split work.
template <typename Run>
void check_thread_independent(Run run) {
  AttentionResult one, two;
  {
    ThreadCount t(1);
    one = run();
  }
  {
    ThreadCount t(2);
    two = run();
  }
  CHECK(one.out == two.out);
  CHECK(one.dQ == two.dQ);
  CHECK(one.dK == two.dK);
  CHECK(one.dV == two.dV);
}

}  // namespace clustr::test
