// Optimizers over a list of parameters (leaf Variables): SGD (momentum, Nesterov, L2 weight
// decay), Adam, AdamW and R-Adam, each matching PyTorch 1.13's torch.optim single-group update;
// gradient clipping by global norm; learning-rate schedules (constant, linear warm-up,
// reduce-on-plateau).
//
// Usage:
//   optim::Adam opt(model.named_parameters(), {.lr = 1e-3f});
//   loss.backward();
//   optim::clip_grad_norm(model.parameters(), 1.0);
//   opt.step();          // parameters without a gradient are skipped
//   opt.zero_grad();
//
// State (moments, momentum buffers, step counts) is created on a parameter's first step, on its
// device, and can be saved and restored as named tensors for checkpoints (layers/checkpoint.h):
//   optimizer.step                  i32 (), step() calls so far
//   optimizer.lr                    f32 (), the current learning rate
//   optimizer.<param>.step          i32 (), steps this parameter has taken
//   optimizer.<param>.<slot>        f32, the parameter's shape: exp_avg, exp_avg_sq (Adam family),
//                                   momentum_buffer (SGD with momentum)
// Parameters may live on the cpu or a CUDA device, each its own (a model may mix them): a
// parameter's update runs on its device (optim/cuda/update.h for CUDA) with the same per-element
// formula, and its state lives beside it; state_dict() copies state to the cpu and
// load_state_dict() copies it back to each parameter's device.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autograd/variable.h"
#include "core/tensor.h"
#include "optim/update_math.h"

namespace clustr::optim {

using NamedParameters = std::vector<std::pair<std::string, Variable>>;

// Names parameters "0", "1", ... (for optimizers built from Module::parameters()).
NamedParameters number_parameters(const std::vector<Variable>& params);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient.
  void step();
  // Forgets every parameter's gradient.
  void zero_grad();

  float lr() const { return lr_; }
  void set_lr(float lr);
  int64_t step_count() const { return step_count_; }
  const char* name() const { return name_; }
  const NamedParameters& parameters() const { return params_; }

  // The state as named cpu tensors (copies), names as in the header comment.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  // Restores a state_dict() (e.g. Checkpoint extras). Every name must belong to this optimizer
  // and every shape must match; parameters absent from `state` start afresh.
  void load_state_dict(const std::map<std::string, Tensor>& state);

  // One parameter to update: p, g and slots[i] (slot_names()[i]) hold n floats.
  struct ParamUpdate {
    float* p;
    float* g;  // the step decided on the device leaves it clipped
    std::vector<float*> slots;
    int64_t n;
  };

 protected:
  Optimizer(const char* name, NamedParameters params, float lr, std::vector<std::string> slots);
  // Updates parameters that are all on `device` and all at step t (counted from 1), in one go:
  // on the CUDA device a few launches for all of them (the multi-tensor kernels of
  // optim/cuda/update.h), on the CPU one loop per parameter.
  virtual void update(Device device, int64_t t, const std::vector<ParamUpdate>& params) = 0;
  // The scalars of update number t (counted from 1) at learning rate lr (the field of this
  // optimizer's kind; update() uses the same).
  virtual math::StepScalars scalars_at(int64_t t, float lr) const = 0;
  // update() on the CUDA device with the scalars, and the decision to skip, read from `state`
  // (device memory; DeviceSteps).
  virtual void update_on_device(const std::vector<ParamUpdate>& params,
                                const math::DeviceStepState* state) = 0;

 private:
  friend class DeviceSteps;
  struct ParamState {
    int64_t step = 0;           // 0: no state yet
    std::vector<Tensor> slots;  // one per slot name, shaped like the parameter
  };
  const char* name_;
  NamedParameters params_;
  float lr_;
  std::vector<std::string> slot_names_;
  std::vector<ParamState> state_;
  int64_t step_count_ = 0;
};

// ---- SGD --------------------------------------------------------------------------------------
struct SgdOptions {
  float lr = 0.01f;
  float momentum = 0.0f;      // in [0, 1)
  bool nesterov = false;      // needs momentum > 0
  float weight_decay = 0.0f;  // L2: added to the gradient as weight_decay * p
};
class Sgd : public Optimizer {
 public:
  Sgd(NamedParameters params, const SgdOptions& options);
  Sgd(const std::vector<Variable>& params, const SgdOptions& options)
      : Sgd(number_parameters(params), options) {}

 protected:
  void update(Device device, int64_t t, const std::vector<ParamUpdate>& params) override;
  math::StepScalars scalars_at(int64_t t, float lr) const override;
  void update_on_device(const std::vector<ParamUpdate>& params,
                        const math::DeviceStepState* state) override;

 private:
  SgdOptions options_;
};

// ---- Adam family ------------------------------------------------------------------------------
// How weight decay acts: l2 adds weight_decay * p to the gradient (Adam, PyTorch 1.13's RAdam);
// decoupled shrinks p by (1 - lr * weight_decay) before the update (AdamW, Loshchilov & Hutter).
enum class WeightDecay { l2, decoupled };

struct AdamOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.999f;  // each in [0, 1)
  float eps = 1e-8f;                   // > 0
  float weight_decay = 0.0f;           // >= 0
  WeightDecay decay = WeightDecay::l2;
};

enum class AdamVariant { adam, radam };

class AdamBase : public Optimizer {
 protected:
  AdamBase(const char* name, AdamVariant variant, NamedParameters params,
           const AdamOptions& options);
  void update(Device device, int64_t t, const std::vector<ParamUpdate>& params) override;
  math::StepScalars scalars_at(int64_t t, float lr) const override;
  void update_on_device(const std::vector<ParamUpdate>& params,
                        const math::DeviceStepState* state) override;

 private:
  AdamVariant variant_;
  AdamOptions options_;
};

// Adam (Kingma & Ba), weight decay as set in the options (default L2, as torch.optim.Adam).
class Adam : public AdamBase {
 public:
  Adam(NamedParameters params, const AdamOptions& options)
      : AdamBase("Adam", AdamVariant::adam, std::move(params), options) {}
};

// AdamW: Adam with decoupled weight decay whatever options.decay says (default 0.01 as PyTorch).
AdamOptions adamw_defaults();
class AdamW : public AdamBase {
 public:
  AdamW(NamedParameters params, AdamOptions options);
};

// R-Adam (Liu et al. 2020, "On the variance of the adaptive learning rate", Algorithm 2) as
// PyTorch 1.13: rho_inf = 2 / (1 - beta2) - 1, rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t);
// when rho_t > 5 the step is rectified by
//   r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t)),
// otherwise it is the bias-corrected momentum step lr * m / (1 - beta1^t).
class RAdam : public AdamBase {
 public:
  RAdam(NamedParameters params, const AdamOptions& options)
      : AdamBase("RAdam", AdamVariant::radam, std::move(params), options) {}
};

// rho_t of R-Adam for step t (>= 1), and whether that step is rectified (rho_t > 5).
double radam_rho(double beta2, int64_t t);

// ---- gradient clipping ------------------------------------------------------------------------
// The global 2-norm of all gradients (parameters without one are skipped), computed in double
// in a fixed order; when max_norm / (norm + 1e-6) < 1 every gradient is scaled by that factor in
// place (as torch.nn.utils.clip_grad_norm_). Returns the norm before clipping. Gradients on a
// CUDA device are summed there (in double, per block, the block sums added on the host in a
// fixed order) and scaled there; cpu and device gradients may be mixed.
double clip_grad_norm(const std::vector<Variable>& params, double max_norm);
double clip_grad_norm(const NamedParameters& params, double max_norm);
// The same global norm without clipping (a run without clipping still checks it is finite).
double grad_norm(const std::vector<Variable>& params);

// ---- steps decided on the device -------------------------------------------------------------
// A training step that must not wait for the host (one captured into a CUDA graph,
// core/cuda/cuda.h) cannot read its loss or its gradient norm there. DeviceSteps keeps them on
// the device with everything that depends on them: the decision to skip a step whose loss or
// norm is not finite, the clipping, and the update with the scalars of its step number and
// learning rate. Each step does what clip_grad_norm (or grad_norm) and Optimizer::step() do in
// the eager loop, with the same sums in the same order, so the two give the same bits.
//
//   optim::DeviceSteps steps(opt, clip, window);   // every parameter on the CUDA device
//   steps.prepare([&](int64_t done) { return schedule.lr_at(done); });
//   ... up to `window` times: forward, backward, steps.queue_step(loss)  (or a graph's replay)
//   for (const math::StepRecord& r : steps.collect()) ...   // waits; one record per step
//
// The host works out the scalars of the window's updates when it prepares it (so a schedule
// and its numerics stay the host's); collect() brings the optimizer's step count and learning
// rate up to date. Every parameter must have a gradient at every step (else queue_step throws).
class DeviceSteps {
 public:
  // clip > 0 clips the global gradient norm to it; 0 only measures it. Makes the optimizer's
  // state (zeros, as its first step would) so that no step allocates it.
  DeviceSteps(Optimizer& opt, float clip, int32_t window);
  DeviceSteps(const DeviceSteps&) = delete;
  DeviceSteps& operator=(const DeviceSteps&) = delete;

  int32_t window() const { return window_; }
  // Starts a window: the learning rate of the update after `done` updates is lr_at(done).
  // Not while capturing (it copies the window's scalars to the device).
  void prepare(const std::function<float(int64_t done)>& lr_at);
  // Queues one step after backward (capturable): the norm, the decision, the clipping and the
  // update, all on the device. loss: the step's loss, shape () on the device; extras: up to
  // math::kStepExtras one-element tensors on the device whose values the step's record keeps
  // (e.g. its correct predictions and tokens). A step run outside a prepared window (a graph
  // replayed before prepare() or after collect()) makes no update, and the next prepare() says
  // so.
  void queue_step(const Tensor& loss, const std::vector<Tensor>& extras = {});
  // Waits for the device and returns one record per step queued since prepare(); sets the
  // optimizer's step count and learning rate to where the window left them. Throws when more
  // steps were queued than the window holds (those made no update).
  std::vector<math::StepRecord> collect();

 private:
  Optimizer& opt_;
  double clip_;
  int32_t window_;
  int64_t base_ = 0;        // the optimizer's step count at prepare()
  std::vector<float> lrs_;  // the lr of each update of the window
  bool prepared_ = false;
  std::vector<int64_t> first_;  // the norm's block partials of each parameter
  Tensor state_, table_, records_, partial_, first_device_;  // device memory, as bytes
};

// ---- learning-rate schedules ------------------------------------------------------------------
// The learning rate for the step after `steps_done` steps: set it with
//   opt.set_lr(schedule.lr_at(opt.step_count()));
struct ConstantLr {
  float lr;
  float lr_at(int64_t /*steps_done*/) const { return lr; }
};
// Rises linearly from lr / warmup_steps (first step) to lr (step warmup_steps), then stays.
struct LinearWarmupLr {
  LinearWarmupLr(float lr, int64_t warmup_steps);
  float lr_at(int64_t steps_done) const;
  float lr;
  int64_t warmup_steps;
};

// torch.optim.lr_scheduler.ReduceLROnPlateau, mode "min", threshold_mode "rel": a metric is an
// improvement when metric < best * (1 - threshold); after more than `patience` epochs without
// one, lr = max(lr * factor, min_lr) (skipped when the change is <= 1e-8), then `cooldown`
// epochs in which bad epochs are not counted.
struct PlateauOptions {
  double factor = 0.1;      // in (0, 1)
  int64_t patience = 10;    // >= 0
  double threshold = 1e-4;  // >= 0
  int64_t cooldown = 0;     // >= 0
  double min_lr = 0.0;      // >= 0
};
class ReduceLrOnPlateau {
 public:
  explicit ReduceLrOnPlateau(const PlateauOptions& options = {});
  // Records one epoch's metric (e.g. validation loss) and lowers opt's lr when due. Returns
  // true when it lowered it.
  bool step(double metric, Optimizer& opt);
  double best() const { return best_; }
  int64_t bad_epochs() const { return num_bad_epochs_; }
  int64_t cooldown_counter() const { return cooldown_counter_; }
  // Puts back best(), bad_epochs() and cooldown_counter() saved by an earlier run (e.g. in a
  // checkpoint), so a resumed run lowers the lr at the same epochs. The current lr lives in the
  // optimizer's state. Throws on negative counts or a NaN best.
  void restore(double best, int64_t bad_epochs, int64_t cooldown_counter);

 private:
  PlateauOptions options_;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
};

}  // namespace clustr::optim
