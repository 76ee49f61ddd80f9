// Connectionist temporal classification loss (Graves et al. 2006), the speech model's loss.
//
// Legend: B utterances, T frames (the padded length), V classes (blank included), U labels of
// one target, P = 2U + 1 positions of the extended target (blank, l1, blank, l2, ..., blank).
//
// Layout: logits are batch-first (B, T, V), as the encoder produces them; PyTorch's ctc_loss
// takes time-first log-probabilities (T, B, V). The logits are unnormalised: the log-softmax
// over V is part of the op. Utterance b uses frames t < input_lengths[b]; its target is
// targets[b, 0:target_lengths[b]] (padded (B, Umax)) or the b-th run of target_lengths[b]
// labels of a concatenated (sum of target_lengths) vector.
//
// The loss of utterance b is -ln p(target | logits) summed over every alignment (the
// forward-backward algorithm). Everything runs in one fused pass per utterance:
//   log-softmax of the frames -> alpha recursion in log space -> loss;
//   and when a gradient is wanted: beta recursion (backwards) -> per frame the occupation
//   posterior gamma_t(c) of each class -> d loss / d logits[t, c] = softmax_t(c) - gamma_t(c).
// So the backward of the autograd op only scales that saved gradient.
//
// Impossible targets (fewer frames than U plus the repeats, which need a blank between them)
// have loss +inf and a zero gradient (PyTorch gives NaN there); zero_infinity turns the loss
// into 0. Input length 0 gives loss 0 for an empty target and +inf otherwise (PyTorch 1.13
// reads uninitialised memory there).
//
// Devices: logits may be on the cpu or the CUDA device; there the CUDA kernel (cuda/ctc.h) runs
// the same recursions with one block per utterance, and the loss, its reduction and the
// gradient stay on the device. The lengths and targets may be on either device; their values
// are read on the host (the batch's own are there already), which checks them and lays out what
// the kernel reads. On the CUDA device `impossible` counts the utterances whose target cannot
// fit in their frames (from the lengths, without reading the device); the CPU kernel counts
// also one whose logits make every alignment impossible (-inf logits), which on the device
// shows only as its +inf loss.
#pragma once

#include <cstdint>
#include <vector>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace clustr {

enum class CtcReduction { none, sum, mean };
const char* to_string(CtcReduction r);  // "none", "sum", "mean"

struct CtcOptions {
  int blank = 0;  // the class index of the blank, in [0, V)
  // none: the per-utterance losses (B); sum: their sum; mean (PyTorch's default): each loss
  // divided by its target length (at least 1), then the mean over the batch.
  CtcReduction reduction = CtcReduction::mean;
  bool zero_infinity = false;  // impossible utterances count as loss 0 (and gradient 0)
};

// The tensor-level op (no autograd).
//   logits f32 (B, T, V), input_lengths i32 (B) in [0, T], targets i32 (B, Umax) or
//   (sum of target_lengths), target_lengths i32 (B) >= 0; labels in [0, V) and != blank.
// Returns per-utterance losses and, when want_grad, d loss_b / d logits (the reduction is
// applied by the caller), both on the logits' device.
struct CtcOutput {
  Tensor loss;             // f32 (B): -ln p(target_b | logits_b); +inf when impossible
  Tensor grad;             // f32 (B, T, V) (overwritten, 0 for t >= input_lengths[b] and for
                           // impossible utterances), or undefined without want_grad
  int64_t impossible = 0;  // utterances whose target cannot be aligned (loss +inf)
};
CtcOutput ctc_loss_forward(const Tensor& logits, const Tensor& input_lengths, const Tensor& targets,
                           const Tensor& target_lengths, int blank, bool want_grad);

// The instruction set the kernel runs with on this CPU: "avx512", "avx2" or "generic" (the
// environment variable CLUSTR_CTC_KERNEL forces one, for tests and comparisons).
const char* ctc_kernel_name();

// The differentiable loss. `loss` is shape () for sum and mean, (B) for none; `impossible`
// counts the utterances that could not be aligned (whatever zero_infinity says), for an app
// to report; `per_utterance` is each utterance's loss before reduction and zero_infinity. The
// loss, its gradient and per_utterance are on the logits' device.
struct CtcLoss {
  Variable loss;
  Tensor per_utterance;  // f32 (B)
  int64_t impossible = 0;
};
CtcLoss ctc_loss(const Variable& logits, const Tensor& input_lengths, const Tensor& targets,
                 const Tensor& target_lengths, const CtcOptions& options = {});

// For a step captured in a CUDA graph, which cannot copy from the host: what the CUDA kernel
// reads of a batch (cuda/ctc.h's info), laid out on the host from its lengths and targets (as
// ctc_loss checks them) for logits (B, T, V). The caller copies `words` into a device buffer
// before each replay; the graph's ctc_loss reads it there.
struct CtcLayout {
  int64_t B = 0, T = 0, V = 0;
  int64_t Pmax = 0;        // positions of the longest extended target (2 Umax + 1)
  int blank = 0;
  int64_t impossible = 0;  // utterances whose target cannot fit in their frames
  std::vector<int32_t> words;
};
CtcLayout ctc_layout(int64_t T, int64_t V, const Tensor& input_lengths, const Tensor& targets,
                     const Tensor& target_lengths, int blank = 0);
// ctc_loss on the CUDA device from a layout whose words are in `info` (i32, on the logits'
// device): the same result as ctc_loss from the lengths and targets the layout was made from;
// `impossible` is the layout's.
CtcLoss ctc_loss(const Variable& logits, const CtcLayout& layout, const Tensor& info,
                 const CtcOptions& options = {});

}  // namespace clustr
