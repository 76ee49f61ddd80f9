// CPU layer norm, forward and backward, plain and on a residual sum (core/cpu/layer_norm.h);
// the twin of core/cuda/layer_norm.cu. The per-element formulas live in core/math.h.
//
// Row sums are accumulated in double over 8 partial sums in a fixed order (row_sum.h), so a
// row's result is the same whichever thread computes it. The one sum across rows, dgamma and
// dbeta, is split into row blocks whose number depends only on R, and the block partials are
// added in block order.
//
// The per-row functions are compiled for AVX-512, AVX2 and plain x86-64 (target_clones; the
// loader picks one for this CPU): they are the hot loops of a transformer layer's
// normalisation, and the baseline build would run their double sums two lanes at a time. Each
// version sums in the same order and none fuses a multiply-add (fp-contract=off: with D = 1, a
// fused dy * gamma - mean(dy * gamma) would not cancel to 0), so every version gives the same
// bits as the plain one.
#include "core/cpu/layer_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/row_clones.h"
#include "core/cpu/row_sum.h"
#include "core/math.h"

namespace clustr::cpu {

namespace {

constexpr int64_t kParallelMin = 16384;  // elements; below this a parallel region costs more

// The layer-norm input row: x itself, or x + x2 (float sums, as the add op would give) in
// `scratch` (D floats).
inline const float* input_row(const float* x, const float* x2, float* scratch, int64_t D) {
  if (!x2) return x;
  for (int64_t j = 0; j < D; ++j) scratch[j] = x[j] + x2[j];
  return scratch;
}

// One row of layer norm forward: x, y (D). Two passes in double (mean, then the mean square
// deviation from it): no cancellation even for rows like 1e4 + small noise, where E[x^2] -
// E[x]^2 in float is noise.
CLUSTR_ROW_CLONES_NO_CONTRACT
void layer_norm_row(const float* x, const float* gamma, const float* beta, float eps, float* y,
                    float* mean, float* rstd, int64_t D) {
  const double mu = row_sum(D, [&](int64_t j) { return double(x[j]); }) / double(D);
  const double var = row_sum(D, [&](int64_t j) {
                       const double d = x[j] - mu;
                       return d * d;
                     }) / double(D);
  const double rs = math::layer_norm_rstd(var, eps);
  *mean = static_cast<float>(mu);
  *rstd = static_cast<float>(rs);
  for (int64_t j = 0; j < D; ++j) y[j] = math::layer_norm_value(x[j], mu, rs, gamma[j], beta[j]);
}

// One row of layer norm backward: dy, x, dx (D); dx is written, and dy * xhat and dy are added
// to the block partials pg and pb (D). The row's constants, and why the mean is recomputed:
// math::layer_norm_row_grad.
CLUSTR_ROW_CLONES_NO_CONTRACT
void layer_norm_backward_row(const float* dy, const float* x, float mean_f, float rstd,
                             const float* gamma, float* dx, double* pg, double* pb, int64_t D) {
  const double m = mean_f;
  const double sum_g = row_sum(D, [&](int64_t j) { return double(dy[j]) * gamma[j]; });
  const double sum_d = row_sum(D, [&](int64_t j) { return double(x[j]) - m; });
  const double sum_gd =
      row_sum(D, [&](int64_t j) { return double(dy[j]) * gamma[j] * (double(x[j]) - m); });
  const math::LayerNormRowGrad k =
      math::layer_norm_row_grad(sum_g, sum_d, sum_gd, mean_f, rstd, D);
  for (int64_t j = 0; j < D; ++j) {
    const float xhat = math::layer_norm_xhat(x[j], k.shift, rstd);
    dx[j] = math::layer_norm_dx(math::layer_norm_g(dy[j], gamma[j]), xhat, k.mean_g, k.mean_gx, rstd);
    pg[j] += double(dy[j]) * xhat;
    pb[j] += dy[j];
  }
}

// The input rows are x, or x + x2 when x2 is not null.
void layer_norm_rows(const float* x, const float* x2, const float* gamma, const float* beta,
                     float eps, float* y, float* mean, float* rstd, int64_t R, int64_t D) {
#pragma omp parallel if (R * D >= kParallelMin)
  {
    std::vector<float> scratch(x2 ? static_cast<size_t>(D) : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const float* xr = input_row(x + r * D, x2 ? x2 + r * D : nullptr, scratch.data(), D);
      layer_norm_row(xr, gamma, beta, eps, y + r * D, mean + r, rstd + r, D);
    }
  }
}

void layer_norm_rows_backward(const float* dy, const float* x, const float* x2,
                              const float* mean, const float* rstd, const float* gamma,
                              float* dx, float* dgamma, float* dbeta, int64_t R, int64_t D) {
  // Block b holds rows [b * block_rows, (b + 1) * block_rows); the split depends on R only.
  const int64_t block_rows = math::layer_norm_group_rows(R);
  const int64_t blocks = (R + block_rows - 1) / block_rows;
  // partial[b] = (sum of dy * xhat over block b's rows (D), sum of dy (D)).
  std::vector<double> partial(static_cast<size_t>(2 * blocks * D), 0.0);
#pragma omp parallel if (R * D >= kParallelMin)
  {
    std::vector<float> scratch(x2 ? static_cast<size_t>(D) : 0);
#pragma omp for schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
      double* pg = partial.data() + 2 * b * D;
      double* pb = pg + D;
      const int64_t r1 = std::min(R, (b + 1) * block_rows);
      for (int64_t r = b * block_rows; r < r1; ++r) {
        const float* xr = input_row(x + r * D, x2 ? x2 + r * D : nullptr, scratch.data(), D);
        layer_norm_backward_row(dy + r * D, xr, mean[r], rstd[r], gamma, dx + r * D, pg, pb, D);
      }
    }
#pragma omp for schedule(static)
    for (int64_t j = 0; j < D; ++j) {
      double g = 0, s = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        g += partial[static_cast<size_t>(2 * b * D + j)];
        s += partial[static_cast<size_t>(2 * b * D + D + j)];
      }
      dgamma[j] = static_cast<float>(g);
      dbeta[j] = static_cast<float>(s);
    }
  }
}

}  // namespace

void layer_norm(const float* x, const float* gamma, const float* beta, float eps, float* y,
                float* mean, float* rstd, int64_t R, int64_t D) {
  layer_norm_rows(x, nullptr, gamma, beta, eps, y, mean, rstd, R, D);
}

void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                         const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t R,
                         int64_t D) {
  layer_norm_rows_backward(dy, x, nullptr, mean, rstd, gamma, dx, dgamma, dbeta, R, D);
}

void add_layer_norm(const float* a, const float* b, const float* gamma, const float* beta,
                    float eps, float* y, float* mean, float* rstd, int64_t R, int64_t D) {
  layer_norm_rows(a, b, gamma, beta, eps, y, mean, rstd, R, D);
}

void add_layer_norm_backward(const float* dy, const float* a, const float* b, const float* mean,
                             const float* rstd, const float* gamma, float* dx, float* dgamma,
                             float* dbeta, int64_t R, int64_t D) {
  layer_norm_rows_backward(dy, a, b, mean, rstd, gamma, dx, dgamma, dbeta, R, D);
}

}  // namespace clustr::cpu
