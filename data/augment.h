// Data augmentation for speech training, seeded from the run's training stream (so a resumed
// run draws the same augmentation as an uninterrupted one).
//
// SpecAugment (Park et al. 2019), its masks without time warping: on each utterance of a
// batch, `freq_masks` bands of the mel bins set to zero (each f ~ U{0..freq_width} bins wide,
// starting at f0 ~ U{0..M - f}), and `time_masks` stretches of frames set to zero (each
// t ~ U{0..min(time_width, max_time_ratio T)} 10 ms frames, at t0 ~ U{0..T - t}). Zero is the
// utterance's mean, since features are normalised per utterance before they are batched. On
// stacked frames (speech_batch.h) a band is masked in each of the k stacked blocks, and a
// stretch in the blocks that hold its frames: the same as masking before stacking.
#pragma once

#include <cstdint>

#include "core/random.h"
#include "data/speech_batch.h"

namespace clustr {

struct SpecAugmentOptions {
  int freq_masks = 0;   // bands per utterance (0: none)
  int freq_width = 8;   // the widest band, in mel bins
  int time_masks = 0;   // stretches per utterance (0: none)
  int time_width = 40;  // the longest stretch, in 10 ms frames
  double max_time_ratio = 0.2;  // and at most this share of the utterance
  bool enabled() const { return freq_masks > 0 || time_masks > 0; }
  // Throws clustr::Error naming the flag (--spec-*) of a value out of range.
  void validate() const;
};

// Masks every utterance of `batch` in place (features (B, Tmax, k M), lengths (B)): M bins per
// frame, k frames stacked per position. Draws 2 numbers per mask from `gen`, utterance by
// utterance, in batch order. Nothing changes (and nothing is drawn) when !options.enabled().
void spec_augment(SpeechBatch& batch, int64_t bins, int stacking,
                  const SpecAugmentOptions& options, Generator& gen);

// A uniform integer in [0, n] from one draw of gen (n < 2^32).
int64_t uniform_int(Generator& gen, int64_t n);

}  // namespace clustr
