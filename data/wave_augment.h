// Waveform augmentation for speech training: speed perturbation (Ko et al. 2015), simulated
// reverberation, additive noise and gain on the samples, and vocal-tract-length perturbation
// (VTLP; Jaitly and Hinton 2013) as a warp of the front end's filters (data/fbank.h). Every
// training utterance is augmented anew each epoch; the rooms and noises are generated here,
// none is read from a file.
//
// One utterance, in this order:
//   1. speed: the samples played at factor s, i.e. resampled from rate x s to rate (libsoxr):
//      the duration divided by s, every frequency multiplied by s (what Kaldi's speed
//      perturbation and sox's `speed` do);
//   2. reverberation, with probability reverb_prob: the convolution with a room impulse
//      response made of the direct sound (one sample of 1) and a diffuse tail of Gaussian
//      noise whose amplitude falls by 60 dB in RT60 ~ reverb_rt60 seconds, the tail's energy
//      DRR ~ U[0, 10] dB below the direct sound's; the result keeps the utterance's length and
//      RMS;
//   3. noise, with probability noise_prob: white, pink (power 1/f) or brown (1/f^2) noise, the
//      colour chosen uniformly, at SNR ~ noise_snr dB (signal power over the whole utterance);
//   4. gain: x 10^(g / 20) with g ~ U[-gain_db, gain_db] dB;
//   5. VTLP: the filterbank warped by a factor ~ vtlp.
// The draws of an utterance come from its own generator (the app derives its key from the
// run's seed, the epoch and the utterance's index), so the augmentation depends neither on the
// thread count nor on the batch order, and a resumed run draws what the uninterrupted one did.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "data/fbank.h"

namespace clustr {

// A value to draw, as a flag spells it: "1.1" (always 1.1), "0.9,1,1.1" (one of the list,
// uniformly), "0.9:1.1" (uniform in the range).
class Spread {
 public:
  explicit Spread(double value = 1.0) : values_{value} {}
  static Spread range(double lo, double hi);  // uniform in [lo, hi]
  // Throws clustr::Error naming `flag` and the accepted forms.
  static Spread parse(const std::string& text, const std::string& flag);
  std::string text() const;
  // One draw from gen, whatever the spread (so the draws after it do not shift).
  double draw(Generator& gen) const;
  double lowest() const;
  double highest() const;
  bool only(double v) const { return lowest() == v && highest() == v; }

 private:
  std::vector<double> values_;  // the list, or {lo, hi} of a range
  bool range_ = false;
};

enum class NoiseColour { white, pink, brown };
const char* to_string(NoiseColour c);

struct WaveAugmentOptions {
  Spread speed{1.0};             // --speed-perturb: factors, in [0.5, 2]
  Spread vtlp{1.0};              // --vtlp: warp factors, in [0.7, 1.4]
  double gain_db = 0;            // --gain-db, in [0, 40]
  double noise_prob = 0;         // --noise-prob, in [0, 1]
  Spread noise_snr = Spread::range(5, 30);  // --noise-snr: dB, in [-20, 100]
  double reverb_prob = 0;        // --reverb-prob, in [0, 1]
  Spread reverb_rt60 = Spread::range(0.2, 0.8);  // --reverb-rt60: seconds, in [0.05, 3]
  // True when some part can change an utterance.
  bool enabled() const;
  // Throws clustr::Error naming the flag of a value out of range.
  void validate() const;
};

// What one utterance gets.
struct AugmentDraw {
  double speed = 1.0, warp = 1.0, gain_db = 0.0;
  bool reverb = false;
  double rt60 = 0.0, drr_db = 0.0;
  bool noise = false;
  NoiseColour colour = NoiseColour::white;
  double snr_db = 0.0;
};

// Draws an utterance's augmentation: 9 numbers from gen, whatever the options.
AugmentDraw draw_augmentation(const WaveAugmentOptions& options, Generator& gen);

// Steps 1-4 of `d` applied to `samples` at `rate` Hz (the impulse response and the noise drawn
// from gen); VTLP (d.warp) is the front end's part.
std::vector<float> augment_waveform(const std::vector<float>& samples, int rate,
                                    const AugmentDraw& d, Generator& gen);

// The raw features (T, M) of the audio file at `path`, one utterance's augmentation drawn from
// gen and applied: read at the front end's rate, augment_waveform, the warped filterbank.
Tensor augmented_features(const std::string& path, const Fbank& fbank,
                          const WaveAugmentOptions& options, Generator& gen);

// The building blocks, each tested on its own.

// The first x.size() samples of the linear convolution x * h, through real FFTs (in double).
std::vector<float> convolve(const std::vector<float>& x, const std::vector<float>& h);
// The impulse response of step 2: ceil(rt60 x rate) samples, h[0] = 1.
std::vector<float> room_impulse_response(int rate, double rt60, double drr_db, Generator& gen);
// n samples of noise of that colour, scaled to an RMS of 1.
std::vector<float> coloured_noise(int64_t n, NoiseColour colour, Generator& gen);
// x + noise scaled so that 10 log10(power(x) / power(noise)) = snr_db; noise.size() == x.size().
// Silence (power 0) stays silence.
void add_noise(std::vector<float>& x, const std::vector<float>& noise, double snr_db);

}  // namespace clustr
