// Settings of the speech app (CTC phone recognition): the model, the data, training and output;
// the presets; the checks; the config map a checkpoint carries (so that evaluate, decode and
// matrix rebuild a trained model from its checkpoint alone).
//
// Config keys are the flag names without the dashes ("head-dim", "max-frames").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/flag_table.h"
#include "apps/common/settings.h"
#include "data/augment.h"
#include "data/wave_augment.h"
#include "layers/attention/config.h"

namespace CLI {
class App;
}

namespace clustr::speech {

// The encoder's settings (apps/common/settings.h) with this app's defaults (4 layers, 4 heads
// x 32, feed-forward 512, dropout 0.1 after the input projection, residual branches and
// feed-forward), and the frame stacking.
struct ModelOptions : EncoderOptions {
  int stacking = 4;  // frames concatenated per encoder position: 1, 2 or 4
  ModelOptions() {
    layers = 4;
    feedforward = 512;
    dropout = 0.1f;
  }
};

struct DataOptions {
  std::string corpus;    // folder with train.tsv, dev.tsv, test.tsv and tokens.txt
  std::string train;     // manifest paths (default: <corpus>/train.tsv, <corpus>/dev.tsv)
  std::string dev;
  std::string tokens;    // default: <corpus>/tokens.txt, else beside the manifest
  std::string cache;     // feature cache folder (default: <corpus or manifest dir>/fbank-cache)
  int64_t max_train = 0;  // use only the first N training utterances; 0 = all
  int64_t max_dev = 0;    // the same for dev
};

struct TrainOptions : TrainingOptions {
  int64_t epochs = 30;
  int64_t max_steps = 0;      // stop after this many optimizer steps in all; 0 = no limit
  int64_t batch = 32;         // most utterances per batch; 0 = only the frame budget
  int64_t max_frames = 4000;  // most padded encoder positions (B x Tmax) per batch; 0 = none
  SpecAugmentOptions spec;    // masks on the training batches (data/augment.h); off by default
  WaveAugmentOptions wave;    // speed, VTLP, reverberation, noise, gain (data/wave_augment.h);
                              // off by default
  int64_t max_graphs = 16;    // --device cuda: the most CUDA graphs kept (one per batch shape)
  TrainOptions() {
    clip = 5.0f;
    lr_schedule = "plateau";  // warm-up, then lowered on plateaus of the dev loss
    warmup = 300;
    plateau_patience = 1;  // epochs without a lower dev loss before lowering the lr
    min_lr = 1e-6;
  }
};

struct OutputOptions {
  // metrics.csv, loss.png, per.png, best/last.safetensors. The app's default (no --out) is the
  // first free folder among runs/speech, runs/speech-2, ... (apps/common/run_folder.h).
  std::string out = "runs/speech";
  bool overwrite = false;           // --overwrite: a new run may replace the one in `out`
  int64_t log_interval = 20;        // steps between progress lines
  int64_t examples = 2;             // decoded dev utterances printed after each epoch
  bool write_plots = true;
};

// threads, device and tf32 come from MachineOptions.
struct RunOptions : MachineOptions {
  std::string preset = "cpu";
  ModelOptions model;
  DataOptions data;
  TrainOptions train;
  OutputOptions output;
};

// "cpu" (the default: a small model that learns on two cores in minutes) or "paper" (the
// paper's WSJ model, sec. 4.2 and supp. C.3: 9 layers, 6 heads x 32, ff 768, R-Adam lr 1e-4,
// clip 10, decoupled weight decay 0.01, the lr dropped on plateaus of the dev loss, 100 clusters,
// k = 32). Throws on another name.
RunOptions preset_options(const std::string& name);

// The attention flags of evaluate and decode (--attention --clusters --topk --bits --iterations
// --rounds --buckets --chunk) bound to `a`; their help gives the model's values as the default.
void add_attention_flags(CLI::App& app, AttentionConfig& a);
// --precision fp32|bf16, bound to `precision`.
void add_precision_flag(CLI::App& app, Precision& precision);
// Every setting of `train`, declared once (apps/common/flag_table.h), bound to `o`'s fields.
FlagTable settings_table(RunOptions& o);
// Everything `train` takes.
void add_train_flags(CLI::App& app, RunOptions& o);

// Throws clustr::Error naming the flag and its allowed range.
void validate(const RunOptions& o);

// The model options of a config map written by to_config; throws naming a missing or
// malformed key.
ModelOptions model_from_config(const std::map<std::string, std::string>& config);
// For `train --resume`: each locked setting whose flag is not on the command line takes the
// checkpoint's value, so a run resumes without repeating its model flags; a flag that is given
// keeps its value (and Trainer::resume refuses it if it differs from the checkpoint's).
void adopt_locked_settings(const std::map<std::string, std::string>& saved, const CLI::App& app,
                           RunOptions& o);

}  // namespace clustr::speech
