// The audio front end (data/audio.h: libsndfile, then libsoxr to 16 kHz) on arbitrary bytes:
// probing and reading; every sample read must be a finite number.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "data/audio.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      clustr::fuzz::write_file("input.wav", std::string(reinterpret_cast<const char*>(data), size));
  clustr::fuzz::expect_clear_errors([&] {
    const clustr::AudioInfo info = clustr::probe_audio(path);
    // Keep each run short: a header may claim hours of audio in a few bytes.
    if (info.frames > 2000000 || info.channels > 64) return;
    for (float v : clustr::read_audio(path, 16000))
      if (!std::isfinite(v)) __builtin_trap();
  });
  return 0;
}

// The seed inputs (--make-seeds=DIR); the ordinary suite runs them through the target too.
void clustr_fuzz_seeds(const std::string& dir) {
  std::vector<float> tone(800);
  for (size_t i = 0; i < tone.size(); ++i) tone[i] = 0.5f * std::sin(0.05f * float(i));
  clustr::write_wav_pcm16(dir + "/tone.wav", tone, 8000);
  clustr::write_audio(dir + "/tone.flac", tone, 1, 16000, "flac16");
  clustr::write_audio(dir + "/tone-float.wav", tone, 1, 44100, "wav-float");
  std::vector<float> stereo(tone.size() * 2);
  for (size_t i = 0; i < tone.size(); ++i) stereo[2 * i] = stereo[2 * i + 1] = tone[i];
  clustr::write_audio(dir + "/stereo.wav", stereo, 2, 22050, "wav24");
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  clustr::fuzz::make_seeds_if_asked(*argc, *argv, clustr_fuzz_seeds);
  return 0;
}
