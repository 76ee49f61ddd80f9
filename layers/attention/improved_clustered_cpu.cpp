// CPU kernels of improved clustered attention for a fixed clustering (improved_clustered.h,
// eq. 9-11; the front doors are in improved_clustered.cpp).
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters; L the
// valid keys of a sequence; kk = min(k, L) the top keys of a cluster, kw = min(k, S) the saved
// width; n the members of one cluster; t the temperature.
//
// A pair's work, as in clustered.cpp: centroids and Ac (shared helpers in clustered_common.h),
// the top-k sets, then cluster by cluster the members' exact softmax over their T_j, by
// cpu::gemm. With at least as many (b, h) pairs as threads a task is one pair on one thread;
// with fewer, the pairs run in turn and all threads share each one: the dense C x S products
// through the GEMM's threads, the top-k selections and the members' work cluster by cluster
// (each thread with its own scratch). A query belongs to one cluster, so each member row of
// out and dQ is written by one cluster's work. dK and dV, which several clusters' top-k sets
// add into, are reduced deterministically: each cluster writes its k x E and k x M
// contributions to its own slot, and the slots are added into dK, dV in cluster order after all
// clusters are done (a pair on one thread adds each cluster's right after it, the same sums in
// the same order, and needs one slot). Members are summed in query order, so results never
// depend on the thread count.
//
// Backward (fixed assignment, fixed T_j). With dO_i the upstream gradient, for cluster j:
//   P_i = softmax_Tj(t q_i K_T^T), out_i = m P_i V_T + R_j, R_j = sum_{l not in T} Ac[l] V_l
//   G_i[l]  = dO_i . V_l (l in T)                  dP_i = m G_i
//   dV_l   += m sum_i P_i[l] dO_i (l in T),        dV_l += Ac[l] dVc_j (l not in T, dVc_j =
//             sum_{i in j} dO_i)
//   dm_j    = sum_i sum_{l in T} P_i[l] G_i[l]     (out_i depends on m linearly, eq. 10)
//   dZ_i    = m P_i (G_i - sum_l P_i[l] G_i[l])    (softmax backward of the exact scores)
//   dq_i    = t dZ_i K_T,  dk_l += t sum_i dZ_i[l] q_i (l in T)
//   dAc[l]  = dm_j (l in T: m = sum_T Ac), dVc_j . V_l (l not in T: eq. 11's second term)
//   dzc     = Ac (dAc - sum_l Ac[l] dAc[l])        (softmax backward of eq. 3)
//   dQc_j   = t dzc K,  dK += t dzc^T Qc,  dq_i += dQc_j / |j|   (the mean of eq. 4-5)
// With dropout (improved_clustered.h) the weights that multiply V carry the masks: in the lines
// above P_i[l] becomes P_i[l] D_i[l] r where it multiplies V or dO (out_i, dV_T), G_i[l]
// becomes G_i[l] D_i[l] r (the gradient reaching P_i through the mask), Ac[l] off T becomes
// Ac[l] Dc_j[l] r in R_j and dV, and dAc[l] off T is dVc_j . V_l Dc_j[l] r; m_j, T_j and the
// softmax backward use the weights before dropout.
// Masked keys take no part in any product; their rows of dK, dV are 0.
#include "layers/attention/improved_clustered_cpu.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "core/math.h"
#include "core/parallel.h"

namespace clustr::cpu {

namespace {

using namespace clustered_detail;

constexpr int64_t kReduceCols = 16;  // columns of dK, dV per task of the slot reduction

// Scratch of one pair in flight (sizes from the shapes).
struct PairScratch {
  float* acr = nullptr;   // C x S: Ac with the T_j columns zeroed (and the dropout mask)
  float* cm = nullptr;    // C x M: R (forward), dVc (backward)
  float* ds = nullptr;    // C x S: dAc, then dzc (backward)
  float* dqc = nullptr;   // C x E (backward)
  float* kslot = nullptr; // slots x kw x E: a cluster's dK_T contribution (backward)
  float* vslot = nullptr; // slots x kw x M: its dV_T contribution (backward)
  float* dm = nullptr;    // C (backward)
  Members members{};
};

// Slots: one per cluster when the threads share a pair's clusters (`inner`), else one, added
// into dK, dV right after each cluster (the same additions in the same order).
Tensor make_pair_scratch(const Dims& d, int64_t kw, bool backward, bool inner, PairScratch& s) {
  return carve([&](Carve& c) {
    s.acr = c.f32(d.C * d.S);
    s.cm = c.f32(d.C * d.M);
    if (backward) {
      const int64_t slots = inner ? d.C : 1;
      s.ds = c.f32(d.C * d.S);
      s.dqc = c.f32(d.C * d.E);
      s.kslot = c.f32(slots * kw * d.E);
      s.vslot = c.f32(slots * kw * d.M);
      s.dm = c.f32(d.C);
    }
    s.members.count = c.i32(d.C);
    s.members.start = c.i32(d.C + 1);
    s.members.order = c.i32(d.N);
  });
}

// Rows of Ac up to this many valid keys take select_topk's bitwise search; longer ones its
// candidate pass.
constexpr int64_t kShortRow = 512;

// Room for select_topk's candidates: at least 4 kw, at most S.
int64_t select_room(const Dims& d, int64_t kw) {
  return std::min(d.S, std::max<int64_t>(4 * kw, 256));
}

// Scratch of one thread working on the clusters of a pair whose largest cluster has n members.
struct MemberScratch {
  float *qj, *oj, *kt, *vt, *P, *G, *Pd, *tq;  // n x E, n x M, kw x E, kw x M, n x kw (3), n x E
  int32_t* sel;                                // select_room(): top-k candidates
  uint32_t* keys;                              // min(S, kShortRow): a short row's order keys
};

// `team` sets of member scratch (one per thread sharing the pair).
Tensor make_member_scratch(const Dims& d, int64_t kw, int64_t n, bool dropout,
                           std::vector<MemberScratch>& ms) {
  return carve([&](Carve& c) {
    for (MemberScratch& m : ms) {
      m.qj = c.f32(n * d.E);
      m.oj = c.f32(n * d.M);
      m.kt = c.f32(kw * d.E);
      m.vt = c.f32(kw * d.M);
      m.P = c.f32(n * kw);
      m.G = c.f32(n * kw);
      m.Pd = dropout ? c.f32(n * kw) : nullptr;
      m.tq = c.f32(n * d.E);
      m.sel = c.i32(select_room(d, kw));
      m.keys = reinterpret_cast<uint32_t*>(c.i32(std::min(d.S, kShortRow)));
    }
  });
}

// Runs pair(bh, inner, scratch) for every pair: one pair per task, or (fewer pairs than
// threads) pair after pair with every thread inside.
template <class Pair>
void for_each_pair(const Dims& d, int64_t kw, bool backward, Pair pair) {
  const int64_t pairs = d.B * d.H;
  const int threads = num_threads();
  if (pairs < threads) {
    PairScratch s;
    const Tensor hold = make_pair_scratch(d, kw, backward, true, s);
    for (int64_t bh = 0; bh < pairs; ++bh) pair(bh, true, s);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    set_num_threads(1);  // for cpu::gemm inside this region (this thread's ICV only)
    PairScratch s;
    const Tensor hold = make_pair_scratch(d, kw, backward, false, s);
#pragma omp for schedule(dynamic)
    for (int64_t bh = 0; bh < pairs; ++bh) pair(bh, false, s);
  }
}

// eq. 9-10: T = the kk = min(k, L) valid keys with the largest weights of row (S), ties to the
// lower key index, written to tk (kw) in ascending key order with -1 padding; returns m = their
// summed weight (in key order). An empty row (empty cluster, L = 0) has T empty and m = 0.
// Weights are ranked by math::order_key (the floats' order), then by index ascending: a total
// order, so the selected set is unique, and the device's (TopkKernel) is the same.
// A short row (L <= kShortRow; the keys in `keys`) finds the kk-th largest key bit by bit from
// the top, as the device does: the largest bar with at least kk keys at or above it (stopping
// as soon as exactly kk are: they are T); one pass in index order then takes the keys above
// the bar and enough of those equal to it. Each step is a count over the row that the compiler
// vectorises: about 16 passes over L keys in all, with no data-dependent branch.
// A longer row is one pass that keeps candidates in sel (room for at least 4 kk): whenever it
// fills, nth_element keeps its best kk and their lowest key becomes the bar that later keys
// must beat strictly (a later key with an equal weight has a higher index, so it ranks lower).
// Most keys fail the bar at the cost of one comparison.
float select_topk(const float* row, int64_t L, int64_t k, int64_t kw, bool empty, uint32_t* keys,
                  int32_t* sel, int64_t room, int32_t* tk) {
  const int64_t kk = empty ? 0 : std::min(k, L);
  int64_t n = 0;
  if (kk == L) {
    std::iota(sel, sel + L, 0);
    n = L;
  } else if (kk > 0 && L <= kShortRow) {
    for (int64_t l = 0; l < L; ++l) keys[l] = math::order_key(row[l]);
    uint32_t bar = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t trial = bar | (1u << bit);
      int32_t at_or_above = 0;
      for (int64_t l = 0; l < L; ++l) at_or_above += keys[l] >= trial ? 1 : 0;
      if (at_or_above < kk) continue;
      bar = trial;
      if (at_or_above == kk) break;
    }
    int32_t above = 0;
    for (int64_t l = 0; l < L; ++l) above += keys[l] > bar ? 1 : 0;
    int64_t equal = kk - above;  // keys equal to the bar that T takes, lowest index first
    for (int64_t l = 0; l < L && n < kk; ++l)
      if (keys[l] > bar || (keys[l] == bar && equal-- > 0)) sel[n++] = static_cast<int32_t>(l);
  } else if (kk > 0) {
    auto better = [row](int32_t x, int32_t y) {
      const uint32_t kx = math::order_key(row[x]), ky = math::order_key(row[y]);
      return kx > ky || (kx == ky && x < y);
    };
    uint32_t bar = 0;
    bool full = false;
    for (int64_t l = 0; l < L; ++l) {
      if (full && !(math::order_key(row[l]) > bar)) continue;
      sel[n++] = static_cast<int32_t>(l);
      if (n == room) {
        std::nth_element(sel, sel + (kk - 1), sel + n, better);
        n = kk;
        bar = math::order_key(row[sel[kk - 1]]);
        full = true;
      }
    }
    if (n > kk) std::nth_element(sel, sel + (kk - 1), sel + n, better);
    std::sort(sel, sel + kk);
  }
  float m = 0.0f;
  for (int64_t c = 0; c < kw; ++c) {
    tk[c] = c < kk ? sel[c] : -1;
    if (c < kk) m += row[sel[c]];
  }
  return m;
}

// Gathers rows idx[0..n) of x (., width) into y (n, width).
template <class I>
void gather(const float* x, int64_t width, const I* idx, int64_t n, float* y) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < width; ++c) y[r * width + c] = x[idx[r] * width + c];
}

// P (n, kk) = row softmax of t Qj K_T^T: the exact member weights on T (eq. 11), kk >= 1.
void member_weights(int64_t n, int64_t kk, int64_t E, float t, const float* qj, const float* kt,
                    float* P) {
  product(false, true, n, kk, E, t, qj, E, kt, E, P, kk);
  for (int64_t r = 0; r < n; ++r) softmax_row(P + r * kk, kk, kk);
}

// The first mask element of member query i of pair bh (improved_clustered.h): after the
// B H C S elements of the clusters' masks, kw per query.
uint64_t member_mask(const Dims& d, int64_t kw, int64_t bh, int64_t i) {
  return static_cast<uint64_t>(d.B * d.H * d.C * d.S + (bh * d.N + i) * kw);
}

// acr (C, S) = Ac with the T_j columns zeroed, times the clusters' dropout mask; with g (the
// backward's dAc, or null) masked by the same words.
void remainder_weights(const Dims& d, const Dropout& drop, int64_t L, int64_t kw, int64_t bh,
                       const float* ac, const int32_t* tk, float* acr, float* g,
                       [[maybe_unused]] bool inner) {
#pragma omp parallel for schedule(static) if (inner)
  for (int64_t j = 0; j < d.C; ++j) {
    float* row = acr + j * d.S;
    std::copy(ac + j * d.S, ac + j * d.S + L, row);
    for (int64_t c = 0; c < kw && tk[j * kw + c] >= 0; ++c) row[tk[j * kw + c]] = 0.0f;
    if (!drop.on()) continue;
    float* gr = g ? g + j * d.S : nullptr;
    for_each_mask_word(drop, static_cast<uint64_t>((bh * d.C + j) * d.S), L,
                       [&](int64_t c, uint32_t word) {
                         row[c] = math::dropout_value(row[c], word, drop.p, drop.scale);
                         if (gr) gr[c] = math::dropout_value(gr[c], word, drop.p, drop.scale);
                       });
  }
}

// One (b, h) pair of the forward (eq. 3-11). Writes out (N, M), ac (C, S), qc (C, E),
// count (C), tk (C, kw), mass (C) of the pair.
void forward_pair(const Dims& d, const Params& p, const Dropout& drop, int64_t k, int64_t kw,
                  int64_t bh, bool inner, const float* Q, const float* K, const float* V,
                  float* out, float* ac, float* qc, int32_t* count, int32_t* tk, float* mass,
                  PairScratch& s) {
  const int64_t L = p.lengths ? p.lengths[bh / d.H] : d.S;
  const int32_t* a = p.assignment + bh * d.N;
  const float* q = Q + bh * d.N * d.E;
  const float* kb = K + bh * d.S * d.E;
  const float* v = V + bh * d.S * d.M;
  float* o = out + bh * d.N * d.M;
  Members& m = s.members;
  group(d, a, m);
  std::copy(m.count, m.count + d.C, count);
  centroids(d, m, q, qc, inner);                        // eq. 4-5
  centroid_weights(d, p, L, qc, count, kb, ac, inner);  // eq. 3
  const int team = inner ? num_threads() : 1;
  std::vector<MemberScratch> ms(static_cast<size_t>(team));
  const Tensor hold = make_member_scratch(d, kw, m.largest, false, ms);
#pragma omp parallel for schedule(dynamic, 4) num_threads(team) if (inner)
  for (int64_t j = 0; j < d.C; ++j)  // eq. 9-10
    mass[j] = select_topk(ac + j * d.S, L, k, kw, count[j] == 0 || L == 0, ms[thread_id()].keys,
                          ms[thread_id()].sel, select_room(d, kw), tk + j * kw);
  fill_shared(o, d.N * d.M, 0.0f, inner);
  if (L == 0) return;
  // eq. 11, second term once per cluster: R = (Ac with the T_j columns zeroed) V.
  remainder_weights(d, drop, L, kw, bh, ac, tk, s.acr, nullptr, inner);
  cluster_product(p, false, false, d.C, d.M, L, 1.0f, s.acr, d.S, v, d.M, s.cm, d.M);
  // eq. 11, first term: m_j softmax_Tj(t q_i K_T^T) V_T for the members of each cluster.
#pragma omp parallel for schedule(dynamic) num_threads(team) if (inner)
  for (int64_t j = 0; j < d.C; ++j) {
    const int64_t n = count[j], kk = topk_size(tk + j * kw, kw);
    if (n == 0) continue;
    MemberScratch& w = ms[thread_id()];
    const int32_t* members = m.order + m.start[j];
    gather(q, d.E, members, n, w.qj);
    gather(kb, d.E, tk + j * kw, kk, w.kt);
    gather(v, d.M, tk + j * kw, kk, w.vt);
    member_weights(n, kk, d.E, p.temperature, w.qj, w.kt, w.P);
    if (drop.on())
      for (int64_t r = 0; r < n; ++r)
        dropout_row(drop, member_mask(d, kw, bh, members[r]), kk, w.P + r * kk, w.P + r * kk);
    product(false, false, n, d.M, kk, mass[j], w.P, kk, w.vt, d.M, w.oj, d.M);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < d.M; ++c)
        o[members[r] * d.M + c] = w.oj[r * d.M + c] + s.cm[j * d.M + c];
  }
}

// dst rows T[c] += slot[c] (width w) for c < kk.
void add_slot(const int32_t* T, int64_t kk, const float* slot, int64_t w, float* dst) {
  for (int64_t c = 0; c < kk; ++c) {
    const float* src = slot + c * w;
    float* out = dst + static_cast<int64_t>(T[c]) * w;
    for (int64_t e = 0; e < w; ++e) out[e] += src[e];
  }
}

// dst rows T_j[c] += slot_j[c] (width w) for the clusters in index order, columns split among
// the threads (each element is still summed in cluster order, as add_slot after each cluster
// would).
void add_slots(const Dims& d, int64_t kw, const int32_t* tk, const int32_t* count,
               const float* slot, int64_t w, float* dst, [[maybe_unused]] bool inner) {
  const int64_t blocks = (w + kReduceCols - 1) / kReduceCols;
#pragma omp parallel for schedule(static) if (inner)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * kReduceCols, c1 = std::min(w, c0 + kReduceCols);
    for (int64_t j = 0; j < d.C; ++j) {
      if (count[j] == 0) continue;
      const int32_t* T = tk + j * kw;
      for (int64_t c = 0; c < kw && T[c] >= 0; ++c) {
        const float* src = slot + (j * kw + c) * w;
        float* out = dst + static_cast<int64_t>(T[c]) * w;
        for (int64_t e = c0; e < c1; ++e) out[e] += src[e];
      }
    }
  }
}

// One (b, h) pair of the backward (the derivation at the top of this file). Writes dQ (N, E),
// dK (S, E), dV (S, M) of the pair.
void backward_pair(const Dims& d, const Params& p, const Dropout& drop, int64_t kw, int64_t bh,
                   bool inner, const float* Q, const float* K, const float* V, const float* ac,
                   const float* qc, const int32_t* tk, const float* mass, const float* dout,
                   float* dQ, float* dK, float* dV, PairScratch& s) {
  const int64_t L = p.lengths ? p.lengths[bh / d.H] : d.S;
  const int32_t* a = p.assignment + bh * d.N;
  const float t = p.temperature;
  const float* q = Q + bh * d.N * d.E;
  const float* kb = K + bh * d.S * d.E;
  const float* v = V + bh * d.S * d.M;
  const float* go = dout + bh * d.N * d.M;
  float* dq = dQ + bh * d.N * d.E;
  float* dk = dK + bh * d.S * d.E;
  float* dv = dV + bh * d.S * d.M;
  fill_shared(dq, d.N * d.E, 0.0f, inner);  // padded queries keep 0
  fill_shared(dk, d.S * d.E, 0.0f, inner);  // masked keys keep 0; valid rows accumulate below
  fill(dv + L * d.M, (d.S - L) * d.M, 0.0f);
  if (L == 0) return;

  Members& m = s.members;
  group(d, a, m);
  const int32_t* count = m.count;
  // dVc_j = sum_{i in j} dO_i; dAc = dVc V^T off the top-k sets (overwritten with dm_j on them
  // below); dV = (Ac with T_j zeroed)^T dVc (eq. 11, second term). Dropout masks both.
  float* dvc = s.cm;
  sum_members(d, m, go, d.M, dvc, inner);
  cluster_product(p, false, true, d.C, L, d.M, 1.0f, dvc, d.M, v, d.M, s.ds, d.S);
  remainder_weights(d, drop, L, kw, bh, ac, tk, s.acr, s.ds, inner);
  cluster_product(p, true, false, L, d.M, d.C, 1.0f, s.acr, d.S, dvc, d.M, dv, d.M);

  // The exact top-k part of eq. 11, cluster by cluster.
  const int team = inner ? num_threads() : 1;
  std::vector<MemberScratch> ms(static_cast<size_t>(team));
  const Tensor hold = make_member_scratch(d, kw, m.largest, drop.on(), ms);
#pragma omp parallel for schedule(dynamic) num_threads(team) if (inner)
  for (int64_t j = 0; j < d.C; ++j) {
    const int64_t n = count[j];
    s.dm[j] = 0.0f;
    if (n == 0) continue;
    MemberScratch& w = ms[thread_id()];
    const int32_t* T = tk + j * kw;
    const int64_t kk = topk_size(T, kw);
    const int32_t* members = m.order + m.start[j];
    float *P = w.P, *G = w.G;
    gather(q, d.E, members, n, w.qj);
    gather(go, d.M, members, n, w.oj);
    gather(kb, d.E, T, kk, w.kt);
    gather(v, d.M, T, kk, w.vt);
    member_weights(n, kk, d.E, t, w.qj, w.kt, P);
    product(false, true, n, kk, d.M, 1.0f, w.oj, d.M, w.vt, d.M, G, kk);
    const float* Pv = P;  // the weights that multiply V
    if (drop.on()) {
      for (int64_t r = 0; r < n; ++r)
        for_each_mask_word(drop, member_mask(d, kw, bh, members[r]), kk,
                           [&](int64_t c, uint32_t word) {
                             const int64_t x = r * kk + c;
                             w.Pd[x] = math::dropout_value(P[x], word, drop.p, drop.scale);
                             G[x] = math::dropout_value(G[x], word, drop.p, drop.scale);
                           });
      Pv = w.Pd;
    }
    // dV_T += m P^T dO (through this cluster's slot)
    float* vslot = s.vslot + (inner ? j : 0) * kw * d.M;
    float* kslot = s.kslot + (inner ? j : 0) * kw * d.E;
    product(true, false, kk, d.M, n, mass[j], Pv, kk, w.oj, d.M, vslot, d.M);
    // dm_j and dZ = m P (G - rowsum(P G)), in place of G.
    float dm = 0.0f;
    for (int64_t r = 0; r < n; ++r) {
      float dot = 0.0f;
      for (int64_t c = 0; c < kk; ++c) dot += P[r * kk + c] * G[r * kk + c];
      dm += dot;
      for (int64_t c = 0; c < kk; ++c)
        G[r * kk + c] = mass[j] * P[r * kk + c] * (G[r * kk + c] - dot);
    }
    s.dm[j] = dm;
    // dq_i = t dZ_i K_T; dK_T += t dZ^T Qj (through this cluster's slot)
    product(false, false, n, d.E, kk, t, G, kk, w.kt, d.E, w.tq, d.E);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t e = 0; e < d.E; ++e) dq[members[r] * d.E + e] = w.tq[r * d.E + e];
    product(true, false, kk, d.E, n, t, G, kk, w.qj, d.E, kslot, d.E);
    if (!inner) {  // one thread visits the clusters in order: add now
      add_slot(T, kk, vslot, d.M, dv);
      add_slot(T, kk, kslot, d.E, dk);
    }
  }
  if (inner) {
    add_slots(d, kw, tk, count, s.vslot, d.M, dv, inner);
    add_slots(d, kw, tk, count, s.kslot, d.E, dk, inner);
  }
  for (int64_t j = 0; j < d.C; ++j)  // m_j = sum_T Ac_j (eq. 10)
    for (int64_t c = 0; c < kw && tk[j * kw + c] >= 0; ++c)
      s.ds[j * d.S + tk[j * kw + c]] = s.dm[j];

  // Through Ac (eq. 3) and the centroids (eq. 4-5).
  softmax_backward_rows(d, L, ac, s.ds, inner);  // empty cluster: Ac = 0
  cluster_product(p, false, false, d.C, d.E, L, t, s.ds, d.S, kb, d.E, s.dqc, d.E);
  cluster_product(p, true, false, L, d.E, d.C, t, s.ds, d.S, qc, d.E, dk, d.E, 1.0f);
#pragma omp parallel for schedule(static) if (inner)
  for (int64_t i = 0; i < d.N; ++i) {
    if (a[i] < 0) continue;
    const float n = static_cast<float>(count[a[i]]);
    for (int64_t e = 0; e < d.E; ++e) dq[i * d.E + e] += s.dqc[a[i] * d.E + e] / n;
  }
}

}  // namespace

void improved_clustered_attention_forward(const clustered_detail::Dims& d,
                                          const clustered_detail::Params& p,
                                          const clustered_detail::Dropout& drop, int64_t topk,
                                          int64_t kw, const float* q, const float* k,
                                          const float* v, float* out, float* ac, float* qc,
                                          int32_t* count, int32_t* tk, float* mass) {
  for_each_pair(d, kw, false, [&](int64_t bh, bool inner, PairScratch& s) {
    forward_pair(d, p, drop, topk, kw, bh, inner, q, k, v, out, ac + bh * d.C * d.S,
                 qc + bh * d.C * d.E, count + bh * d.C, tk + bh * d.C * kw, mass + bh * d.C, s);
  });
}

void improved_clustered_attention_backward(const clustered_detail::Dims& d,
                                           const clustered_detail::Params& p,
                                           const clustered_detail::Dropout& drop, int64_t kw,
                                           const float* q, const float* k, const float* v,
                                           const float* ac, const float* qc, const int32_t* tk,
                                           const float* mass, const float* dout, float* dQ,
                                           float* dK, float* dV) {
  for_each_pair(d, kw, true, [&](int64_t bh, bool inner, PairScratch& s) {
    backward_pair(d, p, drop, kw, bh, inner, q, k, v, ac + bh * d.C * d.S, qc + bh * d.C * d.E,
                  tk + bh * d.C * kw, mass + bh * d.C, dout, dQ, dK, dV, s);
  });
}

}  // namespace clustr::cpu
