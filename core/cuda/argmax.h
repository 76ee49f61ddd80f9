// The argmax of a row over one block, for kernels (core/cuda/kernel.h's primitives): the row
// argmax kernel (core/cuda/reduce.cu) and the cross-entropy's, which finds each row's
// prediction as it reads the row for the loss (core/cuda/cross_entropy.cu). The CPU's rule
// (math::argmax_beats: the first index of the largest value, NaN the largest), so the index is
// the CPU's exactly.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/cuda/kernel.h"
#include "core/math.h"

namespace clustr::cuda {

// A value and the index it came from. An empty partial (a thread with no element of the row)
// is -inf at index INT32_MAX: it beats nothing, and any element wins over it.
struct ArgmaxPartial {
  float v;
  int32_t i;
};
CLUSTR_DEVICE ArgmaxPartial argmax_empty() { return {-INFINITY, INT32_MAX}; }
// The first maximum of two disjoint index sets, as the CPU's scan in index order finds it
// (math::argmax_beats): the partial with the higher index must beat the lower one to win.
struct ArgmaxCombine {
  CLUSTR_DEVICE ArgmaxPartial operator()(const ArgmaxPartial& a, const ArgmaxPartial& b) const {
    const bool a_first = a.i < b.i;
    const ArgmaxPartial& lo = a_first ? a : b;
    const ArgmaxPartial& hi = a_first ? b : a;
    return math::argmax_beats(hi.v, lo.v) ? hi : lo;
  }
};

// The argmax of xr[0, len) (len >= 1), returned to every thread of the block: each thread scans
// its strided share in index order and block_reduce combines the partials. scratch: block_dim
// ArgmaxPartials of shared memory. Every thread of the block calls it.
CLUSTR_DEVICE int32_t block_argmax(const Thread& t, const float* xr, int64_t len,
                                   ArgmaxPartial* scratch) {
  const unsigned tid = t.thread_idx().x, nt = t.block_dim().x;
  ArgmaxPartial acc = argmax_empty();
  for (int64_t l = tid; l < len; l += nt)
    if (acc.i == INT32_MAX || math::argmax_beats(xr[l], acc.v))
      acc = {xr[l], static_cast<int32_t>(l)};
  return block_reduce(t, acc, scratch, ArgmaxCombine{}).i;
}

}  // namespace clustr::cuda
