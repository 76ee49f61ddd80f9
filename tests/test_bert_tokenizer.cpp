// BERT's WordPiece tokenizer (data/bert_tokenizer.h): id for id against Hugging Face's tokenizers
// 0.22.1 on the fixture that tests/fixtures/make_bert_tokenizer_fixture.py writes (2,650 lines
// of Debian text: copyright and README files, WordNet glosses, fortunes, message translations
// in many scripts; hand-written odd cases, code points, random mixtures; and pairs with
// truncation), and each step of the algorithm on a small hand-made vocabulary, with the errors
// of bad text and bad vocabulary files.
//
// The fixture tests need the model's vocab.txt (data/prepare_pretrained.py writes it; the folder
// is CLUSTR_PRETRAINED_DIR in the environment, else the build's default); without it they are
// skipped (ctest reports them as not run). The others always run.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/bert_tokenizer.h"
#include "pretrained.h"

#ifndef CLUSTR_FIXTURE_DIR
#error "CLUSTR_FIXTURE_DIR must name the folder of the reference fixtures (tests/CMakeLists.txt)"
#endif

using namespace clustr;

namespace {

using Ids = std::vector<int32_t>;
using Pieces = std::vector<std::string>;

std::string pretrained_vocab() { return clustr::test::pretrained_dir() + "/vocab.txt"; }

bool vocab_present() { return clustr::test::pretrained_has("vocab.txt"); }

const std::string kText = std::string(CLUSTR_FIXTURE_DIR) + "/text/";

// The lines of a file, split at '\n' only (a sample line may hold \r or U+2028).
std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  const std::string all{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::vector<std::string> lines;
  for (size_t start = 0; start < all.size();) {
    const size_t stop = all.find('\n', start);
    REQUIRE_MESSAGE(stop != std::string::npos, path, " does not end with a newline");
    lines.push_back(all.substr(start, stop - start));
    start = stop + 1;
  }
  return lines;
}

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

// The sample file's escapes: "\\" is a backslash, "\u{HEX}" a code point.
std::string unescape(const std::string& line) {
  std::string out;
  for (size_t i = 0; i < line.size(); ++i) {
    if (line[i] != '\\') {
      out += line[i];
    } else if (line.compare(i, 2, "\\\\") == 0) {
      out += '\\';
      ++i;
    } else {
      const size_t close = line.find('}', i);
      REQUIRE_MESSAGE((line.compare(i, 3, "\\u{") == 0 && close != std::string::npos),
                      "bad escape in sample line: ", line);
      append_utf8(out, uint32_t(std::stoul(line.substr(i + 3, close - i - 3), nullptr, 16)));
      i = close;
    }
  }
  return out;
}

Ids parse_ids(const std::string& s) {
  Ids ids;
  std::istringstream in(s);
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

// "7592 1010 (hello ,)": ids and their pieces, for failure messages.
std::string show(const BertTokenizer& tok, const Ids& ids) {
  std::string s, p;
  for (const int32_t id : ids) {
    s += (s.empty() ? "" : " ") + std::to_string(id);
    p += (p.empty() ? "" : " ") + (id >= 0 && id < tok.size() ? tok.piece(id) : "?");
  }
  return s + " (" + p + ")";
}

// What `f` throws as clustr::Error ("" when it does not throw).
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define CHECK_ERROR_HAS(expr, ...)                                                     \
  do {                                                                                 \
    const std::string message_ = error_of([&] { (void)(expr); });                      \
    CHECK_MESSAGE(!message_.empty(), #expr " did not throw clustr::Error");            \
    for (const std::string part_ : {__VA_ARGS__})                                      \
      CHECK_MESSAGE(message_.find(part_) != std::string::npos, "message '", message_, \
                    "' lacks '", part_, "'");                                          \
  } while (0)

// A small vocabulary: the five specials first (ids 0-4), then pieces chosen for the cases below.
BertTokenizer tiny(bool lower_case = true) {
  return BertTokenizer({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able",
                        "a", "##b", "ab", "abc", "##c", "##bc", "##bcd", "hello", "world", ",",
                        "!", "[", "]", "cafe", "naive", "angstrom", "x", "##x", "中", "文",
                        "i", "##y", "y", "σ", "##σ", "ο", "##ο", "##δ", "Café"},
                       lower_case, "tiny");
}

std::string temp_file(const std::string& name, const std::string& content) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("clustr_test_bert_tokenizer_" + name)).string();
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

}  // namespace

TEST_CASE("bert tokenizer: the fixture's files agree with each other") {
  const auto sample = read_lines(kText + "bert_tokenizer_sample.txt");
  const auto ids = read_lines(kText + "bert_tokenizer_ids.txt");
  CHECK(sample.size() >= 2000);  // a sample that shrank by accident
  CHECK(sample.size() == ids.size());
  for (const std::string& line : sample) CHECK_NOTHROW(unescape(line));
}

TEST_CASE("bert tokenizer: every fixture line gives the reference's ids (skipped without the "
          "prepared model)" * doctest::skip(!vocab_present())) {
  const BertTokenizer tok = BertTokenizer::load(pretrained_vocab());
  REQUIRE(tok.size() == 30522);
  CHECK(tok.pad_id() == 0);
  CHECK(tok.unk_id() == 100);
  CHECK(tok.cls_id() == 101);
  CHECK(tok.sep_id() == 102);
  CHECK(tok.mask_id() == 103);

  const auto sample = read_lines(kText + "bert_tokenizer_sample.txt");
  const auto expected = read_lines(kText + "bert_tokenizer_ids.txt");
  REQUIRE(sample.size() == expected.size());
  size_t bad = 0, ids = 0;
  for (size_t k = 0; k < sample.size(); ++k) {
    const Ids want = parse_ids(expected[k]);
    const Ids got = tok.encode(unescape(sample[k]));
    ids += want.size();
    if (got == want) continue;
    if (++bad <= 10)
      FAIL_CHECK("bert_tokenizer_sample.txt line " << k + 1 << ": " << sample[k]
                 << "\n  expected " << show(tok, want) << "\n  got      " << show(tok, got));
  }
  MESSAGE(sample.size(), " lines, ", ids, " ids compared");
  CHECK_MESSAGE(bad == 0, bad, " of ", sample.size(), " lines differ (the first 10 are above)");
}

TEST_CASE("bert tokenizer: pairs with [CLS]/[SEP], type ids and longest-first truncation as the "
          "reference (skipped without the prepared model)" * doctest::skip(!vocab_present())) {
  const BertTokenizer tok = BertTokenizer::load(pretrained_vocab());
  const auto sample = read_lines(kText + "bert_tokenizer_sample.txt");
  const auto cases = read_lines(kText + "bert_tokenizer_pairs.txt");
  REQUIRE(cases.size() > 100);
  for (size_t k = 1; k < cases.size(); ++k) {  // line 1 is the header
    const std::string& c = cases[k];
    const size_t bar1 = c.find(" | "), bar2 = c.find(" | ", bar1 + 3);
    REQUIRE((bar1 != std::string::npos && bar2 != std::string::npos));
    std::istringstream head(c.substr(0, bar1));
    size_t a = 0;
    std::string b;
    int max_length = 0;
    head >> a >> b >> max_length;
    REQUIRE((a >= 1 && a <= sample.size()));
    const std::string text_a = unescape(sample[a - 1]);
    std::string text_b;
    if (b != "-") text_b = unescape(sample[std::stoul(b) - 1]);
    const BertEncoding e = tok.encode(text_a, b == "-" ? nullptr : &text_b, max_length);
    const Ids want_ids = parse_ids(c.substr(bar1 + 3, bar2 - bar1 - 3));
    const Ids want_types = parse_ids(c.substr(bar2 + 3));
    CHECK_MESSAGE(e.ids == want_ids, "bert_tokenizer_pairs.txt line ", k + 1, " (", a, " ", b,
                  " ", max_length, ")\n  expected ", show(tok, want_ids), "\n  got      ",
                  show(tok, e.ids));
    CHECK_MESSAGE(e.type_ids == want_types, "bert_tokenizer_pairs.txt line ", k + 1);
  }
}

TEST_CASE("bert tokenizer: greedy longest match, ## continuations, [UNK] for a whole word") {
  const BertTokenizer tok = tiny();
  CHECK(tok.tokenize("unaffable") == Pieces{"un", "##aff", "##able"});
  CHECK(tok.tokenize("abcbc") == Pieces{"abc", "##bc"});  // the longest first piece, not ab
  // Greedy takes "abc" and then finds no "##d": the whole word is [UNK], although a + ##bcd
  // would cover it.
  CHECK(tok.tokenize("abcd") == Pieces{"[UNK]"});
  CHECK(tok.tokenize("hello qqq world") == Pieces{"hello", "[UNK]", "world"});
  CHECK(tok.encode("hello world") == Ids{15, 16});
  CHECK(tok.tokenize("##b") == Pieces{"[UNK]", "[UNK]", "[UNK]"});  // '#' is punctuation
}

TEST_CASE("bert tokenizer: a word of more than 100 characters is [UNK]") {
  const BertTokenizer tok = tiny();
  const Pieces hundred = tok.tokenize(std::string(100, 'x'));
  REQUIRE(hundred.size() == 100);
  CHECK(hundred.front() == "x");
  CHECK(hundred.back() == "##x");
  CHECK(tok.tokenize(std::string(101, 'x')) == Pieces{"[UNK]"});
  CHECK(tok.tokenize(std::string(101, 'x') + " x") == Pieces{"[UNK]", "x"});
  // Counted in characters after normalisation: 100 "X" + U+0301 lose their accents.
  std::string accented;
  for (int i = 0; i < 100; ++i) accented += "X\xcc\x81";
  CHECK(tok.tokenize(accented).size() == 100);
}

TEST_CASE("bert tokenizer: empty, whitespace-only and control characters") {
  const BertTokenizer tok = tiny();
  CHECK(tok.tokenize("").empty());
  // ' ' \t \r \n U+00A0 U+3000 U+2028
  CHECK(tok.tokenize(" \t\r\n \xc2\xa0 \xe3\x80\x80 \xe2\x80\xa8").empty());
  CHECK(tok.tokenize(std::string("hel\0lo", 6)) == Pieces{"hello"});
  CHECK(tok.tokenize("hel\x01lo\x7f") == Pieces{"hello"});
  CHECK(tok.tokenize("he\xe2\x80\x8bllo") == Pieces{"hello"});        // U+200B zero-width space
  CHECK(tok.tokenize("\xef\xbb\xbfhello\xef\xbf\xbd") == Pieces{"hello"});  // U+FEFF, U+FFFD
  CHECK(tok.tokenize("hel\xc2\x85lo") == Pieces{"hello"});  // U+0085 is Cc: dropped, not a space
  CHECK(tok.tokenize("hello\tworld\rhello") == Pieces{"hello", "world", "hello"});
}

TEST_CASE("bert tokenizer: CJK ideographs and punctuation become words of their own") {
  const BertTokenizer tok = tiny();
  CHECK(tok.tokenize("中文") == Pieces{"中", "文"});
  CHECK(tok.tokenize("x中x") == Pieces{"x", "中", "x"});
  // U+2B820 is outside the reference's CJK ranges: no spaces around it.
  CHECK(tok.normalize("a\xf0\xab\xa0\xa0" "b") == "a\xf0\xab\xa0\xa0" "b");
  CHECK(tok.tokenize("hello,world!") == Pieces{"hello", ",", "world", "!"});
  CHECK(tok.tokenize("hello\xe2\x80\x94world") == Pieces{"hello", "[UNK]", "world"});  // U+2014
  CHECK(tok.tokenize("a$b") == Pieces{"a", "[UNK]", "[UNK]"});  // ASCII symbols split too
}

TEST_CASE("bert tokenizer: accents stripped and lower case, or neither for a cased model") {
  const BertTokenizer tok = tiny();
  CHECK(tok.normalize("Caf\xc3\xa9 NA\xc3\x8fVE \xc3\x85ngstr\xc3\xb6m") == "cafe naive angstrom");
  CHECK(tok.tokenize("Caf\xc3\xa9 nai\xcc\x88ve") == Pieces{"cafe", "naive"});  // é, i + U+0308
  CHECK(tok.normalize("\xce\x9f\xce\x94\xce\x9f\xce\xa3") == "\xce\xbf\xce\xb4\xce\xbf\xcf\x83");
  CHECK(tok.normalize("\xc4\xb0y") == "iy");  // İ: NFD gives I + U+0307, the mark goes
  const BertTokenizer cased = tiny(false);
  CHECK(cased.normalize("Caf\xc3\xa9") == "Caf\xc3\xa9");
  CHECK(cased.tokenize("Caf\xc3\xa9 cafe") == Pieces{"Café", "cafe"});
}

TEST_CASE("bert tokenizer: special pieces written in the text") {
  const BertTokenizer tok = tiny();
  CHECK(tok.tokenize("a[SEP]ab") == Pieces{"a", "[SEP]", "ab"});
  CHECK(tok.encode("[CLS][MASK]") == Ids{2, 4});
  CHECK(tok.tokenize("[sep]") == Pieces{"[", "[UNK]", "]"});  // case-sensitive
  CHECK(tok.tokenize("[SEP") == Pieces{"[", "[UNK]"});
}

TEST_CASE("bert tokenizer: [CLS] a [SEP] b [SEP], type ids and longest-first truncation") {
  const BertTokenizer tok = tiny();
  const std::string a = "hello world hello world hello", b = "x x x";  // 5 and 3 ids
  const BertEncoding whole = tok.encode(a, &b, 100);
  CHECK(whole.ids == Ids{2, 15, 16, 15, 16, 15, 3, 24, 24, 24, 3});
  CHECK(whole.type_ids == Ids{0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1});
  // Budget 9 - 3 = 6 = 2 * 3: the shorter b stays whole, a keeps 3.
  CHECK(tok.encode(a, &b, 9).ids == Ids{2, 15, 16, 15, 3, 24, 24, 24, 3});
  // Budget 5 < 2 * 3: each keeps 2, the longer a one more (5 is odd).
  CHECK(tok.encode(a, &b, 8).ids == Ids{2, 15, 16, 15, 3, 24, 24, 3});
  // A tie gives the odd extra to b.
  const std::string c = "hello world hello";
  CHECK(tok.encode(c, &b, 8).ids == Ids{2, 15, 16, 3, 24, 24, 24, 3});
  CHECK(tok.encode(a, nullptr, 4).ids == Ids{2, 15, 16, 3});
  CHECK(tok.encode(a, nullptr, 4).type_ids == Ids{0, 0, 0, 0});
  CHECK(tok.encode(a, &b, 3).ids == Ids{2, 3, 3});
  CHECK_ERROR_HAS(tok.encode(a, &b, 2), "max_length 2", "at least 3");
  CHECK_ERROR_HAS(tok.encode(a, nullptr, 1), "max_length 1", "at least 2");
}

TEST_CASE("bert tokenizer: text that is not UTF-8 throws naming the byte") {
  const BertTokenizer tok = tiny();
  CHECK_ERROR_HAS(tok.encode("abc\xff"), "not valid UTF-8", "byte 3", "0xff");
  CHECK_ERROR_HAS(tok.tokenize("ab\xc3"), "byte 2", "0xc3");                   // cut short
  CHECK_ERROR_HAS(tok.encode("\xc0\xaf"), "byte 0");                           // overlong '/'
  CHECK_ERROR_HAS(tok.encode("x\xed\xa0\x80"), "byte 1");                      // a surrogate
  CHECK_ERROR_HAS(tok.encode("ok \xf4\x90\x80\x80"), "byte 3");                // past U+10FFFF
  CHECK_ERROR_HAS(tok.normalize("\x80"), "byte 0");
  CHECK_ERROR_HAS(tok.encode("[SEP]\xe4\xb8"), "byte 5");
}

TEST_CASE("bert tokenizer: lookups and the vocabulary's errors") {
  const BertTokenizer tok = tiny();
  CHECK(tok.size() == 37);
  CHECK(tok.id("##aff") == 6);
  CHECK(tok.id("nope") == -1);
  CHECK(tok.piece(5) == "un");
  CHECK_ERROR_HAS(tok.piece(37), "id 37", "[0, 37)");
  CHECK_ERROR_HAS(tok.piece(-1), "id -1");

  CHECK_ERROR_HAS(BertTokenizer::load("/nonexistent/vocab.txt"), "/nonexistent/vocab.txt",
                  "cannot open");
  CHECK_ERROR_HAS(BertTokenizer::load(std::filesystem::temp_directory_path().string()),
                  "is a folder");
  CHECK_ERROR_HAS(BertTokenizer::load(temp_file("empty.txt", "")), "empty.txt", "no pieces");
  CHECK_ERROR_HAS(BertTokenizer::load(temp_file("dup.txt", "[PAD]\nab\n[UNK]\n[CLS]\nab\n")),
                  "dup.txt", "'ab'", "line 2", "line 5");
  CHECK_ERROR_HAS(BertTokenizer::load(temp_file("blank.txt", "[PAD]\n[UNK]\n\n[CLS]\n")),
                  "line 3", "empty");
  CHECK_ERROR_HAS(BertTokenizer::load(temp_file("nocls.txt", "[PAD]\n[UNK]\n[SEP]\n")),
                  "nocls.txt", "[CLS]");
  CHECK_ERROR_HAS(BertTokenizer::load(temp_file("bad.txt", "[PAD]\n[UNK]\na\xff\n")), "line 3",
                  "UTF-8");
  CHECK_ERROR_HAS(BertTokenizer(std::vector<std::string>{}), "no pieces");

  // CRLF line ends, no final newline, no [MASK] (allowed: mask_id() is -1).
  const BertTokenizer crlf =
      BertTokenizer::load(temp_file("crlf.txt", "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\nhello"));
  CHECK(crlf.size() == 5);
  CHECK(crlf.mask_id() == -1);
  CHECK(crlf.encode("Hello [MASK]") == Ids{4, 1, 1, 1});  // [MASK] is text here: [ mask ]
}
