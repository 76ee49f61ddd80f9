// The label n-gram model (layers/ngram_lm.h) and its fusion into the CTC beam search
// (layers/ctc_decode.h, LmFusion): Kneser-Ney by hand, distributions that sum to 1, the JSON
// form and its refusals, and decoding where the model decides between two labels the logits
// leave nearly tied.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "check.h"
#include "layers/ctc_decode.h"
#include "layers/ngram_lm.h"

using namespace clustr;
using clustr::test::ints;

namespace {

std::vector<float> all_log_probs(const NgramLm& lm, const std::vector<int32_t>& context) {
  std::vector<float> out(size_t(lm.classes()) + 1);
  lm.log_probs(context.data(), out.data());
  return out;
}

// Logits (1, T, V) whose softmax is the given per-frame probabilities.
Tensor frames(const std::vector<std::vector<float>>& p) {
  std::vector<float> v;
  for (const auto& f : p)
    for (float x : f) v.push_back(std::log(x));
  return Tensor::from_vector(v, {1, int64_t(p.size()), int64_t(p.at(0).size())});
}

}  // namespace

TEST_CASE("n-gram model: interpolated Kneser-Ney by hand") {
  // {1 2}, {1 3}, {2} over labels 1..3 (and 4 unused), </s> = 5, bigrams. Counts: <s>1:2, <s>2:1,
  // 12:1, 13:1, 2</s>:2, 3</s>:1, so D2 = n1 / (n1 + 2 n2) = 4 / 8. Continuation counts: 1:1,
  // 2:2, 3:1, </s>:2 (total 6, 4 types), D1 = 2 / 6; p0 = 1/5 over 4 labels and </s>.
  const NgramLm lm = NgramLm::estimate({{1, 2}, {1, 3}, {2}}, 5, 2);
  CHECK(lm.end() == 5);
  CHECK(lm.distinct_ngrams() == std::vector<int64_t>{4, 6});
  auto p1 = [](double c) { return (c > 0 ? (c - 1.0 / 3) / 6 : 0.0) + (1.0 / 3) * 4 / 6 / 5; };
  // A history never seen (4) hands over to the unigrams whole.
  CHECK(std::exp(lm.log_prob({4}, 1)) == doctest::Approx(p1(1)).epsilon(1e-12));
  CHECK(std::exp(lm.log_prob({4}, 5)) == doctest::Approx(p1(2)).epsilon(1e-12));
  CHECK(std::exp(lm.log_prob({4}, 4)) == doctest::Approx(p1(0)).epsilon(1e-12));
  // After 1: seen 2 and 3 once each (total 2, 2 types): gamma = 0.5 * 2 / 2.
  CHECK(std::exp(lm.log_prob({1}, 3)) == doctest::Approx(0.5 / 2 + 0.5 * p1(1)).epsilon(1e-12));
  CHECK(std::exp(lm.log_prob({1}, 5)) == doctest::Approx(0.5 * p1(2)).epsilon(1e-12));
  // At the start: <s>1 twice, <s>2 once (total 3, 2 types); only the last label counts.
  const double start1 = 1.5 / 3 + 0.5 * 2 / 3 * p1(1);
  CHECK(std::exp(lm.log_prob({}, 1)) == doctest::Approx(start1).epsilon(1e-12));
  CHECK(lm.log_prob({3, 3, 1}, 3) == lm.log_prob({1}, 3));
  CHECK(lm.sequence_log_prob({1}) ==
        doctest::Approx(std::log(start1) + lm.log_prob({1}, 5)).epsilon(1e-12));
  // The same numbers from the whole-distribution call; the blank is never predicted.
  const std::vector<float> after1 = all_log_probs(lm, {1});
  CHECK(after1[0] == -INFINITY);
  CHECK(after1[3] == doctest::Approx(lm.log_prob({1}, 3)).epsilon(1e-6));
}

TEST_CASE("n-gram model: every distribution sums to 1 and agrees with log_prob") {
  std::vector<LabelSequence> text;
  uint32_t s = 7;
  auto next = [&s](uint32_t n) { return ((s = s * 1664525u + 1013904223u) >> 8) % n; };
  for (int i = 0; i < 60; ++i) {
    LabelSequence q;
    const uint32_t len = 1 + next(9);
    for (uint32_t j = 0; j < len; ++j) q.push_back(int32_t(1 + next(6)));  // labels 1..6 of 1..7
    text.push_back(q);
  }
  for (int order : {1, 2, 3, 5}) {
    const NgramLm lm = NgramLm::estimate(text, 8, order);
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<int32_t> context(size_t(order - 1));
      for (size_t i = 0; i < context.size(); ++i)  // <s> only at the front, 7 never seen
        context[i] = (trial % 3 == 0 && i == 0) ? 0 : int32_t(1 + next(7));
      const std::vector<float> lp = all_log_probs(lm, context);
      double sum = 0;
      for (size_t w = 1; w < lp.size(); ++w) {
        CHECK(std::isfinite(lp[w]));
        sum += std::exp(double(lp[w]));
      }
      INFO("order ", order, " trial ", trial);
      CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
      // A leading <s> is what a shorter history is padded with.
      LabelSequence h;
      for (int32_t c : context)
        if (c != 0) h.push_back(c);
      // One routine computes both: the same double, rounded to float here.
      for (int32_t w = 1; w <= lm.end(); ++w)
        CHECK(lp[size_t(w)] == static_cast<float>(lm.log_prob(h, w)));
    }
  }
}

TEST_CASE("n-gram model: the JSON form round-trips and bad files are refused") {
  const NgramLm lm = NgramLm::estimate({{1, 2, 1}, {2, 2}, {1}}, 3, 3);
  const std::vector<std::string> tokens{"<blank>", "a", "b"};
  const std::string text = lm.to_json(tokens);
  std::vector<std::string> read;
  const NgramLm back = NgramLm::from_json(text, "lm.json", &read);
  CHECK(read == tokens);
  CHECK(back.order() == 3);
  CHECK(back.classes() == 3);
  for (const LabelSequence& h : {LabelSequence{}, {1}, {2, 1}, {2, 2}})
    for (int32_t w = 1; w <= 3; ++w) CHECK(back.log_prob(h, w) == lm.log_prob(h, w));

  CHECK_ERROR(lm.to_json({"<blank>", "a"}), "expected 3 tokens");
  CHECK_ERROR(NgramLm::from_json("{oops", "f.json"), "f.json: not an n-gram model (not JSON");
  CHECK_ERROR(NgramLm::from_json("[1]", "f.json"), "expected a JSON object with \"format\"");
  const std::string head = R"({"format": "clustr-ngram-lm", "version": 1, "order": 2, )"
                           R"("tokens": ["<blank>", "a", "b"], "counts": )";
  CHECK(NgramLm::from_json(head + "[[0, 1, 2], [1, 3, 1]]}", "f.json").order() == 2);
  CHECK_ERROR(NgramLm::from_json(head + "[[3, 1, 2]]}", "f.json"),
              "counts[0][0] = 3 is not a label or <s>");  // </s> only last
  CHECK_ERROR(NgramLm::from_json(head + "[[0, 4, 2]]}", "f.json"), "counts[0][1] = 4");
  CHECK_ERROR(NgramLm::from_json(head + "[[0, 0, 2]]}", "f.json"), "counts[0][1] = 0");
  CHECK_ERROR(NgramLm::from_json(head + "[[0, 1, 0]]}", "f.json"), "count must be >= 1");
  CHECK_ERROR(NgramLm::from_json(head + "[[0, 1]]}", "f.json"), "must be 2 ids and a count");
  CHECK_ERROR(NgramLm::from_json(head + "[[0, 1, 1], [0, 1, 2]]}", "f.json"),
              "counts[1] repeats the n-gram [0,1]");
  CHECK_ERROR(NgramLm::from_json(head + "[]}", "f.json"), "has no counts");
  CHECK_ERROR(NgramLm::from_json(R"({"format": "x"})", "f.json"), "expected format");
  CHECK_ERROR(NgramLm::from_json(R"({"format": "clustr-ngram-lm", "version": 2})", "f.json"),
              "version 2 is not the supported 1");
  CHECK_ERROR(
      NgramLm::from_json(R"({"format": "clustr-ngram-lm", "version": 1, "order": 9})", "f.json"),
      "\"order\" must be an integer in [1, 8], got 9");
  CHECK_ERROR(NgramLm::estimate({{1, 3}}, 3, 2), "sequence 0, position 1: label 3");
  CHECK_ERROR(NgramLm::estimate({{0}}, 3, 2), "label 0 is outside the labels [1, 3)");
  CHECK_ERROR(NgramLm::estimate({{1}}, 3, 0), "order must be in [1, 8], got 0");
}

TEST_CASE("beam search with a language model: fusion decides between near ties") {
  // Frame 1 says 3; frame 2 is 1 or 2, with 2 slightly ahead (0.46 against 0.44).
  const Tensor x = frames({{0.05f, 0.05f, 0.05f, 0.85f}, {0.10f, 0.44f, 0.46f, 0.0001f}});
  const Tensor il = ints({2});
  const CtcHypothesis plain = ctc_beam_search(x, il, 4).at(0);
  CHECK(plain.labels == LabelSequence{3, 2});
  // A model that has only seen 3 followed by 1.
  const NgramLm lm = NgramLm::estimate(std::vector<LabelSequence>(20, {3, 1}), 4, 2);
  LmFusion f{&lm, 0.5, 0.0};
  const CtcHypothesis fused = ctc_beam_search(x, il, 4, 0, f).at(0);
  CHECK(fused.labels == LabelSequence{3, 1});
  // The model ranks the prefixes while pruning, not only at the end: a beam of one keeps it.
  CHECK(ctc_beam_search(x, il, 1, 0, f).at(0).labels == LabelSequence{3, 1});
  // Its score is the CTC log-probability plus the weighted model's, </s> included.
  CHECK(fused.score ==
        doctest::Approx(fused.log_prob + 0.5 * lm.sequence_log_prob({3, 1})).epsilon(1e-6));
  // A length bonus alone: a large one prefers a longer labelling.
  const CtcHypothesis longer = ctc_beam_search(x, il, 8, 0, LmFusion{nullptr, 0, 20}).at(0);
  CHECK(longer.labels.size() == 2);
  CHECK(longer.score == longer.log_prob + 40);  // 20 per label, exactly
}

TEST_CASE("beam search with a zero-weight model is the plain search") {
  const int64_t B = 3, T = 30, V = 6;
  std::vector<float> v(size_t(B * T * V));
  uint32_t s = 3;
  for (float& x : v) x = float((s = s * 1664525u + 1013904223u) >> 9) / float(1 << 23) * 4 - 2;
  const Tensor x = Tensor::from_vector(v, {B, T, V});
  const Tensor il = ints({30, 17, 1});
  const NgramLm lm = NgramLm::estimate({{1, 2, 3}, {4, 5}, {5, 5, 1}}, V, 3);
  const auto plain = ctc_beam_search(x, il, 6);
  const auto zero = ctc_beam_search(x, il, 6, 0, LmFusion{&lm, 0, 0});
  const auto weighted = ctc_beam_search(x, il, 6, 0, LmFusion{&lm, 2.0, 0});
  bool differs = false;
  for (int64_t b = 0; b < B; ++b) {
    CHECK(zero[b].labels == plain[b].labels);
    CHECK(zero[b].log_prob == plain[b].log_prob);
    CHECK(zero[b].score == plain[b].log_prob);
    differs |= weighted[b].labels != plain[b].labels;
  }
  CHECK(differs);  // a heavy model changes something, or the check above proves nothing

  CHECK_ERROR(ctc_beam_search(x, il, 6, 0, LmFusion{&lm, -1, 0}), "weight >= 0");
  CHECK_ERROR(ctc_beam_search(x, il, 6, 0, LmFusion{&lm, 1, NAN}), "finite");
  const NgramLm other = NgramLm::estimate({{1}}, 4, 2);
  CHECK_ERROR(ctc_beam_search(x, il, 6, 0, LmFusion{&other, 1, 0}),
              "model's 4 classes must be the logits' V = 6");
  CHECK_ERROR(ctc_beam_search(x, il, 6, 2, LmFusion{&lm, 1, 0}), "blank = 2");
}
