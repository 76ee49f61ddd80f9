// The error rate of label sequences against references (phone or word error rate): edit
// distance summed over a corpus. The speech app measures its decoders' output with it
// (layers/ctc_decode.h).
#pragma once

#include <cstdint>
#include <vector>

namespace clustr {

using LabelSequence = std::vector<int32_t>;

// Levenshtein distance: the fewest substitutions, insertions and deletions that turn
// `hypothesis` into `reference`.
int64_t edit_distance(const LabelSequence& reference, const LabelSequence& hypothesis);

// Corpus error rate (phone error rate for phone targets): total edits / total reference
// length, summed over the corpus, not averaged per utterance. Accumulate batch by batch.
struct ErrorRate {
  int64_t edits = 0;
  int64_t reference_length = 0;

  void add(const LabelSequence& reference, const LabelSequence& hypothesis);
  void add(const std::vector<LabelSequence>& references,
           const std::vector<LabelSequence>& hypotheses);
  // edits / reference_length; 0 for an empty corpus with no edits, +inf when there are edits
  // against empty references only.
  double rate() const;
};
double error_rate(const std::vector<LabelSequence>& references,
                  const std::vector<LabelSequence>& hypotheses);

}  // namespace clustr
