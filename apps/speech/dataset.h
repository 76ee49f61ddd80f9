// Loading a speech manifest into memory for training or evaluation: the manifest's good lines
// (data/manifest.h), their filterbank features through the on-disk cache (data/fbank.h),
// normalised per utterance and stacked (data/speech_batch.h).
//
// Bad utterances are skipped and counted, never fatal: a bad manifest line (wrong field count,
// unknown label, empty transcript, missing file; named by file and line), audio that cannot be
// read (a truncated or non-WAV file, a wrong sample rate or channel count; the reader's message
// names the file), and an utterance with too few frames for its labels once stacked (CTC could
// not align it). Configuration errors (a missing manifest or tokens file) throw.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "data/fbank.h"
#include "data/manifest.h"
#include "data/speech_batch.h"

namespace clustr::speech {

struct SpeechSet {
  std::string manifest;
  std::vector<SpeechExample> examples;
  std::vector<int64_t> lines;  // manifest line of each example
  std::vector<std::string> audio;  // audio file of each example
  int64_t bad_lines = 0;       // skipped while reading the manifest
  int64_t bad_audio = 0;       // skipped: the WAV could not be read
  int64_t too_short = 0;       // skipped: fewer stacked frames than CTC needs
  std::vector<std::string> problems;  // "file:line: what" of every skipped utterance
  double seconds = 0;                 // audio of the kept utterances (10 ms per frame)
  int64_t skipped() const { return bad_lines + bad_audio + too_short; }
  // "dev.tsv: 30 utterances, 180.2 s; skipped 2 (1 bad line, 1 unreadable audio, 0 too short)"
  std::string summary() const;
};

// Reads `manifest` (labels checked against `tokens`), the features of its first `max_utts`
// good utterances (0: all) through `cache` (in parallel), normalises and stacks them by
// `stacking`. `log` (may be null) receives the summary and the first few problems.
SpeechSet load_speech_set(const std::string& manifest, const TokenTable& tokens,
                          FeatureCache& cache, int stacking, int64_t max_utts, std::FILE* log);

// Joins a token table's names: labels {5, 9} -> "AH B".
std::string label_string(const TokenTable& tokens, const std::vector<int32_t>& labels);

}  // namespace clustr::speech
