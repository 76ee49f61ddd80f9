// CTC loss: validation, the fused per-utterance kernel, and the autograd op.
//
// Per utterance (Tb = input length frames, U labels, P = 2U + 1 extended positions, s even a
// blank, s odd the label l_{(s-1)/2}):
//   lp (Tb, V)     log-softmax of the frames
//   emit_t(s)      lp[t, ext(s)], gathered per frame
//   alpha_t(s)     = emit_t(s) + lse(alpha_{t-1}(s), alpha_{t-1}(s-1), alpha_{t-1}(s-2) if s is
//                    a label different from the one two positions back)
//   beta_t(s)      = emit_t(s) + lse(beta_{t+1}(s), beta_{t+1}(s+1), beta_{t+1}(s+2) if allowed)
//   ln p           = lse(alpha_{Tb-1}(P-1), alpha_{Tb-1}(P-2))
//   gamma_t(c)     = sum over s with ext(s) = c of exp(alpha_t(s) + beta_t(s) - emit_t(s)) / p
//   d(-ln p)/dx_t(c) = softmax_t(c) - gamma_t(c)
//
// Numerics. Every alpha row is shifted by its maximum after it is computed, and the shifts
// are summed in double: the stored values stay near 0, where float keeps ~7 digits, instead of
// growing like -4 t (about -3000 at t = 800, where a float step is 2.4e-4 and the rounding of
// 800 steps would reach the posteriors as a relative error of ~1e-3; PyTorch's float32 kernel
// has that error). Beta rows are shifted the same way, and a posterior is
// exp(alpha + beta - emit + k_t) with k_t = (both rows' shifts) - ln p formed in double, then
// normalised over the frame.
// Positions that cannot lie on a complete path at frame t (s >= 2t + 2: not reachable yet;
// s < P - 2(Tb - t): the rest of the target no longer fits) are set to -inf and skipped.
//
// Speed. The recursions are branch-free loops over s (math::log_add_exp of three terms: two
// exps and one log, all polynomial) that the compiler vectorises; the gathers of emit_t and
// the scatter of the posteriors into classes are scalar loops over the labels. The kernel is
// compiled once per instruction set (generic x86-64, AVX2, AVX-512) and the CPU's best is
// chosen at run time. Utterances are independent and run in parallel (OpenMP, dynamic
// schedule); each is computed by one thread with a fixed order of operations, so results do
// not depend on the thread count.
#include "layers/ctc.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "core/error.h"
#include "core/math.h"
#include "core/ops.h"
#include "layers/cuda/ctc.h"

namespace clustr {

const char* to_string(CtcReduction r) {
  switch (r) {
    case CtcReduction::none: return "none";
    case CtcReduction::sum: return "sum";
    case CtcReduction::mean: return "mean";
  }
  return "?";
}

namespace {

constexpr float kNegInf = -INFINITY;
constexpr int64_t kParallelMin = 32768;  // cells; below this a parallel region costs more

// The helpers of the kernel are inlined into each instruction-set version of it (see
// utterance_generic and the others below), so that their loops are compiled, and vectorised,
// for that set.
#define CLUSTR_CTC_INLINE [[gnu::always_inline]] inline

// Scratch of one thread, grown as needed and reused for the utterances it computes.
struct Scratch {
  std::vector<float> lp;        // (Tb, V)
  std::vector<float> alpha;     // (Tb or 2, P + 2): two -inf pads in front of position 0
  std::vector<double> shift;    // (Tb) what was taken out of alpha rows 0..t, in all
  std::vector<float> beta;      // (2, P + 2): two -inf pads after position P - 1
  std::vector<float> emit;      // (P)
  std::vector<float> post;      // (P)
  std::vector<float> skip_a;    // (P) 0 where alpha may come from s - 2, else -inf
  std::vector<float> skip_b;    // (P) 0 where beta may come from s + 2, else -inf
  std::vector<int32_t> ext;     // (P) the extended target
  std::vector<float> ones;      // (P) 1
  std::vector<float> is_blank;  // (P) 1 at even s, 0 at odd s
};

// max(x[0, n)), -inf for n = 0; NaN-propagating.
CLUSTR_CTC_INLINE float row_max(const float* x, int64_t n) {
  constexpr int kLanes = 16;
  float m[kLanes];
  for (float& v : m) v = kNegInf;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) m[k] = math::Maximum{}(m[k], x[i + k]);
  for (; i < n; ++i) m[0] = math::Maximum{}(m[0], x[i]);
  for (int k = 1; k < kLanes; ++k) m[0] = math::Maximum{}(m[0], m[k]);
  return m[0];
}

// lp (rows, V) = log_softmax(x (rows, V)) row by row; the sum of exps in double.
CLUSTR_CTC_INLINE void log_softmax_rows(const float* __restrict x, int64_t rows, int64_t V,
                                        float* __restrict lp) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x + t * V;
    float* yr = lp + t * V;
    const float m = row_max(xr, V);
    for (int64_t c = 0; c < V; ++c) yr[c] = math::exp_term(xr[c] - m);
    double s = 0;
    for (int64_t c = 0; c < V; ++c) s += yr[c];
    const float shift = m + static_cast<float>(std::log(s));
    for (int64_t c = 0; c < V; ++c) yr[c] = xr[c] - shift;
  }
}

// cur[s] = emit[s] + lse(prev[s], prev[s-1], prev[s-2] + skip[s]) for s in [lo, hi). prev and
// cur point at position 0 of rows with two readable entries in front.
CLUSTR_CTC_INLINE void alpha_row(const float* __restrict prev, const float* __restrict emit,
                                 const float* __restrict skip, float* __restrict cur, int64_t lo,
                                 int64_t hi) {
  for (int64_t s = lo; s < hi; ++s)
    cur[s] = emit[s] + math::log_add_exp(prev[s], prev[s - 1], prev[s - 2] + skip[s]);
}

// cur[s] = emit[s] + lse(next[s], next[s+1], next[s+2] + skip[s]) for s in [lo, hi); next has
// two readable entries after position P - 1.
CLUSTR_CTC_INLINE void beta_row(const float* __restrict next, const float* __restrict emit,
                                const float* __restrict skip, float* __restrict cur, int64_t lo,
                                int64_t hi) {
  for (int64_t s = lo; s < hi; ++s)
    cur[s] = emit[s] + math::log_add_exp(next[s], next[s + 1], next[s + 2] + skip[s]);
}

// x[s] -= m for s in [0, n).
CLUSTR_CTC_INLINE void shift_row(float* x, int64_t n, float m) {
  for (int64_t s = 0; s < n; ++s) x[s] -= m;
}

// The positions of frame t (of Tb) that can lie on a complete path: [lo, hi).
struct Range {
  int64_t lo, hi;
};
CLUSTR_CTC_INLINE Range positions(int64_t t, int64_t Tb, int64_t P) {
  return {std::max<int64_t>(0, P - 2 * (Tb - t)), std::min<int64_t>(P, 2 * t + 2)};
}

// emit[s] = lp_t[ext(s)] for s in [lo, hi) (a vector gather where the CPU has one).
CLUSTR_CTC_INLINE void gather(const float* __restrict lpt, const int32_t* __restrict ext, Range r,
                              float* __restrict emit) {
  for (int64_t s = r.lo; s < r.hi; ++s) emit[s] = lpt[ext[s]];
}

// sum(x[0, n) * w[0, n)) in a fixed order (16 lanes, then the lanes in order).
CLUSTR_CTC_INLINE float row_dot(const float* __restrict x, const float* __restrict w, int64_t n) {
  constexpr int kLanes = 16;
  float a[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) a[k] += x[i + k] * w[i + k];
  for (; i < n; ++i) a[0] += x[i] * w[i];
  for (int k = 1; k < kLanes; ++k) a[0] += a[k];
  return a[0];
}

// d(-ln p)/dx for frame t into g (V): softmax_t - gamma_t. The posterior of position s is
// exp(alpha[s] + beta[s] - emit[s] + k) with k = (the shifts taken out of both rows) - ln p,
// divided by the frame's sum of them (1 up to rounding): that sum takes out the rounding the
// rows have in common, which makes the gradient of a 300-frame utterance 10x more accurate.
// Posteriors below e^-80 are 0 (and exp never sees a subnormal).
// ones and is_blank: (P) 1 everywhere, and 1 at even s (blanks) and 0 at odd s.
CLUSTR_CTC_INLINE void frame_grad(const float* __restrict lp, const float* __restrict alpha,
                                  const float* __restrict beta, const float* __restrict emit,
                                  float k, const int32_t* __restrict ext,
                                  const float* __restrict ones, const float* __restrict is_blank,
                                  int64_t V, int blank, Range r, float* __restrict post,
                                  float* __restrict g) {
  for (int64_t s = r.lo; s < r.hi; ++s) {
    const float v = alpha[s] + beta[s] - emit[s] + k;
    post[s] = math::select(v < -80.0f, 0.0f, math::exp_term(v));
  }
  const int64_t n = r.hi - r.lo;
  const float total = row_dot(post + r.lo, ones + r.lo, n);
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  for (int64_t c = 0; c < V; ++c) g[c] = math::exp(lp[c]);
  g[blank] -= row_dot(post + r.lo, is_blank + r.lo, n) * inv;
  for (int64_t s = r.lo | 1; s < r.hi; s += 2) g[ext[s]] -= post[s] * inv;
}

// The frames an alignment of `labels` needs: one per label, plus a blank between repeats.
int64_t frames_needed(const int32_t* labels, int64_t U) {
  int64_t n = U;
  for (int64_t k = 1; k < U; ++k) n += labels[k] == labels[k - 1];
  return n;
}

// ln p(labels | x) for one utterance: x (Tb, V) logits, labels (U). -inf when no alignment has
// a nonzero probability. With grad (Tb, V) non-null, it also writes d(-ln p)/dx there (left
// incomplete when the result is not finite; the caller zeroes it).
CLUSTR_CTC_INLINE double utterance_impl(const float* x, int64_t Tb, int64_t V,
                                        const int32_t* labels, int64_t U, int blank, float* grad,
                                        Scratch& w) {
  if (Tb == 0) return U == 0 ? 0.0 : -INFINITY;
  if (Tb < frames_needed(labels, U)) return -INFINITY;
  const int64_t P = 2 * U + 1, W = P + 2;
  w.lp.resize(static_cast<size_t>(Tb * V));
  log_softmax_rows(x, Tb, V, w.lp.data());

  w.ext.resize(P);
  w.skip_a.resize(P);
  w.skip_b.resize(P);
  w.emit.resize(P);
  w.post.resize(P);
  for (int64_t s = 0; s < P; ++s) w.ext[s] = (s & 1) ? labels[s / 2] : blank;
  for (int64_t s = 0; s < P; ++s)
    w.skip_a[s] = ((s & 1) && s >= 2 && w.ext[s] != w.ext[s - 2]) ? 0.0f : kNegInf;
  for (int64_t s = 0; s < P; ++s) w.skip_b[s] = s + 2 < P ? w.skip_a[s + 2] : kNegInf;
  w.ones.assign(P, 1.0f);
  w.is_blank.resize(P);
  for (int64_t s = 0; s < P; ++s) w.is_blank[s] = (s & 1) ? 0.0f : 1.0f;
  const float* lp = w.lp.data();
  const int32_t* ext = w.ext.data();
  float* emit = w.emit.data();

  // Forward. Without a gradient only two alpha rows are kept.
  const int64_t alpha_rows = grad ? Tb : 2;
  w.alpha.resize(static_cast<size_t>(alpha_rows * W));
  w.shift.resize(static_cast<size_t>(Tb));
  float* alpha = w.alpha.data() + 2;  // row t at alpha + (grad ? t : t & 1) * W
  auto row = [grad, W](int64_t t) { return (grad ? t : (t & 1)) * W; };
  double shift = 0;  // the sum of the row maxima taken out so far
  for (int64_t t = 0; t < Tb; ++t) {
    const Range r = positions(t, Tb, P);
    float* cur = alpha + row(t);
    std::fill(cur - 2, cur + r.lo, kNegInf);
    std::fill(cur + r.hi, cur + P, kNegInf);
    gather(lp + t * V, ext, r, emit);
    if (t == 0)
      for (int64_t s = r.lo; s < r.hi; ++s) cur[s] = emit[s];
    else
      alpha_row(alpha + row(t - 1), emit, w.skip_a.data(), cur, r.lo, r.hi);
    const float m = row_max(cur + r.lo, r.hi - r.lo);
    if (!(m > kNegInf)) return m == kNegInf ? -INFINITY : NAN;  // every path has p = 0 (or NaN)
    shift_row(cur + r.lo, r.hi - r.lo, m);
    shift += m;
    w.shift[t] = shift;
  }
  const float* last = alpha + row(Tb - 1);
  const double log_p =
      shift + static_cast<double>(math::log_add_exp(last[P - 1], P >= 2 ? last[P - 2] : kNegInf));
  if (!grad || !std::isfinite(log_p)) return log_p;

  // Backward, with the gradient of each frame as soon as its beta row is known.
  w.beta.resize(static_cast<size_t>(2 * W));
  double beta_shift = 0;
  for (int64_t t = Tb - 1; t >= 0; --t) {
    const Range r = positions(t, Tb, P);
    float* cur = w.beta.data() + (t & 1) * W;
    std::fill(cur, cur + r.lo, kNegInf);
    std::fill(cur + r.hi, cur + W, kNegInf);
    gather(lp + t * V, ext, r, emit);
    if (t == Tb - 1)
      for (int64_t s = r.lo; s < r.hi; ++s) cur[s] = s >= P - 2 ? emit[s] : kNegInf;
    else
      beta_row(w.beta.data() + ((t + 1) & 1) * W, emit, w.skip_b.data(), cur, r.lo, r.hi);
    const float m = row_max(cur + r.lo, r.hi - r.lo);
    if (!(m > kNegInf)) return m == kNegInf ? -INFINITY : NAN;
    shift_row(cur + r.lo, r.hi - r.lo, m);
    beta_shift += m;
    const float k = static_cast<float>(w.shift[t] + beta_shift - log_p);
    frame_grad(lp + t * V, alpha + row(t), cur, emit, k, ext, w.ones.data(), w.is_blank.data(), V,
               blank, r, w.post.data(), grad + t * V);
  }
  return log_p;
}

#undef CLUSTR_CTC_INLINE

// One version of the kernel per instruction set; the CPU's best is chosen at run time, or the
// one that CLUSTR_CTC_KERNEL (avx512, avx2, generic) names. The versions run the same code,
// vectorised for their set; they differ in the last bits where the compiler contracts a * b + c
// into one FMA (AVX2, AVX-512) and where a lane count fixes a summation order.
using UtteranceFn = double (*)(const float*, int64_t, int64_t, const int32_t*, int64_t, int, float*,
                               Scratch&);

double utterance_generic(const float* x, int64_t Tb, int64_t V, const int32_t* labels, int64_t U,
                         int blank, float* grad, Scratch& w) {
  return utterance_impl(x, Tb, V, labels, U, blank, grad, w);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define CLUSTR_CTC_X86 1
[[gnu::target("avx2,fma")]] double utterance_avx2(const float* x, int64_t Tb, int64_t V,
                                                  const int32_t* labels, int64_t U, int blank,
                                                  float* grad, Scratch& w) {
  return utterance_impl(x, Tb, V, labels, U, blank, grad, w);
}
[[gnu::target("avx512f,avx512vl,avx512dq,avx512bw,avx2")]] double utterance_avx512(
    const float* x, int64_t Tb, int64_t V, const int32_t* labels, int64_t U, int blank, float* grad,
    Scratch& w) {
  return utterance_impl(x, Tb, V, labels, U, blank, grad, w);
}
#endif

struct Kernel {
  UtteranceFn fn;
  const char* name;
};

bool cpu_has(const std::string& isa) {
#ifdef CLUSTR_CTC_X86
  if (isa == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
  return isa == "generic";
}

Kernel choose_kernel() {
  static const Kernel table[] = {
#ifdef CLUSTR_CTC_X86
      {utterance_avx512, "avx512"},
      {utterance_avx2, "avx2"},
#endif
      {utterance_generic, "generic"}};
  const char* forced = std::getenv("CLUSTR_CTC_KERNEL");
  if (forced && *forced) {
    for (const Kernel& k : table)
      if (forced == std::string(k.name)) {
        CLUSTR_CHECK(cpu_has(k.name), "ctc_loss: CLUSTR_CTC_KERNEL=", forced,
                     " but this CPU does not support it");
        return k;
      }
    throw Error(detail::cat("ctc_loss: CLUSTR_CTC_KERNEL=", forced,
                            " is not one of avx512, avx2, generic"));
  }
  for (const Kernel& k : table)
    if (cpu_has(k.name)) return k;
  return {utterance_generic, "generic"};
}

const Kernel& kernel() {
  static const Kernel k = choose_kernel();
  return k;
}

// Where each utterance's labels start in `targets` (padded or concatenated), after checking
// the lengths and every label.
std::vector<int64_t> target_offsets(const Tensor& targets, const int32_t* tl, int64_t B, int64_t V,
                                    int blank) {
  std::vector<int64_t> offset(static_cast<size_t>(B));
  const int32_t* tg = targets.i32();
  if (targets.rank() == 2) {
    const int64_t smax = targets.size(1);
    for (int64_t b = 0; b < B; ++b) {
      CLUSTR_CHECK(tl[b] <= smax, "ctc_loss: target_lengths[", b, "] = ", tl[b],
                   " exceeds the padded target length ", smax, " of targets ", describe(targets));
      offset[b] = b * smax;
    }
  } else {
    int64_t total = 0;
    for (int64_t b = 0; b < B; ++b) offset[b] = total, total += tl[b];
    CLUSTR_CHECK(total == targets.numel(), "ctc_loss: concatenated targets ", describe(targets),
                 " should hold sum(target_lengths) = ", total, " labels");
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t k = 0; k < tl[b]; ++k) {
      const int32_t label = tg[offset[b] + k];
      CLUSTR_CHECK(label >= 0 && label < V, "ctc_loss: label ", label, " of utterance ", b,
                   " (position ", k, ") is outside the ", V, " classes [0, ", V, ")");
      CLUSTR_CHECK(label != blank, "ctc_loss: label ", label, " of utterance ", b, " (position ", k,
                   ") is the blank; targets must not contain the blank");
    }
  return offset;
}

// Checks an i32 (B) lengths tensor (t_host its host copy); returns its host pointer.
const int32_t* lengths_of(const Tensor& t, const Tensor& t_host, const char* what, int64_t B) {
  CLUSTR_CHECK(t.defined(), "ctc_loss: ", what, " is an undefined tensor");
  CLUSTR_CHECK(t.dtype() == DType::i32 && t.rank() == 1 && t.size(0) == B, "ctc_loss: expected ",
               what, " i32 (", B, ") (one per utterance), got ", describe(t));
  return t_host.i32();
}

// t itself on the cpu, else a host copy (undefined stays undefined).
Tensor on_host(const Tensor& t) {
  return !t.defined() || t.device() == Device::cpu ? t : t.to(Device::cpu);
}

// The batch after its checks: host copies of the lengths and targets (the tensors may be on
// either device), and where each utterance's labels start in the targets.
struct CtcBatch {
  int64_t B = 0, T = 0, V = 0;
  Tensor il_host, tl_host, tg_host;
  const int32_t *il = nullptr, *tl = nullptr, *tg = nullptr;
  std::vector<int64_t> offset;
};

// logits: the logits' description, for the messages.
CtcBatch check_batch(int64_t B, int64_t T, int64_t V, const std::string& logits,
                     const Tensor& input_lengths, const Tensor& targets,
                     const Tensor& target_lengths, int blank) {
  CtcBatch c;
  c.B = B, c.T = T, c.V = V;
  CLUSTR_CHECK(B >= 1 && V >= 1, "ctc_loss: expected at least one utterance and one class, got ",
               "logits ", logits);
  CLUSTR_CHECK(blank >= 0 && blank < V, "ctc_loss: blank = ", blank, " is outside the ", V,
               " classes [0, ", V, ")");
  c.il_host = on_host(input_lengths), c.tl_host = on_host(target_lengths);
  c.il = lengths_of(input_lengths, c.il_host, "input_lengths", B);
  c.tl = lengths_of(target_lengths, c.tl_host, "target_lengths", B);
  for (int64_t b = 0; b < B; ++b) {
    CLUSTR_CHECK(c.il[b] >= 0 && c.il[b] <= T, "ctc_loss: input_lengths[", b, "] = ", c.il[b],
                 " is outside [0, T = ", T, "] (logits ", logits, ")");
    CLUSTR_CHECK(c.tl[b] >= 0, "ctc_loss: target_lengths[", b, "] = ", c.tl[b], " is negative");
  }
  CLUSTR_CHECK(targets.defined(), "ctc_loss: targets is an undefined tensor");
  CLUSTR_CHECK(targets.dtype() == DType::i32 &&
                   (targets.rank() == 1 || (targets.rank() == 2 && targets.size(0) == B)),
               "ctc_loss: expected targets i32 (B = ", B, ", Umax) padded or (sum of ",
               "target_lengths) concatenated, got ", describe(targets));
  c.tg_host = on_host(targets);
  c.tg = c.tg_host.i32();
  c.offset = target_offsets(c.tg_host, c.tl, B, V, blank);
  return c;
}

CtcBatch check_batch(const Tensor& logits, const Tensor& input_lengths, const Tensor& targets,
                     const Tensor& target_lengths, int blank) {
  return check_batch(logits.size(0), logits.size(1), logits.size(2), describe(logits),
                     input_lengths, targets, target_lengths, blank);
}

// The CPU kernel over the batch: x_host is a host copy of the logits; the outputs are on the
// cpu.
CtcOutput ctc_forward_host(const CtcBatch& c, const Tensor& x_host, int blank, bool want_grad) {
  const int64_t B = c.B, T = c.T, V = c.V;
  const int32_t *il = c.il, *tl = c.tl, *tg = c.tg;
  CtcOutput out;
  out.loss = Tensor::empty({B});
  if (want_grad) out.grad = Tensor::empty({B, T, V});
  const float* x = x_host.f32();
  float* loss = out.loss.f32();
  float* grad = want_grad ? out.grad.f32() : nullptr;
  int64_t impossible = 0;
  // Cells of the recursions and the softmax; a parallel region costs more than a small batch.
  int64_t work = 0;
  for (int64_t b = 0; b < B; ++b) work += int64_t(il[b]) * (2 * int64_t(tl[b]) + 1 + V);
#pragma omp parallel reduction(+ : impossible) if (B > 1 && work >= kParallelMin)
  {
    Scratch w;
#pragma omp for schedule(dynamic, 1)
    for (int64_t b = 0; b < B; ++b) {
      float* gb = grad ? grad + b * T * V : nullptr;
      const double log_p =
          kernel().fn(x + b * T * V, il[b], V, tg + c.offset[b], tl[b], blank, gb, w);
      loss[b] = static_cast<float>(-log_p);
      impossible += log_p == -INFINITY;
      if (gb) {
        // Frames past the input get 0; an impossible utterance 0 throughout; NaN logits NaN on
        // the utterance's frames.
        int64_t kept = il[b];
        if (std::isnan(log_p))
          std::fill(gb, gb + kept * V, NAN);
        else if (!std::isfinite(log_p))
          kept = 0;
        std::fill(gb + kept * V, gb + T * V, 0.0f);
      }
    }
  }
  out.impossible = impossible;
  return out;
}

// What the CUDA kernel reads of the batch (cuda/ctc.h's info), laid out on the host. Its
// `impossible` counts the utterances whose target cannot fit in their frames, known here from
// the lengths (the CPU kernel also counts one whose logits give every alignment probability 0,
// e.g. -inf logits: on the device that one shows only as its loss, +inf).
CtcLayout make_layout(const CtcBatch& c, int blank) {
  const int64_t B = c.B, V = c.V;
  int64_t Umax = 0;
  for (int64_t b = 0; b < B; ++b) Umax = std::max<int64_t>(Umax, c.tl[b]);
  CLUSTR_CHECK(Umax <= cuda::kCtcMaxLabels, "ctc_loss: a target of ", Umax, " labels is longer ",
               "than the CUDA kernel takes (", cuda::kCtcMaxLabels, " labels, for its rows in a ",
               "block's shared memory); compute this loss on the cpu");
  CtcLayout l;
  l.B = B, l.T = c.T, l.V = V, l.blank = blank;
  l.Pmax = 2 * Umax + 1;
  const int64_t Pmax = l.Pmax;
  l.words.assign(static_cast<size_t>(cuda::ctc_info_words(B, Pmax)), 0);
  int32_t* header = l.words.data();
  int32_t* ext = header + 3 * B;
  int32_t* next = ext + B * Pmax;
  int32_t* head = next + B * Pmax;
  std::vector<int64_t> last(static_cast<size_t>(V));
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* labels = c.tg + c.offset[b];
    const int64_t Tb = c.il[b], U = c.tl[b], P = 2 * U + 1;
    const int32_t status = Tb == 0 ? (U == 0 ? cuda::kCtcEmpty : cuda::kCtcImpossible)
                           : Tb < frames_needed(labels, U) ? cuda::kCtcImpossible
                                                           : cuda::kCtcRun;
    l.impossible += status == cuda::kCtcImpossible;
    header[3 * b] = static_cast<int32_t>(Tb);
    header[3 * b + 1] = static_cast<int32_t>(U);
    header[3 * b + 2] = status;
    int32_t* e = ext + b * Pmax;
    int32_t* n = next + b * Pmax;
    int32_t* h = head + b * Pmax;
    for (int64_t s = 0; s < P; ++s) e[s] = (s & 1) ? labels[s / 2] : blank;
    // Each label's chain of odd positions: next from the back, heads from the front.
    for (int64_t s = P - 2; s >= 1; s -= 2) last[static_cast<size_t>(e[s])] = -1;
    for (int64_t s = P - 2; s >= 1; s -= 2) {
      int64_t& l_at = last[static_cast<size_t>(e[s])];
      n[s] = static_cast<int32_t>(l_at);
      h[s] = 1;
      if (l_at >= 0) h[l_at] = 0;
      l_at = s;
    }
  }
  return l;
}

// The CUDA kernel over the batch, on the device's logits, reading the layout from `info` (on
// the device).
CtcOutput run_device(const CtcLayout& l, const Tensor& logits, const Tensor& info,
                     bool want_grad) {
  CtcOutput out;
  out.impossible = l.impossible;
  out.loss = Tensor::empty({l.B}, DType::f32, logits.device());
  if (want_grad) out.grad = Tensor::empty({l.B, l.T, l.V}, DType::f32, logits.device());
  cuda::ctc_forward(logits.f32(), info.i32(), l.B, l.T, l.V, l.Pmax, l.blank, out.loss.f32(),
                    want_grad ? out.grad.f32() : nullptr);
  return out;
}

// The layout's words copied to `device` in one piece: what run_device reads as `info`.
Tensor on_device(const CtcLayout& l, Device device) {
  return Tensor::from_int_vector(l.words, {static_cast<int64_t>(l.words.size())}, device);
}

int reduction_code(CtcReduction r) {
  return r == CtcReduction::none ? 0 : r == CtcReduction::sum ? 1 : 2;
}

void check_logits(const Tensor& logits) {
  CLUSTR_CHECK(logits.defined(), "ctc_loss: logits is an undefined tensor");
  CLUSTR_CHECK(logits.dtype() == DType::f32 && logits.rank() == 3,
               "ctc_loss: expected logits f32 (B, T, V), got ", describe(logits));
}

}  // namespace

const char* ctc_kernel_name() { return kernel().name; }

// On the CUDA device the CUDA kernel runs (cuda/ctc.h): nothing of the logits comes back to
// the host, which only lays out the targets and lengths it already holds.
CtcOutput ctc_loss_forward(const Tensor& logits, const Tensor& input_lengths, const Tensor& targets,
                           const Tensor& target_lengths, int blank, bool want_grad) {
  check_logits(logits);
  const CtcBatch c = check_batch(logits, input_lengths, targets, target_lengths, blank);
  if (logits.device() != Device::cpu) {
    const CtcLayout l = make_layout(c, blank);
    return run_device(l, logits, on_device(l, logits.device()), want_grad);
  }
  return ctc_forward_host(c, logits, blank, want_grad);
}

namespace {

// Holds d loss_b / d logits (B, T, V) from the forward and each utterance's reduction factor;
// backward scales them by the incoming gradient (on the logits' device).
class CtcNode : public Node {
 public:
  const char* name() const override { return "ctc_loss"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    const int64_t B = grad_.size(0), TC = grad_.size(1) * grad_.size(2);
    const bool per_utterance = reduction_ == CtcReduction::none;
    if (grad_.device() != Device::cpu) {  // the loop below as one kernel, the same products
      Tensor d = Tensor::empty(grad_.shape(), DType::f32, grad_.device());
      cuda::ctc_scale_grad(grad_.f32(), g.f32(), info_.i32(), B, grad_.size(1), grad_.size(2),
                           reduction_code(reduction_), d.f32());
      return {std::move(d)};
    }
    Tensor d = Tensor::empty(grad_.shape());
    const float* src = grad_.f32();
    const float* gy = g.f32();
    float* dst = d.f32();
#pragma omp parallel for schedule(static) if (B * TC >= kParallelMin)
    for (int64_t b = 0; b < B; ++b) {
      const float s = weight_[b] * (per_utterance ? gy[b] : gy[0]);
      for (int64_t i = 0; i < TC; ++i) dst[b * TC + i] = s * src[b * TC + i];
    }
    return {std::move(d)};
  }
  void release() override { grad_ = Tensor(), info_ = Tensor(); }

  Tensor grad_;                // f32 (B, T, V)
  std::vector<float> weight_;  // (B) the reduction's factor of each utterance's loss (cpu)
  Tensor info_;                // on the CUDA device: the kernel's layout (cuda/ctc.h)
  CtcReduction reduction_ = CtcReduction::mean;
};

}  // namespace

namespace {

// The CtcLoss of a forward's output and its reduced loss, with the node that scales the saved
// gradient when `record`: by the per-utterance weights on the cpu, through the kernel's layout
// (info) on the device.
CtcLoss finish(const Variable& logits, CtcOutput out, Tensor loss, bool record,
               CtcReduction reduction, std::vector<float> weight, Tensor info) {
  CtcLoss result;
  result.per_utterance = std::move(out.loss);
  result.impossible = out.impossible;
  if (!record) {
    result.loss = Variable(std::move(loss));
    return result;
  }
  auto node = std::make_shared<CtcNode>();
  node->grad_ = std::move(out.grad);
  node->weight_ = std::move(weight);
  node->info_ = std::move(info);
  node->reduction_ = reduction;
  result.loss = attach(std::move(loss), std::move(node), {&logits});
  return result;
}

// ctc_loss on the CUDA device: the per-utterance losses, the reduction and the gradient's
// scaling all stay there (cuda/ctc.h), with the CPU's formulas and order of operations.
CtcLoss ctc_loss_device(const Variable& logits, const CtcLayout& layout, Tensor info,
                        const CtcOptions& options, bool record) {
  const Tensor& x = logits.data();
  CtcOutput out = run_device(layout, x, info, record);
  const bool none = options.reduction == CtcReduction::none;
  Tensor loss = none ? Tensor::empty({layout.B}, DType::f32, x.device())
                     : Tensor::empty(Shape{}, DType::f32, x.device());
  cuda::ctc_reduce(out.loss.f32(), info.i32(), layout.B, reduction_code(options.reduction),
                   options.zero_infinity, loss.f32());
  return finish(logits, std::move(out), std::move(loss), record, options.reduction, {},
                std::move(info));
}

}  // namespace

CtcLoss ctc_loss(const Variable& logits, const Tensor& input_lengths, const Tensor& targets,
                 const Tensor& target_lengths, const CtcOptions& options) {
  CLUSTR_CHECK(logits.defined(), "ctc_loss: logits is an undefined variable");
  const bool record = record_needed({&logits});
  const Tensor& x = logits.data();
  check_logits(x);
  const CtcBatch c = check_batch(x, input_lengths, targets, target_lengths, options.blank);
  if (x.device() != Device::cpu) {
    const CtcLayout layout = make_layout(c, options.blank);
    return ctc_loss_device(logits, layout, on_device(layout, x.device()), options, record);
  }
  CtcOutput out = ctc_forward_host(c, x, options.blank, record);
  const int64_t B = out.loss.numel();
  const float* per = out.loss.f32();
  const int32_t* tl = c.tl;

  // Each utterance's loss after zero_infinity, and its factor in the reduced loss.
  std::vector<float> kept(static_cast<size_t>(B)), weight(static_cast<size_t>(B), 1.0f);
  for (int64_t b = 0; b < B; ++b) {
    kept[b] = options.zero_infinity && per[b] == INFINITY ? 0.0f : per[b];
    if (options.reduction == CtcReduction::mean)
      weight[b] = static_cast<float>(1.0 / (static_cast<double>(B) * std::max(tl[b], 1)));
  }
  Tensor loss;
  if (options.reduction == CtcReduction::none) {
    loss = Tensor::from_vector(kept, {B});
  } else {
    double total = 0;
    for (int64_t b = 0; b < B; ++b)
      total += options.reduction == CtcReduction::mean
                   ? static_cast<double>(kept[b]) / std::max(tl[b], 1)
                   : static_cast<double>(kept[b]);
    if (options.reduction == CtcReduction::mean) total /= static_cast<double>(B);
    loss = Tensor::scalar(static_cast<float>(total));
  }

  return finish(logits, std::move(out), std::move(loss), record, options.reduction,
                std::move(weight), Tensor());
}

CtcLayout ctc_layout(int64_t T, int64_t V, const Tensor& input_lengths, const Tensor& targets,
                     const Tensor& target_lengths, int blank) {
  CLUSTR_CHECK(input_lengths.defined() && input_lengths.rank() == 1,
               "ctc_layout: expected input_lengths i32 (B), got ",
               input_lengths.defined() ? describe(input_lengths) : std::string("undefined"));
  const int64_t B = input_lengths.size(0);
  const std::string shape = detail::cat("(", B, ", ", T, ", ", V, ")");
  CLUSTR_CHECK(T >= 0, "ctc_layout: expected T >= 0 frames, got ", T);
  return make_layout(check_batch(B, T, V, shape, input_lengths, targets, target_lengths, blank),
                     blank);
}

CtcLoss ctc_loss(const Variable& logits, const CtcLayout& layout, const Tensor& info,
                 const CtcOptions& options) {
  CLUSTR_CHECK(logits.defined(), "ctc_loss: logits is an undefined variable");
  const Tensor& x = logits.data();
  check_logits(x);
  CLUSTR_CHECK(x.device() != Device::cpu && x.size(0) == layout.B && x.size(1) == layout.T &&
                   x.size(2) == layout.V,
               "ctc_loss: a layout made for logits (", layout.B, ", ", layout.T, ", ", layout.V,
               ") on the CUDA device, got ", describe(x));
  CLUSTR_CHECK(options.blank == layout.blank, "ctc_loss: the layout was made with blank ",
               layout.blank, ", the options say ", options.blank);
  CLUSTR_CHECK(info.defined() && info.dtype() == DType::i32 && info.device() == x.device() &&
                   info.numel() == static_cast<int64_t>(layout.words.size()),
               "ctc_loss: expected the layout's ", layout.words.size(), " words as i32 on the "
               "logits' device, got ", info.defined() ? describe(info) : std::string("undefined"));
  return ctc_loss_device(logits, layout, info, options, record_needed({&logits}));
}

}  // namespace clustr
