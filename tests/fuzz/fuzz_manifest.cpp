// The speech app's token table and manifest readers (data/manifest.h) on arbitrary bytes: the
// input's first line-delimited part up to a NUL byte is tokens.txt, the rest the manifest (read
// with bad lines failing and skipping, audio paths not checked). The first byte picks which.
#include <cstdint>
#include <string>

#include "data/manifest.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t cut = input.find('\0');
  const std::string tokens_text = cut == std::string::npos ? input : input.substr(0, cut);
  const std::string manifest_text = cut == std::string::npos ? "" : input.substr(cut + 1);
  const std::string tokens_path = clustr::fuzz::write_file("tokens.txt", tokens_text);
  const std::string manifest_path = clustr::fuzz::write_file("train.tsv", manifest_text);
  clustr::fuzz::expect_clear_errors([&] {
    const clustr::TokenTable tokens = clustr::read_tokens(tokens_path);
    for (clustr::BadLines mode : {clustr::BadLines::fail, clustr::BadLines::skip})
      clustr::fuzz::expect_clear_errors([&] {
        clustr::ManifestOptions options;
        options.bad_lines = mode;
        options.check_files = false;
        const clustr::Manifest m = clustr::read_manifest(manifest_path, tokens, options);
        for (const clustr::Utterance& u : m.utterances)
          for (int32_t l : u.labels)
            if (l <= 0 || l >= tokens.size()) __builtin_trap();  // a label outside the table
        (void)m.summary();
      });
  });
  return 0;
}

// The seed inputs (--make-seeds=DIR); the ordinary suite runs them through the target too.
void clustr_fuzz_seeds(const std::string& dir) {
  clustr::fuzz::write_seed(dir, "good", std::string("<blank>\nHH\nAH\nL\nOW\n", 20) +
                           std::string(1, '\0') +
                           "u1\twav/u1.wav\t3.415\tHH AH L OW\nu2\t/abs/u2.wav\t0.5\tOW\r\n\n");
  clustr::fuzz::write_seed(dir, "bad", std::string("<blank>\na\na\n") + std::string(1, '\0') +
                           "x\ty.wav\t-1\ta\nx\ty.wav\tnan\tb\n\t\t\t\n");
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  clustr::fuzz::make_seeds_if_asked(*argc, *argv, clustr_fuzz_seeds);
  return 0;
}
