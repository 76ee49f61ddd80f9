// BERT's WordPiece tokenizer; data/bert_tokenizer.h gives the steps 0-6 that the comments cite.
//
// Unicode comes from ICU (categories, White_Space, NFD, lower case). The reference takes three
// character classes from the Rust crate unicode_categories 0.1.1, whose tables are Unicode 8.0:
// control (Cc Cf Co), punctuation (P*) and non-spacing mark (Mn). ICU 72 knows Unicode 15.0, so
// these classes count a character only if it was assigned by Unicode 8.0 (ICU's age), and the
// few characters whose category changed from 8.0 to 15.0 are listed by hand (found by comparing
// the crate's tables with ICU's categories code point by code point). For the rest (NFD,
// White_Space, lower case) the reference uses newer tables, and it agreed with ICU 72 on every
// code point when this was written ("a<c>b" and "A<c>" for all 1.1M of them).
#include "data/bert_tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "core/error.h"

namespace clustr {
namespace {

constexpr size_t kMaxWordChars = 100;          // step 6: longer words are [UNK]
constexpr size_t kMaxTextChars = size_t(1) << 26;  // ICU strings index with int32_t

// Whether ICU dates `c` to Unicode 8.0 or before (unassigned characters have age 0.0).
bool in_unicode8(UChar32 c) {
  UVersionInfo age;
  u_charAge(c, age);
  return age[0] < 8 || (age[0] == 8 && age[1] == 0 && age[2] == 0);
}

// Step 1: Cc, Cf or Co in Unicode 8.0 (no category of these changed since), except \t \n \r.
bool is_control(UChar32 c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  const int8_t type = u_charType(c);
  return (type == U_CONTROL_CHAR || type == U_FORMAT_CHAR || type == U_PRIVATE_USE_CHAR) &&
         in_unicode8(c);
}

// White_Space: \t \n \v \f \r, ' ', U+0085, U+00A0, U+1680, U+2000-200A, U+2028, U+2029,
// U+202F, U+205F, U+3000. \v \f and U+0085 are Cc, so step 1 drops them before mapping.
bool is_whitespace(UChar32 c) { return u_isUWhiteSpace(c); }

// Step 2: the reference's CJK ranges (Google's BERT had U+2B820 where it has U+2B920).
bool is_cjk(UChar32 c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// Step 5: ASCII punctuation (symbols such as $ + < = > ^ ` | ~ included) or P* of Unicode 8.0.
// U+111C9 SHARADA SANDHI MARK (Po, now Mn) and U+166D CANADIAN SYLLABICS CHI SIGN (Po, now So)
// were punctuation then.
bool is_punctuation(UChar32 c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
      (c >= 123 && c <= 126))
    return true;
  if (c == 0x111C9 || c == 0x166D) return true;
  return (U_GET_GC_MASK(c) & U_GC_P_MASK) != 0 && in_unicode8(c);
}

// Step 3: Mn of Unicode 8.0. U+1734 HANUNOO SIGN PAMUDPOD was Mn (now Mc); U+111C9 (then Po),
// U+1885 and U+1886 MONGOLIAN LETTER ALI GALI BALUDA (then Lo) and U+A9BD JAVANESE CONSONANT
// SIGN KERET (then Mc) were not.
bool is_nonspacing_mark(UChar32 c) {
  if (c == 0x1734) return true;
  if (c == 0x111C9 || c == 0x1885 || c == 0x1886 || c == 0xA9BD) return false;
  return u_charType(c) == U_NON_SPACING_MARK && in_unicode8(c);
}

// Step 4: the full lower case of one character on its own, so with no context (final sigma).
void append_lower(UChar32 c, std::u32string& out) {
  if (c < 0x80) {
    out += static_cast<char32_t>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  UChar in[2], lower[16];
  int32_t n = 0;
  U16_APPEND_UNSAFE(in, n, c);
  UErrorCode status = U_ZERO_ERROR;
  const int32_t m = u_strToLower(lower, 16, in, n, "", &status);
  CLUSTR_CHECK(U_SUCCESS(status), "BertTokenizer: ICU cannot lower-case code point ", c, ": ",
               u_errorName(status));
  for (int32_t i = 0; i < m;) {
    UChar32 d;
    U16_NEXT(lower, i, m, d);
    out += static_cast<char32_t>(d);
  }
}

// Decodes `s` into `chars` (when not null). Returns the byte offset of the first ill-formed
// sequence (stray, cut short, overlong, a surrogate or past U+10FFFF), or -1 when there is none.
int64_t decode_utf8(const std::string& s, std::u32string* chars) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(s.data());
  const int64_t n = static_cast<int64_t>(s.size());
  for (int64_t i = 0; i < n;) {
    const int64_t at = i;
    UChar32 c = bytes[i++];
    if (c >= 0x80) {
      // U8_NEXT reads at most 4 bytes; give it a window so that the index fits in int32_t.
      const int32_t window = static_cast<int32_t>(std::min<int64_t>(n - at, 4));
      int32_t k = 0;
      U8_NEXT(bytes + at, k, window, c);
      if (c < 0) return at;
      i = at + k;
    }
    if (chars) *chars += static_cast<char32_t>(c);
  }
  return -1;
}

std::u32string decode(const std::string& text, const char* what) {
  std::u32string chars;
  chars.reserve(text.size());
  const int64_t bad = decode_utf8(text, &chars);
  if (bad >= 0) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(text[size_t(bad)]));
    throw Error(detail::cat(what, ": the text is not valid UTF-8 at byte ", bad, " (", hex,
                            "): a stray, cut-short, overlong or surrogate sequence"));
  }
  return chars;
}

void append_utf8(std::string& out, char32_t c) {
  uint8_t buf[4];
  int32_t n = 0;
  U8_APPEND_UNSAFE(buf, n, static_cast<UChar32>(c));
  out.append(reinterpret_cast<const char*>(buf), size_t(n));
}

// Steps 1-4 on text[begin, end).
std::u32string normalize_chars(const std::u32string& text, size_t begin, size_t end,
                               bool lower_case) {
  CLUSTR_CHECK(end - begin <= kMaxTextChars, "BertTokenizer: a text of ", end - begin,
               " characters between special pieces; at most ", kMaxTextChars, " are handled");
  std::u32string out;
  out.reserve(end - begin);
  for (size_t i = begin; i < end; ++i) {
    const UChar32 c = static_cast<UChar32>(text[i]);
    if (c == 0 || c == 0xFFFD || is_control(c)) continue;
    if (is_whitespace(c)) {
      out += U' ';
    } else if (is_cjk(c)) {
      out += U' ';
      out += char32_t(c);
      out += U' ';
    } else {
      out += char32_t(c);
    }
  }
  if (!lower_case) return out;

  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(status);
  icu::UnicodeString decomposed;
  if (U_SUCCESS(status)) {
    const icu::UnicodeString s = icu::UnicodeString::fromUTF32(
        reinterpret_cast<const UChar32*>(out.data()), static_cast<int32_t>(out.size()));
    decomposed = nfd->normalize(s, status);
  }
  CLUSTR_CHECK(U_SUCCESS(status), "BertTokenizer: ICU's NFD failed: ", u_errorName(status));
  out.clear();
  for (int32_t i = 0; i < decomposed.length();) {
    const UChar32 c = decomposed.char32At(i);
    i += U16_LENGTH(c);
    if (!is_nonspacing_mark(c)) append_lower(c, out);
  }
  return out;
}

const char* const kSpecials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};

}  // namespace

BertTokenizer BertTokenizer::load(const std::string& vocab_path, bool lower_case) {
  std::error_code ec;
  CLUSTR_CHECK(!std::filesystem::is_directory(vocab_path, ec), "BertTokenizer::load: '",
               vocab_path, "' is a folder; expected the path of a vocab.txt file");
  std::ifstream in(vocab_path, std::ios::binary);
  CLUSTR_CHECK(in.good(), "BertTokenizer::load: cannot open the vocabulary '", vocab_path,
               "': ", std::strerror(errno));
  const std::string all{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  CLUSTR_CHECK(!in.bad(), "BertTokenizer::load: read error in '", vocab_path, "'");

  std::vector<std::string> pieces;
  for (size_t start = 0; start < all.size();) {
    size_t stop = all.find('\n', start);
    if (stop == std::string::npos) stop = all.size();
    std::string line = all.substr(start, stop - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    pieces.push_back(std::move(line));
    start = stop + 1;
  }
  return BertTokenizer(std::move(pieces), lower_case, "'" + vocab_path + "'");
}

BertTokenizer::BertTokenizer(std::vector<std::string> pieces, bool lower_case,
                             const std::string& source)
    : pieces_(std::move(pieces)), lower_case_(lower_case) {
  CLUSTR_CHECK(!pieces_.empty(), "BertTokenizer: the vocabulary ", source,
               " has no pieces; expected one piece per line (vocab.txt)");
  CLUSTR_CHECK(pieces_.size() < size_t(INT32_MAX), "BertTokenizer: the vocabulary ", source,
               " has ", pieces_.size(), " pieces, more than int32 ids can number");
  ids_.reserve(pieces_.size());
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const std::string& p = pieces_[i];
    CLUSTR_CHECK(!p.empty(), "BertTokenizer: line ", i + 1, " (id ", i, ") of the vocabulary ",
                 source, " is empty; every line must hold one piece");
    const int64_t bad = decode_utf8(p, nullptr);
    CLUSTR_CHECK(bad < 0, "BertTokenizer: line ", i + 1, " (id ", i, ") of the vocabulary ",
                 source, " is not valid UTF-8 at byte ", bad, " of the line");
    const auto [it, added] = ids_.emplace(p, static_cast<int32_t>(i));
    CLUSTR_CHECK(added, "BertTokenizer: the piece '", p, "' is on line ", it->second + 1,
                 " (id ", it->second, ") and again on line ", i + 1, " (id ", i,
                 ") of the vocabulary ", source, "; each piece must appear once");
    longest_piece_ = std::max(longest_piece_, p.size());
  }
  int32_t* const special_ids[] = {&pad_, &unk_, &cls_, &sep_, &mask_};
  for (size_t k = 0; k < 5; ++k) {
    *special_ids[k] = id(kSpecials[k]);
    CLUSTR_CHECK(*special_ids[k] >= 0 || special_ids[k] == &mask_,
                 "BertTokenizer: the vocabulary ", source, " has no piece ", kSpecials[k],
                 ", which BERT needs (only [MASK] may be missing)");
  }
}

std::string BertTokenizer::normalize(const std::string& text) const {
  const std::u32string chars = decode(text, "BertTokenizer::normalize");
  std::string out;
  for (char32_t c : normalize_chars(chars, 0, chars.size(), lower_case_)) append_utf8(out, c);
  return out;
}

std::vector<int32_t> BertTokenizer::encode(const std::string& text) const {
  const std::u32string chars = decode(text, "BertTokenizer::encode");
  std::vector<int32_t> out;
  size_t plain = 0;  // start of the characters not yet encoded
  for (size_t i = 0; i < chars.size(); ++i) {
    if (chars[i] != U'[') continue;
    for (const int32_t special : {pad_, unk_, cls_, sep_, mask_}) {
      if (special < 0) continue;
      const std::string& p = pieces_[size_t(special)];
      if (chars.size() - i < p.size() || !std::equal(p.begin(), p.end(), chars.begin() + long(i)))
        continue;
      encode_plain(chars, plain, i, out);  // step 0
      out.push_back(special);
      i += p.size() - 1;
      plain = i + 1;
      break;
    }
  }
  encode_plain(chars, plain, chars.size(), out);
  return out;
}

std::vector<std::string> BertTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> out;
  for (const int32_t i : encode(text)) out.push_back(pieces_[size_t(i)]);
  return out;
}

void BertTokenizer::encode_plain(const std::u32string& text, size_t begin, size_t end,
                                 std::vector<int32_t>& out) const {
  if (begin >= end) return;
  const std::u32string normalized = normalize_chars(text, begin, end, lower_case_);
  std::u32string word;  // step 5
  for (const char32_t c : normalized) {
    const bool space = is_whitespace(UChar32(c)), punct = !space && is_punctuation(UChar32(c));
    if (!space && !punct) {
      word += c;
      continue;
    }
    if (!word.empty()) word_pieces(word, out);
    word.clear();
    if (punct) word_pieces(std::u32string(1, c), out);
  }
  if (!word.empty()) word_pieces(word, out);
}

void BertTokenizer::word_pieces(const std::u32string& word, std::vector<int32_t>& out) const {
  if (word.size() > kMaxWordChars) {
    out.push_back(unk_);
    return;
  }
  std::string bytes;
  std::vector<size_t> at;  // at[k]: byte offset of character k; at[n] = bytes.size()
  for (const char32_t c : word) {
    at.push_back(bytes.size());
    append_utf8(bytes, c);
  }
  at.push_back(bytes.size());

  const size_t n = word.size(), first = out.size();
  std::string key;
  for (size_t start = 0; start < n;) {
    const char* const prefix = start > 0 ? "##" : "";
    size_t stop = start;  // the longest piece is characters [start, stop)
    for (size_t e = n; e > start && stop == start; --e) {
      const size_t len = at[e] - at[start];
      if (len + std::strlen(prefix) > longest_piece_) continue;
      key.assign(prefix).append(bytes, at[start], len);
      const auto it = ids_.find(key);
      if (it == ids_.end()) continue;
      out.push_back(it->second);
      stop = e;
    }
    if (stop == start) {  // no piece continues the word here: the whole word is unknown
      out.resize(first);
      out.push_back(unk_);
      return;
    }
    start = stop;
  }
}

BertEncoding BertTokenizer::encode(const std::string& a, const std::string* b,
                                   int max_length) const {
  check_room(max_length, b != nullptr);
  std::vector<int32_t> ib;
  if (b) ib = encode(*b);
  return bert_inputs(encode(a), b ? &ib : nullptr, max_length, cls_, sep_);
}

void check_room(int max_length, bool pair) {
  const int specials = pair ? 3 : 2;
  CLUSTR_CHECK(max_length >= specials, "encode: max_length ", max_length,
               " leaves no room for the ", specials, " special pieces of ",
               pair ? "[CLS] a [SEP] b [SEP]" : "[CLS] a [SEP]", "; expected at least ", specials);
}

BertEncoding bert_inputs(std::vector<int32_t> ia, const std::vector<int32_t>* b, int max_length,
                         int32_t cls, int32_t sep) {
  check_room(max_length, b != nullptr);
  std::vector<int32_t> ib = b ? *b : std::vector<int32_t>{};
  const size_t budget = size_t(max_length - (b ? 3 : 2));
  if (ia.size() + ib.size() > budget) {
    size_t keep_a = budget, keep_b = 0;
    if (b) {
      const size_t shorter = std::min(ia.size(), ib.size());
      const size_t keep_short = 2 * shorter <= budget ? shorter : budget / 2;
      const size_t keep_long = budget - keep_short;
      const bool a_longer = ia.size() > ib.size();  // a tie gives b the odd extra
      keep_a = a_longer ? keep_long : keep_short;
      keep_b = a_longer ? keep_short : keep_long;
    }
    ia.resize(std::min(ia.size(), keep_a));
    ib.resize(std::min(ib.size(), keep_b));
  }

  BertEncoding e;
  e.ids.push_back(cls);
  e.ids.insert(e.ids.end(), ia.begin(), ia.end());
  e.ids.push_back(sep);
  e.type_ids.assign(e.ids.size(), 0);
  if (b) {
    e.ids.insert(e.ids.end(), ib.begin(), ib.end());
    e.ids.push_back(sep);
    e.type_ids.resize(e.ids.size(), 1);
  }
  return e;
}

const std::string& BertTokenizer::piece(int32_t id) const {
  CLUSTR_CHECK(id >= 0 && id < size(), "BertTokenizer::piece: id ", id,
               " is outside the vocabulary's [0, ", size(), ")");
  return pieces_[size_t(id)];
}

int32_t BertTokenizer::id(const std::string& piece) const {
  const auto it = ids_.find(piece);
  return it == ids_.end() ? -1 : it->second;
}

int64_t utf8_error_offset(const std::string& text) { return decode_utf8(text, nullptr); }

}  // namespace clustr
