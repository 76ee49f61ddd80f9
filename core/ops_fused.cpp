// Front doors of the fused ops of the transformer layers (core/ops.h, "fused ops"): the linear
// layer's forward (bias and ReLU in the GEMM's store) and backward (the bias gradient from
// dW's GEMM), the ReLU feed-forward block's backward, and layer norm of a residual sum. Each
// checks its arguments once, allocates the results on the inputs' device and calls the CPU
// kernels (core/cpu/gemm.h, core/cpu/nn.h) or the CUDA ones (core/cuda/cuda.h).
//
// On the CUDA device the bias and ReLU of linear_forward are cuBLASLt's epilogue of the product,
// and each bias gradient comes out of its dW's product where dy is that product's operand as it
// is (cuda::gemm_epilogue; in the bf16 precision a float dy is rounded for the product, so its
// sums are a pass of their own over the float dy, as on the CPU). Where cuBLASLt offers no
// algorithm for a product, the same results are composed: the cuBLAS product, then the bias and
// ReLU as one element-wise pass (cuda::bias_activation) and the bias gradients as sums over
// axis 0. The ReLU mask of the feed-forward backward is the ReLU derivative kernel run in place
// on the product, and add_layer_norm's kernels form the residual sum as they read it (a float
// sum, exactly the row the CPU forms on the fly). The results agree with the CPU's to the
// rounding of the GEMMs' and the sums' orders.
//
// Legend: R rows, D layer-norm width.
#include <utility>

#include "core/cpu/gemm.h"
#include "core/cpu/gemm_bf16.h"
#include "core/cpu/layer_norm.h"
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

// An input that a product reads: f32 or bf16, on the device of `like`.
void check_operand(const char* op, const char* what, const Tensor& t, const Tensor& like) {
  detail::check_product_operand(op, what, t);
  check_same_device(op, like, t);
}

bool on_cuda(const Tensor& t) { return t.device() == Device::cuda; }

// One CPU product of a fused op: C (M, N) = alpha op(A) op(B) (+ the epilogue), with A, B, C
// and the epilogue's mask (row stride epilogue.ldm) f32 or bf16 tensors.
struct Product {
  bool trans_a, trans_b;
  int64_t M, N, K;
  const Tensor& A;
  int64_t lda;
  const Tensor& B;
  int64_t ldb;
  Tensor& C;
  int64_t ldc;
  cpu::GemmEpilogue epilogue;  // bias, ReLU and row sums; the mask comes from `mask`
  const Tensor* mask;
  float beta = 0.0f;  // 1: the product is added to C
};

bool is_bf16(const Tensor& t) { return t.dtype() == DType::bf16; }

// The CPU products of one fused op, in one parallel region: cpu::gemm_many when all is f32 in
// the fp32 precision, else cpu::gemm_bf16_many (f32 operands rounded as it packs them; a bf16
// C, only ever made in the bf16 precision, stored rounded).
void run_products(const Product* ps, int count, Precision precision) {
  CLUSTR_CHECK(count <= 2, "run_products: at most 2 products, got ", count);
  bool bf16 = precision == Precision::bf16;
  for (int i = 0; i < count; ++i) {
    const Product& p = ps[i];
    bf16 = bf16 || is_bf16(p.A) || is_bf16(p.B) || (p.mask && is_bf16(*p.mask));
    CLUSTR_CHECK(!is_bf16(p.C) || precision == Precision::bf16,
                 "run_products: a bf16 result needs the bf16 precision");
  }
  if (!bf16) {
    cpu::GemmCall calls[2];
    for (int i = 0; i < count; ++i) {
      const Product& p = ps[i];
      calls[i] = {p.trans_a, p.trans_b, p.M, p.N, p.K, 1.0f, p.A.f32(), p.lda, p.B.f32(), p.ldb,
                  p.beta, p.C.f32(), p.ldc, p.epilogue};
      if (p.mask) calls[i].epilogue.mask = p.mask->f32();
    }
    return cpu::gemm_many(calls, count);
  }
  auto operand = [](const Tensor& t) {
    return is_bf16(t) ? cpu::Operand::bf16 : cpu::Operand::f32;
  };
  cpu::GemmBf16Call calls[2];
  for (int i = 0; i < count; ++i) {
    const Product& p = ps[i];
    calls[i] = {p.trans_a, p.trans_b, p.M,   p.N,        p.K,          1.0f,
                p.A.raw(), operand(p.A), p.lda, p.B.raw(), operand(p.B), p.ldb,
                p.beta,    nullptr,      p.ldc, p.epilogue, nullptr,      nullptr};
    if (is_bf16(p.C))
      calls[i].C_bf16 = p.C.bf16();
    else
      calls[i].C = p.C.f32();
    if (p.mask && is_bf16(*p.mask))
      calls[i].mask_bf16 = p.mask->bf16();
    else if (p.mask)
      calls[i].epilogue.mask = p.mask->f32();
  }
  cpu::gemm_bf16_many(calls, count);
}

// The products among `first` and `second` whose flag is set, in one parallel region.
void run_chosen(const Product& first, bool run_first, const Product& second, bool run_second,
                Precision precision) {
  if (run_first && run_second) {
    const Product both[2] = {first, second};
    return run_products(both, 2, precision);
  }
  if (run_first) return run_products(&first, 1, precision);
  if (run_second) run_products(&second, 1, precision);
}

// The sums of dy's columns (R, out) -> (out): a bias gradient; a bf16 dy is summed in f32.
Tensor column_sums(const Tensor& dy) {
  return sum(is_bf16(dy) ? dy.astype(DType::f32) : dy, 0);
}

// The two operands of a device product: both bf16 (rounded copies of f32 ones) in the bf16
// precision or when either is bf16, as gemm reads them; else both f32.
struct DeviceOperands {
  Tensor a, b;
  bool bf16;
};

DeviceOperands device_operands(const Tensor& A, const Tensor& B, Precision precision) {
  const bool bf16 = precision == Precision::bf16 || is_bf16(A) || is_bf16(B);
  auto as = [bf16](const Tensor& t) { return bf16 && !is_bf16(t) ? t.astype(DType::bf16) : t; };
  return {as(A), as(B), bf16};
}

// y (R, out) = x W^T + b, then ReLU when asked, on the device: one cuBLASLt call with its
// epilogue, or the product and one element-wise pass.
void device_linear(const Tensor& x, const Tensor& W, const float* bias, bool relu,
                   Precision precision, Tensor& y) {
  const int64_t R = x.size(0), out = W.size(0), in = W.size(1);
  const DeviceOperands o = device_operands(x, W, precision);
  cuda::EpilogueGemm g;
  g.trans_b = true;
  g.M = R, g.N = out, g.K = in;
  g.A = o.a.raw(), g.lda = in, g.B = o.b.raw(), g.ldb = in, g.bf16 = o.bf16;
  g.C = y.f32(), g.ldc = out;
  g.epilogue = relu ? cuda::GemmEpilogue::relu_bias : cuda::GemmEpilogue::bias;
  g.vec = const_cast<float*>(bias);
  if (bias != nullptr && cuda::gemm_epilogue(g)) return;
  gemm(false, true, 1.0f, o.a, o.b, 0.0f, y, precision);
  cuda::bias_activation(y.f32(), bias, relu, R, out);
}

// dW (out, in) = dy^T x and db (out) = the sums of dy's columns, on the device: one cuBLASLt
// call whose epilogue reads db off dy, or the product and a sum. The epilogue sums the product's
// operand, so it serves only where that is dy as it is: in the bf16 precision a float dy is
// rounded for the product, and db is summed from the float dy, as on the CPU.
void device_weight_grads(const Tensor& dy, const Tensor& x, Precision precision, Tensor& dW,
                         Tensor& db) {
  const int64_t R = dy.size(0), out = dy.size(1), in = x.size(1);
  const DeviceOperands o = device_operands(dy, x, precision);
  dW = Tensor::empty({out, in}, DType::f32, dy.device());
  if (!o.bf16 || is_bf16(dy)) {  // the product reads dy as it is: db from its epilogue
    db = Tensor::empty({out}, DType::f32, dy.device());
    cuda::EpilogueGemm g;
    g.trans_a = true;
    g.M = out, g.N = in, g.K = R;
    g.A = o.a.raw(), g.lda = out, g.B = o.b.raw(), g.ldb = in, g.bf16 = o.bf16;
    g.C = dW.f32(), g.ldc = in;
    g.epilogue = cuda::GemmEpilogue::a_row_sums;
    g.vec = db.f32();
    if (cuda::gemm_epilogue(g)) return;
  }
  gemm(true, false, 1.0f, o.a, o.b, 0.0f, dW, precision);
  db = column_sums(dy);
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
                      Precision precision, DType out_dtype) {
  const char* op = "linear_forward";
  check_operand(op, "x", x, x);
  check_input(op, "W", W, x);
  CLUSTR_CHECK(W.rank() == 2 && x.rank() == 2 && x.size(1) == W.size(1), op,
               ": expected x (R, in) and W (out, in), got x ", describe(x), " and W ",
               describe(W));
  CLUSTR_CHECK(out_dtype == DType::f32 ||
                   (out_dtype == DType::bf16 && precision == Precision::bf16),
               op, ": the result can be f32, or bf16 in the bf16 precision; got ",
               to_string(out_dtype), " in ", to_string(precision));
  const int64_t R = x.size(0), out = W.size(0), in = W.size(1);
  cpu::GemmEpilogue epilogue{};
  if (b.defined()) {
    check_input(op, "b", b, x);
    CLUSTR_CHECK(b.shape() == Shape{out}, op, ": expected b of shape (", out, ",) for W ",
                 describe(W), ", got ", describe(b));
    epilogue.bias = b.f32();
  }
  epilogue.relu = relu;
  if (on_cuda(x)) {  // the product with its epilogue (and the rounding as a pass of its own)
    Tensor y = Tensor::empty({R, out}, DType::f32, x.device());
    device_linear(x, W, epilogue.bias, relu, precision, y);
    return out_dtype == DType::f32 ? y : y.astype(out_dtype);
  }
  Tensor y = Tensor::empty({R, out}, out_dtype);
  const Product p{false, true, R, out, in, x, in, W, in, y, out, epilogue, nullptr};
  run_products(&p, 1, precision);
  return y;
}

// dy (R, out), x (R, in) or undefined, W (out, in) or undefined -> dx (R, in), dW (out, in),
// db (out).
LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& W, bool need_dx,
                            bool need_dW, bool need_db, Precision precision,
                            const Tensor& dx_sum) {
  const char* op = "linear_backward";
  check_operand(op, "dy", dy, dy);
  CLUSTR_CHECK(dy.rank() == 2, op, ": expected dy (R, out), got ", describe(dy));
  const int64_t R = dy.size(0), out = dy.size(1);
  if (need_dx) {
    check_input(op, "W", W, dy);
    CLUSTR_CHECK(W.rank() == 2 && W.size(0) == out, op, ": expected W (", out, ", in) for dy ",
                 describe(dy), ", got ", describe(W));
  }
  // dx's product adds into dx_sum, viewed as (R, in).
  const bool adding = need_dx && dx_sum.defined();
  if (adding) {
    check_input(op, "dx_sum", dx_sum, dy);
    check_f32(op, "dx_sum", dx_sum);
    CLUSTR_CHECK(dx_sum.numel() == R * W.size(1), op, ": expected dx_sum of ", R, " x ",
                 W.size(1), " elements, got ", describe(dx_sum));
  }
  if (need_dW) {
    check_operand(op, "x", x, dy);
    CLUSTR_CHECK(x.rank() == 2 && x.size(0) == R, op, ": expected x (", R, ", in) for dy ",
                 describe(dy), ", got ", describe(x));
  }
  if (on_cuda(dy)) {  // db from dW's product where both are needed
    LinearGrads g;
    if (adding) {
      Tensor sum2 = dx_sum.reshape({R, W.size(1)});
      gemm(false, false, 1.0f, dy, W, 1.0f, sum2, precision);
      g.dx = dx_sum;
    } else if (need_dx) {
      g.dx = matmul(dy, W, false, false, precision);
    }
    if (need_dW && need_db)
      device_weight_grads(dy, x, precision, g.dW, g.db);
    else if (need_dW)
      g.dW = matmul(dy, x, true, false, precision);
    else if (need_db)
      g.db = column_sums(dy);
    return g;
  }
  LinearGrads g;
  const int64_t in = need_dx ? W.size(1) : need_dW ? x.size(1) : 0;
  if (need_dx) g.dx = adding ? dx_sum.reshape({R, in}) : Tensor::empty({R, in});
  if (need_dW) g.dW = Tensor::empty({out, in});
  cpu::GemmEpilogue sums{};
  if (need_db) {
    g.db = Tensor::empty({out});
    if (need_dW) sums.a_row_sums = g.db.f32();  // the row sums of dy^T, from dW's GEMM
  }
  const Product dx{false, false, R, in, out, dy, out, W, in, g.dx, in, {}, nullptr,
                   adding ? 1.0f : 0.0f};                                            // dy W
  const Product dW{true, false, out, in, R, dy, out, x, in, g.dW, in, sums, nullptr};  // dy^T x
  run_chosen(dx, need_dx, dW, need_dW, precision);
  if (need_db && !need_dW) g.db = column_sums(dy);
  if (adding) g.dx = dx_sum;
  return g;
}

// dy (R, D_out), x (R, D), W1 (F, D), W2 (D_out, F), H (R, F) -> the five gradients.
FeedForwardGrads feed_forward_relu_backward(const Tensor& dy, const Tensor& x, const Tensor& W1,
                                            const Tensor& W2, const Tensor& H,
                                            const FeedForwardNeeds& need, Precision precision,
                                            const Tensor& dx_sum) {
  const char* op = "feed_forward_relu_backward";
  check_input(op, "dy", dy, dy);
  check_input(op, "x", x, dy);
  check_input(op, "W1", W1, dy);
  check_input(op, "W2", W2, dy);
  check_operand(op, "H", H, dy);
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
    if (need.dW2 && need.db2)  // dy^T H, and db2 from that product
      device_weight_grads(dy, H, precision, g.dW2, g.db2);
    else if (need.dW2)
      g.dW2 = matmul(dy, H, true, false, precision);
    else if (need.db2)
      g.db2 = sum(dy, 0);
    if (need_dp) {  // dP = (dy W2) * [H > 0]: ReLU's derivative at H, in place on the product
      dp = matmul(dy, W2, false, false, precision);
      const Tensor h = is_bf16(H) ? H.astype(DType::f32) : H;
      cuda::unary_backward(UnaryOp::relu, h.f32(), nullptr, dp.f32(), dp.f32(), R * F);
      if (precision == Precision::bf16) dp = dp.astype(DType::bf16);  // as the CPU stores it
    }
  } else {
    // dP is read only by the two products of linear_backward: in the bf16 precision it is
    // stored in bf16, as they would round it anyway (the device rounds it in a pass of its own).
    if (need.dW2) g.dW2 = Tensor::empty({D_out, F});
    if (need_dp)
      dp = Tensor::empty({R, F}, precision == Precision::bf16 ? DType::bf16 : DType::f32);
    cpu::GemmEpilogue sums{};
    if (need.db2) {
      g.db2 = Tensor::empty({D_out});
      if (need.dW2) sums.a_row_sums = g.db2.f32();  // the row sums of dy^T, from dW2's GEMM
    }
    cpu::GemmEpilogue mask{};
    mask.ldm = F;
    const Product dW2{true, false, D_out, F, R, dy, D_out, H, F, g.dW2, F, sums, nullptr};
    const Product dP{false, false, R, F, D_out, dy, D_out, W2, F, dp, F, mask, &H};
    run_chosen(dW2, need.dW2, dP, need_dp, precision);
    if (need.db2 && !need.dW2) g.db2 = sum(dy, 0);
  }
  if (need_dp) {
    LinearGrads d1 = linear_backward(dp, x, W1, need.dx, need.dW1, need.db1, precision, dx_sum);
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
    cuda::add_layer_norm(a.f32(), b.f32(), gamma.f32(), beta.f32(), eps, out.y.f32(),
                         out.mean.f32(), out.rstd.f32(), R, D);
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
  if (on_cuda(a)) {
    cuda::add_layer_norm_backward(dy.f32(), a.f32(), b.f32(), mean.f32(), rstd.f32(),
                                  gamma.f32(), g.dx.f32(), g.dgamma.f32(), g.dbeta.f32(),
                                  a.numel() / D, D);
    return g;
  }
  cpu::add_layer_norm_backward(dy.f32(), a.f32(), b.f32(), mean.f32(), rstd.f32(), gamma.f32(),
                               g.dx.f32(), g.dgamma.f32(), g.dbeta.f32(), a.numel() / D, D);
  return g;
}

}  // namespace clustr
