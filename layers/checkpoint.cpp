// Checkpoints (layers/checkpoint.h) on top of the safetensors reader and atomic writer: this
// file only decides what goes into the file and checks what comes out of it.
#include "layers/checkpoint.h"

#include <charconv>
#include <cstdlib>
#include <set>

#include "core/error.h"
#include "core/safetensors.h"

namespace clustr {

namespace {

constexpr const char* kConfigPrefix = "config.";

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// "checkpoint: <path>: <what>"
template <typename... Args>
[[noreturn]] void fail(const std::string& path, const Args&... what) {
  throw Error(detail::cat("checkpoint: ", path, ": ", what...));
}

// One error for many problems: a summary line, then one indented line per problem.
[[noreturn]] void fail_all(const std::string& path, const std::string& summary,
                           const std::vector<std::string>& problems) {
  std::string msg = detail::cat("checkpoint: ", path, ": ", summary, " (", problems.size(),
                                problems.size() == 1 ? " problem):" : " problems):");
  for (const std::string& p : problems) msg += "\n  " + p;
  throw Error(msg);
}

// A decimal number with nothing around it (no sign, no spaces); nullopt otherwise or on overflow.
template <typename T>
std::optional<T> parse_decimal(const std::string& s) {
  if (s.empty() || s[0] < '0' || s[0] > '9') return std::nullopt;
  T v{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// Reads the decimal value of metadata `key` into `out`; a problem line when it is malformed.
template <typename T>
void read_number(const std::map<std::string, std::string>& meta, const std::string& key,
                 const char* what, std::optional<T>& out, std::vector<std::string>& problems) {
  auto it = meta.find(key);
  if (it == meta.end()) return;
  out = parse_decimal<T>(it->second);
  if (!out)
    problems.push_back(detail::cat("metadata '", key, "' is \"", it->second, "\", not ", what));
}

}  // namespace

void save_checkpoint(const std::string& path, const Module& model, const CheckpointState& state) {
  if (state.step < 0) fail(path, "cannot save a negative step (", state.step, ")");

  std::vector<std::pair<std::string, Tensor>> tensors;
  std::set<std::string> param_names;
  for (const auto& [name, p] : model.named_parameters()) {
    param_names.insert(name);
    tensors.emplace_back(name, p.data());
  }

  std::vector<std::string> problems;
  for (const auto& [name, t] : state.extras) {
    if (!starts_with(name, kCheckpointExtrasPrefix))
      problems.push_back(detail::cat("extra tensor '", name, "' does not start with \"",
                                     kCheckpointExtrasPrefix, "\""));
    else if (param_names.count(name))
      problems.push_back(
          detail::cat("extra tensor '", name, "' has the name of a parameter of the model"));
    tensors.emplace_back(name, t);
  }
  if (!problems.empty()) fail_all(path, "cannot save these extra tensors", problems);

  std::map<std::string, std::string> metadata;
  metadata["format"] = kCheckpointFormat;
  metadata["format_version"] = std::to_string(kCheckpointFormatVersion);
  metadata["step"] = std::to_string(state.step);
  for (const auto& [key, value] : state.config) {
    if (key.empty()) fail(path, "cannot save a config entry with an empty key");
    metadata[kConfigPrefix + key] = value;
  }
  if (state.rng) {
    metadata["rng.seed"] = std::to_string(state.rng->seed);
    metadata["rng.offset"] = std::to_string(state.rng->offset);
  }
  save_safetensors(path, tensors, metadata);
}

void LoadedCheckpoint::restore_generator(Generator& gen) const {
  if (!rng) fail(path, "has no generator state (no \"rng.seed\" and \"rng.offset\" metadata)");
  rng->restore(gen);
}

namespace {

// A file that is not a checkpoint of this version: its tensors cannot be interpreted, so
// listing them as missing or unexpected would only bury the real problem.
void check_format(const std::string& path, const SafetensorsFile& file) {
  auto format = file.metadata.find("format");
  if (format == file.metadata.end() || format->second != kCheckpointFormat)
    fail(path, "not a clustr checkpoint (metadata \"format\" is ",
         format == file.metadata.end() ? std::string("absent") : "\"" + format->second + "\"",
         ", expected \"", kCheckpointFormat, "\")");
  auto version = file.metadata.find("format_version");
  const std::string expected_version = std::to_string(kCheckpointFormatVersion);
  if (version == file.metadata.end() || version->second != expected_version)
    fail(path, "unsupported checkpoint format_version ",
         version == file.metadata.end() ? std::string("(absent)") : "\"" + version->second + "\"",
         "; this build reads version ", expected_version);
}

std::map<std::string, std::string> config_of(const SafetensorsFile& file) {
  std::map<std::string, std::string> config;
  for (const auto& [key, value] : file.metadata)
    if (starts_with(key, kConfigPrefix))
      config[key.substr(std::char_traits<char>::length(kConfigPrefix))] = value;
  return config;
}

}  // namespace

std::map<std::string, std::string> read_checkpoint_config(const std::string& path) {
  const SafetensorsFile file = load_safetensors(path);
  check_format(path, file);
  return config_of(file);
}

double config_number(const std::map<std::string, std::string>& config, const char* key,
                     const std::string& file) {
  auto it = config.find(key);
  CLUSTR_CHECK(it != config.end(), file, " lacks config entry '", key, "'");
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  CLUSTR_CHECK(!it->second.empty() && *end == '\0', file, ": config entry '", key, "' is \"",
               it->second, "\", not a number");
  return v;
}

LoadedCheckpoint load_checkpoint(const std::string& path, Module& model,
                                 const CheckpointLoadOptions& options) {
  SafetensorsFile file = load_safetensors(path);
  check_format(path, file);

  LoadedCheckpoint out;
  out.path = path;
  out.metadata = file.metadata;
  std::vector<std::string> problems;

  std::optional<int64_t> step;
  read_number(file.metadata, "step", "a non-negative integer", step, problems);
  if (!file.metadata.count("step")) problems.push_back("metadata 'step' is absent");
  out.step = step.value_or(0);

  std::optional<uint64_t> seed, offset;
  read_number(file.metadata, "rng.seed", "an unsigned 64-bit integer", seed, problems);
  read_number(file.metadata, "rng.offset", "an unsigned 64-bit integer", offset, problems);
  const bool has_seed = file.metadata.count("rng.seed"),
             has_offset = file.metadata.count("rng.offset");
  if (has_seed != has_offset)
    problems.push_back(detail::cat("metadata '", has_seed ? "rng.seed" : "rng.offset",
                                   "' is present without '", has_seed ? "rng.offset" : "rng.seed",
                                   "'"));
  if (seed && offset) out.rng = GeneratorState{*seed, *offset};

  out.config = config_of(file);

  // Validate every parameter before copying any.
  const auto params = model.named_parameters();
  std::vector<std::pair<Tensor, const Tensor*>> copies;  // (parameter, file tensor)
  std::set<std::string> param_names;
  for (const auto& [name, p] : params) {
    param_names.insert(name);
    const Tensor& dst = p.data();
    auto it = file.tensors.find(name);
    if (it == file.tensors.end()) {
      if (options.strict)
        problems.push_back(detail::cat("missing tensor '", name, "' (the model has ",
                                       to_string(dst.dtype()), " ", to_string(dst.shape()), ")"));
      else
        out.missing.push_back(name);
      continue;
    }
    const Tensor& src = it->second;
    bool ok = true;
    if (src.shape() != dst.shape()) {
      problems.push_back(detail::cat("tensor '", name, "' has the wrong shape: expected ",
                                     to_string(dst.shape()), ", found ", to_string(src.shape())));
      ok = false;
    }
    if (src.dtype() != dst.dtype()) {
      problems.push_back(detail::cat("tensor '", name, "' has the wrong dtype: expected ",
                                     to_string(dst.dtype()), ", found ", to_string(src.dtype())));
      ok = false;
    }
    if (ok) copies.emplace_back(dst, &src);
  }
  for (const auto& [name, t] : file.tensors) {
    if (param_names.count(name)) continue;
    if (starts_with(name, kCheckpointExtrasPrefix)) {
      out.extras.emplace(name, t);
    } else if (options.strict) {
      problems.push_back(detail::cat(
          "unexpected tensor '", name, "' (", to_string(t.dtype()), " ", to_string(t.shape()),
          "; neither a parameter of the model nor an extra named \"", kCheckpointExtrasPrefix,
          "...\")"));
    } else {
      out.unexpected.push_back(name);
    }
  }
  if (!problems.empty()) fail_all(path, "cannot be loaded into this model", problems);

  for (auto& [dst, src] : copies) dst.copy_from(*src);
  return out;
}

}  // namespace clustr
