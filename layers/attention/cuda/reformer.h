// CUDA kernels of lsh and shared-full attention (layers/attention/reformer.h): the twins of
// reformer.cpp's CPU kernels, on device pointers. Implemented by cuda/reformer.cu when clustr has
// the CUDA backend (a GPU build or device emulation), and by no_cuda.cpp otherwise, where every
// call throws a clear error.
//
// Legend: B batch, H heads, N positions, E query/key dim, M value dim, X rounds, R buckets per
// round, m the chunk.
//   Q (B, H, N, E), V (B, H, N, M), out and dout (B, H, N, M), rotations (X, E, R / 2) (null
//   when R = 1), order (B, H, X, N) i32, logsumexp (B, H, N), all contiguous device arrays;
//   lengths (B) device or null.
// Semantics, the sort, the chunks and the self rule are reformer.h's.
#pragma once

#include <cstdint>

namespace clustr::cuda {

struct ReformerDims {
  int64_t B = 0, H = 0, N = 0, E = 0, M = 0, X = 1, R = 1, m = 1;
};

// The attention dropout of a call (reformer.h's mask; off when p is 0; scale = 1 / (1 - p)).
struct ReformerDropout {
  float p = 0.0f, scale = 1.0f;
  uint64_t seed = 0, offset = 0;
};

// out, order and logsumexp = (overwritten) the forward of reformer_attention_forward.
void reformer_attention_forward(const ReformerDims& d, const int32_t* lengths, float temperature,
                                const ReformerDropout& dropout, const float* Q, const float* V, const float* rotations, float* out,
                                int32_t* order, float* logsumexp);

// dQ, dV = (overwritten) the gradients of sum(dout * out) for the forward's order.
void reformer_attention_backward(const ReformerDims& d, const int32_t* lengths, float temperature,
                                 const ReformerDropout& dropout, const float* Q, const float* V, const float* out,
                                 const int32_t* order, const float* logsumexp, const float* dout,
                                 float* dQ, float* dV);

// buckets (B, H, X, N) = (overwritten) each position's bucket per round, -1 where padded.
void reformer_buckets(const ReformerDims& d, const int32_t* lengths, const float* Q,
                      const float* rotations, int32_t* buckets);

}  // namespace clustr::cuda
