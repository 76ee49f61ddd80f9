// Oracle-top attention (layers/attention/oracle_top.h): full attention when it keeps every key,
// the best key's value when it keeps one, the dense weights of attention_matrix in between, the
// same at any thread count, and refused wherever a gradient or training would need it.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "autograd/variable.h"
#include "check.h"
#include "core/random.h"
#include "layers/attention/attention.h"
#include "layers/attention/full.h"
#include "layers/attention/oracle_top.h"

namespace {

using clustr::AttentionConfig;
using clustr::AttentionType;
using clustr::Tensor;
using clustr::Variable;
using clustr::test::random_tensor;

struct Inputs {
  Tensor Q, K, V, lengths;
};

// B 2, H 2, N = S = 9, E 4, M 3; the second sequence padded to 6 positions.
Inputs make_inputs(uint32_t seed) {
  return {random_tensor({2, 2, 9, 4}, seed), random_tensor({2, 2, 9, 4}, seed + 1),
          random_tensor({2, 2, 9, 3}, seed + 2), Tensor::from_int_vector({9, 6}, {2})};
}

Tensor oracle(const Inputs& x, int64_t topk) {
  return clustr::oracle_top_attention(Variable(x.Q), Variable(x.K), Variable(x.V), x.lengths,
                                      topk)
      .data();
}

}  // namespace

TEST_CASE("oracle-top keeping every valid key is full attention") {
  const Inputs x = make_inputs(1);
  const Tensor full = clustr::full_attention(Variable(x.Q), Variable(x.K), Variable(x.V),
                                             x.lengths, clustr::FullAttentionOptions{})
                          .data();
  for (int64_t k : {9, 100}) {
    CAPTURE(k);
    CHECK_CLOSE(oracle(x, k).to_vector(), full.to_vector(), 1e-6, 1e-5);
  }
}

TEST_CASE("oracle-top keeping one key copies the value of the highest-scoring key") {
  const Inputs x = make_inputs(2);
  const std::vector<float> q = x.Q.to_vector(), k = x.K.to_vector(), v = x.V.to_vector();
  const std::vector<float> got = oracle(x, 1).to_vector();
  const int lengths[2] = {9, 6};
  for (int64_t bh = 0; bh < 4; ++bh)
    for (int64_t i = 0; i < 9; ++i) {
      const int64_t L = lengths[bh / 2];
      int64_t best = 0;
      double best_score = -INFINITY;
      for (int64_t l = 0; l < L; ++l) {
        double dot = 0;
        for (int64_t e = 0; e < 4; ++e)
          dot += double(q[(bh * 9 + i) * 4 + e]) * k[(bh * 9 + l) * 4 + e];
        if (dot > best_score) best_score = dot, best = l;
      }
      for (int64_t m = 0; m < 3; ++m) {
        CAPTURE(bh);
        CAPTURE(i);
        const float want = i < L ? v[(bh * 9 + best) * 3 + m] : 0.0f;  // padded queries: 0
        CHECK(got[(bh * 9 + i) * 3 + m] == want);
      }
    }
}

TEST_CASE("oracle-top with 3 keys: the dense oracle-top weights of attention_matrix times V") {
  const Inputs x = make_inputs(3);
  const Tensor A = clustr::attention_matrix(AttentionType::oracle_top, x.Q, x.K, x.lengths,
                                            Tensor(), 1, 3);  // (B, H, N, S)
  const std::vector<float> a = A.to_vector(), v = x.V.to_vector();
  std::vector<float> want(2 * 2 * 9 * 3, 0.0f);
  for (int64_t bh = 0; bh < 4; ++bh)
    for (int64_t i = 0; i < 9; ++i) {
      int kept = 0;
      double sum = 0;
      for (int64_t l = 0; l < 9; ++l) {
        const float w = a[(bh * 9 + i) * 9 + l];
        kept += w != 0.0f;
        sum += w;
        for (int64_t m = 0; m < 3; ++m)
          want[(bh * 9 + i) * 3 + m] += w * v[(bh * 9 + l) * 3 + m];
      }
      const bool padded = bh >= 2 && i >= 6;
      CAPTURE(bh);
      CAPTURE(i);
      CHECK(kept == (padded ? 0 : 3));  // three keys kept, renormalised
      CHECK(std::fabs(sum - (padded ? 0.0 : 1.0)) < 1e-6);
    }
  CHECK_CLOSE(oracle(x, 3).to_vector(), want, 1e-6, 1e-5);
}

TEST_CASE("oracle-top is the same at 1 and 2 threads") {
  const Inputs x = make_inputs(4);
  std::vector<float> one, two;
  {
    clustr::test::ThreadCount t(1);
    one = oracle(x, 4).to_vector();
  }
  {
    clustr::test::ThreadCount t(2);
    two = oracle(x, 4).to_vector();
  }
  CHECK(one == two);
}

TEST_CASE("oracle-top through attention(): evaluation only, named in configs") {
  const Inputs x = make_inputs(5);
  AttentionConfig config;
  config.type = clustr::parse_attention_type("oracle-top");
  config.topk = 5;
  CHECK(config.describe() == "oracle-top (k=5)");
  clustr::Generator gen(1);
  const Tensor out = clustr::attention(config, Variable(x.Q), Variable(x.K), Variable(x.V),
                                       x.lengths, gen, /*training=*/false)
                         .data();
  CHECK(out.to_vector() == oracle(x, 5).to_vector());
  CHECK_ERROR(clustr::attention(config, Variable(x.Q), Variable(x.K), Variable(x.V), x.lengths,
                                gen, /*training=*/true),
              "oracle-top attention is for evaluation only");
  // Recording gradients for an input that wants them: refused, not silently gradient-free.
  CHECK_ERROR(clustr::oracle_top_attention(Variable(x.Q, true), Variable(x.K), Variable(x.V),
                                           x.lengths, 5),
              "oracle_top_attention: oracle-top attention is for evaluation only");
  {
    clustr::NoGradGuard no_grad;
    CHECK(clustr::oracle_top_attention(Variable(x.Q, true), Variable(x.K), Variable(x.V),
                                       x.lengths, 5)
              .data()
              .to_vector() == oracle(x, 5).to_vector());
  }
  CHECK_ERROR(oracle(x, 0), "expected topk >= 1, got 0");
  CHECK_ERROR(clustr::oracle_top_attention(Variable(x.Q), Variable(x.K),
                                           Variable(random_tensor({2, 2, 8, 3}, 9)), x.lengths,
                                           2),
              "expected Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M)");
  CHECK_ERROR(clustr::parse_attention_type("oracle"), "expected one of: full, clustered, "
              "improved-clustered, oracle-top");
}
