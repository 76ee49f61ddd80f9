// Batches of speech utterances for CTC training: frame stacking, length buckets and padding.
//
// Legend: B utterances in a batch, T frames of one utterance (10 ms each), `bins` the feature
// bins (40), k the stacking factor, T' = ceil(T / k) stacked frames, Tmax the longest T' of a
// batch, U labels of one utterance, Umax the most labels in a batch; `features` = k bins.
//
// Frame stacking (time subsampling, as in the paper's WSJ setup where the corpus allows it):
// frames k t .. k t + k - 1 are concatenated into one frame of k bins values, so the encoder sees
// T' = ceil(T / k) positions, each covering k x 10 ms. The last group of an utterance whose T is
// not a multiple of k is completed with zero frames (the per-utterance mean once features are
// normalised), so no audio is dropped. CTC needs T' >= U + (the repeated neighbours in the
// labels): stacking by 4 gives 40 ms per position, which still fits phone rates of natural
// speech (about 12 phones/s).
//
// Buckets: utterances are sorted by length (ties by their index, so the order is deterministic)
// and cut into consecutive batches, each holding as many utterances as fit both limits: at most
// `batch_size` utterances and at most `max_frames` padded frames (B x Tmax of the stacked
// frames). Since neighbours in the sorted order have similar lengths, padding stays small. An
// utterance longer than max_frames on its own gets a batch to itself. Training shuffles the order
// of the batches (not their contents) every epoch with the run's Generator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"

namespace clustr {

// The number of stacked frames of an utterance of `frames` frames: ceil(frames / k), k >= 1.
int64_t stacked_length(int64_t frames, int k);

// features f32 (T, bins) on cpu -> (ceil(T / k), k bins): row t is frames k t .. k t + k - 1
// side by side, zero frames past T. k = 1 returns a copy.
Tensor stack_frames(const Tensor& features, int k);

// One utterance ready for batching: features already normalised and stacked.
struct SpeechExample {
  std::string id;
  Tensor features;              // f32 (T', k bins)
  std::vector<int32_t> labels;  // token indices (never the blank)
  int64_t frames = 0;           // 10 ms frames before stacking (T)
};

// The fewest frames CTC needs for `labels`: U plus one blank between each pair of equal
// neighbours.
int64_t ctc_min_frames(const std::vector<int32_t>& labels);

struct BucketOptions {
  int64_t batch_size = 0;  // most utterances per batch; 0 = no limit
  int64_t max_frames = 0;  // most padded frames (B x Tmax) per batch; 0 = no limit
};

// lengths (one per utterance, >= 0) -> batches of utterance indices (into `lengths`), in
// order of increasing length; every index appears exactly once. Throws when both limits are 0
// (one batch of everything is never what a caller wants) or one is negative.
std::vector<std::vector<size_t>> make_length_buckets(const std::vector<int64_t>& lengths,
                                                     const BucketOptions& options);

// Shuffles the order of the batches in place (Fisher-Yates with draws from gen).
void shuffle_batches(std::vector<std::vector<size_t>>& batches, Generator& gen);

// A padded batch; everything on cpu.
struct SpeechBatch {
  Tensor features;        // f32 (B, Tmax, features), zeros past each utterance's length
  Tensor lengths;         // i32 (B): T' of each utterance; the encoder's attention masks keys
                          // (and queries) at positions >= lengths[b], CTC reads t < lengths[b]
  Tensor targets;         // i32 (B, Umax), zeros past each target length
  Tensor target_lengths;  // i32 (B)
  std::vector<size_t> indices;  // the examples' indices, in batch order
  int64_t frames = 0;           // sum of lengths (stacked frames actually used)
  int64_t input_frames = 0;     // sum of the examples' 10 ms frames before stacking
};

// Pads examples[indices[0]], examples[indices[1]], ... into one batch. Throws on an empty index
// list, an index out of range, or examples whose feature widths differ.
SpeechBatch collate_speech(const std::vector<SpeechExample>& examples,
                           const std::vector<size_t>& indices);

}  // namespace clustr
