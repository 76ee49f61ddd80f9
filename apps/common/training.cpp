// What the apps' training loops share (training.h).
#include "apps/common/training.h"

#include <cmath>
#include <cstdarg>
#include <filesystem>
#include <new>
#include <cstdlib>
#include <system_error>

#include "core/error.h"
#include "core/safetensors.h"

namespace clustr {

namespace {
std::string& memory_flags() {
  static std::string flags;
  return flags;
}
}  // namespace

void note_memory_flags(const std::string& flags) { memory_flags() = flags; }

std::string error_text(const std::exception& e) {
  const std::string what = e.what();
  const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
                   what.find("out of host memory") != std::string::npos ||
                   what.find("out of device memory") != std::string::npos ||
                   what.find("out of memory") != std::string::npos;
  if (!oom) return what;
  std::string text = dynamic_cast<const std::bad_alloc*>(&e) ? "out of host memory (" + what + ")"
                                                             : what;
  if (!memory_flags().empty())
    text += "\n  this run's memory grows with " + memory_flags() +
            ": lower them, or give the process more memory";
  return text;
}

void check_threads(int threads, const char* flag) {
  CLUSTR_CHECK(threads >= 0 && threads <= kMaxThreads, flag, " must be in [0, ", kMaxThreads,
               "] (0: OpenMP's default), got ", threads);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void logf(std::FILE* log, const char* format, ...) {
  if (!log) return;
  va_list args;
  va_start(args, format);
  std::vfprintf(log, format, args);
  va_end(args);
  std::fflush(log);
}

uint64_t derive_key(uint64_t seed, uint64_t purpose) {
  uint64_t z = seed + purpose * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainingOptions& c,
                                                 optim::NamedParameters params) {
  if (c.optimizer == "sgd")
    return std::make_unique<optim::Sgd>(std::move(params),
                                        optim::SgdOptions{c.lr, c.momentum, false, c.weight_decay});
  optim::AdamOptions a;
  a.lr = c.lr;
  a.weight_decay = c.weight_decay;
  a.decay = c.decoupled_weight_decay ? optim::WeightDecay::decoupled : optim::WeightDecay::l2;
  if (c.optimizer == "radam") return std::make_unique<optim::RAdam>(std::move(params), a);
  if (c.optimizer == "adamw") return std::make_unique<optim::AdamW>(std::move(params), a);
  CLUSTR_CHECK(c.optimizer == "adam", "--optimizer must be radam, adam, adamw or sgd, got '",
               c.optimizer, "'");
  return std::make_unique<optim::Adam>(std::move(params), a);
}

namespace {
constexpr const char* kPlateauBest = "state.plateau-best";
constexpr const char* kPlateauBad = "state.plateau-bad-epochs";
constexpr const char* kPlateauCooldown = "state.plateau-cooldown";
}  // namespace

LrSchedule::LrSchedule(const TrainingOptions& o) : o_(o) {
  if (o.lr_schedule == "plateau")
    plateau_ = std::make_unique<optim::ReduceLrOnPlateau>(optim::PlateauOptions{
        o.plateau_factor, o.plateau_patience, o.plateau_threshold, o.plateau_cooldown,
        o.min_lr});
}

void LrSchedule::before_step(int64_t done, optim::Optimizer& opt) const {
  opt.set_lr(lr_for(done, opt.lr()));
}

float LrSchedule::lr_for(int64_t done, float current) const {
  if (plateau_ && done >= o_.warmup) return current;  // the plateau schedule owns the lr
  if (o_.lr_schedule != "constant" && o_.warmup > 0 && done < o_.warmup)
    return optim::LinearWarmupLr(o_.lr, o_.warmup).lr_at(done);
  return o_.lr;
}

bool LrSchedule::at_evaluation(double loss, int64_t done, optim::Optimizer& opt) {
  return plateau_ && done >= o_.warmup && std::isfinite(loss) && plateau_->step(loss, opt);
}

void LrSchedule::save(std::map<std::string, std::string>& config) const {
  if (!plateau_) return;
  char best[40];
  std::snprintf(best, sizeof best, "%.17g", plateau_->best());  // reads back exactly
  config[kPlateauBest] = best;
  config[kPlateauBad] = std::to_string(plateau_->bad_epochs());
  config[kPlateauCooldown] = std::to_string(plateau_->cooldown_counter());
}

void LrSchedule::restore(const std::map<std::string, std::string>& config,
                         const std::string& file) {
  if (!plateau_ || !config.count(kPlateauBest)) return;
  plateau_->restore(config_number(config, kPlateauBest, file),
                    int64_t(config_number(config, kPlateauBad, file)),
                    int64_t(config_number(config, kPlateauCooldown, file)));
}

std::string resolve_checkpoint(const std::string& path, const char* flag,
                               std::initializer_list<const char*> names) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    CLUSTR_CHECK(std::filesystem::is_regular_file(path, ec), flag,
                 ": no such checkpoint file or folder: ", path);
    return path;
  }
  std::string listed;
  for (const char* name : names) {
    const std::string file = (std::filesystem::path(path) / name).string();
    if (std::filesystem::is_regular_file(file, ec)) return file;
    listed += listed.empty() ? name : std::string(" nor ") + name;
  }
  throw Error(detail::cat(flag, ": the folder ", path, " holds ",
                          names.size() > 1 ? "neither " : "no ", listed));
}

double clip_or_measure(const optim::NamedParameters& params, float clip) {
  std::vector<Variable> plain;
  for (const auto& np : params) plain.push_back(np.second);
  return clip > 0.0f ? optim::clip_grad_norm(plain, double(clip)) : optim::grad_norm(plain);
}

TrainerBase::TrainerBase(const MachineOptions& machine, const TrainingOptions& training,
                         std::FILE* log)
    : log_(log),
      device_(prepare_machine(machine)),
      seed_(training.seed),
      gen_(derive_key(training.seed, 0)),
      schedule_(training) {}

void NonFiniteSteps::skipped(const std::string& what, std::FILE* log,
                             const std::string& last_checkpoint) {
  ++total_;
  ++in_a_row_;
  if (log) {
    std::fprintf(log, "%s; step skipped (%lld in a row; the run stops at %lld)\n", what.c_str(),
                 static_cast<long long>(in_a_row_), static_cast<long long>(limit_));
    std::fflush(log);
  }
  CLUSTR_CHECK(in_a_row_ < limit_, "training stopped: ", in_a_row_, " steps in a row had a ",
               "non-finite loss or gradient norm (the last: ", what, "); ", last_checkpoint,
               ". Lower --lr, clip the gradients (--clip), or allow more skipped steps with "
               "--max-skipped-steps");
}

void check_finite_state(const Module& model,
                        const std::vector<std::pair<std::string, Tensor>>& extras,
                        const std::string& path) {
  auto check = [&](const std::string& name, const Tensor& t) {
    if (t.dtype() != DType::f32) return;
    const std::vector<float> v = t.to_vector();
    for (size_t i = 0; i < v.size(); ++i)
      CLUSTR_CHECK(std::isfinite(v[i]), "not writing the checkpoint ", path, ": ", name,
                   " holds a non-finite value (", v[i], " at element ", i, "); the file is "
                   "left as it was");
  };
  for (const auto& [name, p] : model.named_parameters()) check(name, p.data());
  for (const auto& [name, t] : extras) check(name, t);
}

}  // namespace clustr
