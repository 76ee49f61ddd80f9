// Training and evaluating the speech model with CTC: the training loop (progress lines, the
// per-epoch dev loss and phone error rate with decoded examples, metrics.csv, PNG plots,
// checkpoints) and the evaluation that the evaluate, decode and matrix commands share.
//
// Random streams (Philox, core/random.h), keyed by numbers derived from --seed:
//   training  model initialisation, then each step's dropout masks and the clustered types'
//             hashing; its position is saved in checkpoints;
//   order     the batch order of epoch e (its own key per epoch, so a resumed run sees the
//             same order);
//   eval      the hashing during an evaluation, restarted at each one (repeatable).
//
// Bad steps: a non-finite loss or gradient norm skips the optimizer step (the gradients are
// dropped) and is reported with the batch's utterance ids; training never continues with NaN.
// Utterances whose targets cannot be aligned (CTC loss +inf) count as 0 in the loss
// (zero_infinity) and are counted per epoch.
//
// Checkpoints in --out: last.safetensors (weights, optimizer state, the training stream's
// position, the epoch and batch reached, plateau state: what --resume needs) after every epoch,
// and best.safetensors (weights and config) whenever the dev PER improves.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "apps/speech/dataset.h"
#include "apps/common/run_folder.h"
#include "apps/common/training.h"
#include "apps/speech/graphed.h"
#include "apps/speech/model.h"
#include "apps/speech/options.h"
#include "data/fbank.h"
#include "data/manifest.h"
#include "layers/ctc_decode.h"
#include "layers/error_rate.h"
#include "optim/optimizer.h"

namespace clustr::speech {

struct Evaluation {
  double loss = 0;  // mean over utterances of CTC loss / target length (impossible ones left out)
  ErrorRate greedy;  // phone error rate of best-path decoding
  ErrorRate beam;    // of prefix beam search (when beam > 1)
  std::vector<ErrorRate> fused;  // of the beam search with each language-model fusion asked for
  std::vector<LabelSequence> hypotheses;  // per example of the set, in its order
  int64_t utterances = 0, impossible = 0;
  int64_t input_frames = 0;
  double seconds = 0;          // the whole evaluation
  double forward_seconds = 0;  // the model's forward passes alone (the device synchronized)
};

// Evaluates `model` on `set` in evaluation mode (no dropout, no gradients), batches of up to
// `max_frames` padded positions, on the device of the model's parameters (decoding runs on host
// copies of the logits). The hypotheses are the first fusion's when `fusions` are given (beam
// > 1), else the beam search's when beam > 1, else greedy. `hash_seed` keys the clustered
// types' hashing.
Evaluation evaluate_set(SpeechModel& model, const SpeechSet& set, int64_t max_frames, int beam,
                        uint64_t hash_seed, const std::vector<LmFusion>& fusions = {});

// A checkpoint path: a file, or a folder holding best.safetensors (or last.safetensors).
std::string resolve_checkpoint(const std::string& file_or_folder, const char* flag);
// The checkpoint `train --resume` continues from: the file, or a folder's last.safetensors.
std::string resume_file(const std::string& file_or_folder);

// A trained model rebuilt from its checkpoint: options from the config, weights loaded.
struct LoadedModel {
  ModelOptions options;
  std::unique_ptr<SpeechModel> model;
  std::map<std::string, std::string> config;
  int64_t step = 0;
  std::string file;
  // The token table the model was trained with (stored in the checkpoint; empty for a
  // checkpoint from before the table was stored, which holds only the class count).
  std::vector<std::string> tokens;
  // Not strict only: the parameters the file lacked (left at their initial values) and the
  // tensors of the file that are not the model's (ignored).
  std::vector<std::string> missing, unexpected;
};
// The model is built on the CPU, loaded, then moved to `device`. strict (the default): the
// file must hold every parameter of the model and nothing but parameters and the optimizer
// state, else the error lists what is missing or unexpected; not strict (--non-strict): those
// are listed in the result and on `log` (nullptr: silent), and the load goes on.
LoadedModel load_trained_model(const std::string& file_or_folder, const char* flag,
                               Device device = Device::cpu, bool strict = true,
                               std::FILE* log = nullptr);

// The token table to read and score a manifest with, for a model trained with `trained` (a
// checkpoint's table; empty: unknown, then `classes` is the count it had). The tokens file at
// `path` (given with --tokens, or beside the manifest) must hold exactly that table, in that
// order; when no file is given and none lies beside the manifest, the checkpoint's table is
// used. Throws naming the first token that differs.
TokenTable model_tokens(const std::vector<std::string>& trained, int64_t classes,
                        const std::string& path, bool given, const std::string& checkpoint);

// Splits a manifest path's folder; the tokens file defaults to tokens.txt there.
std::string default_tokens(const std::string& manifest);
std::string default_cache(const std::string& manifest);

struct TrainResult {
  double first_loss = 0, last_loss = 0;  // mean training loss of the first and last log interval
  std::vector<float> losses;             // the loss of each step taken by this call, in order
  double best_per = 0;
  Evaluation last_dev;
  int64_t steps = 0, skipped_steps = 0, impossible = 0;
  int interrupted_by = 0;  // SIGINT or SIGTERM when a signal stopped the run, else 0
  double train_seconds = 0, frames_per_second = 0;
  // --device cuda: kernel launches and cuBLAS calls per training step (cuda::launch_counts),
  // averaged over the last log interval; 0 on the cpu.
  double kernel_launches_per_step = 0, blas_calls_per_step = 0;
};

class Trainer : public TrainerBase {
 public:
  // Reads the tokens and both sets, builds the model (on the CPU from the seed, then moved to
  // --device) and the optimizer. `log` receives the log. Throws at once when --device cuda
  // has no usable GPU.
  Trainer(const RunOptions& options, std::FILE* log);

  // Continues from last.safetensors (a file or the folder holding it); refuses, naming each
  // differing flag, when the model shape or optimizer kind differ, or when the checkpoint is
  // past --max-steps.
  void resume(const std::string& path);
  // Trains to --epochs (or --max-steps, or the time limit), evaluating the dev set after each
  // epoch and writing metrics.csv, plots, best.safetensors and last.safetensors into the
  // output folder: `folder` (opened by the caller), or opened here from options.output (a
  // new run, --overwrite, or the resumed run's folder). SIGINT or SIGTERM stops it after the
  // current step with last.safetensors saved (TrainResult::interrupted_by).
  TrainResult run(RunFolder* folder = nullptr);
  // The files a run writes into its folder (what --overwrite removes first).
  static const std::vector<std::string>& run_files();
  void print_config(std::FILE* out) const;

  SpeechModel& model() { return *model_; }
  // Why run() trains without CUDA graphs ("" when it uses them), and their counts (null when
  // it does not use them).
  const std::string& graphs_off_reason() const { return graphs_off_; }
  const GraphedSteps* graphed_steps() const { return graphs_.get(); }

 private:
  void save(const std::string& path, bool with_state) const;
  // With waveform augmentation: the training examples of epoch_ (each utterance read again and
  // augmented from its own stream: derive_key(derive_key(augment_key_, epoch), index)) and
  // their length buckets; without: the cached features and buckets made once. Returns the
  // seconds it took.
  double prepare_epoch();
  const std::vector<SpeechExample>& training_examples() const;
  // One training step as the run loop sees it.
  struct StepEvent {
    float loss = 0;
    double norm = 0;       // the gradient norm (when the loss was finite)
    bool skipped = false;  // a non-finite loss or gradient norm: no update
    int64_t impossible = 0, input_frames = 0;
    size_t first = 0, utterances = 0;  // the batch's first example and its size
  };
  static StepEvent event_of(const SpeechBatch& batch);
  // The batch of these examples, spec-augmented from the training stream.
  SpeechBatch next_batch(const std::vector<SpeechExample>& examples,
                         const std::vector<size_t>& indices);
  // One step op by op, its loss and norm read back and decided on the host.
  StepEvent eager_step(const std::vector<SpeechExample>& examples,
                       const std::vector<size_t>& indices);
  // --cuda-graphs on: the next `steps` batches of `order` (from batch_in_epoch_) as steps
  // decided on the device (GraphedSteps), read back once at the end; fewer when a capture
  // fails (graphs are then off).
  std::vector<StepEvent> graphed_steps(const std::vector<SpeechExample>& examples,
                                       const std::vector<std::vector<size_t>>& order,
                                       int64_t steps);

  RunOptions options_;
  TokenTable tokens_;
  std::unique_ptr<FeatureCache> cache_;
  SpeechSet train_, dev_;
  uint64_t order_key_, eval_key_, augment_key_;
  std::vector<SpeechExample> augmented_;  // the epoch's augmented training examples
  int64_t augmented_epoch_ = 0;           // the epoch they are for (0: none)
  std::unique_ptr<SpeechModel> model_;
  std::vector<std::vector<size_t>> buckets_;
  int64_t epoch_ = 1;         // the epoch in progress (1-based)
  int64_t batch_in_epoch_ = 0;  // batches of it already done
  double best_per_ = -1;      // < 0: none yet
  std::string graphs_off_;    // why there are no graphs ("" when there are)
  std::unique_ptr<GraphedSteps> graphs_;
};

}  // namespace clustr::speech
