// Reading audio files for the speech front end, through libsndfile (WAV of any PCM or float
// encoding, FLAC, Ogg/Vorbis, AIFF, ...: whatever the installed libsndfile reads), mixed down to
// mono (the mean of the channels) and resampled to the rate the caller needs with libsoxr (its
// high-quality setting) when the file has another one. Writing WAV and FLAC, for tests and tools.
//
// Integer samples come out as libsndfile scales them: divided by 2^(bits - 1), so a 16-bit
// file gives value / 32768 exactly; float files as stored. Every problem (not an audio file, a
// format libsndfile cannot read, a WAV whose data chunk is cut short, a sample that is not a
// finite number, a file that cannot be opened, and why) throws clustr::Error naming the file.
//
// Built with libsndfile and libsoxr when CMake finds them (CLUSTR_AUDIO, on by default where
// they are installed); without them every function here throws an error saying so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace clustr {

// True when clustr was built with libsndfile and libsoxr.
bool audio_compiled();

// What a file holds, as stored (before the mix-down and the resampling).
struct AudioInfo {
  int sample_rate = 0;
  int channels = 0;
  int64_t frames = 0;  // samples per channel
  std::string format;  // libsndfile's words for the container and the encoding
};

// What the file at `path` holds, from its header (nothing is decoded).
AudioInfo probe_audio(const std::string& path);

// The samples of the audio file at `path`, mono, at `rate` Hz.
std::vector<float> read_audio(const std::string& path, int rate, AudioInfo* info = nullptr);

// The same, from bytes already in memory; `name` is used in error messages.
std::vector<float> decode_audio(const std::string& name, const std::vector<uint8_t>& bytes,
                                int rate, AudioInfo* info = nullptr);

// `samples` taken as sampled at `from_rate` Hz, resampled to `to_rate` Hz by libsoxr (its
// high-quality setting), about samples.size() x to_rate / from_rate samples. Rates may be
// fractional: speed perturbation plays 16 kHz audio as if it were 16 kHz x factor.
std::vector<float> resample(const std::vector<float>& samples, double from_rate, double to_rate);

// Writes interleaved samples (`channels` per frame, in [-1, 1]) as `format`: "wav8", "wav16",
// "wav24", "wav-float" (32-bit IEEE float), "flac16" or "flac24". Integer encodings round and
// clip. Atomic (a temporary file renamed over `path`).
void write_audio(const std::string& path, const std::vector<float>& interleaved, int channels,
                 int rate, const std::string& format);

// Mono 16-bit PCM WAV (write_audio with "wav16").
void write_wav_pcm16(const std::string& path, const std::vector<float>& samples, int sample_rate);

}  // namespace clustr
