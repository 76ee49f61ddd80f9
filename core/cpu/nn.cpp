// CPU kernels of the nn ops (see core/cpu/nn.h for shapes): the unary derivatives,
// cross-entropy forward and backward, and dropout (softmax's backward is in
// core/cpu/softmax.cpp, layer norm in core/cpu/layer_norm.cpp). The per-element formulas live in
// core/math.h. Row sums are accumulated in double over 8 partial sums in a fixed order
// (row_sum.h), so a row's result is the same whichever thread computes it.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/cpu/nn.h"
#include "core/cpu/row_clones.h"
#include "core/cpu/row_sum.h"
#include "core/math.h"
#include "core/philox.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace clustr::cpu {

namespace {

constexpr int64_t kParallelMin = 16384;  // elements; below this a parallel region costs more
constexpr int64_t kDropoutItem = 4096;   // dropout's elements per parallel work item

// NaN-propagating, so that a row holding a NaN gives NaN rather than passing as masked.
float logits_max(const float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = math::Maximum{}(m, x[j]);
  return m;
}

// Calls fn(functor) with the derivative functor of op (core/math.h).
template <class Fn>
[[gnu::always_inline]] inline void with_unary_grad(UnaryOp op, Fn&& fn) {
  switch (op) {
    case UnaryOp::neg: return fn(math::NegGrad{});
    case UnaryOp::exp: return fn(math::ExpGrad{});
    case UnaryOp::log: return fn(math::LogGrad{});
    case UnaryOp::sqrt: return fn(math::SqrtGrad{});
    case UnaryOp::abs: return fn(math::AbsGrad{});
    case UnaryOp::relu: return fn(math::ReluGrad{});
    case UnaryOp::gelu: return fn(math::GeluGrad{});
    case UnaryOp::tanh: return fn(math::TanhGrad{});
    case UnaryOp::sigmoid: return fn(math::SigmoidGrad{});
  }
}

// dx = f'(x or y) dy over a contiguous span, compiled per instruction set as unary() is
// (core/cpu/elementwise.cpp). The pointer that the formula does not read may be null; the
// branch is decided at compile time, so it is never dereferenced.
CLUSTR_ROW_CLONES_NO_CONTRACT
void unary_backward_span(UnaryOp op, const float* x, const float* y, const float* dy, float* dx,
                         int64_t n) {
  with_unary_grad(op, [&](auto f) __attribute__((always_inline)) {
    using F = decltype(f);
    for (int64_t i = 0; i < n; ++i)
      dx[i] = f(F::kUsesX ? x[i] : 0.0f, F::kUsesY ? y[i] : 0.0f, dy[i]);
  });
}

// Dropout of x[0..n) into y, element i kept when word i % 4 of Philox block `block` + i / 4
// says so (math::dropout_value): the portable loop, a block at a time.
void dropout_blocks(const float* x, float p, float scale, uint64_t seed, uint64_t block, float* y,
                    int64_t n) {
  for (int64_t i0 = 0; i0 < n; i0 += 4, ++block) {
    const Philox4 bits = philox4x32(seed, block);
    const int64_t len = std::min<int64_t>(4, n - i0);
    for (int64_t k = 0; k < len; ++k)
      y[i0 + k] = math::dropout_value(x[i0 + k], bits.v[k], p, scale);
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#define CLUSTR_DROPOUT_AVX512 1
// GCC 12 reports the intrinsics' internal undefined vectors as (maybe) uninitialized (a known
// false positive of its headers; see gemm_driver.h's transpose16).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define CLUSTR_TARGET_AVX512 __attribute__((target("avx512f")))
// The same with AVX-512: Philox runs on sixteen blocks per register (block j in lane j), two
// groups of sixteen at a time so that one group's multiplies overlap the other's. Philox is
// most of dropout's time, and the scalar loop spent a tenth of a fine-tuning step in it.
//
// One round on a group: (hi, lo) of the 32 x 32-bit products M0 c0 and M1 c2. _mm512_mul_epu32
// multiplies the even lanes (the low halves of the 64-bit lanes); the odd lanes, shifted down,
// go through a second one.
struct PhiloxGroup {
  __m512i c0, c1, c2, c3;
};
CLUSTR_TARGET_AVX512 inline void mul_hi_lo(__m512i a, __m512i m, __m512i* hi, __m512i* lo) {
  const __m512i even = _mm512_mul_epu32(a, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
  *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}
CLUSTR_TARGET_AVX512 inline void philox_round(PhiloxGroup& g, __m512i k0, __m512i k1) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(0xCD9E8D57u));
  __m512i hi0, lo0, hi1, lo1;
  mul_hi_lo(g.c0, m0, &hi0, &lo0);
  mul_hi_lo(g.c2, m1, &hi1, &lo1);
  g.c0 = _mm512_ternarylogic_epi32(hi1, g.c1, k0, 0x96);  // three-way xor
  g.c2 = _mm512_ternarylogic_epi32(hi0, g.c3, k1, 0x96);
  g.c1 = lo1;
  g.c3 = lo0;
}
// The counters of blocks first .. first + 15 (a carry into the high word where the low wraps).
CLUSTR_TARGET_AVX512 inline PhiloxGroup philox_counters(uint64_t first) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i lo = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first)));
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(first >> 32)));
  PhiloxGroup g;
  g.c0 = _mm512_add_epi32(lo, lanes);
  g.c1 = _mm512_mask_add_epi32(hi, _mm512_cmplt_epu32_mask(g.c0, lo), hi, _mm512_set1_epi32(1));
  g.c2 = g.c3 = _mm512_setzero_si512();
  return g;
}
// Words of a group in stream order: out[q] holds blocks 4 q .. 4 q + 3, four words each.
CLUSTR_TARGET_AVX512 inline void philox_words(const PhiloxGroup& g, __m512i out[4]) {
  const __m512i t0 = _mm512_unpacklo_epi32(g.c0, g.c1), t1 = _mm512_unpackhi_epi32(g.c0, g.c1);
  const __m512i t2 = _mm512_unpacklo_epi32(g.c2, g.c3), t3 = _mm512_unpackhi_epi32(g.c2, g.c3);
  // 128-bit lane L of u_b: block 4 L + b's words.
  const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
  const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
  const __m512i a = _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(1, 0, 1, 0));  // lanes 0, 1
  const __m512i b = _mm512_shuffle_i32x4(u2, u3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i c = _mm512_shuffle_i32x4(u0, u1, _MM_SHUFFLE(3, 2, 3, 2));  // lanes 2, 3
  const __m512i d = _mm512_shuffle_i32x4(u2, u3, _MM_SHUFFLE(3, 2, 3, 2));
  out[0] = _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(2, 0, 2, 0));
  out[1] = _mm512_shuffle_i32x4(a, b, _MM_SHUFFLE(3, 1, 3, 1));
  out[2] = _mm512_shuffle_i32x4(c, d, _MM_SHUFFLE(2, 0, 2, 0));
  out[3] = _mm512_shuffle_i32x4(c, d, _MM_SHUFFLE(3, 1, 3, 1));
}
// Sixteen elements from their sixteen words: math::dropout_value's float(w >> 8) 2^-24 >= p,
// then x scale or 0 (exact, so the same bits as the portable loop).
CLUSTR_TARGET_AVX512 inline void drop16(const float* x, __m512i words, __m512 p, __m512 scale,
                                        float* y) {
  const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(words, 8)),
                                 _mm512_set1_ps(1.0f / 16777216.0f));
  const __mmask16 keep = _mm512_cmp_ps_mask(u, p, _CMP_GE_OQ);
  _mm512_storeu_ps(y, _mm512_maskz_mul_ps(keep, _mm512_loadu_ps(x), scale));
}
CLUSTR_TARGET_AVX512 void dropout_avx512(const float* x, float p, float scale, uint64_t seed,
                                         uint64_t block, float* y, int64_t n) {
  constexpr int64_t kStep = 2 * 16 * 4;  // two groups of sixteen blocks
  const __m512 vp = _mm512_set1_ps(p), vscale = _mm512_set1_ps(scale);
  int64_t i0 = 0;
  for (; i0 + kStep <= n; i0 += kStep) {
    const uint64_t first = block + static_cast<uint64_t>(i0 / 4);
    PhiloxGroup g = philox_counters(first), h = philox_counters(first + 16);
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < 10; ++round) {
      const __m512i vk0 = _mm512_set1_epi32(static_cast<int>(k0));
      const __m512i vk1 = _mm512_set1_epi32(static_cast<int>(k1));
      philox_round(g, vk0, vk1);
      philox_round(h, vk0, vk1);
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    __m512i words[8];
    philox_words(g, words);
    philox_words(h, words + 4);
    for (int q = 0; q < 8; ++q) drop16(x + i0 + 16 * q, words[q], vp, vscale, y + i0 + 16 * q);
  }
  dropout_blocks(x + i0, p, scale, seed, block + static_cast<uint64_t>(i0 / 4), y + i0, n - i0);
}
#undef CLUSTR_TARGET_AVX512
#pragma GCC diagnostic pop
#endif

}  // namespace

UnaryGradInputs unary_grad_inputs(UnaryOp op) {
  UnaryGradInputs in;
  with_unary_grad(op, [&](auto f) {
    in.x = decltype(f)::kUsesX;
    in.y = decltype(f)::kUsesY;
  });
  return in;
}

void unary_backward(UnaryOp op, const float* x, const float* y, const float* dy, float* dx,
                    int64_t n) {
  const int64_t items = (n + kParallelMin - 1) / kParallelMin;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t i0 = item * kParallelMin;
    unary_backward_span(op, x ? x + i0 : nullptr, y ? y + i0 : nullptr, dy + i0, dx + i0,
                        std::min(kParallelMin, n - i0));
  }
}

CrossEntropySums cross_entropy(const float* logits, const int32_t* target, const float* weight,
                               int32_t ignore_index, float* lse, int64_t R, int64_t V,
                               int32_t* predictions) {
  // Per-row terms, summed below in row order so the total does not depend on the threads.
  std::vector<double> row_loss(static_cast<size_t>(R)), row_weight(static_cast<size_t>(R));
#pragma omp parallel for schedule(static) if (R * V >= kParallelMin)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = logits + r * V;
    // logsumexp = m + log(sum exp(x - m)): every exp is <= 1, so logits of 1e4 do not overflow.
    const float m = logits_max(xr, V);
    double log_s = 0;
    if (!math::fully_masked(m))
      log_s = std::log(row_sum(V, [&](int64_t j) { return double(math::exp(xr[j] - m)); }));
    lse[r] = math::cross_entropy_lse(m, log_s);
    if (predictions) {  // the first largest logit (math::argmax_beats), as argmax finds it
      int64_t at = 0;
      for (int64_t j = 1; j < V; ++j)
        if (math::argmax_beats(xr[j], xr[at])) at = j;
      predictions[r] = static_cast<int32_t>(at);
    }
    const int32_t t = target[r];
    const double w = math::cross_entropy_weight(t, ignore_index, weight, r);
    row_weight[static_cast<size_t>(r)] = w;
    row_loss[static_cast<size_t>(r)] =
        w == 0.0 ? 0.0 : math::cross_entropy_row_loss(w, m, xr[t], log_s);
  }
  CrossEntropySums sums;
  for (int64_t r = 0; r < R; ++r) {
    sums.loss += row_loss[static_cast<size_t>(r)];
    sums.weight += row_weight[static_cast<size_t>(r)];
  }
  return sums;
}

void cross_entropy_backward(float scale, const float* logits, const int32_t* target,
                            const float* weight, const float* lse, int32_t ignore_index,
                            float* dlogits, int64_t R, int64_t V) {
#pragma omp parallel for schedule(static) if (R * V >= kParallelMin)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = logits + r * V;
    float* out = dlogits + r * V;
    const int32_t t = target[r];
    const float w = math::cross_entropy_weight(t, ignore_index, weight, r);
    if (w == 0.0f) {
      std::fill(out, out + V, 0.0f);
      continue;
    }
    const float sc = scale * w, l = lse[r];
    // The target column is redone after the loop, which then has no per-element test and
    // vectorises.
    for (int64_t j = 0; j < V; ++j) out[j] = math::cross_entropy_dlogit(xr[j], l, false, sc);
    out[t] = math::cross_entropy_dlogit(xr[t], l, true, sc);
  }
}

void dropout_portable(const float* x, float p, uint64_t seed, uint64_t offset, float* y,
                      int64_t n) {
  const float scale = 1.0f / (1.0f - p);
  const int64_t items = (n + kDropoutItem - 1) / kDropoutItem;
  // Philox costs about as much as the rest together, so parallelise earlier than elsewhere.
#pragma omp parallel for schedule(static) if (n >= kParallelMin / 4)
  for (int64_t item = 0; item < items; ++item) {
    const int64_t i0 = item * kDropoutItem;
    dropout_blocks(x + i0, p, scale, seed, offset + static_cast<uint64_t>(i0 / 4), y + i0,
                   std::min(kDropoutItem, n - i0));
  }
}

void dropout(const float* x, float p, uint64_t seed, uint64_t offset, float* y, int64_t n) {
#ifdef CLUSTR_DROPOUT_AVX512
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512) {
    const float scale = 1.0f / (1.0f - p);
    const int64_t items = (n + kDropoutItem - 1) / kDropoutItem;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t i0 = item * kDropoutItem;
      dropout_avx512(x + i0, p, scale, seed, offset + static_cast<uint64_t>(i0 / 4), y + i0,
                     std::min(kDropoutItem, n - i0));
    }
    return;
  }
#endif
  dropout_portable(x, p, seed, offset, y, n);
}

}  // namespace clustr::cpu
