// Per-element optimizer updates, shared by the CPU loops (optim/optimizer.cpp) and the CUDA
// kernels (optim/cuda/update.cu). Everything that depends only on the step number (bias
// corrections, the R-Adam rectification) is computed once per step on the host into a *Scalars
// struct, passed to the kernels by value; the functions here are the per-element part. Each
// updates p and its state in place (=, not +=).
//
// Formulas follow PyTorch 1.13's single-tensor torch.optim implementations, so that the
// float64 reference trajectories in tests/fixtures/optim/ are reproduced.
#pragma once

#include <cmath>

#include "core/hostdevice.h"

namespace clustr::optim::math {

// SGD with momentum (dampening 0):
//   d = g + weight_decay * p
//   buf = d on the first step, else momentum * buf + d
//   d = nesterov ? d + momentum * buf : buf;   p -= lr * d
// Without momentum buf is not touched (the caller passes a dummy).
struct SgdScalars {
  float lr, momentum, weight_decay;
  bool nesterov, first_step;
};
CLUSTR_HD void sgd_update(float& p, float g, float& buf, const SgdScalars& s) {
  float d = g + s.weight_decay * p;
  if (s.momentum != 0.0f) {
    buf = s.first_step ? d : s.momentum * buf + d;
    d = s.nesterov ? d + s.momentum * buf : buf;
  }
  p -= s.lr * d;
}

// Adam, AdamW and R-Adam share the moment updates:
//   m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2
// with g = grad + l2 * p (L2 weight decay, Adam/R-Adam) and p *= decay_factor first
// (decoupled weight decay, AdamW: decay_factor = 1 - lr * weight_decay).
struct AdamScalars {
  float beta1, beta2;
  float l2;            // added to the gradient: g += l2 * p
  float decay_factor;  // p *= decay_factor before the update (1 when not decoupled)
  // Adam: p -= step_size * m / (sqrt(v) / sqrt_bc2 + eps), step_size = lr / (1 - beta1^t),
  // sqrt_bc2 = sqrt(1 - beta2^t).
  float step_size, sqrt_bc2, eps;
  // R-Adam: rectified (rho_t > 5): p -= step_size * rect * sqrt_bc2 * m / (sqrt(v) + eps),
  // else p -= step_size * m (bias-corrected momentum, no second moment).
  bool rectified;
  float rect;
};

CLUSTR_HD void moments_update(float& p, float g, float& m, float& v, const AdamScalars& s,
                              float& g_out) {
  p *= s.decay_factor;
  g_out = g + s.l2 * p;
  m = s.beta1 * m + (1.0f - s.beta1) * g_out;
  v = s.beta2 * v + (1.0f - s.beta2) * g_out * g_out;
}

CLUSTR_HD void adam_update(float& p, float g, float& m, float& v, const AdamScalars& s) {
  float gw;
  moments_update(p, g, m, v, s, gw);
  const float denom = sqrtf(v) / s.sqrt_bc2 + s.eps;
  p -= s.step_size * m / denom;
}

// As PyTorch 1.13's RAdam: eps is added to sqrt(v) (not to sqrt(v_hat) = sqrt(v) / sqrt_bc2).
CLUSTR_HD void radam_update(float& p, float g, float& m, float& v, const AdamScalars& s) {
  float gw;
  moments_update(p, g, m, v, s, gw);
  if (s.rectified)
    p -= s.step_size * m * (s.sqrt_bc2 / (sqrtf(v) + s.eps)) * s.rect;
  else
    p -= s.step_size * m;
}

// The scalars of one step of any optimizer (the one that steps uses its own), and what a step
// decided on the device (optim::DeviceSteps) keeps there.
struct StepScalars {
  SgdScalars sgd;
  AdamScalars adam;
};
struct DeviceStepState {
  StepScalars scalars;  // the current step's (when it is not skipped)
  double sum_sq;        // the current step's sum of the squared gradients
  float clip_scale;     // gradients *= clip_scale before the update (1: not clipped)
  int32_t skip;         // 1: the current step's loss or gradient norm is not finite
  int32_t queued;       // steps queued since the window was prepared
  int32_t taken;        // updates made since then (the scalars table's index)
  int32_t overflow;     // 1: more steps were queued than the window holds
};
// What the host reads back of each step of a window.
constexpr int kStepExtras = 2;
struct StepRecord {
  double norm;  // the gradient norm before clipping
  float loss;
  int32_t skipped;            // 1: no update (a non-finite loss or norm)
  float extra[kStepExtras];  // the caller's values of the step (DeviceSteps::queue_step)
};

// clip_grad_norm's factor (as torch.nn.utils.clip_grad_norm_: the 1e-6 keeps it finite for a
// zero norm): the gradients are scaled by it when it is below 1 (also false for a NaN norm).
CLUSTR_HD double clip_coefficient(double max_norm, double norm) { return max_norm / (norm + 1e-6); }
// Neither infinite nor NaN (x - x is NaN for both), on the host and the device alike.
CLUSTR_HD bool finite(double x) { return x - x == 0.0; }

}  // namespace clustr::optim::math
