// The dropout mask of lsh and shared-full attention (reformer.h), shared by the CPU kernel
// (reformer.cpp) and the CUDA kernels (cuda/reformer.cu).
#pragma once

#include <cstdint>

#include "core/hostdevice.h"
#include "core/math.h"
#include "core/philox.h"

namespace clustr::reformer_detail {

// Mask element of query i and key j (positions in their sequence) in round x of pair bh.
CLUSTR_HD uint64_t mask_index(int64_t N, int64_t X, int64_t bh, int64_t x, int64_t i, int64_t j) {
  return ((uint64_t(bh) * uint64_t(X) + uint64_t(x)) * uint64_t(N) + uint64_t(i)) * uint64_t(N) +
         uint64_t(j);
}

// The factor of mask element idx: scale where the element keeps, else 0 (math::dropout_value
// of word idx % 4 of counter block offset + idx / 4). The keys of a sorted chunk are not
// contiguous positions, so each element makes its own Philox call.
CLUSTR_HD float keep_factor(uint64_t seed, uint64_t offset, uint64_t idx, float p, float scale) {
  return math::dropout_value(1.0f, philox4x32(seed, offset + idx / 4).v[idx % 4], p, scale);
}

}  // namespace clustr::reformer_detail
