// Per-element and per-row math shared by the CPU kernels and the CUDA kernels: every formula is
// written once here as a CLUSTR_HD inline function or functor, so both backends compute the
// same thing and a CUDA kernel can be tested against its CPU twin element for element.
//
// The functors are empty structs with a const call operator; kernels are templates over them,
// which lets the compiler inline and vectorise the body of the hot loop.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/hostdevice.h"
#include "core/philox.h"

namespace clustr::math {

// ---- binary: out = f(a, b) ---------------------------------------------------------------
struct Add {
  CLUSTR_HD float operator()(float a, float b) const { return a + b; }
};
struct Sub {
  CLUSTR_HD float operator()(float a, float b) const { return a - b; }
};
struct Mul {
  CLUSTR_HD float operator()(float a, float b) const { return a * b; }
};
struct Div {
  CLUSTR_HD float operator()(float a, float b) const { return a / b; }
};
// NaN in either argument gives NaN, as in PyTorch (fmaxf would silently drop it and hide a
// diverged value). `|` rather than `||`: without a short-circuit branch the compiler turns
// this into compare-and-blend and vectorises reductions over it.
struct Maximum {
  CLUSTR_HD float operator()(float a, float b) const { return ((a > b) | (a != a)) ? a : b; }
};
struct Minimum {
  CLUSTR_HD float operator()(float a, float b) const { return ((a < b) | (a != a)) ? a : b; }
};

// ---- unary: y = f(x) ---------------------------------------------------------------------
constexpr float kInvSqrt2 = 0.70710678118654752440f;

// The float with bit pattern `bits`, and back.
CLUSTR_HD float float_from_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}
CLUSTR_HD uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
#endif
}

// Unsigned integers in the order of the floats: the sign bit set for positives, every bit
// flipped for negatives. -0 ranks just below +0, and a NaN by its bits (above +inf when its
// sign is clear, below -inf when set). For selections that must agree between the CPU and the
// device (the top-k sets of improved-clustered attention).
CLUSTR_HD uint32_t order_key(float x) {
  const uint32_t u = bits_of(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// c ? a : b, computed on the bits with a compare mask. GCC's vectoriser, under its default
// -ftrapping-math, will not if-convert a float `c ? a : b` whose result feeds more arithmetic,
// and the loop around it then stays scalar; it does vectorise this.
CLUSTR_HD float select(bool c, float a, float b) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);  // all ones when c
  return float_from_bits((bits_of(a) & m) | (bits_of(b) & ~m));
}

// Multiply-adds for the polynomials below: a * b + c rounded twice (what the CPU's row loops,
// compiled without contraction, and the device both do), or once (fmaf: the same bits on every
// CPU and the device; one instruction where the code is compiled for FMA, as the AVX2 and
// AVX-512 clones of the row loops are (core/cpu/row_clones.h) and every GPU; a libm call in
// code built for plain x86-64).
struct MulAdd {
  CLUSTR_HD float operator()(float a, float b, float c) const { return a * b + c; }
};
struct FusedMulAdd {
  CLUSTR_HD float operator()(float a, float b, float c) const { return fmaf(a, b, c); }
};

// exp's constants: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two, Cody-Waite, so n ln2 is
// exact), e^r from Cephes' degree-6 polynomial, and 2^n applied as two factors 2^(n/2)
// 2^(n - n/2) so that both are normal floats even when the result is subnormal.
namespace exp_detail {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;      // 9 significant bits: n * kLn2Hi is exact
constexpr float kLn2Lo = -2.12194440e-4f;   // ln2 - kLn2Hi
constexpr float kRound = 12582912.0f;       // 1.5 * 2^23: v + kRound has ulp 1, rounds v

// e^r 2^n for the reduced r and t = the rounding sum that gave n (n read from its bits rather
// than converted with (int), which would be undefined for NaN).
template <class MA>
CLUSTR_HD float scaled(float r, float t, MA ma) {
  float p = 1.9875691500e-4f;
  p = ma(p, r, 1.3981999507e-3f);
  p = ma(p, r, 8.3334519073e-3f);
  p = ma(p, r, 4.1665795894e-2f);
  p = ma(p, r, 1.6666665459e-1f);
  p = ma(p, r, 5.0000001201e-1f);
  const float er = ma(p * r, r, r) + 1.0f;
  const int32_t ni = static_cast<int32_t>(bits_of(t) - bits_of(kRound));
  const int32_t n1 = ni / 2, n2 = ni - n1;
  return er * float_from_bits(static_cast<uint32_t>(n1 + 127) << 23) *
         float_from_bits(static_cast<uint32_t>(n2 + 127) << 23);
}
}  // namespace exp_detail

// e^x for every float x, within 2 ulp of the exact value (checked against double exp over
// the whole range in tests/test_elementwise.cpp), and without a libm call or a branch, so that
// loops over it vectorise: libm's expf is one scalar call per element, and softmax spent most
// of its time there. The reduction and polynomial of exp_detail, x down to -104.
// The clamp of x to [kMin, kMax] also gives the limits: at kMin the formula yields
// 0.97 * 2^-150, which rounds to 0, and at kMax 1.0000003 * 2^128, which overflows to inf; NaN
// passes the clamp and flows through r.
CLUSTR_HD float exp(float x) {
  using namespace exp_detail;
  constexpr float kMax = 88.7228394f;         // e^kMax > FLT_MAX: inf from here up
  constexpr float kMin = -104.0f;             // e^kMin < 2^-150: 0 from here down
  const float xc = select(x < kMin, kMin, select(x > kMax, kMax, x));
  const float t = xc * kLog2e + kRound;
  const float n = t - kRound;  // round(x / ln2), in [-150, 128]
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  return scaled(r, t, MulAdd{});
}

CLUSTR_HD float relu(float x) { return x < 0.0f ? 0.0f : x; }  // NaN passes through

// erfc(x) for every float x, within 7 ulp of the exact value wherever it is a normal float
// (checked against double erfc in tests/test_elementwise.cpp), without a libm call or a branch,
// so that loops over it vectorise (libm's erfcf is one scalar call per element: GELU spent most
// of a BERT layer's non-GEMM time there). Its multiply-adds are fused (FusedMulAdd): GELU's
// row loops run half the instructions, with the same bits on every CPU and on the device.
// For z = |x|: erfc(z) = t e^(-z^2 + P(t)), t = 1 / (1 + z/2), P the degree-9 fit of Numerical
// Recipes' erfcc (relative error below 1.2e-7 for every z). -z^2 is split exactly into
// hi + lo (lo the fused product's rounding error), and e^(hi + lo + P) takes one range
// reduction: n from hi + P, then r = ((hi - n ln2_hi) + (lo - n ln2_lo)) + P, whose first
// difference is exact (hi and n ln2_hi are close multiples of a common small power of two), so
// the large exponent never carries the rounding of z^2 (the series below takes over for
// z <= 0.5). For x < 0, erfc(x) = 2 - erfc(-x). z is clamped at 10.5 (erfc(10.5) = 1e-49
// rounds to 0); NaN passes.
CLUSTR_HD float erfc(float x) {
  using namespace exp_detail;
  const FusedMulAdd ma;
  const float a = fabsf(x);
  const float z = select(a > 10.5f, 10.5f, a);
  const float t = 1.0f / ma(0.5f, z, 1.0f);
  float p = 0.17087277f;
  p = ma(p, t, -0.82215223f);
  p = ma(p, t, 1.48851587f);
  p = ma(p, t, -1.13520398f);
  p = ma(p, t, 0.27886807f);
  p = ma(p, t, -0.18628806f);
  p = ma(p, t, 0.09678418f);
  p = ma(p, t, 0.37409196f);
  p = ma(p, t, 1.00002368f);
  p = ma(p, t, -1.26551223f);
  const float hi = -z * z;
  const float lo = ma(-z, z, -hi);  // -z^2 - hi, exactly
  const float rounding = ma(hi + p, kLog2e, kRound);
  const float n = rounding - kRound;
  const float r = (ma(-n, kLn2Hi, hi) + ma(-n, kLn2Lo, lo)) + p;
  const float tail = t * scaled(r, rounding, ma);
  // Near 0 the fit's terms cancel to e^P with P near 0, a few ulp off erfc ~ 1: there
  // 1 - erf(z), erf from its Taylor series to z^13 (below an ulp for z <= 0.5).
  const float s = -hi;  // z^2
  float q = -1.0f / 9360.0f;
  q = ma(q, s, 1.0f / 1320.0f);
  q = ma(q, s, -1.0f / 216.0f);
  q = ma(q, s, 1.0f / 42.0f);
  q = ma(q, s, -1.0f / 10.0f);
  q = ma(q, s, 1.0f / 3.0f);
  const float erf_small = z * ma(-1.12837916709551257f * s, q, 1.12837916709551257f);
  const float rz = select(z <= 0.5f, 1.0f - erf_small, tail);
  return select(x < 0.0f, 2.0f - rz, rz);
}

// GELU, exact form 0.5 x (1 + erf(x / sqrt(2))) (PyTorch's default, not the tanh fit).
// Written with erfc because 1 + erf(z) = erfc(-z): for negative x, 1 + erf cancels to a few
// significant bits while erfc keeps full relative precision in the left tail.
CLUSTR_HD float gelu(float x) { return 0.5f * x * erfc(-x * kInvSqrt2); }

// 1 / (1 + e^-x), evaluated so that exp never overflows: with e = e^-|x| <= 1, it is
// 1 / (1 + e) for x >= 0 and e / (1 + e) for x < 0.
CLUSTR_HD float sigmoid(float x) {
  const float e = exp(-fabsf(x));  // <= 1
  const float s = 1.0f / (1.0f + e);
  return select(x < 0.0f, e * s, s);
}

struct Neg {
  CLUSTR_HD float operator()(float x) const { return -x; }
};
struct Exp {
  CLUSTR_HD float operator()(float x) const { return exp(x); }
};
struct Log {
  CLUSTR_HD float operator()(float x) const { return logf(x); }
};
struct Sqrt {
  CLUSTR_HD float operator()(float x) const { return sqrtf(x); }
};
struct Abs {
  CLUSTR_HD float operator()(float x) const { return fabsf(x); }
};
struct Relu {
  CLUSTR_HD float operator()(float x) const { return relu(x); }
};
struct Gelu {
  CLUSTR_HD float operator()(float x) const { return gelu(x); }
};
struct Tanh {
  CLUSTR_HD float operator()(float x) const { return tanhf(x); }
};
struct Sigmoid {
  CLUSTR_HD float operator()(float x) const { return sigmoid(x); }
};

// ---- derivatives of the unary ops: dx = dy * f'(x) -------------------------------------------
// Each functor takes (x, y = f(x), dy) but reads only the one of x and y that gives the cheaper
// and stabler formula; kUsesX / kUsesY say which, so a kernel loads, and an autograd node
// saves, only that one (exp, sqrt, tanh and sigmoid use y; log, abs, relu and gelu use x).

// d/dx of the exact GELU x Phi(x): Phi(x) + x phi(x), phi the standard normal density (the
// formula of PyTorch's gelu backward). Phi is written with erfc, as in gelu() above.
CLUSTR_HD float gelu_grad(float x) {
  constexpr float kInvSqrt2Pi = 0.39894228040143267794f;
  const float cdf = 0.5f * erfc(-x * kInvSqrt2);
  const float pdf = kInvSqrt2Pi * exp(-0.5f * x * x);
  return cdf + x * pdf;
}
CLUSTR_HD float sigmoid_grad_from_y(float y) { return y * (1.0f - y); }
CLUSTR_HD float tanh_grad_from_y(float y) { return 1.0f - y * y; }

struct NegGrad {
  static constexpr bool kUsesX = false, kUsesY = false;
  CLUSTR_HD float operator()(float, float, float dy) const { return -dy; }
};
struct ExpGrad {
  static constexpr bool kUsesX = false, kUsesY = true;
  CLUSTR_HD float operator()(float, float y, float dy) const { return dy * y; }
};
struct LogGrad {
  static constexpr bool kUsesX = true, kUsesY = false;
  CLUSTR_HD float operator()(float x, float, float dy) const { return dy / x; }
};
struct SqrtGrad {  // 1 / (2 sqrt(x)) = 0.5 / y
  static constexpr bool kUsesX = false, kUsesY = true;
  CLUSTR_HD float operator()(float, float y, float dy) const { return 0.5f * dy / y; }
};
// sign(x) dy, 0 at x = 0 (PyTorch's choice of subgradient).
struct AbsGrad {
  static constexpr bool kUsesX = true, kUsesY = false;
  CLUSTR_HD float operator()(float x, float, float dy) const {
    return select(x > 0.0f, dy, select(x < 0.0f, -dy, 0.0f));
  }
};
// dy where x > 0, else 0 (0 at the kink, as PyTorch).
struct ReluGrad {
  static constexpr bool kUsesX = true, kUsesY = false;
  CLUSTR_HD float operator()(float x, float, float dy) const { return select(x > 0.0f, dy, 0.0f); }
};
struct GeluGrad {
  static constexpr bool kUsesX = true, kUsesY = false;
  CLUSTR_HD float operator()(float x, float, float dy) const { return dy * gelu_grad(x); }
};
struct TanhGrad {
  static constexpr bool kUsesX = false, kUsesY = true;
  CLUSTR_HD float operator()(float, float y, float dy) const { return dy * tanh_grad_from_y(y); }
};
struct SigmoidGrad {
  static constexpr bool kUsesX = false, kUsesY = true;
  CLUSTR_HD float operator()(float, float y, float dy) const {
    return dy * sigmoid_grad_from_y(y);
  }
};

// ---- argmax ------------------------------------------------------------------------------------
// Does v replace the best value so far, scanning in index order? A larger value, or the first
// NaN (NaN counts as the largest, as in PyTorch); strict comparisons keep the first index among
// equal maxima (+0 and -0 are equal). Combining partial results of disjoint index sets with
// this rule, the lower index taken as "so far", gives the sequential scan's answer in any order.
CLUSTR_HD bool argmax_beats(float v, float best) { return v > best || (v != v && best == best); }

// ---- softmax pieces ------------------------------------------------------------------------
// A row x is reduced to m = max(x) and s = sum_j exp(x_j - m) (so every exp is <= 1 and none
// overflows); then softmax = exp(x - m) / s and log-softmax = x - m - log(s). A fully masked
// row (m = -inf) would give inf - inf = NaN here; kernels test for it and write 0 / -inf.
CLUSTR_HD bool fully_masked(float row_max) { return row_max == -INFINITY; }
CLUSTR_HD float log_softmax_value(float x, float row_max, float log_sum) {
  return x - row_max - log_sum;
}
// Backward over a row, given the forward output y and s from one pass over the row:
// softmax:     s = sum(dy * y), dx = y (dy - s);
// log-softmax: s = sum(dy),     dx = dy - exp(y) s (exp(y) is the softmax; y <= 0, so it
//              never overflows, and a masked entry y = -inf gives exp(y) = 0).
CLUSTR_HD float softmax_dx(float y, float dy, float s) { return y * (dy - s); }
CLUSTR_HD float log_softmax_dx(float y, float dy, float s) { return dy - exp(y) * s; }

// ---- layer norm, cross-entropy and dropout pieces ----------------------------------------------
// Layer norm forward of a row with mean mu and variance var (both in double, biased, from two
// passes over the row): rstd = 1 / sqrt(var + eps), and each element
// y = float((x - mu) rstd) gamma + beta, centred in double so that rows like 1e4 + noise keep
// their noise. (::sqrt: the double one, not a float overload.)
CLUSTR_HD double layer_norm_rstd(double var, float eps) { return 1.0 / ::sqrt(var + double(eps)); }
CLUSTR_HD float layer_norm_value(float x, double mu, double rstd, float gamma, float beta) {
  return static_cast<float>((x - mu) * rstd) * gamma + beta;
}

// The per-row constants of layer norm backward, from three sums over the row (double):
// sum_g = sum(g), sum_d = sum(d), sum_gd = sum(g d), with g = dy * gamma and d = x - mean_f.
// The saved mean is the float rounding mean_f of the row's mean; with rows like 1e4 + noise its
// error (up to half an ulp of 1e4, 5e-4) would shift every xhat by a visible amount. So the
// exact remainder c = mean(d) is recomputed, in double, and xhat = (x - shift) rstd with
// shift = mean_f + c agrees with the forward pass, which centred with the double mean.
// mean(g xhat) = rstd (mean(g d) - c mean(g)).
struct LayerNormRowGrad {
  double shift;           // mean_f + c
  float mean_g, mean_gx;  // mean(g), mean(g * xhat)
};
CLUSTR_HD LayerNormRowGrad layer_norm_row_grad(double sum_g, double sum_d, double sum_gd,
                                               float mean_f, float rstd, int64_t D) {
  const double c = sum_d / double(D);
  const double mean_g = sum_g / double(D);
  const double mean_gx = double(rstd) * (sum_gd / double(D) - c * mean_g);
  return {double(mean_f) + c, static_cast<float>(mean_g), static_cast<float>(mean_gx)};
}
CLUSTR_HD float layer_norm_xhat(float x, double shift, float rstd) {
  return static_cast<float>((double(x) - shift) * rstd);
}
// Layer norm backward sums dgamma and dbeta over the rows in groups of this many consecutive
// rows (at most 64 groups, their number a function of R alone) and then adds the group sums in
// group order; both backends split the rows this way, so they add the same terms in the same
// order and neither result depends on the thread count.
CLUSTR_HD int64_t layer_norm_group_rows(int64_t R) {
  const int64_t q = (R + 63) / 64;
  return q > 1 ? q : 1;
}
// g = dy * gamma of layer norm backward, rounded on its own. With D = 1, g - mean(g) must
// cancel to exactly 0 (the CPU compiles these rows with fp-contract=off); nvcc would otherwise
// fuse the product into that subtraction, leaving the product's rounding error, which rstd
// (up to 1 / sqrt(eps)) then amplifies.
CLUSTR_HD float layer_norm_g(float dy, float gamma) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(dy, gamma);
#else
  return dy * gamma;
#endif
}
// Layer norm backward for one element of a row, with g = dy * gamma, mean_g = mean(g) and
// mean_gx = mean(g * xhat) over the row: dx = rstd (g - mean_g - xhat mean_gx).
CLUSTR_HD float layer_norm_dx(float g, float xhat, float mean_g, float mean_gx, float rstd) {
  return rstd * (g - mean_g - xhat * mean_gx);
}

// The weight w_r of cross-entropy row r: 0 when its target is ignore_index, else weight[r]
// (1 when weight is null).
CLUSTR_HD float cross_entropy_weight(int32_t target, int32_t ignore_index, const float* weight,
                                     int64_t r) {
  return target == ignore_index ? 0.0f : (weight ? weight[r] : 1.0f);
}
// A row's logsumexp = m + log_s, with m its max and log_s = log(sum_j exp(x_j - m)) (every exp
// <= 1, so logits of 1e4 do not overflow; log_s = 0 for a fully masked row), and its loss
// w ((m - x_t) + log_s) rather than w (lse - x_t): both parts are small when x_t is near the
// max. Kernels skip a row with w = 0 (it adds 0, even when its loss is inf, and its target may
// be ignore_index, which is no column).
CLUSTR_HD float cross_entropy_lse(float m, double log_s) { return static_cast<float>(m + log_s); }
CLUSTR_HD double cross_entropy_row_loss(double w, float m, float x_t, double log_s) {
  return w * ((double(m) - x_t) + log_s);
}
// The results of a cross-entropy from its row sums (loss, weight: in double): mean divides by
// the weight, and is 0 over no weight at all (every row ignored or weighted 0: nothing to
// learn); loss_scale = d loss / d (sum of the row losses), which backward multiplies by dloss.
struct CrossEntropyTotals {
  float loss, weight_sum, loss_scale;
};
CLUSTR_HD CrossEntropyTotals cross_entropy_totals(double loss, double weight, bool mean) {
  if (!mean) return {static_cast<float>(loss), static_cast<float>(weight), 1.0f};
  if (!(weight > 0.0)) return {0.0f, static_cast<float>(weight), 0.0f};
  return {static_cast<float>(loss / weight), static_cast<float>(weight),
          static_cast<float>(1.0 / weight)};
}
CLUSTR_HD float cross_entropy_scale(float dloss, float loss_scale) { return dloss * loss_scale; }
// d loss / d logit_j of one cross-entropy row, scale = dloss * loss_scale * w_r:
// scale (softmax_j - [j == target]), softmax_j = exp(x_j - logsumexp).
CLUSTR_HD float cross_entropy_dlogit(float x, float lse, bool is_target, float scale) {
  return scale * (exp(x - lse) - select(is_target, 1.0f, 0.0f));
}

// Inverted dropout of one element: x * scale (scale = 1 / (1 - p)) when the uniform 32-bit word
// `bits` keeps it, which happens when uint_to_unit(bits) >= p, i.e. with probability 1 - p.
// A dropped element is 0 even when x is inf or NaN.
CLUSTR_HD float dropout_value(float x, uint32_t bits, float p, float scale) {
  return select(uint_to_unit(bits) >= p, x * scale, 0.0f);
}

// ---- full attention pieces (layers/attention/full*) ------------------------------------------
// Query row i of a sequence whose keys j < length are valid sees the keys j < this bound (with
// causal, only j <= i).
CLUSTR_HD int64_t attention_keys_seen(int64_t i, int64_t length, bool causal) {
  return causal && i + 1 < length ? i + 1 : length;
}
// A row's log-sum-exp from its max m and its sum l of exp(x - m) (l >= 1: the max contributes 1).
CLUSTR_HD float attention_lse(float m, float l) { return m + logf(l); }
// The dropout mask's element number of weight (b, h, i, j), the same on both devices: Philox
// block offset + idx / 4, word idx % 4 (full_cpu.h).
CLUSTR_HD uint64_t attention_dropout_index(int64_t bh, int64_t N, int64_t i, int64_t S,
                                           int64_t j) {
  return static_cast<uint64_t>((bh * N + i) * S + j);
}

// ---- query clustering pieces (layers/attention/clustering*) --------------------------------
// Bits set in x: the Hamming distance of two hash codes is popcount64(a ^ b).
CLUSTR_HD int popcount64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __popcll(x);
#else
  return __builtin_popcountll(x);
#endif
}
// A hash plane's threshold lo + u (hi - lo) (clustering.h), rounded as the CPU rounds it: nvcc
// would fuse the product into the sum, and a threshold one ulp off can flip a code bit.
CLUSTR_HD float clustering_threshold(float lo, float hi, float u) {
#if defined(__CUDA_ARCH__)
  return lo + __fmul_rn(u, hi - lo);
#else
  return lo + u * (hi - lo);
#endif
}

// ---- logarithm and log-add-exp (CTC recursions, decoding) ------------------------------------
// ln(2^k x) for a positive normal float x and an integer k (as a float), branch-free so that
// loops over it vectorise, as exp above does. x = 2^e m with m in [sqrt(1/2), sqrt(2)); ln(m)
// from Cephes' logf polynomial in f = m - 1, and (e + k) ln2 added in two parts (kLn2Hi times
// an integer below 2^15 is exact). No special values: log() below handles those, and
// log_add_exp calls this directly on its sum in [1, 3].
CLUSTR_HD float log_scaled(float x, float k) {
  constexpr float kSqrtHalf = 0.707106781186547524f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  const uint32_t b = bits_of(x);
  const float m = float_from_bits((b & 0x007fffffu) | 0x3f000000u);  // in [0.5, 1)
  const bool low = m < kSqrtHalf;
  const float e =
      static_cast<float>(static_cast<int32_t>(b >> 23) - 126) + k - select(low, 1.0f, 0.0f);
  const float f = select(low, m + m, m) - 1.0f;  // in [sqrt(1/2) - 1, sqrt(2) - 1)
  const float z = f * f;
  float p = 7.0376836292e-2f;
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  const float y = p * f * z + e * kLn2Lo - 0.5f * z;
  return (f + y) + e * kLn2Hi;
}

// ln(x) for every float x, within 2 ulp of the exact value (checked against double log in
// tests/test_ctc.cpp). Subnormal x is scaled by 2^23 first; the special values are selected
// at the end: 0 gives -inf, +inf gives +inf, negative x and NaN give NaN.
CLUSTR_HD float log(float x) {
  constexpr float kMinNormal = 1.17549435e-38f;  // 2^-126
  const bool tiny = x < kMinNormal;
  const float r = log_scaled(select(tiny, x * 8388608.0f, x), select(tiny, -23.0f, 0.0f));
  return select(!(x >= 0.0f), NAN, select(x == 0.0f, -INFINITY, select(x == INFINITY, x, r)));
}

// e^d for the terms of a log-add-exp, d <= 0: d is raised to at least -80 first, which
// changes no result (1 + e^-80 rounds to 1 as 1 + e^d does) but keeps every intermediate of
// exp a normal float: on x86 an operation that produces or reads a subnormal float can take
// a hundred cycles, and -inf terms (impossible CTC positions) would produce them all the time.
CLUSTR_HD float exp_term(float d) { return exp(select(d < -80.0f, -80.0f, d)); }

// ln(e^a + e^b) = max + ln(1 + e^(min - max)), which never overflows. Both -inf gives -inf
// (min - max would be NaN there); a NaN argument gives NaN (through sum - sum, which is 0
// otherwise: log_scaled works on the bits and would turn a NaN sum into a number).
CLUSTR_HD float log_add_exp(float a, float b) {
  const bool a_hi = a > b;
  const float hi = select(a_hi, a, b), lo = select(a_hi, b, a);
  const float sum = 1.0f + exp_term(lo - hi);
  const float r = hi + log_scaled(sum, 0.0f) + (sum - sum);
  return select(hi == -INFINITY, hi, r);
}

// ln(e^a + e^b + e^c): the largest m of the three is found with compares (no sorting
// branch), so only the other two need an exp: m + ln(1 + e^(o1 - m) + e^(o2 - m)). All -inf
// gives -inf, a NaN argument NaN. The CTC alpha/beta recursions spend their time here.
CLUSTR_HD float log_add_exp(float a, float b, float c) {
  const bool a_hi = a > b;
  const float hi_ab = select(a_hi, a, b), lo_ab = select(a_hi, b, a);
  const bool ab_hi = hi_ab > c;
  const float m = select(ab_hi, hi_ab, c), mid = select(ab_hi, c, hi_ab);
  const float sum = 1.0f + exp_term(lo_ab - m) + exp_term(mid - m);
  const float r = m + log_scaled(sum, 0.0f) + (sum - sum);
  return select(m == -INFINITY, m, r);
}

}  // namespace clustr::math
