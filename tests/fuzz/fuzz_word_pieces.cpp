// The word-piece model wrapper (data/word_pieces.h, a SentencePiece model file) on arbitrary
// bytes; a model it accepts encodes and decodes a sentence.
#include <cstdint>
#include <string>
#include <vector>

#include "data/word_pieces.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = clustr::fuzz::write_file(
      "pieces.model", std::string(reinterpret_cast<const char*>(data), size));
  clustr::fuzz::expect_clear_errors([&] {
    const clustr::WordPieces w = clustr::WordPieces::load(path);
    const auto ids = w.encode_ids("the quick brown fox");
    for (int32_t id : ids)
      if (id < 0 || id >= w.size()) __builtin_trap();
    (void)w.decode(ids);
    (void)w.pieces();
    clustr::fuzz::expect_clear_errors([&] { (void)w.encode("hello world"); });
  });
  return 0;
}

// The seed inputs (--make-seeds=DIR); the ordinary suite runs them through the target too.
void clustr_fuzz_seeds(const std::string& dir) {
  std::vector<std::string> sentences;
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "again",
                         "and", "then", "sleeps", "under", "a", "warm", "blanket"};
  for (int i = 0; i < 300; ++i)
    sentences.push_back(std::string(words[i % 16]) + " " + words[(i * 7) % 16] + " " +
                        words[(i * 5 + 3) % 16]);
  clustr::WordPieces::train(sentences, 40).save(dir + "/plain.model");
  clustr::WordPieceOptions o;
  o.normalization = "nmt_nfkc_cf";
  o.control_symbols = {"[PAD]", "[CLS]", "[SEP]", "[MASK]"};
  clustr::WordPieces::train(sentences, 44, o).save(dir + "/specials.model");
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  clustr::fuzz::make_seeds_if_asked(*argc, *argv, clustr_fuzz_seeds);
  return 0;
}
