// The checkpoint loader (layers/checkpoint.h) on arbitrary bytes, strict and not strict, into a
// small model (two linear layers, "0.weight" (3, 4) ...), and the config reader. The seeds are
// checkpoints of that model (--make-seeds), so that mutations reach the metadata and name
// checks.
#include <cstdint>
#include <memory>
#include <string>

#include "core/random.h"
#include "fuzz_input.h"
#include "safetensors_mutator.h"  // its custom mutator, half the mutations
#include "layers/checkpoint.h"
#include "layers/linear.h"
#include "layers/module.h"

namespace {

std::unique_ptr<clustr::ModuleList<clustr::Linear>> small_model() {
  clustr::Generator gen(1);
  auto m = std::make_unique<clustr::ModuleList<clustr::Linear>>();
  m->push_back(std::make_shared<clustr::Linear>(4, 3, true, gen));
  m->push_back(std::make_shared<clustr::Linear>(3, 2, false, gen));
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = clustr::fuzz::write_file(
      "input.safetensors", std::string(reinterpret_cast<const char*>(data), size));
  for (bool strict : {true, false})
    clustr::fuzz::expect_clear_errors([&] {
      auto model = small_model();
      clustr::CheckpointLoadOptions options;
      options.strict = strict;
      const clustr::LoadedCheckpoint c = clustr::load_checkpoint(path, *model, options);
      clustr::Generator gen(2);
      if (c.rng) c.restore_generator(gen);
    });
  clustr::fuzz::expect_clear_errors([&] { (void)clustr::read_checkpoint_config(path); });
  return 0;
}

// The seed inputs (--make-seeds=DIR); the ordinary suite runs them through the target too.
void clustr_fuzz_seeds(const std::string& dir) {
  auto model = small_model();
  clustr::CheckpointState state;
  state.step = 7;
  state.config = {{"lr", "0.001"}, {"layers", "2"}};
  clustr::Generator gen(3);
  state.rng = clustr::GeneratorState::of(gen);
  clustr::save_checkpoint(dir + "/full.safetensors", *model, state);
  clustr::save_checkpoint(dir + "/plain.safetensors", *model, clustr::CheckpointState{});
}

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  clustr::fuzz::make_seeds_if_asked(*argc, *argv, clustr_fuzz_seeds);
  return 0;
}
