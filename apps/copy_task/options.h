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

#include "apps/common/flag_table.h"
#include "apps/common/settings.h"
#include "data/copy_task.h"
#include "layers/attention/config.h"

namespace CLI {
class App;
}

namespace clustr::copy {

// The encoder's settings (apps/common/settings.h) with this app's defaults: 2 layers, 4 heads
// x 32, feed-forward 256, dropout 0 (residual branches, feed-forward, positional encoding).
struct ModelOptions : EncoderOptions {};

struct TrainOptions : TrainingOptions {
  int64_t batch = 32;
  int64_t steps = 3000;  // total optimizer steps of the run (a resumed run counts from 0 too)
  double target_accuracy = 0.995;  // stop once the held-out accuracy reaches it; 0 = never
  TrainOptions() { time_limit = 540.0; }
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

// threads, device and tf32 come from MachineOptions.
struct RunOptions : MachineOptions {
  std::string preset = "cpu";
  ModelOptions model;
  CopyTaskConfig task{63, 10, 0.2f};  // N = 128
  TrainOptions train;
  OutputOptions output;
};

// The presets: "cpu" (the default: a model and schedule that reach the target accuracy in a
// few minutes on two cores) and "paper" (supp. C.2: 4 layers, 6 heads x 32, ff 768, R-Adam lr
// 2e-4, batch 32, 5000 steps, improved-clustered). Throws on an unknown name.
RunOptions preset_options(const std::string& name);

// Every setting of a run, declared once (apps/common/flag_table.h), bound to `o`'s fields.
FlagTable settings_table(RunOptions& o);

// Adds every flag bound to `o`. A sweep passes grid_axes = false: it defines --attention,
// --clusters and --length itself, as lists.
void add_flags(CLI::App& app, RunOptions& o, bool grid_axes = true);

// Throws clustr::Error naming the flag and its allowed range.
void validate(const RunOptions& o);

// Sets the model and task options, the batch size and the seed from a config map written by
// to_config (a checkpoint's), leaving the rest of o as it is: enough to rebuild the trained
// model and its held-out set. Throws naming a missing or malformed key.
void apply_checkpoint_config(const std::map<std::string, std::string>& config, RunOptions& o);

}  // namespace clustr::copy
