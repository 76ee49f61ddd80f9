// The settings every training app shares, declared once (apps/common/flag_table.h): the encoder
// (EncoderOptions, the base of each app's ModelOptions), the optimizer, clipping, schedule, seed
// and stopping rules (TrainingOptions, the base of each app's TrainOptions), the machine
// (threads, device, TF32) and the output folder. Each app adds its own (the copy task's task
// and held-out sets, the speech app's data and frame stacking) in its options.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/flag_table.h"
#include "core/precision.h"
#include "layers/attention/config.h"

namespace clustr {

struct EncoderOptions {
  int layers = 2;
  int heads = 4;
  int head_dim = 32;      // E; the model width is D = heads * head_dim
  int feedforward = 256;  // F
  float dropout = 0.0f;
  bool pre_norm = false;  // post-norm (the paper's form) unless set
  AttentionConfig attention;
  // The matrix products' precision (core/precision.h): fp32, or bf16 operands with f32 sums.
  // The weights, the optimizer and everything else stay f32 either way.
  Precision precision = Precision::fp32;

  int64_t dim() const { return int64_t(heads) * head_dim; }
};

struct TrainingOptions {
  float lr = 1e-3f;
  std::string optimizer = "adam";  // radam | adam | adamw | sgd (where the app has it)
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = false;  // AdamW-style decay for adam/radam (adamw always is)
  float momentum = 0.0f;                // sgd only
  float clip = 1.0f;                    // max global gradient norm; 0 = no clipping
  std::string lr_schedule = "warmup";   // constant | warmup | plateau
  int64_t warmup = 100;                 // linear warm-up steps (warmup, plateau); 0 = none
  double plateau_factor = 0.5;
  int64_t plateau_patience = 2;  // evaluations without improvement before lowering the lr
  double plateau_threshold = 1e-4;
  int64_t plateau_cooldown = 0;
  double min_lr = 0.0;
  uint64_t seed = 1;
  double time_limit = 0.0;         // seconds of training before stopping; 0 = no limit
  int64_t max_skipped_steps = 10;  // non-finite steps in a row before the run stops
};

struct MachineOptions {
  int threads = 0;             // 0: OpenMP's default
  std::string device = "cpu";  // cpu | cuda
  bool tf32 = false;           // --device cuda: TF32 tensor cores for the f32 products
  std::string cuda_graphs = "on";  // --device cuda: on (where the step allows) | off
};

// The value of --preset in argv ("cpu" when absent), read before the flags are defined so that
// the preset supplies their defaults.
std::string find_preset(int argc, const char* const* argv);
// Sets the settings of preset `name` (its "name=value ..." text in `presets`) on a table;
// throws naming the presets there are for another name.
void apply_preset(FlagTable& t, const std::string& name,
                  const std::vector<std::pair<std::string, std::string>>& presets);
// Options (with a `preset` member) set to preset `name`, through its app's settings_table.
template <class Options>
Options preset_of(const std::string& name,
                  const std::vector<std::pair<std::string, std::string>>& presets) {
  Options o;
  o.preset = name;
  FlagTable t = settings_table(o);
  apply_preset(t, name, presets);
  return o;
}

// The stored settings of `o`, through its app's settings_table(Options&) (found by
// argument-dependent lookup): as (flag name, value) in declaration order (the configuration
// table), as a map (a checkpoint's config), and the keys with a resume rule.
template <class Options>
std::vector<std::pair<std::string, std::string>> config_entries(const Options& o) {
  Options copy = o;
  return settings_table(copy).entries();
}
template <class Options>
std::map<std::string, std::string> to_config(const Options& o) {
  Options copy = o;
  return settings_table(copy).config();
}
template <class Options>
std::vector<std::string> resume_keys(Resume rule) {
  Options o;
  return settings_table(o).keys(rule);
}

// --attention (unless `with_type` is false), --clusters, --topk, --bits, --iterations,
// --rounds, --buckets, --chunk: part of the model (Resume::locked; a model evaluates with other
// values, given on the command line).
void add_attention_settings(FlagTable& t, AttentionConfig& a, bool with_type = true);
// The attention a trained model is evaluated with: the checkpoint's (`trained`), with the type
// and each parameter that the command line gave (`given_flag("--clusters")`, ...) taken from
// `given`; validated.
AttentionConfig override_attention(const AttentionConfig& trained, const AttentionConfig& given,
                                   const std::function<bool(const std::string&)>& given_flag);
// --layers ... --pre-norm, --precision, then the attention's (locked; dropout and precision
// may change on resume).
void add_encoder_settings(FlagTable& t, EncoderOptions& m, const std::string& dropout_help);
// --lr, --optimizer (one of `optimizers`), --weight-decay, --decoupled-weight-decay,
// --momentum, --clip, --lr-schedule, --warmup, --plateau-*, --min-lr. `evaluation` names when
// the plateau schedule looks at the loss ("evaluations", "epochs").
void add_optimizer_settings(FlagTable& t, TrainingOptions& o,
                            const std::vector<std::string>& optimizers,
                            const std::string& evaluation);
// --seed, --time-limit, --max-skipped-steps.
void add_run_settings(FlagTable& t, TrainingOptions& o, const std::string& seed_help);
// --threads, --device, --tf32 (with its check that the run is on the GPU).
void add_machine_settings(FlagTable& t, MachineOptions& m);
// --out (stored) and --overwrite (not stored).
void add_out_settings(FlagTable& t, std::string& out, bool& overwrite,
                      const std::string& default_folder, const std::string& what);

}  // namespace clustr
