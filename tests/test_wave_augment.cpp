// Waveform augmentation (data/wave_augment.h) and VTLP in the front end (data/fbank.h): the
// warped filters and features against torchaudio's Kaldi code (tests/fixtures/
// make_audio_fixtures.py), the FFT convolution against a direct one, the statistics each part
// promises (speed factors, SNR, decay, noise colours, draw frequencies), identity at zero
// strength, and seeded determinism.
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "check.h"
#include "core/safetensors.h"
#include "data/audio.h"
#include "data/fbank.h"
#include "data/wave_augment.h"

using namespace clustr;
using clustr::test::TempDir;

namespace {

const std::string kAudio = std::string(CLUSTR_FIXTURE_DIR) + "/audio/";

const SafetensorsFile& references() {
  static const SafetensorsFile f = load_safetensors(kAudio + "fbank_reference.safetensors");
  return f;
}

constexpr double kPi = 3.14159265358979323846;

std::vector<float> tone(int64_t n, double hz, int rate = 16000, double amplitude = 0.3) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(amplitude * std::sin(2 * kPi * hz * i / rate));
  return x;
}

double power_of(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += double(v) * v;
  return s / double(x.size());
}

// The filters of `fb` warped by `warp`, as a dense (40, 256) matrix.
std::vector<float> dense_filters(const Fbank& fb, double warp) {
  std::vector<int> first;
  std::vector<std::vector<double>> w;
  fb.make_filters(warp, first, w);
  std::vector<float> out(40 * 256, 0.0f);
  for (int m = 0; m < 40; ++m)
    for (size_t i = 0; i < w[size_t(m)].size(); ++i)
      out[size_t(m * 256 + first[size_t(m)]) + i] = float(w[size_t(m)][i]);
  return out;
}

// The mean power of x in [lo, hi) Hz, from the periodograms of 1024-sample segments.
double band_power(const std::vector<float>& x, double lo, double hi, int rate = 16000) {
  const int N = 1024;
  RealFft fft(N);
  std::vector<double> seg(N), re(N / 2 + 1), im(N / 2 + 1);
  double sum = 0;
  int64_t count = 0;
  for (size_t start = 0; start + N <= x.size(); start += N) {
    for (int j = 0; j < N; ++j) seg[size_t(j)] = x[start + size_t(j)];
    fft.transform(seg.data(), re.data(), im.data());
    for (int k = 0; k <= N / 2; ++k) {
      const double f = double(k) * rate / N;
      if (f < lo || f >= hi) continue;
      sum += re[size_t(k)] * re[size_t(k)] + im[size_t(k)] * im[size_t(k)];
      ++count;
    }
  }
  return sum / double(count);
}

// The frequency of the strongest FFT bin of the middle 8192 samples (bin width ~2 Hz).
double peak_hz(const std::vector<float>& x, int rate = 16000) {
  const int N = 8192;
  RealFft fft(N);
  std::vector<double> seg(N), re(N / 2 + 1), im(N / 2 + 1);
  const size_t start = (x.size() - N) / 2;
  for (int j = 0; j < N; ++j)
    seg[size_t(j)] = x[start + size_t(j)] * (0.5 - 0.5 * std::cos(2 * kPi * j / (N - 1)));
  fft.transform(seg.data(), re.data(), im.data());
  int best = 0;
  for (int k = 1; k <= N / 2; ++k)
    if (re[size_t(k)] * re[size_t(k)] + im[size_t(k)] * im[size_t(k)] >
        re[size_t(best)] * re[size_t(best)] + im[size_t(best)] * im[size_t(best)])
      best = k;
  return double(best) * rate / N;
}

}  // namespace

// ---- VTLP in the front end ----------------------------------------------------------------------

TEST_CASE("vtlp: warped filters and features equal torchaudio's Kaldi VTLN") {
  Fbank fb;
  // Warp 1 is the plain front end's filters, bit for bit.
  std::vector<float> plain(40 * 256, 0.0f);
  for (int m = 0; m < 40; ++m)
    for (size_t i = 0; i < fb.filter(m).size(); ++i)
      plain[size_t(m * 256 + fb.filter_first(m)) + i] = float(fb.filter(m)[i]);
  CHECK(dense_filters(fb, 1.0) == plain);
  for (const auto& [name, warp] : std::map<std::string, double>{{"090", 0.90}, {"115", 1.15}}) {
    INFO("warp " << warp);
    const Tensor& ref = references().get("mel_banks_vtlp_" + name);
    REQUIRE(ref.shape() == Shape{40, 256});
    // float64 on both sides, rounded once (as the plain filters' test).
    CHECK_CLOSE(dense_filters(fb, warp), ref.to_vector(), 0.0, 2.5e-7);
  }
  if (!audio_compiled()) return;
  const std::vector<float> chirp = read_audio(kAudio + "chirp.wav", 16000);
  for (const auto& [name, warp] : std::map<std::string, double>{{"085", 0.85}, {"110", 1.10}}) {
    INFO("warp " << warp);
    const Tensor& ref = references().get("chirp_vtlp_" + name);
    const Tensor mine = fb.compute(chirp, warp);
    REQUIRE(mine.shape() == ref.shape());
    CHECK_CLOSE(mine.to_vector(), ref.to_vector(), 0.0, 2.5e-7);
  }
  CHECK(fb.compute(chirp, 1.0).to_vector() == fb.compute(chirp).to_vector());
}

TEST_CASE("vtlp: the warp is continuous, keeps the band's ends and moves a tone's bin") {
  const double lo = 20, hi = 8000, vl = 100, vh = 7500;
  for (double w : {0.8, 0.9, 1.1, 1.25}) {
    INFO("warp " << w);
    CHECK(vtln_warp_freq(lo, w, lo, hi, vl, vh) == doctest::Approx(lo));
    CHECK(vtln_warp_freq(hi, w, lo, hi, vl, vh) == doctest::Approx(hi));
    CHECK(vtln_warp_freq(10, w, lo, hi, vl, vh) == 10);  // outside the band: unchanged
    CHECK(vtln_warp_freq(1000, w, lo, hi, vl, vh) == doctest::Approx(1000 / w));
    // Continuous at the two breakpoints, increasing everywhere.
    const double l = vl * std::max(1.0, w), h = vh * std::min(1.0, w);
    for (double b : {l, h})
      CHECK(vtln_warp_freq(b - 1e-9, w, lo, hi, vl, vh) ==
            doctest::Approx(vtln_warp_freq(b, w, lo, hi, vl, vh)).epsilon(1e-9));
    double prev = -1;
    for (double f = lo; f <= hi; f += 7.3) {
      const double v = vtln_warp_freq(f, w, lo, hi, vl, vh);
      CHECK(v > prev);
      prev = v;
    }
  }
  // A 1 kHz tone peaks in a higher mel bin when the filters are warped down (warp > 1).
  Fbank fb;
  const std::vector<float> x = tone(4000, 1000.0);
  const auto peak_bin = [&](double warp) {
    const Tensor f = fb.compute(x, warp);
    const std::vector<float> v = f.to_vector();
    int best = 0;
    for (int m = 0; m < 40; ++m)
      if (v[size_t(10 * 40 + m)] > v[size_t(10 * 40 + best)]) best = m;
    return best;
  };
  CHECK(peak_bin(1.2) > peak_bin(1.0));
  CHECK(peak_bin(0.8) < peak_bin(1.0));
  CHECK_ERROR(fb.compute(x, 0.3), "VTLP warp factor must be in [0.5, 2]", "got 0.3");
  CHECK_ERROR(fb.compute(x, std::nan("")), "VTLP warp factor");
}

// ---- spreads and draws --------------------------------------------------------------------------

TEST_CASE("augment: spreads parse, print and draw what they say") {
  CHECK(Spread::parse("1.1", "--x").text() == "1.1");
  CHECK(Spread::parse("0.9,1.0,1.1", "--x").text() == "0.9,1,1.1");
  CHECK(Spread::parse("0.9:1.1", "--x").text() == "0.9:1.1");
  CHECK(Spread::parse(Spread::parse("0.85:1.2", "--x").text(), "--x").text() == "0.85:1.2");
  CHECK(Spread::parse("1", "--x").only(1.0));
  CHECK_ERROR(Spread::parse("", "--speed-perturb"), "--speed-perturb ''", "0.9,1,1.1");
  CHECK_ERROR(Spread::parse("0.9;1.1", "--speed-perturb"), "'0.9;1.1' is not a value");
  CHECK_ERROR(Spread::parse("0.9,", "--vtlp"), "--vtlp '0.9,'");
  CHECK_ERROR(Spread::parse("1.1:0.9", "--vtlp"), "low end is above its high end");
  CHECK_ERROR(Spread::parse("1:nan", "--vtlp"), "is not a value");

  // A list: each value about a third of the time, nothing else; one generator block a draw.
  const Spread list = Spread::parse("0.9,1,1.1", "--x");
  Generator gen(7);
  std::map<double, int> counts;
  const int n = 6000;
  for (int i = 0; i < n; ++i) ++counts[list.draw(gen)];
  CHECK(gen.offset() == uint64_t(n));
  REQUIRE(counts.size() == 3);
  for (const auto& [v, c] : counts) {
    INFO("value " << v << " drawn " << c << " times of " << n);
    CHECK(std::abs(double(c) / n - 1.0 / 3) < 0.025);
  }
  // A range: inside it, mean in the middle, both ends approached.
  const Spread range = Spread::parse("0.9:1.1", "--x");
  double lo = 2, hi = 0, sum = 0;
  for (int i = 0; i < n; ++i) {
    const double v = range.draw(gen);
    lo = std::min(lo, v), hi = std::max(hi, v), sum += v;
  }
  CHECK(lo >= 0.9);
  CHECK(hi <= 1.1);
  CHECK(lo < 0.901);
  CHECK(hi > 1.099);
  CHECK(std::abs(sum / n - 1.0) < 0.003);
}

TEST_CASE("augment: draws are seeded, keep their count and follow the options") {
  WaveAugmentOptions o;
  CHECK_FALSE(o.enabled());
  o.speed = Spread::parse("0.9,1,1.1", "--speed-perturb");
  o.vtlp = Spread::parse("0.9:1.1", "--vtlp");
  o.gain_db = 6;
  o.noise_prob = 0.3;
  o.reverb_prob = 0.6;
  CHECK(o.enabled());
  // The same seed draws the same; every draw takes 9 blocks, whatever the options.
  Generator a(11), b(11), c(12), d(11);
  const AugmentDraw x = draw_augmentation(o, a), y = draw_augmentation(o, b),
                    z = draw_augmentation(o, c);
  CHECK(x.speed == y.speed);
  CHECK(x.warp == y.warp);
  CHECK(x.gain_db == y.gain_db);
  CHECK(x.snr_db == y.snr_db);
  CHECK((x.warp != z.warp || x.gain_db != z.gain_db));
  CHECK(a.offset() == 9);
  draw_augmentation(WaveAugmentOptions{}, d);
  CHECK(d.offset() == 9);

  int noise = 0, reverb = 0, colours[3] = {0, 0, 0};
  double gain_lo = 0, gain_hi = 0;
  const int n = 4000;
  Generator gen(3);
  for (int i = 0; i < n; ++i) {
    const AugmentDraw e = draw_augmentation(o, gen);
    noise += e.noise, reverb += e.reverb, ++colours[int(e.colour)];
    gain_lo = std::min(gain_lo, e.gain_db), gain_hi = std::max(gain_hi, e.gain_db);
    CHECK((e.rt60 >= 0.2 && e.rt60 <= 0.8));
    CHECK((e.snr_db >= 5 && e.snr_db <= 30));
    CHECK((e.drr_db >= 0 && e.drr_db <= 10));
  }
  INFO("noise " << noise << " reverb " << reverb << " of " << n);
  CHECK(std::abs(double(noise) / n - 0.3) < 0.025);
  CHECK(std::abs(double(reverb) / n - 0.6) < 0.025);
  for (int k = 0; k < 3; ++k) CHECK(std::abs(double(colours[k]) / n - 1.0 / 3) < 0.03);
  CHECK((gain_lo >= -6 && gain_lo < -5.9));
  CHECK((gain_hi <= 6 && gain_hi > 5.9));

  // Bounds name their flags.
  WaveAugmentOptions bad;
  bad.speed = Spread::parse("0.4:1", "--speed-perturb");
  CHECK_ERROR(bad.validate(), "--speed-perturb must keep to [0.5, 2]", "got 0.4:1");
  bad = WaveAugmentOptions{};
  bad.vtlp = Spread::parse("1.5", "--vtlp");
  CHECK_ERROR(bad.validate(), "--vtlp must keep to [0.7, 1.4]");
  bad = WaveAugmentOptions{};
  bad.noise_prob = 1.5;
  CHECK_ERROR(bad.validate(), "--noise-prob must be in [0, 1]", "1.5");
  bad = WaveAugmentOptions{};
  bad.reverb_rt60 = Spread::parse("0:1", "--reverb-rt60");
  CHECK_ERROR(bad.validate(), "--reverb-rt60 must keep to [0.05, 3] seconds");
  bad = WaveAugmentOptions{};
  bad.gain_db = -1;
  CHECK_ERROR(bad.validate(), "--gain-db must be in [0, 40]");
}

// ---- the building blocks ------------------------------------------------------------------------

TEST_CASE("augment: the FFT convolution equals the direct one") {
  for (const auto& [n, L] : std::vector<std::pair<int, int>>{
           {1, 1}, {5, 3}, {100, 1}, {100, 37}, {257, 256}, {50, 200}, {3000, 1200}}) {
    INFO("n " << n << " L " << L);
    const std::vector<float> x = test::random_values(n, 1 + uint32_t(n)),
                             h = test::random_values(L, 2 + uint32_t(L), -1, 1);
    std::vector<float> direct(size_t(n), 0.0f);
    for (int i = 0; i < n; ++i) {
      double s = 0;
      for (int j = 0; j < L && j <= i; ++j) s += double(h[size_t(j)]) * x[size_t(i - j)];
      direct[size_t(i)] = float(s);
    }
    // Both in double, rounded once; the FFT's rounding is about 1e-15 of the largest terms.
    CHECK_CLOSE(convolve(x, h), direct, 1e-5, 1e-6);
  }
  CHECK(convolve({}, {1.0f}).empty());
  CHECK(convolve({1.0f, 2.0f}, {}) == std::vector<float>{0.0f, 0.0f});
}

TEST_CASE("augment: the room impulse response decays by 60 dB in RT60 at its DRR") {
  Generator gen(5);
  const int rate = 16000;
  for (double rt60 : {0.2, 0.5}) {
    for (double drr : {0.0, 6.0}) {
      INFO("rt60 " << rt60 << " drr " << drr);
      const std::vector<float> h = room_impulse_response(rate, rt60, drr, gen);
      CHECK(h.size() == size_t(std::ceil(rt60 * rate)));
      CHECK(h[0] == 1.0f);
      double tail = 0;
      for (size_t t = 1; t < h.size(); ++t) tail += double(h[t]) * h[t];
      CHECK(10 * std::log10(1.0 / tail) == doctest::Approx(drr).epsilon(1e-4));
      // The envelope: the energy of 20 ms windows a tenth of RT60 apart falls 6 dB per tenth.
      const size_t w = size_t(0.02 * rate);
      const auto window_db = [&](double at) {
        const size_t s = size_t(at * rt60 * rate);
        double e = 0;
        for (size_t t = s; t < s + w; ++t) e += double(h[t]) * h[t];
        return 10 * std::log10(e);
      };
      const double slope = (window_db(0.1) - window_db(0.7)) / 0.6;  // dB per RT60
      CHECK(slope == doctest::Approx(60).epsilon(0.12));
    }
  }
}

TEST_CASE("augment: noise colours have their spectral slopes and the SNR is the one asked") {
  Generator gen(9);
  const int64_t n = 16000 * 20;
  // Power per octave band against the band of 250-500 Hz: white rises 3 dB an octave (more
  // bins per band), pink stays flat, brown falls 3 dB an octave.
  const std::map<NoiseColour, double> per_octave = {
      {NoiseColour::white, 3.0}, {NoiseColour::pink, 0.0}, {NoiseColour::brown, -3.0}};
  for (const auto& [colour, slope] : per_octave) {
    INFO("colour " << std::string(to_string(colour)));
    const std::vector<float> x = coloured_noise(n, colour, gen);
    CHECK(power_of(x) == doctest::Approx(1.0).epsilon(1e-6));
    const double base = band_power(x, 250, 500) * 250;
    for (double f : {1000.0, 2000.0, 4000.0}) {
      // The leaky integrator's power rises above 1/f^2 toward Nyquist (2 dB at 6 kHz).
      if (colour == NoiseColour::brown && f > 2000) continue;
      const double octaves = std::log2(f / 250);
      const double db = 10 * std::log10(band_power(x, f, 2 * f) * f / base);
      INFO("band " << f << "-" << 2 * f << " Hz: " << db << " dB against " << slope * octaves);
      CHECK(std::abs(db - slope * octaves) < 0.6);
    }
  }
  // add_noise: the measured SNR is the one asked; silence stays silent.
  for (double snr : {-5.0, 10.0, 30.0}) {
    std::vector<float> x = tone(16000, 440), y = x;
    const std::vector<float> noise = coloured_noise(16000, NoiseColour::pink, gen);
    add_noise(y, noise, snr);
    std::vector<float> diff(x.size());
    for (size_t i = 0; i < x.size(); ++i) diff[i] = y[i] - x[i];
    CHECK(10 * std::log10(power_of(x) / power_of(diff)) == doctest::Approx(snr).epsilon(1e-4));
  }
  std::vector<float> silent(100, 0.0f);
  add_noise(silent, coloured_noise(100, NoiseColour::white, gen), 10);
  CHECK(silent == std::vector<float>(100, 0.0f));
  CHECK_ERROR(add_noise(silent, std::vector<float>(3), 10), "3 noise samples for 100");
}

TEST_CASE("augment: the waveform steps: identity, speed, reverberation and gain") {
  const int rate = 16000;
  const std::vector<float> x = tone(32000, 500, rate);
  Generator gen(1);
  // Zero strength changes nothing and draws nothing.
  CHECK(augment_waveform(x, rate, AugmentDraw{}, gen) == x);
  CHECK(gen.offset() == 0);
  if (audio_compiled()) {
    // Speed s: the length divided by s, a tone's frequency multiplied by s.
    for (double s : {0.9, 1.1, 1.37}) {
      INFO("speed " << s);
      AugmentDraw d;
      d.speed = s;
      const std::vector<float> y = augment_waveform(x, rate, d, gen);
      CHECK(std::abs(double(y.size()) - double(x.size()) / s) <= 1.0);
      CHECK(std::abs(peak_hz(y) - 500 * s) <= 2.0);
    }
  }
  // Reverberation keeps the length and the RMS, and spreads a click over RT60.
  AugmentDraw r;
  r.reverb = true, r.rt60 = 0.3, r.drr_db = 3;
  std::vector<float> click(8000, 0.0f);
  click[100] = 1.0f;
  const std::vector<float> y = augment_waveform(click, rate, r, gen);
  CHECK(y.size() == click.size());
  CHECK(power_of(y) == doctest::Approx(power_of(click)).epsilon(1e-5));
  int64_t after = 0;
  for (size_t i = 200 + 2400; i < 100 + 4800; ++i) after += std::abs(y[i]) > 0;
  CHECK(after > 2000);  // the tail is still there 150-300 ms later
  // Gain is a product.
  AugmentDraw g;
  g.gain_db = -6.0206;
  const std::vector<float> z = augment_waveform(x, rate, g, gen);
  for (size_t i = 0; i < x.size(); i += 997) CHECK(z[i] == doctest::Approx(x[i] * 0.5).epsilon(1e-5));
  // Noise at an SNR.
  AugmentDraw nd;
  nd.noise = true, nd.snr_db = 12, nd.colour = NoiseColour::brown;
  const std::vector<float> w = augment_waveform(x, rate, nd, gen);
  std::vector<float> diff(x.size());
  for (size_t i = 0; i < x.size(); ++i) diff[i] = w[i] - x[i];
  CHECK(10 * std::log10(power_of(x) / power_of(diff)) == doctest::Approx(12).epsilon(1e-4));
}

TEST_CASE("augment: augmented features are seeded and plain without augmentation" *
          doctest::skip(!audio_compiled())) {
  TempDir dir;
  const std::string wav = dir.file("u.wav");
  std::vector<float> x = tone(24000, 300);
  const std::vector<float> noise = test::random_values(24000, 3, -0.05f, 0.05f);
  for (size_t i = 0; i < x.size(); ++i) x[i] += noise[i];
  write_wav_pcm16(wav, x, 16000);
  Fbank fb;
  const std::vector<float> plain = fb.compute(read_audio(wav, 16000)).to_vector();
  Generator g0(1);
  CHECK(augmented_features(wav, fb, WaveAugmentOptions{}, g0).to_vector() == plain);
  WaveAugmentOptions o;
  o.speed = Spread::parse("0.9:1.1", "--speed-perturb");
  o.vtlp = Spread::parse("0.9:1.1", "--vtlp");
  o.noise_prob = o.reverb_prob = 1;
  o.gain_db = 3;
  Generator a(4), b(4), c(5);
  const Tensor fa = augmented_features(wav, fb, o, a), fb2 = augmented_features(wav, fb, o, b),
               fc = augmented_features(wav, fb, o, c);
  CHECK(fa.to_vector() == fb2.to_vector());
  CHECK(a.offset() == b.offset());
  CHECK(fa.to_vector() != fc.to_vector());
  CHECK(fa.to_vector() != plain);
  // VTLP alone is the warped front end of the same samples.
  WaveAugmentOptions v;
  v.vtlp = Spread(1.2);
  Generator d(1);
  CHECK(augmented_features(wav, fb, v, d).to_vector() ==
        fb.compute(read_audio(wav, 16000), 1.2).to_vector());
}
