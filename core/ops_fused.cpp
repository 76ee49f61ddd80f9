// Front doors of the fused ops of the transformer layers (core/ops.h, "fused ops"): the linear
// layer's forward (bias and ReLU in the GEMM's store) and backward (the bias gradient from
// dW's GEMM), the ReLU feed-forward block's backward, and layer norm of a residual sum. Each
// checks its arguments once, allocates the results on the inputs' device and calls the CPU
// kernels (core/cpu/gemm.h, core/cpu/nn.h) or the CUDA ones (core/cuda/cuda.h).
//
// On the CUDA device the GEMMs are cuBLAS calls, which have no epilogue hook: the bias and ReLU
// of linear_forward are one element-wise pass after the product (cuda::bias_activation), the
// bias gradients are sums over axis 0, the ReLU mask of the feed-forward backward is the ReLU
// derivative kernel run in place on the product, and add_layer_norm stores the residual sum and
// runs the layer-norm kernels on it (a float sum, exactly the row the CPU forms on the fly).
// The results agree with the CPU's to the rounding of the GEMMs' and the sums' orders.
//
// Legend: R rows, D layer-norm width.
#include <utility>

#include "core/cpu/gemm.h"
#include "core/cpu/gemm_bf16.h"
#include "core/cpu/nn.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops_check.h"

namespace clustr {

using detail::check_f32;
using detail::check_same_device;

namespace {

// An f32 input on the device of `like`, the op's first input.
void check_input(const char* op, const char* what, const Tensor& t, const Tensor& like) {
  check_f32(op, what, t);
  check_same_device(op, like, t);
}

bool on_cuda(const Tensor& t) { return t.device() == Device::cuda; }

// The CPU products of one fused op, in one parallel region (cpu::gemm_many), in f32 or with
// the f32 operands rounded to bf16 (cpu::gemm_bf16_many): the same calls either way.
void run_products(const cpu::GemmCall* calls, int count, Precision precision) {
  if (precision == Precision::fp32) return cpu::gemm_many(calls, count);
  cpu::GemmBf16Call bf16[2];
  CLUSTR_CHECK(count <= 2, "run_products: at most 2 products, got ", count);
  for (int i = 0; i < count; ++i) {
    const cpu::GemmCall& c = calls[i];
    bf16[i] = {c.trans_a, c.trans_b, c.M,        c.N,         c.K,      c.alpha,
               c.A,       cpu::Operand::f32, c.lda, c.B,      cpu::Operand::f32, c.ldb,
               c.beta,    c.C,              c.ldc, c.epilogue};
  }
  cpu::gemm_bf16_many(bf16, count);
}

Shape row_shape(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 1); }

// a, b (..., D) of the same shape; gamma (D) -> D.
int64_t check_add_layer_norm(const char* op, const Tensor& a, const Tensor& b,
                             const Tensor& gamma) {
  check_f32(op, "a", a);
  check_input(op, "b", b, a);
  CLUSTR_CHECK(a.rank() >= 1 && a.shape().back() >= 1, op,
               ": expected a (..., D) with D >= 1, got ", describe(a));
  CLUSTR_CHECK(b.shape() == a.shape(), op, ": expected b of a's shape ", to_string(a.shape()),
               ", got ", describe(b));
  const int64_t D = a.shape().back();
  check_input(op, "gamma", gamma, a);
  CLUSTR_CHECK(gamma.shape() == Shape{D}, op, ": expected gamma of shape (", D, ",), got ",
               describe(gamma));
  return D;
}

}  // namespace

// x (R, in), W (out, in), b (out) or undefined -> (R, out).
Tensor linear_forward(const Tensor& x, const Tensor& W, const Tensor& b, bool relu,
                      Precision precision) {
  const char* op = "linear_forward";
  check_f32(op, "x", x);
  check_input(op, "W", W, x);
  CLUSTR_CHECK(W.rank() == 2 && x.rank() == 2 && x.size(1) == W.size(1), op,
               ": expected x (R, in) and W (out, in), got x ", describe(x), " and W ",
               describe(W));
  const int64_t R = x.size(0), out = W.size(0), in = W.size(1);
  cpu::GemmEpilogue epilogue{};
  if (b.defined()) {
    check_input(op, "b", b, x);
    CLUSTR_CHECK(b.shape() == Shape{out}, op, ": expected b of shape (", out, ",) for W ",
                 describe(W), ", got ", describe(b));
    epilogue.bias = b.f32();
  }
  epilogue.relu = relu;
  Tensor y = Tensor::empty({R, out}, DType::f32, x.device());
  if (on_cuda(x)) {  // the product, then the epilogue as its own pass
    gemm(false, true, 1.0f, x, W, 0.0f, y, precision);
    cuda::bias_activation(y.f32(), epilogue.bias, relu, R, out);
    return y;
  }
  const cpu::GemmCall call{false, true, R,   out,  in,      1.0f, x.f32(), in,
                           W.f32(), in,   0.0f, y.f32(), out, epilogue};
  run_products(&call, 1, precision);
  return y;
}

// dy (R, out), x (R, in) or undefined, W (out, in) or undefined -> dx (R, in), dW (out, in),
// db (out).
LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& W, bool need_dx,
                            bool need_dW, bool need_db, Precision precision) {
  const char* op = "linear_backward";
  check_f32(op, "dy", dy);
  CLUSTR_CHECK(dy.rank() == 2, op, ": expected dy (R, out), got ", describe(dy));
  const int64_t R = dy.size(0), out = dy.size(1);
  if (need_dx) {
    check_input(op, "W", W, dy);
    CLUSTR_CHECK(W.rank() == 2 && W.size(0) == out, op, ": expected W (", out, ", in) for dy ",
                 describe(dy), ", got ", describe(W));
  }
  if (need_dW) {
    check_input(op, "x", x, dy);
    CLUSTR_CHECK(x.rank() == 2 && x.size(0) == R, op, ": expected x (", R, ", in) for dy ",
                 describe(dy), ", got ", describe(x));
  }
  if (on_cuda(dy)) {  // cuBLAS has no row-sum epilogue: the plain products and sum
    LinearGrads g;
    if (need_dx) g.dx = matmul(dy, W, false, false, precision);
    if (need_dW) g.dW = matmul(dy, x, true, false, precision);
    if (need_db) g.db = sum(dy, 0);
    return g;
  }
  LinearGrads g;
  cpu::GemmCall calls[2];
  int count = 0;
  if (need_dx) {  // dx = dy W: (R, out) (out, in)
    const int64_t in = W.size(1);
    g.dx = Tensor::empty({R, in});
    calls[count++] = {false, false, R, in, out, 1.0f, dy.f32(), out, W.f32(), in, 0.0f,
                      g.dx.f32(), in, cpu::GemmEpilogue{}};
  }
  if (need_dW) {  // dW = dy^T x: (out, R) (R, in), and db = the row sums of dy^T
    const int64_t in = x.size(1);
    g.dW = Tensor::empty({out, in});
    cpu::GemmEpilogue epilogue{};
    if (need_db) {
      g.db = Tensor::empty({out});
      epilogue.a_row_sums = g.db.f32();
    }
    calls[count++] = {true, false, out, in, R, 1.0f, dy.f32(), out, x.f32(), in, 0.0f,
                      g.dW.f32(), in, epilogue};
  } else if (need_db) {
    g.db = sum(dy, 0);
  }
  run_products(calls, count, precision);  // both products in one parallel region
  return g;
}

// dy (R, D_out), x (R, D), W1 (F, D), W2 (D_out, F), H (R, F) -> the five gradients.
FeedForwardGrads feed_forward_relu_backward(const Tensor& dy, const Tensor& x, const Tensor& W1,
                                            const Tensor& W2, const Tensor& H,
                                            const FeedForwardNeeds& need, Precision precision) {
  const char* op = "feed_forward_relu_backward";
  for (const Tensor* t : {&dy, &x, &W1, &W2, &H})
    check_input(op, t == &dy ? "dy" : t == &x ? "x" : t == &W1 ? "W1" : t == &W2 ? "W2" : "H",
                *t, dy);
  CLUSTR_CHECK(dy.rank() == 2 && x.rank() == 2 && W1.rank() == 2 && W2.rank() == 2 &&
                   H.rank() == 2,
               op, ": expected matrices, got dy ", describe(dy), ", x ", describe(x), ", W1 ",
               describe(W1), ", W2 ", describe(W2), ", H ", describe(H));
  const int64_t R = dy.size(0), D_out = dy.size(1), F = W1.size(0), D = W1.size(1);
  CLUSTR_CHECK(x.shape() == (Shape{R, D}) && W2.shape() == (Shape{D_out, F}) &&
                   H.shape() == (Shape{R, F}),
               op, ": expected x (", R, ", ", D, "), W2 (", D_out, ", ", F, ") and H (", R, ", ",
               F, ") for dy ", describe(dy), " and W1 ", describe(W1), ", got x ", describe(x),
               ", W2 ", describe(W2), ", H ", describe(H));
  FeedForwardGrads g;
  const bool need_dp = need.dx || need.dW1 || need.db1;
  Tensor dp;
  if (on_cuda(dy)) {
    if (need.dW2) g.dW2 = matmul(dy, H, true, false, precision);  // dy^T H
    if (need.db2) g.db2 = sum(dy, 0);
    if (need_dp) {  // dP = (dy W2) * [H > 0]: ReLU's derivative at H, in place on the product
      dp = matmul(dy, W2, false, false, precision);
      cuda::unary_backward(UnaryOp::relu, H.f32(), nullptr, dp.f32(), dp.f32(), R * F);
    }
  } else {
    cpu::GemmCall calls[2];
    int count = 0;
    if (need.dW2) {  // dW2 = dy^T H, db2 = the row sums of dy^T
      g.dW2 = Tensor::empty({D_out, F});
      cpu::GemmEpilogue epilogue{};
      if (need.db2) {
        g.db2 = Tensor::empty({D_out});
        epilogue.a_row_sums = g.db2.f32();
      }
      calls[count++] = {true, false, D_out, F, R, 1.0f, dy.f32(), D_out, H.f32(), F, 0.0f,
                        g.dW2.f32(), F, epilogue};
    } else if (need.db2) {
      g.db2 = sum(dy, 0);
    }
    if (need_dp) {  // dP = (dy W2) * [H > 0]
      dp = Tensor::empty({R, F});
      cpu::GemmEpilogue epilogue{};
      epilogue.mask = H.f32();
      epilogue.ldm = F;
      calls[count++] = {false, false, R, F, D_out, 1.0f, dy.f32(), D_out, W2.f32(), F, 0.0f,
                        dp.f32(), F, epilogue};
    }
    run_products(calls, count, precision);  // dW2 and dP in one parallel region
  }
  if (need_dp) {
    LinearGrads d1 = linear_backward(dp, x, W1, need.dx, need.dW1, need.db1, precision);
    g.dx = std::move(d1.dx);
    g.dW1 = std::move(d1.dW);
    g.db1 = std::move(d1.db);
  }
  return g;
}

// a, b (..., D), gamma, beta (D) -> y (..., D), mean, rstd (...).
LayerNormOutput add_layer_norm(const Tensor& a, const Tensor& b, const Tensor& gamma,
                               const Tensor& beta, float eps) {
  const char* op = "add_layer_norm";
  const int64_t D = check_add_layer_norm(op, a, b, gamma);
  check_input(op, "beta", beta, a);
  CLUSTR_CHECK(beta.shape() == Shape{D}, op, ": expected beta of shape (", D, ",), got ",
               describe(beta));
  CLUSTR_CHECK(eps >= 0.0f, op, ": expected eps >= 0, got ", eps);
  LayerNormOutput out;
  out.y = Tensor::empty(a.shape(), DType::f32, a.device());
  out.mean = Tensor::empty(row_shape(a), DType::f32, a.device());
  out.rstd = Tensor::empty(row_shape(a), DType::f32, a.device());
  const int64_t R = a.numel() / D;
  if (R > 0 && on_cuda(a)) {
    const Tensor ab = add(a, b);
    cuda::layer_norm(ab.f32(), gamma.f32(), beta.f32(), eps, out.y.f32(), out.mean.f32(),
                     out.rstd.f32(), R, D);
  } else if (R > 0) {
    cpu::add_layer_norm(a.f32(), b.f32(), gamma.f32(), beta.f32(), eps, out.y.f32(),
                        out.mean.f32(), out.rstd.f32(), R, D);
  }
  return out;
}

// dy, a, b (..., D), mean, rstd (...), gamma (D) -> dx (..., D), dgamma, dbeta (D).
LayerNormGrads add_layer_norm_backward(const Tensor& dy, const Tensor& a, const Tensor& b,
                                       const Tensor& mean, const Tensor& rstd,
                                       const Tensor& gamma) {
  const char* op = "add_layer_norm_backward";
  const int64_t D = check_add_layer_norm(op, a, b, gamma);
  check_input(op, "dy", dy, a);
  CLUSTR_CHECK(dy.shape() == a.shape(), op, ": expected dy of shape ", to_string(a.shape()),
               ", got ", describe(dy));
  for (const Tensor* t : {&mean, &rstd}) {
    check_input(op, t == &mean ? "mean" : "rstd", *t, a);
    CLUSTR_CHECK(t->shape() == row_shape(a), op, ": expected ", t == &mean ? "mean" : "rstd",
                 " of shape ", to_string(row_shape(a)), ", got ", describe(*t));
  }
  LayerNormGrads g;
  g.dx = Tensor::empty(a.shape(), DType::f32, a.device());
  g.dgamma = Tensor::empty({D}, DType::f32, a.device());
  g.dbeta = Tensor::empty({D}, DType::f32, a.device());
  if (on_cuda(a)) {  // the layer-norm backward of the stored sum
    const Tensor ab = add(a, b);
    cuda::layer_norm_backward(dy.f32(), ab.f32(), mean.f32(), rstd.f32(), gamma.f32(),
                              g.dx.f32(), g.dgamma.f32(), g.dbeta.f32(), a.numel() / D, D);
    return g;
  }
  cpu::add_layer_norm_backward(dy.f32(), a.f32(), b.f32(), mean.f32(), rstd.f32(), gamma.f32(),
                               g.dx.f32(), g.dgamma.f32(), g.dbeta.f32(), a.numel() / D, D);
  return g;
}

}  // namespace clustr
