// CUDA kernels of improved clustered attention for a given clustering
// (layers/attention/improved_clustered.h, eq. 9-11; supplementary eq. 13-17): the twins of
// improved_clustered_cpu.cpp's CPU kernels, on device pointers. Implemented by
// cuda/improved_clustered.cu when clustr has the CUDA backend (a GPU build or device
// emulation), and by no_cuda.cpp otherwise, where every call throws.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters, k the
// top keys per cluster, kw = min(k, S) the saved width.
//   Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M), out and dout (B, H, N, M), weights Ac
//   (B, H, C, S), centroids Qc (B, H, C, E), topk i32 (B, H, C, kw) (T_j in ascending key order,
//   -1 padded), mass (B, H, C), all contiguous device arrays. The members, lengths, temperature
//   and dropout stream come as for clustered attention (cuda/clustered.h's ClusteredParams).
// Semantics, masks, empty clusters, the top-k rule and the dropout element numbering are
// improved_clustered.h's.
#pragma once

#include <cstdint>

#include "layers/attention/cuda/clustered.h"

namespace clustr::cuda {

// Floats of device scratch each call needs.
int64_t improved_clustered_attention_forward_workspace(const ClusteredDims& d, int64_t kw,
                                                       const ClusteredParams& p);
int64_t improved_clustered_attention_backward_workspace(const ClusteredDims& d, int64_t kw,
                                                        const ClusteredParams& p);

// out, weights, centroids, topk, mass = (overwritten); eq. 3-5 and 9-11 as
// improved_clustered_attention_forward. topk >= 1.
void improved_clustered_attention_forward(const ClusteredDims& d, const ClusteredParams& p,
                                          int64_t topk, int64_t kw, const float* Q,
                                          const float* K, const float* V, float* out,
                                          float* weights, float* centroids, int32_t* tk,
                                          float* mass, float* workspace);

// dQ, dK, dV = (overwritten) the gradients of sum(dout * out) for the fixed assignment, the
// forward's top-k sets and its dropout masks, as improved_clustered_attention_backward.
void improved_clustered_attention_backward(const ClusteredDims& d, const ClusteredParams& p,
                                           int64_t kw, const float* Q, const float* K,
                                           const float* V, const float* weights,
                                           const float* centroids, const int32_t* tk,
                                           const float* mass, const float* dout, float* dQ,
                                           float* dK, float* dV, float* workspace);

}  // namespace clustr::cuda
