// CUDA layer norm over the last axis, forward and backward; the twins of cpu::layer_norm and
// cpu::layer_norm_backward (core/cpu/nn.cpp), with the row formulas of core/math.h.
//
// Legend: R rows, D layer-norm width; G row groups of the dgamma / dbeta sums.
//
// Forward and the dx part of backward give each row to one block: its threads stride over the
// row and block_reduce combines their double partial sums, so the two backends differ only in
// the order of double additions (which almost never changes a rounded float). dgamma and dbeta
// are sums over rows, done without float atomics and in a fixed order, in the same launch: the
// block that finishes the last row of a row group of math::layer_norm_group_rows (the CPU's
// split; kernel.h's last_to_arrive) sums that group's rows in order, a thread per column, and
// the block that finishes the last group adds the G group sums in order; the CPU adds the same
// terms in the same order.
//
// Each kernel reads its row x, or the residual sum a + b of two rows (add_layer_norm: the float
// sum, formed where it is read, the element the CPU's add_layer_norm forms; no tensor of it is
// stored), through Rows below.
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/scratch.h"
#include "core/error.h"
#include "core/math.h"

namespace clustr::cuda {

namespace {

// The rows a kernel normalises: x, or x + x2 when x2 is not null.
struct Rows {
  const float* x;
  const float* x2;
  CLUSTR_HD float operator()(int64_t i) const { return x2 ? x[i] + x2[i] : x[i]; }
};

// The three row sums of backward (math::layer_norm_row_grad): g, d and g * d.
struct Sums3 {
  double g, d, gd;
};
struct AddSums3 {
  CLUSTR_HD Sums3 operator()(const Sums3& a, const Sums3& b) const {
    return {a.g + b.g, a.d + b.d, a.gd + b.gd};
  }
};

// x, y (R, D); gamma, beta (D); mean, rstd (R). One block per row; two passes over the row in
// double (the mean, then the mean square deviation from it), as the CPU does.
struct LayerNormKernel {
  static constexpr bool kUsesBarrier = true;
  Rows x;
  const float* gamma;
  const float* beta;
  float eps;
  float* y;
  float* mean;
  float* rstd;
  int64_t R, D;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    double* scratch = t.shared<double>();
    for (int64_t r = t.block_idx().x; r < R; r += t.grid_dim().x) {
      const int64_t row = r * D;
      float* yr = y + row;
      double acc = 0.0;
      for (int64_t j = tid; j < D; j += nt) acc += double(x(row + j));
      const double mu = block_reduce(t, acc, scratch, AddDouble{}) / double(D);
      acc = 0.0;
      for (int64_t j = tid; j < D; j += nt) {
        const double d = x(row + j) - mu;
        acc += d * d;
      }
      const double var = block_reduce(t, acc, scratch, AddDouble{}) / double(D);
      const double rs = math::layer_norm_rstd(var, eps);
      if (tid == 0) {
        mean[r] = static_cast<float>(mu);
        rstd[r] = static_cast<float>(rs);
      }
      for (int64_t j = tid; j < D; j += nt)
        yr[j] = math::layer_norm_value(x(row + j), mu, rs, gamma[j], beta[j]);
    }
  }
};

// Backward: dy, x, dx (R, D); mean, rstd, shift (R); gamma, dgamma, dbeta (D); pg, pb (G, D).
// One block per row: the three row sums, the row's constants, dx (=) and the row's shift (=).
// Then, in the block that finishes a group's last row (arrivals[g], one per row group g), the
// group sums pg, pb (=) = the sums over the group's rows of dy * xhat and of dy, one thread per
// column j, rows in order; and in the block that finishes the last group (arrivals[G]),
// dgamma, dbeta (=) = the G group sums of each column, in group order.
struct LayerNormBackwardKernel {
  static constexpr bool kUsesBarrier = true;
  const float* dy;
  Rows x;
  const float* mean;
  const float* rstd;
  const float* gamma;
  float* dx;
  double* shift;
  double* pg;
  double* pb;
  float* dgamma;
  float* dbeta;
  unsigned* arrivals;  // G + 1 counters
  int64_t R, D, group_rows, G;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    int* flag = t.shared<int>();
    for (int64_t r = t.block_idx().x; r < R; r += t.grid_dim().x) {
      row(t, r);
      const int64_t b = r / group_rows, r0 = b * group_rows;
      const int64_t r1 = r0 + group_rows < R ? r0 + group_rows : R;
      if (!last_to_arrive(t, arrivals + b, static_cast<unsigned>(r1 - r0), flag)) continue;
      for (int64_t j = tid; j < D; j += nt) {
        double g = 0.0, s = 0.0;
        for (int64_t q = r0; q < r1; ++q) {
          const float d = dy[q * D + j];
          g += double(d) * math::layer_norm_xhat(x(q * D + j), shift[q], rstd[q]);
          s += d;
        }
        pg[b * D + j] = g;
        pb[b * D + j] = s;
      }
      if (!last_to_arrive(t, arrivals + G, static_cast<unsigned>(G), flag)) continue;
      for (int64_t j = tid; j < D; j += nt) {
        double g = 0.0, s = 0.0;
        for (int64_t c = 0; c < G; ++c) {
          g += pg[c * D + j];
          s += pb[c * D + j];
        }
        dgamma[j] = static_cast<float>(g);
        dbeta[j] = static_cast<float>(s);
      }
    }
  }
  // Row r: its sums, constants, dx and shift.
  CLUSTR_DEVICE void row(const Thread& t, int64_t r) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t at = r * D;
    const float* dyr = dy + at;
    const double m = mean[r];
    Sums3 acc{0.0, 0.0, 0.0};
    for (int64_t j = tid; j < D; j += nt) {
      const double g = double(dyr[j]) * gamma[j], d = double(x(at + j)) - m;
      acc.g += g;
      acc.d += d;
      acc.gd += g * d;
    }
    const Sums3 s = block_reduce(t, acc, t.shared<Sums3>(), AddSums3{});
    const float rs = rstd[r];
    const math::LayerNormRowGrad k = math::layer_norm_row_grad(s.g, s.d, s.gd, mean[r], rs, D);
    if (tid == 0) shift[r] = k.shift;
    float* dxr = dx + at;
    for (int64_t j = tid; j < D; j += nt) {
      const float xhat = math::layer_norm_xhat(x(at + j), k.shift, rs);
      const float g = math::layer_norm_g(dyr[j], gamma[j]);
      dxr[j] = math::layer_norm_dx(g, xhat, k.mean_g, k.mean_gx, rs);
    }
  }
};

void launch_layer_norm(Rows x, const float* gamma, const float* beta, float eps, float* y,
                       float* mean, float* rstd, int64_t R, int64_t D) {
  if (R == 0 || D == 0) return;
  require("cuda::layer_norm");
  const unsigned threads = row_threads(D);
  launch("cuda::layer_norm", {row_blocks(R)}, {threads}, threads * sizeof(double),
         LayerNormKernel{x, gamma, beta, eps, y, mean, rstd, R, D});
}

void launch_layer_norm_backward(const float* dy, Rows x, const float* mean, const float* rstd,
                                const float* gamma, float* dx, float* dgamma, float* dbeta,
                                int64_t R, int64_t D) {
  if (D == 0) return;
  require("cuda::layer_norm_backward");
  if (R == 0) {  // no rows: dgamma = dbeta = 0
    fill_f32(dgamma, 0.0f, D);
    fill_f32(dbeta, 0.0f, D);
    return;
  }
  const int64_t group_rows = math::layer_norm_group_rows(R);
  const int64_t G = (R + group_rows - 1) / group_rows;
  Scratch<double> shift(R), pg(G * D), pb(G * D);
  unsigned* arrivals = arrival_counters(G + 1, "cuda::layer_norm_backward");
  const unsigned threads = row_threads(D);
  launch("cuda::layer_norm_backward", {row_blocks(R)}, {threads}, threads * sizeof(Sums3),
         LayerNormBackwardKernel{dy, x, mean, rstd, gamma, dx, shift.get(), pg.get(), pb.get(),
                                 dgamma, dbeta, arrivals, R, D, group_rows, G});
}

}  // namespace

// x, y (R, D); gamma, beta (D); mean, rstd (R); all overwritten (=).
void layer_norm(const float* x, const float* gamma, const float* beta, float eps, float* y,
                float* mean, float* rstd, int64_t R, int64_t D) {
  launch_layer_norm({x, nullptr}, gamma, beta, eps, y, mean, rstd, R, D);
}

// a, b, y (R, D): the layer norm of a + b.
void add_layer_norm(const float* a, const float* b, const float* gamma, const float* beta,
                    float eps, float* y, float* mean, float* rstd, int64_t R, int64_t D) {
  launch_layer_norm({a, b}, gamma, beta, eps, y, mean, rstd, R, D);
}

// dy, x, dx (R, D); mean, rstd (R); gamma, dgamma, dbeta (D); dx, dgamma, dbeta overwritten (=).
void layer_norm_backward(const float* dy, const float* x, const float* mean, const float* rstd,
                         const float* gamma, float* dx, float* dgamma, float* dbeta, int64_t R,
                         int64_t D) {
  launch_layer_norm_backward(dy, {x, nullptr}, mean, rstd, gamma, dx, dgamma, dbeta, R, D);
}

// a, b (R, D): the backward of the layer norm of a + b (dx is the gradient of either).
void add_layer_norm_backward(const float* dy, const float* a, const float* b, const float* mean,
                             const float* rstd, const float* gamma, float* dx, float* dgamma,
                             float* dbeta, int64_t R, int64_t D) {
  launch_layer_norm_backward(dy, {a, b}, mean, rstd, gamma, dx, dgamma, dbeta, R, D);
}

}  // namespace clustr::cuda
