// Reformer attention and shared-full (layers/attention/reformer.h): shared-QK full attention as
// its one-chunk limit, values and gradients against the plain autograd reference for the same
// buckets, the buckets against a double-precision hashing, gradcheck with padding, the same bits
// at any thread count and whatever padding follows, the rule for a query with nothing but
// itself, and the layer with one projection for queries and keys.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "check.h"
#include "core/philox.h"
#include "core/random.h"
#include "layers/attention/attention.h"
#include "layers/attention/full.h"
#include "layers/attention/reference.h"
#include "layers/attention/reformer.h"
#include "layers/multihead_attention.h"

using namespace clustr;
using clustr::test::random_tensor;

namespace {

struct Inputs {
  Tensor Q, V, lengths;
  int64_t B, H, N, E, M;
};

// B 2, H 2, E 8, M 5; the second sequence padded to `short_len` positions.
Inputs make_inputs(int64_t N, int64_t short_len, uint32_t seed) {
  Inputs x{random_tensor({2, 2, N, 8}, seed),
           random_tensor({2, 2, N, 5}, seed + 1),
           Tensor::from_int_vector({int32_t(N), int32_t(short_len)}, {2}),
           2,
           2,
           N,
           8,
           5};
  return x;
}

Tensor rotations_for(const ReformerOptions& o, int64_t E, uint32_t seed) {
  return o.buckets > 1 ? random_tensor({o.rounds, E, o.buckets / 2}, seed) : Tensor();
}

// Output, dQ and dV of sum(out * G) through the fused op.
struct Run {
  std::vector<float> out, dQ, dV;
};
Run run_op(const Inputs& x, const Tensor& rotations, const ReformerOptions& o, const Tensor& G) {
  Variable Q(x.Q.clone(), true), V(x.V.clone(), true);
  const Variable out = reformer_attention(Q, V, x.lengths, rotations, o);
  sum_all(out * Variable(G)).backward();
  return {out.data().to_vector(), Q.grad().to_vector(), V.grad().to_vector()};
}

Run run_reference(const Inputs& x, const Tensor& buckets, int64_t chunk, const Tensor& G) {
  Variable Q(x.Q.clone(), true), V(x.V.clone(), true);
  const Variable out = reformer_attention_reference(Q, V, x.lengths, buckets, chunk);
  sum_all(out * Variable(G)).backward();
  return {out.data().to_vector(), Q.grad().to_vector(), V.grad().to_vector()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The op at 1 and at 2 threads: the same bits (checked); returns the first run.
Run run_at_two_thread_counts(const Inputs& x, const Tensor& rotations, const ReformerOptions& o,
                             const Tensor& G) {
  Run one, two;
  {
    test::ThreadCount t(1);
    one = run_op(x, rotations, o, G);
  }
  {
    test::ThreadCount t(2);
    two = run_op(x, rotations, o, G);
  }
  CHECK(same_bits(one.out, two.out));
  CHECK(same_bits(one.dQ, two.dQ));
  CHECK(same_bits(one.dV, two.dV));
  return one;
}

// Shared-QK full attention without the self position, summed in double for inputs of
// make_inputs: factor(bh, i, j) scales weight (i, j) after the softmax (dropout; 1: none).
template <class Factor>
std::vector<float> shared_full_reference(const Inputs& x, Factor factor) {
  const int64_t N = x.N;
  const std::vector<float> q = x.Q.to_vector(), v = x.V.to_vector();
  const std::vector<int32_t> lens = x.lengths.to_int_vector();
  std::vector<float> want(size_t(4 * N * 5), 0.0f);
  for (int64_t bh = 0; bh < 4; ++bh) {
    const int64_t L = lens[size_t(bh / 2)];
    for (int64_t i = 0; i < L; ++i) {
      std::vector<double> w(size_t(N), 0.0);
      double top = -INFINITY, total = 0;
      for (int64_t j = 0; j < L; ++j) {
        if (j == i) continue;
        double dot = 0, norm = 0;
        for (int64_t e = 0; e < 8; ++e) {
          dot += double(q[(bh * N + i) * 8 + e]) * q[(bh * N + j) * 8 + e];
          norm += double(q[(bh * N + j) * 8 + e]) * q[(bh * N + j) * 8 + e];
        }
        w[size_t(j)] = dot / std::sqrt(norm) / std::sqrt(8.0);
        top = std::max(top, w[size_t(j)]);
      }
      for (int64_t j = 0; j < L; ++j)
        total += w[size_t(j)] = j == i ? 0.0 : std::exp(w[size_t(j)] - top);
      for (int64_t j = 0; j < L; ++j)
        if (j != i) w[size_t(j)] *= factor(bh, i, j);
      for (int64_t m = 0; m < 5; ++m) {
        double acc = 0;
        for (int64_t j = 0; j < L; ++j) acc += w[size_t(j)] * v[(bh * N + j) * 5 + m];
        want[size_t((bh * N + i) * 5 + m)] = float(acc / total);
      }
    }
  }
  return want;
}

}  // namespace

TEST_CASE("shared-full: one bucket, one round, one chunk: every other valid position") {
  const Inputs x = make_inputs(11, 7, 1);
  // Independent double-precision sums of shared-QK full attention without the self position.
  const std::vector<float> want =
      shared_full_reference(x, [](int64_t, int64_t, int64_t) { return 1.0; });
  const Tensor G = random_tensor({2, 2, 11, 5}, 9);
  const Run got = run_op(x, Tensor(), ReformerOptions{1, 1, 11}, G);
  CHECK_CLOSE(got.out, want, 1e-6, 1e-5);
  // Through the dispatcher, with a chunk as long as the sequence.
  AttentionConfig c;
  c.type = AttentionType::shared_full;
  Generator gen(3);
  const Variable Q(x.Q);
  const Tensor via = attention(c, Q, Q, Variable(x.V), x.lengths, gen, false).data();
  CHECK(same_bits(via.to_vector(), got.out));
  // The lsh type with one round of 2 buckets, a chunk past the sequence: the same attention.
  const Run two =
      run_op(x, rotations_for(ReformerOptions{1, 2, 64}, 8, 4), ReformerOptions{1, 2, 64}, G);
  CHECK_CLOSE(two.out, want, 1e-6, 1e-5);
  // Gradients against the autograd reference.
  const Run ref = run_reference(x, Tensor::zeros({2, 2, 1, 11}, DType::i32), 11, G);
  CHECK_CLOSE(got.out, ref.out, 1e-6, 1e-5);
  CHECK_CLOSE(got.dQ, ref.dQ, 1e-5, 1e-4);
  CHECK_CLOSE(got.dV, ref.dV, 1e-6, 1e-5);
}

// Dropout: shared-full's weights against a double-precision sum with the mask reformer.h names
// (element ((bh X + x) N + i) N + j of the Philox stream, kept when its uniform is >= p), about p
// of them dropped; gradcheck for a fixed mask; the same bits at 1 and 2 threads; through the
// dispatcher, training only.
TEST_CASE("lsh and shared-full: dropout on the attention weights") {
  const Inputs x = make_inputs(11, 7, 91);
  const float p = 0.3f;
  const uint64_t seed = 5, offset = 7;
  int64_t pairs = 0, dropped = 0;
  const std::vector<float> want = shared_full_reference(x, [&](int64_t bh, int64_t i, int64_t j) {
    const uint64_t idx = uint64_t((bh * 11 + i) * 11 + j);  // X = 1
    const bool keep = uint_to_unit(philox4x32(seed, offset + idx / 4).v[idx % 4]) >= p;
    ++pairs;
    dropped += keep ? 0 : 1;
    return keep ? 1.0 / (1.0 - p) : 0.0;
  });
  CHECK(pairs == 2 * 11 * 10 + 2 * 7 * 6);
  CHECK_MESSAGE(dropped > pairs / 5, dropped, " of ", pairs, " dropped at p = 0.3");
  CHECK_MESSAGE(dropped < 2 * pairs / 5, dropped, " of ", pairs, " dropped at p = 0.3");
  const ReformerOptions shared{1, 1, 11, 0.0f, p, seed, offset};
  const Tensor G = random_tensor({2, 2, 11, 5}, 92);
  const Run got = run_op(x, Tensor(), shared, G);
  CHECK_CLOSE(got.out, want, 1e-6, 1e-5);

  // Gradcheck for the fixed mask, one bucket (a fixed order), two rounds.
  const Inputs small = make_inputs(9, 5, 93);
  test::check_grad("reformer with dropout",
                   [&](const std::vector<Variable>& in) {
                     return reformer_attention(in[0], in[1], small.lengths, Tensor(),
                                               ReformerOptions{2, 1, 3, 0.0f, 0.4f, 11, 3});
                   },
                   {small.Q, small.V});

  // The same bits at 1 and 2 threads.
  const ReformerOptions o{2, 8, 4, 0.0f, 0.25f, 13, 2};
  const Inputs y = make_inputs(45, 29, 94);
  const Tensor rot = rotations_for(o, 8, 95), Gy = random_tensor({2, 2, 45, 5}, 96);
  const Run one = run_at_two_thread_counts(y, rot, o, Gy);
  CHECK_FALSE(same_bits(one.out, run_op(y, rot, ReformerOptions{2, 8, 4}, Gy).out));

  // The dispatcher drops weights in training only.
  AttentionConfig c;
  c.type = AttentionType::lsh;
  c.rounds = 2;
  c.buckets = 4;
  c.chunk = 4;
  const Variable Qv(y.Q), Vv(y.V);
  Generator g0(3), g1(3), g2(3);
  const std::vector<float> plain = attention(c, Qv, Qv, Vv, y.lengths, g0, true).data().to_vector();
  c.dropout = 0.2f;
  CHECK(same_bits(attention(c, Qv, Qv, Vv, y.lengths, g1, false).data().to_vector(), plain));
  CHECK_FALSE(same_bits(attention(c, Qv, Qv, Vv, y.lengths, g2, true).data().to_vector(), plain));
  CHECK(reformer_attention_dropout_blocks(2, 3, 10, 4) == 600);
}

TEST_CASE("lsh: values and gradients against the reference for the same buckets") {
  struct Case {
    int64_t rounds, buckets, chunk;
  };
  for (const Case k :
       {Case{1, 4, 4}, Case{2, 8, 4}, Case{4, 4, 3}, Case{3, 6, 32}, Case{2, 2, 1}}) {
    CAPTURE(k.rounds);
    CAPTURE(k.buckets);
    CAPTURE(k.chunk);
    const Inputs x = make_inputs(37, 23, 11);
    const ReformerOptions o{k.rounds, k.buckets, k.chunk};
    const Tensor rot = rotations_for(o, 8, 12);
    const Tensor G = random_tensor({2, 2, 37, 5}, 13);
    const Run got = run_op(x, rot, o, G);
    const Run ref = run_reference(x, reformer_buckets(x.Q, x.lengths, rot, k.buckets), k.chunk, G);
    CHECK_CLOSE(got.out, ref.out, 1e-6, 1e-5);
    CHECK_CLOSE(got.dQ, ref.dQ, 1e-5, 1e-4);
    CHECK_CLOSE(got.dV, ref.dV, 1e-6, 1e-5);
  }
}

TEST_CASE("lsh: buckets against a double-precision reference of the rotations") {
  const Inputs x = make_inputs(50, 31, 21);
  const int64_t R = 16, X = 3;
  const Tensor rot = random_tensor({X, 8, R / 2}, 22);
  const std::vector<int32_t> got = reformer_buckets(x.Q, x.lengths, rot, R).to_int_vector();
  const std::vector<float> q = x.Q.to_vector(), w = rot.to_vector();
  const int L[2] = {50, 31};
  int64_t checked = 0, near_ties = 0;
  for (int64_t bh = 0; bh < 4; ++bh)
    for (int64_t r = 0; r < X; ++r)
      for (int64_t j = 0; j < 50; ++j) {
        const int32_t b = got[size_t((bh * X + r) * 50 + j)];
        if (j >= L[bh / 2]) {
          CHECK(b == -1);  // padded
          continue;
        }
        std::vector<double> p(static_cast<size_t>(R));
        double norm = 0;
        for (int64_t e = 0; e < 8; ++e)
          norm += double(q[(bh * 50 + j) * 8 + e]) * q[(bh * 50 + j) * 8 + e];
        for (int64_t c = 0; c < R / 2; ++c) {
          double s = 0;
          for (int64_t e = 0; e < 8; ++e)
            s += double(q[(bh * 50 + j) * 8 + e]) * w[size_t((r * 8 + e) * (R / 2) + c)];
          p[size_t(c)] = s / std::sqrt(norm);
          p[size_t(c + R / 2)] = -s / std::sqrt(norm);
        }
        int64_t best = 0;
        for (int64_t c = 1; c < R; ++c)
          if (p[size_t(c)] > p[size_t(best)]) best = c;
        ++checked;
        if (b == best) continue;
        // Only a near tie may come out the other way in float.
        ++near_ties;
        CHECK_MESSAGE(std::fabs(p[size_t(b)] - p[size_t(best)]) < 1e-5, "pair ", bh, " round ", r,
                      " position ", j, ": bucket ", b, " against ", best);
      }
  CHECK(checked == 3 * (2 * 50 + 2 * 31));
  CHECK(near_ties <= 2);
}

TEST_CASE("lsh: gradcheck with padding (one bucket: the order is fixed)") {
  const Inputs x = make_inputs(9, 5, 31);
  for (int64_t chunk : {2, 4}) {
    CAPTURE(chunk);
    test::check_grad("reformer chunk " + std::to_string(chunk),
                     [&](const std::vector<Variable>& in) {
                       return reformer_attention(in[0], in[1], x.lengths, Tensor(),
                                                 ReformerOptions{2, 1, chunk});
                     },
                     {x.Q, x.V});
  }
}

TEST_CASE("lsh: the same bits at 1 and 2 threads, and whatever padding follows") {
  const Inputs x = make_inputs(45, 29, 41);
  const ReformerOptions o = ReformerOptions{2, 8, 4};
  const Tensor rot = rotations_for(o, 8, 42), G = random_tensor({2, 2, 45, 5}, 43);
  const Run one = run_at_two_thread_counts(x, rot, o, G);

  // The second sequence alone, unpadded (its 29 valid positions), gives the same bits.
  auto rows = [](const std::vector<float>& t, int64_t width) {  // b = 1, positions < 29
    std::vector<float> r;
    for (int64_t h = 0; h < 2; ++h)
      r.insert(r.end(), t.begin() + ((2 + h) * 45) * width,
               t.begin() + ((2 + h) * 45 + 29) * width);
    return r;
  };
  const Inputs alone{Tensor::from_vector(rows(x.Q.to_vector(), 8), {1, 2, 29, 8}),
                     Tensor::from_vector(rows(x.V.to_vector(), 5), {1, 2, 29, 5}),
                     Tensor(),
                     1,
                     2,
                     29,
                     8,
                     5};
  const Run a = run_op(alone, rot, o, Tensor::from_vector(rows(G.to_vector(), 5), {1, 2, 29, 5}));
  CHECK(same_bits(rows(one.out, 5), a.out));
  CHECK(same_bits(rows(one.dQ, 8), a.dQ));
  CHECK(same_bits(rows(one.dV, 5), a.dV));
  // Padded positions: zero outputs and gradients.
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 29; i < 45; ++i) {
      for (int64_t m = 0; m < 5; ++m) CHECK(one.out[size_t(((2 + h) * 45 + i) * 5 + m)] == 0.0f);
      for (int64_t e = 0; e < 8; ++e) CHECK(one.dQ[size_t(((2 + h) * 45 + i) * 8 + e)] == 0.0f);
    }
}

TEST_CASE("lsh: a query with nothing but itself takes its own value") {
  // One bucket and chunks of one position: query i sees position i - 1 only, and the first
  // position nothing but itself.
  const Inputs x = make_inputs(6, 1, 51);
  const Tensor G = random_tensor({2, 2, 6, 5}, 52);
  const Run r = run_op(x, Tensor(), ReformerOptions{1, 1, 1}, G);
  const std::vector<float> v = x.V.to_vector(), g = G.to_vector();
  for (int64_t bh = 0; bh < 2; ++bh)  // the first sequence: all 6 valid
    for (int64_t i = 0; i < 6; ++i)
      for (int64_t m = 0; m < 5; ++m)
        CHECK(r.out[size_t((bh * 6 + i) * 5 + m)] == v[size_t((bh * 6 + (i ? i - 1 : 0)) * 5 + m)]);
  // The second: one valid position, its own value; its dV is its dO.
  for (int64_t bh = 2; bh < 4; ++bh)
    for (int64_t m = 0; m < 5; ++m) {
      CHECK(r.out[size_t(bh * 6 * 5 + m)] == v[size_t(bh * 6 * 5 + m)]);
      CHECK(r.dV[size_t(bh * 6 * 5 + m)] == g[size_t(bh * 6 * 5 + m)]);
    }
}

TEST_CASE("lsh: errors") {
  const Inputs x = make_inputs(8, 8, 61);
  const Variable Q(x.Q), V(x.V);
  CHECK_ERROR(reformer_attention(Q, V, Tensor(), Tensor(), ReformerOptions{1, 3, 4}),
              "expected 1 bucket or an even number of them, got 3");
  CHECK_ERROR(
      reformer_attention(Q, V, Tensor(), random_tensor({1, 8, 3}, 1), ReformerOptions{1, 4, 4}),
      "expected rotations of shape (rounds 1, E 8, buckets / 2 2)");
  CHECK_ERROR(reformer_attention(Q, V, Tensor(), Tensor(), ReformerOptions{1, 4, 4}),
              "4 buckets need rotations");
  CHECK_ERROR(reformer_attention(Q, V, Tensor(), Tensor(), ReformerOptions{0, 1, 4}),
              "rounds >= 1, got 0");
  CHECK_ERROR(reformer_attention(Q, Variable(random_tensor({2, 2, 7, 5}, 2)), Tensor(), Tensor(),
                                 ReformerOptions{1, 1, 4}),
              "expected Q (B, H, N, E) and V (B, H, N, M) of one self-attention");
  AttentionConfig c;
  c.type = AttentionType::lsh;
  Generator gen(1);
  CHECK_ERROR(attention(c, Q, Variable(x.Q.clone()), V, Tensor(), gen, false),
              "lsh attention uses one projection for queries and keys", "pass the queries as K");
  c.buckets = 5;
  CHECK_ERROR(c.validate(), "buckets must be an even number >= 2, got 5");
  c.buckets = 4;
  c.dropout = 0.1f;
  CHECK_NOTHROW(c.validate());
  c.dropout = 1.0f;
  CHECK_ERROR(c.validate(), "dropout must be in [0, 1), got 1");
  CHECK_ERROR(reformer_attention(Q, V, Tensor(), Tensor(), ReformerOptions{1, 1, 4, 0.0f, 1.0f}),
              "expected dropout in [0, 1), got 1");
  CHECK_ERROR(attention_matrix(AttentionType::shared_full, x.Q, x.Q, Tensor(), Tensor(), 1, 1),
              "shared-full attention's weights depend on its settings",
              "use shared_attention_matrix");
  CHECK_ERROR(shared_attention_matrix(AttentionConfig{}, x.Q, Tensor(), gen),
              "expected shared-full or lsh attention, got full");
  CHECK(parse_attention_type("lsh") == AttentionType::lsh);
  CHECK(parse_attention_type("shared-full") == AttentionType::shared_full);
  CHECK_ERROR(parse_attention_type("reformer"), "shared-full, lsh");
  CHECK(parse_attention_name("lsh-4").type == AttentionType::lsh);
  CHECK(parse_attention_name("lsh-4").rounds == 4);
  CHECK(parse_attention_name("clustered").rounds == 0);
  CHECK_ERROR(parse_attention_name("lsh-0"), "at least 1 hashing round");
  CHECK_ERROR(parse_attention_name("lsh-x"), "unknown attention type 'lsh-x'");
}

// out = W V for the dense weights W, with the rotations drawn from the same generator state;
// the rows of valid queries sum to 1, padded ones are 0; shared-full puts no weight on the
// query's own position unless the sequence has no other.
TEST_CASE("lsh and shared-full: dense weights (shared_attention_matrix)") {
  const int64_t B = 2, H = 2, N = 13, M = 5;
  const Tensor Q = random_tensor({B, H, N, 8}, 81), V = random_tensor({B, H, N, M}, 82);
  for (const std::vector<int32_t>& lens : {std::vector<int32_t>{13, 6}, {1, 9}}) {
    const Tensor lengths = Tensor::from_int_vector(lens, {B});
    for (AttentionType type : {AttentionType::lsh, AttentionType::shared_full}) {
      AttentionConfig c;
      c.type = type;
      c.rounds = 2;
      c.buckets = 4;
      c.chunk = 4;
      const std::string name = attention_type_name(type);
      CAPTURE(name);
      CAPTURE(lens[0]);
      Generator g1(11), g2(11);
      const std::vector<float> W = shared_attention_matrix(c, Q, lengths, g1).to_vector();
      REQUIRE(W.size() == size_t(B * H * N * N));
      const Variable q(Q);
      const std::vector<float> out =
          attention(c, q, q, Variable(V), lengths, g2, false).data().to_vector();
      const std::vector<float> v = V.to_vector();
      std::vector<float> wv(out.size(), 0.0f);
      for (int64_t bh = 0; bh < B * H; ++bh)
        for (int64_t i = 0; i < N; ++i) {
          const int64_t L = lens[size_t(bh / H)];
          double sum = 0.0;
          for (int64_t j = 0; j < N; ++j) {
            const float w = W[size_t((bh * N + i) * N + j)];
            sum += w;
            for (int64_t m = 0; m < M; ++m)
              wv[size_t((bh * N + i) * M + m)] += w * v[size_t((bh * N + j) * M + m)];
          }
          CHECK_MESSAGE(std::fabs(sum - (i < L ? 1.0 : 0.0)) < 1e-6,
                        "row sum " << sum << " at (bh " << bh << ", i " << i << ")");
          if (type == AttentionType::shared_full && i < L)
            CHECK_MESSAGE(W[size_t((bh * N + i) * N + i)] == (L == 1 ? 1.0f : 0.0f),
                          "self weight at (bh " << bh << ", i " << i << ")");
        }
      CHECK_CLOSE(wv, out, 1e-6, 1e-5);
    }
  }
}

TEST_CASE("multi-head attention with one projection for queries and keys") {
  Generator gen(7);
  AttentionConfig c;
  c.type = AttentionType::lsh;
  c.rounds = 2;
  c.buckets = 4;
  c.chunk = 4;
  MultiHeadAttention shared(16, 2, c, gen);
  CHECK(shared.shared_query_key());
  std::vector<std::string> names;
  for (const auto& [name, p] : shared.named_parameters()) names.push_back(name);
  CHECK(names == std::vector<std::string>{"query.weight", "query.bias", "value.weight",
                                          "value.bias", "out.weight", "out.bias"});
  CHECK(&shared.key() == &shared.query());
  const Variable x(random_tensor({2, 9, 16}, 71));
  const Tensor lengths = Tensor::from_int_vector({9, 6}, {2});
  Generator g1(5);
  const Variable y = shared.forward(x, lengths, g1);
  CHECK(y.shape() == (Shape{2, 9, 16}));
  // Full attention on the shared layer (the fused path) uses the queries as keys.
  shared.config.type = AttentionType::full;
  const Tensor fused = shared.forward(x, lengths, g1).data();
  auto split = [](const Variable& t) { return permute(reshape(t, {2, 9, 2, 8}), {0, 2, 1, 3}); };
  const Variable Qh = split(shared.query().forward(x));
  const Variable heads = full_attention(Qh, Qh, split(shared.value().forward(x)), lengths, {});
  const Tensor manual =
      shared.out().forward(reshape(permute(heads, {0, 2, 1, 3}), {2, 9, 16})).data();
  CHECK_CLOSE(fused.to_vector(), manual.to_vector(), 1e-6, 1e-5);

  AttentionConfig plain;
  MultiHeadAttention separate(16, 2, plain, gen);
  CHECK_FALSE(separate.shared_query_key());
  separate.config.type = AttentionType::shared_full;
  CHECK_ERROR(separate.forward(x, lengths, g1),
              "shared-full attention needs a layer whose queries and keys share one projection");
}
