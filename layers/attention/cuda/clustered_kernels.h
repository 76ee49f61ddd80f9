// Kernels and host helpers shared by the device clustered attention ops (cuda/clustered.cu,
// eq. 3-6, and cuda/improved_clustered.cu, eq. 9-11), beside layers/attention/cuda/dropout.h: the
// per-cluster member sums, the masked softmax rows of Ac and their backward, the broadcast of a
// cluster's row to its members, and the per-sequence batched GEMMs. Written against
// core/cuda/kernel.h; included only by those .cu files.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters; L the
// valid keys of a sequence (lengths[b], or S). Rows of (pair bh, cluster j) are row bh C + j.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/cuda/scratch.h"
#include "core/math.h"
#include "core/philox.h"
#include "layers/attention/cuda/clustered.h"
#include "layers/attention/cuda/dropout.h"

namespace clustr::cuda::clustered_kernels {

using attention_kernels::Dropout;
using attention_kernels::dropout_of;
using attention_kernels::for_each_word;

// Clamped to [0, S]: a length outside it is possible only when the front door's check was
// deferred to the device (cuda.h's DeferredChecks), which reports it.
CLUSTR_DEVICE int64_t keys_of(const int32_t* lengths, int64_t bh, int64_t H, int64_t S) {
  const int64_t given = lengths ? lengths[bh / H] : S;
  return given < 0 ? 0 : given > S ? S : given;
}

// y (B, H, C, w) = sum over the members of each cluster of the rows of x (B, H, N, w), in query
// order from 0 (the CPU's sum_members); with `mean`, divided by |j| when |j| > 1 (eq. 4-5).
// Empty clusters get 0. One CUDA block per (pair, cluster), threads over w.
struct MemberSumKernel {
  static constexpr bool kUsesBarrier = false;
  const float* x;
  float* y;
  const int32_t *count, *start, *order;
  int64_t N, C, w;
  bool mean;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t j = t.block_idx().x % C, bh = t.block_idx().x / C;
    const int32_t* st = start + bh * (C + 1);
    const int32_t* ord = order + bh * N;
    const int32_t n = count[bh * C + j];
    for (int64_t e = t.thread_idx().x; e < w; e += t.block_dim().x) {
      float acc = 0.0f;
      for (int32_t r = st[j]; r < st[j + 1]; ++r) acc += x[(bh * N + ord[r]) * w + e];
      if (mean && n > 1) acc /= static_cast<float>(n);
      y[(bh * C + j) * w + e] = acc;
    }
  }
};

// eq. 3 row by row, one CUDA block per row (pair bh, cluster j) = block bh C + j: the first L columns of ac (B, H, C,
// S) hold t Qc K^T and become softmax over them, the rest 0; rows of empty clusters, and all
// rows when L = 0, are 0. With dropout, ad = Ac D / (1 - p) on the first L columns.
struct WeightsRowsKernel {
  static constexpr bool kUsesBarrier = true;
  float* ac;
  float* ad;  // null without dropout
  const int32_t* count;
  const int32_t* lengths;
  int64_t H, C, S;
  Dropout drop;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t j = t.block_idx().x % C, bh = t.block_idx().x / C;
    const int64_t L = keys_of(lengths, bh, H, S);
    float* x = ac + (bh * C + j) * S;
    if (count[bh * C + j] == 0 || L == 0) {  // the same for the whole block
      // An empty cluster's row is read by the product Ac V (whose result nobody uses): zeros,
      // in the dropped-out copy too, rather than memory nothing wrote.
      for (int64_t c = tid; c < S; c += nt) x[c] = 0.0f;
      if (drop.on())
        for (int64_t c = tid; c < S; c += nt) ad[(bh * C + j) * S + c] = 0.0f;
      return;
    }
    float m = x[0];
    for (int64_t c = tid; c < L; c += nt) m = math::Maximum{}(m, x[c]);
    m = block_reduce(t, m, t.shared<float>(), math::Maximum{});
    double acc = 0.0;
    for (int64_t c = tid; c < L; c += nt) {
      x[c] = math::exp(x[c] - m);
      acc += x[c];
    }
    const float inv = 1.0f / static_cast<float>(block_reduce(t, acc, t.shared<double>(),
                                                             AddDouble{}));
    for (int64_t c = tid; c < L; c += nt) x[c] *= inv;
    for (int64_t c = L + tid; c < S; c += nt) x[c] = 0.0f;
    if (!drop.on()) return;
    t.sync();  // the mask's columns fall to other threads than the normalisation's
    float* y = ad + (bh * C + j) * S;
    const float p = drop.p, scale = drop.scale;
    for_each_word(t, drop, static_cast<uint64_t>((bh * C + j) * S), L,
                  [&](int64_t c, uint32_t word) { y[c] = math::dropout_value(x[c], word, p, scale); });
    for (int64_t c = L + tid; c < S; c += nt) y[c] = 0.0f;
  }
};

// Backward of eq. 3 and of the mask, one CUDA block per row (as WeightsRowsKernel): on the first L columns,
// ad = Ac D r and g = dAc D r (with dropout), then g = Ac (g - sum_l Ac[l] g[l]) in place; 0 on
// the others.
struct BackwardRowsKernel {
  static constexpr bool kUsesBarrier = true;
  const float* ac;
  float* ds;  // dAc in, dS out
  float* ad;  // null without dropout
  const int32_t* lengths;
  int64_t H, C, S;
  Dropout drop;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t j = t.block_idx().x % C, bh = t.block_idx().x / C;
    const int64_t L = keys_of(lengths, bh, H, S);
    const int64_t row = (bh * C + j) * S;
    const float* w = ac + row;
    float* g = ds + row;
    if (drop.on()) {
      float* y = ad + row;
      const float p = drop.p, scale = drop.scale;
      for_each_word(t, drop, static_cast<uint64_t>(row), L, [&](int64_t c, uint32_t word) {
        y[c] = math::dropout_value(w[c], word, p, scale);
        g[c] = math::dropout_value(g[c], word, p, scale);
      });
      t.sync();
    }
    double acc = 0.0;
    for (int64_t c = tid; c < L; c += nt) acc += double(g[c]) * w[c];
    const float dot = static_cast<float>(block_reduce(t, acc, t.shared<double>(), AddDouble{}));
    for (int64_t c = tid; c < L; c += nt) g[c] = math::softmax_dx(w[c], g[c], dot);
    // Masked keys: zeros, which the products read when their sizes do not stop at L (lengths on
    // the device only, as in a CUDA graph's capture).
    for (int64_t c = L + tid; c < S; c += nt) {
      g[c] = 0.0f;
      if (drop.on()) ad[row + c] = 0.0f;
    }
  }
};

// y (B, H, N, w): row i of pair bh = src (B, H, C, w) row a[i] (divided by |a[i]| with
// `mean`), 0 for padded queries and when the sequence has no valid key. One thread per element.
struct BroadcastKernel {
  static constexpr bool kUsesBarrier = false;
  const float* src;
  float* y;
  const int32_t* assignment;
  const int32_t* count;
  const int32_t* lengths;
  int64_t H, N, S, C, w, total;
  bool mean;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t e = global_x(t); e < total; e += grid_stride_x(t)) {
      const int64_t row = e / w, bh = row / N;
      const int32_t j = assignment[row];
      // j >= C only when the front door's check went to the device (which reports it).
      if (j < 0 || j >= C || keys_of(lengths, bh, H, S) == 0) {
        y[e] = 0.0f;
        continue;
      }
      const float v = src[(bh * C + j) * w + e % w];
      y[e] = mean ? v / static_cast<float>(count[bh * C + j]) : v;
    }
  }
};

// Calls f(b0, nb, L) for runs of sequences that share their key count L: all B at once without
// lengths, else each run of consecutive sequences of one length (the GEMM sizes come from the
// host lengths).
template <class F>
inline void for_each_sequence(const ClusteredDims& d, const ClusteredParams& p, F f) {
  if (!p.lengths_host) return f(int64_t{0}, d.B, d.S);
  // Consecutive sequences of one length share a call: a batch of equal lengths (the copy
  // task's) makes one call, as without lengths.
  for (int64_t b0 = 0; b0 < d.B;) {
    const int32_t L = p.lengths_host[b0];
    int64_t nb = 1;
    while (b0 + nb < d.B && p.lengths_host[b0 + nb] == L) ++nb;
    f(b0, nb, static_cast<int64_t>(L));
    b0 += nb;
  }
}

// True when some sequence has fewer than S valid keys by the host lengths: for_each_sequence's
// GEMMs then leave the rows of its masked keys unwritten (zeroed first by the caller).
inline bool some_keys_masked(const ClusteredDims& d, const ClusteredParams& p) {
  if (!p.lengths_host) return false;
  for (int64_t b = 0; b < d.B; ++b)
    if (p.lengths_host[b] < d.S) return true;
  return false;
}

// The elements a batch of `batch` matrices of rows x cols spans (row stride ld, matrix i at
// i * stride).
inline int64_t batch_span(int64_t rows, int64_t cols, int64_t ld, int64_t stride, int64_t batch) {
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

// Under bf16, the span of a batch of f32 matrices (rows x cols stored, row stride ld, matrix i
// at i * stride) converted to bf16, for the products that read it: an operand that several
// products share (dS in backward) is converted once, given to each as product's a_bf16. Null
// without bf16 or for an empty batch.
inline std::unique_ptr<Scratch<uint16_t>> bf16_operand(bool bf16, const float* x, int64_t rows,
                                                       int64_t cols, int64_t ld, int64_t stride,
                                                       int64_t batch) {
  if (!bf16 || rows == 0 || cols == 0 || batch == 0) return nullptr;
  const int64_t n = batch_span(rows, cols, ld, stride, batch);
  auto h = std::make_unique<Scratch<uint16_t>>(n);
  f32_to_bf16(x, h->get(), n);
  return h;
}

// A batch of GEMMs over `batch` pairs, C_i(rows, cols) = alpha op(A_i) op(B_i) + beta C_i with
// an inner size that may be 0 (then C_i = 0 when beta is 0; every such C here is a contiguous
// block), and nothing to do for an empty C. With bf16 (the precision policy: the C x S
// products, as cluster_product on the CPU) the operands are converted to bf16 once, the spans
// the batch reads (A's already, when a_bf16 holds it: bf16_operand of A's stored shape), and
// the bf16 GEMM sums in f32.
inline void product(bool bf16, bool ta, bool tb, int64_t rows, int64_t cols, int64_t inner,
                    float alpha, const float* A, int64_t lda, int64_t sa, const float* Bm,
                    int64_t ldb, int64_t sb, float* Cm, int64_t ldc, int64_t sc, int64_t batch,
                    float beta = 0.0f, const Scratch<uint16_t>* a_bf16 = nullptr) {
  if (rows == 0 || cols == 0 || batch == 0) return;
  if (inner == 0) {
    if (beta == 0.0f) fill_f32(Cm, 0.0f, batch * sc);
    return;
  }
  if (!bf16)
    return gemm_strided_batched(ta, tb, rows, cols, inner, alpha, A, lda, sa, Bm, ldb, sb, beta,
                                Cm, ldc, sc, batch);
  std::unique_ptr<Scratch<uint16_t>> own_a;
  if (!a_bf16) {
    own_a = bf16_operand(true, A, ta ? inner : rows, ta ? rows : inner, lda, sa, batch);
    a_bf16 = own_a.get();
  }
  const auto b = bf16_operand(true, Bm, tb ? cols : inner, tb ? inner : cols, ldb, sb, batch);
  gemm_bf16_strided_batched(ta, tb, rows, cols, inner, alpha, a_bf16->get(), lda, sa, b->get(),
                            ldb, sb, beta, Cm, ldc, sc, batch);
}

inline unsigned grid_of(int64_t n) { return static_cast<unsigned>(n); }

// eq. 4-5 and the logits of eq. 3: centroids (B, H, C, E) = the mean of each cluster's queries
// (launch name `what`), then the first L columns of each sequence's weights (B, H, C, S) =
// t Qc K^T.
inline void centroid_logits(const char* what, const ClusteredDims& d, const ClusteredParams& p,
                            const float* Q, const float* K, float* centroids, float* weights) {
  const int64_t H = d.H, N = d.N, S = d.S, E = d.E, C = d.C;
  launch(what, {grid_of(d.B * H * C)}, {row_threads(E)}, 0,
         MemberSumKernel{Q, centroids, p.count, p.start, p.order, N, C, E, true});
  for_each_sequence(d, p, [&](int64_t b0, int64_t nb, int64_t L) {
    product(p.bf16, false, true, C, L, E, p.temperature, centroids + b0 * H * C * E, E, C * E,
            K + b0 * H * S * E, E, S * E, weights + b0 * H * C * S, S, C * S, nb * H);
  });
}

// dVc (B, H, C, M) = the sum of each cluster's rows of dout (launch name `what`), then the first
// L columns of each sequence's dAc (B, H, C, S) = dVc V^T.
inline void cluster_value_grads(const char* what, const ClusteredDims& d,
                                const ClusteredParams& p, const float* dout, const float* V,
                                float* dvc, float* ds) {
  const int64_t H = d.H, N = d.N, S = d.S, M = d.M, C = d.C;
  launch(what, {grid_of(d.B * H * C)}, {row_threads(M)}, 0,
         MemberSumKernel{dout, dvc, p.count, p.start, p.order, N, C, M, false});
  for_each_sequence(d, p, [&](int64_t b0, int64_t nb, int64_t L) {
    product(p.bf16, false, true, C, L, M, 1.0f, dvc + b0 * H * C * M, M, C * M,
            V + b0 * H * S * M, M, S * M, ds + b0 * H * C * S, S, C * S, nb * H);
  });
}

}  // namespace clustr::cuda::clustered_kernels
