// The fused full attention (layers/attention/full.h) against an explicit reference: plain loops
// in double that build every (b, h) attention matrix, then the output and every gradient from
// it. Shapes cover sizes 1, 3, 17, 129, N != S, E != M, several query blocks and key tiles;
// masks: key lengths with padded queries, causal, rows that see no key. Then gradcheck, padding
// invariance, dropout (against the reference, which regenerates the documented Philox mask),
// identical results at 1 and 2 threads, argument errors, and the AttentionConfig / attention()
// dispatcher.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"
#include "check.h"
#include "core/philox.h"
#include "core/random.h"
#include "layers/attention/attention.h"
#include "layers/attention/config.h"
#include "layers/attention/full.h"

using namespace clustr;
using namespace clustr::test;

namespace {

struct Case {
  int64_t B = 1, H = 1, N = 1, S = 1, E = 1, M = 1;
  std::vector<int32_t> lengths;  // empty: no key mask
  FullAttentionOptions options;
};

struct Inputs {
  Tensor Q, K, V, dO, lengths;
};

Inputs make_inputs(const Case& c, uint32_t seed, float scale = 1.0f) {
  Inputs in;
  in.Q = random_tensor({c.B, c.H, c.N, c.E}, seed, -scale, scale);
  in.K = random_tensor({c.B, c.H, c.S, c.E}, seed + 1, -scale, scale);
  in.V = random_tensor({c.B, c.H, c.S, c.M}, seed + 2);
  in.dO = random_tensor({c.B, c.H, c.N, c.M}, seed + 3);
  if (!c.lengths.empty()) in.lengths = Tensor::from_int_vector(c.lengths, {c.B});
  return in;
}

struct Result {
  std::vector<float> out, lse, dQ, dK, dV;
};

// The explicit reference, in double: for each (b, h) the N x S weights A (softmax over the
// keys row i sees), Ad = A keep / (1 - p), out = Ad V, and backward by the chain rule:
// dV = Ad^T dO, dA = keep / (1 - p) (dO V^T), dS = A (dA - rowsum(A dA)), dQ = t dS K,
// dK = t dS^T Q. Padded rows (i >= lengths[b] when N == S) and rows with no key give 0.
Result reference(const Case& c, const Inputs& in) {
  const int64_t B = c.B, H = c.H, N = c.N, S = c.S, E = c.E, M = c.M;
  const FullAttentionOptions& o = c.options;
  const double t = o.temperature > 0 ? o.temperature : 1.0 / std::sqrt(double(E));
  const double p = o.dropout, scale = 1.0 / (1.0 - p);
  const std::vector<float> Q = in.Q.to_vector(), K = in.K.to_vector(), V = in.V.to_vector(),
                           dO = in.dO.to_vector();
  Result r;
  r.out.assign(B * H * N * M, 0.0f);
  r.lse.assign(B * H * N, -INFINITY);
  r.dQ.assign(B * H * N * E, 0.0f);
  std::vector<double> dK(B * H * S * E, 0.0), dV(B * H * S * M, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = b * H + h;
      const int64_t L = c.lengths.empty() ? S : c.lengths[b];
      const int64_t queries = (!c.lengths.empty() && N == S) ? L : N;
      for (int64_t i = 0; i < queries; ++i) {
        const int64_t seen = o.causal ? std::min(L, i + 1) : L;
        if (seen == 0) continue;
        std::vector<double> a(seen), keep(seen, 1.0), dA(seen);
        double mx = -INFINITY;
        for (int64_t j = 0; j < seen; ++j) {
          double s = 0;
          for (int64_t e = 0; e < E; ++e) s += double(Q[(bh * N + i) * E + e]) * K[(bh * S + j) * E + e];
          a[j] = t * s;
          mx = std::max(mx, a[j]);
        }
        double sum = 0;
        for (double& x : a) sum += (x = std::exp(x - mx));
        for (double& x : a) x /= sum;
        r.lse[bh * N + i] = float(mx + std::log(sum));
        if (p > 0)
          for (int64_t j = 0; j < seen; ++j) {
            const uint64_t idx = uint64_t((bh * N + i) * S + j);
            const uint32_t bits = philox4x32(o.seed, o.offset.value + idx / 4).v[idx % 4];
            keep[j] = uint_to_unit(bits) >= float(p) ? scale : 0.0;
          }
        double rowsum = 0;
        for (int64_t j = 0; j < seen; ++j) {
          double g = 0;
          for (int64_t m = 0; m < M; ++m) {
            g += double(dO[(bh * N + i) * M + m]) * V[(bh * S + j) * M + m];
            dV[(bh * S + j) * M + m] += a[j] * keep[j] * dO[(bh * N + i) * M + m];
          }
          dA[j] = keep[j] * g;
          rowsum += a[j] * dA[j];
        }
        for (int64_t m = 0; m < M; ++m) {
          double acc = 0;
          for (int64_t j = 0; j < seen; ++j) acc += a[j] * keep[j] * V[(bh * S + j) * M + m];
          r.out[(bh * N + i) * M + m] = float(acc);
        }
        for (int64_t j = 0; j < seen; ++j) {
          const double ds = a[j] * (dA[j] - rowsum) * t;
          for (int64_t e = 0; e < E; ++e) {
            r.dQ[(bh * N + i) * E + e] += float(ds * K[(bh * S + j) * E + e]);
            dK[(bh * S + j) * E + e] += ds * Q[(bh * N + i) * E + e];
          }
        }
      }
    }
  r.dK.assign(dK.begin(), dK.end());
  r.dV.assign(dV.begin(), dV.end());
  return r;
}

Result ours(const Case& c, const Inputs& in) {
  FullAttentionOutput f = full_attention_forward(in.Q, in.K, in.V, in.lengths, c.options);
  FullAttentionGrads g = full_attention_backward(in.dO, in.Q, in.K, in.V, f.out, f.logsumexp,
                                                 in.lengths, c.options);
  return {f.out.to_vector(), f.logsumexp.to_vector(), g.dQ.to_vector(), g.dK.to_vector(),
          g.dV.to_vector()};
}

std::string name_of(const Case& c) {
  std::string s = "B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " N=" +
                  std::to_string(c.N) + " S=" + std::to_string(c.S) + " E=" +
                  std::to_string(c.E) + " M=" + std::to_string(c.M);
  if (!c.lengths.empty()) {
    s += " lengths=";
    for (int32_t l : c.lengths) s += std::to_string(l) + ",";
  }
  if (c.options.causal) s += " causal";
  if (c.options.dropout > 0) s += " dropout=" + std::to_string(c.options.dropout);
  return s;
}

// Float results against the double reference. Outputs are convex combinations of values in
// [-2, 2] and the gradients sums of S such terms: float rounding over S terms stays far below
// these tolerances, while a wrong mask, scale or transposition is off by O(1). `loose`
// widens them for large logits x, whose float rounding (|x| 2^-24) moves every weight by a
// relative |x| 2^-24.
void check_against_reference(const Case& c, const Inputs& in, double loose = 1.0) {
  INFO(name_of(c));
  const Result want = reference(c, in), got = ours(c, in);
  CHECK_CLOSE(got.out, want.out, 2e-6 * loose, 2e-5 * loose);
  CHECK_CLOSE(got.lse, want.lse, 2e-6 * loose, 2e-6 * loose);
  CHECK_CLOSE(got.dQ, want.dQ, 1e-5 * loose, 1e-4 * loose);
  CHECK_CLOSE(got.dK, want.dK, 1e-5 * loose, 1e-4 * loose);
  CHECK_CLOSE(got.dV, want.dV, 1e-5 * loose, 1e-4 * loose);
}

void check_against_reference(const Case& c, uint32_t seed, float scale = 1.0f,
                             double loose = 1.0) {
  check_against_reference(c, make_inputs(c, seed, scale), loose);
}

Case make_case(int64_t B, int64_t H, int64_t N, int64_t S, int64_t E, int64_t M,
               std::vector<int32_t> lengths = {}, bool causal = false) {
  Case c;
  c.B = B, c.H = H, c.N = N, c.S = S, c.E = E, c.M = M;
  c.lengths = std::move(lengths);
  c.options.causal = causal;
  return c;
}

using Fn = std::function<Variable(const std::vector<Variable>&)>;

Fn attention_fn(const Tensor& lengths, const FullAttentionOptions& options) {
  return [lengths, options](const std::vector<Variable>& v) {
    return full_attention(v[0], v[1], v[2], lengths, options);
  };
}

}  // namespace

TEST_CASE("full attention matches the explicit reference on awkward shapes") {
  for (const Case& c : {make_case(1, 1, 1, 1, 1, 1), make_case(2, 3, 3, 17, 5, 3),
                        make_case(1, 2, 17, 3, 4, 7), make_case(2, 1, 129, 129, 8, 16),
                        make_case(1, 1, 3, 129, 17, 1), make_case(1, 2, 300, 40, 6, 5)})
    check_against_reference(c, 11);
}

TEST_CASE("full attention with key lengths: padded keys and queries, rows that see no key") {
  // Cross-attention (N != S): only keys are masked; length 0 leaves every row without a key.
  check_against_reference(make_case(3, 2, 5, 17, 4, 3, {17, 6, 0}), 21);
  // Self-attention: rows >= lengths[b] are padding too.
  check_against_reference(make_case(3, 2, 17, 17, 4, 3, {17, 9, 1}), 22);
  check_against_reference(make_case(2, 1, 129, 129, 3, 5, {129, 0}), 23);
  // No keys at all, and no queries at all.
  check_against_reference(make_case(2, 2, 3, 0, 4, 3), 24);
  check_against_reference(make_case(2, 2, 0, 5, 4, 3), 25);
}

TEST_CASE("causal full attention equals the explicitly masked reference") {
  check_against_reference(make_case(2, 2, 17, 17, 5, 3, {}, true), 31);
  check_against_reference(make_case(2, 2, 129, 129, 4, 6, {129, 70}, true), 32);
  check_against_reference(make_case(1, 1, 1, 1, 3, 2, {}, true), 33);
}

TEST_CASE("long sequences: the blocked path (several query blocks and key tiles) equals the reference") {
  // 128-row query blocks and 512-column key tiles: 5 blocks and 2 tiles, with partial last ones.
  check_against_reference(make_case(1, 1, 600, 600, 16, 8, {}, false), 41);
  check_against_reference(make_case(2, 1, 600, 600, 8, 16, {600, 530}, true), 42);
  check_against_reference(make_case(1, 2, 150, 1100, 8, 4, {}, false), 43);
}

TEST_CASE("large logits: the online softmax does not overflow") {
  // Scores up to t * E * 20^2 = 0.5 * 4 * 400 = 800: exp would overflow without the max shift.
  // Rounding the scores to float alone moves the weights by up to 800 * 2^-24 = 5e-5 relative.
  Case c = make_case(1, 2, 40, 700, 4, 3);
  c.options.temperature = 0.5f;
  check_against_reference(c, 51, 20.0f, 10.0);
  // Every score negative, down to -800: the shift must be the least negative one, or exp
  // overflows (a shift that is too low) or every weight underflows (too high).
  Inputs in = make_inputs(c, 52);
  in.Q = random_tensor(in.Q.shape(), 53, 1.0f, 20.0f);
  in.K = random_tensor(in.K.shape(), 54, -20.0f, -1.0f);
  check_against_reference(c, in, 10.0);
}

TEST_CASE("temperature <= 0 means 1/sqrt(E); a given temperature is used as is") {
  const Case c = make_case(1, 2, 6, 9, 16, 4);
  const Inputs in = make_inputs(c, 61);
  FullAttentionOptions quarter;
  quarter.temperature = 0.25f;  // 1/sqrt(16)
  CHECK(full_attention_forward(in.Q, in.K, in.V, {}, {}).out.to_vector() ==
        full_attention_forward(in.Q, in.K, in.V, {}, quarter).out.to_vector());
  Case hot = c;
  hot.options.temperature = 2.0f;
  check_against_reference(hot, 61);
}

TEST_CASE("gradcheck of full attention in Q, K and V, with padding and causal") {
  {
    const Case c = make_case(2, 2, 4, 5, 3, 2, {5, 3});
    const Inputs in = make_inputs(c, 71);
    check_grad("cross-attention, key lengths", attention_fn(in.lengths, c.options),
               {in.Q, in.K, in.V});
  }
  {
    const Case c = make_case(2, 1, 5, 5, 3, 4, {5, 3}, true);
    const Inputs in = make_inputs(c, 72);
    check_grad("self-attention, padded queries, causal", attention_fn(in.lengths, c.options),
               {in.Q, in.K, in.V});
  }
  {
    Case c = make_case(1, 2, 3, 4, 2, 3);
    c.options.temperature = 0.7f;
    const Inputs in = make_inputs(c, 73);
    check_grad("temperature 0.7", attention_fn(in.lengths, c.options), {in.Q, in.K, in.V});
  }
}

TEST_CASE("padding invariance: padded content changes nothing at valid positions") {
  const Case c = make_case(2, 2, 150, 150, 4, 3, {150, 97}, false);
  for (bool causal : {false, true}) {
    Case cc = c;
    cc.options.causal = causal;
    INFO("causal " << causal);
    const Inputs a = make_inputs(cc, 81);
    Inputs b = make_inputs(cc, 81);
    // Overwrite every padded row of sequence 1 (positions >= 97) in Q, K, V and dO.
    Inputs noise = make_inputs(cc, 82, 5.0f);
    for (Tensor* t : {&b.Q, &b.K, &b.V, &b.dO}) {
      const Tensor* src = t == &b.Q ? &noise.Q : t == &b.K ? &noise.K : t == &b.V ? &noise.V
                                                                                 : &noise.dO;
      std::vector<float> v = t->to_vector(), w = src->to_vector();
      const int64_t rows = t->size(2), width = t->size(3);
      for (int64_t h = 0; h < cc.H; ++h)
        for (int64_t i = 97; i < rows; ++i)
          for (int64_t e = 0; e < width; ++e) {
            const int64_t at = ((1 * cc.H + h) * rows + i) * width + e;
            v[at] = w[at];
          }
      *t = Tensor::from_vector(v, t->shape());
    }
    const Result ra = ours(cc, a), rb = ours(cc, b);
    CHECK(ra.out == rb.out);
    CHECK(ra.lse == rb.lse);
    CHECK(ra.dQ == rb.dQ);
    CHECK(ra.dK == rb.dK);
    CHECK(ra.dV == rb.dV);
    // And the padded positions themselves get 0 output and 0 gradient.
    const std::vector<float> zeros_o(53 * 3, 0.0f), zeros_q(53 * 4, 0.0f);
    for (int64_t h = 0; h < cc.H; ++h) {
      const int64_t o0 = ((1 * cc.H + h) * 150 + 97);
      CHECK(std::vector<float>(rb.out.begin() + o0 * 3, rb.out.begin() + (o0 + 53) * 3) == zeros_o);
      CHECK(std::vector<float>(rb.dQ.begin() + o0 * 4, rb.dQ.begin() + (o0 + 53) * 4) == zeros_q);
      CHECK(std::vector<float>(rb.dK.begin() + o0 * 4, rb.dK.begin() + (o0 + 53) * 4) == zeros_q);
      CHECK(std::vector<float>(rb.dV.begin() + o0 * 3, rb.dV.begin() + (o0 + 53) * 3) == zeros_o);
    }
  }
}

TEST_CASE("attention dropout: the documented Philox mask, reproducible, with a consistent gradient") {
  Case c = make_case(2, 2, 17, 19, 4, 3, {19, 11});
  c.options.dropout = 0.3f;
  c.options.seed = 1234;
  c.options.offset = 77;
  check_against_reference(c, 91);  // the reference draws the mask from the documented formula
  Case tiles = make_case(1, 2, 130, 1100, 4, 3, {}, false);  // 2 query blocks, 3 key tiles
  tiles.options = c.options;
  check_against_reference(tiles, 94);

  const Inputs in = make_inputs(c, 92);
  const std::vector<float> once = full_attention_forward(in.Q, in.K, in.V, in.lengths,
                                                         c.options).out.to_vector();
  CHECK(once == full_attention_forward(in.Q, in.K, in.V, in.lengths, c.options).out.to_vector());
  FullAttentionOptions other = c.options;
  other.seed = 1235;
  CHECK(once != full_attention_forward(in.Q, in.K, in.V, in.lengths, other).out.to_vector());
  CHECK(full_attention_dropout_blocks(in.Q, in.K) == uint64_t((2 * 2 * 17 * 19 + 3) / 4));

  Case small = make_case(1, 2, 4, 5, 3, 2, {5});
  small.options = c.options;
  const Inputs s = make_inputs(small, 93);
  check_grad("dropout 0.3 with a fixed seed and offset", attention_fn(s.lengths, small.options),
             {s.Q, s.K, s.V});
}

TEST_CASE("results are identical at 1 and 2 threads") {
  // B H = 1 splits each (b, h) into chunks for dK, dV; B H = 6 does not.
  for (Case c : {make_case(1, 1, 700, 700, 8, 4, {640}, true), make_case(2, 3, 300, 200, 5, 7)}) {
    INFO(name_of(c));
    c.options.dropout = 0.1f;
    const Inputs in = make_inputs(c, 101);
    Result one, two;
    {
      ThreadCount t(1);
      one = ours(c, in);
    }
    {
      ThreadCount t(2);
      two = ours(c, in);
    }
    CHECK(one.out == two.out);
    CHECK(one.lse == two.lse);
    CHECK(one.dQ == two.dQ);
    CHECK(one.dK == two.dK);
    CHECK(one.dV == two.dV);
  }
}

TEST_CASE("full attention rejects bad arguments with messages naming the op and the shapes") {
  const Tensor Q = random_tensor({2, 3, 4, 5}, 1), K = random_tensor({2, 3, 6, 5}, 2),
               V = random_tensor({2, 3, 6, 7}, 3);
  const FullAttentionOptions none;
  CHECK_ERROR(full_attention_forward(Q.reshape({6, 4, 5}), K, V, {}, none), "full_attention",
              "(B, H, N, E)", "(6, 4, 5)");
  CHECK_ERROR(full_attention_forward(Q, random_tensor({2, 3, 6, 4}, 4), V, {}, none),
              "full_attention", "expected K of shape (B, H, S, E) = (2, 3, S, 5)", "(2, 3, 6, 4)");
  CHECK_ERROR(full_attention_forward(Q, K, random_tensor({2, 3, 5, 7}, 5), {}, none),
              "expected V of shape (B, H, S, M) = (2, 3, 6, M)", "(2, 3, 5, 7)");
  FullAttentionOptions causal;
  causal.causal = true;
  CHECK_ERROR(full_attention_forward(Q, K, V, {}, causal), "full_attention", "causal",
              "N == S", "(2, 3, 4, 5)", "(2, 3, 6, 5)");
  FullAttentionOptions bad_p;
  bad_p.dropout = 1.0f;
  CHECK_ERROR(full_attention_forward(Q, K, V, {}, bad_p), "dropout probability in [0, 1)");
  FullAttentionOptions bad_t;
  bad_t.temperature = NAN;
  CHECK_ERROR(full_attention_forward(Q, K, V, {}, bad_t), "finite temperature");
  CHECK_ERROR(full_attention_forward(Q, K, V, Tensor::from_int_vector({6, 7}, {2}), none),
              "lengths[1] = 7", "[0, S = 6]");
  CHECK_ERROR(full_attention_forward(Q, K, V, Tensor::from_int_vector({6, 2, 1}, {3}), none),
              "expected lengths of shape (2,)");
  CHECK_ERROR(full_attention_forward(Q, K, V, Tensor::from_vector({6, 2}, {2}), none),
              "lengths", "i32");
  CHECK_ERROR(full_attention_forward(Q, K, Tensor::from_int_vector(std::vector<int32_t>(252, 0),
                                                                   {2, 3, 6, 7}), {}, none),
              "full_attention", "V", "f32");
  const FullAttentionOutput f = full_attention_forward(Q, K, V, {}, none);
  CHECK_ERROR(full_attention_backward(random_tensor({2, 3, 4, 5}, 6), Q, K, V, f.out,
                                      f.logsumexp, {}, none),
              "full_attention_backward", "dout", "(2, 3, 4, 7)");
  CHECK_ERROR(full_attention_backward(f.out, Q, K, V, f.out, f.out, {}, none),
              "full_attention_backward", "logsumexp", "(2, 3, 4)");
}

TEST_CASE("AttentionConfig: names, parsing, validation and description") {
  for (AttentionType t :
       {AttentionType::full, AttentionType::clustered, AttentionType::improved_clustered})
    CHECK(parse_attention_type(attention_type_name(t)) == t);
  CHECK(std::string(attention_type_name(AttentionType::improved_clustered)) ==
        "improved-clustered");
  CHECK_ERROR(parse_attention_type("flash"), "'flash'", "full, clustered, improved-clustered");

  AttentionConfig ok;
  ok.validate();
  CHECK(ok.describe() == "full");
  ok.type = AttentionType::clustered;
  CHECK(ok.describe() == "clustered (C=100, bits=63, iterations=10)");
  ok.type = AttentionType::improved_clustered;
  ok.dropout = 0.1f;
  CHECK(ok.describe() ==
        "improved-clustered (C=100, k=32, bits=63, iterations=10), dropout 0.1");

  auto with = [](auto change) {
    AttentionConfig c;
    change(c);
    return c;
  };
  CHECK_ERROR(with([](AttentionConfig& c) { c.clusters = 0; }).validate(), "clusters", ">= 1");
  CHECK_ERROR(with([](AttentionConfig& c) { c.topk = 0; }).validate(), "topk", ">= 1");
  CHECK_ERROR(with([](AttentionConfig& c) { c.bits = 64; }).validate(), "bits", "[1, 63]", "64");
  CHECK_ERROR(with([](AttentionConfig& c) { c.iterations = 0; }).validate(), "iterations");
  CHECK_ERROR(with([](AttentionConfig& c) { c.dropout = 1.0f; }).validate(), "dropout",
              "[0, 1)");
  CHECK_ERROR(with([](AttentionConfig& c) {
                c.type = AttentionType::clustered;
                c.causal = true;
              }).validate(),
              "causal", "full attention only", "clustered");
  AttentionConfig causal_full;
  causal_full.causal = true;
  causal_full.validate();
  CHECK(causal_full.describe() == "full, causal");
}

TEST_CASE("attention(): full runs full_attention, dropout only in training") {
  const Case c = make_case(2, 2, 6, 6, 4, 3, {6, 4});
  const Inputs in = make_inputs(c, 111);
  const Variable Q(in.Q), K(in.K), V(in.V);
  AttentionConfig config;
  config.dropout = 0.2f;
  Generator gen(5);
  const Tensor plain = full_attention_forward(in.Q, in.K, in.V, in.lengths, {}).out;
  CHECK(attention(config, Q, K, V, in.lengths, gen, false).data().to_vector() ==
        plain.to_vector());
  CHECK(gen.offset() == 0);  // evaluation draws nothing

  const Tensor trained = attention(config, Q, K, V, in.lengths, gen, true).data();
  CHECK(gen.offset() == full_attention_dropout_blocks(in.Q, in.K));
  FullAttentionOptions same;
  same.dropout = 0.2f;
  same.seed = 5;
  same.offset = 0;
  CHECK(trained.to_vector() ==
        full_attention_forward(in.Q, in.K, in.V, in.lengths, same).out.to_vector());
  CHECK(trained.to_vector() != plain.to_vector());
}
