// Speech data augmentation (augment.h).
#include "data/augment.h"

#include <algorithm>

#include "core/error.h"

namespace clustr {

void SpecAugmentOptions::validate() const {
  CLUSTR_CHECK(freq_masks >= 0 && freq_masks <= 16, "--spec-freq-masks must be in [0, 16], got ",
               freq_masks);
  CLUSTR_CHECK(freq_width >= 0 && freq_width <= 80, "--spec-freq-width must be in [0, 80] bins, "
               "got ", freq_width);
  CLUSTR_CHECK(time_masks >= 0 && time_masks <= 16, "--spec-time-masks must be in [0, 16], got ",
               time_masks);
  CLUSTR_CHECK(time_width >= 0 && time_width <= 1000, "--spec-time-width must be in [0, 1000] "
               "frames, got ", time_width);
  CLUSTR_CHECK(max_time_ratio >= 0.0 && max_time_ratio <= 1.0,
               "--spec-time-ratio must be in [0, 1], got ", max_time_ratio);
}

int64_t uniform_int(Generator& gen, int64_t n) {
  CLUSTR_CHECK(n >= 0 && n < (int64_t(1) << 32), "uniform_int: n must be in [0, 2^32), got ", n);
  return int64_t((uint64_t(gen.next_u32()) * uint64_t(n + 1)) >> 32);
}

void spec_augment(SpeechBatch& batch, int64_t bins, int stacking,
                  const SpecAugmentOptions& options, Generator& gen) {
  if (!options.enabled()) return;
  options.validate();
  Tensor& x = batch.features;
  CLUSTR_CHECK(x.rank() == 3 && x.device() == Device::cpu && x.dtype() == DType::f32,
               "spec_augment: features must be f32 (B, Tmax, F) on the cpu");
  CLUSTR_CHECK(stacking >= 1 && bins >= 1 && x.size(2) == bins * stacking, "spec_augment: ",
               x.size(2), " features per position are not ", stacking, " x ", bins, " bins");
  const int64_t B = x.size(0), Tmax = x.size(1), F = x.size(2);
  const std::vector<int32_t> lengths = batch.lengths.to_int_vector();
  float* data = x.f32();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t positions = lengths[size_t(b)];  // stacked
    const int64_t frames = positions * stacking;   // 10 ms frames, the last group padded
    float* u = data + b * Tmax * F;
    for (int m = 0; m < options.freq_masks; ++m) {
      const int64_t f = uniform_int(gen, std::min<int64_t>(options.freq_width, bins));
      const int64_t f0 = uniform_int(gen, bins - f);
      for (int64_t t = 0; t < positions; ++t)
        for (int s = 0; s < stacking; ++s)
          std::fill(u + t * F + s * bins + f0, u + t * F + s * bins + f0 + f, 0.0f);
    }
    for (int m = 0; m < options.time_masks; ++m) {
      const int64_t widest = std::min<int64_t>(
          options.time_width, int64_t(options.max_time_ratio * double(frames)));
      const int64_t w = uniform_int(gen, widest);
      const int64_t t0 = uniform_int(gen, frames - w);
      // Frame t is block t % k of stacked position t / k: exactly the frames masked, as if
      // before stacking.
      for (int64_t t = t0; t < t0 + w; ++t) {
        float* frame = u + (t / stacking) * F + (t % stacking) * bins;
        std::fill(frame, frame + bins, 0.0f);
      }
    }
  }
}

}  // namespace clustr
