// The backward kernel of full attention on tensor cores (flash.cu describes it): key blocks for
// dK and dV, query blocks for dQ, in one grid. Included only by flash.cu.
#pragma once

#include "layers/attention/cuda/flash_kernels.h"

namespace clustr::cuda::flash_kernels {

template <class Math, int D>
struct FlashBackward {
  static constexpr bool kUsesBarrier = true;
  using T = Tile<Math, D>;
  using Elem = typename Math::Elem;
  static constexpr int kSteps = D / Math::kK, kStride = T::kStride;
  static constexpr int kKeys = 64, kRows = 64, kBqt = Shape<Math, D>::kBt, kBkt = kBqt;
  static constexpr size_t kKeyShared =
      T::bytes(2 * kKeys + 4 * kBqt) + 4 * kBqt * sizeof(float);  // K, V, (Q, dO) x 2, lse, D
  static constexpr size_t kRowShared = T::bytes(2 * kRows + 4 * kBkt);  // Q, dO, (K, V) x 2
  static constexpr size_t kShared = kKeyShared > kRowShared ? kKeyShared : kRowShared;

  Operands<Elem> a;
  const float* lse;    // (B, H, N)
  const float* delta;  // D_i (B, H, N)
  Heads<float> dq, dk, dv;
  float temperature;
  int64_t key_blocks, row_blocks;  // per (b, h)

  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t per_head = key_blocks + row_blocks;
    const int64_t bh = t.block_idx().x / per_head, r = t.block_idx().x % per_head;
    if (r < key_blocks)
      key_block(t, bh, r * kKeys);
    else
      row_block(t, bh, (r - key_blocks) * kRows);
  }

  // dK and dV of keys [j0, j0 + 64).
  CLUSTR_DEVICE void key_block(const Thread& t, int64_t bh, int64_t j0) const {
    const int64_t b = bh / a.H, h = bh % a.H;
    const Sequence sq = sequence_of(a.lengths, b, a.N, a.S);
    const int key_rows = static_cast<int>(min64(kKeys, a.S - j0));
    const unsigned tid = t.thread_idx().x, l = mma::lane(t), w = mma::warp(t);
    const unsigned g = l / 4, c = l % 4;
    float* dk_head = dk.at(b, h);
    float* dv_head = dv.at(b, h);
    // Query tiles [first, last) can see these keys: from the tile of query j0 when causal.
    const int64_t first = a.causal ? j0 / kBqt : 0;
    const int64_t last = (sq.live + kBqt - 1) / kBqt;
    if (j0 >= sq.length || first >= last) {  // no query sees them: no gradient
      for (int e = static_cast<int>(tid); e < key_rows * D; e += kThreads) {
        dk_head[(j0 + e / D) * dk.row + e % D] = 0.0f;
        dv_head[(j0 + e / D) * dv.row + e % D] = 0.0f;
      }
      return;
    }
    Elem* sK = t.shared<Elem>();
    Elem* sV = sK + kKeys * kStride;
    Elem* sQ = sV + kKeys * kStride;    // two buffers of kBqt rows
    Elem* sO = sQ + 2 * kBqt * kStride;  // dO, two buffers
    float* sL = reinterpret_cast<float*>(sO + 2 * kBqt * kStride);  // lse log2(e), two
    float* sD = sL + 2 * kBqt;                                       // D, two
    const int valid_keys = static_cast<int>(min64(kKeys, sq.length - j0));
    T::load(t, sK, a.k.at(b, h) + j0 * a.k.row, a.k.row, kKeys, valid_keys);
    T::load(t, sV, a.v.at(b, h) + j0 * a.v.row, a.v.row, kKeys, valid_keys);
    // Query tile qt into buffer `buf`: rows, their lse (in base 2) and D; rows past live are
    // masked below, so what they hold does not matter (zeros).
    auto issue = [&](int64_t qt, int buf) {
      const int64_t i0 = qt * kBqt;
      const int n = static_cast<int>(min64(kBqt, a.N - i0));
      T::load(t, sQ + buf * kBqt * kStride, a.q.at(b, h) + i0 * a.q.row, a.q.row, kBqt, n);
      T::load(t, sO + buf * kBqt * kStride, a.o.at(b, h) + i0 * a.o.row, a.o.row, kBqt, n);
      for (int e = static_cast<int>(tid); e < kBqt; e += kThreads) {
        sL[buf * kBqt + e] = e < n ? lse[bh * a.N + i0 + e] * kLog2e : 0.0f;
        sD[buf * kBqt + e] = e < n ? delta[bh * a.N + i0 + e] : 0.0f;
      }
      mma::cp_async_commit(t);
    };
    issue(first, 0);
    FragC dk_acc[D / 8], dv_acc[D / 8];
    CLUSTR_UNROLL
    for (int n = 0; n < D / 8; ++n) {
      zero(dk_acc[n]);
      zero(dv_acc[n]);
    }
    const int r0 = 16 * static_cast<int>(w);  // the warp's keys in the block
    for (int64_t qt = first; qt < last; ++qt) {
      const int buf = static_cast<int>((qt - first) % 2);
      if (qt + 1 < last)
        issue(qt + 1, 1 - buf);
      else
        mma::cp_async_commit(t);
      mma::cp_async_wait<1>(t);
      t.sync();
      const Elem* qtile = sQ + buf * kBqt * kStride;
      const Elem* otile = sO + buf * kBqt * kStride;
      // S^T = K Q_i^T and dP^T = V dO_i^T (16 keys x kBqt queries a warp).
      FragC st[kBqt / 8], dpt[kBqt / 8];
      CLUSTR_UNROLL
      for (int n = 0; n < kBqt / 8; ++n) {
        zero(st[n]);
        zero(dpt[n]);
      }
      CLUSTR_UNROLL
      for (int kk = 0; kk < kSteps; ++kk) {
        const typename Math::A ka = Math::a(t, sK, kStride, r0, Math::kK * kk);
        const typename Math::A va = Math::a(t, sV, kStride, r0, Math::kK * kk);
        CLUSTR_UNROLL
        for (int np = 0; np < kBqt / 16; ++np) {
          typename Math::B b0, b1;
          Math::b_rows(t, b0, b1, qtile, kStride, 16 * np, Math::kK * kk);
          Math::mma(t, st[2 * np], ka, b0);
          Math::mma(t, st[2 * np + 1], ka, b1);
          Math::b_rows(t, b0, b1, otile, kStride, 16 * np, Math::kK * kk);
          Math::mma(t, dpt[2 * np], va, b0);
          Math::mma(t, dpt[2 * np + 1], va, b1);
        }
      }
      // P^T, and dS^T = P^T (dP^T keep / (1 - p) - D); st becomes P^T keep / (1 - p).
      const int64_t i0 = qt * kBqt;
      CLUSTR_UNROLL
      for (int n = 0; n < kBqt / 8; ++n)
        CLUSTR_UNROLL
        for (int x = 0; x < 4; ++x) {
          const int64_t key = j0 + r0 + g + 8 * (x / 2);
          const int col = 8 * n + 2 * static_cast<int>(c) + x % 2;
          const int64_t i = i0 + col;
          const bool seen = i < sq.live && key < math::attention_keys_seen(i, sq.length, a.causal);
          const float p =
              seen ? exp2_fast(st[n].x[x] * a.scale_log2 - sL[buf * kBqt + col]) : 0.0f;
          float pd = p, dp = dpt[n].x[x];
          if (a.drop.on()) {
            const uint32_t bits =
                dropout_word(a.drop, math::attention_dropout_index(bh, a.N, i, a.S, key));
            pd = math::dropout_value(p, bits, a.drop.p, a.drop.scale);
            dp = math::dropout_value(dp, bits, a.drop.p, a.drop.scale);
          }
          st[n].x[x] = pd;
          dpt[n].x[x] = math::softmax_dx(p, dp, sD[buf * kBqt + col]);
        }
      // dV += Pd^T dO_i, dK += dS^T Q_i.
      CLUSTR_UNROLL
      for (int kk = 0; kk < kBqt / Math::kK; ++kk) {
        const typename Math::A pa = Math::c_to_a(st, kk), da = Math::c_to_a(dpt, kk);
        CLUSTR_UNROLL
        for (int np = 0; np < D / 16; ++np) {
          typename Math::B b0, b1;
          Math::b_cols(t, b0, b1, otile, kStride, Math::kK * kk, 16 * np);
          Math::mma(t, dv_acc[2 * np], pa, b0);
          Math::mma(t, dv_acc[2 * np + 1], pa, b1);
          Math::b_cols(t, b0, b1, qtile, kStride, Math::kK * kk, 16 * np);
          Math::mma(t, dk_acc[2 * np], da, b0);
          Math::mma(t, dk_acc[2 * np + 1], da, b1);
        }
      }
      t.sync();  // every warp is done with this buffer before the next round refills it
    }
    mma::cp_async_wait<0>(t);
    CLUSTR_UNROLL
    for (int x = 0; x < 4; x += 2) {
      const int key = r0 + static_cast<int>(g) + 8 * (x / 2);
      if (key >= key_rows) continue;
      float* krow = dk_head + (j0 + key) * dk.row;
      float* vrow = dv_head + (j0 + key) * dv.row;
      CLUSTR_UNROLL
      for (int n = 0; n < D / 8; ++n) {
        krow[8 * n + 2 * c] = dk_acc[n].x[x] * temperature;
        krow[8 * n + 2 * c + 1] = dk_acc[n].x[x + 1] * temperature;
        vrow[8 * n + 2 * c] = dv_acc[n].x[x];
        vrow[8 * n + 2 * c + 1] = dv_acc[n].x[x + 1];
      }
    }
  }

  // dQ of query rows [i0, i0 + 64).
  CLUSTR_DEVICE void row_block(const Thread& t, int64_t bh, int64_t i0) const {
    const int64_t b = bh / a.H, h = bh % a.H;
    const Sequence sq = sequence_of(a.lengths, b, a.N, a.S);
    const int rows = static_cast<int>(min64(kRows, a.N - i0));
    const int live = static_cast<int>(max64(0, min64(sq.live - i0, rows)));
    const unsigned tid = t.thread_idx().x, l = mma::lane(t), w = mma::warp(t);
    const unsigned g = l / 4, c = l % 4;
    float* dq_head = dq.at(b, h);
    if (live == 0) {
      for (int e = static_cast<int>(tid); e < rows * D; e += kThreads)
        dq_head[(i0 + e / D) * dq.row + e % D] = 0.0f;
      return;
    }
    const int64_t keys = math::attention_keys_seen(i0 + live - 1, sq.length, a.causal);
    const int tiles = static_cast<int>((keys + kBkt - 1) / kBkt);
    Elem* sQ = t.shared<Elem>();
    Elem* sO = sQ + kRows * kStride;
    Elem* sK = sO + kRows * kStride;  // two buffers of kBkt rows
    Elem* sV = sK + 2 * kBkt * kStride;
    const Elem* k_head = a.k.at(b, h);
    const Elem* v_head = a.v.at(b, h);
    T::load(t, sQ, a.q.at(b, h) + i0 * a.q.row, a.q.row, kRows, rows);
    T::load(t, sO, a.o.at(b, h) + i0 * a.o.row, a.o.row, kRows, rows);
    auto issue = [&](int jt, int buf) {
      const int64_t j0 = int64_t(jt) * kBkt;
      const int valid = static_cast<int>(min64(kBkt, keys - j0));
      T::load(t, sK + buf * kBkt * kStride, k_head + j0 * a.k.row, a.k.row, kBkt, valid);
      T::load(t, sV + buf * kBkt * kStride, v_head + j0 * a.v.row, a.v.row, kBkt, valid);
      mma::cp_async_commit(t);
    };
    issue(0, 0);
    // The thread's rows g and g + 8 of the warp's 16: which keys they see, lse and D.
    const int r0 = 16 * static_cast<int>(w);
    int64_t seen[2];
    float lse2[2], dd[2];
    CLUSTR_UNROLL
    for (int hf = 0; hf < 2; ++hf) {
      const int r = r0 + static_cast<int>(g) + 8 * hf;
      const int64_t i = i0 + r;
      seen[hf] = r < live ? math::attention_keys_seen(i, sq.length, a.causal) : 0;
      lse2[hf] = r < live ? lse[bh * a.N + i] * kLog2e : 0.0f;
      dd[hf] = r < live ? delta[bh * a.N + i] : 0.0f;
    }
    FragC acc[D / 8];
    CLUSTR_UNROLL
    for (int n = 0; n < D / 8; ++n) zero(acc[n]);
    for (int jt = 0; jt < tiles; ++jt) {
      const int buf = jt % 2;
      if (jt + 1 < tiles)
        issue(jt + 1, 1 - buf);
      else
        mma::cp_async_commit(t);
      mma::cp_async_wait<1>(t);
      t.sync();
      const Elem* ktile = sK + buf * kBkt * kStride;
      const Elem* vtile = sV + buf * kBkt * kStride;
      FragC s[kBkt / 8], dp[kBkt / 8];
      CLUSTR_UNROLL
      for (int n = 0; n < kBkt / 8; ++n) {
        zero(s[n]);
        zero(dp[n]);
      }
      CLUSTR_UNROLL
      for (int kk = 0; kk < kSteps; ++kk) {
        const typename Math::A qa = Math::a(t, sQ, kStride, r0, Math::kK * kk);
        const typename Math::A oa = Math::a(t, sO, kStride, r0, Math::kK * kk);
        CLUSTR_UNROLL
        for (int np = 0; np < kBkt / 16; ++np) {
          typename Math::B b0, b1;
          Math::b_rows(t, b0, b1, ktile, kStride, 16 * np, Math::kK * kk);
          Math::mma(t, s[2 * np], qa, b0);
          Math::mma(t, s[2 * np + 1], qa, b1);
          Math::b_rows(t, b0, b1, vtile, kStride, 16 * np, Math::kK * kk);
          Math::mma(t, dp[2 * np], oa, b0);
          Math::mma(t, dp[2 * np + 1], oa, b1);
        }
      }
      // dS = P (dP keep / (1 - p) - D), into s.
      const int64_t j0 = int64_t(jt) * kBkt;
      CLUSTR_UNROLL
      for (int n = 0; n < kBkt / 8; ++n)
        CLUSTR_UNROLL
        for (int hf = 0; hf < 2; ++hf) {
          const int64_t key = j0 + 8 * n + 2 * c;
          float p[2], d2[2];
          CLUSTR_UNROLL
          for (int e = 0; e < 2; ++e) {
            p[e] = key + e < seen[hf] ? exp2_fast(s[n].x[2 * hf + e] * a.scale_log2 - lse2[hf])
                                      : 0.0f;
            d2[e] = dp[n].x[2 * hf + e];
          }
          if (a.drop.on()) {
            const int64_t i = i0 + r0 + g + 8 * hf;
            drop_pair(a.drop, math::attention_dropout_index(bh, a.N, i, a.S, key), d2[0], d2[1]);
          }
          CLUSTR_UNROLL
          for (int e = 0; e < 2; ++e) s[n].x[2 * hf + e] = math::softmax_dx(p[e], d2[e], dd[hf]);
        }
      // dQ += dS K_j.
      CLUSTR_UNROLL
      for (int kk = 0; kk < kBkt / Math::kK; ++kk) {
        const typename Math::A da = Math::c_to_a(s, kk);
        CLUSTR_UNROLL
        for (int np = 0; np < D / 16; ++np) {
          typename Math::B b0, b1;
          Math::b_cols(t, b0, b1, ktile, kStride, Math::kK * kk, 16 * np);
          Math::mma(t, acc[2 * np], da, b0);
          Math::mma(t, acc[2 * np + 1], da, b1);
        }
      }
      t.sync();  // every warp is done with this buffer before the next round refills it
    }
    mma::cp_async_wait<0>(t);
    CLUSTR_UNROLL
    for (int hf = 0; hf < 2; ++hf) {
      const int r = r0 + static_cast<int>(g) + 8 * hf;
      if (r >= rows) continue;
      float* row = dq_head + (i0 + r) * dq.row;
      CLUSTR_UNROLL
      for (int n = 0; n < D / 8; ++n) {
        row[8 * n + 2 * c] = acc[n].x[2 * hf] * temperature;
        row[8 * n + 2 * c + 1] = acc[n].x[2 * hf + 1] * temperature;
      }
    }
  }
};

}  // namespace clustr::cuda::flash_kernels
