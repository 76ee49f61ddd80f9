// WAV reading: see data/wav.h for the layout and what is supported.
#include "data/wav.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "data/file_reason.h"

namespace clustr {
namespace {

constexpr int kFormatPcm = 1;
constexpr int kFormatFloat = 3;
constexpr int kFormatExtensible = 0xFFFE;

template <typename... Args>
[[noreturn]] void fail(const std::string& name, const Args&... args) {
  throw Error(detail::cat("read_wav: ", name, ": ", args...));
}

uint16_t u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// A chunk id for messages: printable characters as they are, others as \xNN.
std::string chunk_name(const uint8_t* p) {
  std::string s = "'";
  for (int i = 0; i < 4; ++i) {
    if (p[i] >= 32 && p[i] < 127) {
      s += static_cast<char>(p[i]);
    } else {
      static const char* hex = "0123456789abcdef";
      s += "\\x";
      s += hex[p[i] >> 4];
      s += hex[p[i] & 15];
    }
  }
  return s + "'";
}

struct Chunk {
  size_t offset = 0;  // of the payload in the file
  size_t size = 0;
  bool found = false;
};

}  // namespace

std::vector<float> parse_wav(const std::string& name, const std::vector<uint8_t>& bytes,
                             int expected_rate, WavInfo* info) {
  const size_t n = bytes.size();
  const uint8_t* b = bytes.data();
  if (n < 12) fail(name, "truncated header: ", n, " bytes, a WAV file has at least 12");
  if (std::memcmp(b, "RIFF", 4) != 0 || std::memcmp(b + 8, "WAVE", 4) != 0)
    fail(name, "not a RIFF/WAVE file (starts with ", chunk_name(b),
         ", expected 'RIFF' ... 'WAVE')");

  // Walk the chunks. The RIFF size field is not trusted (writers that stream often leave it
  // wrong); the real file length bounds everything.
  Chunk fmt, data;
  size_t pos = 12;
  while (pos + 8 <= n) {
    const uint8_t* id = b + pos;
    const size_t size = u32(b + pos + 4);
    const size_t payload = pos + 8;
    if (std::memcmp(id, "fmt ", 4) == 0 || std::memcmp(id, "data", 4) == 0) {
      Chunk& c = id[0] == 'f' ? fmt : data;
      if (c.found) fail(name, "second ", chunk_name(id), " chunk at byte ", pos);
      if (size > n - payload)
        fail(name, "truncated ", chunk_name(id), " chunk at byte ", pos, ": it declares ", size,
             " bytes but only ", n - payload, " remain");
      c = Chunk{payload, size, true};
    }
    if (size > n - payload) break;      // an unknown chunk cut short at the end: ignore it
    pos = payload + size + (size & 1);  // odd sizes are followed by a pad byte
  }
  if (pos < n && pos + 8 > n && !data.found)
    fail(name, "truncated chunk header at byte ", pos, " (", n - pos, " bytes left)");
  if (!fmt.found) fail(name, "no 'fmt ' chunk");
  if (!data.found) fail(name, "no 'data' chunk");

  // The format chunk: tag, channels, rate, byte rate, block align, bits (16 bytes), then for
  // WAVE_FORMAT_EXTENSIBLE a 2-byte extension size, valid bits, channel mask and a GUID whose
  // first two bytes are the real format tag.
  if (fmt.size < 16) fail(name, "'fmt ' chunk has ", fmt.size, " bytes, expected at least 16");
  const uint8_t* f = b + fmt.offset;
  WavInfo wi;
  wi.format = u16(f);
  wi.channels = u16(f + 2);
  wi.sample_rate = static_cast<int>(u32(f + 4));
  const int block_align = u16(f + 12);
  wi.bits_per_sample = u16(f + 14);
  if (wi.format == kFormatExtensible) {
    if (fmt.size < 40)
      fail(name, "extensible 'fmt ' chunk has ", fmt.size, " bytes, expected at least 40");
    static const uint8_t kGuidTail[14] = {0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x80,
                                          0x00, 0x00, 0xAA, 0x00, 0x38, 0x9B, 0x71};
    if (std::memcmp(f + 24 + 2, kGuidTail, 14) != 0)
      fail(name, "extensible format with an unknown sub-format GUID");
    wi.format = u16(f + 24);
  }
  if (wi.format != kFormatPcm && wi.format != kFormatFloat)
    fail(name, "unsupported format tag ", wi.format, " (supported: 1 PCM, 3 IEEE float)");
  if (wi.format == kFormatPcm && wi.bits_per_sample != 16)
    fail(name, "unsupported PCM sample size of ", wi.bits_per_sample,
         " bits (supported: 16-bit PCM, 32-bit float)");
  if (wi.format == kFormatFloat && wi.bits_per_sample != 32)
    fail(name, "unsupported float sample size of ", wi.bits_per_sample,
         " bits (supported: 16-bit PCM, 32-bit float)");
  if (wi.channels != 1) fail(name, wi.channels, " channels, expected mono (1 channel)");
  if (wi.sample_rate != expected_rate)
    fail(name, "sample rate ", wi.sample_rate, " Hz, expected ", expected_rate, " Hz");
  const int bytes_per_sample = wi.bits_per_sample / 8;
  if (block_align != bytes_per_sample)
    fail(name, "block align ", block_align, " does not match one ", wi.bits_per_sample,
         "-bit mono sample");
  if (data.size % static_cast<size_t>(bytes_per_sample) != 0)
    fail(name, "'data' chunk of ", data.size, " bytes is not a whole number of ", bytes_per_sample,
         "-byte samples");

  wi.num_samples = static_cast<int64_t>(data.size / static_cast<size_t>(bytes_per_sample));
  std::vector<float> out(static_cast<size_t>(wi.num_samples));
  const uint8_t* d = b + data.offset;
  if (wi.format == kFormatPcm) {
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = static_cast<float>(static_cast<int16_t>(u16(d + 2 * i))) * (1.0f / 32768.0f);
  } else {
    for (size_t i = 0; i < out.size(); ++i) {
      const uint32_t bits = u32(d + 4 * i);
      float v;
      std::memcpy(&v, &bits, 4);
      if (!std::isfinite(v)) fail(name, "sample ", i, " is not a finite number");
      out[i] = v;
    }
  }
  if (info) *info = wi;
  return out;
}

std::vector<float> read_wav(const std::string& path, int expected_rate, WavInfo* info) {
  const std::string reason = unreadable_reason(path);
  if (!reason.empty()) fail(path, "cannot open the file: it ", reason);
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail(path, "cannot open the file: ", std::strerror(errno));
  const std::streamoff size = in.tellg();
  if (size < 0) fail(path, "cannot read the file");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (size > 0) in.read(reinterpret_cast<char*>(bytes.data()), size);
  if (!in || in.gcount() != size) fail(path, "read error");
  return parse_wav(path, bytes, expected_rate, info);
}

void write_wav_pcm16(const std::string& path, const std::vector<float>& samples, int sample_rate) {
  CLUSTR_CHECK(sample_rate > 0, "write_wav_pcm16: ", path, ": sample rate must be positive, got ",
               sample_rate);
  const uint64_t data_bytes = 2 * static_cast<uint64_t>(samples.size());
  CLUSTR_CHECK(data_bytes <= 0xFFFFFFFFull - 36, "write_wav_pcm16: ", path, ": ", samples.size(),
               " samples do not fit in a WAV file");
  std::vector<uint8_t> out;
  out.reserve(44 + data_bytes);
  auto put32 = [&](uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  auto put16 = [&](uint16_t v) {
    out.push_back(static_cast<uint8_t>(v));
    out.push_back(static_cast<uint8_t>(v >> 8));
  };
  auto tag = [&](const char* s) { out.insert(out.end(), s, s + 4); };
  tag("RIFF");
  put32(static_cast<uint32_t>(36 + data_bytes));
  tag("WAVE");
  tag("fmt ");
  put32(16);
  put16(kFormatPcm);
  put16(1);
  put32(static_cast<uint32_t>(sample_rate));
  put32(static_cast<uint32_t>(sample_rate) * 2);
  put16(2);
  put16(16);
  tag("data");
  put32(static_cast<uint32_t>(data_bytes));
  for (float x : samples) {
    const float s = std::nearbyint(x * 32768.0f);
    const float c = s > 32767.0f ? 32767.0f : (s < -32768.0f ? -32768.0f : s);
    put16(static_cast<uint16_t>(static_cast<int16_t>(c)));
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  CLUSTR_CHECK(f.good(), "write_wav_pcm16: cannot open ", path, " for writing");
  f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  CLUSTR_CHECK(f.good(), "write_wav_pcm16: write to ", path, " failed");
}

}  // namespace clustr
