// fill: dst[i] = value for i in [0, n), the CUDA twin of the loops in Tensor::fill (f32, i32,
// and the 16-bit words of bf16).
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"

namespace clustr::cuda {

namespace {

// Grid-stride loop: a fixed, modest grid covers any n (including n past 2^31 elements, hence the
// 64-bit index), and each thread's consecutive iterations stay coalesced across the warp.
template <typename T>
struct FillKernel {
  static constexpr bool kUsesBarrier = false;
  T* dst;
  T value;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) dst[i] = value;
  }
};

template <typename T>
void launch_fill(T* dst, T value, int64_t n, const char* what) {
  CLUSTR_CHECK(n >= 0, what, ": negative element count ", n);
  if (n == 0) return;
  require(what);
  CLUSTR_CHECK(dst != nullptr, what, ": null destination for ", n, " elements");
  launch(what, {elementwise_blocks(n)}, {kElementwiseThreads}, 0, FillKernel<T>{dst, value, n});
}

}  // namespace

void fill_f32(float* dst, float value, int64_t n) { launch_fill(dst, value, n, "cuda::fill_f32"); }

void fill_i32(int32_t* dst, int32_t value, int64_t n) {
  launch_fill(dst, value, n, "cuda::fill_i32");
}

void fill_u16(uint16_t* dst, uint16_t value, int64_t n) {
  launch_fill(dst, value, n, "cuda::fill_u16");
}

}  // namespace clustr::cuda
