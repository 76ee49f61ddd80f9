// Differentiable matrix products and lookups: matmul (with transpose flags, rank 2 or batched
// rank 3), linear and embedding. Every gradient of a product is one GEMM whose transpose flags
// absorb the transposes, so no transposed copy is ever made.
//
// matmul, C = op_a(A) op_b(B) (op = identity or transpose), dC the gradient of C:
//   dA = dC op_b(B)^T          when A is not transposed: matmul(dC, B, false, !tb)
//   dA = (dC op_b(B)^T)^T      when it is:               matmul(B, dC, tb, true)
//   dB = op_a(A)^T dC          when B is not transposed: matmul(A, dC, !ta, false)
//   dB = (op_a(A)^T dC)^T      when it is:               matmul(dC, A, true, ta)
//
// linear, x (..., in) viewed as X (R, in) with R the product of the leading sizes, W (out, in),
// b (out): Y (R, out) = X W^T + b, and
//   dX = dY W (R, in),   dW = dY^T X (out, in),   db = sum of the rows of dY (out)
// (core linear_backward: db comes out of dW's GEMM).
//
// embedding, table (V, D), index i32 (...): y (..., D) = table[index]; dtable (V, D) = zeros
// with dy's rows added at their indices (repeated indices add up).
//
// matmul and linear run their products in this thread's precision (core/precision.h) and
// record it, so that backward's products use the forward's precision.
#include <memory>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/ops.h"

namespace clustr {

namespace {

class MatmulNode : public Node {
 public:
  MatmulNode(bool trans_a, bool trans_b, Precision precision)
      : ta_(trans_a), tb_(trans_b), precision_(precision) {}
  const char* name() const override { return "matmul"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    std::vector<Tensor> out(2);
    const Precision p = precision_;
    if (needs_grad(0))
      out[0] = ta_ ? matmul(B_, g, tb_, true, p) : matmul(g, B_, false, !tb_, p);
    if (needs_grad(1))
      out[1] = tb_ ? matmul(g, A_, true, ta_, p) : matmul(A_, g, !ta_, false, p);
    return out;
  }
  void release() override { A_ = B_ = Tensor(); }

  Tensor A_, B_;  // A only when B requires grad, B only when A does

 private:
  bool ta_, tb_;
  Precision precision_;
};

class LinearNode : public Node {
 public:
  LinearNode(Shape x_shape, int64_t rows, int64_t out_features, bool has_bias,
             Precision precision)
      : x_shape_(std::move(x_shape)),
        rows_(rows),
        out_(out_features),
        has_bias_(has_bias),
        precision_(precision) {}
  const char* name() const override { return "linear"; }
  std::vector<Tensor> backward(const Tensor& g) override { return backward_adding(g, {}); }
  // dx's product adds into the sum waiting at x (the residual branch's gradient, in a layer);
  // not into g itself, which dW's product may still be reading.
  SumOffer takes_sums() const override { return SumOffer::separate; }
  std::vector<Tensor> backward_adding(const Tensor& g, const std::vector<Tensor>& sums) override {
    std::vector<Tensor> out(has_bias_ ? 3 : 2);
    const Tensor dy = g.reshape({rows_, out_});  // (R, out)
    LinearGrads d = linear_backward(dy, X_, W_, needs_grad(0), needs_grad(1),
                                    has_bias_ && needs_grad(2), precision_,
                                    sums.empty() ? Tensor() : sums[0]);
    if (needs_grad(0)) out[0] = d.dx.reshape(x_shape_);  // the sum itself, where it took it
    out[1] = std::move(d.dW);
    if (has_bias_) out[2] = std::move(d.db);
    return out;
  }
  void release() override { X_ = W_ = Tensor(); }

  Tensor X_, W_;  // X (R, in) only when W requires grad, W only when x does

 private:
  Shape x_shape_;
  int64_t rows_, out_;
  bool has_bias_;
  Precision precision_;
};

class EmbeddingNode : public Node {
 public:
  EmbeddingNode(Tensor index, Shape table_shape)
      : index_(std::move(index)), table_shape_(std::move(table_shape)) {}
  const char* name() const override { return "embedding"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {scatter_sum_rows(table_shape_[0], index_, g)};
  }
  void release() override { index_ = Tensor(); }

 private:
  Tensor index_;
  Shape table_shape_;
};

}  // namespace

// A (.., M, K) or its transpose, B (.., K, N) or its transpose -> (.., M, N).
Variable matmul(const Variable& A, const Variable& B, bool trans_a, bool trans_b) {
  const Precision precision = current_precision();
  Tensor C = matmul(A.data(), B.data(), trans_a, trans_b, precision);
  if (!record_needed({&A, &B})) return Variable(std::move(C));
  auto node = std::make_shared<MatmulNode>(trans_a, trans_b, precision);
  if (B.requires_grad()) node->A_ = A.data();
  if (A.requires_grad()) node->B_ = B.data();
  return attach(std::move(C), std::move(node), {&A, &B});
}

// x (..., in), weight (out, in), bias (out) or undefined -> (..., out).
Variable linear(const Variable& x, const Variable& weight, const Variable& bias) {
  const char* op = "linear";
  CLUSTR_CHECK(x.defined() && weight.defined(), op, ": x and weight must be defined Variables");
  const Tensor& X = x.data();
  const Tensor& W = weight.data();
  CLUSTR_CHECK(W.rank() == 2, op, ": expected weight of rank 2 (out, in), got ", describe(W));
  const int64_t out_features = W.shape()[0], in_features = W.shape()[1];
  CLUSTR_CHECK(X.rank() >= 1 && X.shape().back() == in_features, op, ": expected x (..., ",
               in_features, ") to match weight ", describe(W), ", got x ", describe(X));
  const bool has_bias = bias.defined();
  if (has_bias)
    CLUSTR_CHECK(bias.shape() == Shape{out_features}, op, ": expected bias of shape (",
                 out_features, ",) for weight ", describe(W), ", got ", describe(bias.data()));
  int64_t rows = 1;
  for (int i = 0; i + 1 < X.rank(); ++i) rows *= X.shape()[i];
  const Tensor X2 = X.reshape({rows, in_features});
  // With a bias, one GEMM that adds it as it stores each tile of Y.
  const Precision precision = current_precision();
  Tensor Y = has_bias ? linear_forward(X2, W, bias.data(), false, precision)
                      : matmul(X2, W, false, true, precision);
  Shape y_shape = X.shape();
  y_shape.back() = out_features;
  Y = Y.reshape(y_shape);
  const bool record =
      has_bias ? record_needed({&x, &weight, &bias}) : record_needed({&x, &weight});
  if (!record) return Variable(std::move(Y));
  auto node = std::make_shared<LinearNode>(X.shape(), rows, out_features, has_bias, precision);
  if (weight.requires_grad()) node->X_ = X2;
  if (x.requires_grad()) node->W_ = W;
  if (has_bias) return attach(std::move(Y), std::move(node), {&x, &weight, &bias});
  return attach(std::move(Y), std::move(node), {&x, &weight});
}

// table (V, D), index i32 (...) -> (..., D).
Variable embedding(const Variable& table, const Tensor& index, const Tensor& added) {
  Tensor y = gather_rows(table.data(), index, added);  // validates shapes, dtypes and indices
  if (!record_needed({&table})) return Variable(std::move(y));
  return attach(std::move(y), std::make_shared<EmbeddingNode>(index, table.shape()), {&table});
}

}  // namespace clustr
