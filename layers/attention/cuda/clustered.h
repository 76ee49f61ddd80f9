// CUDA kernels of clustered attention for a given clustering (layers/attention/clustered.h,
// eq. 3-6): the twins of clustered.cpp's CPU kernels, on device pointers. Implemented by
// cuda/clustered.cu when clustr has the CUDA backend (a GPU build or device emulation), and by
// no_cuda.cpp otherwise, where every call throws a clear error.
//
// Legend: B batch, H heads, N queries, S keys, E query/key dim, M value dim, C clusters.
//   Q (B, H, N, E), K (B, H, S, E), V (B, H, S, M), out and dout (B, H, N, M), weights Ac
//   (B, H, C, S), centroids Qc (B, H, C, E), all contiguous device arrays.
//   Members of each cluster (device, made by the front door from the assignment): count (B, H,
//   C), start (B, H, C + 1) and order (B, H, N): the queries of cluster j of pair bh, in query
//   order, are order[bh N + start[bh (C + 1) + j] ...] (clustered_common.h's group()).
//   lengths_host (B) is a HOST array or null (the GEMM sizes of each sequence come from it);
//   lengths the same values on the device, or null.
// Semantics, masks, empty clusters and the dropout element numbering are clustered.h's.
#pragma once

#include <cstdint>

#include "core/philox.h"

namespace clustr::cuda {

struct ClusteredDims {
  int64_t B = 0, H = 0, N = 0, S = 0, E = 0, M = 0, C = 0;
};

struct ClusteredParams {
  const int32_t* lengths_host = nullptr;  // (B) host, or null
  const int32_t* lengths = nullptr;       // (B) device, or null
  const int32_t* assignment = nullptr;    // (B, H, N) device, values in [-1, C)
  const int32_t *count = nullptr, *start = nullptr, *order = nullptr;  // device members
  float temperature = 1.0f;               // > 0
  float dropout = 0.0f;                   // p in [0, 1); 0: off
  uint64_t seed = 0;                      // the mask's Philox stream
  PhiloxOffset offset;                    // its first block (device memory when `at`)
  bool bf16 = false;                      // the C x S products with bf16 operands
};

// Floats of device scratch each call needs.
int64_t clustered_attention_forward_workspace(const ClusteredDims& d, const ClusteredParams& p);
int64_t clustered_attention_backward_workspace(const ClusteredDims& d, const ClusteredParams& p);

// out, weights, centroids = (overwritten); eq. 3-6 as clustered_attention_forward.
void clustered_attention_forward(const ClusteredDims& d, const ClusteredParams& p,
                                 const float* Q, const float* K, const float* V, float* out,
                                 float* weights, float* centroids, float* workspace);

// dQ, dK, dV = (overwritten) the gradients of sum(dout * out) for the fixed assignment and the
// forward's dropout mask, as clustered_attention_backward.
void clustered_attention_backward(const ClusteredDims& d, const ClusteredParams& p,
                                  const float* K, const float* V, const float* weights,
                                  const float* centroids, const float* dout, float* dQ,
                                  float* dK, float* dV, float* workspace);

// The members of each cluster from a device assignment (B, H, N), values in [-1, C): count (B, H,
// C), start (B, H, C + 1) and order (B, H, N) as above (=; order's entries past the valid
// queries are 0), the same arrays as clustered_common.h's group() makes on the CPU. count
// holds B H C + B H ints: the last B H (=) are each (batch, head) pair's number of values
// outside [-1, C), which are in no cluster. One launch where N and C are at most
// kGroupInBlock (a block per pair does it all), else three (a fill, the counts, the order).
constexpr int64_t kGroupInBlock = 1024;
void group_members(const ClusteredDims& d, const int32_t* assignment, int32_t* count,
                   int32_t* start, int32_t* order);

}  // namespace clustr::cuda
