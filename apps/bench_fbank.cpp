// Front-end benchmark: 40-dim Kaldi filterbanks (data/fbank.h) on one core, in x real time
// (seconds of audio per second of compute).
//
//   bench_fbank [--seconds 600] [--reps 5]     a synthetic 16 kHz signal (chirps + noise)
//   bench_fbank --manifest corpus/train.tsv    the corpus' WAV files: reading, filterbank,
//               [--cache DIR]                  normalisation; with --cache, a pass that fills the
//                                              feature cache and a pass that reads it back
//   bench_fbank --augment [--utterance 6]      each step of the waveform augmentation
//                                              (data/wave_augment.h) on a synthetic utterance
// Prints the median of --reps timed runs (after one untimed run) for the synthetic signal; a
// manifest pass is timed once.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "apps/common/flags.h"
#include "core/error.h"
#include "core/parallel.h"
#include "data/audio.h"
#include "data/fbank.h"
#include "data/manifest.h"
#include "data/wave_augment.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Rising chirps (100 Hz to 7 kHz, one per second) plus white noise, deterministic.
std::vector<float> synthetic_signal(double seconds, int rate) {
  std::vector<float> x(static_cast<size_t>(seconds * rate));
  std::mt19937 rng(1);
  std::normal_distribution<float> noise(0.0f, 0.02f);
  const double pi = 3.14159265358979323846;
  for (size_t i = 0; i < x.size(); ++i) {
    const double t = double(i % size_t(rate)) / rate;
    const double phase = 2 * pi * (100 * t + 0.5 * 6900 * t * t);
    x[i] = 0.3f * float(std::sin(phase)) + noise(rng);
  }
  return x;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void bench_synthetic(double seconds, int reps) {
  clustr::Fbank fbank;
  const std::vector<float> x = synthetic_signal(seconds, fbank.config().sample_rate);
  fbank.compute(x);  // untimed: first-touch of the output pages
  std::vector<double> times;
  int64_t frames = 0;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    clustr::Tensor f = fbank.compute(x);
    times.push_back(seconds_since(t0));
    frames = f.size(0);
  }
  const double t = median(times);
  std::printf(
      "synthetic: %.0f s of audio, %lld frames x %d bins: %.3f s (median of %d), "
      "%.0f x real time, %.2f us per frame\n",
      seconds, static_cast<long long>(frames), fbank.num_bins(), t, reps, seconds / t,
      1e6 * t / double(frames));
}

void bench_manifest(const std::string& manifest_path, const std::string& cache_dir) {
  const std::string dir = std::filesystem::path(manifest_path).parent_path().string();
  const clustr::TokenTable tokens =
      clustr::read_tokens((std::filesystem::path(dir) / "tokens.txt").string());
  const clustr::Manifest m = clustr::read_manifest(manifest_path, tokens);
  std::printf("%s\n", m.summary().c_str());
  clustr::Fbank fbank;
  double audio = 0, t_read = 0, t_fbank = 0, t_norm = 0;
  int64_t frames = 0;
  for (const clustr::Utterance& u : m.utterances) {
    auto t0 = Clock::now();
    const std::vector<float> x = clustr::read_audio(u.wav_path, fbank.config().sample_rate);
    t_read += seconds_since(t0);
    t0 = Clock::now();
    const clustr::Tensor f = fbank.compute(x);
    t_fbank += seconds_since(t0);
    t0 = Clock::now();
    clustr::normalize_utterance(f);
    t_norm += seconds_since(t0);
    audio += double(x.size()) / fbank.config().sample_rate;
    frames += f.size(0);
  }
  std::printf(
      "corpus: %.1f s of audio, %lld frames; read %.3f s (%.0f x), fbank %.3f s "
      "(%.0f x real time), normalise %.3f s; all three %.0f x real time\n",
      audio, static_cast<long long>(frames), t_read, audio / t_read, t_fbank, audio / t_fbank,
      t_norm, audio / (t_read + t_fbank + t_norm));
  if (cache_dir.empty()) return;
  std::filesystem::remove_all(cache_dir);
  for (int pass = 0; pass < 2; ++pass) {
    clustr::FeatureCache cache(cache_dir);
    const auto t0 = Clock::now();
    for (const clustr::Utterance& u : m.utterances) cache.features(u.wav_path);
    const double t = seconds_since(t0);
    std::printf("cache pass %d (%s): %.3f s, %.0f x real time, %lld hits, %lld misses\n", pass + 1,
                pass == 0 ? "compute and store" : "read back", t, audio / t,
                static_cast<long long>(cache.hits()), static_cast<long long>(cache.misses()));
  }
}

// Each augmentation step on a synthetic utterance of `seconds`, median of `reps` runs, in x real
// time; then all steps at their most expensive (every part on) and the plain filterbank.
void bench_augment(double seconds, int reps) {
  clustr::Fbank fbank;
  const int rate = fbank.config().sample_rate;
  const std::vector<float> x = synthetic_signal(seconds, rate);
  const auto time = [&](const char* what, const std::function<void(clustr::Generator&)>& f) {
    std::vector<double> times;
    clustr::Generator gen(1);
    f(gen);  // untimed
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      f(gen);
      times.push_back(seconds_since(t0));
    }
    const double t = median(times);
    std::printf("  %-44s %8.3f ms  %7.0f x real time\n", what, 1e3 * t, seconds / t);
  };
  std::printf("augmentation steps on a %.1f s utterance (median of %d runs, one thread):\n",
              seconds, reps);
  clustr::AugmentDraw d;
  time("filterbank (plain)", [&](clustr::Generator&) { fbank.compute(x); });
  time("filterbank, VTLP warp 1.1", [&](clustr::Generator&) { fbank.compute(x, 1.1); });
  d = {};
  d.speed = 1.1;
  time("speed 1.1 (libsoxr)", [&](clustr::Generator& g) { augment_waveform(x, rate, d, g); });
  for (double rt60 : {0.2, 0.8}) {
    d = {};
    d.reverb = true, d.rt60 = rt60, d.drr_db = 5;
    const std::string what = "reverberation, RT60 " + std::to_string(rt60).substr(0, 3) + " s";
    time(what.c_str(), [&](clustr::Generator& g) { augment_waveform(x, rate, d, g); });
  }
  d = {};
  d.noise = true, d.snr_db = 10, d.colour = clustr::NoiseColour::pink;
  time("pink noise at 10 dB", [&](clustr::Generator& g) { augment_waveform(x, rate, d, g); });
  d.speed = 1.1, d.reverb = true, d.rt60 = 0.8, d.drr_db = 5, d.gain_db = 3, d.warp = 1.1;
  time("all on (RT60 0.8 s) + filterbank", [&](clustr::Generator& g) {
    fbank.compute(augment_waveform(x, rate, d, g), d.warp);
  });
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"clustr filterbank front-end benchmark (one core)"};
  double seconds = 600;
  int reps = 5;
  std::string manifest, cache_dir;
  bool augment = false;
  double utterance = 6;
  app.add_option("--seconds", seconds, "length of the synthetic signal")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 36000.0));
  app.add_option("--reps", reps, "timed runs on the synthetic signal")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--manifest", manifest, "also time a corpus manifest (tokens.txt beside it)");
  app.add_option("--cache", cache_dir,
                 "with --manifest: time the feature cache in this "
                 "directory (emptied first)");
  app.add_flag("--augment", augment, "time the waveform augmentation's steps instead");
  app.add_option("--utterance", utterance, "with --augment: the utterance's length in seconds")
      ->capture_default_str()
      ->check(CLI::Range(0.5, 60.0));
  if (const int status = clustr::parse_or_exit(app, argc, argv); status >= 0) return status;
  clustr::set_num_threads(1);
  if (augment) {
    bench_augment(utterance, std::max(reps, 21));
    return 0;
  }
  bench_synthetic(seconds, reps);
  if (!manifest.empty()) bench_manifest(manifest, cache_dir);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_fbank: %s\n", e.what());
  return 1;
}
