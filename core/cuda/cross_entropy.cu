// CUDA cross-entropy of logits against class targets, forward and backward; the twins of
// cpu::cross_entropy and cpu::cross_entropy_backward (core/cpu/nn.cpp), with the row formulas
// of core/math.h (row weight, logsumexp, row loss, d loss / d logit).
//
// Legend: R rows, V classes (vocabulary).
//
// Forward, one launch, gives each row to one block (max, then the sum of exp(x - max) in double
// over a block_reduce), which writes the row's logsumexp, its weighted loss and weight, and,
// when asked, its argmax (the prediction, core/cuda/argmax.h); the block that finishes the last
// row (kernel.h's last_to_arrive) adds the R row terms in a fixed tree (double) and writes the
// loss, the weight sum and the loss scale (math::cross_entropy_totals) to device scalars:
// nothing comes back to the host. Backward is element-wise and reads dloss and the loss scale
// on the device.
//
// A target outside [0, V) that is not ignore_index (possible only when the front door's check
// was deferred to the device, cuda.h's DeferredChecks) reads no logit: its row's loss is NaN.
#include <cmath>
#include <cstdint>

#include "core/cuda/argmax.h"
#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/scratch.h"
#include "core/error.h"
#include "core/math.h"

namespace clustr::cuda {

namespace {

// A loss and a weight summed together.
struct Sums2 {
  double loss, weight;
};
struct AddSums2 {
  CLUSTR_HD Sums2 operator()(const Sums2& a, const Sums2& b) const {
    return {a.loss + b.loss, a.weight + b.weight};
  }
};

// logits (R, V); target, weight (or null) (R) -> lse (R), row_loss, row_weight (R, double),
// predictions (R, or null: none) = each row's argmax; then loss, weight_sum, loss_scale () from
// the sums of row_loss and row_weight, by the last block to finish a row (or, with no rows, by
// the one block). Every thread sees the same row max m, so the fully-masked branch (around a
// barrier) is taken by the whole block. Row r's target is read only when its weight is not 0:
// an ignored row's target is ignore_index, no column.
struct CrossEntropyKernel {
  static constexpr bool kUsesBarrier = true;
  const float* logits;
  const int32_t* target;
  const float* weight;
  int32_t ignore_index;
  float* lse;
  double* row_loss;
  double* row_weight;
  int32_t* predictions;
  bool mean;
  float *loss, *weight_sum, *loss_scale;
  unsigned* arrivals;  // 1 counter
  int64_t R, V;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t r = t.block_idx().x; r < R; r += t.grid_dim().x) {
      row(t, r);
      if (last_to_arrive(t, arrivals, static_cast<unsigned>(R), t.shared<int>())) total(t);
    }
    if (R == 0) total(t);
  }
  CLUSTR_DEVICE void row(const Thread& t, int64_t r) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const float* xr = logits + r * V;
    float m = -INFINITY;
    for (int64_t j = tid; j < V; j += nt) m = math::Maximum{}(m, xr[j]);
    m = block_reduce(t, m, t.shared<float>(), math::Maximum{});
    double log_s = 0.0;
    if (!math::fully_masked(m)) {
      double acc = 0.0;
      for (int64_t j = tid; j < V; j += nt) acc += double(math::exp(xr[j] - m));
      log_s = ::log(block_reduce(t, acc, t.shared<double>(), AddDouble{}));
    }
    if (predictions) {
      const int32_t best = block_argmax(t, xr, V, t.shared<ArgmaxPartial>());
      if (tid == 0) predictions[r] = best;
    }
    if (tid == 0) {
      lse[r] = math::cross_entropy_lse(m, log_s);
      const int32_t tr = target[r];
      const double w = math::cross_entropy_weight(tr, ignore_index, weight, r);
      const bool bad = tr != ignore_index && (tr < 0 || tr >= V);
      row_weight[r] = w;
      row_loss[r] = bad        ? double(NAN)
                    : w == 0.0 ? 0.0
                               : math::cross_entropy_row_loss(w, m, xr[tr], log_s);
    }
  }
  // The sums of row_loss and row_weight over all rows -> loss, weight_sum, loss_scale.
  CLUSTR_DEVICE void total(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    Sums2 acc{0.0, 0.0};
    for (int64_t r = tid; r < R; r += nt) {
      acc.loss += row_loss[r];
      acc.weight += row_weight[r];
    }
    const Sums2 s = block_reduce(t, acc, t.shared<Sums2>(), AddSums2{});
    if (tid == 0) {
      const math::CrossEntropyTotals totals = math::cross_entropy_totals(s.loss, s.weight, mean);
      *loss = totals.loss;
      *weight_sum = totals.weight_sum;
      *loss_scale = totals.loss_scale;
    }
  }
};

// dlogits (R, V) = dloss * loss_scale * w_r * (softmax(logits_r) - onehot(target_r)), 0 on rows
// with w_r = 0 and everywhere when the scale is 0.
struct CrossEntropyBackwardKernel {
  static constexpr bool kUsesBarrier = false;
  const float* dloss;
  const float* loss_scale;
  const float* logits;
  const int32_t* target;
  const float* weight;
  const float* lse;
  int32_t ignore_index;
  float* dlogits;
  int64_t R, V;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const float scale = math::cross_entropy_scale(*dloss, *loss_scale);
    for (int64_t i = global_x(t); i < R * V; i += grid_stride_x(t)) {
      const int64_t r = i / V, j = i - r * V;
      const int32_t tr = target[r];
      const float w = math::cross_entropy_weight(tr, ignore_index, weight, r);
      dlogits[i] = w == 0.0f || scale == 0.0f
                       ? 0.0f
                       : math::cross_entropy_dlogit(logits[i], lse[r], j == tr, scale * w);
    }
  }
};

}  // namespace

// logits (R, V); target (R), checked by the caller; weight (R) or null; lse (R) (=); loss,
// weight_sum, loss_scale () (=); predictions (R) (=) or null.
void cross_entropy(const float* logits, const int32_t* target, const float* weight,
                   int32_t ignore_index, float* lse, int64_t R, int64_t V, bool mean, float* loss,
                   float* weight_sum, float* loss_scale, int32_t* predictions) {
  require("cuda::cross_entropy");
  Scratch<double> row_loss(R), row_weight(R);
  const unsigned threads = row_threads(V);
  launch("cuda::cross_entropy", {R > 0 ? row_blocks(R) : 1u}, {threads},
         threads * sizeof(Sums2),
         CrossEntropyKernel{logits, target, weight, ignore_index, lse, row_loss.get(),
                            row_weight.get(), predictions, mean, loss, weight_sum, loss_scale,
                            arrival_counters(1, "cuda::cross_entropy"), R, V});
}

// logits, dlogits (R, V); target, weight (or null), lse (R); dloss, loss_scale (); dlogits
// overwritten (=).
void cross_entropy_backward(const float* dloss, const float* loss_scale, const float* logits,
                            const int32_t* target, const float* weight, const float* lse,
                            int32_t ignore_index, float* dlogits, int64_t R, int64_t V) {
  if (R * V == 0) return;
  require("cuda::cross_entropy_backward");
  launch("cuda::cross_entropy_backward", {elementwise_blocks(R * V)}, {kElementwiseThreads}, 0,
         CrossEntropyBackwardKernel{dloss, loss_scale, logits, target, weight, lse, ignore_index,
                                    dlogits, R, V});
}

}  // namespace clustr::cuda
