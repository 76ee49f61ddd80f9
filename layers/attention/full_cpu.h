// CPU kernels of the fused full softmax attention (layers/attention/full.h): raw pointers, no
// validation (the front doors in full.cpp did it), OpenMP inside.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim; Bq rows of a query
// block, Bk columns of a key tile.
//   Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M), out and dout (B, H, N, M), each stored
//   as its FullAttentionLayout says; logsumexp (B, H, N), lengths i32 (B) or null.
// A query row i of sequence b sees the keys j < lengths[b] (all S when lengths is null) and,
// with causal, j <= i. With lengths and N == S, rows i >= lengths[b] are padding. A padded row,
// or a row that sees no key, has out = 0 and logsumexp = -inf, and gets and gives no gradient.
//
// How (FlashAttention-2, Dao 2023, on the CPU): a task is one query block of one (b, h); it
// walks the key tiles with an online softmax, so scratch is O(Bq x Bk) per thread and no N x S
// matrix exists. Products go through cpu::gemm on one thread per task. Backward recomputes each
// tile of weights from Q, K and the saved logsumexp.
// Deterministic at any thread count (docs/ARCHITECTURE.md, "Threads and determinism"): dK and
// dV, sums over query blocks, go through fixed chunks (full_attention_backward_chunks).
#pragma once

#include <cstdint>

#include "core/philox.h"

namespace clustr::cpu {

struct FullAttentionDims {
  int64_t B = 0, H = 0, N = 0, S = 0, E = 0, M = 0;
};

// Where the heads of a tensor live: row i of head (b, h) starts at element
//   b * batch + h * head + i * row.
// A contiguous (B, H, N, E) tensor has {H N E, N E, E} (heads_contiguous). The heads of a
// projection's output (B, N, H E), side by side in each token's row of `ld` elements, have
// {N ld, E, ld} (heads_interleaved): attention then reads and writes the projections in place,
// with no permute.
struct HeadStrides {
  int64_t batch = 0, head = 0, row = 0;
  int64_t at(int64_t b, int64_t h) const { return b * batch + h * head; }
};
inline HeadStrides heads_contiguous(int64_t H, int64_t rows, int64_t width) {
  return {H * rows * width, rows * width, width};
}
inline HeadStrides heads_interleaved(int64_t rows, int64_t width, int64_t ld) {
  return {rows * ld, width, ld};
}
// Q and dQ use q, K and dK use k, V and dV use v, out and dout use o.
struct FullAttentionLayout {
  HeadStrides q, k, v, o;
};
// The layout of contiguous (B, H, N, E), (B, H, S, E), (B, H, S, M) and (B, H, N, M) tensors.
inline FullAttentionLayout contiguous_layout(const FullAttentionDims& d) {
  return {heads_contiguous(d.H, d.N, d.E), heads_contiguous(d.H, d.S, d.E),
          heads_contiguous(d.H, d.S, d.M), heads_contiguous(d.H, d.N, d.M)};
}

struct FullAttentionParams {
  const int32_t* lengths = nullptr;  // (B), values in [0, S], or null
  bool causal = false;               // needs N == S
  float temperature = 1.0f;          // > 0: logits = temperature * q . k
  float dropout = 0.0f;              // in [0, 1)
  uint64_t seed = 0;                 // dropout: element idx = ((b H + h) N + i) S + j keeps
  PhiloxOffset offset;               // when uint_to_unit(philox4x32(seed, offset +
                                     // idx/4).v[idx%4]) >= dropout, and is then scaled by
                                     // 1 / (1 - dropout); offset read on the device when `at`
  bool bf16 = false;                 // the products read their operands rounded to bf16
};

// Floats of scratch (`workspace` below) each kernel needs when run on `threads` threads.
int64_t full_attention_forward_workspace(const FullAttentionDims& d, int threads);
int64_t full_attention_backward_workspace(const FullAttentionDims& d, int threads);

// Per (b, h): how many chunks the query blocks are split into for backward (each chunk sums its
// own dK, dV; the chunks are then added in order). Depends on the shape only, never on threads.
int64_t full_attention_backward_chunks(const FullAttentionDims& d);

// out, logsumexp = (overwritten). eq. 1-2: out_i = sum_j softmax_j(t q_i . k_j) v_j (with the
// dropout mask applied to the normalised weights); logsumexp_i = log sum_j exp(t q_i . k_j).
// Only out's head rows are written (with an interleaved layout, other columns keep their values).
void full_attention_forward(const FullAttentionDims& d, const FullAttentionLayout& lay,
                            const FullAttentionParams& p, const float* Q, const float* K,
                            const float* V, float* out, float* logsumexp, float* workspace,
                            int threads);

// dQ, dK, dV = (overwritten) the gradients of sum(dout * out), given the forward's out and
// logsumexp:
//   P = exp(t Q K^T - lse) (masked), Pd = P * keep / (1 - p), dV = Pd^T dO,
//   dP = keep / (1 - p) * (dO V^T), D_i = dO_i . O_i, dS = P (dP - D), dQ = t dS K,
//   dK = t dS^T Q.
void full_attention_backward(const FullAttentionDims& d, const FullAttentionLayout& lay,
                             const FullAttentionParams& p, const float* Q, const float* K,
                             const float* V, const float* out, const float* logsumexp,
                             const float* dout, float* dQ, float* dK, float* dV, float* workspace,
                             int threads);

}  // namespace clustr::cpu
