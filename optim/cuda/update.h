// The optimizers' CUDA kernels: the twins of the CPU loops in optim/optimizer.cpp and of the sum
// of squares in clip_grad_norm (optim/clip_schedule.cpp). Implemented by optim/cuda/update.cu
// when clustr has the CUDA backend (a GPU build or device emulation), and by
// optim/cuda/no_cuda.cpp otherwise, where every call throws a clear error.
//
// Raw pointers are device pointers, n elements each. The per-step scalars (bias corrections,
// R-Adam's rectification) are computed once on the host, as for the CPU loops, and passed by
// value; each element runs the same CLUSTR_HD formula (optim/update_math.h) as on the CPU.
// Parameters and state are updated in place (=).
#pragma once

#include <cstdint>
#include <vector>

#include "optim/update_math.h"

namespace clustr::optim::cuda {

// The updates of a whole model's parameters at once (multi-tensor): one launch per
// kTensorsPerLaunch parameters (the list travels in the kernel's arguments), each element
// updated by the CPU's formula. a and b are the parameter's state:
// SGD's momentum buffer in a (null without momentum); Adam's exp_avg in a, exp_avg_sq in b.
struct TensorSlots {
  float* p;
  float* g;  // scaled in place by the updates of a step decided on the device
  float* a;
  float* b;
  int64_t n;
};
constexpr int kTensorsPerLaunch = 48;
void sgd_update_many(const std::vector<TensorSlots>& tensors, const math::SgdScalars& s);
void adam_update_many(const std::vector<TensorSlots>& tensors, const math::AdamScalars& s,
                      bool radam);

// x *= c for every element of each tensor's p (multi-tensor, like the updates; g, a, b unused).
void scale_many(const std::vector<TensorSlots>& tensors, float c);

// sums[i] = sum over j of double(xs[i][j])^2 for the arrays xs[i] of ns[i] floats (host vector
// out, one entry per array), one launch per kTensorsPerLaunch arrays. Each array is split into
// a fixed number of blocks (a function of its length only) that sum in double in a fixed tree;
// the host adds the block sums in order, so a result never depends on timing. One copy back to
// the host for all arrays.
std::vector<double> sum_squares(const std::vector<const float*>& xs,
                                const std::vector<int64_t>& ns);

// ---- steps decided on the device (optim::DeviceSteps) ----
// The block partial sums behind sum_squares: sum_square_blocks gives their number for arrays of
// ns floats and where array i's start (first, ns.size() + 1 entries); sum_squares_partials
// launches the kernels that write them to `partial` (device), reading nothing back.
int64_t sum_square_blocks(const std::vector<int64_t>& ns, std::vector<int64_t>* first);
void sum_squares_partials(const std::vector<const float*>& xs, const std::vector<int64_t>& ns,
                          double* partial);
// The step's sum of squares of the gradients xs (sum_squares_partials's launches into partial)
// and then, on the device, in one thread of the last launch's block that finishes last
// (core/cuda/kernel.h's last_to_arrive; a launch of its own where there is nothing to sum): the
// norm from the partials (first: a device copy of sum_square_blocks's), whether the step is
// finite (its loss, a device scalar, and the norm), the clip scale for max_norm (0: no
// clipping), the scalars of update number state->taken from table (window entries), and the
// step's record (records[state->queued], with the values of the device scalars `extras`, at most
// kStepExtras). Queued past the window, it sets state->overflow and skips.
void decide_step(const std::vector<const float*>& xs, const std::vector<int64_t>& ns,
                 double* partial, const int64_t* first, const float* loss,
                 const std::vector<const float*>& extras, double max_norm,
                 const math::StepScalars* table, int32_t window, math::DeviceStepState* state,
                 math::StepRecord* records);
// The multi-tensor launches with their scalars read from the device state (and nothing done
// when it says the step is skipped): the clip scale, SGD's and the Adam family's scalars. The
// updates apply the step's clip scale to each gradient as they read it (and leave it scaled),
// so a step decided on the device needs no scaling launch of its own.
void sgd_update_many(const std::vector<TensorSlots>& tensors,
                     const math::DeviceStepState* state);
void adam_update_many(const std::vector<TensorSlots>& tensors,
                      const math::DeviceStepState* state, bool radam);

}  // namespace clustr::optim::cuda
