// BERT's WordPiece tokenizer (Devlin et al. 2019; Wu et al. 2016), id for id as Hugging Face's
// tokenizers 0.22.1 encodes with a BERT tokenizer.json (BertNormalizer, BertPreTokenizer,
// WordPiece, the [CLS] A [SEP] B [SEP] template). tests/test_bert_tokenizer.cpp checks it against that
// reference on a fixture of a few thousand lines in many scripts.
//
// Legend: a piece is one line of vocab.txt, its id the line's index from 0; a continuation
// piece starts with "##" and may only follow another piece of the same word; a character is a
// Unicode code point; "Unicode 8.0" means the character classes of the Rust crate
// unicode_categories 0.1.1 that the reference uses (see is_control etc. in the .cpp).
//
// text -> ids, in order:
//   0. Special pieces written literally in the text ("[CLS]", "[SEP]", "[PAD]", "[UNK]",
//      "[MASK]", case-sensitive) become their ids; the text between them goes through 1-6.
//   1. clean: drop U+0000, U+FFFD and control characters (categories Cc, Cf, Co of Unicode 8.0,
//      except \t \n \r); every other White_Space character (\t \n \r, U+00A0, U+2028, U+3000,
//      ...) becomes ' '.
//   2. CJK: a space before and after each CJK ideograph (the reference's ranges, which leave
//      out U+2B820-2B91F).
//   3. accents (lower_case only): NFD, then drop non-spacing marks (Mn of Unicode 8.0).
//   4. lower case (lower_case only): each character's full lower case on its own, without
//      context ("Σ" -> "σ" even at a word's end).
//   5. words: split at White_Space (dropped); each punctuation character (ASCII !"#$%&'()*+,-./
//      :;<=>?@[\]^_`{|}~ or category P* of Unicode 8.0) becomes a word of its own.
//   6. WordPiece per word: a word of more than 100 characters is [UNK]; otherwise the longest
//      piece that starts the word, then the longest "##" piece that continues it, and so on;
//      if some position has no piece the whole word is [UNK].
// Step 0 is Hugging Face's "added tokens" (BERT's never_split): its specials match the raw text.
//
// Text must be valid UTF-8; anything else throws naming the byte offset, so that a file with
// bad bytes is not silently read as [UNK]s. Errors are clustr::Error (core/error.h). A loaded
// tokenizer is never modified: several threads may encode with it at once.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace clustr {

// The model's input for one text or a pair: [CLS] A [SEP] (B [SEP]).
struct BertEncoding {
  std::vector<int32_t> ids;       // (L) piece ids, L <= max_length
  std::vector<int32_t> type_ids;  // (L) 0 for [CLS] A [SEP], 1 for B [SEP]
};

// The byte offset of the first ill-formed UTF-8 sequence of `text` (stray, cut short, overlong,
// a surrogate or past U+10FFFF), or -1 when it is valid UTF-8.
int64_t utf8_error_offset(const std::string& text);

// [CLS] a [SEP], or [CLS] a [SEP] b [SEP] when b is not null, from the texts' ids, cut to
// max_length ids in all as BertTokenizer::encode(a, b, max_length) says; any vocabulary's
// [CLS] and [SEP] ids. check_room throws when max_length leaves no room for the special pieces.
void check_room(int max_length, bool pair);
BertEncoding bert_inputs(std::vector<int32_t> a, const std::vector<int32_t>* b, int max_length,
                         int32_t cls, int32_t sep);

class BertTokenizer {
 public:
  // Reads vocab.txt: one piece per line (a final newline and "\r" line ends allowed), id = line
  // index. Throws naming the file for: a file that cannot be read, no pieces, an empty line, a
  // line that is not UTF-8, a piece on two lines (both line numbers), a missing [PAD] [UNK]
  // [CLS] or [SEP]. [MASK] may be missing (a vocabulary for embedding only): mask_id() is -1.
  // lower_case: run steps 3 and 4 (uncased models such as bert-base-uncased, all-MiniLM-L6-v2);
  // false for cased models, which neither lower-case nor strip accents.
  static BertTokenizer load(const std::string& vocab_path, bool lower_case = true);
  // The same checks on pieces given in memory (id = index); `source` names them in messages.
  explicit BertTokenizer(std::vector<std::string> pieces, bool lower_case = true,
                         const std::string& source = "vocabulary");

  // The text after steps 1-4 (without step 0), as UTF-8.
  std::string normalize(const std::string& text) const;
  // The pieces of a text: steps 0-6, no [CLS]/[SEP].
  std::vector<std::string> tokenize(const std::string& text) const;
  // The ids of tokenize(text).
  std::vector<int32_t> encode(const std::string& text) const;
  // [CLS] a [SEP], or [CLS] a [SEP] b [SEP] when b is not null, cut to max_length ids in all.
  // Longest first, as the reference: with M = max_length - 2 (one text) or - 3 (a pair), a
  // text keeps its first M ids; of a pair whose lengths add up to more than M, the shorter one
  // (length s) stays whole when 2s <= M and the longer keeps M - s, otherwise the two keep
  // M / 2 each and the longer one (the second on a tie) one more when M is odd. Throws when
  // max_length leaves no room for the special pieces.
  BertEncoding encode(const std::string& a, const std::string* b, int max_length) const;

  // The piece of an id (throws outside [0, size())), the id of a piece (-1 if absent).
  const std::string& piece(int32_t id) const;
  int32_t id(const std::string& piece) const;
  int32_t size() const { return static_cast<int32_t>(pieces_.size()); }
  bool lower_case() const { return lower_case_; }

  int32_t pad_id() const { return pad_; }
  int32_t unk_id() const { return unk_; }
  int32_t cls_id() const { return cls_; }
  int32_t sep_id() const { return sep_; }
  int32_t mask_id() const { return mask_; }  // -1 when the vocabulary has no [MASK]

 private:
  // Appends the ids of `text`'s characters [begin, end) (steps 1-6) to `out`.
  void encode_plain(const std::u32string& text, size_t begin, size_t end,
                    std::vector<int32_t>& out) const;
  // Appends the ids of one word (step 6) to `out`.
  void word_pieces(const std::u32string& word, std::vector<int32_t>& out) const;

  std::vector<std::string> pieces_;
  std::unordered_map<std::string, int32_t> ids_;
  size_t longest_piece_ = 0;  // in bytes, to skip substrings that no piece can match
  bool lower_case_ = true;
  int32_t pad_ = -1, unk_ = -1, cls_ = -1, sep_ = -1, mask_ = -1;
};

}  // namespace clustr
