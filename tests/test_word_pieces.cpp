// Word pieces (data/word_pieces.h): learning them from transcripts, saving and loading, encoding,
// their use as manifest labels (data/corpus_import.h), and the words that character and
// word-piece labels spell, with the word error rate.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "check.h"
#include "data/corpus_import.h"
#include "data/manifest.h"
#include "data/word_pieces.h"

using namespace clustr;
using clustr::test::TempDir;
using clustr::test::write_text;

namespace {

// A token table of the given tokens after the blank.
TokenTable table(const std::vector<std::string>& tokens) {
  TokenTable t;
  t.tokens.push_back(kBlankToken);
  t.tokens.insert(t.tokens.end(), tokens.begin(), tokens.end());
  for (size_t i = 0; i < t.tokens.size(); ++i) t.index[t.tokens[i]] = int32_t(i);
  return t;
}

LabelSequence labels(const TokenTable& t, const std::vector<std::string>& tokens) {
  LabelSequence out;
  for (const std::string& s : tokens) {
    REQUIRE_MESSAGE(t.find(s) > 0, "no token '", s, "'");
    out.push_back(t.find(s));
  }
  return out;
}

// Sentences of a small vocabulary with a few frequent words.
std::vector<std::string> sentences() {
  const std::vector<std::string> words = {"the",     "cat", "sat",  "on", "mat",  "cats",
                                          "sitting", "hat", "that", "at", "it's", "42"};
  std::vector<std::string> out;
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (int k = 0; k < 3 + i % 4; ++k)
      s += (k ? " " : "") + words[size_t((i * 7 + k * k * 5 + k) % words.size())];
    out.push_back(s);
  }
  return out;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("word pieces: the words that character and word-piece labels spell") {
  const TokenTable chars = table({"a", "b", "c", "'", "|"});
  CHECK(labels_spell_words(chars));
  CHECK(label_words(chars, labels(chars, {"a", "b", "|", "c", "'", "a", "|", "|", "b"})) ==
        std::vector<std::string>{"ab", "c'a", "b"});
  CHECK(label_words(chars, {}).empty());

  const TokenTable pieces = table({"\xE2\x96\x81the", "\xE2\x96\x81", "c", "at", "s"});
  CHECK(labels_spell_words(pieces));
  // "▁the ▁ c at s ▁the at": a lone "▁" starts the next piece's word.
  CHECK(label_words(pieces, labels(pieces, {"\xE2\x96\x81the", "\xE2\x96\x81", "c", "at", "s",
                                            "\xE2\x96\x81the", "at"})) ==
        std::vector<std::string>{"the", "cats", "theat"});
  // A hypothesis may begin inside a word: its first piece opens one.
  CHECK(label_words(pieces, labels(pieces, {"at", "\xE2\x96\x81the"})) ==
        std::vector<std::string>{"at", "the"});

  const TokenTable phones = table({"AH", "B", "K"});
  CHECK_FALSE(labels_spell_words(phones));
  CHECK_ERROR(label_words(chars, {9}), "label 9 is not a token");

  // Words compared as wholes: "ab c'a b" against "ab ca b b": one substitution, one insertion.
  const ErrorRate e = word_errors(chars, {labels(chars, {"a", "b", "|", "c", "'", "a", "|", "b"})},
                                  {labels(chars, {"a", "b", "|", "c", "a", "|", "b", "|", "b"})});
  CHECK(e.edits == 2);
  CHECK(e.reference_length == 3);
  CHECK_ERROR(word_errors(chars, {{}}, {}), "1 references against 0 hypotheses");
}

#if CLUSTR_WITH_SENTENCEPIECE
TEST_CASE("word pieces: learnt from transcripts, saved, loaded, applied") {
  TempDir dir;
  const std::vector<std::string> s = sentences();
  const WordPieces w = WordPieces::train(s, 24);
  const std::vector<std::string> p = w.pieces();
  CHECK(p.size() == 23);  // the unknown piece is not a label
  const TokenTable t = table(p);
  // Every sentence's pieces spell its words again, in fewer labels than its letters.
  size_t letters = 0, labelled = 0;
  for (const std::string& sentence : s) {
    LabelSequence l;
    for (const std::string& piece : w.encode(sentence)) l.push_back(t.find(piece));
    letters += sentence.size();
    labelled += l.size();
    std::string joined;
    for (const std::string& word : label_words(t, l)) joined += (joined.empty() ? "" : " ") + word;
    REQUIRE_MESSAGE(joined == sentence, "pieces of '", sentence, "' spell '", joined, "'");
  }
  CHECK_MESSAGE(labelled * 2 < letters, labelled, " pieces for ", letters, " characters");

  // The model depends on the sentences alone: learnt twice, the same bytes; loaded, the same
  // pieces and encodings.
  w.save(dir.file("a.model"));
  WordPieces::train(s, 24).save(dir.file("b.model"));
  CHECK(read_bytes(dir.file("a.model")) == read_bytes(dir.file("b.model")));
  CHECK_FALSE(std::filesystem::exists(dir.file("a.model.tmp")));
  const WordPieces loaded = WordPieces::load(dir.file("a.model"));
  CHECK(loaded.pieces() == p);
  CHECK(loaded.encode("cats sitting on that mat") == w.encode("cats sitting on that mat"));

  // Errors: characters no piece covers, a vocabulary the text cannot fill, bad files.
  CHECK_ERROR(w.encode("the zebra"), "the characters 'z' are in no word piece");
  CHECK_ERROR(WordPieces::train(s, 5000), "cannot learn 5000 pieces from 300 transcripts",
              "Vocabulary size too high");
  CHECK_ERROR(WordPieces::train({}, 24), "no transcripts");
  CHECK_ERROR(WordPieces::train(s, 1), "at least 2, got 1");
  write_text(dir.file("text.model"), "not a model\n");
  CHECK_ERROR(WordPieces::load(dir.file("text.model")), "text.model",
              "is not a SentencePiece model");
  CHECK_ERROR(WordPieces::load(dir.file("none.model")), "cannot read",
              "none.model: does not exist");
}

TEST_CASE("word pieces: manifest labels and tokens.txt") {
  TempDir dir;
  const WordPieces w = WordPieces::train(sentences(), 24);
  std::vector<CorpusUtterance> u(3);
  u[0] = {"u0", dir.file("u0.wav"), 1.5, "The CAT sat, on the mat.", "list:1"};
  u[1] = {"u1", dir.file("u1.wav"), 2.0, "the zebra", "list:2"};
  u[2] = {"u2", dir.file("u2.wav"), 0.5, "it's 42", "list:3"};
  for (const CorpusUtterance& x : u) write_text(x.audio, "");
  const ImportReport r =
      write_manifest(u, LabelUnits::pieces, nullptr, dir.file("d/train.tsv"), &w);
  CHECK(r.written == 2);
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0] == "list:2: utterance 'u1': the characters 'z' are in no word piece");
  const TokenTable t = read_tokens(dir.file("d/tokens.txt"));
  CHECK(std::vector<std::string>(t.tokens.begin() + 1, t.tokens.end()) == w.pieces());
  const Manifest m = read_manifest(dir.file("d/train.tsv"), t);
  REQUIRE(m.utterances.size() == 2);
  CHECK(label_words(t, m.utterances[0].labels) ==
        std::vector<std::string>{"the", "cat", "sat", "on", "the", "mat"});
  CHECK(label_words(t, m.utterances[1].labels) == std::vector<std::string>{"it's", "42"});
  CHECK_ERROR(write_manifest(u, LabelUnits::pieces, nullptr, dir.file("x.tsv")),
              "word-piece labels need a model");
}
#else
TEST_CASE("word pieces: a build without SentencePiece says so") {
  CHECK_ERROR(WordPieces::train({"a b"}, 4), "this build has no SentencePiece");
}
#endif
