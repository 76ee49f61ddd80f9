// Speech manifests and token tables, as data/make_speech_corpus.py writes them.
//
// tokens.txt: one token per line; the first is the CTC blank "<blank>" (index 0), then the
// phones (index = line number - 1). Tokens are unique and contain no whitespace.
//
// A manifest (train.tsv, dev.tsv, test.tsv): one utterance per line, four tab-separated fields
//   id <TAB> wav path (relative to the manifest's directory, or absolute) <TAB> duration in
//   seconds <TAB> labels separated by single spaces
// e.g. "tr000017\twav/tr000017.wav\t3.415\tHH AH L OW". Empty lines are ignored; a trailing
// carriage return is removed.
//
// Configuration errors (a missing or unreadable file, a bad tokens file) always throw. A bad
// utterance line (wrong number of fields, empty or duplicate id, a duration that is not a
// positive number, an empty transcript, a label that is not a token or is the blank, a missing
// wav file) either throws (BadLines::fail) or is skipped and counted (BadLines::skip); either
// way the message names the file and the line number.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace clustr {

struct TokenTable {
  std::vector<std::string> tokens;                 // index -> token; tokens[0] = "<blank>"
  std::unordered_map<std::string, int32_t> index;  // token -> index
  int32_t blank() const { return 0; }
  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  // The index of `token`, or -1.
  int32_t find(const std::string& token) const;
};

constexpr const char* kBlankToken = "<blank>";

// Reads tokens.txt; throws on a missing file, an empty table, a first token other than
// "<blank>", a duplicate, an empty line or whitespace inside a token (file and line named).
TokenTable read_tokens(const std::string& path);

struct Utterance {
  std::string id;
  std::string wav_path;         // resolved: relative paths are joined to the manifest's dir
  double duration = 0;          // seconds, as the manifest says
  std::vector<int32_t> labels;  // token indices, never the blank, at least one
  int64_t line = 0;             // 1-based line in the manifest
};

struct Manifest {
  std::string path;
  std::vector<Utterance> utterances;  // the good lines, in file order
  int64_t skipped = 0;                // bad lines skipped (BadLines::skip)
  std::vector<std::string> problems;  // "file:line: what" for each skipped line
  double total_seconds = 0;           // sum of the good utterances' durations
  // One line: "train.tsv: 1000 utterances, 3412.5 s, 2 bad lines skipped".
  std::string summary() const;
};

enum class BadLines { fail, skip };

struct ManifestOptions {
  BadLines bad_lines = BadLines::fail;
  bool check_files = true;  // a wav path that does not exist is a bad line
};

Manifest read_manifest(const std::string& path, const TokenTable& tokens,
                       const ManifestOptions& options = {});

}  // namespace clustr
