// CUDA kernels of the CTC loss (layers/ctc.h): the twins of ctc.cpp's per-utterance kernel, on
// device pointers. Implemented by cuda/ctc.cu when clustr has the CUDA backend (a GPU build or
// device emulation), and by cuda/no_cuda.cpp otherwise, where every call throws a clear error.
//
// Legend as in ctc.h: B utterances, T frames (padded), V classes, U labels of one target,
// P = 2U + 1 extended positions; Pmax the largest P of the batch.
//
// What the kernels read of the targets is laid out on the host by ctc.cpp (which has checked
// every length and label there) in one i32 buffer, `info`:
//   [0, 3B)                      per utterance b: frames Tb, labels U, status (kCtcRun: run the
//                                recursions; kCtcEmpty: Tb = 0 and U = 0, loss 0; kCtcImpossible:
//                                the target does not fit in Tb frames, loss +inf)
//   [3B, 3B + B Pmax)            ext: the extended target of b at b Pmax + s (s < P)
//   [3B + B Pmax, 3B + 2 B Pmax) next: for odd s, the next odd position with the same label, or -1
//   [3B + 2 B Pmax, 3B + 3 B Pmax) head: 1 at the odd positions that no earlier odd position
//                                shares a label with (each label's chain starts there), else 0
#pragma once

#include <cstdint>

namespace clustr::cuda {

constexpr int32_t kCtcRun = 0, kCtcEmpty = 1, kCtcImpossible = 2;

// The longest target the kernel takes: a block keeps two beta rows and a row of posteriors of
// 2U + 3 floats in shared memory, which at this U still fits the 99 KiB that every GPU from
// compute capability 8.6 on gives a block (227 KiB on an H100 or H200).
constexpr int64_t kCtcMaxLabels = 4000;

inline int64_t ctc_info_words(int64_t B, int64_t Pmax) { return 3 * B + 3 * B * Pmax; }

// loss (B) = -ln p(target_b | logits_b) (+inf when impossible, NaN from NaN logits); with grad
// non-null, grad (B, T, V) = d loss_b / d logits (0 past each input length and for utterances
// whose loss is not finite, NaN on the frames of a NaN one). logits (B, T, V).
void ctc_forward(const float* logits, const int32_t* info, int64_t B, int64_t T, int64_t V,
                 int64_t Pmax, int32_t blank, float* loss, float* grad);

// The reduced loss from per-utterance losses (B), in the CPU's order and precision: with
// zero_infinity a +inf loss counts as 0; reduction 0 none (out (B)), 1 sum, 2 mean (each loss
// divided by max(U, 1), the sum by B) (out ()). target_lengths: info's headers.
void ctc_reduce(const float* per_utterance, const int32_t* info, int64_t B, int reduction,
                bool zero_infinity, float* out);

// dlogits (B, T, V) = s_b grad, s_b = w_b g_b (reduction none) or w_b g (sum, mean), w_b the
// reduction's factor of utterance b (1, or 1 / (B max(U_b, 1)) for mean).
void ctc_scale_grad(const float* grad, const float* g, const int32_t* info, int64_t B, int64_t T,
                    int64_t V, int reduction, float* dlogits);

}  // namespace clustr::cuda
