// The masked copy task (data/copy_task.h): structure `0 w 0 w`, every masked symbol recoverable
// from the other copy, the masking ratio, seeded determinism at any thread count, errors, and
// masked_accuracy on hand-made inputs.
#include <cmath>
#include <vector>

#include "check.h"
#include "core/ops.h"
#include "data/copy_task.h"

using namespace clustr;
using namespace clustr::test;

namespace {

CopyTaskBatch make(const CopyTaskConfig& c, int64_t batch, uint64_t seed, int threads = 1) {
  ThreadCount tc(threads);
  Generator gen(seed);
  return make_copy_task_batch(c, batch, gen);
}

// Checks every invariant of one batch; returns the number of masked symbol positions.
int64_t check_batch(const CopyTaskConfig& c, const CopyTaskBatch& b, int64_t batch) {
  const int64_t L = c.length, N = 2 * L + 2;
  const int32_t mask = c.symbols + 1;
  REQUIRE(b.input.shape() == Shape{batch, N});
  REQUIRE(b.target.shape() == Shape{batch, N});
  REQUIRE(b.lengths.shape() == Shape{batch});
  REQUIRE(b.input.dtype() == DType::i32);
  REQUIRE(b.target.dtype() == DType::i32);
  const std::vector<int32_t> x = b.input.to_int_vector(), y = b.target.to_int_vector();
  for (int32_t n : b.lengths.to_int_vector()) CHECK(n == N);
  int64_t masked = 0, bad = 0;
  for (int64_t s = 0; s < batch; ++s) {
    const int32_t* xs = x.data() + s * N;
    const int32_t* ys = y.data() + s * N;
    // Separators: present, never masked, never targets.
    bad += xs[0] != 0 || xs[L + 1] != 0 || ys[0] != -100 || ys[L + 1] != -100;
    for (int64_t j = 0; j < L; ++j) {
      const int64_t p[2] = {1 + j, L + 2 + j};
      int32_t orig[2];
      for (int k = 0; k < 2; ++k) {
        const bool is_masked = xs[p[k]] == mask;
        // Targets are -100 exactly at unmasked positions; masked ones hold a symbol 1..S.
        if (is_masked) {
          ++masked;
          bad += ys[p[k]] < 1 || ys[p[k]] > c.symbols;
          orig[k] = ys[p[k]];
        } else {
          bad += ys[p[k]] != -100 || xs[p[k]] < 1 || xs[p[k]] > c.symbols;
          orig[k] = xs[p[k]];
        }
      }
      // Recoverable: never masked in both copies, and both copies hold the same word symbol.
      bad += xs[p[0]] == mask && xs[p[1]] == mask;
      bad += orig[0] != orig[1];
    }
  }
  CHECK_MESSAGE(bad == 0, bad, " invariant violations in a batch of ", batch);
  return masked;
}

}  // namespace

TEST_CASE("copy task: structure, recoverability and targets") {
  for (int L : {1, 3, 17, 64}) {
    for (float r : {0.0f, 0.2f, 0.5f}) {
      CopyTaskConfig c;
      c.length = L;
      c.mask_ratio = r;
      INFO("L = " << L << ", r = " << r);
      const int64_t masked = check_batch(c, make(c, 9, 42 + L), 9);
      if (r == 0.0f) CHECK(masked == 0);
      if (r == 0.5f) CHECK(masked == 9 * L);  // every word position masked in exactly one copy
    }
  }
  CopyTaskConfig one;
  one.symbols = 1;  // the word is all ones
  const std::vector<int32_t> x = make(one, 2, 1).input.to_int_vector();
  for (size_t i = 0; i < x.size(); ++i) CHECK((x[i] == 0 || x[i] == 1 || x[i] == 2));
  CHECK(vocab_size(CopyTaskConfig{}) == 12);
  CHECK(mask_token(CopyTaskConfig{}) == 11);
}

TEST_CASE("copy task: masking ratio and symbol frequencies") {
  CopyTaskConfig c;
  c.length = 50;
  const int64_t batch = 400;
  const CopyTaskBatch b = make(c, batch, 7, 2);
  const int64_t masked = check_batch(c, b, batch);
  const double n = 2.0 * c.length * batch, r = c.mask_ratio;
  // Per word position exactly one copy is masked with probability 2r, so the masked count is
  // a sum of L B Bernoulli(2r) and the fraction's variance is 2r(1 - 2r) / (4 L B).
  const double se = std::sqrt(2 * r * (1 - 2 * r) / (2 * n));
  const double observed = masked / n;
  CHECK_MESSAGE(std::fabs(observed - r) < 5 * se, "observed ", observed, " vs r ", r, ", se ", se);
  // Each symbol 1..S appears with frequency 1/S in the unmasked first copies.
  std::vector<int64_t> count(c.symbols + 2, 0);
  const std::vector<int32_t> x = b.input.to_int_vector(), y = b.target.to_int_vector();
  const int64_t N = 2 * c.length + 2;
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t j = 1; j <= c.length; ++j) {
      const int64_t i = s * N + j;
      ++count[y[i] == -100 ? x[i] : y[i]];
    }
  const double words = double(batch) * c.length, p = 1.0 / c.symbols;
  const double se_sym = std::sqrt(words * p * (1 - p));
  for (int v = 1; v <= c.symbols; ++v)
    CHECK_MESSAGE(std::fabs(count[v] - words * p) < 5 * se_sym, "symbol ", v, ": ", count[v]);
}

TEST_CASE("copy task: seeded, independent of the thread count") {
  CopyTaskConfig c;
  c.length = 31;
  const CopyTaskBatch a = make(c, 13, 5, 1), b = make(c, 13, 5, 2), d = make(c, 13, 6, 2);
  CHECK(a.input.to_int_vector() == b.input.to_int_vector());
  CHECK(a.target.to_int_vector() == b.target.to_int_vector());
  CHECK(a.input.to_int_vector() != d.input.to_int_vector());
  // Consecutive batches from one generator differ, and reproduce from the same seed.
  Generator g1(9), g2(9);
  const CopyTaskBatch first = make_copy_task_batch(c, 4, g1);
  const CopyTaskBatch second = make_copy_task_batch(c, 4, g1);
  CHECK(first.input.to_int_vector() != second.input.to_int_vector());
  CHECK(g1.offset() == 2u * 4u * 31u);  // B * L counter blocks per batch
  make_copy_task_batch(c, 4, g2);
  CHECK(make_copy_task_batch(c, 4, g2).input.to_int_vector() == second.input.to_int_vector());
}

TEST_CASE("copy task: errors") {
  Generator gen(0);
  CopyTaskConfig c;
  c.length = 0;
  CHECK_ERROR(make_copy_task_batch(c, 2, gen), "length", "got 0");
  c = CopyTaskConfig{};
  c.symbols = 0;
  CHECK_ERROR(make_copy_task_batch(c, 2, gen), "symbols", "[1, 1000]", "got 0");
  c.symbols = 1001;
  CHECK_ERROR(make_copy_task_batch(c, 2, gen), "symbols", "got 1001");
  c = CopyTaskConfig{};
  c.mask_ratio = -0.1f;
  CHECK_ERROR(make_copy_task_batch(c, 2, gen), "mask_ratio", "[0, 0.5]");
  c.mask_ratio = 0.6f;
  CHECK_ERROR(make_copy_task_batch(c, 2, gen), "mask_ratio", "recoverable", "0.6");
  CHECK_ERROR(make_copy_task_batch(CopyTaskConfig{}, 0, gen), "batch", "got 0");
  CHECK(gen.offset() == 0u);  // nothing is drawn for a rejected request
}

TEST_CASE("copy task: masked_accuracy") {
  // B = 1, N = 4, V = 3; targets at positions 1 and 3 only.
  const Tensor target = Tensor::from_int_vector({-100, 2, -100, 1}, {1, 4});
  const Tensor right_wrong = Tensor::from_int_vector({0, 2, 0, 0}, {1, 4});
  CHECK(masked_accuracy(right_wrong, target) == doctest::Approx(0.5));
  CHECK(masked_accuracy(Tensor::from_int_vector({1, 2, 2, 1}, {1, 4}), target) == 1.0);
  // Logits: row 1 argmax 2 (right), row 3 argmax 0 (wrong, ties go to the first).
  const Tensor logits = Tensor::from_vector(
      {9, 0, 0, 0, 1, 5, 9, 0, 0, 3, 1, 3}, {1, 4, 3});
  CHECK(masked_accuracy(logits, target) == doctest::Approx(0.5));
  CHECK(masked_accuracy(right_wrong, Tensor::from_int_vector({-100, -100, -100, -100}, {1, 4})) ==
        0.0);
  CHECK_ERROR(masked_accuracy(Tensor::empty({1, 3}, DType::i32), target), "masked_accuracy",
              "(1, 4)");
  CHECK_ERROR(masked_accuracy(Tensor::empty({1, 4, 3}), Tensor::empty({1, 4})), "target", "i32");
  CHECK_ERROR(masked_accuracy(Tensor::empty({2, 4, 3}), target), "logits");
  // Neither f32 logits nor i32 predictions: bf16 is refused by name, not read as i32.
  CHECK_ERROR(masked_accuracy(Tensor::zeros({1, 4}, DType::bf16), target), "masked_accuracy",
              "or predictions i32 (1, 4)", "got bf16 (1, 4)");
}

TEST_CASE("copy task: targets train only masked positions through cross_entropy") {
  CopyTaskConfig c;
  c.length = 20;
  const CopyTaskBatch b = make(c, 6, 3);
  const int64_t R = b.target.numel(), V = vocab_size(c);
  const std::vector<int32_t> y = b.target.to_int_vector();
  // Perfect logits at masked positions, garbage elsewhere: loss ~ 0 over masked rows only.
  std::vector<float> logits(static_cast<size_t>(R * V), 0.0f);
  int64_t masked = 0;
  for (int64_t i = 0; i < R; ++i) {
    if (y[i] == -100) {
      logits[i * V] = 50.0f;
      continue;
    }
    ++masked;
    logits[i * V + y[i]] = 50.0f;
  }
  const CrossEntropyOutput ce = cross_entropy(Tensor::from_vector(logits, {R, V}),
                                              b.target.reshape({R}), {}, -100, Reduction::mean);
  CHECK(ce.weight_sum.item() == float(masked));
  CHECK(ce.loss.item() < 1e-6f);
  CHECK(masked_accuracy(Tensor::from_vector(logits, {6, 2 * 20 + 2, V}), b.target) == 1.0);
}
