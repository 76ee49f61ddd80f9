// Audio files through libsndfile and libsoxr (audio.h).
#include "data/audio.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "data/file_reason.h"

#if defined(CLUSTR_WITH_AUDIO)
#include <sndfile.h>
#include <soxr.h>
#endif

namespace clustr {

namespace {

template <typename... Args>
[[noreturn]] void fail(const char* op, const std::string& name, const Args&... args) {
  throw Error(detail::cat(op, ": ", name, ": ", args...));
}

}  // namespace

#if !defined(CLUSTR_WITH_AUDIO)

bool audio_compiled() { return false; }

namespace {
[[noreturn]] void no_audio(const char* op) {
  throw Error(detail::cat(op, ": clustr was built without libsndfile and libsoxr (install "
                          "libsndfile1-dev and libsoxr-dev, then configure again)"));
}
}  // namespace

AudioInfo probe_audio(const std::string&) { no_audio("probe_audio"); }
std::vector<float> read_audio(const std::string&, int, AudioInfo*) { no_audio("read_audio"); }
std::vector<float> decode_audio(const std::string&, const std::vector<uint8_t>&, int, AudioInfo*) {
  no_audio("decode_audio");
}
void write_audio(const std::string&, const std::vector<float>&, int, int, const std::string&) {
  no_audio("write_audio");
}
std::vector<float> resample(const std::vector<float>&, double, double) { no_audio("resample"); }

#else

bool audio_compiled() { return true; }

namespace {

// Closes the file on every path out.
class Sound {
 public:
  explicit Sound(SNDFILE* f) : f_(f) {}
  ~Sound() {
    if (f_) sf_close(f_);
  }
  Sound(const Sound&) = delete;
  Sound& operator=(const Sound&) = delete;
  SNDFILE* get() const { return f_; }

 private:
  SNDFILE* f_;
};

std::string format_name(int format) {
  SF_FORMAT_INFO major{}, sub{};
  major.format = format & SF_FORMAT_TYPEMASK;
  sub.format = format & SF_FORMAT_SUBMASK;
  const bool m = sf_command(nullptr, SFC_GET_FORMAT_INFO, &major, sizeof major) == 0;
  const bool s = sf_command(nullptr, SFC_GET_FORMAT_INFO, &sub, sizeof sub) == 0;
  return detail::cat(m ? major.name : "unknown container", ", ", s ? sub.name : "unknown encoding");
}

bool is_wav_family(int format) {
  const int major = format & SF_FORMAT_TYPEMASK;
  return major == SF_FORMAT_WAV || major == SF_FORMAT_WAVEX || major == SF_FORMAT_W64 ||
         major == SF_FORMAT_RF64;
}

// libsndfile reads a WAV that is cut short without an error when its header parses: its log
// says so, on the data chunk's line ("data : 14 (should be 11)"), or as a short read before
// that line (the data chunk's own header cut). (A short read after it, in a chunk past the
// data, loses nothing.) Throws those as errors.
void refuse_cut_data(SNDFILE* f, const std::string& name) {
  char log[16384] = {0};
  sf_command(f, SFC_GET_LOG_INFO, log, sizeof log);
  const char* line = log;
  while (line && *line) {
    const char* end = std::strchr(line, '\n');
    const std::string l(line, end ? size_t(end - line) : std::strlen(line));
    long long declared = 0, held = 0;
    if (std::sscanf(l.c_str(), "data : %lld (should be %lld)", &declared, &held) == 2)
      fail("read_audio", name, "the 'data' chunk declares ", declared,
           " bytes but the file holds ", held, " (the file is cut short)");
    if (l.rfind("data :", 0) == 0) return;
    if (l.find("short count") != std::string::npos)
      fail("read_audio", name, "the file ends inside its header (it is cut short)");
    line = end ? end + 1 : nullptr;
  }
}

constexpr int kMaxChannels = 64;
constexpr int kMinRate = 1000, kMaxRate = 768000;

// The whole file, mixed down to mono, at `rate`.
std::vector<float> decode(SNDFILE* f, const SF_INFO& si, const std::string& name, int rate,
                          AudioInfo* info) {
  CLUSTR_CHECK(rate >= kMinRate && rate <= kMaxRate, "read_audio: ", name,
               ": the rate asked for must be in [", kMinRate, ", ", kMaxRate, "] Hz, got ", rate);
  if (si.channels < 1 || si.channels > kMaxChannels)
    fail("read_audio", name, si.channels, " channels (expected 1 to ", kMaxChannels,
         "; a damaged header?)");
  // Rates outside these are damaged headers, not audio (and would make the resampler's
  // filters absurd).
  if (si.samplerate < kMinRate || si.samplerate > kMaxRate)
    fail("read_audio", name, "a sample rate of ", si.samplerate, " Hz (expected ", kMinRate,
         " to ", kMaxRate, " Hz; a damaged header?)");
  if (is_wav_family(si.format)) refuse_cut_data(f, name);
  const int64_t frames = si.frames;
  if (frames < 0 || frames > std::numeric_limits<int64_t>::max() / 8 / si.channels)
    fail("read_audio", name, "an impossible length of ", frames, " frames");
  std::vector<float> all(size_t(frames) * size_t(si.channels));
  const sf_count_t got = frames ? sf_readf_float(f, all.data(), frames) : 0;
  if (got != frames)
    fail("read_audio", name, "decoded ", got, " of ", frames, " frames (", sf_strerror(f),
         "; the file is cut short or damaged)");
  // Float files can hold anything; audio lies near [-1, 1]. A sample far outside is a damaged
  // file, and mixing or resampling it could overflow to infinity.
  constexpr float kMaxMagnitude = 1e6f;
  for (size_t i = 0; i < all.size(); ++i) {
    if (!std::isfinite(all[i]))
      fail("read_audio", name, "sample ", i / size_t(si.channels), " is not a finite number");
    if (std::fabs(all[i]) > kMaxMagnitude)
      fail("read_audio", name, "sample ", i / size_t(si.channels), " is ", all[i],
           ", far outside audio's range (at most ", kMaxMagnitude, " in magnitude is read; a "
           "damaged file?)");
  }
  std::vector<float> mono(static_cast<size_t>(frames));
  if (si.channels == 1) {
    mono = std::move(all);
  } else {
    for (size_t t = 0; t < mono.size(); ++t) {
      double sum = 0;
      for (int c = 0; c < si.channels; ++c) sum += all[t * size_t(si.channels) + size_t(c)];
      mono[t] = static_cast<float>(sum / si.channels);
    }
  }
  if (info) *info = AudioInfo{si.samplerate, si.channels, frames, format_name(si.format)};
  if (si.samplerate == rate || mono.empty()) return mono;
  return resample(mono, si.samplerate, rate);
}

// libsndfile's virtual I/O over bytes in memory.
struct Memory {
  const std::vector<uint8_t>* bytes;
  sf_count_t pos;
};
sf_count_t memory_length(void* m) { return sf_count_t(static_cast<Memory*>(m)->bytes->size()); }
sf_count_t memory_seek(sf_count_t offset, int whence, void* m) {
  Memory* mem = static_cast<Memory*>(m);
  const sf_count_t size = sf_count_t(mem->bytes->size());
  sf_count_t p = whence == SEEK_SET ? offset : whence == SEEK_CUR ? mem->pos + offset : size + offset;
  mem->pos = std::clamp<sf_count_t>(p, 0, size);
  return mem->pos;
}
sf_count_t memory_read(void* ptr, sf_count_t n, void* m) {
  Memory* mem = static_cast<Memory*>(m);
  n = std::clamp<sf_count_t>(n, 0, sf_count_t(mem->bytes->size()) - mem->pos);
  if (n > 0) std::memcpy(ptr, mem->bytes->data() + mem->pos, size_t(n));
  mem->pos += n;
  return n;
}
sf_count_t memory_write(const void*, sf_count_t, void*) { return 0; }
sf_count_t memory_tell(void* m) { return static_cast<Memory*>(m)->pos; }

}  // namespace

std::vector<float> resample(const std::vector<float>& samples, double from_rate, double to_rate) {
  CLUSTR_CHECK(std::isfinite(from_rate) && std::isfinite(to_rate) && from_rate >= kMinRate &&
                   from_rate <= kMaxRate && to_rate >= kMinRate && to_rate <= kMaxRate,
               "resample: rates must be in [", kMinRate, ", ", kMaxRate, "] Hz, got ", from_rate,
               " and ", to_rate);
  if (from_rate == to_rate || samples.empty()) return samples;
  // libsoxr, one shot: its high-quality setting (20-bit precision, a passband to 91% of the
  // lower Nyquist frequency), float in and out.
  const size_t out_len = size_t(std::llround(double(samples.size()) * to_rate / from_rate));
  if (out_len == 0) return {};  // fewer input samples than one output period
  std::vector<float> out(out_len);
  size_t in_done = 0, out_done = 0;
  const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);
  const soxr_error_t err =
      soxr_oneshot(from_rate, to_rate, 1, samples.data(), samples.size(), &in_done, out.data(),
                   out.size(), &out_done, &io, &quality, nullptr);
  CLUSTR_CHECK(!err, "resample: from ", from_rate, " to ", to_rate, " Hz failed: ", err);
  out.resize(out_done);
  return out;
}

AudioInfo probe_audio(const std::string& path) {
  const std::string reason = unreadable_reason(path);
  if (!reason.empty()) fail("probe_audio", path, "cannot open the file: it ", reason);
  SF_INFO si{};
  Sound f(sf_open(path.c_str(), SFM_READ, &si));
  if (!f.get()) fail("probe_audio", path, sf_strerror(nullptr));
  if (si.samplerate < kMinRate || si.samplerate > kMaxRate || si.channels < 1)
    fail("probe_audio", path, si.channels, " channels at ", si.samplerate,
         " Hz (a damaged header?)");
  return AudioInfo{si.samplerate, si.channels, si.frames, format_name(si.format)};
}

std::vector<float> read_audio(const std::string& path, int rate, AudioInfo* info) {
  const std::string reason = unreadable_reason(path);
  if (!reason.empty()) fail("read_audio", path, "cannot open the file: it ", reason);
  SF_INFO si{};
  Sound f(sf_open(path.c_str(), SFM_READ, &si));
  if (!f.get()) fail("read_audio", path, sf_strerror(nullptr));
  return decode(f.get(), si, path, rate, info);
}

std::vector<float> decode_audio(const std::string& name, const std::vector<uint8_t>& bytes,
                                int rate, AudioInfo* info) {
  Memory mem{&bytes, 0};
  SF_VIRTUAL_IO io{memory_length, memory_seek, memory_read, memory_write, memory_tell};
  SF_INFO si{};
  Sound f(sf_open_virtual(&io, SFM_READ, &si, &mem));
  if (!f.get()) fail("read_audio", name, sf_strerror(nullptr));
  return decode(f.get(), si, name, rate, info);
}

void write_audio(const std::string& path, const std::vector<float>& interleaved, int channels,
                 int rate, const std::string& format) {
  CLUSTR_CHECK(channels >= 1 && rate >= 1, "write_audio: ", path, ": ", channels,
               " channels at ", rate, " Hz");
  CLUSTR_CHECK(interleaved.size() % size_t(channels) == 0, "write_audio: ", path, ": ",
               interleaved.size(), " samples are not whole frames of ", channels);
  for (size_t i = 0; i < interleaved.size(); ++i)
    CLUSTR_CHECK(std::isfinite(interleaved[i]), "write_audio: ", path, ": sample ", i,
                 " is not a finite number");
  struct Kind {
    const char* name;
    int format, bits;  // bits 0: float
  };
  static const Kind kinds[] = {{"wav8", SF_FORMAT_WAV | SF_FORMAT_PCM_U8, 8},
                               {"wav16", SF_FORMAT_WAV | SF_FORMAT_PCM_16, 16},
                               {"wav24", SF_FORMAT_WAV | SF_FORMAT_PCM_24, 24},
                               {"wav-float", SF_FORMAT_WAV | SF_FORMAT_FLOAT, 0},
                               {"flac16", SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 16},
                               {"flac24", SF_FORMAT_FLAC | SF_FORMAT_PCM_24, 24}};
  const Kind* kind = nullptr;
  for (const Kind& k : kinds)
    if (format == k.name) kind = &k;
  CLUSTR_CHECK(kind, "write_audio: ", path, ": unknown format '", format,
               "' (wav8, wav16, wav24, wav-float, flac16, flac24)");
  SF_INFO si{};
  si.samplerate = rate;
  si.channels = channels;
  si.format = kind->format;
  const std::string tmp = detail::cat(path, ".tmp.", ::getpid());
  {
    Sound f(sf_open(tmp.c_str(), SFM_WRITE, &si));
    if (!f.get()) fail("write_audio", path, "cannot create ", tmp, ": ", sf_strerror(nullptr));
    const sf_count_t frames = sf_count_t(interleaved.size() / size_t(channels));
    sf_count_t put = 0;
    if (kind->bits == 0) {
      put = sf_writef_float(f.get(), interleaved.data(), frames);
    } else {
      // Our own rounding: x * 2^(bits-1), clipped, in the top bits of an int (libsndfile's
      // float conversion scales by 2^(bits-1) - 1, which would not read back exactly).
      const double scale = std::ldexp(1.0, kind->bits - 1);
      std::vector<int> q(interleaved.size());
      for (size_t i = 0; i < q.size(); ++i) {
        const double v = std::clamp(std::nearbyint(double(interleaved[i]) * scale), -scale,
                                    scale - 1.0);
        q[i] = static_cast<int>(static_cast<int64_t>(v) * (int64_t(1) << (32 - kind->bits)));
      }
      put = sf_writef_int(f.get(), q.data(), frames);
    }
    if (put != frames) {
      const std::string why = sf_strerror(f.get());
      std::remove(tmp.c_str());
      fail("write_audio", path, "wrote ", put, " of ", frames, " frames: ", why);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    fail("write_audio", path, "cannot rename ", tmp, ": ", std::strerror(err));
  }
}

#endif

void write_wav_pcm16(const std::string& path, const std::vector<float>& samples, int sample_rate) {
  write_audio(path, samples, 1, sample_rate, "wav16");
}

}  // namespace clustr
