// The speech front end: log-mel filterbank features as Kaldi's `compute-fbank-feats` computes
// them (and torchaudio.compliance.kaldi.fbank, which copies Kaldi), per-utterance mean/variance
// normalisation, and an on-disk cache of features.
//
// Shapes: n samples, T frames, M mel bins (40), K = fft_size / 2 + 1 spectrum bins.
//
// Per frame (Kaldi's defaults; only num_mel_bins = 40 and no dither differ):
//   1. frames of window_size = 25 ms (400 samples at 16 kHz) every 10 ms (160); only frames that
//      fit entirely (snip_edges): T = 1 + (n - 400) / 160, and T = 0 when n < 400;
//   2. samples scaled by input_scale (32768: Kaldi reads 16-bit samples as integers, so its
//      features are those of the integer waveform);
//   3. the frame's mean is subtracted (remove DC offset);
//   4. pre-emphasis: x[j] -= 0.97 x[j-1], and x[0] -= 0.97 x[0];
//   5. the Povey window w[j] = (0.5 - 0.5 cos(2 pi j / (L - 1)))^0.85;
//   6. zero padding to the next power of two (512) and a real FFT; power spectrum |X_k|^2;
//   7. M triangular filters, equally spaced on the mel scale mel(f) = 1127 ln(1 + f / 700)
//      between low_freq (20 Hz) and high_freq (Nyquist), with weights from the mel value of each
//      FFT bin's frequency k * rate / fft_size (the Nyquist bin gets weight 0, as in Kaldi);
//   8. log(max(energy, float epsilon)).
// No energy coefficient is added. Everything inside runs in double; the output is float.
//
// Vocal-tract-length perturbation (VTLP; Jaitly and Hinton 2013) is a warp of the filters, the
// way Kaldi's VTLN warps them (vtln_warp_freq below, with vtln-low 100 Hz and vtln-high 500 Hz
// below Nyquist): each triangle's three corners move from frequency f to about f / warp. A warp
// above 1 moves the filters down, so a formant lands in a higher mel bin, as if the speaker's
// vocal tract were shorter.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace clustr {

// A radix-2 FFT of a real sequence of length n (a power of two, >= 4), through a complex FFT of
// length n/2 on the even/odd samples. Tables are made once; transform() is const and keeps no
// state, so one object may be used by several threads.
class RealFft {
 public:
  explicit RealFft(int n);
  int size() const { return n_; }
  // x: (n) reals -> X_k = sum_j x_j e^{-2 pi i j k / n} for k = 0..n/2: re, im each (n/2 + 1),
  // overwritten. x is only read.
  void transform(const double* x, double* re, double* im) const;

 private:
  int n_ = 0;                      // real length
  int m_ = 0;                      // complex length n/2
  std::vector<int> bitrev_;        // (m) bit-reversal permutation
  std::vector<double> cos_, sin_;  // (m/2) twiddles of the complex FFT: e^{-2 pi i k / m}
  std::vector<double> split_cos_, split_sin_;  // (m + 1) e^{-2 pi i k / n} for the real split
};

// Kaldi's piecewise-linear VTLN warp of a frequency (Hz): f / warp between the cut-offs l =
// vtln_low max(1, warp) and h = vtln_high min(1, warp), straight lines from there to low_freq and
// high_freq (which stay where they are); frequencies outside [low_freq, high_freq] unchanged.
double vtln_warp_freq(double freq, double warp, double low_freq, double high_freq,
                      double vtln_low, double vtln_high);

// The VTLP warp factors a front end accepts.
constexpr double kMinWarp = 0.5, kMaxWarp = 2.0;

struct FbankConfig {
  int sample_rate = 16000;
  double frame_length_ms = 25.0;
  double frame_shift_ms = 10.0;
  int num_mel_bins = 40;
  double low_freq = 20.0;     // Hz
  double high_freq = 0.0;     // Hz; <= 0 means Nyquist + high_freq
  double preemphasis = 0.97;  // in [0, 1]
  bool remove_dc_offset = true;
  double input_scale = 32768.0;  // samples in [-1, 1] times this (Kaldi's 16-bit scale)
};

class Fbank {
 public:
  // Checks the configuration (clustr::Error naming the bad field) and builds the window, FFT
  // tables and filters.
  explicit Fbank(const FbankConfig& config = {});

  const FbankConfig& config() const { return config_; }
  int window_size() const { return window_size_; }    // samples per frame (400)
  int window_shift() const { return window_shift_; }  // samples between frames (160)
  int fft_size() const { return fft_.size(); }        // 512
  int num_bins() const { return config_.num_mel_bins; }
  int64_t num_frames(int64_t num_samples) const;  // T for n samples (snip_edges)

  // samples: (n) -> features: (T, M) f32 on cpu (T may be 0), through the filters warped by
  // `warp` (VTLP; 1 = none; in [kMinWarp, kMaxWarp]).
  Tensor compute(const std::vector<float>& samples, double warp = 1.0) const;
  // The same into caller memory: out holds num_frames(n) * M floats (overwritten).
  void compute(const float* samples, int64_t n, float* out, double warp = 1.0) const;

  // The filters warped by `warp`, in the layout of filter_first and filter below.
  void make_filters(double warp, std::vector<int>& first_bins,
                    std::vector<std::vector<double>>& weights) const;
  // The triangular filter of bin m: weights for FFT bins first(m) .. first(m) + size - 1.
  int filter_first(int m) const { return filter_first_[m]; }
  const std::vector<double>& filter(int m) const { return filter_weights_[m]; }

  // Every setting that changes the features, as text: part of the feature cache's key.
  std::string signature() const;

 private:
  FbankConfig config_;
  int window_size_ = 0;
  int window_shift_ = 0;
  RealFft fft_;
  std::vector<double> window_;                       // (window_size) Povey window
  std::vector<int> filter_first_;                    // (M)
  std::vector<std::vector<double>> filter_weights_;  // (M) non-zero weights of each filter
};

// Per-utterance mean and variance normalisation of features (T, M): each bin minus its mean
// over the T frames, divided by sqrt(variance + eps) (population variance). Sums in double.
// Returns a new tensor; T = 0 returns an empty (0, M) tensor.
Tensor normalize_utterance(const Tensor& features, double eps = 1e-5);

// Features of WAV files, computed once and kept in a directory, one small binary file per
// utterance. The entry's name is a hash of the WAV's absolute path and the front end's
// signature; inside, beside the features, the entry stores its full key: path, modification
// time (ns), size in bytes and signature. A lookup whose key differs (the file was rewritten,
// touched or resized) or whose entry is unreadable or cut short recomputes the features and
// replaces the entry (written to a temporary file and renamed, so readers never see half an
// entry). Safe to use from several threads and processes at once.
class FeatureCache {
 public:
  // Creates `dir` when missing. wav files are read at config.sample_rate.
  explicit FeatureCache(std::string dir, const FbankConfig& config = {});

  // Raw (not normalised) features (T, M) of the WAV at `wav_path`.
  Tensor features(const std::string& wav_path);

  const Fbank& fbank() const { return fbank_; }
  const std::string& dir() const { return dir_; }
  std::string entry_path(const std::string& wav_path) const;  // where its entry lives
  int64_t hits() const { return hits_.load(); }
  int64_t misses() const { return misses_.load(); }

 private:
  std::string dir_;
  Fbank fbank_;
  std::string signature_;
  std::atomic<int64_t> hits_{0};
  std::atomic<int64_t> misses_{0};
};

}  // namespace clustr
