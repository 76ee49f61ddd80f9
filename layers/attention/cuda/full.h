// CUDA kernels of the fused full softmax attention (layers/attention/full.h): the twins of
// full_cpu.h's, on device pointers. Implemented by cuda/full.cu when clustr has the CUDA backend
// (a GPU build or device emulation), and by no_cuda.cpp otherwise, where every call throws
// a clear error.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim.
//   Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M), out and dout (B, H, N, M), logsumexp
//   (B, H, N), all contiguous (the fused projection layout of the qkv variant is permuted into
//   these by the front door, full.cpp); p.lengths is a HOST array (B) or null: the GEMM sizes of
//   each sequence come from it.
// Semantics, masks, the logsumexp of empty rows (-inf) and the dropout element numbering are
// those of full_cpu.h.
#pragma once

#include <cstdint>

#include "layers/attention/full_cpu.h"

namespace clustr::cuda {

// Floats of device scratch each kernel needs (the score blocks; cuda/full.cu).
int64_t full_attention_forward_workspace(const cpu::FullAttentionDims& d);
int64_t full_attention_backward_workspace(const cpu::FullAttentionDims& d);

// out, logsumexp = (overwritten); eq. 1-2, as cpu::full_attention_forward.
void full_attention_forward(const cpu::FullAttentionDims& d, const cpu::FullAttentionParams& p,
                            const float* Q, const float* K, const float* V, float* out,
                            float* logsumexp, float* workspace);

// dQ, dK, dV = (overwritten) the gradients of sum(dout * out), as cpu::full_attention_backward.
void full_attention_backward(const cpu::FullAttentionDims& d, const cpu::FullAttentionParams& p,
                             const float* Q, const float* K, const float* V, const float* out,
                             const float* logsumexp, const float* dout, float* dQ, float* dK,
                             float* dV, float* workspace);

}  // namespace clustr::cuda
