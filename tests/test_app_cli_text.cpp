// The text app (apps/text.cpp) run as a user runs it: `text embed` with the pretrained
// all-MiniLM-L6-v2 (the folder data/prepare_pretrained.py writes; without it every case but the
// one that needs no model is skipped, and ctest reports them as not run).
//
// The similarity 0.755 of the first two sentences below is the value sentence-transformers'
// documentation gives for this model and these sentences (0.7553); printed to three decimals,
// clustr's must be the same.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app_cli.h"
#include "check.h"
#include "core/safetensors.h"

#ifndef CLUSTR_APP_TEXT
#error "CLUSTR_APP_TEXT must name the text app's executable (tests/CMakeLists.txt)"
#endif

using clustr::test::AppRun;
using clustr::test::run_app;

namespace {

std::string pretrained_dir() {
  const char* env = std::getenv("CLUSTR_PRETRAINED_DIR");
  return env && *env ? env : CLUSTR_PRETRAINED_DIR;
}

bool pretrained_present() {
  return std::filesystem::exists(pretrained_dir() + "/model.safetensors");
}

const std::vector<std::string> kSentences = {"A man is eating food.",
                                             "A man is eating a piece of bread.",
                                             "The girl is carrying a baby."};

AppRun text(std::vector<std::string> args) {
  args.insert(args.begin(), CLUSTR_APP_TEXT);
  return run_app(args);
}

std::vector<std::string> embed_args(std::vector<std::string> extra) {
  std::vector<std::string> args = {"embed", "--model", pretrained_dir()};
  args.insert(args.end(), kSentences.begin(), kSentences.end());
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::string temp_dir() {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / "clustr_test_app_cli_text";
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace

TEST_CASE("text cli: embed prints the pretrained model's cosine similarities" *
          doctest::skip(!pretrained_present())) {
  const AppRun r = text(embed_args({}));
  CHECK_STATUS(r, 0);
  CHECK_OUTPUT_HAS(r, "6 layers, D 384, 12 heads, 22713216 parameters, vocabulary 30522");
  CHECK_OUTPUT_MATCHES(r, "\\[ 0\\]  1\\.000  0\\.755 -0\\.105  A man is eating food\\.");
  CHECK_OUTPUT_MATCHES(r, "\\[ 1\\]  0\\.755  1\\.000 -0\\.061  A man is eating a piece");
}

TEST_CASE("text cli: improved-clustered with 25 clusters equals full on short sentences, "
          "clustered with 2 clusters does not" *
          doctest::skip(!pretrained_present())) {
  // No sentence has more than 25 tokens: every query is its own cluster, and improved-clustered
  // attention computes each query's top-k keys exactly (k = 32 covers all keys).
  const AppRun same = text(embed_args({"--compare-with", "improved-clustered"}));
  CHECK_STATUS(same, 0);
  CHECK_OUTPUT_HAS(same, "improved-clustered against full: mean cosine 1.0000, lowest 1.0000");
  const AppRun fewer = text(embed_args({"--attention", "clustered", "--clusters", "2",
                                        "--compare-with", "full"}));
  CHECK_STATUS(fewer, 0);
  CHECK_OUTPUT_MATCHES(fewer, "full against clustered: mean cosine 0\\.9[0-8][0-9]+, lowest "
                              "0\\.9[0-9]+ over 3 sentences");
}

TEST_CASE("text cli: --out writes the embeddings, and an existing file is kept unless "
          "--overwrite" *
          doctest::skip(!pretrained_present())) {
  const std::string out = temp_dir() + "/embeddings.safetensors";
  std::filesystem::remove(out);
  const AppRun first = text(embed_args({"--out", out}));
  CHECK_STATUS(first, 0);
  CHECK_OUTPUT_HAS(first, "embeddings (3, 384)");
  const clustr::SafetensorsFile f = clustr::load_safetensors(out);
  CHECK(f.get("embeddings").shape() == clustr::Shape{3, 384});
  CHECK(f.meta("sentence.1") == kSentences[1]);
  const auto written = std::filesystem::last_write_time(out);
  const AppRun again = text(embed_args({"--out", out}));
  CHECK_STATUS(again, 1);
  CHECK_OUTPUT_HAS(again, "--overwrite");
  CHECK(std::filesystem::last_write_time(out) == written);
  CHECK_STATUS(text(embed_args({"--out", out, "--overwrite"})), 0);
}

TEST_CASE("text cli: sentences from a file, and a line that is not UTF-8 named by its line" *
          doctest::skip(!pretrained_present())) {
  const std::string file = temp_dir() + "/sentences.txt";
  clustr::test::write_text(file, "A man is eating food.\r\nA man is eating a piece of bread.\n");
  const AppRun r = text({"embed", "--model", pretrained_dir(), "--file", file});
  CHECK_STATUS(r, 0);
  CHECK_OUTPUT_MATCHES(r, "\\[ 0\\]  1\\.000  0\\.755  A man is eating food\\.");
  clustr::test::write_text(file, "fine\nnot \xff fine\n");
  CHECK_FAILS_WITH(text({"embed", "--model", pretrained_dir(), "--file", file}),
                   "sentences.txt line 2: BertTokenizer::encode: the text is not valid UTF-8 "
                   "at byte 4 (0xff)");
}

#ifdef CLUSTR_APP_CLI_CUDA_EMULATION
TEST_CASE("text cli: the pretrained model on the emulated device prints the cpu's "
          "similarities" *
          doctest::skip(!pretrained_present())) {
  const AppRun r = text(embed_args({"--device", "cuda"}));
  CHECK_STATUS(r, 0);
  CHECK_OUTPUT_HAS(r, "device cuda");
  CHECK_OUTPUT_MATCHES(r, "\\[ 0\\]  1\\.000  0\\.755 -0\\.105  A man is eating food\\.");
  CHECK_OUTPUT_MATCHES(r, "\\[ 2\\] -0\\.105 -0\\.061  1\\.000  The girl");
}
#endif

TEST_CASE("text cli: bad input is refused with a clear error") {
  CHECK_FAILS_WITH(text({"embed", "--model", temp_dir() + "/absent", "x"}),
                   "no pretrained model folder");
  CHECK_FAILS_WITH(text({"embed", "--model", temp_dir() + "/absent"}), "no sentences");
  CHECK_FAILS_WITH(text({"embed", "--batch", "0", "x"}), "--batch must be >= 1, got 0");
  CHECK_FAILS_WITH(text({"embed", "--file", temp_dir() + "/absent.txt"}), "--file: cannot open");
  CHECK_FAILS_WITH(text({"embed", "--attention", "bogus", "x"}), "bogus");
}
