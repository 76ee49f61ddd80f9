// The filterbank front end and its feature cache (see data/fbank.h).
#include "data/fbank.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "data/audio.h"

namespace clustr {
namespace fs = std::filesystem;

namespace {

constexpr double kPi = 3.14159265358979323846;

double mel_scale(double hz) { return 1127.0 * std::log(1.0 + hz / 700.0); }
double inverse_mel_scale(double mel) { return 700.0 * (std::exp(mel / 1127.0) - 1.0); }

}  // namespace

// ---- real FFT ----------------------------------------------------------------------------------

RealFft::RealFft(int n) : n_(n), m_(n / 2) {
  CLUSTR_CHECK(n >= 4 && (n & (n - 1)) == 0, "RealFft: size must be a power of two >= 4, got ", n);
  int bits = 0;
  while ((1 << bits) < m_) ++bits;
  bitrev_.resize(static_cast<size_t>(m_));
  for (int i = 0; i < m_; ++i) {
    int r = 0;
    for (int b = 0; b < bits; ++b) r |= ((i >> b) & 1) << (bits - 1 - b);
    bitrev_[static_cast<size_t>(i)] = r;
  }
  cos_.resize(static_cast<size_t>(m_ / 2));
  sin_.resize(static_cast<size_t>(m_ / 2));
  for (int k = 0; k < m_ / 2; ++k) {
    cos_[static_cast<size_t>(k)] = std::cos(2 * kPi * k / m_);
    sin_[static_cast<size_t>(k)] = -std::sin(2 * kPi * k / m_);
  }
  split_cos_.resize(static_cast<size_t>(m_) + 1);
  split_sin_.resize(static_cast<size_t>(m_) + 1);
  for (int k = 0; k <= m_; ++k) {
    split_cos_[static_cast<size_t>(k)] = std::cos(2 * kPi * k / n_);
    split_sin_[static_cast<size_t>(k)] = -std::sin(2 * kPi * k / n_);
  }
}

void RealFft::transform(const double* x, double* re, double* im) const {
  // z_j = x_{2j} + i x_{2j+1}, loaded in bit-reversed order, then an iterative radix-2 FFT of
  // length m in place: Z_k = E_k + i O_k, where E and O are the FFTs of the even and odd
  // samples.
  const int m = m_;
  for (int j = 0; j < m; ++j) {
    const int r = bitrev_[static_cast<size_t>(j)];
    re[j] = x[2 * r];
    im[j] = x[2 * r + 1];
  }
  for (int len = 2, step = m / 2; len <= m; len *= 2, step /= 2) {
    const int half = len / 2;
    for (int i = 0; i < m; i += len) {
      for (int j = 0; j < half; ++j) {
        const double wr = cos_[static_cast<size_t>(j * step)];
        const double wi = sin_[static_cast<size_t>(j * step)];
        const int p = i + j, q = p + half;
        const double tr = wr * re[q] - wi * im[q];
        const double ti = wr * im[q] + wi * re[q];
        re[q] = re[p] - tr;
        im[q] = im[p] - ti;
        re[p] += tr;
        im[p] += ti;
      }
    }
  }
  // Split: with Zc_k = conj(Z_{m-k}), E_k = (Z_k + Zc_k) / 2, O_k = (Z_k - Zc_k) / (2i), and
  // X_k = E_k + W^k O_k, W = e^{-2 pi i / n}. Bins k and m - k use the same two values, so
  // they are computed together and written in place.
  const double z0r = re[0], z0i = im[0];
  re[0] = z0r + z0i, im[0] = 0;
  re[m] = z0r - z0i, im[m] = 0;
  for (int k = 1; k <= m / 2; ++k) {
    const int j = m - k;
    const double a = re[k], b = im[k], c = re[j], d = im[j];
    const double er = 0.5 * (a + c), ei = 0.5 * (b - d);
    const double orr = 0.5 * (b + d), oi = 0.5 * (c - a);
    const double wr = split_cos_[static_cast<size_t>(k)], wi = split_sin_[static_cast<size_t>(k)];
    const double vr = split_cos_[static_cast<size_t>(j)], vi = split_sin_[static_cast<size_t>(j)];
    // X_k = E_k + W^k O_k and X_j = conj(E_k) + W^j conj(O_k).
    re[k] = er + wr * orr - wi * oi;
    im[k] = ei + wr * oi + wi * orr;
    re[j] = er + vr * orr + vi * oi;
    im[j] = -ei + vi * orr - vr * oi;
  }
}

// ---- filterbank ------------------------------------------------------------------------------

namespace {

// Kaldi computes the frame sizes as int(rate * ms * 0.001) in double; the same expression gives
// the same integers.
int samples_of(int rate, double ms) { return static_cast<int>(rate * ms * 0.001); }

int next_power_of_two(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

RealFft make_fft(const FbankConfig& c) {
  const int window = samples_of(c.sample_rate, c.frame_length_ms);
  CLUSTR_CHECK(window >= 2, "Fbank: frame_length_ms = ", c.frame_length_ms, " at ", c.sample_rate,
               " Hz gives ", window, " samples per frame, need at least 2");
  return RealFft(std::max(4, next_power_of_two(window)));
}

}  // namespace

Fbank::Fbank(const FbankConfig& config) : config_(config), fft_(make_fft(config)) {
  const FbankConfig& c = config_;
  CLUSTR_CHECK(c.sample_rate > 0, "Fbank: sample_rate must be positive, got ", c.sample_rate);
  window_size_ = samples_of(c.sample_rate, c.frame_length_ms);
  window_shift_ = samples_of(c.sample_rate, c.frame_shift_ms);
  CLUSTR_CHECK(window_shift_ > 0, "Fbank: frame_shift_ms = ", c.frame_shift_ms,
               " gives a shift of ", window_shift_, " samples, need at least 1");
  CLUSTR_CHECK(c.num_mel_bins > 3, "Fbank: num_mel_bins must be > 3, got ", c.num_mel_bins);
  CLUSTR_CHECK(c.preemphasis >= 0 && c.preemphasis <= 1,
               "Fbank: preemphasis must be in [0, 1], got ", c.preemphasis);
  CLUSTR_CHECK(std::isfinite(c.input_scale) && c.input_scale > 0,
               "Fbank: input_scale must be positive, got ", c.input_scale);
  const double nyquist = 0.5 * c.sample_rate;
  const double high = c.high_freq <= 0 ? nyquist + c.high_freq : c.high_freq;
  CLUSTR_CHECK(
      c.low_freq >= 0 && c.low_freq < nyquist && high > 0 && high <= nyquist && c.low_freq < high,
      "Fbank: need 0 <= low_freq < high_freq <= Nyquist (", nyquist, " Hz), got low_freq ",
      c.low_freq, ", high_freq ", high);

  window_.resize(static_cast<size_t>(window_size_));
  for (int j = 0; j < window_size_; ++j)
    window_[static_cast<size_t>(j)] =
        std::pow(0.5 - 0.5 * std::cos(2 * kPi * j / (window_size_ - 1)), 0.85);

  make_filters(1.0, filter_first_, filter_weights_);
}

double vtln_warp_freq(double freq, double warp, double low_freq, double high_freq,
                      double vtln_low, double vtln_high) {
  if (freq < low_freq || freq > high_freq) return freq;
  // The breakpoints: inside (l, h) a frequency is divided by the warp factor; below and above,
  // straight lines join that stretch to (low_freq, low_freq) and (high_freq, high_freq).
  const double l = vtln_low * std::max(1.0, warp), h = vtln_high * std::min(1.0, warp);
  const double scale = 1.0 / warp, fl = scale * l, fh = scale * h;
  if (freq < l) return low_freq + (fl - low_freq) / (l - low_freq) * (freq - low_freq);
  if (freq < h) return scale * freq;
  return high_freq + (high_freq - fh) / (high_freq - h) * (freq - high_freq);
}

void Fbank::make_filters(double warp, std::vector<int>& first_bins,
                         std::vector<std::vector<double>>& weights) const {
  const FbankConfig& c = config_;
  CLUSTR_CHECK(std::isfinite(warp) && warp >= kMinWarp && warp <= kMaxWarp,
               "Fbank: the VTLP warp factor must be in [", kMinWarp, ", ", kMaxWarp, "], got ",
               warp);
  const double nyquist = 0.5 * c.sample_rate;
  const double high = c.high_freq <= 0 ? nyquist + c.high_freq : c.high_freq;
  // Kaldi's VTLN cut-offs (vtln-low 100 Hz, vtln-high 500 Hz below Nyquist).
  const double vtln_low = 100.0, vtln_high = nyquist - 500.0;
  const auto warped_mel = [&](double mel) {
    return warp == 1.0 ? mel
                       : mel_scale(vtln_warp_freq(inverse_mel_scale(mel), warp, c.low_freq, high,
                                                  vtln_low, vtln_high));
  };
  // Triangles equally spaced in mel between low and high, each spanning two steps (their corners
  // moved by the warp); FFT bins 0 .. n/2 - 1 (the Nyquist bin gets no weight, as in Kaldi).
  const int fft_bins = fft_.size() / 2;
  const double bin_width = double(c.sample_rate) / fft_.size();
  const double mel_low = mel_scale(c.low_freq), mel_high = mel_scale(high);
  const double delta = (mel_high - mel_low) / (c.num_mel_bins + 1);
  first_bins.assign(static_cast<size_t>(c.num_mel_bins), 0);
  weights.assign(static_cast<size_t>(c.num_mel_bins), {});
  for (int m = 0; m < c.num_mel_bins; ++m) {
    const double left = warped_mel(mel_low + m * delta),
                 center = warped_mel(mel_low + (m + 1) * delta),
                 right = warped_mel(mel_low + (m + 2) * delta);
    int first = -1;
    std::vector<double>& w = weights[static_cast<size_t>(m)];
    for (int k = 0; k < fft_bins; ++k) {
      const double mel = mel_scale(bin_width * k);
      const double up = (mel - left) / (center - left), down = (right - mel) / (right - center);
      const double weight = std::max(0.0, std::min(up, down));
      if (weight > 0) {
        if (first < 0) first = k;
        w.resize(static_cast<size_t>(k - first + 1), 0.0);
        w.back() = weight;
      }
    }
    CLUSTR_CHECK(first >= 0, "Fbank: mel bin ", m, " of ", c.num_mel_bins,
                 " covers no FFT bin; use fewer mel bins or a longer frame");
    first_bins[static_cast<size_t>(m)] = first;
  }
}

int64_t Fbank::num_frames(int64_t num_samples) const {
  if (num_samples < window_size_) return 0;
  return 1 + (num_samples - window_size_) / window_shift_;
}

Tensor Fbank::compute(const std::vector<float>& samples, double warp) const {
  const int64_t n = static_cast<int64_t>(samples.size());
  Tensor out = Tensor::empty({num_frames(n), int64_t(num_bins())});
  if (out.numel() > 0) compute(samples.data(), n, out.f32(), warp);
  return out;
}

void Fbank::compute(const float* samples, int64_t n, float* out, double warp) const {
  // A warped front end builds its own filters (40 x 256 weights: microseconds).
  std::vector<int> warped_first;
  std::vector<std::vector<double>> warped_weights;
  if (warp != 1.0) make_filters(warp, warped_first, warped_weights);
  const std::vector<int>& first_bins = warp != 1.0 ? warped_first : filter_first_;
  const std::vector<std::vector<double>>& weights =
      warp != 1.0 ? warped_weights : filter_weights_;
  const int64_t frames = num_frames(n);
  const int L = window_size_, N = fft_.size(), K = N / 2 + 1, M = num_bins();
  const double scale = config_.input_scale, p = config_.preemphasis;
  std::vector<double> frame(static_cast<size_t>(N), 0.0), re(static_cast<size_t>(K)),
      im(static_cast<size_t>(K)), power(static_cast<size_t>(K));
  for (int64_t t = 0; t < frames; ++t) {
    const float* s = samples + t * window_shift_;
    double* f = frame.data();
    double sum = 0;
    for (int j = 0; j < L; ++j) {
      f[j] = scale * s[j];
      sum += f[j];
    }
    if (config_.remove_dc_offset) {
      const double mean = sum / L;
      for (int j = 0; j < L; ++j) f[j] -= mean;
    }
    if (p != 0) {
      for (int j = L - 1; j > 0; --j) f[j] -= p * f[j - 1];
      f[0] -= p * f[0];
    }
    for (int j = 0; j < L; ++j) f[j] *= window_[static_cast<size_t>(j)];
    // f[L..N) stays zero: the padding.
    fft_.transform(f, re.data(), im.data());
    for (int k = 0; k < K; ++k) power[static_cast<size_t>(k)] = re[k] * re[k] + im[k] * im[k];
    float* o = out + t * M;
    for (int m = 0; m < M; ++m) {
      const std::vector<double>& w = weights[static_cast<size_t>(m)];
      const double* pw = power.data() + first_bins[static_cast<size_t>(m)];
      double e = 0;
      for (size_t i = 0; i < w.size(); ++i) e += w[i] * pw[i];
      o[m] = static_cast<float>(std::log(std::max(e, double(FLT_EPSILON))));
    }
  }
}

std::string Fbank::signature() const {
  const FbankConfig& c = config_;
  std::ostringstream os;
  os << std::setprecision(17) << "fbank v1 rate=" << c.sample_rate
     << " frame_length_ms=" << c.frame_length_ms << " frame_shift_ms=" << c.frame_shift_ms
     << " mel_bins=" << c.num_mel_bins << " low_freq=" << c.low_freq << " high_freq=" << c.high_freq
     << " preemphasis=" << c.preemphasis << " remove_dc=" << (c.remove_dc_offset ? 1 : 0)
     << " input_scale=" << c.input_scale << " window=povey fft=" << fft_.size() << " power log";
  return os.str();
}

Tensor normalize_utterance(const Tensor& features, double eps) {
  CLUSTR_CHECK(
      features.dtype() == DType::f32 && features.device() == Device::cpu && features.rank() == 2,
      "normalize_utterance: expected f32 (T, M) features on cpu, got ", describe(features));
  CLUSTR_CHECK(eps >= 0, "normalize_utterance: eps must be >= 0, got ", eps);
  const int64_t T = features.size(0), M = features.size(1);
  Tensor out = Tensor::empty(features.shape());
  if (out.numel() == 0) return out;
  const float* x = features.f32();
  float* y = out.f32();
  std::vector<double> mean(static_cast<size_t>(M), 0.0), var(static_cast<size_t>(M), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t m = 0; m < M; ++m) mean[static_cast<size_t>(m)] += x[t * M + m];
  for (double& v : mean) v /= double(T);
  // Two passes (mean, then squared deviations): no cancellation for large log energies.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t m = 0; m < M; ++m) {
      const double d = x[t * M + m] - mean[static_cast<size_t>(m)];
      var[static_cast<size_t>(m)] += d * d;
    }
  // A constant bin (all frames equal, eps = 0) maps to 0, not 0/0.
  for (double& v : var) v = v / double(T) + eps > 0 ? 1.0 / std::sqrt(v / double(T) + eps) : 0.0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t m = 0; m < M; ++m)
      y[t * M + m] = static_cast<float>((x[t * M + m] - mean[static_cast<size_t>(m)]) *
                                        var[static_cast<size_t>(m)]);
  return out;
}

// ---- feature cache -----------------------------------------------------------------------------
//
// Entry layout (little-endian): "CLFBANK1", u32 key length, the key, u32 T, u32 M, T * M f32.
// The file must be exactly that long.

namespace {

constexpr char kCacheMagic[8] = {'C', 'L', 'F', 'B', 'A', 'N', 'K', '1'};

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

uint32_t get_u32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(static_cast<unsigned char>(s[at + i])) << (8 * i);
  return v;
}

std::string absolute_path(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

// The entry's features when the file is a complete entry for `key` with M bins; otherwise an
// undefined tensor (any damage is just a miss).
Tensor read_entry(const std::string& path, const std::string& key, int64_t M) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return {};
  const std::streamoff size = in.tellg();
  if (size < 12) return {};
  std::string bytes(static_cast<size_t>(size), '\0');
  in.seekg(0);
  in.read(bytes.data(), size);
  if (!in || in.gcount() != size || bytes.size() < 12 ||
      std::memcmp(bytes.data(), kCacheMagic, 8) != 0)
    return {};
  const size_t key_len = get_u32(bytes, 8);
  if (bytes.size() < 12 + key_len + 8 || bytes.compare(12, key_len, key) != 0 ||
      key_len != key.size())
    return {};
  const int64_t T = get_u32(bytes, 12 + key_len), m = get_u32(bytes, 16 + key_len);
  const size_t data = 20 + key_len;
  if (m != M || bytes.size() != data + size_t(T * M) * 4) return {};
  Tensor out = Tensor::empty({T, M});
  if (out.numel() > 0) std::memcpy(out.f32(), bytes.data() + data, out.nbytes());
  return out;
}

void write_entry(const std::string& path, const std::string& key, const Tensor& features) {
  std::string bytes(kCacheMagic, 8);
  put_u32(bytes, static_cast<uint32_t>(key.size()));
  bytes += key;
  put_u32(bytes, static_cast<uint32_t>(features.size(0)));
  put_u32(bytes, static_cast<uint32_t>(features.size(1)));
  if (features.numel() > 0)
    bytes.append(reinterpret_cast<const char*>(features.f32()), features.nbytes());
  // A unique temporary name, then rename: readers see the old entry or the new one, never
  // part of one. No fsync: a lost entry is only recomputed.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = detail::cat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      const int err = errno;
      std::error_code ec;
      fs::remove(tmp, ec);
      throw Error(detail::cat("FeatureCache: cannot write the cache entry ", tmp, ": ",
                              std::strerror(err)));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw Error(detail::cat("FeatureCache: cannot rename ", tmp, " to ", path, ": ", ec.message()));
  }
}

}  // namespace

FeatureCache::FeatureCache(std::string dir, const FbankConfig& config)
    : dir_(std::move(dir)), fbank_(config), signature_(fbank_.signature()) {
  CLUSTR_CHECK(!dir_.empty(), "FeatureCache: the cache directory name is empty");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  CLUSTR_CHECK(!ec && fs::is_directory(dir_), "FeatureCache: cannot create the cache directory ",
               dir_, ec ? ": " + ec.message() : std::string());
}

std::string FeatureCache::entry_path(const std::string& wav_path) const {
  std::ostringstream name;
  name << std::hex << std::setw(16) << std::setfill('0')
       << fnv1a(absolute_path(wav_path) + '\n' + signature_) << ".fbank";
  return (fs::path(dir_) / name.str()).string();
}

Tensor FeatureCache::features(const std::string& wav_path) {
  // The key is taken before the file is read: if it changes in between, the entry carries the
  // old time and the next lookup recomputes it.
  std::error_code ec;
  const auto size = fs::file_size(wav_path, ec);
  CLUSTR_CHECK(!ec, "FeatureCache: ", wav_path, ": ", ec.message());
  const auto mtime = fs::last_write_time(wav_path, ec);
  CLUSTR_CHECK(!ec, "FeatureCache: ", wav_path, ": ", ec.message());
  const std::string key =
      detail::cat("path=", absolute_path(wav_path),
                  "\nmtime_ns=", static_cast<long long>(mtime.time_since_epoch().count()),
                  "\nsize=", size, "\n", signature_);
  const std::string entry = entry_path(wav_path);
  Tensor cached = read_entry(entry, key, fbank_.num_bins());
  if (cached.defined()) {
    ++hits_;
    return cached;
  }
  ++misses_;
  Tensor feats = fbank_.compute(read_audio(wav_path, fbank_.config().sample_rate));
  write_entry(entry, key, feats);
  return feats;
}

}  // namespace clustr
