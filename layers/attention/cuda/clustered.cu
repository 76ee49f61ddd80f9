// CUDA kernels of clustered attention for a given clustering (cuda/clustered.h gives the
// contract, clustered.h the semantics). Written against core/cuda/kernel.h, so the same code
// runs on a GPU and in device emulation.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters; L the
// valid keys of a sequence (lengths[b], or S).
//   vc, dvc (B, H, C, M), ds and ad (B, H, C, S), dqc (B, H, C, E): scratch.
//
// How: the products are cuBLAS strided-batched GEMMs over the heads of one sequence, sized by
// its L (over all B H pairs at once without lengths), so masked keys take no part in any
// product and whatever padded K, V hold cannot leak into a result, as on the CPU. Own kernels
// do the rest: the per-cluster sums over members (eq. 4-5 and dVc) in query order, as the CPU
// sums them; the masked softmax of eq. 3 with the dropout mask (one CUDA block per row of Ac);
// the broadcast of eq. 6 and of dQ_i = dQc_j / |j|; and in backward one row kernel for the mask
// and the softmax gradient. dK and dV come whole from one GEMM each (a sum over clusters), so
// nothing is accumulated across launches and there are no float atomics: results do not depend
// on timing. The kernels and helpers, shared with improved clustered attention, are in
// cuda/clustered_kernels.h.
#include "layers/attention/cuda/clustered.h"

#include "core/cuda/scratch.h"
#include "layers/attention/cuda/clustered_kernels.h"

namespace clustr::cuda {

using namespace clustered_kernels;

int64_t clustered_attention_forward_workspace(const ClusteredDims& d, const ClusteredParams& p) {
  const int64_t pairs_c = d.B * d.H * d.C;
  return pairs_c * d.M + (p.dropout > 0.0f ? pairs_c * d.S : 0);
}
int64_t clustered_attention_backward_workspace(const ClusteredDims& d, const ClusteredParams& p) {
  const int64_t pairs_c = d.B * d.H * d.C;
  return pairs_c * (d.M + d.S + d.E) + (p.dropout > 0.0f ? pairs_c * d.S : 0);
}

void clustered_attention_forward(const ClusteredDims& d, const ClusteredParams& p,
                                 const float* Q, const float* K, const float* V, float* out,
                                 float* weights, float* centroids, float* workspace) {
  const int64_t BH = d.B * d.H, H = d.H, N = d.N, S = d.S, M = d.M, C = d.C;
  if (BH == 0 || C == 0) return;
  require("cuda::clustered_attention_forward");
  const Dropout drop = dropout_of(p);
  float* vc = workspace;
  float* ad = drop.on() ? workspace + BH * C * M : nullptr;
  // eq. 4-5: Qc; eq. 3: Ac = softmax(t Qc K^T + mask)
  centroid_logits("cuda::clustered_attention_forward (centroids)", d, p, Q, K, centroids,
                  weights);
  const unsigned threads = row_threads(S);
  if (S > 0)
    launch("cuda::clustered_attention_forward (weights)", {grid_of(BH * C)}, {threads},
           threads * sizeof(double),
           WeightsRowsKernel{weights, ad, p.count, p.lengths, H, C, S, drop});
  // Vc = Ac V (Ac D / (1 - p) with dropout)
  const float* w = drop.on() ? ad : weights;
  for_each_sequence(d, p, [&](int64_t b0, int64_t nb, int64_t L) {
    product(p.bf16, false, false, C, M, L, 1.0f, w + b0 * H * C * S, S, C * S,
            V + b0 * H * S * M, M, S * M, vc + b0 * H * C * M, M, C * M, nb * H);
  });
  // eq. 6: out_i = Vc_{j(i)}
  const int64_t total = BH * N * M;
  launch("cuda::clustered_attention_forward (broadcast)", {elementwise_blocks(total)},
         {kElementwiseThreads}, 0,
         BroadcastKernel{vc, out, p.assignment, p.count, p.lengths, H, N, S, C, M, total, false});
}

void clustered_attention_backward(const ClusteredDims& d, const ClusteredParams& p,
                                  const float* K, const float* V, const float* weights,
                                  const float* centroids, const float* dout, float* dQ,
                                  float* dK, float* dV, float* workspace) {
  const int64_t BH = d.B * d.H, H = d.H, N = d.N, S = d.S, E = d.E, M = d.M, C = d.C;
  // Masked keys get no gradient: the GEMMs below write only the first L rows of dK and dV.
  if (some_keys_masked(d, p)) {
    fill_f32(dK, 0.0f, BH * S * E);
    fill_f32(dV, 0.0f, BH * S * M);
  }
  if (BH == 0 || C == 0) return;
  require("cuda::clustered_attention_backward");
  const Dropout drop = dropout_of(p);
  float* dvc = workspace;
  float* ds = dvc + BH * C * M;
  float* dqc = ds + BH * C * S;
  float* ad = drop.on() ? dqc + BH * C * E : nullptr;
  // dVc_j = sum_{i in j} dO_i; dAc = dVc V^T
  cluster_value_grads("cuda::clustered_attention_backward (member sums)", d, p, dout, V, dvc, ds);
  // The mask on Ac and dAc, then dS = Ac (dAc - rowsum(dAc Ac))
  const unsigned threads = row_threads(S);
  if (S > 0)
    launch("cuda::clustered_attention_backward (rows)", {grid_of(BH * C)}, {threads},
           threads * sizeof(double),
           BackwardRowsKernel{weights, ds, ad, p.lengths, H, C, S, drop});
  const float* w = drop.on() ? ad : weights;
  const float t = p.temperature;
  for_each_sequence(d, p, [&](int64_t b0, int64_t nb, int64_t L) {
    const int64_t bc = b0 * H * C, batch = nb * H;
    // dV = (Ac D r)^T dVc, dQc = t dS K, dK = t dS^T Qc
    product(p.bf16, true, false, L, M, C, 1.0f, w + bc * S, S, C * S, dvc + bc * M, M, C * M,
            dV + b0 * H * S * M, M, S * M, batch);
    const auto ds16 = bf16_operand(p.bf16, ds + bc * S, C, L, S, C * S, batch);  // read twice
    product(p.bf16, false, false, C, E, L, t, ds + bc * S, S, C * S, K + b0 * H * S * E, E, S * E,
            dqc + bc * E, E, C * E, batch, 0.0f, ds16.get());
    product(p.bf16, true, false, L, E, C, t, ds + bc * S, S, C * S, centroids + bc * E, E, C * E,
            dK + b0 * H * S * E, E, S * E, batch, 0.0f, ds16.get());
  });
  // dQ_i = dQc_{j(i)} / |j(i)| (through the mean of eq. 4-5)
  const int64_t total = BH * N * E;
  launch("cuda::clustered_attention_backward (broadcast)", {elementwise_blocks(total)},
         {kElementwiseThreads}, 0,
         BroadcastKernel{dqc, dQ, p.assignment, p.count, p.lengths, H, N, S, C, E, total, true});
}

namespace {

struct AddInt {
  CLUSTR_HD int operator()(int a, int b) const { return a + b; }
};

// The whole grouping of a small pair (N, C <= kGroupInBlock) in one block, block p for pair p:
// its assignment copied to shared memory, its clusters counted there (integer atomics: exact in
// any order), the counts scanned into starts (each thread a contiguous span of clusters), and
// each member placed at its cluster's start + the members of that cluster before it in query
// order (a count over the earlier queries: N^2 / threads comparisons, little at this size); the
// slots past the members 0, as on the CPU. Also each pair's count of values outside [-1, C).
// Shared: N + C + block_dim ints.
struct GroupInBlockKernel {
  static constexpr bool kUsesBarrier = true;
  const int32_t* a;
  int32_t* count;    // (B H C)
  int32_t* outside;  // (B H)
  int32_t* start;    // (B H (C + 1))
  int32_t* order;    // (B H N)
  int64_t N, C;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t p = t.block_idx().x;
    const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
    int* sa = t.shared<int>();  // the pair's assignment (N), then the clusters' starts (C)
    int* first = sa + N;
    int* scratch = first + C;
    for (int64_t i = tid; i < N; i += nt) sa[i] = a[p * N + i];
    for (int64_t j = tid; j < C; j += nt) first[j] = 0;
    t.sync();
    int bad = 0;
    for (int64_t i = tid; i < N; i += nt) {
      const int j = sa[i];
      if (j < -1 || j >= C)
        ++bad;
      else if (j >= 0)
        atomic_add(first + j, 1);
    }
    bad = block_reduce(t, bad, scratch, AddInt{});  // its barriers also end the counting
    if (tid == 0) outside[p] = bad;
    const auto [c0, c1] = block_span(t, C);
    int mine = 0;
    for (int64_t c = c0; c < c1; ++c) {
      count[p * C + c] = first[c];
      mine += first[c];
    }
    int at = block_exclusive_sum(t, mine, scratch);
    for (int64_t c = c0; c < c1; ++c) {
      const int n = first[c];
      start[p * (C + 1) + c] = first[c] = at;
      at += n;
    }
    if (tid == nt - 1) {  // after the last span: every member
      start[p * (C + 1) + C] = at;
      scratch[0] = at;
    }
    t.sync();
    const int members = scratch[0];
    for (int64_t i = tid; i < N; i += nt) {
      const int j = sa[i];
      if (j < 0 || j >= C) continue;
      int rank = 0;
      for (int64_t k = 0; k < i; ++k) rank += sa[k] == j;
      order[p * N + first[j] + rank] = static_cast<int32_t>(i);
    }
    for (int64_t i = members + tid; i < N; i += nt) order[p * N + i] = 0;
  }
};

// Larger pairs, in three launches. count[p C + j] += 1 for each query of pair p in cluster j: a
// thread per query, integer atomics (exact in any order). Also counts the values outside
// [-1, C) into outside[p], and zeroes order[q] (the slots of padded queries, which no member
// fills, are then 0 as on the CPU).
struct CountMembersKernel {
  static constexpr bool kUsesBarrier = false;
  const int32_t* a;
  int32_t* count;    // (B H C), zeroed before
  int32_t* outside;  // (B H), zeroed before
  int32_t* order;    // (B H N)
  int64_t N, C, total;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t q = global_x(t); q < total; q += grid_stride_x(t)) {
      order[q] = 0;
      const int32_t j = a[q];
      if (j < -1 || j >= C)
        atomic_add(outside + q / N, 1);
      else if (j >= 0)
        atomic_add(count + (q / N) * C + j, 1);
    }
  }
};

// order and start: one CUDA block per (pair p, cluster j) = block p C + j. The block adds the
// counts of the pair's clusters before j (start[p (C + 1) + j], which it writes, and the last
// cluster's block the pair's total too); each thread owns a contiguous span of the pair's
// queries and writes the members of j among them at start + the members in the spans before
// its own, so the members come in query order. Shared: block_dim ints.
struct MemberOrderKernel {
  static constexpr bool kUsesBarrier = true;
  const int32_t* a;
  const int32_t* count;
  int32_t* start;
  int32_t* order;
  int64_t N, C;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t p = t.block_idx().x / C, j = t.block_idx().x % C;
    int* scratch = t.shared<int>();
    int before = 0;
    for (int64_t c = t.thread_idx().x; c < j; c += t.block_dim().x) before += count[p * C + c];
    const int base = block_reduce(t, before, scratch, AddInt{});  // integers: exact
    if (t.thread_idx().x == 0) {
      start[p * (C + 1) + j] = base;
      if (j == C - 1) start[p * (C + 1) + C] = base + count[p * C + j];
    }
    const int32_t* ap = a + p * N;
    const auto [i0, i1] = block_span(t, N);
    int n = 0;
    for (int64_t i = i0; i < i1; ++i) n += ap[i] == j;
    int64_t at = base + block_exclusive_sum(t, n, scratch);
    for (int64_t i = i0; i < i1; ++i)
      if (ap[i] == j) order[p * N + at++] = static_cast<int32_t>(i);
  }
};

}  // namespace

void group_members(const ClusteredDims& d, const int32_t* assignment, int32_t* count,
                   int32_t* start, int32_t* order) {
  const int64_t BH = d.B * d.H, total = BH * d.N;
  require("cuda::group_members");
  if (BH == 0) return;
  int32_t* const outside = count + BH * d.C;
  if (d.N <= kGroupInBlock && d.C <= kGroupInBlock) {
    const unsigned threads = row_threads(d.N);
    launch("cuda::group_members", {grid_of(BH)}, {threads},
           static_cast<size_t>(d.N + d.C + threads) * sizeof(int),
           GroupInBlockKernel{assignment, count, outside, start, order, d.N, d.C});
    return;
  }
  fill_i32(count, 0, BH * (d.C + 1));
  launch("cuda::group_members (counts)", {elementwise_blocks(total)}, {kElementwiseThreads}, 0,
         CountMembersKernel{assignment, count, outside, order, d.N, d.C, total});
  const unsigned threads = row_threads(d.N);
  launch("cuda::group_members (order)", {grid_of(BH * d.C)}, {threads}, threads * sizeof(int),
         MemberOrderKernel{assignment, count, start, order, d.N, d.C});
}

}  // namespace clustr::cuda
