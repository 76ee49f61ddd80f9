// CUDA CTC loss: the recursions of layers/ctc.cpp (see its header comment for the formulas,
// the row shifts and the posterior normalisation) with one block per utterance.
//
// The frames are log-softmaxed first (B T rows, one block each, the CPU kernel's formula). Then each utterance's block runs the alpha recursion frame after frame, its threads
// striding over the extended positions s: a row is computed, its maximum found with a
// block_reduce and taken out (the shifts summed in double by every thread alike), and the
// block waits at a barrier before the next row reads it. The alpha rows are kept in device
// scratch (B, T, Pmax + 2) for the backward pass; the beta recursion runs backwards with its
// two rows in shared memory, and each frame's gradient is written as soon as its beta row is
// known: softmax_t(c) for every class, then the blank's posterior sum and each label's
// posteriors subtracted. A label that occurs more than once in a target is handled by one
// thread, the one at its first position, walking the chain of its positions in increasing s:
// the same subtractions in the same order as the CPU's loop, and no two threads write one
// class.
//
// Work: the recursions are O(Tb P) per utterance with 3 + log2(threads) barriers per frame; the
// gradient is O(Tb V). A short target leaves most of a block (up to 256 threads) idle in the
// recursions: the GPU's parallelism here is the batch.
//
// The results match the CPU kernel's up to the order of float additions in the posterior sums
// (a block_reduce tree here, 16 lanes there) and contracted multiply-adds.
#include "layers/cuda/ctc.h"

#include <cmath>
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/scratch.h"
#include "core/math.h"

namespace clustr::cuda {

namespace {

struct Pair {
  float total, blank;
};
struct AddPair {
  CLUSTR_HD Pair operator()(const Pair& a, const Pair& b) const {
    return {a.total + b.total, a.blank + b.blank};
  }
};

// lp (rows, V) = log_softmax(x (rows, V)), one block a row, in the CPU kernel's formula (ctc.cpp's
// log_softmax_rows): the row max m, the sum of exp_term(x - m) in double, then x - (m + ln s)
// with the shift rounded to float once. Only the order of the double additions differs, so the
// rows are the CPU's, bit for bit, but for a rare last-bit tie.
struct CtcLogSoftmaxKernel {
  static constexpr bool kUsesBarrier = true;
  const float* x;
  float* lp;
  int64_t rows, V;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    for (int64_t r = t.block_idx().x; r < rows; r += t.grid_dim().x) {
      const float* xr = x + r * V;
      float m = -INFINITY;
      for (int64_t c = tid; c < V; c += nt) m = math::Maximum{}(m, xr[c]);
      m = block_reduce(t, m, t.shared<float>(), math::Maximum{});
      double acc = 0;
      for (int64_t c = tid; c < V; c += nt) acc += double(math::exp_term(xr[c] - m));
      const double s = block_reduce(t, acc, t.shared<double>(), AddDouble{});
      const float shift = m + float(::log(s));
      for (int64_t c = tid; c < V; c += nt) lp[r * V + c] = xr[c] - shift;
    }
  }
};

CLUSTR_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
CLUSTR_HD int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

struct CtcKernel {
  static constexpr bool kUsesBarrier = true;
  const float* lp;     // (B, T, V) log-softmax of the logits
  const int32_t* info;  // ctc.h
  float* alpha;        // (B, T, W) scratch, W = Pmax + 2: two -inf pads before position 0
  double* shift;       // (B, T) scratch: the alpha shifts taken out up to each frame
  float* loss;         // (B)
  float* grad;         // (B, T, V) or null
  int64_t B, T, V, Pmax;
  int32_t blank;

  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t b = t.block_idx().x; b < B; b += t.grid_dim().x) utterance(t, b);
  }

  // Writes loss[b] and, with a gradient, fills frames [0, Tb) of it with `value`.
  CLUSTR_DEVICE void give_up(const Thread& t, int64_t b, int64_t Tb, float loss_value,
                             float value) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    if (tid == 0) loss[b] = loss_value;
    if (grad)
      for (int64_t i = tid; i < Tb * V; i += nt) grad[b * T * V + i] = value;
  }

  CLUSTR_DEVICE void utterance(const Thread& t, int64_t b) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t Tb = info[3 * b], U = info[3 * b + 1];
    const int32_t status = info[3 * b + 2];
    const int32_t* ext = info + 3 * B + b * Pmax;
    const int32_t* next = ext + B * Pmax;
    const int32_t* head = next + B * Pmax;
    const float* lpb = lp + b * T * V;
    float* g = grad ? grad + b * T * V : nullptr;
    if (g)
      for (int64_t i = Tb * V + tid; i < T * V; i += nt) g[i] = 0.0f;
    if (status != kCtcRun) {
      give_up(t, b, Tb, status == kCtcEmpty ? -0.0f : INFINITY, 0.0f);  // -ln 1, as on the CPU
      return;
    }
    const int64_t P = 2 * U + 1, W = Pmax + 2;
    float* scratch = t.shared<float>();  // (nt) block_reduce, 8 bytes a thread
    float* beta_rows = scratch + 2 * nt;  // (2, W): pads after position P - 1
    float* post = beta_rows + 2 * W;      // (Pmax)
    float* al = alpha + b * T * W + 2;    // row t at al + t W
    double* sh = shift + b * T;

    // Forward: alpha rows with their maxima taken out.
    double alpha_shift = 0;
    for (int64_t f = 0; f < Tb; ++f) {
      const int64_t lo = max64(0, P - 2 * (Tb - f)), hi = min64(P, 2 * f + 2);
      float* cur = al + f * W;
      const float* prev = cur - W;
      const float* lpt = lpb + f * V;
      float m = -INFINITY;
      for (int64_t s = int64_t(tid) - 2; s < P; s += nt) {
        float v = -INFINITY;
        if (s >= lo && s < hi) {
          const float e = lpt[ext[s]];
          const bool skip = (s & 1) && s >= 2 && ext[s] != ext[s - 2];
          v = f == 0 ? e
                     : e + math::log_add_exp(prev[s], prev[s - 1],
                                             prev[s - 2] + (skip ? 0.0f : -INFINITY));
          m = math::Maximum{}(m, v);
        }
        cur[s] = v;
      }
      m = block_reduce(t, m, scratch, math::Maximum{});
      if (!(m > -INFINITY)) {  // every path has p = 0 (or NaN)
        give_up(t, b, Tb, m == -INFINITY ? INFINITY : NAN, m == -INFINITY ? 0.0f : NAN);
        return;
      }
      for (int64_t s = lo + tid; s < hi; s += nt) cur[s] -= m;
      alpha_shift += m;
      if (tid == 0) sh[f] = alpha_shift;
      t.sync();  // the row is complete before the next one reads it
    }
    const float* last = al + (Tb - 1) * W;
    const double log_p =
        alpha_shift + double(math::log_add_exp(last[P - 1], P >= 2 ? last[P - 2] : -INFINITY));
    if (g == nullptr || !(log_p > -INFINITY && log_p < INFINITY)) {  // NaN too
      if (g == nullptr || log_p == -INFINITY || log_p == INFINITY)
        give_up(t, b, g ? Tb : 0, float(-log_p), 0.0f);
      else
        give_up(t, b, Tb, NAN, NAN);
      return;
    }
    if (tid == 0) loss[b] = float(-log_p);

    // Backward, with the gradient of each frame as soon as its beta row is known.
    double beta_shift = 0;
    for (int64_t f = Tb - 1; f >= 0; --f) {
      const int64_t lo = max64(0, P - 2 * (Tb - f)), hi = min64(P, 2 * f + 2);
      float* cur = beta_rows + (f & 1) * W;
      const float* nxt = beta_rows + ((f + 1) & 1) * W;
      const float* lpt = lpb + f * V;
      float m = -INFINITY;
      for (int64_t s = tid; s < W; s += nt) {
        float v = -INFINITY;
        if (s >= lo && s < hi) {
          const float e = lpt[ext[s]];
          if (f == Tb - 1) {
            v = s >= P - 2 ? e : -INFINITY;
          } else {
            const bool skip = s + 2 < P && (s & 1) && ext[s + 2] != ext[s];
            v = e + math::log_add_exp(nxt[s], nxt[s + 1], nxt[s + 2] + (skip ? 0.0f : -INFINITY));
          }
          m = math::Maximum{}(m, v);
        }
        cur[s] = v;
      }
      m = block_reduce(t, m, scratch, math::Maximum{});
      if (!(m > -INFINITY)) {
        give_up(t, b, Tb, m == -INFINITY ? INFINITY : NAN, m == -INFINITY ? 0.0f : NAN);
        return;
      }
      beta_shift += m;
      const float k = float(sh[f] + beta_shift - log_p);
      const float* alpha_row = al + f * W;
      Pair acc{0.0f, 0.0f};
      for (int64_t s = tid; s < P; s += nt) {
        float p = 0.0f;
        if (s >= lo && s < hi) {
          cur[s] -= m;
          const float v = alpha_row[s] + cur[s] - lpt[ext[s]] + k;
          p = math::select(v < -80.0f, 0.0f, math::exp_term(v));
          acc.total += p;
          if (!(s & 1)) acc.blank += p;
        }
        post[s] = p;
      }
      const Pair sums = block_reduce(t, acc, reinterpret_cast<Pair*>(scratch), AddPair{});
      const float inv = sums.total > 0.0f ? 1.0f / sums.total : 0.0f;
      float* gt = g + f * V;
      for (int64_t c = tid; c < V; c += nt) gt[c] = math::exp(lpt[c]);
      t.sync();  // the softmax row and every posterior are written
      if (tid == 0) gt[blank] -= sums.blank * inv;
      for (int64_t s = tid; s < P; s += nt) {
        if (!(s & 1) || !head[s]) continue;
        const int32_t c = ext[s];
        float v = gt[c];
        for (int64_t j = s; j >= 0; j = next[j])
          if (j >= lo && j < hi) v -= post[j] * inv;
        gt[c] = v;
      }
      t.sync();  // this frame's beta row and posteriors are read before they are overwritten
    }
  }
};

// out = the reduced loss, by one thread in the CPU's order (ctc.cpp's ctc_loss).
struct CtcReduceKernel {
  static constexpr bool kUsesBarrier = false;
  const float* per;
  const int32_t* info;
  int64_t B;
  int reduction;  // 0 none, 1 sum, 2 mean
  bool zero_infinity;
  float* out;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    if (t.thread_idx().x != 0 || t.block_idx().x != 0) return;
    double total = 0;
    for (int64_t b = 0; b < B; ++b) {
      const float kept = zero_infinity && per[b] == INFINITY ? 0.0f : per[b];
      const int32_t U = info[3 * b + 1];
      if (reduction == 0) out[b] = kept;
      else total += reduction == 2 ? double(kept) / (U > 1 ? U : 1) : double(kept);
    }
    if (reduction == 2) total /= double(B);
    if (reduction != 0) *out = float(total);
  }
};

struct CtcScaleKernel {
  static constexpr bool kUsesBarrier = false;
  const float* grad;
  const float* g;
  const int32_t* info;
  int64_t B, TV;
  int reduction;
  float* dlogits;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < B * TV; i += grid_stride_x(t)) {
      const int64_t b = i / TV;
      const int32_t U = info[3 * b + 1];
      const float w =
          reduction == 2 ? float(1.0 / (double(B) * double(U > 1 ? U : 1))) : 1.0f;
      dlogits[i] = w * (reduction == 0 ? g[b] : g[0]) * grad[i];
    }
  }
};

}  // namespace

void ctc_forward(const float* logits, const int32_t* info, int64_t B, int64_t T, int64_t V,
                 int64_t Pmax, int32_t blank, float* loss, float* grad) {
  if (B == 0) return;
  require("cuda::ctc_forward");
  Scratch<float> lp(B * T * V);
  if (T > 0) {
    const unsigned row = row_threads(V);
    launch("cuda::ctc_forward (log-softmax)", {row_blocks(B * T)}, {row}, row * sizeof(double),
           CtcLogSoftmaxKernel{logits, lp.get(), B * T, V});
  }
  const int64_t W = Pmax + 2;
  Scratch<float> alpha(B * (T > 0 ? T : 1) * W);
  Scratch<double> shift(B * (T > 0 ? T : 1));
  const unsigned threads = row_threads(Pmax > V ? Pmax : V);
  const size_t shared = (2 * size_t(threads) + 2 * size_t(W) + size_t(Pmax)) * sizeof(float);
  launch("cuda::ctc_forward", {row_blocks(B)}, {threads}, shared,
         CtcKernel{lp.get(), info, alpha.get(), shift.get(), loss, grad, B, T, V, Pmax, blank});
}

void ctc_reduce(const float* per_utterance, const int32_t* info, int64_t B, int reduction,
                bool zero_infinity, float* out) {
  require("cuda::ctc_reduce");
  launch("cuda::ctc_reduce", {1}, {32}, 0,
         CtcReduceKernel{per_utterance, info, B, reduction, zero_infinity, out});
}

void ctc_scale_grad(const float* grad, const float* g, const int32_t* info, int64_t B, int64_t T,
                    int64_t V, int reduction, float* dlogits) {
  const int64_t n = B * T * V;
  if (n == 0) return;
  require("cuda::ctc_scale_grad");
  launch("cuda::ctc_scale_grad", {elementwise_blocks(n)}, {kElementwiseThreads}, 0,
         CtcScaleKernel{grad, g, info, B, T * V, reduction, dlogits});
}

}  // namespace clustr::cuda
