// Waveform augmentation for speech training (wave_augment.h).
#include "data/wave_augment.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>

#include "core/error.h"
#include "data/audio.h"
#include "data/augment.h"

namespace clustr {

namespace {

constexpr double kLn1000 = 6.907755278982137;  // ln(10^3): 60 dB of amplitude

// Canonical text of a value: %.15g reads back as the decimal the user typed.
std::string number_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

double parse_value(const std::string& part, const std::string& text, const std::string& flag) {
  char* end = nullptr;
  const double v = std::strtod(part.c_str(), &end);
  CLUSTR_CHECK(!part.empty() && *end == '\0' && std::isfinite(v), flag, " '", text,
               "' is not a value, a list or a range: expected a number (1.1), numbers separated "
               "by commas (0.9,1,1.1) or two numbers separated by a colon (0.9:1.1)");
  return v;
}

double power(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += double(v) * double(v);
  return x.empty() ? 0.0 : s / double(x.size());
}

// Real FFTs by size, made once per thread (their tables take O(n) cosines).
const RealFft& fft_of_size(int n) {
  thread_local std::map<int, std::unique_ptr<RealFft>> ffts;
  std::unique_ptr<RealFft>& f = ffts[n];
  if (!f) f = std::make_unique<RealFft>(n);
  return *f;
}

}  // namespace

// ---- Spread ------------------------------------------------------------------------------------

Spread Spread::range(double lo, double hi) {
  CLUSTR_CHECK(lo <= hi, "Spread::range: ", lo, " > ", hi);
  Spread s;
  s.values_ = {lo, hi};
  s.range_ = true;
  return s;
}

Spread Spread::parse(const std::string& text, const std::string& flag) {
  const size_t colon = text.find(':');
  if (colon != std::string::npos) {
    const double lo = parse_value(text.substr(0, colon), text, flag);
    const double hi = parse_value(text.substr(colon + 1), text, flag);
    CLUSTR_CHECK(lo <= hi, flag, " '", text, "': the range's low end is above its high end");
    return range(lo, hi);
  }
  Spread s;
  s.values_.clear();
  size_t i = 0;
  while (true) {
    const size_t j = std::min(text.find(',', i), text.size());
    s.values_.push_back(parse_value(text.substr(i, j - i), text, flag));
    if (j == text.size()) break;
    i = j + 1;
  }
  CLUSTR_CHECK(s.values_.size() <= 64, flag, " '", text, "': at most 64 values, got ",
               s.values_.size());
  return s;
}

std::string Spread::text() const {
  std::string s;
  for (double v : values_) s += (s.empty() ? "" : range_ ? ":" : ",") + number_text(v);
  return s;
}

double Spread::draw(Generator& gen) const {
  if (range_) return values_[0] + (values_[1] - values_[0]) * double(gen.next_unit());
  return values_[size_t(uniform_int(gen, int64_t(values_.size()) - 1))];
}

double Spread::lowest() const { return *std::min_element(values_.begin(), values_.end()); }
double Spread::highest() const { return *std::max_element(values_.begin(), values_.end()); }

// ---- options and draws -------------------------------------------------------------------------

const char* to_string(NoiseColour c) {
  switch (c) {
    case NoiseColour::white: return "white";
    case NoiseColour::pink: return "pink";
    case NoiseColour::brown: return "brown";
  }
  return "?";
}

bool WaveAugmentOptions::enabled() const {
  return !speed.only(1.0) || !vtlp.only(1.0) || gain_db > 0 || noise_prob > 0 || reverb_prob > 0;
}

void WaveAugmentOptions::validate() const {
  const auto within = [](const Spread& s, double lo, double hi, const char* flag,
                         const char* what) {
    CLUSTR_CHECK(s.lowest() >= lo && s.highest() <= hi, flag, " must keep to [", lo, ", ", hi,
                 "] ", what, ", got ", s.text());
  };
  within(speed, 0.5, 2.0, "--speed-perturb", "(speed factors)");
  within(vtlp, 0.7, 1.4, "--vtlp", "(warp factors)");
  within(noise_snr, -20, 100, "--noise-snr", "dB");
  within(reverb_rt60, 0.05, 3.0, "--reverb-rt60", "seconds");
  CLUSTR_CHECK(gain_db >= 0 && gain_db <= 40, "--gain-db must be in [0, 40] dB, got ", gain_db);
  CLUSTR_CHECK(noise_prob >= 0 && noise_prob <= 1, "--noise-prob must be in [0, 1], got ",
               noise_prob);
  CLUSTR_CHECK(reverb_prob >= 0 && reverb_prob <= 1, "--reverb-prob must be in [0, 1], got ",
               reverb_prob);
}

AugmentDraw draw_augmentation(const WaveAugmentOptions& o, Generator& gen) {
  AugmentDraw d;
  d.speed = o.speed.draw(gen);
  d.warp = o.vtlp.draw(gen);
  d.gain_db = o.gain_db * (2.0 * double(gen.next_unit()) - 1.0);
  d.reverb = double(gen.next_unit()) < o.reverb_prob;
  d.rt60 = o.reverb_rt60.draw(gen);
  d.drr_db = 10.0 * double(gen.next_unit());
  d.noise = double(gen.next_unit()) < o.noise_prob;
  d.colour = NoiseColour(uniform_int(gen, 2));
  d.snr_db = o.noise_snr.draw(gen);
  return d;
}

// ---- the building blocks -----------------------------------------------------------------------

std::vector<float> convolve(const std::vector<float>& x, const std::vector<float>& h) {
  const size_t n = x.size();
  if (n == 0 || h.empty()) return std::vector<float>(n, 0.0f);
  CLUSTR_CHECK(n + h.size() < (size_t(1) << 30), "convolve: ", n, " samples and ", h.size(),
               " taps are too many for one FFT (at most 2^30 together)");
  // N >= n + L - 1: the circular convolution of the padded sequences is the linear one.
  int N = 4;
  while (size_t(N) < n + h.size() - 1) N *= 2;
  const RealFft& fft = fft_of_size(N);
  const int K = N / 2 + 1;
  const auto n_real = static_cast<size_t>(N), n_bins = static_cast<size_t>(K);
  std::vector<double> buf(n_real, 0.0), xr(n_bins), xi(n_bins), hr(n_bins), hi(n_bins);
  std::copy(x.begin(), x.end(), buf.begin());
  fft.transform(buf.data(), xr.data(), xi.data());
  std::fill(buf.begin(), buf.end(), 0.0);
  std::copy(h.begin(), h.end(), buf.begin());
  fft.transform(buf.data(), hr.data(), hi.data());
  // Y = X H on k = 0..N/2; its inverse through two forward real FFTs: with a_k = Re Y_k (even
  // in k) and b_k = Im Y_k (odd), A = FFT(a) and B = FFT(b), y_j = (Re A_j + Im B_j) / N and
  // y_{N-j} = (Re A_j - Im B_j) / N.
  std::vector<double> a(n_real), b(n_real);
  for (int k = 0; k < K; ++k) {
    const double re = xr[k] * hr[k] - xi[k] * hi[k], im = xr[k] * hi[k] + xi[k] * hr[k];
    a[size_t(k)] = re, b[size_t(k)] = im;
    if (k > 0 && k < N / 2) a[size_t(N - k)] = re, b[size_t(N - k)] = -im;
  }
  b[0] = b[size_t(N / 2)] = 0.0;  // imaginary parts of a real sequence's DFT there: rounding
  std::vector<double> ar(n_bins), ai(n_bins), br(n_bins), bi(n_bins);
  fft.transform(a.data(), ar.data(), ai.data());
  fft.transform(b.data(), br.data(), bi.data());
  std::vector<float> y(n);
  for (int j = 0; j < K; ++j) {
    if (size_t(j) < n) y[size_t(j)] = float((ar[j] + bi[j]) / N);
    if (j > 0 && j < N / 2 && size_t(N - j) < n) y[size_t(N - j)] = float((ar[j] - bi[j]) / N);
  }
  return y;
}

std::vector<float> room_impulse_response(int rate, double rt60, double drr_db, Generator& gen) {
  CLUSTR_CHECK(rate > 0 && rt60 > 0 && std::isfinite(rt60) && std::isfinite(drr_db),
               "room_impulse_response: need rate > 0 and rt60 > 0, got ", rate, " and ", rt60);
  const auto L = int64_t(std::ceil(rt60 * rate));
  Tensor tail = Tensor::empty({std::max<int64_t>(L, 2)});
  normal_(tail, gen);
  std::vector<float> h = tail.to_vector();
  double energy = 0;
  for (size_t t = 1; t < h.size(); ++t) {
    h[t] *= float(std::exp(-kLn1000 * double(t) / (rt60 * rate)));
    energy += double(h[t]) * double(h[t]);
  }
  // The direct sound has energy 1; the tail 10^(-DRR / 10).
  const double scale = energy > 0 ? std::sqrt(std::pow(10.0, -drr_db / 10.0) / energy) : 0.0;
  for (size_t t = 1; t < h.size(); ++t) h[t] = float(h[t] * scale);
  h[0] = 1.0f;
  return h;
}

std::vector<float> coloured_noise(int64_t n, NoiseColour colour, Generator& gen) {
  CLUSTR_CHECK(n >= 0, "coloured_noise: n must be >= 0, got ", n);
  if (n == 0) return {};
  Tensor white = Tensor::empty({n});
  normal_(white, gen);
  std::vector<float> x = white.to_vector();
  if (colour == NoiseColour::pink) {
    // Paul Kellet's sum of six first-order low-passes, made for 44.1 kHz; at 16 kHz its power
    // per octave band stays within 0.3 dB of flat from 250 Hz to 8 kHz (the test measures it).
    double b[7] = {0, 0, 0, 0, 0, 0, 0};
    for (float& v : x) {
      const double w = v;
      b[0] = 0.99886 * b[0] + w * 0.0555179;
      b[1] = 0.99332 * b[1] + w * 0.0750759;
      b[2] = 0.96900 * b[2] + w * 0.1538520;
      b[3] = 0.86650 * b[3] + w * 0.3104856;
      b[4] = 0.55000 * b[4] + w * 0.5329522;
      b[5] = -0.7616 * b[5] - w * 0.0168980;
      v = float(b[0] + b[1] + b[2] + b[3] + b[4] + b[5] + b[6] + w * 0.5362);
      b[6] = w * 0.115926;
    }
  } else if (colour == NoiseColour::brown) {
    // Integrated white noise, leaking with a corner near 2.5 Hz at 16 kHz so it stays bounded.
    double y = 0;
    for (float& v : x) v = float(y = 0.999 * y + double(v));
  }
  const double p = power(x);
  const double scale = p > 0 ? 1.0 / std::sqrt(p) : 0.0;
  for (float& v : x) v = float(v * scale);
  return x;
}

void add_noise(std::vector<float>& x, const std::vector<float>& noise, double snr_db) {
  CLUSTR_CHECK(noise.size() == x.size(), "add_noise: ", noise.size(), " noise samples for ",
               x.size(), " signal samples");
  const double ps = power(x), pn = power(noise);
  if (ps <= 0 || pn <= 0) return;
  const double scale = std::sqrt(ps / pn * std::pow(10.0, -snr_db / 10.0));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(double(x[i]) + scale * double(noise[i]));
}

std::vector<float> augment_waveform(const std::vector<float>& samples, int rate,
                                    const AugmentDraw& d, Generator& gen) {
  std::vector<float> x = d.speed == 1.0 ? samples : resample(samples, rate * d.speed, rate);
  if (d.reverb && !x.empty()) {
    const double before = power(x);
    x = convolve(x, room_impulse_response(rate, d.rt60, d.drr_db, gen));
    const double after = power(x);
    if (after > 0) {
      const double scale = std::sqrt(before / after);
      for (float& v : x) v = float(v * scale);
    }
  }
  if (d.noise && !x.empty())
    add_noise(x, coloured_noise(int64_t(x.size()), d.colour, gen), d.snr_db);
  if (d.gain_db != 0.0) {
    const double g = std::pow(10.0, d.gain_db / 20.0);
    for (float& v : x) v = float(v * g);
  }
  return x;
}

Tensor augmented_features(const std::string& path, const Fbank& fbank,
                          const WaveAugmentOptions& options, Generator& gen) {
  const int rate = fbank.config().sample_rate;
  const AugmentDraw d = draw_augmentation(options, gen);
  return fbank.compute(augment_waveform(read_audio(path, rate), rate, d, gen), d.warp);
}

}  // namespace clustr
