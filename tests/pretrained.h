// Where the text tests find the pretrained model (data/prepare_pretrained.py writes it) and
// WordNet (Debian's wordnet-base). Tests that need them are decorated with
// doctest::skip(!pretrained_has("...")), and ctest reports them as not run where the files are
// absent (tests/CMakeLists.txt: clustr_pretrained_test).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#ifndef CLUSTR_PRETRAINED_DIR
#error "CLUSTR_PRETRAINED_DIR must name the default folder of the pretrained model"
#endif

namespace clustr::test {

// CLUSTR_PRETRAINED_DIR from the environment, else the build's default (models/ in the tree).
inline std::string pretrained_dir() {
  const char* env = std::getenv("CLUSTR_PRETRAINED_DIR");
  return env && *env ? env : CLUSTR_PRETRAINED_DIR;
}

// Whether the pretrained model's folder holds `file` (e.g. "vocab.txt").
inline bool pretrained_has(const std::string& file) {
  return std::filesystem::exists(pretrained_dir() + "/" + file);
}

inline const char* wordnet_dir() { return "/usr/share/wordnet"; }
inline bool wordnet_present() {
  return std::filesystem::exists(std::string(wordnet_dir()) + "/data.noun");
}

}  // namespace clustr::test
