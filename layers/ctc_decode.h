// Decoding CTC outputs into label sequences (their error rate: layers/error_rate.h).
//
// Legend: B utterances, T frames (padded), V classes (blank included).
// The decoders take logits f32 (B, T, V), batch-first as layers/ctc.h does, and input_lengths
// i32 (B); frames t >= input_lengths[b] are ignored. Log-probabilities work as well: the
// log-softmax applied inside leaves them unchanged.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "layers/error_rate.h"
#include "layers/ngram_lm.h"

namespace clustr {

// Best path: the most probable class of each frame (the lowest index on a tie), repeats
// merged, then blanks dropped. One sequence per utterance.
std::vector<LabelSequence> ctc_greedy_decode(const Tensor& logits, const Tensor& input_lengths,
                                             int blank = 0);

struct CtcHypothesis {
  LabelSequence labels;
  double log_prob = 0;  // ln p(labels | logits) summed over the alignments the beam kept
  double score = 0;     // what the search ranked it by: log_prob, plus the fusion's terms
};

// Shallow fusion of a label language model into the beam search: prefixes are ranked by
//   ln p_ctc(y) + weight * ln p_lm(y) + bonus * |y|
// and the final choice adds weight * ln p_lm(</s> | y). The bonus (per label) offsets the
// model's pull towards short outputs. No model (or weight and bonus 0) is the plain search.
struct LmFusion {
  const NgramLm* lm = nullptr;
  double weight = 0;
  double bonus = 0;
};

// Prefix beam search (Hannun et al. 2014; a language model with `fusion`): after each frame, keep
// the beam_width label prefixes of highest probability, where the probability of a prefix sums
// every alignment that collapses to it, split into alignments ending in a blank and in a label
// (both in log space) so that a repeated label is told apart from a held one. With a beam wide
// enough to keep every prefix the result is the exact most probable labelling; beam_width 1 is
// greedy decoding when every frame's best class has probability above 1/2. Equal scores keep
// the prefix found first. Utterances run in parallel. With `fusion`, the language model's
// classes must be the logits' V and the blank 0 (the token tables' convention).
std::vector<CtcHypothesis> ctc_beam_search(const Tensor& logits, const Tensor& input_lengths,
                                           int beam_width, int blank = 0,
                                           const LmFusion& fusion = {});

// The label sequences of a CTC target batch: targets i32 (B, Umax) padded or (sum of
// target_lengths) concatenated, target_lengths i32 (B), as layers/ctc.h takes them.
std::vector<LabelSequence> target_sequences(const Tensor& targets, const Tensor& target_lengths);

}  // namespace clustr
