// The CUDA part of the fused ops of the transformer layers (core/ops_fused.cpp): the linear
// layer's epilogue, applied to the product that cuda::gemm (cuBLAS) has just written.
//
// Legend: R rows, N output features.
//
// On the CPU the bias and the ReLU are folded into the GEMM's store of each tile; cuBLAS has no
// such hook (cuBLASLt's epilogues would, at the price of a second library and its own rounding
// of the bias), so here they are one extra element-wise pass over y. The other fused ops need
// no kernel of their own on the device: their front doors compose cuda::gemm, cuda::reduce,
// cuda::unary_backward and the layer-norm kernels.
#include <cstdint>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/math.h"

namespace clustr::cuda {

namespace {

// y (R, N) = relu?(y + bias); bias (N) or null. Each element by one thread.
struct BiasActivationKernel {
  static constexpr bool kUsesBarrier = false;
  float* y;
  const float* bias;
  bool relu;
  int64_t n, N;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) {
      float v = y[i];
      if (bias) v += bias[i % N];
      y[i] = relu ? math::relu(v) : v;
    }
  }
};

}  // namespace

// y (R, N) in place; bias (N) or null.
void bias_activation(float* y, const float* bias, bool relu, int64_t R, int64_t N) {
  const int64_t n = R * N;
  if (n == 0 || (!bias && !relu)) return;
  require("cuda::bias_activation");
  launch("cuda::bias_activation", {elementwise_blocks(n)}, {kElementwiseThreads}, 0,
         BiasActivationKernel{y, bias, relu, n, N});
}

}  // namespace clustr::cuda
