// Importers for the layouts real speech corpora come in, to the speech app's manifest
// (data/manifest.h: id, audio path, seconds, labels):
//   - a LibriSpeech-style folder: <speaker>/<chapter>/<speaker>-<chapter>.trans.txt, each line
//     "<id> <TRANSCRIPT>", the audio <id>.flac (or .wav) beside it;
//   - a Kaldi data folder: wav.scp ("<id> <path>"; a command ending in '|' is refused, since
//     nothing here runs commands), text ("<id> <transcript>"), utt2spk when present;
//   - a NeMo manifest: JSON lines {"audio_filepath": ..., "duration": ..., "text": ...}.
// Transcripts in words become labels through a pronunciation dictionary (phones, data/lexicon.h),
// letter by letter (characters: a-z, ', and "|" between words), or in word pieces learnt from
// the training transcripts (data/word_pieces.h), so a corpus without a lexicon can be used too.
// Durations come from the audio files' headers (libsndfile), or from the NeMo manifest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/lexicon.h"
#include "data/word_pieces.h"

namespace clustr {

// One utterance as a corpus lists it.
struct CorpusUtterance {
  std::string id;
  std::string audio;       // absolute path
  double seconds = 0;      // < 0: not known yet (probe_durations fills it)
  std::string transcript;  // words
  std::string where;       // "file:line" of the entry, for messages
};

std::vector<CorpusUtterance> import_librispeech(const std::string& folder);
std::vector<CorpusUtterance> import_kaldi(const std::string& folder);
std::vector<CorpusUtterance> import_nemo(const std::string& manifest);

// Fills every unknown duration from the audio file's header; throws naming the file of one that
// cannot be read.
void probe_durations(std::vector<CorpusUtterance>& utterances);

enum class LabelUnits { phones, chars, pieces };

struct ImportReport {
  int64_t written = 0;
  std::vector<std::string> problems;  // "file:line: utterance 'id': word 'xyz' is not in the
                                      // lexicon", one per utterance left out
};

// Writes `manifest` (the app's TSV, audio paths absolute) and, beside it, tokens.txt (the blank,
// then the units: the 39 phones, the characters, or the word pieces), leaving out the utterances
// with a word the lexicon lacks, with characters no word piece covers (listed in the report) or
// with no labels. `lexicon` is needed for phones, `pieces` for word pieces. tokens.txt is shared
// by the manifests of its folder: one that is there already is kept, and must hold the same
// table (else this throws before writing anything).
ImportReport write_manifest(const std::vector<CorpusUtterance>& utterances, LabelUnits units,
                            const Lexicon* lexicon, const std::string& manifest,
                            const WordPieces* pieces = nullptr);

// A transcript's words (transcript_words) joined by single spaces: what word pieces are learnt
// from and applied to.
std::string word_sentence(const std::string& transcript);

// The labels of a transcript as characters: its words' letters, digits and apostrophes, with
// "|" between words.
std::vector<std::string> char_labels(const std::string& transcript);

}  // namespace clustr
