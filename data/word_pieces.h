// Word pieces for corpora transcribed in words (SentencePiece's unigram model, Kudo 2018), and
// the words that label sequences spell, for a word error rate.
//
// A corpus without a pronunciation dictionary can be labelled letter by letter (characters,
// data/corpus_import.h) or in word pieces: a vocabulary of frequent words and word fragments
// learnt from the training transcripts, so that a label sequence is shorter than its letters and
// each label carries more of a word. The transcripts are normalised first (transcript_words: lower
// case, letters, digits and apostrophes), so the model needs no normaliser of its own. A piece
// that begins a word starts with "▁" (U+2581), as SentencePiece writes it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/manifest.h"
#include "layers/error_rate.h"

namespace clustr {

struct WordPieceOptions {
  // SentencePiece's normaliser: "identity" for text normalised already (transcript_words), or
  // "nmt_nfkc_cf" (Unicode NFKC, then case folding) for raw text.
  std::string normalization = "identity";
  // Pieces that text never produces, with ids 1, 2, ... in this order (after the unknown piece,
  // id 0): a model's special pieces such as [PAD] [CLS] [SEP] [MASK].
  std::vector<std::string> control_symbols;
  // The fraction of the characters that single-character pieces must cover (1: every one; raw
  // text with rare symbols: 0.9995, the rest becoming the unknown piece).
  double character_coverage = 1.0;
};

class WordPieces {
 public:
  // Learns `vocab_size` pieces (the unknown piece and the control symbols included) from
  // `sentences` (words separated by single spaces), on one thread so that the model depends on
  // the sentences alone. Throws with SentencePiece's reason where it cannot (e.g. a vocabulary
  // larger than the text allows).
  static WordPieces train(const std::vector<std::string>& sentences, int vocab_size,
                          const WordPieceOptions& options = {});
  // Reads a model that save() wrote (or any SentencePiece model); throws naming the file.
  static WordPieces load(const std::string& path);
  // Writes the model to `path` (through a temporary file and a rename), making its folder.
  void save(const std::string& path) const;

  // The pieces of the vocabulary in the model's order, without the unknown piece.
  std::vector<std::string> pieces() const;
  // The pieces of `sentence`. A stretch of characters that no piece covers makes it throw
  // naming them (e.g. a letter that the training transcripts never used).
  std::vector<std::string> encode(const std::string& sentence) const;

  // The ids of a text's pieces, a stretch that no piece covers as the unknown piece (id 0).
  std::vector<int32_t> encode_ids(const std::string& text) const;
  // The text of ids (a piece's "▁" becoming a space between words); control pieces are left out.
  std::string decode(const std::vector<int32_t>& ids) const;
  int32_t size() const;                        // pieces, the unknown and control ones included
  int32_t id(const std::string& piece) const;  // -1 when absent
  std::string piece(int32_t id) const;         // throws outside [0, size())

  WordPieces(WordPieces&&) noexcept;
  WordPieces& operator=(WordPieces&&) noexcept;
  ~WordPieces();

 private:
  WordPieces();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether a token table's labels spell words: characters with "|" between words, or word pieces
// (a piece that starts with "▁" starts a word). Phones do not.
bool labels_spell_words(const TokenTable& tokens);

// The words that `labels` spell (labels_spell_words(tokens) must hold).
std::vector<std::string> label_words(const TokenTable& tokens, const std::vector<int32_t>& labels);

// The word error rate of `hypotheses` against `references`, both label sequences of `tokens`:
// each side's labels joined into words (label_words), the words compared as wholes.
ErrorRate word_errors(const TokenTable& tokens, const std::vector<LabelSequence>& references,
                      const std::vector<LabelSequence>& hypotheses);

}  // namespace clustr
