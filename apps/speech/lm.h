// The speech app's label language model: `speech lm` counts a manifest's label sequences into
// an n-gram model (layers/ngram_lm.h) saved as JSON, and evaluate and decode fuse it into the
// beam search (--lm FILE --lm-weight W --lm-bonus B; layers/ctc_decode.h, LmFusion).
#pragma once

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "data/manifest.h"
#include "layers/ctc_decode.h"
#include "layers/ngram_lm.h"

namespace clustr::speech {

struct LmFlags {
  std::string manifest;  // the training text: a manifest's label sequences
  std::string tokens;    // default: tokens.txt beside the manifest
  std::string dev;       // optional: a manifest to report the model's perplexity on
  std::string out;
  int order = 6;  // the best on the synthetic corpus's dev set (docs/RESULTS.md)
  bool overwrite = false;
};

// Builds the model and writes it to flags.out (refusing an existing file without --overwrite),
// printing what it counted and the perplexity per label (</s> included) on the training text
// and on --dev.
void build_language_model(const LmFlags& flags, std::FILE* log);

// A saved model and the fusions to decode with: every pair of `weights` x `bonuses`, in that
// order (weights outer). The model's token table must be `tokens` (a model counted over
// another table would score the wrong labels).
struct LanguageModel {
  std::unique_ptr<NgramLm> lm;
  std::vector<LmFusion> fusions;
  std::string file;
};
LanguageModel load_language_model(const std::string& path, const TokenTable& tokens,
                                  const std::vector<double>& weights,
                                  const std::vector<double>& bonuses);

// Perplexity per symbol (labels and one </s> per sequence) of `sequences` under `lm`.
double perplexity(const NgramLm& lm, const std::vector<LabelSequence>& sequences);

}  // namespace clustr::speech
