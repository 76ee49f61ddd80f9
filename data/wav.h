// Reading (and, for tests and tools, writing) mono WAV files.
//
// A WAV file is a RIFF container: "RIFF" <u32 size> "WAVE", then chunks, each
// <4-byte id> <u32 little-endian size> <size bytes> plus one pad byte when size is odd. The
// reader walks every chunk, skips the ones it does not need (LIST, fact, cue, ...), and uses
// "fmt " and "data", wherever they are. Supported formats: 16-bit PCM (format tag 1) and 32-bit
// IEEE float (tag 3), also when wrapped in WAVE_FORMAT_EXTENSIBLE (tag 0xFFFE, sub-format GUID
// of PCM or float). One channel only.
//
// Every problem (not a RIFF/WAVE file, a header or chunk cut short, no fmt or data chunk, an
// unsupported format, a wrong channel count or sample rate) throws clustr::Error naming the
// file and the problem; malformed input never reads out of bounds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace clustr {

struct WavInfo {
  int format = 0;  // 1 PCM, 3 IEEE float (after resolving an extensible header)
  int channels = 0;
  int sample_rate = 0;
  int bits_per_sample = 0;
  int64_t num_samples = 0;  // per channel
};

// The samples of a mono WAV file as floats in [-1, 1] (PCM16 values divided by 32768; float
// files as stored). `expected_rate` is the sample rate the caller needs (16000 for the speech
// front end); another rate is an error, as is more than one channel.
std::vector<float> read_wav(const std::string& path, int expected_rate, WavInfo* info = nullptr);

// The same, from bytes already in memory; `name` is used in error messages.
std::vector<float> parse_wav(const std::string& name, const std::vector<uint8_t>& bytes,
                             int expected_rate, WavInfo* info = nullptr);

// Writes mono 16-bit PCM: samples in [-1, 1] are scaled by 32768, rounded and clipped.
void write_wav_pcm16(const std::string& path, const std::vector<float>& samples, int sample_rate);

}  // namespace clustr
