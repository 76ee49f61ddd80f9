// A tiny synthetic speech corpus for the speech app's tests (test_speech_app.cpp and the
// cross-device test in test_cuda_apps.cpp): one tone per label, so no speech synthesizer is
// needed.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "data/audio.h"

namespace clustr::test {

// Five labels, each a tone of its own frequency, 80..140 ms long with 20..60 ms of silence
// between; a little white noise everywhere. Utterances of 3..6 labels.
inline constexpr double kToneHz[] = {300, 650, 1100, 1800, 2900};
inline constexpr int kLabels = 5;

inline std::vector<float> tone_utterance(const std::vector<int32_t>& labels, std::mt19937& rng) {
  std::uniform_int_distribution<int> tone_ms(80, 140), gap_ms(20, 60);
  std::normal_distribution<float> noise(0.0f, 0.01f);
  std::vector<float> s;
  auto silence = [&](int ms) {
    for (int i = 0; i < 16 * ms; ++i) s.push_back(noise(rng));
  };
  silence(gap_ms(rng));
  for (int32_t l : labels) {
    const int n = 16 * tone_ms(rng);
    for (int i = 0; i < n; ++i)
      s.push_back(0.3f * float(std::sin(2 * M_PI * kToneHz[l - 1] * i / 16000.0)) + noise(rng));
    silence(gap_ms(rng));
  }
  return s;
}

// Writes tokens.txt, train.tsv (n_train tone utterances) and dev.tsv (n_dev) into dir. With
// `bad`, train.tsv also gets a line with 3 fields, a truncated WAV and an utterance far too
// short for its labels.
inline void write_tone_corpus(const std::string& dir, int n_train, int n_dev, bool bad) {
  namespace fs = std::filesystem;
  fs::create_directories(fs::path(dir) / "wav");
  {
    std::ofstream t(fs::path(dir) / "tokens.txt");
    t << "<blank>\n";
    for (int i = 0; i < kLabels; ++i) t << char('A' + i) << "\n";
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> count(3, 6), label(1, kLabels);
  for (const char* split : {"train", "dev"}) {
    const int n = std::string(split) == "train" ? n_train : n_dev;
    std::ofstream m(fs::path(dir) / (std::string(split) + ".tsv"));
    for (int u = 0; u < n; ++u) {
      std::vector<int32_t> labels(size_t(count(rng)));
      for (int32_t& l : labels) l = label(rng);
      const std::vector<float> samples = tone_utterance(labels, rng);
      const std::string id = std::string(split) + std::to_string(u);
      write_wav_pcm16((fs::path(dir) / "wav" / (id + ".wav")).string(), samples, 16000);
      m << id << "\twav/" << id << ".wav\t" << double(samples.size()) / 16000.0 << "\t";
      for (size_t i = 0; i < labels.size(); ++i) m << (i ? " " : "") << char('A' + labels[i] - 1);
      m << "\n";
    }
    if (bad && std::string(split) == "train") {
      m << "broken_fields\twav/train0.wav\t1.0\n";
      {
        std::ofstream w(fs::path(dir) / "wav" / "cut.wav", std::ios::binary);
        w << "RIFF\x24\x00\x00\x00WAVEfmt ";  // the header stops inside the fmt chunk
      }
      m << "cut\twav/cut.wav\t1.0\tA B\n";
      write_wav_pcm16((fs::path(dir) / "wav" / "short.wav").string(),
                      std::vector<float>(1600, 0.0f), 16000);  // 0.1 s: 8 frames
      m << "short\twav/short.wav\t0.1\tA B C D E A B C D E\n";
    }
  }
}

}  // namespace clustr::test
