// The text app's readers (ICU builds) on arbitrary bytes. The first byte picks the reader; the
// rest, cut at the first NUL byte, gives its inputs:
//   0: a WordPiece vocabulary (vocab.txt, part 1) and a text (part 2) tokenized, alone and as
//      the second text of a pair cut to a length the second byte sets;
//   1: a BERT config.json (BertConfig::read);
//   2: the word-in-context task's JSON lines; 3: the span task's.
#include <cstdint>
#include <string>
#include <fstream>
#include <sstream>
#include <tuple>
#include <vector>

#include "data/bert_tokenizer.h"
#include "data/text_tasks.h"
#include "fuzz_input.h"
#include "layers/bert.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int reader = data[0] % 4;
  const int max_length = data[1] % 64;
  const std::string rest(reinterpret_cast<const char*>(data) + 2, size - 2);
  const size_t cut = rest.find('\0');
  const std::string first = rest.substr(0, cut);
  const std::string second = cut == std::string::npos ? "" : rest.substr(cut + 1);
  clustr::fuzz::expect_clear_errors([&] {
    if (reader == 0) {
      const clustr::BertTokenizer tok =
          clustr::BertTokenizer::load(clustr::fuzz::write_file("vocab.txt", first), data[1] & 64);
      for (int32_t id : tok.encode(second))
        if (id < 0 || id >= tok.size()) __builtin_trap();
      const std::string a = "a pair's first text";
      const clustr::BertEncoding e = tok.encode(a, &second, max_length);
      if (static_cast<int>(e.ids.size()) > max_length || e.ids.size() != e.type_ids.size())
        __builtin_trap();
    } else if (reader == 1) {
      (void)clustr::BertConfig::read(clustr::fuzz::write_file("config.json", rest));
    } else if (reader == 2) {
      for (const clustr::WicExample& e :
           clustr::read_wic_jsonl(clustr::fuzz::write_file("wic.jsonl", rest)))
        (void)e.sentence1.substr(e.span1.begin, e.span1.end - e.span1.begin);
    } else {
      for (const clustr::SpanExample& e :
           clustr::read_span_jsonl(clustr::fuzz::write_file("span.jsonl", rest)))
        (void)e.context.substr(e.answer.begin, e.answer.end - e.answer.begin);
    }
  });
  return 0;
}

// The seed inputs (--make-seeds=DIR); the ordinary suite runs them through the target too.
void clustr_fuzz_seeds(const std::string& dir) {
  const std::string nul(1, '\0');
  clustr::fuzz::write_seed(dir, "tokenizer", std::string("\0\x20", 2) +
                           "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nun\n##aff\n##able\nhello\n,\n" +
                           nul +
                               "Unaffable, HELLO h\xC3\xA9llo \xE4\xB8\xAD\xE6\x96\x87 \x01 world");
  clustr::fuzz::write_seed(dir, "config", std::string("\1\0", 2) + clustr::BertConfig{}.to_json());
  clustr::WicExample w;
  w.lemma = "bank";
  w.sentence1 = "the bank of the river";
  w.sentence2 = "a bank loan";
  w.span1 = {4, 8};
  w.span2 = {2, 6};
  w.synset1 = "09213565-n";
  w.synset2 = "08420278-n";
  const std::string wic = clustr::fuzz::work_dir() + "/seed-wic.jsonl";
  clustr::write_wic_jsonl(wic, {w}, true);
  clustr::SpanExample x;
  x.id = "00964781-n";
  x.question = "fighting; acts of overt warfare";
  x.context = "the outbreak of hostilities was sudden";
  x.answer = {16, 27};
  x.answer_text = "hostilities";
  x.lemma = "hostilities";
  x.context_pieces = 7;
  const std::string span = clustr::fuzz::work_dir() + "/seed-span.jsonl";
  clustr::write_span_jsonl(span, {x}, true);
  using Seed = std::tuple<const char*, std::string, char>;
  for (const auto& [name, path, reader] : {Seed{"wic", wic, 2}, Seed{"span", span, 3}}) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    clustr::fuzz::write_seed(dir, name,
                             std::string(1, reader) + std::string(1, '\0') + bytes.str());
  }
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  clustr::fuzz::make_seeds_if_asked(*argc, *argv, clustr_fuzz_seeds);
  return 0;
}
