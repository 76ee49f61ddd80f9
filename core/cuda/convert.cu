// float32 <-> bf16 conversion kernels, the device side of Tensor::astype. Each element goes
// through core/bf16.h's float_to_bf16 / bf16_to_float, the functions the cpu loop calls, so
// the device rounds bit for bit as the cpu does (ties to even, NaN kept quiet with its sign,
// overflow to inf, subnormals kept). CUDA's __float2bfloat16_rn would round the same way, but
// one formula for both devices leaves nothing to compare.
#include <cstdint>

#include "core/bf16.h"
#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"

namespace clustr::cuda {

namespace {

struct F32ToBf16Kernel {
  static constexpr bool kUsesBarrier = false;
  const float* x;
  uint16_t* y;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) y[i] = float_to_bf16(x[i]);
  }
};

struct Bf16ToF32Kernel {
  static constexpr bool kUsesBarrier = false;
  const uint16_t* x;
  float* y;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) y[i] = bf16_to_float(x[i]);
  }
};

template <class Kernel, class In, class Out>
void launch_convert(const char* what, const In* x, Out* y, int64_t n) {
  CLUSTR_CHECK(n >= 0, what, ": negative element count ", n);
  if (n == 0) return;
  require(what);
  CLUSTR_CHECK(x != nullptr && y != nullptr, what, ": null ", x == nullptr ? "input" : "output",
               " pointer for ", n, " elements");
  launch(what, {elementwise_blocks(n)}, {kElementwiseThreads}, 0, Kernel{x, y, n});
}

}  // namespace

void f32_to_bf16(const float* x, uint16_t* y, int64_t n) {
  launch_convert<F32ToBf16Kernel>("cuda::f32_to_bf16", x, y, n);
}

void bf16_to_f32(const uint16_t* x, float* y, int64_t n) {
  launch_convert<Bf16ToF32Kernel>("cuda::bf16_to_f32", x, y, n);
}

}  // namespace clustr::cuda
