// The ordinary suite's side of the fuzz targets: each target's code, built by the suite's
// compiler (and in the sanitizer build under ASan + UBSan), run over its seed inputs and over
// the inputs that fuzzing once found to crash it (tests/fuzz/regressions/<target>/, each kept
// after its fix). A crash, a sanitizer report or an exception other than clustr::Error fails
// the test, as it would a fuzzing run.
//
//   fuzz_replay TARGET [DIR ...]   the target's seeds, then every file in each DIR
//
// tests/CMakeLists.txt compiles every target's source into this one program, renaming each
// target's entry points (fuzz_one_<target>, fuzz_seeds_<target>), and writes the list of
// targets this build has into fuzz_targets.h (CLUSTR_FUZZ_TABLE).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz_targets.h"

#define CLUSTR_FUZZ_DECLARE(t)                                         \
  extern "C" int fuzz_one_##t(const uint8_t* data, size_t size); \
  void fuzz_seeds_##t(const std::string& dir);
CLUSTR_FUZZ_TABLE(CLUSTR_FUZZ_DECLARE)

namespace {

struct Target {
  const char* name;
  int (*one)(const uint8_t*, size_t);
  void (*seeds)(const std::string&);
};

#define CLUSTR_FUZZ_ENTRY(t) {#t, fuzz_one_##t, fuzz_seeds_##t},
const Target kTargets[] = {CLUSTR_FUZZ_TABLE(CLUSTR_FUZZ_ENTRY)};

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file()) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const Target* target = nullptr;
  for (const Target& t : kTargets)
    if (argc > 1 && std::strcmp(argv[1], t.name) == 0) target = &t;
  if (!target) {
    std::fprintf(stderr, "usage: fuzz_replay TARGET [DIR ...]; targets:");
    for (const Target& t : kTargets) std::fprintf(stderr, " %s", t.name);
    std::fprintf(stderr, "\n");
    return 2;
  }
  const std::filesystem::path seeds = std::filesystem::temp_directory_path() /
                                      ("clustr-fuzz-seeds-" + std::to_string(::getpid()));
  std::filesystem::remove_all(seeds);
  std::filesystem::create_directories(seeds);
  target->seeds(seeds.string());
  std::vector<std::string> inputs = files_in(seeds.string());
  const size_t seed_count = inputs.size();
  for (int i = 2; i < argc; ++i) {
    const std::vector<std::string> more = files_in(argv[i]);
    inputs.insert(inputs.end(), more.begin(), more.end());
  }
  for (const std::string& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    const std::string s = bytes.str();
    std::printf("%s: %s (%zu bytes)\n", target->name, path.c_str(), s.size());
    std::fflush(stdout);
    target->one(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  std::filesystem::remove_all(seeds);
  std::printf("%s: %zu seed and %zu regression inputs passed\n", target->name, seed_count,
              inputs.size() - seed_count);
  return seed_count == 0 ? 1 : 0;  // a target without seeds would check nothing
}
