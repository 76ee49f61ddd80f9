// Manifest and token table reading (formats: see data/manifest.h).
#include "data/manifest.h"

#include <cerrno>
#include <cstring>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include "core/error.h"
#include "data/file_reason.h"

namespace clustr {
namespace fs = std::filesystem;

namespace {

// Lines of a text file without their "\n" or "\r\n"; throws when the file cannot be read.
std::vector<std::string> read_lines(const std::string& what, const std::string& path) {
  const std::string reason = unreadable_reason(path);
  CLUSTR_CHECK(reason.empty(), what, ": cannot open ", path, ": ", reason);
  std::ifstream in(path, std::ios::binary);
  CLUSTR_CHECK(in.good(), what, ": cannot open ", path, ": ", std::strerror(errno));
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lines.empty()) line = without_bom(line);  // a UTF-8 byte-order mark opens the file
    lines.push_back(std::move(line));
  }
  CLUSTR_CHECK(!in.bad(), what, ": read error in ", path);
  return lines;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t end = s.find(sep, start);
    parts.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return parts;
}

bool has_space(const std::string& s) {
  for (char c : s)
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return true;
  return false;
}

}  // namespace

int32_t TokenTable::find(const std::string& token) const {
  auto it = index.find(token);
  return it == index.end() ? -1 : it->second;
}

TokenTable read_tokens(const std::string& path) {
  const std::vector<std::string> lines = read_lines("read_tokens", path);
  TokenTable t;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& tok = lines[i];
    const size_t line = i + 1;
    if (tok.empty() && i + 1 == lines.size()) break;  // nothing after the last newline
    CLUSTR_CHECK(!tok.empty(), "read_tokens: ", path, ":", line, ": empty line");
    CLUSTR_CHECK(!has_space(tok), "read_tokens: ", path, ":", line, ": token '", tok,
                 "' contains whitespace");
    CLUSTR_CHECK(i != 0 || tok == kBlankToken, "read_tokens: ", path,
                 ":1: the first token must be the blank '", kBlankToken, "', got '", tok, "'");
    const auto [it, inserted] = t.index.emplace(tok, static_cast<int32_t>(t.tokens.size()));
    CLUSTR_CHECK(inserted, "read_tokens: ", path, ":", line, ": token '", tok,
                 "' already appeared on line ", it->second + 1);
    t.tokens.push_back(tok);
  }
  CLUSTR_CHECK(t.tokens.size() >= 2, "read_tokens: ", path,
               ": needs the blank and at least one "
               "more token, has ",
               t.tokens.size());
  return t;
}

std::string Manifest::summary() const {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << path << ": " << utterances.size() << " utterances, " << total_seconds << " s";
  if (skipped) os << ", " << skipped << " bad line" << (skipped == 1 ? "" : "s") << " skipped";
  return os.str();
}

Manifest read_manifest(const std::string& path, const TokenTable& tokens,
                       const ManifestOptions& options) {
  CLUSTR_CHECK(tokens.size() >= 2 && !tokens.tokens.empty() && tokens.tokens[0] == kBlankToken,
               "read_manifest: ", path, ": the token table is empty or has no blank first");
  const std::vector<std::string> lines = read_lines("read_manifest", path);
  const fs::path base = fs::path(path).parent_path();
  Manifest m;
  m.path = path;
  std::unordered_set<std::string> ids;

  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& text = lines[i];
    if (text.empty()) continue;
    const int64_t line = static_cast<int64_t>(i) + 1;
    // The reason this line is bad, or "" when it is good.
    std::string bad;
    Utterance u;
    u.line = line;
    const std::vector<std::string> fields = split(text, '\t');
    if (fields.size() != 4) {
      bad = detail::cat("expected 4 tab-separated fields (id, wav, duration, labels), got ",
                        fields.size());
    } else if (fields[0].empty() || has_space(fields[0])) {
      bad = detail::cat("the id '", fields[0], "' is empty or contains whitespace");
    } else if (ids.count(fields[0])) {
      bad = detail::cat("duplicate id '", fields[0], "'");
    } else if (fields[1].empty()) {
      bad = "empty wav path";
    } else {
      u.id = fields[0];
      fs::path wav(fields[1]);
      u.wav_path = (wav.is_absolute() ? wav : base / wav).string();
      char* end = nullptr;
      u.duration = std::strtod(fields[2].c_str(), &end);
      if (fields[2].empty() || end != fields[2].c_str() + fields[2].size() ||
          !std::isfinite(u.duration) || u.duration <= 0) {
        bad = detail::cat("duration '", fields[2], "' is not a positive number of seconds");
      } else if (fields[3].find_first_not_of(' ') == std::string::npos) {
        bad = "empty transcript";
      } else {
        for (const std::string& label : split(fields[3], ' ')) {
          if (label.empty()) {
            bad = "labels must be separated by single spaces";
            break;
          }
          const int32_t k = tokens.find(label);
          if (k < 0) {
            bad = detail::cat("label '", label, "' is not in the tokens file");
            break;
          }
          if (k == tokens.blank()) {
            bad = detail::cat("the blank '", label, "' cannot be a label");
            break;
          }
          u.labels.push_back(k);
        }
        if (bad.empty() && options.check_files) {
          const std::string reason = unreadable_reason(u.wav_path);
          if (!reason.empty()) bad = detail::cat("wav file ", u.wav_path, " ", reason);
        }
      }
    }
    if (bad.empty()) {
      ids.insert(u.id);
      m.total_seconds += u.duration;
      m.utterances.push_back(std::move(u));
      continue;
    }
    std::string message = detail::cat(path, ":", line, ": ", bad);
    if (options.bad_lines == BadLines::fail) throw Error("read_manifest: " + message);
    ++m.skipped;
    m.problems.push_back(std::move(message));
  }
  return m;
}

}  // namespace clustr
