// Index arithmetic, and the strided copy built on it, shared by the CUDA layout and shape
// kernels (layout.cu: permute; shape_ops.cu: broadcast_to).
#pragma once

#include <cstdint>

#include "core/cuda/kernel.h"

namespace clustr::cuda {

// The offset sum_d idx_d(i) * stride[d] of element i of a row-major array of the given shape
// (rank axes, the last innermost).
CLUSTR_DEVICE int64_t strided_offset(int64_t i, int rank, const int64_t* shape,
                                     const int64_t* stride) {
  int64_t rem = i, off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    const int64_t idx = rem % shape[d];
    rem /= shape[d];
    off += idx * stride[d];
  }
  return off;
}

// y (n) = x read through the output's axes: y[i] = x[sum_d idx_d(i) * stride[d]] (a stride 0
// repeats x along an axis), rank <= MaxRank. Copies 4-byte words, so f32 and i32 alike.
template <int MaxRank>
struct StridedCopyKernel {
  static constexpr bool kUsesBarrier = false;
  const uint32_t* x;
  uint32_t* y;
  int64_t n;
  int rank;
  int64_t shape[MaxRank], stride[MaxRank];
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t))
      y[i] = x[strided_offset(i, rank, shape, stride)];
  }
};

}  // namespace clustr::cuda
