// WordNet 3.0 as Debian's wordnet-base installs it (/usr/share/wordnet): its synsets with their
// lemmas, definitions and usage examples, the irregular forms of its exception lists, and a
// matcher that finds a lemma (or an inflected form of it) in a sentence. data/text_tasks.h
// builds the text app's fine-tuning tasks from these.
//
// The files (format in `man 5 wndb`). Each of data.noun, data.verb, data.adj, data.adv starts
// with licence lines that begin with two spaces; every other line is one synset:
//   offset lex_filenum ss_type w_cnt (word lex_id){w_cnt} p_cnt (ptr){p_cnt} [frames] | gloss
// offset: 8 decimal digits; lex_filenum: 2 decimal digits; ss_type: n v a s r (s, an adjective
// satellite, counts as an adjective); w_cnt: 2 hexadecimal digits; word: underscores for
// spaces, an adjective may end in a syntactic marker "(a)", "(p)" or "(ip)"; lex_id: 1 hex
// digit; p_cnt: 3 decimal digits; ptr: symbol, offset, pos, 4 hex digits; frames (data.verb
// only): f_cnt (2 decimal digits), then f_cnt times "+ f_num w_num". The gloss runs to the end
// of the line: definitions and examples separated by semicolons, e.g.
//   | (usually followed by `to') having the necessary means or skill ...; "able to swim"
// noun.exc, verb.exc, adj.exc, adv.exc: "inflected base [base...]" per line, underscores for
// spaces ("allowed_for allow_for").
//
// Errors are clustr::Error: a missing folder or file names it and suggests
// `apt-get install wordnet-base`; a malformed line gives file:line, the field, what was
// expected and what was there. Nothing in a corrupt file can make the reader index out of
// bounds: every count is checked against the fields the line has.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace clustr {

enum class PartOfSpeech { noun = 0, verb = 1, adjective = 2, adverb = 3 };

constexpr std::array<PartOfSpeech, 4> kPartsOfSpeech = {
    PartOfSpeech::noun, PartOfSpeech::verb, PartOfSpeech::adjective, PartOfSpeech::adverb};

// 'n', 'v', 'a', 'r' (WordNet's letters), and back; pos_from_letter throws on another letter.
char pos_letter(PartOfSpeech pos);
PartOfSpeech pos_from_letter(char letter);
// "noun", "verb", "adj", "adv": the suffix of the data and exception files.
const char* pos_file_suffix(PartOfSpeech pos);

struct Synset {
  int64_t offset = 0;  // byte offset of its line in data.<pos>
  PartOfSpeech pos = PartOfSpeech::noun;
  bool satellite = false;             // ss_type 's' (an adjective satellite)
  std::vector<std::string> lemmas;    // as written, case kept: "ready to hand", "Paris"
  std::vector<std::string> definitions;
  std::vector<std::string> examples;  // usage examples, without their quotes
  // "00001740-a": offset and pos letter, unique over the four files.
  std::string id() const;
  // The definitions joined with "; ".
  std::string definition() const;
};

// A gloss split into definitions and usage examples. The gloss splits at semicolons into
// pieces, except inside quotes. A double quote opens an example (not inside parentheses:
// `spread by scattering ("straw" is archaic)` is a definition); it ends at the next quote that
// is not followed by a letter or digit (after spaces), so that `I"m` or `the car"women` stay
// inside, or, left open, at "; \"" (a semicolon, spaces, a quote). In a piece with examples,
// the text before its first quote is a definition if no example came before (a trailing ':'
// or "e.g." cut: `a certificate: "..."`), and the text after a quote is dropped (attributions,
// `", "`). A piece without quotes is a definition before the first example and an example
// after it (`...; "a hint"; drop names"`), unless it starts with '-' or '(' (an attribution
// or a note: "(`plenty' is nonstandard)"). Everything is trimmed; empty parts are dropped.
struct Gloss {
  std::vector<std::string> definitions;
  std::vector<std::string> examples;
};
Gloss split_gloss(const std::string& gloss);

// A byte range [begin, end) of a string.
struct Span {
  size_t begin = 0, end = 0;
  bool operator==(const Span& o) const { return begin == o.begin && end == o.end; }
};

// Irregular inflections from the exception lists, lower case, spaces for underscores:
// base -> its inflected forms, per part of speech.
class Morphology {
 public:
  void add(PartOfSpeech pos, const std::string& inflected, const std::string& base);
  // The irregular forms of `base` (lower case); empty when it has none.
  const std::vector<std::string>& irregular(PartOfSpeech pos, const std::string& base) const;
  size_t size() const;  // the number of (inflected, base) pairs

 private:
  std::array<std::unordered_map<std::string, std::vector<std::string>>, 4> forms_;
};

// A lemma compiled for matching in sentences. A match is case-insensitive (ASCII), starts and
// ends on word boundaries (a word character is an ASCII letter or digit or any non-ASCII
// byte), and is one of:
//   - the lemma's words in order, each in one of its forms, separated by one or more spaces or
//     by one hyphen ("look up" matches "looked up", "ice cream" matches "ice-cream");
//   - an irregular form of the whole lemma from the exception list ("allowed for").
// A word's forms are the word itself, its irregular forms, and regular suffixes by part of
// speech (w = the word, C = its last letter when doubling applies, i.e. the word ends in
// consonant-vowel-consonant and C is not w, x or y; "y" rules only after a consonant):
//   noun:      w+s, w+es, w-y+ies
//   verb:      w+s, w+es, w+ed, w+ing, w+d and w-e+ing when w ends in e, w-y+ies, w-y+ied,
//              w+C+ed, w+C+ing
//   adjective: w+er, w+est, w+ly, w+r and w+st when w ends in e, w-y+ier, w-y+iest, w-y+ily,
//              w+C+er, w+C+est
//   adverb:    w+er, w+est
// This over-generates (it accepts "seing" as well as "seeing"), which costs nothing since such
// strings are not words; it misses forms that are neither regular nor listed.
class LemmaPattern {
 public:
  LemmaPattern(const std::string& lemma, PartOfSpeech pos, const Morphology* morphology = nullptr);
  // With the forms of every part of speech: "does the sentence hold this word in any form".
  static LemmaPattern any_pos(const std::string& lemma, const Morphology* morphology = nullptr);
  // The first match (the longest one at the earliest position), or nothing.
  std::optional<Span> find(const std::string& sentence) const;

 private:
  LemmaPattern() = default;
  void add_forms(const std::string& lemma, PartOfSpeech pos, const Morphology* morphology);
  // Each alternative is a phrase: its words, each with its set of forms.
  std::vector<std::vector<std::vector<std::string>>> alternatives_;
};

// LemmaPattern(lemma, pos, morphology).find(sentence).
std::optional<Span> find_lemma(const std::string& sentence, const std::string& lemma,
                               PartOfSpeech pos, const Morphology* morphology = nullptr);

struct WordNet {
  std::string folder;
  std::vector<Synset> synsets;  // data.noun, data.verb, data.adj, data.adv, each in file order
  Morphology morphology;        // from the four .exc files
};

// A usage example in which a lemma of its synset is found.
struct LemmaInExample {
  size_t synset = 0;   // index into WordNet::synsets
  size_t example = 0;  // index into the synset's examples
  std::string lemma;   // lower case
  Span span;           // in the example
};
// Every (example, lemma) of every synset where LemmaPattern(lemma, synset's pos) finds the
// lemma, a lemma that differs only in case counted once; in synset, example, lemma order.
std::vector<LemmaInExample> lemmas_in_examples(const WordNet& wordnet);

// Reads the four data files and the four exception lists of `folder`.
WordNet read_wordnet(const std::string& folder = "/usr/share/wordnet");

// Parses one data line (not a licence line) of data.<pos>; `where` ("data.noun:42") starts
// the error messages.
Synset parse_synset_line(const std::string& line, PartOfSpeech pos, const std::string& where);

}  // namespace clustr
