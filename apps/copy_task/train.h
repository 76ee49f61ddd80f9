// Training and evaluating the copy-task model: the training step, held-out evaluation, the
// learning-rate schedule, checkpoints that resume a run exactly, and the whole training loop
// with its log lines, metrics.csv and plots.
//
// Random streams (all Philox, core/random.h), each keyed by a number derived from --seed:
//   training   model initialisation, then each step's batch, dropout masks and the clustered
//              types' hashing, in that order; its position is saved in checkpoints;
//   held-out   the fixed evaluation batches, drawn once at the start (so every evaluation
//              sees the same sequences; another key, so they are independent of the
//              training batches);
//   final      the larger held-out set evaluated after training (a third key);
//   evaluation the hashing during an evaluation, restarted at each one (evaluations are
//              repeatable and never move the training stream).
//
// Exact resume: a checkpoint holds the weights, the optimizer state (moments, step counts, the
// current lr), the training stream's position, the step, the run's config and the plateau
// schedule's state (config keys state.plateau-*). Since every kernel gives the same result at
// any thread count, N steps + resume + M steps reproduce N + M steps bit for bit.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "apps/common/run_folder.h"
#include "apps/common/training.h"
#include "apps/copy_task/metrics.h"
#include "apps/copy_task/model.h"
#include "apps/copy_task/options.h"
#include "core/cuda/cuda.h"
#include "core/random.h"
#include "data/copy_task.h"
#include "optim/optimizer.h"

namespace clustr::copy {

struct Evaluation {
  double loss = 0;      // mean cross-entropy over the masked positions
  double accuracy = 0;  // masked-token accuracy
  int64_t tokens = 0;   // masked positions counted
  double seconds = 0;
};

struct RunResult {
  int64_t start_step = 0, end_step = 0;
  std::vector<float> losses;  // the training loss of each step this call ran, in order
  std::optional<Evaluation> last_eval;  // the last periodic held-out evaluation
  Evaluation final_eval;                // the larger held-out set, after training
  bool reached_target = false;
  std::string stop_reason;  // "steps", "target accuracy", "time limit", "interrupted by SIGINT"
  int interrupted_by = 0;   // SIGINT or SIGTERM when a signal stopped the run (then no final
                            // evaluation), else 0
  int64_t skipped_steps = 0;  // steps skipped for a non-finite loss or gradient norm
  double train_seconds = 0;  // training steps only, this call
  double total_seconds = 0;  // this call, evaluations and checkpoints included
  // --device cuda: kernel launches and cuBLAS calls per training step (cuda::launch_counts),
  // averaged over the last log interval; 0 on the cpu.
  double kernel_launches_per_step = 0, blas_calls_per_step = 0;
};

// The batch's tensors on `device` (the same tensors when they are there already).
CopyTaskBatch to_device(const CopyTaskBatch& batch, Device device);

// A file path, or a folder holding checkpoint.safetensors -> the checkpoint file; throws a
// clear error when neither exists.
std::string resolve_checkpoint(const std::string& file_or_folder, const char* flag);

class Trainer : public TrainerBase {
 public:
  // Builds the model (initialised from the training stream, on the CPU, then moved to
  // --device), the optimizer and the held-out batches (kept on the device). Throws at once
  // when --device cuda has no usable GPU. `log` receives the log lines (nullptr: silent). Throws on invalid options.
  Trainer(const RunOptions& options, std::FILE* log);

  // Continues from a checkpoint (a file, or a folder with checkpoint.safetensors). Refuses,
  // naming each differing flag, when the model, task or optimizer kind differ from the
  // saved run, or when the checkpoint is past --steps; other differences (lr, batch, ...) are
  // noted in the log and take effect.
  void resume(const std::string& path);

  // One optimizer step on a fresh training batch; returns the loss and sets *accuracy to the
  // batch's masked-token accuracy and *tokens to its number of masked positions. A non-finite
  // loss or gradient norm skips the update (the step count stays): last_skip() then says why.
  float train_step(double* accuracy = nullptr, int64_t* tokens = nullptr);
  const std::string& last_skip() const { return last_skip_; }
  // Loss and accuracy over batches in evaluation mode (no dropout, no gradients).
  Evaluation evaluate(const std::vector<CopyTaskBatch>& batches) const;
  Evaluation evaluate_heldout() const { return evaluate(heldout_); }
  // n batches of the final held-out stream (the same ones for the same seed and n).
  std::vector<CopyTaskBatch> final_batches(int64_t n) const;

  // Writes a checkpoint (atomically) with everything resume() needs; refuses (throws, leaving
  // the file as it was) when a weight or the optimizer state is not finite.
  void save(const std::string& path) const;

  // Trains from the current step to options.train.steps (or the target accuracy, or the time
  // limit), logging, writing metrics.csv, plots and checkpoints into options.output.out; then
  // evaluates the final held-out set and writes the final checkpoint. The output folder is
  // `folder` (already opened by the caller), or opened here from options.output (a new run,
  // --overwrite, or the resumed run's folder). SIGINT or SIGTERM stops it after the current
  // step with a checkpoint (RunResult::interrupted_by).
  RunResult run(RunFolder* folder = nullptr);

  // The files a run writes into its folder (what --overwrite removes first).
  static const std::vector<std::string>& run_files();

  // The settings table and build information (for the start of a run).
  void print_config(std::FILE* out) const;

  CopyModel& model() { return *model_; }
  const RunOptions& options() const { return options_; }
  // Why run() trains without CUDA graphs ("" when it replays the captured step).
  const std::string& graphs_off_reason() const { return graphs_off_; }

 private:
  // One training step as the run loop sees it.
  struct StepEvent {
    float loss = 0;
    double accuracy = 0, seconds = 0;
    std::string skip;  // why it made no update ("" if it did)
  };
  // train_step(), timed.
  StepEvent eager_step();
  // --cuda-graphs on: `steps` steps (at most kMaxWindow) as replays of the captured step, their
  // batches drawn first (the training stream's order is the eager loop's) and their copies to
  // the device queued at once; while the device runs them, the host prepares the next window's
  // (`next_steps`); one event per replay, read back at the end.
  std::vector<StepEvent> graphed_steps(int64_t steps, int64_t next_steps);
  // Appends n attempted steps' batches and random draws, from the training stream, to the
  // ones prepared ahead (a window's are drawn while the device runs the window before).
  void prepare_attempts(int64_t n);
  // The training stream's offset before the first attempt prepared but not yet run (its
  // offset when none is): what a checkpoint saves.
  uint64_t consumed_offset() const;
  // Sets the training stream back to consumed_offset() and forgets the prepared attempts.
  void rewind_prepared();
  // Captures the step (after a warm-up on a batch drawn from no stream); on failure sets
  // graphs_off_ to the reason and returns false.
  bool capture_step();
  // What the captured step runs: forward, loss, backward and (queue) the device step.
  void step_body(bool queue);

  RunOptions options_;
  uint64_t heldout_key_, final_key_, eval_key_;
  std::unique_ptr<CopyModel> model_;
  std::vector<CopyTaskBatch> heldout_;
  std::string last_skip_;   // why the last train_step() made no update ("" if it did)
  double run_seconds_ = 0;  // training seconds of run() so far
  // --cuda-graphs: the reason they are not used ("" when they are), the graph and its stream,
  // the step's fixed inputs on the device (input (B, N), target (B, N), lengths (B), one
  // after another), a window's batches, and the steps decided on the device.
  std::string graphs_off_;
  std::unique_ptr<cuda::Stream> graph_stream_;
  cuda::Graph graph_;
  Tensor step_inputs_, window_inputs_;
  std::unique_ptr<optim::DeviceSteps> device_steps_;
  // The step's random draws (the clustered types' hashing), made on the host for each replay
  // (core/random.h's DrawPlan), and a window's of them.
  std::unique_ptr<DrawPlan> draws_;
  Tensor window_draws_;
  // A window's batches and draws go to the device from this pinned buffer, the copies queued
  // before the replays (the host does not wait for them); `window_copied_` (recorded after
  // them) is waited for before the next window fills the buffer again. The event is made with
  // the first window: an Event needs a GPU, and a cpu run has none.
  cuda::PinnedBuffer window_staging_;
  std::unique_ptr<cuda::Event> window_copied_;
  // Attempts prepared ahead on the host: batch words, draws, the stream's offset before each.
  std::vector<int32_t> ahead_words_;
  std::vector<float> ahead_draws_;
  std::vector<uint64_t> ahead_offsets_;
};

}  // namespace clustr::copy
