// The pronunciation dictionary reader (data/lexicon.h: Festival's and CMUdict's layouts) and
// the transcript normaliser on arbitrary bytes.
#include <cstdint>
#include <string>

#include "data/lexicon.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string path = clustr::fuzz::write_file("lexicon.txt", text);
  clustr::fuzz::expect_clear_errors([&] {
    const clustr::Lexicon lexicon = clustr::Lexicon::read(path);
    for (const std::string& w : clustr::transcript_words(text.substr(0, 256)))
      if (const auto* phones = lexicon.find(w))
        for (const std::string& p : *phones)
          if (p.empty()) __builtin_trap();  // an empty phone
  });
  return 0;
}

// The seed inputs (--make-seeds=DIR); the ordinary suite runs them through the target too.
void clustr_fuzz_seeds(const std::string& dir) {
  clustr::fuzz::write_seed(dir, "cmudict",
                           ";;; a comment\nA  AH0\nDOG  D AO1 G\nDOG(2)  D AA1 G\n");
  clustr::fuzz::write_seed(dir, "festival",
                           "MNCL\n(\"hello\" nil (((hh ah) 0) ((l ow) 1)))\n"
                           "(\"a\" dt (((ah) 0)))\n");
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  clustr::fuzz::make_seeds_if_asked(*argc, *argv, clustr_fuzz_seeds);
  return 0;
}
