// CUDA kernels of the nn ops; the twins of core/cpu/nn.cpp. So far: dropout.
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "core/math.h"
#include "core/philox.h"

namespace clustr::cuda {

namespace {

// Element i keeps with probability 1 - p from word i % 4 of Philox block offset + i / 4 of the
// stream `seed`, exactly as cpu::dropout: one thread per Philox block, so each block of four
// random words is computed once. The mask is integer arithmetic and one float compare, so it is
// the same bits on both devices.
struct DropoutKernel {
  static constexpr bool kUsesBarrier = false;
  const float* x;
  float p, scale;
  uint64_t seed, offset;
  float* y;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t blocks = (n + 3) / 4;
    for (int64_t b = global_x(t); b < blocks; b += grid_stride_x(t)) {
      const Philox4 bits = philox4x32(seed, offset + static_cast<uint64_t>(b));
      const int64_t i0 = 4 * b, len = n - i0 < 4 ? n - i0 : 4;
      for (int64_t k = 0; k < len; ++k)
        y[i0 + k] = math::dropout_value(x[i0 + k], bits.v[k], p, scale);
    }
  }
};

}  // namespace

void dropout(const float* x, float p, uint64_t seed, uint64_t offset, float* y, int64_t n) {
  if (n == 0) return;
  require("cuda::dropout");
  const float scale = 1.0f / (1.0f - p);
  launch("cuda::dropout", {elementwise_blocks(n, 4)}, {kElementwiseThreads}, 0,
         DropoutKernel{x, p, scale, seed, offset, y, n});
}

}  // namespace clustr::cuda
