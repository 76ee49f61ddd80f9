// Gradient clipping by global norm and the learning-rate schedules (optim/optimizer.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/cpu/row_clones.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/ops_check.h"
#include "optim/cuda/update.h"
#include "optim/optimizer.h"

namespace clustr::optim {

namespace {

// Every gradient of params, in order (parameters without one are skipped).
std::vector<const Tensor*> gradients(const std::vector<Variable>& params, const char* op) {
  std::vector<const Tensor*> grads;
  for (const Variable& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    detail::check_f32(op, "gradient", p.grad());
    grads.push_back(&p.grad());
  }
  return grads;
}

// The sum of the squares of x[0, n), in double: eight running sums (element i goes to sum
// i % 8), added pairwise at the end. The order depends on n alone, and the loop vectorises:
// one running sum waits on each addition in turn, and took 1.5% of a copy-task step. (A
// float's square is exact in double, so the clones that fuse the multiply-add agree bit for
// bit with those that do not.)
CLUSTR_ROW_CLONES
double sum_squares(const float* x, int64_t n) {
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += double(x[i + k]) * double(x[i + k]);
  for (; i < n; ++i) acc[i % 8] += double(x[i]) * double(x[i]);
  for (int w = 4; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// A CPU gradient's sum of squares: pieces of kNormPiece elements summed by the threads
// (sum_squares), their sums then added in order, so the result depends on n alone. One thread
// alone reads memory at half the rate that two do, and a pretrained encoder's gradients (its
// embedding table's among them) are 90 MB.
constexpr int64_t kNormPiece = 1 << 16;
double cpu_sum_squares(const float* x, int64_t n) {
  const int64_t pieces = (n + kNormPiece - 1) / kNormPiece;
  if (pieces <= 1) return sum_squares(x, n);
  std::vector<double> part(static_cast<size_t>(pieces));
#pragma omp parallel for schedule(static)
  for (int64_t q = 0; q < pieces; ++q)
    part[q] = sum_squares(x + q * kNormPiece, std::min(kNormPiece, n - q * kNormPiece));
  double sum = 0.0;
  for (double v : part) sum += v;
  return sum;
}

// Device gradients are summed on the device, all before a single copy back; then one double
// sum in the order of params (each gradient adds its own sum: cpu_sum_squares on the cpu): the
// norm is the same whatever the thread count.
double norm_of(const std::vector<const Tensor*>& grads) {
  std::vector<const float*> device_x;
  std::vector<int64_t> device_n;
  for (const Tensor* g : grads)
    if (g->device() == Device::cuda) {
      device_x.push_back(g->f32());
      device_n.push_back(g->numel());
    }
  const std::vector<double> device_sums =
      device_x.empty() ? std::vector<double>{} : cuda::sum_squares(device_x, device_n);
  double sum_sq = 0.0;
  size_t next_device = 0;
  for (const Tensor* g : grads) {
    if (g->device() == Device::cuda) {
      sum_sq += device_sums[next_device++];
      continue;
    }
    sum_sq += cpu_sum_squares(g->f32(), g->numel());
  }
  return std::sqrt(sum_sq);
}

}  // namespace

double grad_norm(const std::vector<Variable>& params) {
  return norm_of(gradients(params, "grad_norm"));
}

double clip_grad_norm(const std::vector<Variable>& params, double max_norm) {
  CLUSTR_CHECK(std::isfinite(max_norm) && max_norm > 0.0,
               "clip_grad_norm: max_norm must be a finite number > 0, got ", max_norm);
  const std::vector<const Tensor*> grads = gradients(params, "clip_grad_norm");
  const double norm = norm_of(grads);
  // As torch.nn.utils.clip_grad_norm_: the 1e-6 keeps the factor finite for a zero norm and
  // makes the clipped norm land just below max_norm.
  const double coef = math::clip_coefficient(max_norm, norm);
  if (coef < 1.0) {  // also false for a NaN norm, which is returned for the caller to see
    const float c = static_cast<float>(coef);
    std::vector<cuda::TensorSlots> device_grads;  // scaled together, a launch per 48
    for (const Tensor* g : grads) {
      float* x = g->f32();
      if (g->device() == Device::cuda)
        device_grads.push_back({x, nullptr, nullptr, nullptr, g->numel()});
      else
#pragma omp parallel for schedule(static) if (g->numel() >= kNormPiece)
        for (int64_t i = 0; i < g->numel(); ++i) x[i] *= c;
    }
    if (!device_grads.empty()) cuda::scale_many(device_grads, c);
  }
  return norm;
}

double clip_grad_norm(const NamedParameters& params, double max_norm) {
  std::vector<Variable> plain;
  for (const auto& np : params) plain.push_back(np.second);
  return clip_grad_norm(plain, max_norm);
}

LinearWarmupLr::LinearWarmupLr(float lr_, int64_t warmup_steps_)
    : lr(lr_), warmup_steps(warmup_steps_) {
  CLUSTR_CHECK(std::isfinite(lr) && lr >= 0.0f, "LinearWarmupLr: lr must be >= 0, got ", lr);
  CLUSTR_CHECK(warmup_steps >= 1, "LinearWarmupLr: warmup_steps must be >= 1, got ",
               warmup_steps);
}

float LinearWarmupLr::lr_at(int64_t steps_done) const {
  CLUSTR_CHECK(steps_done >= 0, "LinearWarmupLr: steps_done must be >= 0, got ", steps_done);
  if (steps_done + 1 >= warmup_steps) return lr;
  return static_cast<float>(double(lr) * double(steps_done + 1) / double(warmup_steps));
}

ReduceLrOnPlateau::ReduceLrOnPlateau(const PlateauOptions& o)
    : options_(o), best_(std::numeric_limits<double>::infinity()) {
  CLUSTR_CHECK(o.factor > 0.0 && o.factor < 1.0,
               "ReduceLrOnPlateau: factor must be in (0, 1), got ", o.factor);
  CLUSTR_CHECK(o.patience >= 0, "ReduceLrOnPlateau: patience must be >= 0, got ", o.patience);
  CLUSTR_CHECK(o.threshold >= 0.0 && o.threshold < 1.0,
               "ReduceLrOnPlateau: threshold must be in [0, 1), got ", o.threshold);
  CLUSTR_CHECK(o.cooldown >= 0, "ReduceLrOnPlateau: cooldown must be >= 0, got ", o.cooldown);
  CLUSTR_CHECK(o.min_lr >= 0.0, "ReduceLrOnPlateau: min_lr must be >= 0, got ", o.min_lr);
}

void ReduceLrOnPlateau::restore(double best, int64_t bad_epochs, int64_t cooldown_counter) {
  CLUSTR_CHECK(!std::isnan(best), "ReduceLrOnPlateau::restore: best must not be NaN");
  CLUSTR_CHECK(bad_epochs >= 0, "ReduceLrOnPlateau::restore: bad_epochs must be >= 0, got ",
               bad_epochs);
  CLUSTR_CHECK(cooldown_counter >= 0,
               "ReduceLrOnPlateau::restore: cooldown_counter must be >= 0, got ",
               cooldown_counter);
  best_ = best;
  num_bad_epochs_ = bad_epochs;
  cooldown_counter_ = cooldown_counter;
}

bool ReduceLrOnPlateau::step(double metric, Optimizer& opt) {
  // The order of PyTorch's ReduceLROnPlateau.step: count, then cooldown, then reduce.
  if (metric < best_ * (1.0 - options_.threshold)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;
  }
  if (num_bad_epochs_ <= options_.patience) return false;
  cooldown_counter_ = options_.cooldown;
  num_bad_epochs_ = 0;
  const double old_lr = opt.lr();
  const double new_lr = std::max(old_lr * options_.factor, options_.min_lr);
  if (old_lr - new_lr <= 1e-8) return false;
  opt.set_lr(static_cast<float>(new_lr));
  return true;
}

}  // namespace clustr::optim
