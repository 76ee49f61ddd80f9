// CPU layer norm kernels: raw pointers, no validation (the front doors in core/ops_nn.cpp and
// core/ops_fused.cpp did it), OpenMP inside. Every output is overwritten (=). Deterministic at
// any thread count (docs/ARCHITECTURE.md, "Threads and determinism"; dgamma and dbeta in the
// row groups of math::layer_norm_group_rows). The CUDA twin: core/cuda/layer_norm.cu.
//
// Legend: R rows, D the normalised width.
#pragma once

#include <cstdint>

namespace clustr::cpu {

// x, y (R, D); gamma, beta (D); mean, rstd (R). y = (x - mean) * rstd * gamma + beta with the
// biased variance; mean and rstd are written for backward.
void layer_norm(const float* x, const float* gamma, const float* beta, float eps, float* y,
                float* mean, float* rstd, int64_t R, int64_t D);
// dy, x, dx (R, D); mean, rstd (R); gamma, dgamma, dbeta (D). dx, dgamma and dbeta are
// overwritten (dgamma = sum over rows of dy * xhat, dbeta = sum over rows of dy).
void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                         const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t R,
                         int64_t D);
// The same for the residual sum x = a + b (a, b (R, D); float sums, as the add op gives them),
// which is never stored: backward recomputes it. dx is the gradient of both a and b.
void add_layer_norm(const float* a, const float* b, const float* gamma, const float* beta,
                    float eps, float* y, float* mean, float* rstd, int64_t R, int64_t D);
void add_layer_norm_backward(const float* dy, const float* a, const float* b, const float* mean,
                             const float* rstd, const float* gamma, float* dx, float* dgamma,
                             float* dbeta, int64_t R, int64_t D);

}  // namespace clustr::cpu
