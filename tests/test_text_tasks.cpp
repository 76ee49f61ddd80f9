// WordNet's reader and lemma matcher (data/wordnet.h) and the text app's two fine-tuning tasks
// (data/text_tasks.h): the reader on a small hand-written WordNet and its errors on corrupt
// lines; the matcher's inflections, boundaries and phrases; word-in-context pairs and span
// questions built from the installed WordNet (/usr/share/wordnet, package wordnet-base; the
// span task also needs the pretrained model's vocab.txt, CLUSTR_PRETRAINED_DIR in the
// environment, else the build's default); without them those cases are skipped (ctest reports
// them as not run); their files, and the metrics against hand-computed values.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "check.h"
#include "data/text_tasks.h"
#include "pretrained.h"


// CHECK_HAS(message, "part", ...): the message contains every part.
#define CHECK_HAS(message, ...)                                                         \
  do {                                                                                  \
    const std::string has_ = (message);                                                 \
    CHECK_MESSAGE(::clustr::test::contains_all(has_, {__VA_ARGS__}), "message: \"" << has_ \
                                                                         << "\"");       \
  } while (0)

using namespace clustr;
using clustr::test::TempDir;
using clustr::test::write_text;

namespace {

const char* const kWordNet = clustr::test::wordnet_dir();
using clustr::test::wordnet_present;

std::string pretrained_vocab() { return clustr::test::pretrained_dir() + "/vocab.txt"; }

bool span_inputs_present() {
  return wordnet_present() && std::filesystem::exists(pretrained_vocab());
}

// The installed WordNet, read once for all the cases that use it.
const WordNet& real_wordnet() {
  static const WordNet wn = read_wordnet(kWordNet);
  return wn;
}

const std::string kLicence = "  1 This software and database is provided \"AS IS\" | no warranty\n"
                             "  2 \n";

// A small WordNet: each file's lines after the licence lines.
std::map<std::string, std::string> small_wordnet() {
  return {
      {"data.noun",
       "00001000 05 n 02 cat 0 true_cat 0 001 @ 00001200 n 0000 | feline mammal; a pet; "
       "\"the cat sat on the mat\"; \"cats purr\"  \n"
       "00001200 05 n 01 dog 0 000 | a domestic animal; \"the dog barked\"  \n"},
      {"data.verb",
       "00002000 38 v 01 stop 0 001 @ 00002100 v 0000 02 + 02 00 + 08 01 | come to a halt; "
       "\"the car stopped\"  \n"},
      {"data.adj",
       "00003000 00 a 01 big 0 000 | large in size; \"a big house\"  \n"
       "00003100 00 s 02 ready_to_hand(p) 0 galore(ip) 0 000 | handy: \"ready to hand\"  \n"},
      {"data.adv", "00004000 02 r 01 quickly 0 000 | with speed; \"he ran quickly\"  \n"},
      {"noun.exc", "mice mouse\nbains_marie bain_marie\n"},
      {"verb.exc", "went go\nran run\n"},
      {"adj.exc", "better good well\n"},
      {"adv.exc", ""},
  };
}

// Writes `files` into `dir`, the licence lines before each data file's lines.
void write_wordnet(const TempDir& dir, const std::map<std::string, std::string>& files) {
  for (const auto& [name, text] : files)
    write_text(dir.file(name), (name.rfind("data.", 0) == 0 ? kLicence : "") + text);
}

// The small WordNet with data.noun's second synset line (line 4 of the file) replaced.
std::string error_with_noun_line(const std::string& line) {
  TempDir dir;
  auto files = small_wordnet();
  std::string& noun = files["data.noun"];
  noun = noun.substr(0, noun.find('\n') + 1) + line + "\n";
  write_wordnet(dir, files);
  return clustr::test::error_of([&] { read_wordnet(dir.file("")); });
}

// Counts the failed conditions of a loop and keeps the first one's message, for one check
// after it (a check per pair of a 10,000-pair split would flood the output and the clock).
struct Failures {
  int64_t count = 0;
  std::string first;
  template <class... Parts>
  void check(bool ok, const Parts&... message) {
    if (!ok && count++ == 0) first = clustr::detail::cat(message...);
  }
};
#define CHECK_NONE(failures) \
  CHECK_MESSAGE(failures.count == 0, failures.count, " failures; the first: ", failures.first)

// "[4, 8)", or "none".
std::string show(const std::optional<Span>& span) {
  return span ? clustr::detail::cat("[", span->begin, ", ", span->end, ")") : "none";
}

std::string span_text(const std::string& s, const Span& span) {
  return s.substr(span.begin, span.end - span.begin);
}

// A sentence as the tasks compare them between splits.
std::string key(const std::string& s) {
  std::string out;
  for (char c : s) {
    c = char(std::tolower(static_cast<unsigned char>(c)));
    if (c != ' ' || (!out.empty() && out.back() != ' ')) out += c;
  }
  if (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

}  // namespace

TEST_CASE("wordnet: reads synsets, lemmas, definitions and examples of a small WordNet") {
  TempDir dir;
  write_wordnet(dir, small_wordnet());
  const WordNet wn = read_wordnet(dir.file(""));
  REQUIRE(wn.synsets.size() == 6);
  const Synset& cat = wn.synsets[0];
  CHECK(cat.id() == "00001000-n");
  CHECK(cat.lemmas == std::vector<std::string>{"cat", "true cat"});
  CHECK(cat.definitions == std::vector<std::string>{"feline mammal", "a pet"});
  CHECK(cat.definition() == "feline mammal; a pet");
  CHECK(cat.examples == std::vector<std::string>{"the cat sat on the mat", "cats purr"});
  CHECK(wn.synsets[2].pos == PartOfSpeech::verb);
  CHECK(wn.synsets[2].examples == std::vector<std::string>{"the car stopped"});
  const Synset& handy = wn.synsets[4];
  CHECK(handy.id() == "00003100-a");
  CHECK(handy.satellite);
  CHECK(handy.lemmas == std::vector<std::string>{"ready to hand", "galore"});
  CHECK(handy.definitions == std::vector<std::string>{"handy"});
  CHECK(wn.synsets[5].pos == PartOfSpeech::adverb);
  CHECK(wn.morphology.size() == 6);
  CHECK(wn.morphology.irregular(PartOfSpeech::adjective, "well") ==
        std::vector<std::string>{"better"});
}

TEST_CASE("wordnet: glosses with odd quotes split into definitions and examples") {
  using V = std::vector<std::string>;
  auto check = [](const std::string& gloss, const V& definitions, const V& examples) {
    const Gloss g = split_gloss(gloss);
    INFO("gloss: ", gloss);
    CHECK(g.definitions == definitions);
    CHECK(g.examples == examples);
  };
  check("just a definition", {"just a definition"}, {});
  check("a; b; \"one\"; \"two; still two\"", {"a", "b"}, {"one", "two; still two"});
  check("utter; \"drop a hint\"; drop names\"", {"utter"}, {"drop a hint", "drop names"});
  check("side; \"I\"m siding against\"", {"side"}, {"I\"m siding against"});
  check("shy; \"I looked at the wall\"- Ezra Pound; \"b\"", {"shy"}, {"I looked at the wall", "b"});
  check("strew (\"straw\" is archaic); \"strew toys\"", {"strew (\"straw\" is archaic)"},
        {"strew toys"});
  check("tense; \"the neck tensed;\" \"the rope strained\"", {"tense"},
        {"the neck tensed", "the rope strained"});
  check("bondage; \"in bondage to fear:; \"he sought release\"", {"bondage"},
        {"in bondage to fear:", "he sought release"});
  check("enough; \"eat\"; (`plenty' is nonstandard) \"I've had plenty\"", {"enough"},
        {"eat", "I've had plenty"});
  check("a certificate: \"certificated teachers\"", {"a certificate"}, {"certificated teachers"});
  check("fixed; e.g. \"frozen prices\"", {"fixed"}, {"frozen prices"});
  check("intensify; \"efforts were intensified\", \"rudeness intensified it\"", {"intensify"},
        {"efforts were intensified", "rudeness intensified it"});
}

TEST_CASE("wordnet: a missing folder or file names it and says how to install WordNet") {
  CHECK_ERROR(read_wordnet("/nonexistent/wordnet"), "/nonexistent/wordnet", "does not exist",
              "apt-get install wordnet-base");
  TempDir dir;
  auto files = small_wordnet();
  files.erase("data.adv");
  write_wordnet(dir, files);
  CHECK_ERROR(read_wordnet(dir.file("")), "data.adv does not exist",
              "apt-get install wordnet-base");
}

TEST_CASE("wordnet: a corrupt line names the file, the line and what was expected") {
  const std::string at = "data.noun:4: expected ";
  // A truncated line, counts too large or too small for the fields, non-numbers.
  CHECK_HAS(error_with_noun_line("00001200 05 n 02 dog 0 000 | a dog"), at.c_str(),
              "word 2 of 2", "got the end of the fields");
  CHECK_HAS(error_with_noun_line("00001200 05 n ff dog 0 000 | a dog"), at.c_str(),
              "of 255");
  CHECK_HAS(error_with_noun_line("00001200 05 n zz dog 0 000 | a dog"), at.c_str(),
              "w_cnt (at most 2 hex digits), got 'zz'");
  CHECK_HAS(error_with_noun_line("00001200 05 n 00 000 | nothing"), at.c_str(), "w_cnt >= 1");
  CHECK_HAS(error_with_noun_line("0000x200 05 n 01 dog 0 000 | a dog"), at.c_str(),
              "synset_offset", "got '0000x200'");
  CHECK_HAS(error_with_noun_line("00001200 05 n 01 dog 0 003 @ 00001000 n 0000 | a"),
              at.c_str(), "pointer_symbol of pointer 2 of 3");
  CHECK_HAS(error_with_noun_line("00001200 05 n 01 dog 0 000 @ 00001000 n 0000 | a"),
              "data.noun:4: expected '|' after the counted fields, got '@'");
  CHECK_HAS(error_with_noun_line("00001200 05 n 01 dog 0 001 @ 00001000 q 0000 | a"),
              at.c_str(), "pos of pointer 1 of 1 (n, v, a, s or r), got 'q'");
  CHECK_HAS(error_with_noun_line("00001200 05 v 01 dog 0 000 | a dog"), at.c_str(),
              "ss_type in data.noun (n), got 'v'");
  CHECK_HAS(error_with_noun_line("00001200 05 n 01 dog 0 000 a dog"), "data.noun:4",
              "found no '|'");
  CHECK_HAS(error_with_noun_line("x"), "data.noun:4", "found no '|'");
  // A verb line whose frame count runs past its fields, and a bad exception line.
  TempDir dir;
  auto files = small_wordnet();
  files["data.verb"] = "00002000 38 v 01 stop 0 000 03 + 02 00 | halt\n";
  write_wordnet(dir, files);
  CHECK_ERROR(read_wordnet(dir.file("")),
              "data.verb:3: expected a plus of frame 2 of 3, got the end of the fields");
  files = small_wordnet();
  files["verb.exc"] = "went go\nran\n";
  write_wordnet(dir, files);
  CHECK_ERROR(read_wordnet(dir.file("")), "verb.exc:2: expected an inflected form");
}

TEST_CASE("wordnet: the matcher finds inflected forms on word boundaries") {
  Morphology m;
  m.add(PartOfSpeech::noun, "mice", "mouse");
  m.add(PartOfSpeech::verb, "went", "go");
  m.add(PartOfSpeech::noun, "bains_marie", "bain_marie");
  auto found = [&](const std::string& sentence, const std::string& lemma, PartOfSpeech pos) {
    const auto span = find_lemma(sentence, lemma, pos, &m);
    return span ? span_text(sentence, *span) : std::string("<none>");
  };
  const auto n = PartOfSpeech::noun, v = PartOfSpeech::verb, a = PartOfSpeech::adjective;
  CHECK(show(find_lemma("The cats sat", "cat", n)) == "[4, 8)");
  CHECK(found("two boxes", "box", n) == "boxes");
  CHECK(found("big cities", "city", n) == "cities");
  CHECK(found("the bus stopped", "stop", v) == "stopped");            // doubling
  CHECK(found("stopping now", "stop", v) == "stopping");
  CHECK(found("she is making tea", "make", v) == "making");           // e dropped
  CHECK(found("she baked bread", "bake", v) == "baked");              // e + d
  CHECK(found("he carried it", "carry", v) == "carried");             // y -> ied
  CHECK(found("he watches it", "watch", v) == "watches");
  CHECK(found("a bigger house", "big", a) == "bigger");
  CHECK(found("the happiest day", "happy", a) == "happiest");
  CHECK(found("three mice", "mouse", n) == "mice");                   // exception lists
  CHECK(found("they went home", "go", v) == "went");
  CHECK(show(find_lemma("three mice", "mouse", n)) == "none");        // none without them
  CHECK(found("he went home", "go", n) == "<none>");                  // verb forms only
  CHECK(found("concatenate", "cat", n) == "<none>");                  // word boundaries
  CHECK(found("a scat singer", "cat", n) == "<none>");
  CHECK(found("the catalogue", "cat", n) == "<none>");
  CHECK(found("cat-like eyes", "cat", n) == "cat");
  CHECK(found("\xc3\xa9" "cat", "cat", n) == "<none>");                // a non-ASCII letter
  CHECK(found("A CAT and a cat", "cat", n) == "CAT");                 // case, first match
  CHECK(found("Paris in spring", "paris", n) == "Paris");
  CHECK(found("she looked up the word", "look up", v) == "looked up");  // phrases
  CHECK(found("an ice-cream cone", "ice cream", n) == "ice-cream");
  CHECK(found("ice   cream", "ice cream", n) == "ice   cream");
  CHECK(found("an ice creamery", "ice cream", n) == "<none>");
  CHECK(found("icecream", "ice cream", n) == "<none>");
  CHECK(found("two bains marie", "bain marie", n) == "bains marie");
  CHECK(found("the St. Louis arch", "St. Louis", n) == "St. Louis");
  const LemmaPattern any = LemmaPattern::any_pos("stop", &m);
  CHECK(show(any.find("bus stops and stopping")) == "[4, 9)");
}

TEST_CASE("text tasks: word-in-context pairs from WordNet (skipped without /usr/share/wordnet)" *
          doctest::skip(!wordnet_present())) {
  const WordNet& wn = real_wordnet();
  const std::array<WicSplit, 3> splits = build_wic(wn);
  std::array<std::set<std::string>, 3> lemmas, sentences;
  Failures labels, spans, caps, shared;
  for (size_t s = 0; s < 3; ++s) {
    const WicSplit& split = splits[s];
    INFO("split ", split_name(split.split));
    CHECK(split.split == Split(int(s)));
    int64_t positives = 0;
    std::map<std::string, std::array<int, 2>> per_lemma;
    for (const WicExample& x : split.examples) {
      positives += x.label;
      labels.check(x.label == int(x.synset1 == x.synset2), "label ", x.label, " for synsets ",
                   x.synset1, " and ", x.synset2);
      lemmas[s].insert(x.lemma + "/" + pos_letter(x.pos));
      ++per_lemma[x.lemma + "/" + pos_letter(x.pos)][size_t(x.label)];
      for (auto [sentence, span] : {std::pair{&x.sentence1, x.span1}, {&x.sentence2, x.span2}}) {
        sentences[s].insert(key(*sentence));
        const auto found = find_lemma(*sentence, x.lemma, x.pos, &wn.morphology);
        spans.check(found && span == *found, "the span [", span.begin, ", ", span.end, ") of '",
                    x.lemma, "' in '", *sentence, "' holds '", span_text(*sentence, span),
                    "', the lemma is at ", found ? found->begin : 0);
      }
    }
    CHECK(split.examples.size() > (s == 0 ? 5000u : 500u));
    CHECK(2 * positives == int64_t(split.examples.size()));
    for (const auto& [lemma, counts] : per_lemma)
      caps.check(counts[0] <= 2 && counts[1] <= 2, lemma, " has ", counts[1], " + ", counts[0]);
  }
  CHECK_NONE(labels);
  CHECK_NONE(spans);
  CHECK_NONE(caps);
  for (size_t s = 0; s < 3; ++s)
    for (size_t t = s + 1; t < 3; ++t) {
      for (const std::string& l : lemmas[s]) shared.check(!lemmas[t].count(l), "lemma ", l);
      for (const std::string& x : sentences[s])
        shared.check(!sentences[t].count(x), "sentence ", x);
    }
  CHECK_NONE(shared);
  // The same seed gives the same pairs; the seed decides the splits.
  const auto again = build_wic(wn);
  Failures same;
  for (size_t s = 0; s < 3; ++s) {
    REQUIRE(again[s].examples.size() == splits[s].examples.size());
    for (size_t i = 0; i < splits[s].examples.size(); ++i) {
      const WicExample &x = splits[s].examples[i], &y = again[s].examples[i];
      same.check(x.sentence1 == y.sentence1 && x.sentence2 == y.sentence2 && x.label == y.label,
                 split_name(Split(int(s))), " pair ", i, " differs");
    }
  }
  CHECK_NONE(same);
  int moved = 0;
  for (const char* l : {"bank", "run", "cat", "light", "play", "set", "head", "line"})
    moved += split_of(l, PartOfSpeech::noun, 1) != split_of(l, PartOfSpeech::noun, 7);
  CHECK(moved > 0);
}

TEST_CASE("text tasks: span questions over long contexts from WordNet (skipped without WordNet "
          "or the model's vocab.txt)" *
          doctest::skip(!span_inputs_present())) {
  const WordNet& wn = real_wordnet();
  const BertTokenizer tokenizer = BertTokenizer::load(pretrained_vocab());
  SpanOptions options;
  options.max_examples = {40, 20, 20};
  const std::array<SpanSplit, 3> splits = build_span_task(wn, tokenizer, options);
  std::unordered_map<std::string, const Synset*> by_id;
  for (const Synset& s : wn.synsets) by_id[s.id()] = &s;
  std::array<std::set<std::string>, 3> ids, lemmas;
  int64_t late_answers = 0;
  Failures spans, lengths, questions, holders, others, shared;
  for (size_t s = 0; s < 3; ++s) {
    INFO("split ", split_name(splits[s].split));
    REQUIRE(int64_t(splits[s].examples.size()) == options.max_examples[s]);
    for (const SpanExample& x : splits[s].examples) {
      const std::string q = "question " + x.id + " (" + x.question + "): ";
      ids[s].insert(x.id), lemmas[s].insert(x.lemma + "/" + pos_letter(x.pos));
      REQUIRE_MESSAGE((x.answer.begin < x.answer.end && x.answer.end <= x.context.size()), q,
                      "the answer [", x.answer.begin, ", ", x.answer.end, ") is not in the ",
                      x.context.size(), " bytes of the context");
      const std::string text = span_text(x.context, x.answer);
      spans.check(text == x.answer_text && show(find_lemma(text, x.lemma, x.pos, &wn.morphology)) ==
                                               show(Span{0, text.size()}),
                  q, "the answer [", x.answer.begin, ", ", x.answer.end, ") holds '", text,
                  "', which is not a form of '", x.lemma, "' (answer_text '", x.answer_text, "')");
      late_answers += 2 * x.answer.begin > x.context.size();
      const int64_t pieces = int64_t(tokenizer.encode(x.context).size());
      lengths.check(x.context_pieces == pieces && pieces >= options.target_pieces &&
                        pieces <= options.target_pieces + options.tolerance,
                    q, "the context has ", pieces, " pieces, says ", x.context_pieces);
      // The synset's one example holds the answer; the rest of the passage holds no example
      // and no lemma of the synset.
      const Synset& synset = *by_id.at(x.id);
      questions.check(x.question == synset.definition(), q, "the definition is ",
                      synset.definition());
      int holding = 0;
      std::string rest;
      for (const std::string& e : synset.examples) {
        const size_t at = x.context.find(e);
        if (at == std::string::npos || at > x.answer.begin || at + e.size() < x.answer.end)
          continue;
        ++holding;
        rest = x.context.substr(0, at) + " | " + x.context.substr(at + e.size());
      }
      holders.check(holding == 1, q, holding, " examples of the synset hold the answer in ",
                    x.context);
      for (const std::string& e : synset.examples)
        others.check(rest.find(e) == std::string::npos, q, "another example '", e, "' in ", rest);
      for (const std::string& l : synset.lemmas)
        others.check(!LemmaPattern::any_pos(l, &wn.morphology).find(rest), q, "the lemma '", l,
                     "' outside the answer's example: ", rest);
    }
  }
  CHECK_NONE(spans);
  CHECK_NONE(lengths);
  CHECK_NONE(questions);
  CHECK_NONE(holders);
  CHECK_NONE(others);
  CHECK(late_answers > 10);  // answers are not all at the start
  for (size_t s = 0; s < 3; ++s)
    for (size_t t = s + 1; t < 3; ++t) {
      for (const std::string& id : ids[s]) shared.check(!ids[t].count(id), "synset ", id);
      for (const std::string& l : lemmas[s]) shared.check(!lemmas[t].count(l), "lemma ", l);
    }
  CHECK_NONE(shared);
}

TEST_CASE("text tasks: JSON-lines files round trip, refuse to overwrite, name bad fields") {
  TempDir dir;
  const std::vector<WicExample> wic = {
      {"bank", PartOfSpeech::noun, "the river bank", "a bank loan", {10, 14}, {2, 6},
       "09213565-n", "08420278-n", 0},
      {"run", PartOfSpeech::verb, "she runs \"fast\"", "run home", {4, 8}, {0, 3}, "1-v", "1-v",
       1}};
  write_wic_jsonl(dir.file("wic.jsonl"), wic);
  const std::vector<WicExample> back = read_wic_jsonl(dir.file("wic.jsonl"));
  REQUIRE(back.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const WicExample &x = wic[i], &y = back[i];
    CHECK((x.lemma == y.lemma && x.pos == y.pos && x.sentence1 == y.sentence1 &&
           x.sentence2 == y.sentence2 && x.span1 == y.span1 && x.span2 == y.span2 &&
           x.synset1 == y.synset1 && x.synset2 == y.synset2 && x.label == y.label));
  }
  CHECK_ERROR(write_wic_jsonl(dir.file("wic.jsonl"), {}), "wic.jsonl exists", "overwrite");
  CHECK(read_wic_jsonl(dir.file("wic.jsonl")).size() == 2);  // untouched
  write_wic_jsonl(dir.file("wic.jsonl"), {wic[1]}, /*overwrite=*/true);
  CHECK(read_wic_jsonl(dir.file("wic.jsonl")).size() == 1);
  CHECK(dir.list() == std::vector<std::string>{"wic.jsonl"});  // no temporary file left

  const std::vector<SpanExample> spans = {
      {"00001000-n", "feline mammal", "dogs bark. the cats sat", {15, 19}, "cats", "cat",
       PartOfSpeech::noun, 7}};
  write_span_jsonl(dir.file("span.jsonl"), spans);
  const std::vector<SpanExample> sback = read_span_jsonl(dir.file("span.jsonl"));
  REQUIRE(sback.size() == 1);
  CHECK((sback[0].id == spans[0].id && sback[0].question == spans[0].question &&
         sback[0].context == spans[0].context && sback[0].answer == spans[0].answer &&
         sback[0].answer_text == "cats" && sback[0].lemma == "cat" &&
         sback[0].pos == PartOfSpeech::noun && sback[0].context_pieces == 7));

  const std::string good = R"({"lemma":"run","pos":"v","sentence1":"run","start1":0,"end1":3,)"
                           R"("synset1":"a","sentence2":"ran","start2":0,"end2":3,"synset2":"a",)";
  auto wic_error = [&](const std::string& line2) {
    write_text(dir.file("bad.jsonl"), good + "\"label\":1}\n" + line2 + "\n");
    return clustr::test::error_of([&] { read_wic_jsonl(dir.file("bad.jsonl")); });
  };
  CHECK_HAS(wic_error(good + "\"label\":2}"), "bad.jsonl:2", "field \"label\"",
              "in [0, 1], got 2");
  CHECK_HAS(wic_error(good + "\"lab\":1}"), "bad.jsonl:2", "\"label\" is missing");
  CHECK_HAS(wic_error(good + "\"label\":\"1\"}"), "bad.jsonl:2",
              "\"label\" should be an integer");
  CHECK_HAS(wic_error(good + "\"label\":1"), "bad.jsonl:2", "expected a JSON object");
  CHECK_HAS(wic_error("[1]"), "bad.jsonl:2", "expected a JSON object");
  std::string past_end = good + "\"label\":1}";
  past_end.replace(past_end.find("\"end2\":3"), 8, "\"end2\":4");
  CHECK_HAS(wic_error(past_end), "bad.jsonl:2", "field \"end2\"", "in [0, 3], got 4");
  write_text(dir.file("bad.jsonl"),
             R"({"id":"x","question":"q","context":"the cats","answer_start":4,"answer_end":8,)"
             R"("answer":"cat","lemma":"cat","pos":"n","context_pieces":2})" "\n");
  CHECK_ERROR(read_span_jsonl(dir.file("bad.jsonl")), "bad.jsonl:1", "field \"answer\" (cat)");
  CHECK_ERROR(read_wic_jsonl(dir.file("missing.jsonl")), "missing.jsonl", "does not exist");
}

TEST_CASE("text tasks: accuracy, exact match and F1 as SQuAD's script computes them") {
  CHECK(accuracy({1, 0, 1, 1}, {1, 1, 1, 0}) == doctest::Approx(0.5));
  CHECK_ERROR(accuracy({1}, {1, 0}), "as many predictions as labels");
  CHECK(squad_normalize("  The Cat's, hat! An  apple a day ") == "cats hat apple day");
  CHECK(squad_exact_match("The cat.", {"cat"}) == 1.0);
  CHECK(squad_exact_match("a cat", {"dog", "the  cat!"}) == 1.0);
  CHECK(squad_exact_match("cats", {"cat"}) == 0.0);
  // "the cat cat sat" -> {cat: 2, sat: 1}; "cat sat sat" -> {cat: 1, sat: 2}; common 1 + 1 = 2;
  // P = R = 2/3, F1 = 2/3 (counting each predicted word that the answer has would say 3 / 3).
  CHECK(squad_f1("the cat cat sat", {"cat sat sat"}) == doctest::Approx(2.0 / 3));
  // {cat: 2} and {cat: 1}: common 1, P = 1/2, R = 1, F1 = 2/3 (sets of words would say 1).
  CHECK(squad_f1("cat cat", {"cat"}) == doctest::Approx(2.0 / 3));
  // P = 1/1, R = 1/4: F1 = 2 * 1/4 / (5/4) = 0.4.
  CHECK(squad_f1("Cat", {"the cat sat on a mat."}) == doctest::Approx(0.4));
  CHECK(squad_f1("dog", {"cat sat", "a dog!"}) == doctest::Approx(1.0));  // the best answer
  CHECK(squad_f1("", {"cat"}) == 0.0);
  CHECK(squad_f1("cat", {""}) == 0.0);
  CHECK(squad_f1("", {""}) == 1.0);
  CHECK(squad_f1("the, a", {"."}) == 1.0);  // both empty after normalisation
  CHECK(squad_exact_match("", {""}) == 1.0);
  CHECK_ERROR(squad_f1("cat", {}), "at least one answer");
}
