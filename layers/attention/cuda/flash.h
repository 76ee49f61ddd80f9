// Full softmax attention on tensor cores: FlashAttention-2's algorithm (Dao 2023) as one fused
// kernel per direction, for the head sizes E == M of 32, 64 or 128 on a GPU of compute
// capability 8.0 or later: bf16 products (p.bf16) on bf16 tensor-core instructions; f32 products
// on TF32 ones, each operand split in two (3xTF32: f32's accuracy, see flash.cu) or, with
// cuda::tf32() on, rounded once to TF32. cuda/full.cu's blocked kernels take every other call
// (other head sizes, older GPUs). Implemented by flash.cu when clustr has the CUDA backend (a GPU
// build or device emulation), and by no_cuda.cpp otherwise.
//
// Legend: B batch, H heads, N queries, S keys, E = M the head size.
//   Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M), out and dout (B, H, N, M), each stored as
//   its cpu::FullAttentionLayout says (the fused projection's interleaved heads too);
//   logsumexp (B, H, N); lengths: a DEVICE array (B) or null.
// Semantics, masks, the logsumexp of empty rows (-inf), the dropout element numbering and the
// bf16 policy (products of operands rounded to bf16, f32 sums; softmax, logsumexp and dropout in
// f32) are those of cuda/full.h and full_cpu.h. The weights are rounded to bf16 before their
// unnormalised product with V (each key tile's exp(s - running max)), not after normalising:
// the same rounding error, from one more place.
//
// Launches, for any B, H and N, and no cuBLAS call: bf16 forward 2 (the bf16 copies of Q, K and
// V; the attention), backward 2 (the bf16 copies of Q, K, V and dout with D_i = dout_i . out_i;
// dK and dV, and dQ, in one grid); f32 forward 1, backward 2 (D; the grid). No float atomics:
// the results are the same run after run.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "layers/attention/full_cpu.h"

namespace clustr::cuda {

// Whether the fused kernels take a call of these sizes, layout and parameters on the current GPU;
// tensors: the call's f32 tensors, whose rows the f32 kernels copy in place (16-byte aligned
// rows needed).
bool flash_attention_applies(const cpu::FullAttentionDims& d, const cpu::FullAttentionLayout& lay,
                             const cpu::FullAttentionParams& p,
                             std::initializer_list<const float*> tensors);

// Floats of device scratch each direction needs (the bf16 copies; backward also D).
int64_t flash_attention_forward_workspace(const cpu::FullAttentionDims& d,
                                          const cpu::FullAttentionParams& p);
int64_t flash_attention_backward_workspace(const cpu::FullAttentionDims& d,
                                           const cpu::FullAttentionParams& p);

// out, logsumexp = (overwritten), for a call flash_attention_applies to.
void flash_attention_forward(const cpu::FullAttentionDims& d, const cpu::FullAttentionLayout& lay,
                             const cpu::FullAttentionParams& p, const int32_t* lengths,
                             const float* Q, const float* K, const float* V, float* out,
                             float* logsumexp, float* workspace);

// dQ, dK, dV = (overwritten) the gradients of sum(dout * out), as cuda::full_attention_backward.
void flash_attention_backward(const cpu::FullAttentionDims& d,
                              const cpu::FullAttentionLayout& lay,
                              const cpu::FullAttentionParams& p, const int32_t* lengths,
                              const float* Q, const float* K, const float* V, const float* out,
                              const float* logsumexp, const float* dout, float* dQ, float* dK,
                              float* dV, float* workspace);

}  // namespace clustr::cuda
