// CPU kernels of the nn ops and of their backward passes: raw pointers, no validation (the
// front doors in core/ops_nn.cpp did it), OpenMP inside. Every output is overwritten (=);
// nothing here accumulates. Deterministic at any thread count (docs/ARCHITECTURE.md, "Threads
// and determinism").
//
// Legend: n elements, R rows, V classes (vocabulary). (Layer norm: core/cpu/layer_norm.h.)
#pragma once

#include <cstdint>

#include "core/ops.h"

namespace clustr::cpu {

// Which of x and y the derivative of `op` reads (core/math.h); the other may be null below.
struct UnaryGradInputs {
  bool x = false, y = false;
};
UnaryGradInputs unary_grad_inputs(UnaryOp op);

// x, y, dy, dx (n): dx = dy * f'(x) for y = unary(op, x).
void unary_backward(UnaryOp op, const float* x, const float* y, const float* dy, float* dx,
                    int64_t n);

// logits (R, V); target (R), each in [0, V) or ignore_index (checked by the caller); weight (R)
// or null (every w_r = 1); lse (R) = logsumexp of each row. Returns the sums over the rows
// (CrossEntropySums, core/ops.h). Rows whose target is ignore_index
// are not counted; rows with w_r = 0 add 0 (even when the row's loss is inf). predictions (R),
// or null for none: each row's argmax (the first largest logit).
CrossEntropySums cross_entropy(const float* logits, const int32_t* target, const float* weight,
                               int32_t ignore_index, float* lse, int64_t R, int64_t V,
                               int32_t* predictions = nullptr);
// dlogits (R, V) = scale * w_r * (softmax(logits_r) - onehot(target_r)), 0 on ignored rows;
// logits (R, V), target, weight (or null), lse (R) as above; scale = dloss / norm.
void cross_entropy_backward(float scale, const float* logits, const int32_t* target,
                            const float* weight, const float* lse, int32_t ignore_index,
                            float* dlogits, int64_t R, int64_t V);

// x, y (n): y[i] = x[i] / (1 - p) when uint_to_unit(philox4x32(seed, offset + i/4).v[i%4]) >= p,
// else 0. p in [0, 1).
// Vectors with AVX-512 where the CPU has it, else dropout_portable (also called by the tests).
void dropout(const float* x, float p, uint64_t seed, uint64_t offset, float* y, int64_t n);
void dropout_portable(const float* x, float p, uint64_t seed, uint64_t offset, float* y,
                      int64_t n);

}  // namespace clustr::cpu
