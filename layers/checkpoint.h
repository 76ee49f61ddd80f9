// Checkpoints: a model's parameters, optional extra tensors (optimizer moments) and the state a
// run needs to resume exactly (step, run config, generator state), in one safetensors file
// (core/safetensors.h), so PyTorch tooling can read it too.
//
// What a checkpoint file holds:
//   <parameter name>         every parameter of the model under its dotted name
//                            ("layers.0.attention.query.weight"), with its shape and dtype
//   optimizer.<anything>     extra tensors the caller supplies (e.g. "optimizer.<param>.m");
//                            every extra name must start with kCheckpointExtrasPrefix
//   __metadata__             "format" = "clustr-checkpoint", "format_version" = "1",
//                            "step" (decimal), "config.<key>" for each entry of the run config,
//                            and, when a generator state is saved, "rng.seed" and "rng.offset"
//                            (decimal)
//
// Loading validates everything before it touches the model: a file that does not match throws
// one clustr::Error listing every problem (missing, unexpected, wrong shape, wrong dtype) by
// name, and leaves every parameter as it was.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "layers/module.h"

namespace clustr {

// Names of extra tensors start with this; anything else in a file that is not a parameter of
// the model is unexpected.
inline constexpr const char* kCheckpointExtrasPrefix = "optimizer.";
inline constexpr const char* kCheckpointFormat = "clustr-checkpoint";
inline constexpr int kCheckpointFormatVersion = 1;  // the only version this build reads

// A Generator's position: Generator::set_state(seed, offset) continues from it exactly.
struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;

  static GeneratorState of(const Generator& g) { return {g.seed(), g.offset()}; }
  void restore(Generator& g) const { g.set_state(seed, offset); }
};

// What is saved beside the parameters.
struct CheckpointState {
  int64_t step = 0;                           // >= 0: optimizer steps taken so far
  std::map<std::string, std::string> config;  // the run's settings (e.g. its flags)
  // Extra tensors (any device; saved from a host copy), each named kCheckpointExtrasPrefix + ...
  std::vector<std::pair<std::string, Tensor>> extras;
  std::optional<GeneratorState> rng;  // e.g. GeneratorState::of(gen)
};

// Writes the checkpoint atomically (a temporary file renamed over `path`; see
// save_safetensors). Throws clustr::Error, leaving any existing file untouched, when the step
// is negative, a config key is empty, an extra's name lacks the prefix or equals a parameter's
// name, or the write fails.
void save_checkpoint(const std::string& path, const Module& model, const CheckpointState& state);

struct CheckpointLoadOptions {
  // strict (the default): every parameter of the model must be in the file and every tensor of
  // the file must be a parameter or an extra. Not strict: missing parameters keep their values
  // and unexpected tensors are ignored; both are listed in the result. Shape and dtype
  // mismatches are errors either way.
  bool strict = true;
};

// What load_checkpoint read besides the parameters (which it copied into the model).
struct LoadedCheckpoint {
  std::string path;
  int64_t step = 0;
  std::map<std::string, std::string> config;    // the "config.<key>" entries, prefix removed
  std::map<std::string, std::string> metadata;  // every metadata entry as stored
  std::map<std::string, Tensor> extras;         // by full name ("optimizer.w.m"), on the cpu
  std::optional<GeneratorState> rng;            // absent when none was saved
  std::vector<std::string> missing;             // not strict only: parameters the file lacked
  std::vector<std::string> unexpected;          // not strict only: tensors that were ignored

  // rng->restore(gen); throws clustr::Error naming the file when no state was saved.
  void restore_generator(Generator& gen) const;
};

// Reads a checkpoint written by save_checkpoint and copies its parameters into `model` (with
// Tensor::copy_from, so parameters on cuda stay there). Throws clustr::Error, with the model
// unchanged, when the file is unreadable or malformed (load_safetensors' message), is not a
// clustr checkpoint of a supported version, has malformed step or rng metadata, or does not
// match the model; a mismatch error lists every problem, one per line.
LoadedCheckpoint load_checkpoint(const std::string& path, Module& model,
                                 const CheckpointLoadOptions& options = {});

// The run config of a checkpoint (LoadedCheckpoint::config) without a model, e.g. to build the
// model it describes before loading it. Throws clustr::Error when the file is unreadable or not
// a clustr checkpoint of a supported version.
std::map<std::string, std::string> read_checkpoint_config(const std::string& path);
// The number `config` holds under `key`; throws clustr::Error naming `file` and the key.
double config_number(const std::map<std::string, std::string>& config, const char* key,
                     const std::string& file);

}  // namespace clustr
