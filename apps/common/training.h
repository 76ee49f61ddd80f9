// What the apps' training loops share: the random stream keys, the optimizer factory, a
// checkpoint's run config, the gradient norm (clipped or only measured), the policy for steps
// whose loss or gradient norm is not finite, and the check that keeps a checkpoint from ever
// holding non-finite weights or optimizer state.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "apps/common/device.h"
#include "apps/common/settings.h"
#include "core/random.h"
#include "layers/checkpoint.h"
#include "layers/module.h"
#include "optim/optimizer.h"

namespace clustr {

// The most OpenMP threads a --threads flag may ask for (far above any machine these apps run on;
// beyond it the runtime fails with "libgomp: Out of memory", naming no flag).
constexpr int kMaxThreads = 256;
// Throws naming `flag` unless 0 <= threads <= kMaxThreads (0: OpenMP's default).
void check_threads(int threads, const char* flag = "--threads");

// What a run's memory grows with, as its flags and values ("--batch 32, --length 63, ..."),
// noted once the flags are parsed, for the hint an out-of-memory error carries (error_text).
void note_memory_flags(const std::string& flags);
// The text after "<app>: error: " for an exception: its message, and for an allocation that
// failed (std::bad_alloc, or a tensor's "out of ... memory") the noted flags to lower.
std::string error_text(const std::exception& e);

using Clock = std::chrono::steady_clock;
// Seconds from t0 to now.
double seconds_since(Clock::time_point t0);

// printf to `log` and flush it (nothing when `log` is null): the trainers' log lines.
void logf(std::FILE* log, const char* format, ...) __attribute__((format(printf, 2, 3)));

// splitmix64: a stream key per purpose (training, held-out, evaluation, ...) from a run's seed.
uint64_t derive_key(uint64_t seed, uint64_t purpose);

// The optimizer of --optimizer, --lr, --weight-decay, --decoupled-weight-decay, --momentum.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainingOptions& o,
                                                 optim::NamedParameters params);

// The learning-rate schedule of a run (--lr-schedule, --warmup, --plateau-*, --min-lr): the
// linear warm-up, then a constant lr, or the plateau schedule, which lowers it when the
// held-out loss of an evaluation stalls. Its state rides in checkpoints as the config entries
// state.plateau-*, so a resumed run goes on exactly.
class LrSchedule {
 public:
  explicit LrSchedule(const TrainingOptions& o);
  // Sets the lr of the step after `done` steps: the warm-up's, or --lr (after the warm-up the
  // plateau schedule owns the lr and this leaves it).
  void before_step(int64_t done, optim::Optimizer& opt) const;
  // The lr before_step would set after `done` steps, `current` the lr it would leave.
  float lr_for(int64_t done, float current) const;
  // An evaluation after `done` steps with held-out loss `loss`: the plateau schedule's step
  // (after the warm-up, for a finite loss); true when it lowered the lr.
  bool at_evaluation(double loss, int64_t done, optim::Optimizer& opt);
  void save(std::map<std::string, std::string>& config) const;
  // From a checkpoint's config (`file` names it in errors); a config without the state (a run
  // saved with another schedule) leaves the schedule as it starts.
  void restore(const std::map<std::string, std::string>& config, const std::string& file);

 private:
  TrainingOptions o_;
  std::unique_ptr<optim::ReduceLrOnPlateau> plateau_;  // the plateau schedule only
};

// The checkpoint a flag names: `path` itself when it is a file, or in a folder the first of
// `names` it holds (e.g. best, then last); throws naming the flag otherwise. (Reading the
// checkpoint's run config: layers/checkpoint.h's read_checkpoint_config.)
std::string resolve_checkpoint(const std::string& path, const char* flag,
                               std::initializer_list<const char*> names);

// After backward: the global gradient norm, with the gradients clipped to `clip` when it is
// > 0 (clip 0: no clipping, the norm only measured, so that a non-finite gradient is seen).
double clip_or_measure(const optim::NamedParameters& params, float clip);

// `o` after its app's validate(o) (found by argument-dependent lookup): for a trainer's base
// initialiser, so that the settings are checked before the machine is prepared.
template <class Options>
const Options& validated(const Options& o) {
  validate(o);
  return o;
}

// What every app's Trainer holds and does the same way (it derives from this): the log, the
// device (prepared from the machine settings), the training stream (key derive_key(seed, 0)),
// the optimizer and its learning-rate schedule, whether the run resumed, and the seconds of
// training before it.
class TrainerBase {
 public:
  TrainerBase(const TrainerBase&) = delete;
  TrainerBase& operator=(const TrainerBase&) = delete;

  int64_t step() const { return optimizer_->step_count(); }
  const optim::Optimizer& optimizer() const { return *optimizer_; }
  Device device() const { return device_; }

 protected:
  TrainerBase(const MachineOptions& machine, const TrainingOptions& training, std::FILE* log);
  ~TrainerBase() = default;
  // The key of the run's stream for `purpose` (0 is the training stream's).
  uint64_t stream_key(uint64_t purpose) const { return derive_key(seed_, purpose); }

  std::FILE* log_;
  Device device_;
  uint64_t seed_;
  Generator gen_;  // the training stream
  LrSchedule schedule_;
  std::unique_ptr<optim::Optimizer> optimizer_;  // made by the app, once its model is built
  bool resumed_ = false;
  double elapsed_before_ = 0;  // training seconds of the runs before a resume
};

// Steps whose loss or gradient norm is not finite are skipped (no update; the caller zeroes
// the gradients) and reported; after `limit` of them in a row the run stops with an error,
// leaving its last checkpoint as it was.
class NonFiniteSteps {
 public:
  explicit NonFiniteSteps(int64_t limit) : limit_(limit) {}
  // Reports one skipped step: `what` says which value and where (the log line's text). Throws
  // clustr::Error once `limit` steps in a row were skipped; `last_checkpoint` names what is kept.
  void skipped(const std::string& what, std::FILE* log, const std::string& last_checkpoint);
  void stepped() { in_a_row_ = 0; }
  int64_t total() const { return total_; }

 private:
  int64_t limit_, in_a_row_ = 0, total_ = 0;
};

// Throws clustr::Error naming the first tensor with a NaN or an infinity among the model's
// parameters and the float extras (the optimizer state): a checkpoint is written only from a
// finite state. `path` is the checkpoint that was about to be written.
void check_finite_state(const Module& model,
                        const std::vector<std::pair<std::string, Tensor>>& extras,
                        const std::string& path);

}  // namespace clustr
