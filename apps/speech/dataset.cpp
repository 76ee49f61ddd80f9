// Loading a speech manifest into memory (dataset.h).
#include "apps/speech/dataset.h"

#include <exception>
#include <filesystem>

#include "core/error.h"

namespace clustr::speech {

namespace {
constexpr size_t kProblemsShown = 5;  // more are summarised as a count
}

std::string SpeechSet::summary() const {
  char buf[160];
  std::snprintf(buf, sizeof buf, ": %zu utterances, %.1f s of audio; skipped %lld", examples.size(),
                seconds, static_cast<long long>(skipped()));
  std::string s = std::filesystem::path(manifest).filename().string() + buf;
  std::snprintf(buf, sizeof buf,
                " (%lld bad manifest lines, %lld unreadable audio, %lld too short for their "
                "labels)",
                static_cast<long long>(bad_lines), static_cast<long long>(bad_audio),
                static_cast<long long>(too_short));
  return s + buf;
}

std::string label_string(const TokenTable& tokens, const std::vector<int32_t>& labels) {
  std::string s;
  for (int32_t l : labels) {
    if (!s.empty()) s += ' ';
    s += l >= 0 && l < tokens.size() ? tokens.tokens[size_t(l)] : "<" + std::to_string(l) + ">";
  }
  return s;
}

SpeechSet load_speech_set(const std::string& manifest_path, const TokenTable& tokens,
                          FeatureCache& cache, int stacking, int64_t max_utts, std::FILE* log) {
  ManifestOptions mo;
  mo.bad_lines = BadLines::skip;
  const Manifest manifest = read_manifest(manifest_path, tokens, mo);
  SpeechSet set;
  set.manifest = manifest_path;
  set.bad_lines = manifest.skipped;
  set.problems = manifest.problems;

  std::vector<Utterance> utts = manifest.utterances;
  if (max_utts > 0 && int64_t(utts.size()) > max_utts) utts.resize(size_t(max_utts));
  const int64_t n = int64_t(utts.size());
  std::vector<SpeechExample> examples(utts.size());
  std::vector<std::string> errors(utts.size());
  // Each utterance reads its own WAV and cache entry (FeatureCache is safe across threads); an
  // exception must not leave the parallel region, so each is kept as that utterance's problem.
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t i = 0; i < n; ++i) {
    const Utterance& u = utts[size_t(i)];
    try {
      const Tensor raw = cache.features(u.wav_path);  // (T, 40)
      SpeechExample& e = examples[size_t(i)];
      e.id = u.id;
      e.labels = u.labels;
      e.frames = raw.size(0);
      e.features = stack_frames(normalize_utterance(raw), stacking);
    } catch (const std::exception& ex) {
      errors[size_t(i)] = ex.what();
    }
  }
  for (size_t i = 0; i < utts.size(); ++i) {
    const std::string where = manifest_path + ":" + std::to_string(utts[i].line) + ": ";
    if (!errors[i].empty()) {
      ++set.bad_audio;
      set.problems.push_back(where + errors[i]);
      continue;
    }
    SpeechExample& e = examples[i];
    const int64_t need = ctc_min_frames(e.labels);
    if (e.features.size(0) < need) {
      ++set.too_short;
      set.problems.push_back(where + "utterance '" + e.id + "' has " +
                             std::to_string(e.features.size(0)) + " frames after stacking by " +
                             std::to_string(stacking) + " but its " +
                             std::to_string(e.labels.size()) + " labels need at least " +
                             std::to_string(need));
      continue;
    }
    set.seconds += double(e.frames) * 0.01;
    set.lines.push_back(utts[i].line);
    set.audio.push_back(utts[i].wav_path);
    set.examples.push_back(std::move(e));
  }
  if (log) {
    std::fprintf(log, "%s\n", set.summary().c_str());
    for (size_t i = 0; i < set.problems.size() && i < kProblemsShown; ++i)
      std::fprintf(log, "  skipped: %s\n", set.problems[i].c_str());
    if (set.problems.size() > kProblemsShown)
      std::fprintf(log, "  ... and %zu more\n", set.problems.size() - kProblemsShown);
    std::fflush(log);
  }
  return set;
}

}  // namespace clustr::speech
