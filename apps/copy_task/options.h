// Every setting of a masked copy-task run (model, task, training, output), its command-line
// flags (CLI11), the presets, checks, and the conversion to and from the string map that
// checkpoints carry (so a resumed run can be compared with the run that saved it, and a trained
// model rebuilt from its checkpoint alone).
//
// Config keys are the flag names without the dashes ("head-dim", "lr-schedule"), so a mismatch
// message can name the flag to change.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/precision.h"
#include "data/copy_task.h"
#include "layers/attention/config.h"

namespace CLI {
class App;
}

namespace clustr::copy {

struct ModelOptions {
  int layers = 2;
  int heads = 4;
  int head_dim = 32;      // E; the model width is D = heads * head_dim
  int feedforward = 256;  // F
  float dropout = 0.0f;   // residual branches, feed-forward and after the positional encoding
  bool pre_norm = false;  // post-norm (the paper's form) unless set
  AttentionConfig attention;
  // The matrix products' precision (core/precision.h): fp32, or bf16 operands with f32 sums.
  // The weights, the optimizer and everything else stay f32 either way.
  Precision precision = Precision::fp32;

  int64_t dim() const { return int64_t(heads) * head_dim; }
};

struct TrainOptions {
  int64_t batch = 32;
  int64_t steps = 3000;  // total optimizer steps of the run (a resumed run counts from 0 too)
  float lr = 1e-3f;
  std::string optimizer = "adam";  // radam | adam | adamw | sgd
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
  double target_accuracy = 0.995;  // stop once the held-out accuracy reaches it; 0 = never
  double time_limit = 540.0;       // seconds of training before stopping; 0 = no limit
  uint64_t seed = 1;
  int64_t max_skipped_steps = 10;  // non-finite steps in a row before the run stops
};

struct OutputOptions {
  // metrics.csv, checkpoint.safetensors, *.png. The app's default (no --out) is the first free
  // folder among runs/copy_task, runs/copy_task-2, ... (apps/common/run_folder.h).
  std::string out = "runs/copy_task";
  bool overwrite = false;  // --overwrite: a new run may replace the one in `out`
  int64_t log_interval = 50;
  int64_t eval_interval = 100;
  int64_t eval_batches = 8;         // fixed held-out batches of `batch` sequences
  int64_t final_eval_batches = 32;  // the larger held-out set evaluated after training
  int64_t checkpoint_interval = 500;  // 0: only the final checkpoint
  bool write_checkpoints = true;      // off in the sweep
  bool write_plots = true;
};

struct RunOptions {
  std::string preset = "cpu";
  ModelOptions model;
  CopyTaskConfig task{63, 10, 0.2f};  // N = 128
  TrainOptions train;
  OutputOptions output;
  int threads = 0;  // 0: OpenMP's default
  std::string device = "cpu";
  bool tf32 = false;  // --device cuda: TF32 tensor cores for the f32 products
};

// The presets: "cpu" (the default: a model and schedule that reach the target accuracy in a
// few minutes on two cores) and "paper" (supp. C.2: 4 layers, 6 heads x 32, ff 768, R-Adam lr
// 2e-4, batch 32, 5000 steps, improved-clustered). Throws on an unknown name.
RunOptions preset_options(const std::string& name);
// The value of --preset in argv ("cpu" when absent), read before the flags are defined so that
// the preset supplies their defaults.
std::string find_preset(int argc, const char* const* argv);

// Adds the model, task and training flags bound to `o`. A sweep passes grid_axes = false: it
// defines --attention, --clusters and --length itself, as lists.
void add_model_task_train_flags(CLI::App& app, RunOptions& o, bool grid_axes = true);
// Adds the output flags (--out, --log-interval, ...).
void add_output_flags(CLI::App& app, RunOptions& o);

// Throws clustr::Error naming the flag and its allowed range.
void validate(const RunOptions& o);

// The settings as (flag name, value) in the order of --help (floats with enough digits to read
// back exactly), and the same as a map (a checkpoint's config).
std::vector<std::pair<std::string, std::string>> config_entries(const RunOptions& o);
std::map<std::string, std::string> to_config(const RunOptions& o);
// Sets the model and task options, the batch size and the seed from a config map written by
// to_config (a checkpoint's), leaving the rest of o as it is: enough to rebuild the trained
// model and its held-out set. Throws naming a missing or malformed key.
void apply_checkpoint_config(const std::map<std::string, std::string>& config, RunOptions& o);

// Keys that must be equal to resume from a checkpoint (model shape, attention, task,
// optimizer kind).
const std::vector<std::string>& resume_locked_keys();
// Keys that change the training trajectory but may differ on resume (the new value is used,
// with a note that the run is then no exact continuation of the saved one).
const std::vector<std::string>& resume_noted_keys();

// "--key: checkpoint <a>, now <b>" for each differing key among `keys` (missing = "(absent)").
std::vector<std::string> config_differences(const std::map<std::string, std::string>& saved,
                                            const std::map<std::string, std::string>& now,
                                            const std::vector<std::string>& keys);

}  // namespace clustr::copy
