// Importers of real corpora to the speech app's manifest (corpus_import.h).
#include "data/corpus_import.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/audio.h"
#include "data/file_reason.h"
#include "data/manifest.h"

namespace clustr {

namespace fs = std::filesystem;

namespace {

// The lines of a text file (a byte-order mark and '\r' dropped), with their numbers from 1.
std::vector<std::string> lines_of(const std::string& what, const std::string& path) {
  const std::string reason = unreadable_reason(path);
  CLUSTR_CHECK(reason.empty(), what, ": cannot open ", path, ": ", reason);
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
    if (lines.empty()) l = without_bom(l);
    lines.push_back(l);
  }
  CLUSTR_CHECK(!in.bad(), what, ": read error in ", path);
  return lines;
}

// "<first word> <rest>" of a line; false when there is no space.
bool split_first(const std::string& line, std::string& first, std::string& rest) {
  const size_t sp = line.find_first_of(" \t");
  if (sp == std::string::npos) return false;
  first = line.substr(0, sp);
  const size_t r = line.find_first_not_of(" \t", sp);
  rest = r == std::string::npos ? std::string() : line.substr(r);
  return !first.empty();
}

std::string absolute_path_of(const fs::path& p) { return fs::absolute(p).lexically_normal().string(); }

}  // namespace

std::vector<CorpusUtterance> import_librispeech(const std::string& folder) {
  std::error_code ec;
  CLUSTR_CHECK(fs::is_directory(folder, ec), "import librispeech: ", folder, " is not a folder");
  std::vector<std::string> transcripts;
  for (fs::recursive_directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (it->is_regular_file() && name.size() > 10 &&
        name.compare(name.size() - 10, 10, ".trans.txt") == 0)
      transcripts.push_back(it->path().string());
  }
  CLUSTR_CHECK(!ec, "import librispeech: cannot walk ", folder, ": ", ec.message());
  CLUSTR_CHECK(!transcripts.empty(), "import librispeech: ", folder,
               " holds no *.trans.txt (expected <speaker>/<chapter>/<speaker>-<chapter>.trans.txt)");
  std::sort(transcripts.begin(), transcripts.end());
  std::vector<CorpusUtterance> out;
  for (const std::string& t : transcripts) {
    const std::vector<std::string> lines = lines_of("import librispeech", t);
    for (size_t i = 0; i < lines.size(); ++i) {
      if (lines[i].empty()) continue;
      CorpusUtterance u;
      u.where = detail::cat(t, ":", i + 1);
      CLUSTR_CHECK(split_first(lines[i], u.id, u.transcript), "import librispeech: ", u.where,
                   ": expected '<id> <TRANSCRIPT>'");
      const fs::path dir = fs::path(t).parent_path();
      fs::path audio = dir / (u.id + ".flac");
      if (!fs::exists(audio, ec)) audio = dir / (u.id + ".wav");
      CLUSTR_CHECK(fs::exists(audio, ec), "import librispeech: ", u.where, ": no audio ", u.id,
                   ".flac or ", u.id, ".wav in ", dir.string());
      u.audio = absolute_path_of(audio);
      u.seconds = -1;
      out.push_back(std::move(u));
    }
  }
  return out;
}

std::vector<CorpusUtterance> import_kaldi(const std::string& folder) {
  const std::string scp = (fs::path(folder) / "wav.scp").string();
  const std::string text = (fs::path(folder) / "text").string();
  std::map<std::string, std::pair<std::string, std::string>> audio;  // id -> (path, where)
  const std::vector<std::string> scp_lines = lines_of("import kaldi", scp);
  for (size_t i = 0; i < scp_lines.size(); ++i) {
    if (scp_lines[i].empty()) continue;
    const std::string where = detail::cat(scp, ":", i + 1);
    std::string id, path;
    CLUSTR_CHECK(split_first(scp_lines[i], id, path) && !path.empty(), "import kaldi: ", where,
                 ": expected '<id> <audio path>'");
    CLUSTR_CHECK(path.back() != '|', "import kaldi: ", where, ": '", path, "' is a command (it "
                 "ends in '|'); this importer reads audio files only: write the audio out first "
                 "(for example with the command itself) and list the files");
    const fs::path p = fs::path(path).is_absolute() ? fs::path(path) : fs::path(folder) / path;
    CLUSTR_CHECK(audio.emplace(id, std::make_pair(absolute_path_of(p), where)).second, "import kaldi: ",
                 where, ": utterance '", id, "' listed twice");
  }
  std::vector<CorpusUtterance> out;
  const std::vector<std::string> text_lines = lines_of("import kaldi", text);
  for (size_t i = 0; i < text_lines.size(); ++i) {
    if (text_lines[i].empty()) continue;
    CorpusUtterance u;
    u.where = detail::cat(text, ":", i + 1);
    CLUSTR_CHECK(split_first(text_lines[i], u.id, u.transcript) || !text_lines[i].empty(),
                 "import kaldi: ", u.where, ": expected '<id> <transcript>'");
    if (u.id.empty()) u.id = text_lines[i];
    auto it = audio.find(u.id);
    CLUSTR_CHECK(it != audio.end(), "import kaldi: ", u.where, ": utterance '", u.id,
                 "' has no line in ", scp);
    u.audio = it->second.first;
    u.seconds = -1;
    out.push_back(std::move(u));
  }
  return out;
}

std::vector<CorpusUtterance> import_nemo(const std::string& manifest) {
  const std::vector<std::string> lines = lines_of("import nemo", manifest);
  const fs::path base = fs::path(manifest).parent_path();
  std::vector<CorpusUtterance> out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \t") == std::string::npos) continue;
    CorpusUtterance u;
    u.where = detail::cat(manifest, ":", i + 1);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(lines[i]);
    } catch (const nlohmann::json::exception& e) {
      throw Error(detail::cat("import nemo: ", u.where, ": not a JSON object: ", e.what()));
    }
    CLUSTR_CHECK(j.is_object() && j.contains("audio_filepath") && j["audio_filepath"].is_string() &&
                     j.contains("text") && j["text"].is_string(),
                 "import nemo: ", u.where,
                 ": expected {\"audio_filepath\": \"...\", \"text\": \"...\", \"duration\": ...}");
    const fs::path p(j["audio_filepath"].get<std::string>());
    u.audio = absolute_path_of(p.is_absolute() ? p : base / p);
    u.transcript = j["text"].get<std::string>();
    u.seconds = -1;
    if (j.contains("duration")) {
      CLUSTR_CHECK(j["duration"].is_number() && j["duration"].get<double>() >= 0, "import nemo: ",
                   u.where, ": \"duration\" must be a number of seconds >= 0");
      u.seconds = j["duration"].get<double>();
    }
    u.id = j.contains("id") && j["id"].is_string() ? j["id"].get<std::string>()
                                                   : p.stem().string();
    out.push_back(std::move(u));
  }
  return out;
}

void probe_durations(std::vector<CorpusUtterance>& utterances) {
  for (CorpusUtterance& u : utterances) {
    if (u.seconds >= 0) continue;
    const AudioInfo info = probe_audio(u.audio);
    u.seconds = double(info.frames) / info.sample_rate;
  }
}

std::vector<std::string> char_labels(const std::string& transcript) {
  std::vector<std::string> labels;
  for (const std::string& w : transcript_words(transcript)) {
    if (!labels.empty()) labels.push_back("|");
    for (char c : w) labels.push_back(std::string(1, c));
  }
  return labels;
}

std::string word_sentence(const std::string& transcript) {
  std::string s;
  for (const std::string& w : transcript_words(transcript)) s += (s.empty() ? "" : " ") + w;
  return s;
}

ImportReport write_manifest(const std::vector<CorpusUtterance>& utterances, LabelUnits units,
                            const Lexicon* lexicon, const std::string& manifest,
                            const WordPieces* pieces) {
  CLUSTR_CHECK(units != LabelUnits::phones || lexicon,
               "import: phone labels need a pronunciation dictionary (--lexicon)");
  CLUSTR_CHECK(units != LabelUnits::pieces || pieces, "import: word-piece labels need a model");
  std::vector<std::string> tokens = {"<blank>"};
  if (units == LabelUnits::phones) {
    tokens.insert(tokens.end(), arpabet_phones().begin(), arpabet_phones().end());
  } else if (units == LabelUnits::pieces) {
    const std::vector<std::string> p = pieces->pieces();
    tokens.insert(tokens.end(), p.begin(), p.end());
  } else {
    for (char c = 'a'; c <= 'z'; ++c) tokens.push_back(std::string(1, c));
    for (char c = '0'; c <= '9'; ++c) tokens.push_back(std::string(1, c));
    tokens.push_back("'");
    tokens.push_back("|");
  }
  const std::set<std::string> known(tokens.begin() + 1, tokens.end());
  ImportReport report;
  std::vector<std::string> rows;
  for (const CorpusUtterance& u : utterances) {
    CLUSTR_CHECK(u.id.find_first_of(" \t") == std::string::npos && !u.id.empty(), "import: ",
                 u.where, ": the id '", u.id, "' is empty or holds whitespace");
    std::vector<std::string> labels;
    std::string problem;
    if (units == LabelUnits::phones) {
      for (const std::string& w : transcript_words(u.transcript)) {
        const std::vector<std::string>* phones = lexicon->find(w);
        if (!phones) {
          problem = detail::cat("word '", w, "' is not in the lexicon");
          break;
        }
        labels.insert(labels.end(), phones->begin(), phones->end());
      }
    } else if (units == LabelUnits::pieces) {
      try {
        labels = pieces->encode(word_sentence(u.transcript));
      } catch (const Error& e) {
        problem = e.what();
      }
    } else {
      labels = char_labels(u.transcript);
      for (const std::string& l : labels)
        if (!known.count(l)) {
          problem = detail::cat("character '", l, "' is not a letter, digit or apostrophe");
          break;
        }
    }
    if (problem.empty() && labels.empty()) problem = "the transcript has no words";
    if (!problem.empty()) {
      report.problems.push_back(detail::cat(u.where, ": utterance '", u.id, "': ", problem));
      continue;
    }
    std::string row = detail::cat(u.id, "\t", u.audio, "\t");
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.3f", u.seconds);
    row += secs;
    row += "\t";
    for (size_t i = 0; i < labels.size(); ++i) row += (i ? " " : "") + labels[i];
    rows.push_back(row);
  }
  const fs::path dir = fs::path(manifest).parent_path();
  // tokens.txt is shared by every manifest of its folder: an import of other units (or other
  // word pieces) must not replace the table the others were written with.
  const std::string tokens_path = (dir / "tokens.txt").string();
  std::error_code ec;
  const bool have_tokens = fs::exists(tokens_path, ec);
  if (have_tokens) {
    const std::vector<std::string> old = read_tokens(tokens_path).tokens;
    size_t i = 0;
    while (i < old.size() && i < tokens.size() && old[i] == tokens[i]) ++i;
    CLUSTR_CHECK(i == old.size() && i == tokens.size(), "import: ", tokens_path,
                 " holds another token table (", old.size(), " tokens against this import's ",
                 tokens.size(), "; line ", i + 1, ": '", i < old.size() ? old[i] : "(none)",
                 "' where this import has '", i < tokens.size() ? tokens[i] : "(none)",
                 "'): the manifests beside it use it; write this import to another folder, or "
                 "delete that tokens.txt if no manifest there needs it");
  }
  if (!dir.empty()) fs::create_directories(dir, ec);
  auto write = [](const std::string& path, const std::vector<std::string>& lines) {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      CLUSTR_CHECK(out.good(), "import: cannot write ", tmp);
      for (const std::string& l : lines) out << l << '\n';
      out.flush();
      CLUSTR_CHECK(out.good(), "import: cannot write ", tmp);
    }
    fs::rename(tmp, path);
  };
  write(manifest, rows);
  if (!have_tokens) write(tokens_path, tokens);
  report.written = int64_t(rows.size());
  return report;
}

}  // namespace clustr
