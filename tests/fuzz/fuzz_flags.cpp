// The apps' flag parsing and presets on argument vectors from arbitrary bytes: the first byte
// picks the copy task or the speech app's train command; the rest, cut at NUL bytes, is the
// argument vector (at most 32 arguments), parsed as the apps parse theirs (parse_flags). A parse
// error is CLI11's (it prints the flag and what it expected) or clustr::Error naming the
// argument; the settings that parse are then validated (clustr::Error naming the flag) and
// turned into a checkpoint's config and back.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "apps/common/settings.h"
#include "apps/common/flags.h"
#include "apps/copy_task/options.h"
#include "fuzz_input.h"
#if CLUSTR_FUZZ_SPEECH
#include "apps/speech/options.h"
#endif

namespace {

template <class Options, class AddFlags, class Validate>
void parse(const std::vector<const char*>& argv, Options o, AddFlags add_flags, Validate validate) {
  CLI::App app{"fuzz"};
  add_flags(app, o);
  try {
    clustr::parse_flags(app, static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError&) {
    return;
  }
  clustr::check_integer_flags(app);
  validate(o);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::vector<std::string> args = {"app"};
  args.emplace_back();
  for (size_t i = 1; i < size && args.size() <= 33; ++i) {
    if (data[i] == 0)
      args.emplace_back();
    else
      args.back() += static_cast<char>(data[i]);
  }
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  clustr::fuzz::expect_clear_errors([&] {
    const std::string preset = clustr::find_preset(static_cast<int>(argv.size()), argv.data());
    if (data[0] % 2 == 0) {
      parse(argv, clustr::copy::preset_options(preset),
            [](CLI::App& app, clustr::copy::RunOptions& o) { clustr::copy::add_flags(app, o); },
            [](const clustr::copy::RunOptions& o) {
              clustr::copy::validate(o);
              clustr::copy::RunOptions back = clustr::copy::preset_options("cpu");
              clustr::copy::apply_checkpoint_config(clustr::to_config(o), back);
            });
    } else {
#if CLUSTR_FUZZ_SPEECH
      parse(argv, clustr::speech::preset_options(preset),
            [](CLI::App& app, clustr::speech::RunOptions& o) {
              clustr::speech::add_train_flags(app, o);
            },
            [](const clustr::speech::RunOptions& o) {
              clustr::speech::validate(o);
              (void)clustr::speech::model_from_config(clustr::to_config(o));
            });
#endif
    }
  });
  return 0;
}

// The seed inputs (--make-seeds=DIR); the ordinary suite runs them through the target too.
void clustr_fuzz_seeds(const std::string& dir) {
  const std::string nul(1, '\0');
  clustr::fuzz::write_seed(dir, "copy", std::string(1, '\0') + "--steps" + nul + "10" + nul +
                           "--attention" + nul + "clustered" + nul + "--clusters=3");
  clustr::fuzz::write_seed(dir, "copy-preset", std::string(1, '\0') + "--preset" + nul + "paper" +
                           nul + "--lr" + nul + "1e-3" + nul + "--length" + nul + "-5");
  clustr::fuzz::write_seed(dir, "speech", std::string(1, '\1') + "--data" + nul + "corpus" + nul +
                           "--epochs" + nul + "2" + nul + "--attention" + nul +
                               "improved-clustered");
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  clustr::fuzz::make_seeds_if_asked(*argc, *argv, clustr_fuzz_seeds);
  return 0;
}
