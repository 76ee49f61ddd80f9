// Differentiable fused ops of the transformer layers: the ReLU feed-forward block and layer
// norm of a residual sum, each one node with a hand-written backward over the fused core ops
// (core/ops.h, "fused ops"). They compute what the composition of the single ops computes,
// with fewer passes over memory and fewer saved tensors.
//
// feed_forward_relu, x viewed as X (R, D), W1 (F, D), W2 (D_out, F), H = relu(X W1^T + b1)
// (R, F), Y = H W2^T + b2 (R, D_out), dY the gradient of Y:
//   dW2 = dY^T H,   db2 = sum of the rows of dY,
//   dP = (dY W2) * [H > 0]       (the gradient of the pre-activation; the mask in the GEMM),
//   dW1 = dP^T X,   db1 = sum of the rows of dP,   dX = dP W1
// (core feed_forward_relu_backward: each db from its dW's GEMM, the products in pairs in one
// parallel region each).
// It saves X, W1, W2 and H; the unfused chain saves H twice (ReLU's input and linear2's). In
// the bf16 precision H and dP are bf16 (core/ops.h): half the memory for H.
//
// add_layer_norm, y = layer_norm(a + b): da = db = the layer-norm gradient of the sum, which
// the backward kernel recomputes from a and b.
//
// feed_forward_relu's products run in this thread's precision (core/precision.h), recorded for
// backward; add_layer_norm is f32 either way.
#include <memory>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/ops.h"

namespace clustr {

namespace {

class FeedForwardReluNode : public Node {
 public:
  FeedForwardReluNode(Shape x_shape, int64_t rows, Precision precision)
      : x_shape_(std::move(x_shape)), rows_(rows), precision_(precision) {}
  const char* name() const override { return "feed_forward_relu"; }
  std::vector<Tensor> backward(const Tensor& g) override { return backward_adding(g, {}); }
  // dx's product (the last) adds into the sum waiting at x, the residual branch's gradient,
  // which the layer norm after the block also hands to the block as g: every read of g (dW2,
  // db2, dP) comes before it.
  SumOffer takes_sums() const override { return SumOffer::after_reading; }
  std::vector<Tensor> backward_adding(const Tensor& g, const std::vector<Tensor>& sums) override {
    const Tensor dy = g.reshape({rows_, W2_.size(0)});
    FeedForwardNeeds need;
    need.dx = needs_grad(0), need.dW1 = needs_grad(1), need.db1 = needs_grad(2);
    need.dW2 = needs_grad(3), need.db2 = needs_grad(4);
    FeedForwardGrads d = feed_forward_relu_backward(dy, X_, W1_, W2_, H_, need, precision_,
                                                    sums.empty() ? Tensor() : sums[0]);
    if (need.dx) d.dx = d.dx.reshape(x_shape_);  // the sum itself, where it took it
    return {std::move(d.dx), std::move(d.dW1), std::move(d.db1), std::move(d.dW2),
            std::move(d.db2)};
  }
  void release() override { X_ = W1_ = W2_ = H_ = Tensor(); }

  Tensor X_, W1_, W2_, H_;  // X (R, D), H (R, F)

 private:
  Shape x_shape_;
  int64_t rows_;
  Precision precision_;
};

class AddLayerNormNode : public Node {
 public:
  const char* name() const override { return "add_layer_norm"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    LayerNormGrads d = add_layer_norm_backward(g, a_, b_, mean_, rstd_, gamma_);
    return {d.dx, d.dx, std::move(d.dgamma), std::move(d.dbeta)};
  }
  void release() override { a_ = b_ = mean_ = rstd_ = gamma_ = Tensor(); }

  Tensor a_, b_, mean_, rstd_, gamma_;
};

}  // namespace

// x (..., D), W1 (F, D), b1 (F), W2 (D_out, F), b2 (D_out) -> (..., D_out).
Variable feed_forward_relu(const Variable& x, const Variable& w1, const Variable& b1,
                           const Variable& w2, const Variable& b2) {
  const char* op = "feed_forward_relu";
  CLUSTR_CHECK(x.defined() && w1.defined() && b1.defined() && w2.defined() && b2.defined(), op,
               ": x, w1, b1, w2 and b2 must all be defined Variables");
  const Tensor& X = x.data();
  const Tensor& W1 = w1.data();
  const Tensor& W2 = w2.data();
  CLUSTR_CHECK(W1.rank() == 2 && W2.rank() == 2 && W2.size(1) == W1.size(0), op,
               ": expected w1 (F, D) and w2 (D_out, F), got ", describe(W1), " and ",
               describe(W2));
  const int64_t D = W1.size(1);
  CLUSTR_CHECK(X.rank() >= 1 && X.shape().back() == D, op, ": expected x (..., ", D,
               ") to match w1 ", describe(W1), ", got ", describe(X));
  const int64_t rows = D == 0 ? 0 : X.numel() / D;
  const Tensor X2 = X.reshape({rows, D});
  const Precision precision = current_precision();
  // H is read only by products (the second linear layer, dW2) and by backward's ReLU mask: in
  // the bf16 precision it is stored in bf16, which those products would round it to.
  const DType hidden = precision == Precision::bf16 ? DType::bf16 : DType::f32;
  Tensor H = linear_forward(X2, W1, b1.data(), /*relu=*/true, precision, hidden);  // checks b1
  Tensor Y = linear_forward(H, W2, b2.data(), false, precision);           // checks b2
  Shape y_shape = X.shape();
  y_shape.back() = W2.size(0);
  Y = Y.reshape(y_shape);
  if (!record_needed({&x, &w1, &b1, &w2, &b2})) return Variable(std::move(Y));
  auto node = std::make_shared<FeedForwardReluNode>(X.shape(), rows, precision);
  node->X_ = X2;
  node->W1_ = W1;
  node->W2_ = W2;
  node->H_ = std::move(H);
  return attach(std::move(Y), std::move(node), {&x, &w1, &b1, &w2, &b2});
}

// a, b (..., D), gamma, beta (D) -> (..., D).
Variable add_layer_norm(const Variable& a, const Variable& b, const Variable& gamma,
                        const Variable& beta, float eps) {
  LayerNormOutput out = add_layer_norm(a.data(), b.data(), gamma.data(), beta.data(), eps);
  if (!record_needed({&a, &b, &gamma, &beta})) return Variable(std::move(out.y));
  auto node = std::make_shared<AddLayerNormNode>();
  node->a_ = a.data();
  node->b_ = b.data();
  node->mean_ = std::move(out.mean);
  node->rstd_ = std::move(out.rstd);
  node->gamma_ = gamma.data();
  return attach(std::move(out.y), std::move(node), {&a, &b, &gamma, &beta});
}

}  // namespace clustr
