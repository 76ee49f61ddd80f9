// The tokenizer of a model folder, of either kind that the text app's models use:
//   - BERT's WordPiece vocabulary (vocab.txt, lower-casing as tokenizer_config.json's
//     do_lower_case says): the pretrained models that data/prepare_pretrained.py writes;
//   - a SentencePiece unigram model (pieces.model) with the special pieces [PAD] [CLS] [SEP]
//     [MASK] as control pieces: the models that `text pretrain` learns from text.
// Both give the same inputs to the model: [CLS] a [SEP] (b [SEP]) with BERT's truncation
// (bert_inputs), so embedding, fine-tuning and evaluation do not depend on the kind.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/bert_tokenizer.h"
#include "data/word_pieces.h"

namespace clustr::text {

// A JSON file of a model folder, parsed; throws naming the file when it cannot be read or is
// not JSON.
nlohmann::json read_json_file(const std::string& path);
// j[key] as a bool (`fallback` when j has no such key); throws naming the file and the key when
// it is not true or false.
bool json_bool(const nlohmann::json& j, const char* key, bool fallback, const std::string& path);

// The special pieces of a SentencePiece model that `text pretrain` learns, in id order after
// the unknown piece (ids 1 to 4).
inline const std::vector<std::string> kSpecialPieces = {"[PAD]", "[CLS]", "[SEP]", "[MASK]"};

class TextTokenizer {
 public:
  // The folder's vocab.txt, or else its pieces.model; throws naming the folder when it has
  // neither, and naming the file when it is malformed or lacks a special piece.
  static TextTokenizer load(const std::string& dir);
  explicit TextTokenizer(BertTokenizer tokenizer);
  // `pieces` must hold the kSpecialPieces; `source` names it in messages.
  TextTokenizer(WordPieces pieces, const std::string& source);

  // The ids of a text's pieces, no special pieces.
  std::vector<int32_t> encode(const std::string& text) const;
  // [CLS] a [SEP] (b [SEP]) cut to max_length ids (bert_inputs).
  BertEncoding encode(const std::string& a, const std::string* b, int max_length) const;
  // The text of ids[first..last]: WordPiece's "##" pieces glued to the piece before, or
  // SentencePiece's pieces decoded.
  std::string text(const std::vector<int32_t>& ids, int64_t first, int64_t last) const;

  int32_t size() const;
  int32_t pad_id() const { return pad_; }
  int32_t cls_id() const { return cls_; }
  int32_t sep_id() const { return sep_; }
  int32_t mask_id() const { return mask_; }  // -1 when the vocabulary has none
  const char* kind() const { return bert_ ? "WordPiece" : "SentencePiece"; }
  // The WordPiece tokenizer, or null for a SentencePiece one.
  const BertTokenizer* bert() const { return bert_.get(); }

 private:
  std::shared_ptr<const BertTokenizer> bert_;
  std::shared_ptr<const WordPieces> pieces_;
  int32_t pad_ = -1, cls_ = -1, sep_ = -1, mask_ = -1;
};

}  // namespace clustr::text
