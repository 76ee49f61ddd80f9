// WordNet's data files and exception lists, and the lemma matcher (data/wordnet.h gives the
// formats and the rules that the comments here cite).
#include "data/wordnet.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "core/error.h"

namespace clustr {
namespace {

namespace fs = std::filesystem;

const char* const kInstall = "install WordNet with `apt-get install wordnet-base`";

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
char lower(char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; }
std::string lower(std::string s) {
  for (char& c : s) c = lower(c);
  return s;
}
// A word character: an ASCII letter or digit, or any byte of a non-ASCII character.
bool word_byte(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return u >= 0x80 || is_digit(c) || (lower(c) >= 'a' && lower(c) <= 'z');
}
bool is_vowel(char c) { return std::string("aeiou").find(c) != std::string::npos; }

std::string trim(const std::string& s, const char* cut = " \t") {
  const std::string c = cut;
  size_t b = 0, e = s.size();
  while (b < e && c.find(s[b]) != std::string::npos) ++b;
  while (e > b && c.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

size_t after_spaces(const std::string& s, size_t at) {
  while (at < s.size() && s[at] == ' ') ++at;
  return at;
}

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

std::string underscores_to_spaces(std::string s) {
  std::replace(s.begin(), s.end(), '_', ' ');
  return s;
}

// The space-separated fields of one line, taken in order; running out or a bad field throws
// "wordnet: <where>: expected <what>[ of <group> i of n], got ...". The message is only
// formatted on failure: a line has hundreds of fields.
class Fields {
 public:
  Fields(std::string_view text, const std::string& where) : where_(where) {
    for (size_t i = 0; i < text.size();) {
      const size_t e = std::min(text.find(' ', i), text.size());
      if (e > i) fields_.push_back(text.substr(i, e - i));
      i = e + 1;
    }
  }
  // Names the group of the next fields in messages: "pointer", 1, 3 -> " of pointer 2 of 3".
  void group(const char* name, int64_t index, int64_t count) {
    group_ = name, index_ = index, count_ = count;
  }
  std::string_view next(const char* what) {
    if (at_ == fields_.size()) fail(what, "", "the end of the fields before '|'");
    return fields_[at_++];
  }
  // A field of 1 to `max_digits` digits (hexadecimal when `hex`), as a number.
  int64_t number(const char* what, size_t max_digits, bool hex = false) {
    const std::string_view f = next(what);
    int64_t v = 0;
    bool ok = !f.empty() && f.size() <= max_digits;
    for (char c : f) {
      ok = ok && (hex ? is_hex(c) : is_digit(c));
      v = v * (hex ? 16 : 10) + (is_digit(c) ? c - '0' : lower(c) - 'a' + 10);
    }
    if (!ok)
      fail(what, detail::cat(" (at most ", max_digits, hex ? " hex" : " decimal", " digits)"),
           "'" + std::string(f) + "'");
    return v;
  }
  // A field that must be one of the letters `allowed`.
  char letter(const char* what, const std::string& allowed) {
    const std::string_view f = next(what);
    if (f.size() == 1 && allowed.find(f[0]) != std::string::npos) return f[0];
    std::string list;  // "n, v, a, s or r"
    for (size_t i = 0; i < allowed.size(); ++i)
      list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + std::string(1, allowed[i]);
    fail(what, " (" + list + ")", "'" + std::string(f) + "'");
  }
  [[noreturn]] void fail(const char* what, const std::string& expected, const std::string& got) {
    const std::string in =
        group_ ? detail::cat(" of ", group_, " ", index_ + 1, " of ", count_) : "";
    throw Error(detail::cat("wordnet: ", where_, ": expected ", what, in, expected, ", got ", got));
  }
  bool done() const { return at_ == fields_.size(); }
  std::string_view rest() const { return fields_[at_]; }

 private:
  const std::string& where_;
  std::vector<std::string_view> fields_;
  size_t at_ = 0;
  const char* group_ = nullptr;
  int64_t index_ = 0, count_ = 0;
};

// A word of a data line: underscores to spaces, an adjective marker "(a)", "(p)", "(ip)" cut.
std::string clean_lemma(const std::string& word) {
  std::string w = word;
  for (const char* marker : {"(a)", "(p)", "(ip)"}) {
    const std::string m = marker;
    if (w.size() > m.size() && ends_with(w, m)) w.resize(w.size() - m.size());
  }
  return underscores_to_spaces(w);
}

// The pointers and (data.verb) frames after the words: counted, checked, dropped.
void skip_pointers_and_frames(Fields& f, PartOfSpeech pos) {
  const int64_t p_cnt = f.number("p_cnt", 3);
  for (int64_t i = 0; i < p_cnt; ++i) {
    f.group("pointer", i, p_cnt);
    f.next("pointer_symbol");
    f.number("synset_offset", 10);
    f.letter("pos", "nvasr");
    f.number("source/target", 4, true);
  }
  f.group(nullptr, 0, 0);
  if (pos != PartOfSpeech::verb) return;
  const int64_t f_cnt = f.number("f_cnt", 2);
  for (int64_t i = 0; i < f_cnt; ++i) {
    f.group("frame", i, f_cnt);
    f.letter("a plus", "+");
    f.number("f_num", 2);
    f.number("w_num", 2, true);
  }
  f.group(nullptr, 0, 0);
}

std::string read_all(const fs::path& path) {
  std::error_code ec;
  CLUSTR_CHECK(fs::is_regular_file(path, ec), "wordnet: ", path.string(),
               fs::exists(path, ec) ? " is not a file" : " does not exist", "; ", kInstall,
               " or pass the folder that holds it");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  std::string text(size_t(std::max<std::streamoff>(0, in.tellg())), '\0');
  in.seekg(0);
  in.read(text.data(), std::streamsize(text.size()));
  CLUSTR_CHECK(in.good(), "wordnet: cannot read ", path.string());
  return text;
}

// Calls f(line, line_number) for each line of `text` (1-based; '\r' before '\n' removed).
template <class F>
void for_each_line(const std::string& text, F f) {
  int64_t number = 0;
  for (size_t start = 0; start < text.size();) {
    size_t stop = text.find('\n', start);
    if (stop == std::string::npos) stop = text.size();
    std::string line = text.substr(start, stop - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    f(line, ++number);
    start = stop + 1;
  }
}

}  // namespace

char pos_letter(PartOfSpeech pos) { return "nvar"[int(pos)]; }

PartOfSpeech pos_from_letter(char letter) {
  const size_t i = std::string("nvar").find(letter);
  CLUSTR_CHECK(letter != 0 && i != std::string::npos,
               "wordnet: expected a part of speech n, v, a or r, got '", letter, "'");
  return PartOfSpeech(int(i));
}

const char* pos_file_suffix(PartOfSpeech pos) {
  static const char* const names[] = {"noun", "verb", "adj", "adv"};
  return names[int(pos)];
}

std::string Synset::id() const {
  std::string digits = std::to_string(offset);
  if (digits.size() < 8) digits.insert(0, 8 - digits.size(), '0');
  return digits + "-" + pos_letter(pos);
}

std::string Synset::definition() const {
  std::string out;
  for (const std::string& d : definitions) out += (out.empty() ? "" : "; ") + d;
  return out;
}

// The scanner of data/wordnet.h's Gloss comment.
Gloss split_gloss(const std::string& g) {
  struct Piece {
    std::string lead;                  // the text before its first quote
    std::vector<std::string> quoted;  // its quoted parts
  };
  std::vector<Piece> pieces(1);
  int depth = 0;  // of parentheses outside quotes
  for (size_t i = 0; i < g.size(); ++i) {
    Piece& p = pieces.back();
    if (g[i] == ';') {
      pieces.emplace_back(), depth = 0;
    } else if (g[i] != '"' || depth > 0) {
      depth += (g[i] == '(') - (g[i] == ')' && depth > 0);
      if (p.quoted.empty()) p.lead += g[i];
    } else {
      size_t j = i + 1;
      for (; j < g.size(); ++j) {
        const size_t k = after_spaces(g, j + 1);
        if (g[j] == '"' && (k == g.size() || !word_byte(g[k]))) break;
        if (g[j] == ';' && k > j + 1 && k < g.size() && g[k] == '"') break;  // "a; "b"
      }
      p.quoted.push_back(trim(g.substr(i + 1, j - i - 1), " \t;"));
      i = j < g.size() && g[j] == ';' ? j - 1 : j;
    }
  }
  Gloss out;
  for (Piece& p : pieces) {
    p.quoted.erase(std::remove(p.quoted.begin(), p.quoted.end(), ""), p.quoted.end());
    std::string lead = trim(p.lead);
    const bool seen_example = !out.examples.empty();
    if (!p.quoted.empty() || !seen_example) {  // a definition before the first example
      for (const std::string cut : {":", "e.g."})  // `a certificate: "..."`, `e.g. "..."`
        while (ends_with(lead, cut)) lead = trim(lead.substr(0, lead.size() - cut.size()));
      if (!seen_example && !lead.empty()) out.definitions.push_back(lead);
      for (std::string& q : p.quoted) out.examples.push_back(std::move(q));
    } else if (!lead.empty() && lead[0] != '-' && lead[0] != '(') {
      out.examples.push_back(lead);  // an example without quotes
    }
  }
  return out;
}

Synset parse_synset_line(const std::string& line, PartOfSpeech pos, const std::string& where) {
  const size_t bar = line.find('|');
  CLUSTR_CHECK(bar != std::string::npos, "wordnet: ", where,
               ": expected a synset line ending in '| gloss', found no '|'");
  Fields f(std::string_view(line).substr(0, bar), where);
  Synset s;
  s.pos = pos;
  s.offset = f.number("synset_offset", 10);
  f.number("lex_filenum", 2);
  const std::string type = std::string("ss_type in data.") + pos_file_suffix(pos);
  const bool adj = pos == PartOfSpeech::adjective;
  s.satellite = f.letter(type.c_str(), adj ? "as" : std::string(1, pos_letter(pos))) == 's';
  const int64_t w_cnt = f.number("w_cnt", 2, true);
  if (w_cnt == 0) f.fail("w_cnt", " >= 1", "0");
  for (int64_t i = 0; i < w_cnt; ++i) {
    f.group("word", i, w_cnt);
    s.lemmas.push_back(clean_lemma(std::string(f.next("word"))));
    f.number("lex_id", 1, true);
  }
  f.group(nullptr, 0, 0);
  skip_pointers_and_frames(f, pos);
  if (!f.done())
    f.fail("'|' after the counted fields", "", "'" + std::string(f.rest()) + "' (a small count?)");
  Gloss gloss = split_gloss(trim(line.substr(bar + 1)));
  s.definitions = std::move(gloss.definitions);
  s.examples = std::move(gloss.examples);
  return s;
}

void Morphology::add(PartOfSpeech pos, const std::string& inflected, const std::string& base) {
  forms_[size_t(pos)][lower(underscores_to_spaces(base))].push_back(
      lower(underscores_to_spaces(inflected)));
}

const std::vector<std::string>& Morphology::irregular(PartOfSpeech pos,
                                                      const std::string& base) const {
  static const std::vector<std::string> none;
  const auto it = forms_[size_t(pos)].find(base);
  return it == forms_[size_t(pos)].end() ? none : it->second;
}

size_t Morphology::size() const {
  size_t n = 0;
  for (const auto& m : forms_)
    for (const auto& kv : m) n += kv.second.size();
  return n;
}

namespace {

// The regular forms of one lower-case word (data/wordnet.h's table), the word itself first.
std::vector<std::string> regular_forms(const std::string& w, PartOfSpeech pos) {
  std::vector<std::string> out = {w};
  const size_t n = w.size();
  const bool ends_e = n > 1 && w[n - 1] == 'e';
  const bool ends_y = n > 1 && w[n - 1] == 'y' && !is_vowel(w[n - 2]);
  const bool doubles = n > 1 && !is_vowel(w[n - 1]) && std::string("wxy").find(w[n - 1]) ==
                       std::string::npos && is_vowel(w[n - 2]) && (n < 3 || !is_vowel(w[n - 3]));
  const std::string stem_y = ends_y ? w.substr(0, n - 1) + "i" : "";
  auto add = [&](std::initializer_list<const char*> suffixes) {
    for (const char* s : suffixes) out.push_back(w + s);
  };
  switch (pos) {
    case PartOfSpeech::noun:
      add({"s", "es"});
      if (ends_y) out.push_back(stem_y + "es");
      break;
    case PartOfSpeech::verb:
      add({"s", "es", "ed", "ing"});
      if (ends_e) out.push_back(w + "d"), out.push_back(w.substr(0, n - 1) + "ing");
      if (ends_y) out.push_back(stem_y + "es"), out.push_back(stem_y + "ed");
      if (doubles) out.push_back(w + w[n - 1] + "ed"), out.push_back(w + w[n - 1] + "ing");
      break;
    case PartOfSpeech::adjective:
      add({"er", "est", "ly"});
      if (ends_e) out.push_back(w + "r"), out.push_back(w + "st");
      if (ends_y) for (const char* s : {"er", "est", "ly"}) out.push_back(stem_y + s);
      if (doubles) out.push_back(w + w[n - 1] + "er"), out.push_back(w + w[n - 1] + "est");
      break;
    case PartOfSpeech::adverb:
      add({"er", "est"});
      break;
  }
  return out;
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> words;
  for (size_t i = 0; i < s.size();) {
    const size_t e = std::min(s.find(' ', i), s.size());
    if (e > i) words.push_back(s.substr(i, e - i));
    i = e + 1;
  }
  return words;
}

// Whether `form` is at s[at...] case-insensitively.
bool matches_at(const std::string& s, size_t at, const std::string& form) {
  if (form.empty() || at + form.size() > s.size()) return false;
  for (size_t k = 0; k < form.size(); ++k)
    if (lower(s[at + k]) != form[k]) return false;
  return true;
}

// The furthest end of a match of words[k...] starting at s[at], or 0 when none.
size_t match_phrase(const std::string& s, size_t at,
                    const std::vector<std::vector<std::string>>& words, size_t k) {
  size_t best = 0;
  for (const std::string& form : words[k]) {
    if (!matches_at(s, at, form)) continue;
    const size_t e = at + form.size();
    if (e < s.size() && word_byte(s[e]) && word_byte(form.back())) continue;  // no word end
    if (k + 1 == words.size()) {
      best = std::max(best, e);
      continue;
    }
    size_t next = e;
    if (next < s.size() && s[next] == '-') {
      ++next;
    } else {
      while (next < s.size() && s[next] == ' ') ++next;
      if (next == e) continue;  // the words of a phrase need a separator
    }
    if (next < s.size()) best = std::max(best, match_phrase(s, next, words, k + 1));
  }
  return best;
}

}  // namespace

void LemmaPattern::add_forms(const std::string& lemma, PartOfSpeech pos, const Morphology* m) {
  const std::vector<std::string> words = split_words(lower(lemma));
  CLUSTR_CHECK(!words.empty(), "LemmaPattern: expected a lemma with a word, got '", lemma, "'");
  if (alternatives_.empty()) alternatives_.emplace_back(words.size());
  for (size_t k = 0; k < words.size(); ++k) {
    std::vector<std::string>& forms = alternatives_[0][k];
    for (const std::string& f : regular_forms(words[k], pos)) forms.push_back(f);
    if (m)
      for (const std::string& f : m->irregular(pos, words[k])) forms.push_back(f);
    std::sort(forms.begin(), forms.end());
    forms.erase(std::unique(forms.begin(), forms.end()), forms.end());
  }
  if (m && words.size() > 1)
    for (const std::string& phrase : m->irregular(pos, lower(lemma))) {
      std::vector<std::vector<std::string>> alt;
      for (const std::string& w : split_words(phrase)) alt.push_back({w});
      if (!alt.empty()) alternatives_.push_back(std::move(alt));
    }
}

LemmaPattern::LemmaPattern(const std::string& lemma, PartOfSpeech pos, const Morphology* m) {
  add_forms(lemma, pos, m);
}

LemmaPattern LemmaPattern::any_pos(const std::string& lemma, const Morphology* m) {
  LemmaPattern p;
  for (PartOfSpeech pos : kPartsOfSpeech) p.add_forms(lemma, pos, m);
  return p;
}

std::optional<Span> LemmaPattern::find(const std::string& sentence) const {
  for (size_t at = 0; at < sentence.size(); ++at) {
    if (at > 0 && word_byte(sentence[at - 1]) && word_byte(sentence[at])) continue;  // mid-word
    size_t best = 0;
    for (const auto& alt : alternatives_) best = std::max(best, match_phrase(sentence, at, alt, 0));
    if (best > 0) return Span{at, best};
  }
  return std::nullopt;
}

std::optional<Span> find_lemma(const std::string& sentence, const std::string& lemma,
                               PartOfSpeech pos, const Morphology* morphology) {
  return LemmaPattern(lemma, pos, morphology).find(sentence);
}

std::vector<LemmaInExample> lemmas_in_examples(const WordNet& wn) {
  std::vector<LemmaInExample> out;
  for (size_t i = 0; i < wn.synsets.size(); ++i) {
    const Synset& s = wn.synsets[i];
    if (s.examples.empty()) continue;
    std::vector<std::string> lemmas;
    std::vector<LemmaPattern> patterns;
    for (const std::string& l : s.lemmas)
      if (std::find(lemmas.begin(), lemmas.end(), lower(l)) == lemmas.end())
        lemmas.push_back(lower(l)), patterns.emplace_back(l, s.pos, &wn.morphology);
    for (size_t k = 0; k < s.examples.size(); ++k)
      for (size_t l = 0; l < lemmas.size(); ++l)
        if (const auto span = patterns[l].find(s.examples[k]))
          out.push_back({i, k, lemmas[l], *span});
  }
  return out;
}

WordNet read_wordnet(const std::string& folder) {
  std::error_code ec;
  CLUSTR_CHECK(fs::is_directory(folder, ec), "wordnet: the folder ", folder,
               fs::exists(folder, ec) ? " is not a folder" : " does not exist", "; ", kInstall,
               " or pass the folder that holds data.noun, data.verb, data.adj and data.adv");
  WordNet wn;
  wn.folder = folder;
  for (PartOfSpeech pos : kPartsOfSpeech) {
    const fs::path path = fs::path(folder) / (std::string("data.") + pos_file_suffix(pos));
    for_each_line(read_all(path), [&](const std::string& line, int64_t number) {
      if (line.empty() || line.rfind("  ", 0) == 0) return;  // the licence lines
      wn.synsets.push_back(
          parse_synset_line(line, pos, path.string() + ":" + std::to_string(number)));
    });
  }
  for (PartOfSpeech pos : kPartsOfSpeech) {
    const fs::path path = fs::path(folder) / (std::string(pos_file_suffix(pos)) + ".exc");
    for_each_line(read_all(path), [&](const std::string& line, int64_t number) {
      if (trim(line).empty()) return;
      const std::vector<std::string> f = split_words(line);
      CLUSTR_CHECK(f.size() >= 2, "wordnet: ", path.string(), ":", number,
                   ": expected an inflected form and its base forms, got '", line, "'");
      for (size_t i = 1; i < f.size(); ++i) wn.morphology.add(pos, f[0], f[i]);
    });
  }
  return wn;
}

}  // namespace clustr
