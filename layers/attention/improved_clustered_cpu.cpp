// CPU kernels of improved clustered attention for a fixed clustering (improved_clustered.h,
// eq. 9-11; the front doors are in improved_clustered.cpp).
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters; L the
// valid keys of a sequence; kk = min(k, L) the top keys of a cluster, kw = min(k, S) the saved
// width; n the members of one cluster; t the temperature.
//
// A pair's work, as in clustered.cpp: centroids and Ac (shared helpers in clustered_common.h),
// the top-k sets, then cluster by cluster the members' exact softmax over their T_j (the C x S
// products through cluster_product, the members' small ones through small_product below).
// With at least as many (b, h) pairs as threads a task is one pair on one thread;
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
#include <cstring>
#include <numeric>
#include <vector>

#include "core/cpu/row_clones.h"
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
  float *ktt, *vtt;                            // E x kw, M x kw: kt and vt transposed
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
      m.ktt = c.f32(d.E * kw);
      m.vtt = c.f32(d.M * kw);
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
// Most keys fail the bar at the cost of one comparison. Compiled per instruction set
// (CLUSTR_ROW_CLONES): the counts run 16 keys to a vector with AVX-512.
CLUSTR_ROW_CLONES
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
    for (int64_t l = 0; l < L && n < kk; ++l) {  // without a branch on the (random) keys
      const bool at_bar = keys[l] == bar;
      const bool take = (keys[l] > bar) | (at_bar & (equal > 0));
      equal -= at_bar;
      sel[n] = static_cast<int32_t>(l);
      n += take;
    }
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

// ---- a cluster's members against its top-k keys --------------------------------------------
// These products are a few rows by kk <= k (32 by default) by a head's width: too small for the
// GEMM's blocking and packing, which cost several times their arithmetic. They, and the loops
// around them, are plain loops compiled per instruction set (CLUSTR_ROW_CLONES): each output
// row is a sum over s in order of A(r, s) times row s of B, 16 columns to a vector, so no sum
// is reordered and no result depends on the thread count.

// GCC's vector of 16 floats: one AVX-512 register, two AVX2 ones, four SSE ones. (Only used
// inside the functions below, never passed: -Wpsabi's note is about passing one.)
typedef float Lanes __attribute__((vector_size(64)));

// The helpers are inlined into the per-cluster functions (member_forward, member_backward),
// and so compiled for each of their instruction sets.
#define CLUSTR_MEMBER_HELPER __attribute__((always_inline)) inline

// C (rows, cols) = alpha sum_{s < inner} A(r, s) B(s, .), with A(r, s) at A[r * ars + s * acs],
// row s of B at B + s * ldb and the rows of C ldc apart; inner >= 1.
CLUSTR_MEMBER_HELPER void small_product(int64_t rows, int64_t cols, int64_t inner, float alpha,
                                        const float* A, int64_t ars, int64_t acs, const float* B,
                                        int64_t ldb, float* C, int64_t ldc) {
  constexpr int64_t W = 16;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = A + r * ars;
    float* c = C + r * ldc;
    int64_t j = 0;
    for (; j + 2 * W <= cols; j += 2 * W) {
      Lanes acc0 = {}, acc1 = {};
      for (int64_t s = 0; s < inner; ++s) {
        Lanes b0, b1;
        std::memcpy(&b0, B + s * ldb + j, sizeof b0);
        std::memcpy(&b1, B + s * ldb + j + W, sizeof b1);
        acc0 += a[s * acs] * b0;
        acc1 += a[s * acs] * b1;
      }
      acc0 *= alpha;
      acc1 *= alpha;
      std::memcpy(c + j, &acc0, sizeof acc0);
      std::memcpy(c + j + W, &acc1, sizeof acc1);
    }
    for (; j + W <= cols; j += W) {
      Lanes acc = {};
      for (int64_t s = 0; s < inner; ++s) {
        Lanes b;
        std::memcpy(&b, B + s * ldb + j, sizeof b);
        acc += a[s * acs] * b;
      }
      acc *= alpha;
      std::memcpy(c + j, &acc, sizeof acc);
    }
    for (; j < cols; ++j) {
      float acc = 0.0f;
      for (int64_t s = 0; s < inner; ++s) acc += a[s * acs] * B[s * ldb + j];
      c[j] = alpha * acc;
    }
  }
}

// Gathers rows idx[0..n) of x (., width) into y (n, width).
CLUSTR_MEMBER_HELPER void gather(const float* x, int64_t width, const int32_t* idx, int64_t n,
                                 float* y) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < width; ++c) y[r * width + c] = x[idx[r] * width + c];
}

// One step of a 16 x 16 transpose (row i in r[i]): for the rows i and i + h (i without bit h),
// the h x h blocks off the diagonal swap. Steps h = 8, 4, 2, 1 swap each bit of the row index
// with that of the column index: the transpose, in 64 two-vector shuffles.
template <int h>
CLUSTR_MEMBER_HELPER void transpose_step(Lanes r[16]) {
#if defined(__clang__)
  // clang has no __builtin_shuffle with a mask vector (its __builtin_shufflevector takes the
  // lanes as constants): the same swap lane by lane, which it vectorises.
  for (int i = 0; i < 16; ++i)
    if (!(i & h)) {
      const Lanes a = r[i], b = r[i + h];
      for (int j = 0; j < 16; ++j) {
        r[i][j] = (j & h) ? b[j - h] : a[j];
        r[i + h][j] = (j & h) ? b[j] : a[j + h];
      }
    }
#else
  typedef int32_t LaneIndex __attribute__((vector_size(64)));
  LaneIndex lo, hi;  // lanes 16.. name the second vector's
  for (int j = 0; j < 16; ++j) {
    lo[j] = (j & h) ? 16 + j - h : j;
    hi[j] = (j & h) ? 16 + j : j + h;
  }
  for (int i = 0; i < 16; ++i)
    if (!(i & h)) {
      const Lanes a = r[i], b = r[i + h];
      r[i] = __builtin_shuffle(a, b, lo);
      r[i + h] = __builtin_shuffle(a, b, hi);
    }
#endif
}

// Gathers rows idx[0..n) of x (., width) into y (width, n) transposed: 16 x 16 blocks through
// registers, the edges element by element.
CLUSTR_MEMBER_HELPER void gather_transposed(const float* x, int64_t width, const int32_t* idx,
                                            int64_t n, float* y) {
  const int64_t n16 = n / 16 * 16, w16 = width / 16 * 16;
  for (int64_t r0 = 0; r0 < n16; r0 += 16)
    for (int64_t c0 = 0; c0 < w16; c0 += 16) {
      Lanes b[16];
      for (int i = 0; i < 16; ++i) std::memcpy(&b[i], x + idx[r0 + i] * width + c0, sizeof b[i]);
      transpose_step<8>(b);
      transpose_step<4>(b);
      transpose_step<2>(b);
      transpose_step<1>(b);
      for (int i = 0; i < 16; ++i) std::memcpy(y + (c0 + i) * n + r0, &b[i], sizeof b[i]);
    }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = r < n16 ? w16 : 0; c < width; ++c) y[c * n + r] = x[idx[r] * width + c];
}

// P (n, kk) = row softmax of t Qj K_T^T (kt_t: K_T transposed, E x kk): the exact member
// weights on T (eq. 11), kk >= 1.
CLUSTR_MEMBER_HELPER void member_weights(int64_t n, int64_t kk, int64_t E, float t,
                                         const float* qj, const float* kt_t, float* P) {
  small_product(n, kk, E, t, qj, E, 1, kt_t, kk, P, kk);
  for (int64_t r = 0; r < n; ++r) softmax_row(P + r * kk, kk, kk);
}

// The first mask element of member query i of pair bh (improved_clustered.h): after the
// B H C S elements of the clusters' masks, kw per query.
uint64_t member_mask(const Dims& d, int64_t kw, int64_t bh, int64_t i) {
  return static_cast<uint64_t>(d.B * d.H * d.C * d.S + (bh * d.N + i) * kw);
}

// What the members' work of one cluster j reads: the pair's operands and the cluster's set.
struct ClusterWork {
  const float *q, *kb, *v;  // the pair's Q (N, E), K (S, E), V (S, M)
  const int32_t* members;   // the n members, in query order
  const int32_t* T;         // the kk keys of T_j
  int64_t n, kk;
  float mass;               // m_j
};

// eq. 11's first term for the members of one cluster: o_i = m_j softmax_Tj(t q_i K_T^T) V_T +
// R_j (cm_j), written to the members' rows of o (N, M).
CLUSTR_ROW_CLONES
void member_forward(const Dims& d, const Dropout& drop, int64_t kw, int64_t bh, float t,
                    const ClusterWork& c, const float* cm_j, float* o, MemberScratch& w) {
  const int64_t n = c.n, kk = c.kk;
  gather(c.q, d.E, c.members, n, w.qj);
  gather_transposed(c.kb, d.E, c.T, kk, w.ktt);
  gather(c.v, d.M, c.T, kk, w.vt);
  member_weights(n, kk, d.E, t, w.qj, w.ktt, w.P);
  if (drop.on())
    for (int64_t r = 0; r < n; ++r)
      dropout_row(drop, member_mask(d, kw, bh, c.members[r]), kk, w.P + r * kk, w.P + r * kk);
  small_product(n, d.M, kk, c.mass, w.P, kk, 1, w.vt, d.M, w.oj, d.M);
  for (int64_t r = 0; r < n; ++r) {
    float* out = o + c.members[r] * d.M;
    for (int64_t e = 0; e < d.M; ++e) out[e] = w.oj[r * d.M + e] + cm_j[e];
  }
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

// Rows i of x (N, w) with a[i] < 0 (the padded queries) = 0.
void fill_rows_of_padded(const Dims& d, const int32_t* a, int64_t w, float* x) {
  for (int64_t i = 0; i < d.N; ++i)
    if (a[i] < 0) fill(x + i * w, w, 0.0f);
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
  // The members' rows are written below (with keys, every cluster with members has T_j), so
  // only the padded queries' rows need their 0 here.
  if (L == 0) return fill_shared(o, d.N * d.M, 0.0f, inner);
  fill_rows_of_padded(d, a, d.M, o);
  // eq. 11, second term once per cluster: R = (Ac with the T_j columns zeroed) V.
  remainder_weights(d, drop, L, kw, bh, ac, tk, s.acr, nullptr, inner);
  cluster_product(p, false, false, d.C, d.M, L, 1.0f, s.acr, d.S, v, d.M, s.cm, d.M);
  // eq. 11, first term: m_j softmax_Tj(t q_i K_T^T) V_T for the members of each cluster.
#pragma omp parallel for schedule(dynamic) num_threads(team) if (inner)
  for (int64_t j = 0; j < d.C; ++j) {
    const int64_t n = count[j], kk = topk_size(tk + j * kw, kw);
    if (n == 0) continue;
    const ClusterWork c{q, kb, v, m.order + m.start[j], tk + j * kw, n, kk, mass[j]};
    member_forward(d, drop, kw, bh, p.temperature, c, s.cm + j * d.M, o, ms[thread_id()]);
  }
}

// dst rows T[c] += slot[c] (width w) for c < kk.
CLUSTR_MEMBER_HELPER void add_slot(const int32_t* T, int64_t kk, const float* slot, int64_t w,
                                   float* dst) {
  for (int64_t c = 0; c < kk; ++c) {
    const float* src = slot + c * w;
    float* out = dst + static_cast<int64_t>(T[c]) * w;
    for (int64_t e = 0; e < w; ++e) out[e] += src[e];
  }
}

// The top-k part of eq. 11's backward for the members of one cluster (the derivation at the
// top of this file), from the upstream gradient go (N, M): writes the members' rows of dq
// (N, E) and the cluster's contributions to dV_T and dK_T into vslot (kk, M) and kslot (kk, E),
// then adds them into dv and dk when those are given; returns dm_j.
CLUSTR_ROW_CLONES
float member_backward(const Dims& d, const Dropout& drop, int64_t kw, int64_t bh, float t,
                      const ClusterWork& c, const float* go, float* dq, float* vslot,
                      float* kslot, float* dv, float* dk, MemberScratch& w) {
  const int64_t n = c.n, kk = c.kk;
  float *P = w.P, *G = w.G;
  gather(c.q, d.E, c.members, n, w.qj);
  gather(go, d.M, c.members, n, w.oj);
  gather(c.kb, d.E, c.T, kk, w.kt);
  gather_transposed(c.kb, d.E, c.T, kk, w.ktt);
  gather_transposed(c.v, d.M, c.T, kk, w.vtt);
  member_weights(n, kk, d.E, t, w.qj, w.ktt, P);
  small_product(n, kk, d.M, 1.0f, w.oj, d.M, 1, w.vtt, kk, G, kk);  // G = dO V_T^T
  const float* Pv = P;  // the weights that multiply V
  if (drop.on()) {
    for (int64_t r = 0; r < n; ++r)
      for_each_mask_word(drop, member_mask(d, kw, bh, c.members[r]), kk,
                         [&](int64_t l, uint32_t word) {
                           const int64_t x = r * kk + l;
                           w.Pd[x] = math::dropout_value(P[x], word, drop.p, drop.scale);
                           G[x] = math::dropout_value(G[x], word, drop.p, drop.scale);
                         });
    Pv = w.Pd;
  }
  // dV_T = m P^T dO
  small_product(kk, d.M, n, c.mass, Pv, 1, kk, w.oj, d.M, vslot, d.M);
  // dm_j and dZ = m P (G - rowsum(P G)), in place of G.
  float dm = 0.0f;
  for (int64_t r = 0; r < n; ++r) {
    const float dot = cpu::dot_lanes(P + r * kk, G + r * kk, kk);
    dm += dot;
    for (int64_t l = 0; l < kk; ++l)
      G[r * kk + l] = c.mass * P[r * kk + l] * (G[r * kk + l] - dot);
  }
  // dq_i = t dZ_i K_T; dK_T = t dZ^T Qj
  small_product(n, d.E, kk, t, G, kk, 1, w.kt, d.E, w.tq, d.E);
  for (int64_t r = 0; r < n; ++r) {
    float* out = dq + c.members[r] * d.E;
    for (int64_t e = 0; e < d.E; ++e) out[e] = w.tq[r * d.E + e];
  }
  small_product(kk, d.E, n, t, G, 1, kk, w.qj, d.E, kslot, d.E);
  if (dv) add_slot(c.T, kk, vslot, d.M, dv);
  if (dk) add_slot(c.T, kk, kslot, d.E, dk);
  return dm;
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

// y (w) += x / n: a query's share of its centroid's gradient (eq. 4-5's mean).
CLUSTR_ROW_CLONES
void add_scaled_row(const float* x, int32_t n, int64_t w, float* y) {
  const float f = static_cast<float>(n);
  for (int64_t e = 0; e < w; ++e) y[e] += x[e] / f;
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
  fill_shared(dk, d.S * d.E, 0.0f, inner);  // masked keys keep 0; valid rows accumulate below
  fill(dv + L * d.M, (d.S - L) * d.M, 0.0f);
  // The members' rows of dq are written below (as the forward's rows of out), the padded
  // queries' stay 0.
  if (L == 0) return fill_shared(dq, d.N * d.E, 0.0f, inner);
  fill_rows_of_padded(d, a, d.E, dq);

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
    const int32_t* T = tk + j * kw;
    const ClusterWork c{q, kb, v, m.order + m.start[j], T, n, topk_size(T, kw), mass[j]};
    // A cluster's dK_T, dV_T contributions go through its slot; one thread visiting the
    // clusters in order adds them right away.
    float* vslot = s.vslot + (inner ? j : 0) * kw * d.M;
    float* kslot = s.kslot + (inner ? j : 0) * kw * d.E;
    s.dm[j] = member_backward(d, drop, kw, bh, t, c, go, dq, vslot, kslot, inner ? nullptr : dv,
                              inner ? nullptr : dk, ms[thread_id()]);
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
  for (int64_t i = 0; i < d.N; ++i)
    if (a[i] >= 0) add_scaled_row(s.dqc + a[i] * d.E, count[a[i]], d.E, dq + i * d.E);
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
