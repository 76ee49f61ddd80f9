// CUDA kernels of improved clustered attention for a given clustering (cuda/improved_clustered.h
// gives the contract, improved_clustered.h the semantics, improved_clustered_cpu.cpp the
// backward's derivation). Written against core/cuda/kernel.h, so the same code runs on a GPU and in device
// emulation.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters; L the
// valid keys of a sequence; kk = min(k, L) the keys of a cluster's top-k set T_j (0 for an empty
// cluster), kw = min(k, S) the saved width; t the temperature.
//   Scratch: rc, dvc (B, H, C, M); acr, ds (B, H, C, S); dqc (B, H, C, E); pw, gw, pv (B, H, N,
//   kw): a member query's exact weights P_i, G_i / dZ_i and the dropped P_i; rowdot (B, H, N).
//
// How. The centroid part reuses clustered attention's kernels (cuda/clustered_kernels.h): the
// member sums in query order, the masked softmax rows of Ac (eq. 3-5), their backward, and the
// per-sequence batched GEMMs sized by L, so masked keys never enter a product. Own kernels:
//  - eq. 9-10, one CUDA block per row of Ac: a radix select over the order-preserving bits of
//    the weights finds the kk-th largest value (four passes of 256-bin histograms), then the
//    threads split
//    the row into spans and write, in key order, the keys above it and the lowest-indexed keys
//    equal to it (offsets from a scan of the spans' counts), and one thread sums m_j over them
//    in ascending key order, as the CPU does: given the same Ac, T_j and m_j are the CPU's bit
//    for bit (the order "weight descending, then index ascending" is total).
//  - eq. 11, second term: Ac with T_j zeroed (and the cluster's dropout mask) times V, once per
//    cluster, by GEMM.
//  - eq. 11, first term, one CUDA block per query: the kk scores, their softmax, the query's
//    dropout mask, m_j P_i V_T plus the cluster's remainder. Backward recomputes P_i the same way
//    and forms G_i = dO_i V_T^T, dZ_i = m_j P_i (G_i - P_i . G_i) and dq_i = t dZ_i K_T.
//  - dm_j (eq. 10's mass, in backward), one block per cluster: the members' P_i . G_i summed in
//    query order, written onto the T_j columns of dAc before the softmax backward of eq. 3.
//  - dK_T, dV_T, one CUDA block per key l: the clusters whose T_j holds l in cluster order, each
//    cluster's members in query order, the CPU's order of additions. Several clusters' top-k
//    sets share keys, and gathering per key instead of scattering per cluster leaves each
//    element of dK and dV to one thread: no float atomics, results independent of timing.
#include "layers/attention/cuda/improved_clustered.h"

#include <algorithm>

#include "layers/attention/cuda/clustered_kernels.h"

namespace clustr::cuda {

using namespace clustered_kernels;

namespace {

// The first query-mask element of query i of pair bh (improved_clustered.h): after the B H C S
// elements of the clusters' masks, kw per query.
CLUSTR_DEVICE uint64_t member_mask(int64_t BHCS, int64_t kw, int64_t row) {
  return static_cast<uint64_t>(BHCS + row * kw);
}

// The number of keys in a top-k row T (kw): its entries before the first -1.
CLUSTR_DEVICE int64_t topk_size(const int32_t* T, int64_t kw) {
  int64_t kk = 0;
  while (kk < kw && T[kk] >= 0) ++kk;
  return kk;
}

// eq. 9-10, one CUDA block per row (pair bh, cluster j) of ac (B, H, C, S): tk (kw) = the kk
// valid keys with the largest weights (ties to the lower key index; weights ranked by
// math::order_key, as on the CPU) in ascending key order, -1 padded; mass = their weights
// summed in that order (0 for an empty set).
struct TopkKernel {
  static constexpr bool kUsesBarrier = true;
  const float* ac;
  const int32_t* count;
  const int32_t* lengths;
  int32_t* tk;
  float* mass;
  int64_t H, C, S, k, kw;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t row = t.block_idx().x, bh = row / C;
    const int64_t L = keys_of(lengths, bh, H, S);
    const int64_t kk = count[row] == 0 ? 0 : (k < L ? k : L);
    const float* w = ac + row * S;
    // The kk-th largest key, 8 bits at a time from the top: among the keys that share the bits
    // found so far, a histogram of the next 8 (shared integer atomics: exact in any order), then
    // the largest digit that leaves >= kk keys at or above it; `above` counts the keys already
    // known to be larger. Every thread reaches the same bar.
    uint32_t bar = 0;
    int64_t take_equal = L;  // kk == L: every valid key, whatever its weight
    if (kk > 0 && kk < L) {
      int* hist = t.shared<int>() + nt;  // 256 bins, after block_exclusive_sum's scratch
      int64_t* chosen = reinterpret_cast<int64_t*>(hist + 256);  // the digit's bar and above
      int64_t above = 0;
      for (int shift = 24; shift >= 0; shift -= 8) {
        for (unsigned x = tid; x < 256; x += nt) hist[x] = 0;
        t.sync();
        for (int64_t c = tid; c < L; c += nt) {
          const uint32_t key = math::order_key(w[c]);
          if (shift == 24 || (key ^ bar) >> (shift + 8) == 0)
            atomic_add(hist + ((key >> shift) & 255u), 1);
        }
        t.sync();
        if (tid == 0) {
          int64_t at_or_above = above;
          int d = 255;
          for (; d > 0 && at_or_above + hist[d] < kk; --d) at_or_above += hist[d];
          chosen[0] = static_cast<int64_t>(bar | (static_cast<uint32_t>(d) << shift));
          chosen[1] = at_or_above;  // the keys above the digit: above it, or above the prefix
        }
        t.sync();
        bar = static_cast<uint32_t>(chosen[0]);
        above = chosen[1];
        t.sync();  // chosen read before the next pass's thread 0 writes it
      }
      take_equal = kk - above;
    }
    // The write-out, in key order: each thread takes a contiguous span of the row, counts what
    // it takes (the keys above the bar, and equal ones while the row's first take_equal last),
    // and writes them at the offset that the threads before it leave.
    int* scratch = t.shared<int>();  // (nt), as block_reduce's above
    const auto [c0, c1] = block_span(t, L);
    int n_above = 0, n_equal = 0;
    if (kk > 0)
      for (int64_t c = c0; c < c1; ++c) {
        const uint32_t key = math::order_key(w[c]);
        n_above += kk == L || key > bar;
        n_equal += kk != L && key == bar;
      }
    // The equal keys this span may still take, after those of the spans before it.
    int64_t quota = take_equal - block_exclusive_sum(t, n_equal, scratch);
    const int n_taken =
        n_above + static_cast<int>(quota < 0 ? 0 : quota < n_equal ? quota : n_equal);
    const int64_t first = block_exclusive_sum(t, n_taken, scratch);
    int32_t* T = tk + row * kw;
    int64_t at = first;
    if (kk > 0)
      for (int64_t c = c0; c < c1; ++c) {
        const uint32_t key = math::order_key(w[c]);
        const bool take = kk == L || key > bar || (key == bar && quota-- > 0);
        if (take) T[at++] = static_cast<int32_t>(c);
      }
    t.sync();  // T whole before thread 0 sums it
    if (tid != 0) return;  // no barrier below
    for (int64_t c = kk; c < kw; ++c) T[c] = -1;
    float m = 0.0f;  // in ascending key order, as the CPU sums it
    for (int64_t x = 0; x < kk; ++x) m += w[T[x]];
    mass[row] = m;
  }
};

// One CUDA block per row (pair bh, cluster j): acr = Ac with the T_j columns zeroed, times the
// cluster's dropout mask, on the first L columns, and 0 on the others; with g (the backward's
// dAc, or null) masked by the same words.
struct RemainderKernel {
  static constexpr bool kUsesBarrier = true;
  const float* ac;
  const int32_t* tk;
  const int32_t* lengths;
  float* acr;
  float* g;
  int64_t H, C, S, kw;
  Dropout drop;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t row = t.block_idx().x, bh = row / C;
    const int64_t L = keys_of(lengths, bh, H, S);
    const float* w = ac + row * S;
    float* y = acr + row * S;
    if (drop.on()) {
      float* gr = g ? g + row * S : nullptr;
      const float p = drop.p, scale = drop.scale;
      for_each_word(t, drop, static_cast<uint64_t>(row * S), L, [&](int64_t c, uint32_t word) {
        y[c] = math::dropout_value(w[c], word, p, scale);
        if (gr) gr[c] = math::dropout_value(gr[c], word, p, scale);
      });
    } else {
      for (int64_t c = tid; c < L; c += nt) y[c] = w[c];
    }
    // Masked keys: zeros, which the products read when their sizes do not stop at L (lengths on
    // the device only, as in a CUDA graph's capture).
    for (int64_t c = L + tid; c < S; c += nt) y[c] = 0.0f;
    t.sync();  // the T_j columns fall to other threads than the copy's
    const int32_t* T = tk + row * kw;
    for (int64_t c = tid; c < kw; c += nt)
      if (T[c] >= 0) y[T[c]] = 0.0f;
  }
};

// ---- the members' exact part (eq. 11's first term), one block of kWarps warps per cluster ----
// Each warp takes the cluster's members in turn (warp w the members w, w + kWarps, ... in query
// order); a member's kk scores are a lane per key, their softmax a warp's reductions, and its
// output row a lane per column. The cluster's rows of K and V (its top-k set T_j) are read from
// shared memory when they fit (staged once for all members), else in place through T_j.

constexpr int kMemberWarps = 4;
constexpr unsigned kMemberThreads = 32 * kMemberWarps;
constexpr size_t kStageBytes = 32 * 1024;  // the most shared memory the staged rows take

struct MaxFloat {
  CLUSTR_HD float operator()(float a, float b) const { return math::Maximum{}(a, b); }
};

// Whether a call's top-k rows of K and V are staged in shared memory, and its bytes: rows of
// E + 1 and M + 1 floats (lanes reading 32 rows at one column hit 32 different banks).
bool staged(int64_t kw, int64_t E, int64_t M) {
  return static_cast<size_t>(kw * (E + 1 + M + 1)) * sizeof(float) <= kStageBytes;
}
size_t stage_bytes(int64_t kw, int64_t E, int64_t M) {
  return staged(kw, E, M) ? static_cast<size_t>(kw * (E + 1 + M + 1)) * sizeof(float) : 0;
}

// The rows of K and V that a cluster's members read: row c of T_j, staged or in place.
struct TopkRows {
  const float *k, *v;  // the staged rows, or the pair's K and V
  int64_t k_stride, v_stride;
  const int32_t* T;
  bool staged;
  CLUSTR_DEVICE const float* krow(int64_t c) const {
    return k + (staged ? c : static_cast<int64_t>(T[c])) * k_stride;
  }
  CLUSTR_DEVICE const float* vrow(int64_t c) const {
    return v + (staged ? c : static_cast<int64_t>(T[c])) * v_stride;
  }
};

// The cluster's top-k rows (kk of them), copied into shared memory when `stage` (every thread
// of the block takes part; ends with a barrier), else read in place.
CLUSTR_DEVICE TopkRows topk_rows(const Thread& t, bool stage, const float* K, const float* V,
                                 const int32_t* T, int64_t kk, int64_t E, int64_t M) {
  if (!stage) return {K, V, E, M, T, false};
  float* sk = t.shared<float>();
  float* sv = sk + kk * (E + 1);
  for (int64_t x = t.thread_idx().x; x < kk * E; x += t.block_dim().x)
    sk[x / E * (E + 1) + x % E] = K[static_cast<int64_t>(T[x / E]) * E + x % E];
  for (int64_t x = t.thread_idx().x; x < kk * M; x += t.block_dim().x)
    sv[x / M * (M + 1) + x % M] = V[static_cast<int64_t>(T[x / M]) * M + x % M];
  t.sync();
  return {sk, sv, E + 1, M + 1, T, true};
}

// P (kk, a row of global scratch) = softmax over c of t q . krow(c) (the exact member weights
// on T_j, eq. 11), kk >= 1, computed by one warp (a lane per key); the warp's lanes see P after
// the closing t.sync_warp().
CLUSTR_DEVICE void member_weights(const Thread& t, const float* q, const TopkRows& rows,
                                  int64_t kk, int64_t E, float temperature, float* P) {
  const unsigned lane = t.thread_idx().x % 32;
  float mx = -INFINITY;
  for (int64_t c = lane; c < kk; c += 32) {
    const float* kr = rows.krow(c);
    float dot = 0.0f;
    for (int64_t e = 0; e < E; ++e) dot += q[e] * kr[e];
    P[c] = temperature * dot;
    mx = math::Maximum{}(mx, P[c]);
  }
  mx = warp_reduce(t, mx, MaxFloat{});
  double acc = 0.0;
  for (int64_t c = lane; c < kk; c += 32) {
    P[c] = math::exp(P[c] - mx);
    acc += P[c];
  }
  const float inv = 1.0f / static_cast<float>(warp_reduce(t, acc, AddDouble{}));
  for (int64_t c = lane; c < kk; c += 32) P[c] *= inv;
}

// The Philox word of element x of a member's dropout mask (improved_clustered.h).
CLUSTR_DEVICE uint32_t mask_word(const Dropout& d, uint64_t x) {
  const Philox4 w = philox4x32(d.seed, d.offset.get() + x / 4);
  const uint64_t k = x % 4;
  return k == 0 ? w.v[0] : k == 1 ? w.v[1] : k == 2 ? w.v[2] : w.v[3];
}

// Rows of padded queries (assignment -1), zeroed by the first cluster's block of each pair
// (no cluster holds them): y (B, H, N, w) and, when not null, rowdot (B, H, N).
CLUSTR_DEVICE void zero_padded(const Thread& t, const int32_t* assignment, int64_t bh, int64_t N,
                               float* y, int64_t w, float* rowdot) {
  for (int64_t x = t.thread_idx().x; x < N * w; x += t.block_dim().x) {
    const int64_t row = bh * N + x / w;
    if (assignment[row] >= 0) continue;
    y[row * w + x % w] = 0.0f;
    if (rowdot && x % w == 0) rowdot[row] = 0.0f;
  }
}

// eq. 11 for the members of one cluster, one block per (pair bh, cluster j) = block bh C + j:
// out_i = m_j (P_i D_i / (1 - p)) V_T + rc_j; members of a sequence without keys get 0 (and
// padded queries, by the pair's first block). pw (kw) of each member's row holds P_i.
struct MemberForwardKernel {
  static constexpr bool kUsesBarrier = true;
  const float *Q, *K, *V, *rc, *mass;
  const int32_t *assignment, *count, *start, *order, *tk, *lengths;
  float* pw;
  float* out;
  int64_t H, N, S, E, M, C, kw, BHCS;
  float temperature;
  bool stage;
  Dropout drop;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned lane = t.thread_idx().x % 32, w = t.thread_idx().x / 32;
    const int64_t cl = t.block_idx().x, bh = cl / C, j = cl % C;
    if (j == 0) zero_padded(t, assignment, bh, N, out, M, nullptr);
    const int64_t n = count[cl], L = keys_of(lengths, bh, H, S);
    const int32_t* members = order + bh * N + start[bh * (C + 1) + j];
    if (n == 0) return;  // the same for the whole block
    if (L == 0) {
      for (int64_t x = t.thread_idx().x; x < n * M; x += t.block_dim().x)
        out[(bh * N + members[x / M]) * M + x % M] = 0.0f;
      return;
    }
    const int32_t* T = tk + cl * kw;
    const int64_t kk = topk_size(T, kw);
    const TopkRows rows = topk_rows(t, stage, K + bh * S * E, V + bh * S * M, T, kk, E, M);
    const float m = mass[cl];
    for (int64_t r = w; r < n; r += kMemberWarps) {
      const int64_t row = bh * N + members[r];
      float* P = pw + row * kw;
      member_weights(t, Q + row * E, rows, kk, E, temperature, P);
      if (drop.on())
        for (int64_t c = lane; c < kk; c += 32)
          P[c] = math::dropout_value(P[c], mask_word(drop, member_mask(BHCS, kw, row) + c),
                                     drop.p, drop.scale);
      t.sync_warp();  // P whole before the lanes read it by column
      float* o = out + row * M;
      for (int64_t e = lane; e < M; e += 32) {
        float acc = 0.0f;
        for (int64_t c = 0; c < kk; ++c) acc += P[c] * rows.vrow(c)[e];
        o[e] = m * acc + rc[cl * M + e];
      }
    }
  }
};

// The exact part of eq. 11's backward for the members of one cluster, one block per (pair bh,
// cluster j): per member (a warp each) P_i again, G_i[c] = dO_i . V[T[c]], with dropout
// pv = P D r and G = G D r, then rowdot_i = P_i . G_i, dZ_i = m_j P_i (G_i - rowdot_i) (in gw)
// and dQ_i = t dZ_i K_T (=); 0 rows for members of a sequence without keys (and padded queries,
// by the pair's first block). Then, the members done, the cluster's share of dK_T and dV_T:
// dkt (B, H, C, kw, E) = t sum_{i in j} dZ_i[c] q_i and dvt (B, H, C, kw, M) = m_j sum_{i in j}
// pv_i[c] dO_i, the members in query order (a thread per element), which KeyGradKernel adds up
// per key.
struct MemberBackwardKernel {
  static constexpr bool kUsesBarrier = true;
  const float *Q, *K, *V, *dout, *mass;
  const int32_t *assignment, *count, *start, *order, *tk, *lengths;
  float *pw, *gw, *pv, *rowdot, *dQ, *dkt, *dvt;
  int64_t H, N, S, E, M, C, kw, BHCS;
  float temperature;
  bool stage;
  Dropout drop;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, lane = tid % 32, w = tid / 32, nt = t.block_dim().x;
    const int64_t cl = t.block_idx().x, bh = cl / C, j = cl % C;
    if (j == 0) zero_padded(t, assignment, bh, N, dQ, E, rowdot);
    const int64_t n = count[cl], L = keys_of(lengths, bh, H, S);
    const int32_t* members = order + bh * N + start[bh * (C + 1) + j];
    if (n == 0) return;  // the same for the whole block
    if (L == 0) {
      for (int64_t x = tid; x < n * E; x += nt) {
        const int64_t row = bh * N + members[x / E];
        dQ[row * E + x % E] = 0.0f;
        if (x % E == 0) rowdot[row] = 0.0f;
      }
      return;
    }
    const int32_t* T = tk + cl * kw;
    const int64_t kk = topk_size(T, kw);
    const TopkRows rows = topk_rows(t, stage, K + bh * S * E, V + bh * S * M, T, kk, E, M);
    const float m = mass[cl];
    for (int64_t r = w; r < n; r += kMemberWarps) {
      const int64_t row = bh * N + members[r];
      float *P = pw + row * kw, *G = gw + row * kw;
      member_weights(t, Q + row * E, rows, kk, E, temperature, P);
      const float* go = dout + row * M;
      double acc = 0.0;
      for (int64_t c = lane; c < kk; c += 32) {
        const float* vr = rows.vrow(c);
        float dot = 0.0f;
        for (int64_t e = 0; e < M; ++e) dot += go[e] * vr[e];
        float g = dot;
        if (drop.on()) {
          const uint32_t word = mask_word(drop, member_mask(BHCS, kw, row) + c);
          pv[row * kw + c] = math::dropout_value(P[c], word, drop.p, drop.scale);
          g = math::dropout_value(g, word, drop.p, drop.scale);
        }
        acc += double(P[c]) * g;
        G[c] = g;
      }
      const float dot = static_cast<float>(warp_reduce(t, acc, AddDouble{}));
      if (lane == 0) rowdot[row] = dot;
      for (int64_t c = lane; c < kk; c += 32) G[c] = m * P[c] * (G[c] - dot);
      t.sync_warp();  // dZ whole before the lanes read it by column
      for (int64_t e = lane; e < E; e += 32) {
        float acc_e = 0.0f;
        for (int64_t c = 0; c < kk; ++c) acc_e += G[c] * rows.krow(c)[e];
        dQ[row * E + e] = temperature * acc_e;
      }
    }
    t.sync();  // every member's dZ and dropped P before the sums over members
    const float* pd = drop.on() ? pv : pw;
    const int64_t width = E > M ? E : M;
    for (int64_t x = tid; x < kk * width; x += nt) {
      const int64_t c = x / width, e = x % width;
      float ks = 0.0f, vs = 0.0f;
      for (int64_t r = 0; r < n; ++r) {
        const int64_t i = bh * N + members[r];
        if (e < E) ks += gw[i * kw + c] * Q[i * E + e];
        if (e < M) vs += pd[i * kw + c] * dout[i * M + e];
      }
      if (e < E) dkt[(cl * kw + c) * E + e] = temperature * ks;
      if (e < M) dvt[(cl * kw + c) * M + e] = m * vs;
    }
  }
};

// eq. 10 backward, one CUDA block per row (pair bh, cluster j): dm_j = the members' rowdot
// summed in query order, written to the T_j columns of ds (dAc; m_j = sum_T Ac_j).
struct MassGradKernel {
  static constexpr bool kUsesBarrier = true;
  const float* rowdot;
  const int32_t *tk, *start, *order;
  float* ds;
  int64_t N, C, S, kw;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    const int64_t row = t.block_idx().x, bh = row / C, j = row % C;
    float* dm = t.shared<float>();
    if (tid == 0) {
      const int32_t* st = start + bh * (C + 1);
      float acc = 0.0f;
      for (int32_t r = st[j]; r < st[j + 1]; ++r) acc += rowdot[bh * N + order[bh * N + r]];
      dm[0] = acc;
    }
    t.sync();
    const int32_t* T = tk + row * kw;
    for (int64_t c = tid; c < kw; c += nt)
      if (T[c] >= 0) ds[row * S + T[c]] = dm[0];
  }
};

// The slot of key l in the ascending top-k row T (kw, -1 padded), or -1.
CLUSTR_DEVICE int64_t slot_of(const int32_t* T, int64_t kw, int32_t l) {
  int64_t lo = 0, hi = kw;  // the first slot whose key is >= l or -1 (padding sorts last)
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (T[mid] >= 0 && T[mid] < l) lo = mid + 1;
    else hi = mid;
  }
  return lo < kw && T[lo] == l ? lo : -1;
}

// dK_T and dV_T of eq. 11's exact part per key, a warp per key row (pair bh, key l), striding
// over the rows: dK[l] = the sum, over the clusters j whose T_j holds l in cluster order, of
// their shares dkt (=); dV[l] += the same sums of dvt (onto the remainder's GEMM). Masked keys:
// dK 0. For each 32 columns, the lanes find in which slot (if any) 32 clusters at a time hold
// the key (a binary search each), then add up those clusters' shares column by column. Shared:
// 32 ints a warp.
struct KeyGradKernel {
  static constexpr bool kUsesBarrier = true;
  const float *dkt, *dvt;
  const int32_t *tk, *count, *lengths;
  float *dK, *dV;
  int64_t rows_, H, S, E, M, C, kw;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const unsigned lane = t.thread_idx().x % 32, w = t.thread_idx().x / 32;
    const unsigned warps = t.block_dim().x / 32;
    int32_t* slots = t.shared<int32_t>() + 32 * w;
    const int64_t width = E > M ? E : M;
    for (int64_t row = int64_t{t.block_idx().x} * warps + w; row < rows_;
         row += int64_t{t.grid_dim().x} * warps) {
      const int64_t bh = row / S, l = row % S;
      float* dk = dK + row * E;
      float* dv = dV + row * M;
      if (l >= keys_of(lengths, bh, H, S)) {  // the same for the whole warp
        for (int64_t e = lane; e < E; e += 32) dk[e] = 0.0f;
        continue;
      }
      for (int64_t e0 = 0; e0 < width; e0 += 32) {
        const int64_t e = e0 + lane;
        float k_acc = 0.0f, v_acc = e < M ? dv[e] : 0.0f;
        for (int64_t j0 = 0; j0 < C; j0 += 32) {
          const int64_t j = j0 + lane;
          slots[lane] = j < C && count[bh * C + j] > 0
                            ? static_cast<int32_t>(
                                  slot_of(tk + (bh * C + j) * kw, kw, static_cast<int32_t>(l)))
                            : -1;
          t.sync_warp();
          for (int64_t x = 0; x < 32 && j0 + x < C; ++x) {
            const int32_t c = slots[x];
            if (c < 0) continue;
            const int64_t at = (bh * C + j0 + x) * kw + c;
            if (e < E) k_acc += dkt[at * E + e];
            if (e < M) v_acc += dvt[at * M + e];
          }
          t.sync_warp();  // the slots read before the next 32 clusters overwrite them
        }
        if (e < E) dk[e] = k_acc;
        if (e < M) dv[e] = v_acc;
      }
    }
  }
};

// dQ (B, H, N, E) += dqc_j / |j| for each query of cluster j (the mean of eq. 4-5); padded
// queries and sequences without keys are left alone. One thread per element.
struct CentroidGradKernel {
  static constexpr bool kUsesBarrier = false;
  const float* dqc;
  const int32_t *assignment, *count, *lengths;
  float* dQ;
  int64_t H, N, S, C, E, total;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t x = global_x(t); x < total; x += grid_stride_x(t)) {
      const int64_t row = x / E, bh = row / N;
      const int32_t j = assignment[row];
      // j >= C only when the front door's check went to the device (which reports it).
      if (j < 0 || j >= C || keys_of(lengths, bh, H, S) == 0) continue;
      const float n = static_cast<float>(count[bh * C + j]);
      dQ[x] += dqc[(bh * C + j) * E + x % E] / n;
    }
  }
};

}  // namespace

int64_t improved_clustered_attention_forward_workspace(const ClusteredDims& d, int64_t kw,
                                                       const ClusteredParams&) {
  const int64_t pairs_c = d.B * d.H * d.C;
  return pairs_c * (d.M + d.S) + d.B * d.H * d.N * kw;
}
int64_t improved_clustered_attention_backward_workspace(const ClusteredDims& d, int64_t kw,
                                                        const ClusteredParams& p) {
  const int64_t pairs_c = d.B * d.H * d.C, rows = d.B * d.H * d.N;
  return pairs_c * (d.M + 2 * d.S + d.E) + rows * (2 * kw + 1) +
         (p.dropout > 0.0f ? rows * kw : 0) + pairs_c * kw * (d.E + d.M);
}

void improved_clustered_attention_forward(const ClusteredDims& d, const ClusteredParams& p,
                                          int64_t topk, int64_t kw, const float* Q,
                                          const float* K, const float* V, float* out,
                                          float* weights, float* centroids, int32_t* tk,
                                          float* mass, float* workspace) {
  const int64_t BH = d.B * d.H, H = d.H, N = d.N, S = d.S, E = d.E, M = d.M, C = d.C;
  if (BH == 0 || C == 0) return;
  require("cuda::improved_clustered_attention_forward");
  const Dropout drop = dropout_of(p);
  float* rc = workspace;
  float* acr = rc + BH * C * M;
  float* pw = acr + BH * C * S;
  // eq. 4-5: Qc; eq. 3: Ac = softmax(t Qc K^T + mask) (no dropout: T_j and m_j see Ac itself)
  centroid_logits("cuda::improved_clustered_attention_forward (centroids)", d, p, Q, K,
                  centroids, weights);
  // Then per cluster row, in one launch: its softmax; eq. 9-10: T_j, m_j; and for eq. 11's
  // second term, acr = Ac with T_j zeroed (and the cluster's mask).
  const unsigned threads = row_threads(S);
  if (S > 0) {
    const size_t shared = std::max(threads * sizeof(double),
                                   (threads + 256) * sizeof(int) + 2 * sizeof(int64_t));
    launch("cuda::improved_clustered_attention_forward (weights, top-k, remainder)",
           {grid_of(BH * C)}, {threads}, shared,
           InTurn<WeightsRowsKernel, InTurn<TopkKernel, RemainderKernel>>{
               {weights, nullptr, p.count, p.lengths, H, C, S, Dropout{}},
               {{weights, p.count, p.lengths, tk, mass, H, C, S, topk, kw},
                {weights, tk, p.lengths, acr, nullptr, H, C, S, kw, drop}}});
  } else {
    fill_f32(mass, 0.0f, BH * C);
  }
  // rc = acr V
  for_each_sequence(d, p, [&](int64_t b0, int64_t nb, int64_t L) {
    product(p.bf16, false, false, C, M, L, 1.0f, acr + b0 * H * C * S, S, C * S,
            V + b0 * H * S * M, M, S * M, rc + b0 * H * C * M, M, C * M, nb * H);
  });
  // eq. 11, first term, and the sum of the two: a block per cluster
  launch("cuda::improved_clustered_attention_forward (members)", {grid_of(BH * C)},
         {kMemberThreads}, stage_bytes(kw, E, M),
         MemberForwardKernel{Q, K, V, rc, mass, p.assignment, p.count, p.start, p.order, tk,
                             p.lengths, pw, out, H, N, S, E, M, C, kw, BH * C * S, p.temperature,
                             staged(kw, E, M), drop});
}

void improved_clustered_attention_backward(const ClusteredDims& d, const ClusteredParams& p,
                                           int64_t kw, const float* Q, const float* K,
                                           const float* V, const float* weights,
                                           const float* centroids, const int32_t* tk,
                                           const float* mass, const float* dout, float* dQ,
                                           float* dK, float* dV, float* workspace) {
  const int64_t BH = d.B * d.H, H = d.H, N = d.N, S = d.S, E = d.E, M = d.M, C = d.C;
  // Masked keys get no gradient: the GEMMs below write only the first L rows of dV.
  if (some_keys_masked(d, p)) fill_f32(dV, 0.0f, BH * S * M);
  if (BH == 0 || C == 0) return;
  require("cuda::improved_clustered_attention_backward");
  const Dropout drop = dropout_of(p);
  const int64_t rows = BH * N;
  float* dvc = workspace;
  float* ds = dvc + BH * C * M;
  float* acr = ds + BH * C * S;
  float* dqc = acr + BH * C * S;
  float* pw = dqc + BH * C * E;
  float* gw = pw + rows * kw;
  float* rowdot = gw + rows * kw;
  float* pv = drop.on() ? rowdot + rows : pw;  // the weights that multiply V and dO
  float* dkt = (drop.on() ? pv + rows * kw : rowdot + rows);
  float* dvt = dkt + BH * C * kw * E;
  const float t = p.temperature;
  // dVc_j = sum_{i in j} dO_i; dAc = dVc V^T off T_j (masked); dV = (Ac off T_j, masked)^T dVc
  cluster_value_grads("cuda::improved_clustered_attention_backward (member sums)", d, p, dout, V,
                      dvc, ds);
  const unsigned threads = row_threads(S);
  if (S > 0)
    launch("cuda::improved_clustered_attention_backward (remainder)", {grid_of(BH * C)},
           {threads}, 0, RemainderKernel{weights, tk, p.lengths, acr, ds, H, C, S, kw, drop});
  for_each_sequence(d, p, [&](int64_t b0, int64_t nb, int64_t L) {
    const int64_t bc = b0 * H * C;
    product(p.bf16, true, false, L, M, C, 1.0f, acr + bc * S, S, C * S, dvc + bc * M, M, C * M,
            dV + b0 * H * S * M, M, S * M, nb * H);
  });
  // The exact top-k part, a block per cluster: dZ_i, rowdot_i and dQ_i = t dZ_i K_T per
  // member, then the cluster's shares of dK_T and dV_T
  launch("cuda::improved_clustered_attention_backward (members)", {grid_of(BH * C)},
         {kMemberThreads}, stage_bytes(kw, E, M),
         MemberBackwardKernel{Q, K, V, dout, mass, p.assignment, p.count, p.start, p.order, tk,
                              p.lengths, pw, gw, pv, rowdot, dQ, dkt, dvt, H, N, S, E, M, C, kw,
                              BH * C * S, t, staged(kw, E, M), drop});
  // dK_T (=) and dV_T (+=) gathered per key, clusters in order
  const int64_t key_rows = BH * S;
  constexpr unsigned kKeyWarps = 4;
  const unsigned key_blocks = row_blocks((key_rows + kKeyWarps - 1) / kKeyWarps);
  launch("cuda::improved_clustered_attention_backward (keys)", {key_blocks}, {32 * kKeyWarps},
         32 * kKeyWarps * sizeof(int32_t),
         KeyGradKernel{dkt, dvt, tk, p.count, p.lengths, dK, dV, key_rows, H, S, E, M, C, kw});
  // dm_j onto the T_j columns of dAc, then the softmax backward of eq. 3
  if (S > 0)
    launch("cuda::improved_clustered_attention_backward (mass, rows)", {grid_of(BH * C)},
           {threads}, threads * sizeof(double),
           InTurn<MassGradKernel, BackwardRowsKernel>{
               {rowdot, tk, p.start, p.order, ds, N, C, S, kw},
               {weights, ds, nullptr, p.lengths, H, C, S, Dropout{}}});
  // Through the centroids (eq. 4-5): dK += t dzc^T Qc, dQc = t dzc K, dQ_i += dQc_j / |j|
  for_each_sequence(d, p, [&](int64_t b0, int64_t nb, int64_t L) {
    const int64_t bc = b0 * H * C, batch = nb * H;
    const auto ds16 = bf16_operand(p.bf16, ds + bc * S, C, L, S, C * S, batch);  // read twice
    product(p.bf16, true, false, L, E, C, t, ds + bc * S, S, C * S, centroids + bc * E, E,
            C * E, dK + b0 * H * S * E, E, S * E, batch, 1.0f, ds16.get());
    product(p.bf16, false, false, C, E, L, t, ds + bc * S, S, C * S, K + b0 * H * S * E, E, S * E,
            dqc + bc * E, E, C * E, batch, 0.0f, ds16.get());
  });
  const int64_t total = BH * N * E;
  launch("cuda::improved_clustered_attention_backward (centroid gradient)",
         {elementwise_blocks(total)}, {kElementwiseThreads}, 0,
         CentroidGradKernel{dqc, p.assignment, p.count, p.lengths, dQ, H, N, S, C, E, total});
}

}  // namespace clustr::cuda
