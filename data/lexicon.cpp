// Pronunciation dictionaries and transcript words (lexicon.h).
#include "data/lexicon.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <unordered_set>

#include "core/error.h"
#include "data/file_reason.h"

namespace clustr {

namespace {

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// A dictionary phone -> one of the 39 (stress digits dropped, AX to AH), or "" when it is none.
std::string arpabet(std::string phone) {
  static const std::unordered_set<std::string> known(arpabet_phones().begin(),
                                                     arpabet_phones().end());
  phone = upper(phone);
  while (!phone.empty() && std::isdigit(static_cast<unsigned char>(phone.back())))
    phone.pop_back();
  if (phone == "AX") phone = "AH";
  return known.count(phone) ? phone : std::string();
}

}  // namespace

const std::vector<std::string>& arpabet_phones() {
  static const std::vector<std::string> phones = {
      "AA", "AE", "AH", "AO", "AW", "AY", "B",  "CH", "D", "DH", "EH", "ER", "EY",
      "F",  "G",  "HH", "IH", "IY", "JH", "K",  "L",  "M", "N",  "NG", "OW", "OY",
      "P",  "R",  "S",  "SH", "T",  "TH", "UH", "UW", "V", "W",  "Y",  "Z",  "ZH"};
  return phones;
}

Lexicon Lexicon::read(const std::string& path) {
  const std::string reason = unreadable_reason(path);
  CLUSTR_CHECK(reason.empty(), "lexicon: cannot open ", path, ": ", reason);
  std::ifstream in(path, std::ios::binary);
  CLUSTR_CHECK(in.good(), "lexicon: cannot open ", path);
  Lexicon lex;
  std::string line;
  int64_t n = 0;
  bool festival = false;
  auto bad = [&](const std::string& what) {
    throw Error(detail::cat("lexicon: ", path, ":", n, ": ", what));
  };
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (n == 1 && line == "MNCL") {
      festival = true;
      continue;
    }
    if (line.empty() || line.rfind(";;;", 0) == 0) continue;
    std::string word;
    std::vector<std::string> phones;
    if (festival) {
      // ("word" pos (((ph ph) 1) ((ph) 0)))
      const size_t q1 = line.find('"'), q2 = line.find('"', q1 + 1);
      if (line.rfind("(\"", 0) != 0 || q2 == std::string::npos) bad("expected (\"word\" ...)");
      word = line.substr(q1 + 1, q2 - q1 - 1);
      const size_t syl = line.find("(((", q2);
      if (syl == std::string::npos) bad("no syllables (((...) after the word");
      std::string token;
      int depth = 0;
      for (size_t i = syl; i < line.size(); ++i) {
        const char c = line[i];
        if (c == '(') {
          ++depth;
        } else if (c == ')' || c == ' ') {
          // Phones sit at depth 3; the stress digit after a syllable at depth 2.
          if (!token.empty() && depth == 3) {
            const std::string p = arpabet(token);
            if (p.empty()) bad("phone '" + token + "' is not one of the 39 of CMUdict");
            phones.push_back(p);
          }
          token.clear();
          if (c == ')') --depth;
        } else {
          token.push_back(c);
        }
      }
    } else {
      const size_t sp = line.find(' ');
      if (sp == std::string::npos) bad("expected WORD  PHONES");
      word = line.substr(0, sp);
      for (char& c : word) c = char(std::tolower(static_cast<unsigned char>(c)));
      if (word.size() > 3 && word.back() == ')' && word[word.size() - 3] == '(')
        word.resize(word.size() - 3);  // "word(2)": an alternative pronunciation
      size_t i = sp;
      while (i < line.size()) {
        while (i < line.size() && line[i] == ' ') ++i;
        const size_t j = std::min(line.find(' ', i), line.size());
        if (j > i) {
          const std::string p = arpabet(line.substr(i, j - i));
          if (p.empty()) bad("phone '" + line.substr(i, j - i) + "' is not one of the 39 of CMUdict");
          phones.push_back(p);
        }
        i = j;
      }
    }
    if (word.empty() || phones.empty()) bad("an entry without a word or phones");
    lex.words_.emplace(word, std::move(phones));  // the first entry of a word stays
  }
  CLUSTR_CHECK(!in.bad(), "lexicon: read error in ", path);
  CLUSTR_CHECK(!lex.words_.empty(), "lexicon: ", path, " holds no entries");
  return lex;
}

const std::vector<std::string>* Lexicon::find(const std::string& word) const {
  auto it = words_.find(word);
  return it == words_.end() ? nullptr : &it->second;
}

std::vector<std::string> transcript_words(const std::string& text) {
  std::vector<std::string> words;
  std::string w;
  auto flush = [&] {
    // Apostrophes only inside a word ("don't", not quotes around one).
    while (!w.empty() && w.front() == '\'') w.erase(w.begin());
    while (!w.empty() && w.back() == '\'') w.pop_back();
    if (!w.empty()) words.push_back(w);
    w.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (std::isalnum(c) || c == '\'' || c >= 0x80) {  // UTF-8 bytes kept as they are
      w.push_back(char(std::tolower(c)));
    } else {
      flush();  // hyphens, punctuation and spaces all end a word
    }
  }
  flush();
  return words;
}

}  // namespace clustr
