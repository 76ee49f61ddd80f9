// What the fuzz targets share (tests/fuzz/README in scripts/fuzz.sh's header): the input as a
// file, as several files, or as a folder, each in a place of its own per process, and the rule
// every target checks: a reader given bad bytes throws clustr::Error (a clear error naming what
// and where) or succeeds. Any other exception escapes the target, and libFuzzer reports it as a
// crash (an uncaught exception aborts), as it does a sanitizer report, a leak or a timeout.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

// Each target's seed maker (its LLVMFuzzerInitialize calls it for --make-seeds=DIR). The
// ordinary suite's replay program (replay_main.cpp) renames it per target, as it does the entry
// points, and calls it too.
void clustr_fuzz_seeds(const std::string& dir);

namespace clustr::fuzz {

// A folder of this process's own under the system's temporary folder, made once; targets
// write their files there (libFuzzer's -fork and -jobs run several processes).
inline const std::string& work_dir() {
  static const std::string dir = [] {
    const std::filesystem::path d = std::filesystem::temp_directory_path() /
                                    ("clustr-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d.string();
  }();
  return dir;
}

// Writes `bytes` to `name` in the work folder (or below it: parents are made) and returns its
// path.
inline std::string write_file(const std::string& name, const std::string& bytes) {
  const std::filesystem::path p = std::filesystem::path(work_dir()) / name;
  std::filesystem::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p.string();
}

// An empty folder `name` in the work folder (what an earlier input left there removed).
inline std::string fresh_dir(const std::string& name) {
  const std::filesystem::path p = std::filesystem::path(work_dir()) / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

// Runs f; a clustr::Error is the expected answer to bad input and is swallowed.
template <class F>
void expect_clear_errors(F&& f) {
  try {
    f();
  } catch (const clustr::Error&) {
  }
}

// `target --make-seeds=DIR` (libFuzzer leaves flags that start with "--" to the target): calls
// make(DIR), which writes the target's seed inputs there, and exits. scripts/fuzz.sh makes
// each target's seed corpus this way, from the same code and data as the tests, so that no
// binary seed is kept in the repository.
inline void make_seeds_if_asked(int argc, char** argv, void (*make)(const std::string&)) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--make-seeds=", 13) == 0) {
      const std::string dir = argv[i] + 13;
      std::filesystem::create_directories(dir);
      try {
        make(dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "--make-seeds: %s\n", e.what());
        std::exit(1);
      }
      std::exit(0);
    }
}

// Writes `bytes` to dir/name (a seed).
inline void write_seed(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::ofstream out(std::filesystem::path(dir) / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace clustr::fuzz
