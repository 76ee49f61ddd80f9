// The speech app's label language model (lm.h).
#include "apps/speech/lm.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "apps/common/metrics_file.h"
#include "apps/common/run_folder.h"
#include "apps/speech/train.h"
#include "core/error.h"
#include "data/file_reason.h"

namespace clustr::speech {

namespace {

// The label sequences of a manifest's good lines; bad lines are skipped, as training skips
// them, and reported on `log`.
std::vector<LabelSequence> manifest_labels(const std::string& manifest, const TokenTable& tokens,
                                           std::FILE* log) {
  ManifestOptions mo;
  mo.bad_lines = BadLines::skip;
  mo.check_files = false;  // only the labels are read
  const Manifest m = read_manifest(manifest, tokens, mo);
  if (m.skipped > 0)
    std::fprintf(log, "%s: %lld bad lines skipped, the first: %s\n", manifest.c_str(),
                 static_cast<long long>(m.skipped), m.problems.front().c_str());
  std::vector<LabelSequence> out;
  for (const Utterance& u : m.utterances) out.push_back(u.labels);
  return out;
}

}  // namespace

double perplexity(const NgramLm& lm, const std::vector<LabelSequence>& sequences) {
  double sum = 0;
  int64_t n = 0;
  for (const LabelSequence& s : sequences) {
    sum += lm.sequence_log_prob(s);
    n += int64_t(s.size()) + 1;
  }
  return n ? std::exp(-sum / double(n)) : std::nan("");
}

void build_language_model(const LmFlags& f, std::FILE* log) {
  CLUSTR_CHECK(!f.out.empty(), "--out: expected the file to write the language model to");
  CLUSTR_CHECK(f.order >= 1 && f.order <= NgramLm::kMaxOrder, "--order must be in [1, ",
               NgramLm::kMaxOrder, "], got ", f.order);
  check_output_file("--out", f.out, f.overwrite, /*folder_must_exist=*/true);
  const TokenTable tokens = read_tokens(f.tokens.empty() ? default_tokens(f.manifest) : f.tokens);
  const std::vector<LabelSequence> text = manifest_labels(f.manifest, tokens, log);
  CLUSTR_CHECK(!text.empty(), f.manifest, ": no utterances to count");
  const std::vector<LabelSequence> dev =
      f.dev.empty() ? std::vector<LabelSequence>{} : manifest_labels(f.dev, tokens, log);
  const NgramLm lm = NgramLm::estimate(text, tokens.size(), f.order);
  int64_t labels = 0;
  for (const LabelSequence& s : text) labels += int64_t(s.size());
  std::fprintf(log, "%s: %zu sequences, %lld labels; order %d, distinct n-grams by order:",
               f.manifest.c_str(), text.size(), static_cast<long long>(labels), f.order);
  for (int64_t n : lm.distinct_ngrams()) std::fprintf(log, " %lld", static_cast<long long>(n));
  std::fprintf(log, "\nperplexity per label: %.3f on the training text", perplexity(lm, text));
  if (!f.dev.empty()) std::fprintf(log, ", %.3f on %s", perplexity(lm, dev), f.dev.c_str());
  std::fprintf(log, " (%d labels and </s>)\n", tokens.size() - 1);
  write_lines_atomically(f.out, {lm.to_json(tokens.tokens)});
  std::fprintf(log, "wrote %s\n", f.out.c_str());
}

LanguageModel load_language_model(const std::string& path, const TokenTable& tokens,
                                  const std::vector<double>& weights,
                                  const std::vector<double>& bonuses) {
  // A folder or a FIFO is refused before it is opened (a FIFO would block the read).
  const std::string reason = unreadable_reason(path);
  CLUSTR_CHECK(reason.empty(), "--lm: cannot open ", path, ": ", reason);
  std::ifstream in(path, std::ios::binary);
  CLUSTR_CHECK(in.good(), "--lm: cannot open ", path);
  std::ostringstream text;
  text << in.rdbuf();
  LanguageModel m;
  m.file = path;
  std::vector<std::string> saved;
  m.lm = std::make_unique<NgramLm>(NgramLm::from_json(text.str(), path, &saved));
  for (size_t i = 0; i < std::max(saved.size(), tokens.tokens.size()); ++i) {
    const std::string a = i < saved.size() ? saved[i] : "(none)";
    const std::string b = i < tokens.tokens.size() ? tokens.tokens[i] : "(none)";
    CLUSTR_CHECK(a == b, path,
                 ": the language model was counted over another token table: its "
                 "token ",
                 i, " is '", a, "' where the model's is '", b, "'");
  }
  for (double w : weights)
    for (double b : bonuses) m.fusions.push_back({m.lm.get(), w, b});
  return m;
}

}  // namespace clustr::speech
