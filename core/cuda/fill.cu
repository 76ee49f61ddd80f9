// fill: dst[i] = value for i in [0, n), the CUDA twin of the loop in Tensor::fill.
#include <algorithm>
#include <cstdint>

#include "core/cuda/check.h"
#include "core/cuda/cuda.h"
#include "core/error.h"

namespace clustr::cuda {

namespace {

// Grid-stride loop: a fixed, modest grid covers any n (including n past 2^31 elements, hence the
// 64-bit index), and each thread's consecutive iterations stay coalesced across the warp.
template <typename T>
__global__ void fill_kernel(T* __restrict__ dst, T value, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    dst[i] = value;
}

template <typename T>
void launch_fill(T* dst, T value, int64_t n, const char* what) {
  CLUSTR_CHECK(n >= 0, what, ": negative element count ", n);
  if (n == 0) return;
  require(what);
  CLUSTR_CHECK(dst != nullptr, what, ": null destination for ", n, " elements");
  constexpr int kThreads = 256;
  // 4096 blocks x 256 threads is several full waves on any current GPU; more blocks would only
  // add scheduling work to a memory-bound loop.
  constexpr int64_t kMaxBlocks = 4096;
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
  fill_kernel<T><<<blocks, kThreads, 0, /*default stream*/ 0>>>(dst, value, n);
  CLUSTR_CUDA_CHECK_LAUNCH();
}

}  // namespace

void fill_f32(float* dst, float value, int64_t n) { launch_fill(dst, value, n, "cuda::fill_f32"); }

void fill_i32(int32_t* dst, int32_t value, int64_t n) {
  launch_fill(dst, value, n, "cuda::fill_i32");
}

}  // namespace clustr::cuda
