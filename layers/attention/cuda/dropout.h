// Device helpers shared by the attention kernels (cuda/full.cu, cuda/clustered_kernels.h,
// cuda/flash_kernels.h): the attention-dropout mask words. Written against core/cuda/kernel.h;
// included only by those files.
#pragma once

#include <cstdint>

#include "core/cuda/kernel.h"
#include "core/philox.h"

namespace clustr::cuda::attention_kernels {

// The dropout of one call: element idx of the weights keeps when its Philox word says so.
struct Dropout {
  float p = 0.0f, scale = 1.0f;
  uint64_t seed = 0;
  PhiloxOffset offset;
  CLUSTR_HD bool on() const { return p > 0.0f; }
};

// The dropout of the params p of one call (p.dropout, p.seed, p.offset); none when p.dropout is 0.
template <class Params>
inline Dropout dropout_of(const Params& p) {
  Dropout d;
  if (p.dropout > 0.0f) {
    d.p = p.dropout;
    d.scale = 1.0f / (1.0f - p.dropout);
    d.seed = p.seed;
    d.offset = p.offset;
  }
  return d;
}

// Calls f(c, word) for the columns c in [0, n) of a row whose column 0 has dropout element
// number idx0, with word the element's Philox word. Each thread takes whole Philox blocks (four
// consecutive elements), so each block of words is computed once per row.
template <class F>
CLUSTR_DEVICE void for_each_word(const Thread& t, const Dropout& drop, uint64_t idx0, int64_t n,
                                 F f) {
  if (n <= 0) return;
  const uint64_t first = idx0 / 4, last = (idx0 + static_cast<uint64_t>(n) - 1) / 4;
  for (uint64_t q = first + t.thread_idx().x; q <= last; q += t.block_dim().x) {
    const Philox4 w = philox4x32(drop.seed, drop.offset.get() + q);
    for (uint64_t k = 0; k < 4; ++k) {
      const int64_t c = static_cast<int64_t>(4 * q + k - idx0);
      if (c >= 0 && c < n) f(c, w.v[k]);
    }
  }
}

}  // namespace clustr::cuda::attention_kernels
