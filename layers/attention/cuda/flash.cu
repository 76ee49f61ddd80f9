// Full attention on tensor cores (flash.h gives the contract): FlashAttention-2's forward and
// backward (Dao 2023, Algorithms 1 and 2) written against core/cuda/kernel.h and the fragments of
// core/cuda/mma.h, so the same code runs on a GPU and in device emulation.
//
// Legend: B batch, H heads, N queries, S keys, D = E = M the head size; a warp's tile is 16
// rows; Bq query rows and Bk keys of a block or tile; g = lane / 4, c = lane % 4 (mma.h).
//
// Counting first (one (b, h), N = S, forward): 4 N^2 D flops on tensor cores (Q K^T and P V) and
// N^2 exponentials; memory: Q, K, V read once per query block from L2 (N / Bq passes over K and
// V), out written once. At N = 16384, D = 64, H = 6: 412 GFLOP, on an H100's ~660 dense bf16
// TFLOP/s (mma.sync reaches ~70% of it) about 0.9 ms; K and V in bf16 are 12 MiB, read 128
// times from L2 at Bq = 128: 1.6 GB, ~0.3 ms at L2's ~5 TB/s. Backward: 2.5 times the forward's
// flops in FlashAttention-2's count, 3.5 times here (dQ has its own pass, which recomputes
// Q K^T and dO V^T: the price of having no float atomics).
//
// The products' arithmetic is a policy (Bf16, Tf32 below): bf16 operands on m16n8k16, or f32
// operands on m16n8k8 in TF32, each operand split into a TF32 head and a TF32 tail and three
// products summed (3xTF32: f32's accuracy, the tail of the tail aside, at half the bf16 rate
// over three) or, with cuda::tf32() on, the heads only. bf16 reads bf16 copies of the operands
// (made by the launch before); f32 reads the operands in place, in any head layout.
//
// Forward (FlashForward, one block of 4 warps per query block of Bq = 16 kMT x 4 rows and
// (b, h); each warp owns kMT 16-row tiles): key tiles K_j, V_j of Bk rows stream through two
// shared buffers each by cp.async (the next K_j while this tile's softmax runs, V_j while
// S_j = Q K_j^T is formed). Online softmax in base 2: x = t s log2(e), the running row max m and
// each thread's share of the row sum l, rescaled by 2^(m_old - m_new); P's accumulator fragments
// turn into A fragments in registers for O += P V_j. At the end O / l and
// lse = (m + log2 l) ln 2. Masked keys (lengths, causal) get x = -inf; a row that sees no key
// ends with l = 0: out 0 and lse -inf.
//
// Backward: one grid of two kinds of blocks, both 4 warps. A key block (64 keys, 16 a warp)
// walks the query tiles that can see its keys (from its first key on when causal), recomputes
// S^T = K Q_i^T and P^T = 2^(x - lse log2 e) from the saved logsumexp, dP^T = V dO_i^T,
// dS^T = P^T (dP^T keep / (1 - p) - D) and accumulates dV += (P^T keep / (1 - p)) dO_i and
// dK += dS^T Q_i in registers, written once at the end. A query block (64 rows) walks the key
// tiles its rows see, recomputes S and dP the same way and accumulates dQ += dS K_j. Each
// output element has one writer, so there is no atomic and no N x S buffer. D_i = dO_i . O_i
// (in double) comes from the launch before.
//
// Dropout: the mask of weight (b, h, i, j) is full_cpu.h's Philox word, regenerated where the
// weight is (the forward and the query blocks draw a block of four words for two neighbouring
// keys; the key blocks, whose neighbours are queries S apart, one block per weight).
//
// Files: flash_kernels.h (the shared pieces: arithmetic policies, tiles, operands),
// flash_forward.h (FlashForward), flash_backward.h (FlashBackward); this file makes the bf16
// copies and D, sizes the workspace and launches.
#include "layers/attention/cuda/flash.h"

#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "layers/attention/cuda/flash_backward.h"
#include "layers/attention/cuda/flash_forward.h"
#include "layers/attention/cuda/flash_kernels.h"

namespace clustr::cuda {

namespace {

using namespace flash_kernels;  // NOLINT: the kernels' own namespace, in this file only

// ---- the bf16 copies and D ----

// Up to four f32 tensors of heads (laid out as their Heads say) into contiguous bf16 heads,
// four elements a thread at a time; with out and dout, also D_i = dout_i . out_i (in double,
// one row a thread) for every row of (B, H, N). One grid-stride loop over all of it.
struct Prepare {
  static constexpr bool kUsesBarrier = false;
  Heads<const float> src[4];
  uint16_t* dst[4];
  int64_t rows[4];  // per head: N or S
  int count;
  int64_t B, H, D, N;
  Heads<const float> out, dout;  // out.base null: no D
  float* delta;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t per_row = D / 4;
    int64_t total = 0;
    for (int k = 0; k < count; ++k) total += B * H * rows[k] * per_row;
    const int64_t n_rows = out.base ? B * H * N : 0;
    for (int64_t e = global_x(t); e < total + n_rows; e += grid_stride_x(t)) {
      if (e >= total) {  // D of row (bh, i)
        const int64_t row = e - total, bh = row / N, i = row % N;
        const float* x = out.at(bh / H, bh % H) + i * out.row;
        const float* y = dout.at(bh / H, bh % H) + i * dout.row;
        double acc = 0.0;
        for (int64_t m = 0; m < D; ++m) acc += double(x[m]) * y[m];
        delta[row] = static_cast<float>(acc);
        continue;
      }
      int64_t u = e;
      int k = 0;
      while (u >= B * H * rows[k] * per_row) u -= B * H * rows[k++] * per_row;
      const int64_t chunk = u % per_row, row = u / per_row, i = row % rows[k], bh = row / rows[k];
      const float* x = src[k].at(bh / H, bh % H) + i * src[k].row + 4 * chunk;
      uint16_t* y = dst[k] + row * D + 4 * chunk;
      for (int m = 0; m < 4; ++m) y[m] = float_to_bf16(x[m]);
    }
  }
};

// The workspace: the bf16 copies of Q, K, V (and dO), each a multiple of 32 elements, so every
// copy starts 64-byte aligned, then D.
struct Workspace {
  uint16_t *q, *k, *v, *o;
  float* delta;
};
Workspace workspace_of(float* base, const FullAttentionDims& d, bool bf16, bool backward) {
  const int64_t nq = d.B * d.H * d.N * d.E, nk = d.B * d.H * d.S * d.E;
  Workspace w{};
  auto* h = reinterpret_cast<uint16_t*>(base);
  if (bf16) {
    w.q = h;
    w.k = w.q + nq;
    w.v = w.k + nk;
    w.o = backward ? w.v + nk : nullptr;
    h = w.v + nk + (backward ? nq : 0);
  }
  w.delta = backward ? reinterpret_cast<float*>(h) : nullptr;
  return w;
}

// The f32 operands as the kernels read them, in place.
struct Inputs {
  const float *q, *k, *v, *o;  // o: dout
};

// The launch before the kernels: the bf16 copies (bf16) and D (backward); none for a forward in
// f32.
void prepare(const char* name, const FullAttentionDims& d, const FullAttentionLayout& lay,
             const Workspace& w, const Inputs& in, const float* out) {
  Prepare k{};
  const int count = w.q == nullptr ? 0 : in.o ? 4 : 3;
  if (count == 0 && out == nullptr) return;
  const float* src[4] = {in.q, in.k, in.v, in.o};
  const cpu::HeadStrides strides[4] = {lay.q, lay.k, lay.v, lay.o};
  uint16_t* dst[4] = {w.q, w.k, w.v, w.o};
  const int64_t rows[4] = {d.N, d.S, d.S, d.N};
  for (int i = 0; i < 4; ++i) {
    k.src[i] = heads_of(src[i], strides[i]);
    k.dst[i] = dst[i];
    k.rows[i] = rows[i];
  }
  k.count = count;
  k.B = d.B, k.H = d.H, k.D = d.E, k.N = d.N;
  k.out = heads_of(out, lay.o);
  k.dout = heads_of(in.o, lay.o);
  k.delta = w.delta;
  int64_t work = out ? d.B * d.H * d.N : 0;
  for (int i = 0; i < count; ++i) work += d.B * d.H * rows[i] * d.E / 4;
  launch(name, {elementwise_blocks(work)}, {kElementwiseThreads}, 0, k);
}

template <class Math>
Operands<typename Math::Elem> operands_of(const FullAttentionDims& d,
                                          const FullAttentionLayout& lay,
                                          const FullAttentionParams& p, const int32_t* lengths,
                                          const Workspace& w, const Inputs& in) {
  Operands<typename Math::Elem> a;
  if constexpr (sizeof(typename Math::Elem) == 2) {  // the contiguous bf16 copies
    const cpu::HeadStrides qs = cpu::heads_contiguous(d.H, d.N, d.E);
    const cpu::HeadStrides ks = cpu::heads_contiguous(d.H, d.S, d.E);
    a.q = heads_of<const uint16_t>(w.q, qs);
    a.k = heads_of<const uint16_t>(w.k, ks);
    a.v = heads_of<const uint16_t>(w.v, ks);
    a.o = heads_of<const uint16_t>(w.o, qs);
  } else {  // the f32 inputs in place
    a.q = heads_of(in.q, lay.q);
    a.k = heads_of(in.k, lay.k);
    a.v = heads_of(in.v, lay.v);
    a.o = heads_of(in.o, lay.o);
  }
  a.lengths = lengths;
  a.H = d.H;
  a.N = d.N;
  a.S = d.S;
  a.scale_log2 = p.temperature * kLog2e;
  a.causal = p.causal;
  a.drop = dropout_of(p);
  return a;
}

template <class Math, int D>
void forward_for(const FullAttentionDims& d, const FullAttentionLayout& lay,
                 const Operands<typename Math::Elem>& a, float* out, float* logsumexp) {
  using K = FlashForward<Math, D>;
  const int64_t q_blocks = (d.N + K::kBq - 1) / K::kBq;
  launch("cuda::flash_attention_forward", {static_cast<unsigned>(d.B * d.H * q_blocks)},
         {kThreads}, K::kShared, K{a, heads_of(out, lay.o), logsumexp, q_blocks});
}

template <class Math, int D>
void backward_for(const FullAttentionDims& d, const FullAttentionLayout& lay,
                  const Operands<typename Math::Elem>& a, const Workspace& w,
                  const float* logsumexp, float* dQ, float* dK, float* dV, float temperature) {
  using K = FlashBackward<Math, D>;
  const int64_t key_blocks = (d.S + K::kKeys - 1) / K::kKeys;
  const int64_t row_blocks = (d.N + K::kRows - 1) / K::kRows;
  launch("cuda::flash_attention_backward",
         {static_cast<unsigned>(d.B * d.H * (key_blocks + row_blocks))}, {kThreads}, K::kShared,
         K{a, logsumexp, w.delta, heads_of(dQ, lay.q), heads_of(dK, lay.k), heads_of(dV, lay.v),
           temperature, key_blocks, row_blocks});
}

// Calls f.template operator()<Math, D>() for the call's policy and head size.
template <class F>
auto dispatch(const FullAttentionDims& d, const FullAttentionParams& p, F f) {
  auto by_size = [&](auto math) {
    using Math = decltype(math);
    switch (d.E) {
      case 32: return f.template operator()<Math, 32>();
      case 64: return f.template operator()<Math, 64>();
      default: return f.template operator()<Math, 128>();
    }
  };
  if (p.bf16) return by_size(Bf16{});
  if (tf32()) return by_size(Tf32<false>{});
  return by_size(Tf32<true>{});
}

// The most shared memory a block of the call's kernels takes.
struct SharedNeeded {
  template <class Math, int D>
  size_t operator()() const {
    const size_t f = FlashForward<Math, D>::kShared, b = FlashBackward<Math, D>::kShared;
    return f > b ? f : b;
  }
};

// The kernels of one call, for dispatch.
struct ForwardRun {
  const FullAttentionDims& d;
  const FullAttentionLayout& lay;
  const FullAttentionParams& p;
  const int32_t* lengths;
  const Workspace& w;
  const Inputs& in;
  float *out, *logsumexp;
  template <class Math, int D>
  void operator()() const {
    forward_for<Math, D>(d, lay, operands_of<Math>(d, lay, p, lengths, w, in), out, logsumexp);
  }
};
struct BackwardRun {
  const FullAttentionDims& d;
  const FullAttentionLayout& lay;
  const FullAttentionParams& p;
  const int32_t* lengths;
  const Workspace& w;
  const Inputs& in;
  const float* logsumexp;
  float *dQ, *dK, *dV;
  template <class Math, int D>
  void operator()() const {
    backward_for<Math, D>(d, lay, operands_of<Math>(d, lay, p, lengths, w, in), w, logsumexp, dQ,
                          dK, dV, p.temperature);
  }
};

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool rows_aligned(const cpu::HeadStrides& s) {
  return s.batch % 4 == 0 && s.head % 4 == 0 && s.row % 4 == 0;
}

}  // namespace

bool flash_attention_applies(const FullAttentionDims& d, const FullAttentionLayout& lay,
                             const FullAttentionParams& p,
                             std::initializer_list<const float*> tensors) {
  if (d.E != d.M || (d.E != 32 && d.E != 64 && d.E != 128)) return false;
  if (d.N < 1 || d.S < 1 || !available()) return false;
  // The f32 kernels copy the operands' rows in place with 16-byte cp.async.
  if (!p.bf16) {
    for (const float* t : tensors)
      if (!aligned(t)) return false;
    if (!rows_aligned(lay.q) || !rows_aligned(lay.k) || !rows_aligned(lay.v) ||
        !rows_aligned(lay.o))
      return false;
  }
  const DeviceInfo& info = device_info();
  // The grids are 1-D: (b, h, block) in x, below 2^31.
  const int64_t blocks = d.B * d.H * ((d.N + 63) / 64 + (d.S + 63) / 64 + 1);
  return info.capability >= 80 && blocks < (int64_t(1) << 31) &&
         info.max_shared_per_block >= dispatch(d, p, SharedNeeded{});
}

int64_t flash_attention_forward_workspace(const FullAttentionDims& d,
                                          const FullAttentionParams& p) {
  return p.bf16 ? (d.B * d.H * (d.N + 2 * d.S) * d.E + 1) / 2 : 0;
}
int64_t flash_attention_backward_workspace(const FullAttentionDims& d,
                                           const FullAttentionParams& p) {
  return (p.bf16 ? d.B * d.H * (d.N + d.S) * d.E : 0) + d.B * d.H * d.N;
}

void flash_attention_forward(const FullAttentionDims& d, const FullAttentionLayout& lay,
                             const FullAttentionParams& p, const int32_t* lengths, const float* Q,
                             const float* K, const float* V, float* out, float* logsumexp,
                             float* workspace) {
  CLUSTR_CHECK(flash_attention_applies(d, lay, p, {Q, K, V, out}),
               "cuda::flash_attention_forward: not for this call");
  const Workspace w = workspace_of(workspace, d, p.bf16, false);
  const Inputs in{Q, K, V, nullptr};
  prepare("cuda::flash_attention_forward (bf16 copies)", d, lay, w, in, nullptr);
  dispatch(d, p, ForwardRun{d, lay, p, lengths, w, in, out, logsumexp});
}

void flash_attention_backward(const FullAttentionDims& d, const FullAttentionLayout& lay,
                              const FullAttentionParams& p, const int32_t* lengths,
                              const float* Q, const float* K, const float* V, const float* out,
                              const float* logsumexp, const float* dout, float* dQ, float* dK,
                              float* dV, float* workspace) {
  CLUSTR_CHECK(flash_attention_applies(d, lay, p, {Q, K, V, out, dout, dQ, dK, dV}),
               "cuda::flash_attention_backward: not for this call");
  const Workspace w = workspace_of(workspace, d, p.bf16, true);
  const Inputs in{Q, K, V, dout};
  prepare("cuda::flash_attention_backward (bf16 copies, D)", d, lay, w, in, out);
  dispatch(d, p, BackwardRun{d, lay, p, lengths, w, in, logsumexp, dQ, dK, dV});
}

}  // namespace clustr::cuda
