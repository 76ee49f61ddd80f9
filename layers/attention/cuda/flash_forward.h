// The forward kernel of full attention on tensor cores (flash.cu describes it): one block of 4
// warps per query block and (b, h). Included only by flash.cu.
#pragma once

#include "layers/attention/cuda/flash_kernels.h"

namespace clustr::cuda::flash_kernels {

template <class Math, int D>
struct FlashForward {
  static constexpr bool kUsesBarrier = true;
  using T = Tile<Math, D>;
  using Elem = typename Math::Elem;
  static constexpr int kMT = Shape<Math, D>::kMT, kBk = Shape<Math, D>::kBk;
  static constexpr int kBq = 16 * kMT * kWarps, kSteps = D / Math::kK, kStride = T::kStride;
  static constexpr size_t kShared = T::bytes(kBq + 4 * kBk);  // Q, K x 2, V x 2

  Operands<Elem> a;
  Heads<float> out;
  float* lse;        // (B, H, N)
  int64_t q_blocks;  // per (b, h)

  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t block = t.block_idx().x, bh = block / q_blocks, b = bh / a.H, h = bh % a.H;
    const int64_t i0 = block % q_blocks * kBq;
    const Sequence sq = sequence_of(a.lengths, b, a.N, a.S);
    const int rows = static_cast<int>(min64(kBq, a.N - i0));
    const int live = static_cast<int>(max64(0, min64(sq.live - i0, rows)));
    const unsigned tid = t.thread_idx().x, l = mma::lane(t), w = mma::warp(t);
    const unsigned g = l / 4, c = l % 4;
    float* out_head = out.at(b, h);
    float* lse_head = lse + bh * a.N;
    if (live == 0) {  // no row of the block sees a key (the same for every thread)
      for (int e = static_cast<int>(tid); e < rows * D; e += kThreads)
        out_head[(i0 + e / D) * out.row + e % D] = 0.0f;
      for (int r = static_cast<int>(tid); r < rows; r += kThreads) lse_head[i0 + r] = -INFINITY;
      return;
    }
    // The keys the block's last live row sees: the last row sees the most.
    const int64_t keys = math::attention_keys_seen(i0 + live - 1, sq.length, a.causal);
    const int tiles = static_cast<int>((keys + kBk - 1) / kBk);
    Elem* sQ = t.shared<Elem>();
    Elem* sK = sQ + kBq * kStride;
    Elem* sV = sK + 2 * kBk * kStride;
    const Elem* k_head = a.k.at(b, h);
    const Elem* v_head = a.v.at(b, h);
    T::load(t, sQ, a.q.at(b, h) + i0 * a.q.row, a.q.row, kBq, rows);
    T::load(t, sK, k_head, a.k.row, kBk, static_cast<int>(min64(kBk, keys)));
    mma::cp_async_commit(t);

    FragC acc[kMT][D / 8];
    float m[kMT][2], lsum[kMT][2];
    CLUSTR_UNROLL
    for (int mt = 0; mt < kMT; ++mt) {
      CLUSTR_UNROLL
      for (int n = 0; n < D / 8; ++n) zero(acc[mt][n]);
      m[mt][0] = m[mt][1] = -INFINITY;
      lsum[mt][0] = lsum[mt][1] = 0.0f;
    }
    for (int j = 0; j < tiles; ++j) {
      const int64_t j0 = int64_t(j) * kBk;
      const int valid = static_cast<int>(min64(kBk, keys - j0));
      const Elem* kt = sK + (j % 2) * kBk * kStride;
      Elem* vt = sV + (j % 2) * kBk * kStride;
      T::load(t, vt, v_head + j0 * a.v.row, a.v.row, kBk, valid);
      mma::cp_async_commit(t);
      mma::cp_async_wait<1>(t);  // Q and K_j are in; V_j may still be on its way
      t.sync();
      // S = Q K_j^T (16 kMT rows x kBk keys a warp).
      FragC s[kMT][kBk / 8];
      CLUSTR_UNROLL
      for (int mt = 0; mt < kMT; ++mt)
        CLUSTR_UNROLL
        for (int n = 0; n < kBk / 8; ++n) zero(s[mt][n]);
      CLUSTR_UNROLL
      for (int kk = 0; kk < kSteps; ++kk) {
        typename Math::A qa[kMT];
        CLUSTR_UNROLL
        for (int mt = 0; mt < kMT; ++mt)
          qa[mt] = Math::a(t, sQ, kStride, (static_cast<int>(w) * kMT + mt) * 16, Math::kK * kk);
        CLUSTR_UNROLL
        for (int np = 0; np < kBk / 16; ++np) {
          typename Math::B b0, b1;
          Math::b_rows(t, b0, b1, kt, kStride, 16 * np, Math::kK * kk);
          CLUSTR_UNROLL
          for (int mt = 0; mt < kMT; ++mt) {
            Math::mma(t, s[mt][2 * np], qa[mt], b0);
            Math::mma(t, s[mt][2 * np + 1], qa[mt], b1);
          }
        }
      }
      // K_{j+1} into the other buffer (read by S_{j-1}, which every warp finished before the
      // barrier above); an empty group when this is the last tile.
      if (j + 1 < tiles)
        T::load(t, sK + ((j + 1) % 2) * kBk * kStride, k_head + (j0 + kBk) * a.k.row, a.k.row,
                kBk, static_cast<int>(min64(kBk, keys - j0 - kBk)));
      mma::cp_async_commit(t);
      // Online softmax over this tile, each of the thread's rows g and g + 8 of each m-tile.
      CLUSTR_UNROLL
      for (int mt = 0; mt < kMT; ++mt)
        CLUSTR_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int r = (static_cast<int>(w) * kMT + mt) * 16 + static_cast<int>(g) + 8 * hf;
          const int64_t i = i0 + r;
          const int64_t seen = r < live ? math::attention_keys_seen(i, sq.length, a.causal) : 0;
          float top = -INFINITY;
          CLUSTR_UNROLL
          for (int n = 0; n < kBk / 8; ++n)
            CLUSTR_UNROLL
            for (int e = 0; e < 2; ++e) {
              const int64_t col = j0 + 8 * n + 2 * c + e;
              float& x = s[mt][n].x[2 * hf + e];
              x = col < seen ? x * a.scale_log2 : -INFINITY;
              top = top > x ? top : x;
            }
          top = math::Maximum{}(top, t.shfl_xor(top, 1));
          top = math::Maximum{}(top, t.shfl_xor(top, 2));
          const float m_new = m[mt][hf] > top ? m[mt][hf] : top;
          const float base = m_new == -INFINITY ? 0.0f : m_new;  // no key yet: every p is 0
          const float alpha = exp2_fast(m[mt][hf] - base);
          m[mt][hf] = m_new;
          float sum = 0.0f;
          CLUSTR_UNROLL
          for (int n = 0; n < kBk / 8; ++n) {
            float& x0 = s[mt][n].x[2 * hf];
            float& x1 = s[mt][n].x[2 * hf + 1];
            x0 = exp2_fast(x0 - base);
            x1 = exp2_fast(x1 - base);
            sum += x0 + x1;
            if (a.drop.on())
              drop_pair(a.drop, math::attention_dropout_index(bh, a.N, i, a.S, j0 + 8 * n + 2 * c),
                        x0, x1);
          }
          lsum[mt][hf] = lsum[mt][hf] * alpha + sum;
          CLUSTR_UNROLL
          for (int n = 0; n < D / 8; ++n) {
            acc[mt][n].x[2 * hf] *= alpha;
            acc[mt][n].x[2 * hf + 1] *= alpha;
          }
        }
      mma::cp_async_wait<1>(t);  // V_j is in; K_{j+1} may still be on its way
      t.sync();
      // O += P V_j.
      CLUSTR_UNROLL
      for (int kk = 0; kk < kBk / Math::kK; ++kk) {
        typename Math::A p[kMT];
        CLUSTR_UNROLL
        for (int mt = 0; mt < kMT; ++mt) p[mt] = Math::c_to_a(s[mt], kk);
        CLUSTR_UNROLL
        for (int np = 0; np < D / 16; ++np) {
          typename Math::B b0, b1;
          Math::b_cols(t, b0, b1, vt, kStride, Math::kK * kk, 16 * np);
          CLUSTR_UNROLL
          for (int mt = 0; mt < kMT; ++mt) {
            Math::mma(t, acc[mt][2 * np], p[mt], b0);
            Math::mma(t, acc[mt][2 * np + 1], p[mt], b1);
          }
        }
      }
    }
    mma::cp_async_wait<0>(t);
    // out = O / l, lse = (m + log2 l) ln 2; a row with l = 0 saw no key: 0 and -inf.
    CLUSTR_UNROLL
    for (int mt = 0; mt < kMT; ++mt)
      CLUSTR_UNROLL
      for (int hf = 0; hf < 2; ++hf) {
        float total = lsum[mt][hf];
        total += t.shfl_xor(total, 1);
        total += t.shfl_xor(total, 2);
        const int r = (static_cast<int>(w) * kMT + mt) * 16 + static_cast<int>(g) + 8 * hf;
        if (r >= rows) continue;
        const int64_t i = i0 + r;
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        float* row = out_head + i * out.row;
        CLUSTR_UNROLL
        for (int n = 0; n < D / 8; ++n) {
          row[8 * n + 2 * c] = acc[mt][n].x[2 * hf] * inv;
          row[8 * n + 2 * c + 1] = acc[mt][n].x[2 * hf + 1] * inv;
        }
        if (c == 0) lse_head[i] = total > 0.0f ? m[mt][hf] * kLn2 + logf(total) : -INFINITY;
      }
  }
};

}  // namespace clustr::cuda::flash_kernels
