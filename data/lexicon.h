// Words to phones for corpora transcribed in words: a pronunciation dictionary, and the text
// normalisation that turns a transcript into its words.
//
// The dictionary is the CMU pronouncing dictionary, in one of two layouts:
//   - Festival's compiled lexicon, as Debian's festlex-cmu ships it
//     (/usr/share/festival/dicts/cmu/cmudict-0.4.out): one entry per line,
//     ("word" pos (((ph ph) stress) ((ph) stress) ...)), phones in lower case, "ax" for the
//     unstressed AH, a first line "MNCL";
//   - CMUdict's own text layout: "WORD  PH1 PH2 ..." with stress digits on the vowels
//     (ignored), ";;;" comment lines, "WORD(2)" for alternative pronunciations.
// Either way the phones are the 39 ARPAbet phones of CMUdict in upper case (AX becomes AH), the
// labels the corpus generator uses. A word with several entries keeps its first.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

namespace clustr {

// The 39 ARPAbet phones of CMUdict, in the order of the corpus generator's tokens.txt.
const std::vector<std::string>& arpabet_phones();

class Lexicon {
 public:
  // Reads either layout (told apart by the first line); throws clustr::Error naming the file
  // and line of anything it cannot read, or a phone outside the 39.
  static Lexicon read(const std::string& path);
  // The phones of a normalised word (transcript_words), or null when the dictionary lacks it.
  const std::vector<std::string>* find(const std::string& word) const;
  size_t size() const { return words_.size(); }

 private:
  std::unordered_map<std::string, std::vector<std::string>> words_;
};

// A transcript -> its words, normalised as the dictionary spells them: lower case; letters,
// digits and apostrophes kept, inner hyphens splitting words, every other character a space.
std::vector<std::string> transcript_words(const std::string& text);

}  // namespace clustr
