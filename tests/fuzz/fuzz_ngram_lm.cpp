// The n-gram language model file (layers/ngram_lm.h, NgramLm::from_json) on arbitrary bytes; a
// model it accepts is asked for scores and written back.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "layers/ngram_lm.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  clustr::fuzz::expect_clear_errors([&] {
    std::vector<std::string> tokens;
    const clustr::NgramLm lm = clustr::NgramLm::from_json(text, "lm.json", &tokens);
    // Probabilities of every symbol after a context of <s>, then after label 1, must be finite
    // numbers or -inf (the blank), summing to about 1.
    std::vector<float> p(static_cast<size_t>(lm.classes()) + 1);
    std::vector<int32_t> context(static_cast<size_t>(std::max(1, lm.order() - 1)), 0);
    for (int round = 0; round < 2; ++round) {
      lm.log_probs(context.data(), p.data());
      double total = 0;
      for (size_t i = 1; i < p.size(); ++i) {
        if (std::isnan(p[i]) || p[i] > 1e-4f) __builtin_trap();
        total += std::exp(double(p[i]));
      }
      if (std::fabs(total - 1.0) > 1e-3) __builtin_trap();
      if (lm.order() > 1 && lm.classes() > 1) context.back() = 1;
    }
    (void)lm.to_json(tokens);
  });
  return 0;
}

// The seed inputs (--make-seeds=DIR); the ordinary suite runs them through the target too.
void clustr_fuzz_seeds(const std::string& dir) {
  const std::vector<clustr::LabelSequence> sequences = {{1, 2, 3}, {2, 3}, {1, 1, 2}, {3}};
  for (int order : {1, 2, 3})
    clustr::fuzz::write_seed(dir, "order" + std::to_string(order),
                             clustr::NgramLm::estimate(sequences, 4, order)
                                 .to_json({"<blank>", "a", "b", "c"}));
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  clustr::fuzz::make_seeds_if_asked(*argc, *argv, clustr_fuzz_seeds);
  return 0;
}
