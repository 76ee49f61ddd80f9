// Differentiable activations and normalisation: the unary activations, softmax and
// log-softmax, layer norm, dropout and cross-entropy. Every backward is a fused core kernel
// (core/ops.h, "backward kernels of the nn ops"), and each node saves only what that kernel
// reads:
//   exp, sqrt, tanh, sigmoid   y              log, relu, gelu   x
//   softmax, log_softmax       y              layer_norm        x, mean, rstd, gamma
//   dropout                    seed, offset, p (the mask is regenerated, never stored)
//   cross_entropy              logits, target, weight, logsumexp (not the softmax)
#include <memory>
#include <utility>
#include <vector>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/random.h"

namespace clustr {

namespace {


// dx = dy * f'(x); holds x or y, whichever the derivative of op reads (the other undefined).
class UnaryNode : public Node {
 public:
  UnaryNode(UnaryOp op, Tensor x, Tensor y) : op_(op), x_(std::move(x)), y_(std::move(y)) {}
  const char* name() const override { return op_name(op_); }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {unary_backward(op_, x_, y_, g)};
  }
  void release() override { x_ = y_ = Tensor(); }

 private:
  UnaryOp op_;
  Tensor x_, y_;
};

// Ops whose derivative reads the input x (log, relu, gelu) or the output y (exp, sqrt, tanh,
// sigmoid).
enum class Saves { x, y };

Variable unary_op(UnaryOp op, const Variable& x, Saves saves) {
  Tensor y = unary(op, x.data());
  if (!record_needed({&x})) return Variable(std::move(y));
  auto node = saves == Saves::x ? std::make_shared<UnaryNode>(op, x.data(), Tensor())
                                : std::make_shared<UnaryNode>(op, Tensor(), y);
  return attach(std::move(y), std::move(node), {&x});
}

// Softmax (log = false) or log-softmax over the last axis; holds the forward output.
class SoftmaxNode : public Node {
 public:
  SoftmaxNode(Tensor y, bool log) : y_(std::move(y)), log_(log) {}
  const char* name() const override { return log_ ? "log_softmax" : "softmax"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {log_ ? log_softmax_backward(y_, g) : softmax_backward(y_, g)};
  }
  void release() override { y_ = Tensor(); }

 private:
  Tensor y_;
  bool log_;
};

Variable softmax_op(const Variable& x, bool log) {
  Tensor y = log ? log_softmax(x.data()) : softmax(x.data());
  if (!record_needed({&x})) return Variable(std::move(y));
  return attach(y, std::make_shared<SoftmaxNode>(y, log), {&x});
}

// Inputs x, gamma, beta; one fused kernel gives all three gradients.
class LayerNormNode : public Node {
 public:
  const char* name() const override { return "layer_norm"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    LayerNormGrads d = layer_norm_backward(g, x_, mean_, rstd_, gamma_);
    return {std::move(d.dx), std::move(d.dgamma), std::move(d.dbeta)};
  }
  void release() override { x_ = mean_ = rstd_ = gamma_ = Tensor(); }

  Tensor x_, mean_, rstd_, gamma_;
};

// dx = dy * mask / (1 - p) with the forward's mask, regenerated from (seed, offset) (an offset
// in device memory, a draw of a captured graph, is read there again: the replay's own).
class DropoutNode : public Node {
 public:
  DropoutNode(float p, uint64_t seed, PhiloxOffset offset) : p_(p), seed_(seed), offset_(offset) {}
  const char* name() const override { return "dropout"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {dropout_apply(g, p_, seed_, offset_)};
  }

 private:
  float p_;
  uint64_t seed_;
  PhiloxOffset offset_;
};

// Holds the (R, V) view of the logits and the (R) views of target and weight.
class CrossEntropyNode : public Node {
 public:
  const char* name() const override { return "cross_entropy"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    Tensor d = cross_entropy_backward(g, logits_, target_, weight_, lse_, loss_scale_,
                                      ignore_index_);
    return {d.reshape(logits_shape_)};
  }
  void release() override { logits_ = target_ = weight_ = lse_ = loss_scale_ = Tensor(); }

  Tensor logits_, target_, weight_, lse_, loss_scale_;
  Shape logits_shape_;
  int ignore_index_ = -100;
};

}  // namespace

// x (any shape) -> y (same shape).
Variable exp(const Variable& x) { return unary_op(UnaryOp::exp, x, Saves::y); }
Variable log(const Variable& x) { return unary_op(UnaryOp::log, x, Saves::x); }
Variable sqrt(const Variable& x) { return unary_op(UnaryOp::sqrt, x, Saves::y); }
Variable relu(const Variable& x) { return unary_op(UnaryOp::relu, x, Saves::x); }
Variable gelu(const Variable& x) { return unary_op(UnaryOp::gelu, x, Saves::x); }
Variable tanh(const Variable& x) { return unary_op(UnaryOp::tanh, x, Saves::y); }
Variable sigmoid(const Variable& x) { return unary_op(UnaryOp::sigmoid, x, Saves::y); }

// x (..., C) -> y (..., C).
Variable softmax(const Variable& x) { return softmax_op(x, false); }
Variable log_softmax(const Variable& x) { return softmax_op(x, true); }

// x (..., D), gamma, beta (D) -> y (..., D).
Variable layer_norm(const Variable& x, const Variable& gamma, const Variable& beta, float eps) {
  LayerNormOutput out = layer_norm(x.data(), gamma.data(), beta.data(), eps);
  if (!record_needed({&x, &gamma, &beta})) return Variable(std::move(out.y));
  auto node = std::make_shared<LayerNormNode>();
  node->x_ = x.data();
  node->mean_ = std::move(out.mean);
  node->rstd_ = std::move(out.rstd);
  node->gamma_ = gamma.data();
  return attach(std::move(out.y), std::move(node), {&x, &gamma, &beta});
}

// x (any shape) -> y (same shape).
Variable dropout(const Variable& x, float p, Generator& gen, bool training) {
  // Checked in evaluation too, so that a bad p fails at once rather than at the first training
  // step.
  CLUSTR_CHECK(p >= 0.0f && p < 1.0f, "dropout: expected a drop probability p in [0, 1), got ",
               p);
  if (!training || p == 0.0f) return x;
  // A device draw: while a CUDA graph is captured, the offset is a slot that each replay's
  // draws refill (core/random.h's DrawPlan); otherwise the value drawn now.
  const PhiloxOffset offset = reserve_device(gen, dropout_blocks(x.numel()));
  Tensor y = dropout_apply(x.data(), p, gen.seed(), offset);
  if (!record_needed({&x})) return Variable(std::move(y));
  return attach(std::move(y), std::make_shared<DropoutNode>(p, gen.seed(), offset), {&x});
}

// logits (..., V), target i32 (...), weight (...) or undefined -> loss ().
Variable cross_entropy(const Variable& logits, const Tensor& target, const Tensor& weight,
                       int ignore_index, Reduction reduction, Tensor* predictions) {
  const Tensor& z = logits.data();
  CLUSTR_CHECK(z.rank() >= 1, "cross_entropy: expected logits (..., V) with at least one axis, ",
               "got ", describe(z));
  const Shape rows(z.shape().begin(), z.shape().end() - 1);
  CLUSTR_CHECK(target.defined(), "cross_entropy: target is an undefined tensor");
  CLUSTR_CHECK(target.shape() == rows, "cross_entropy: expected target of shape ",
               to_string(rows), " (logits ", describe(z), " without the last axis), got ",
               describe(target));
  CLUSTR_CHECK(!weight.defined() || weight.shape() == rows, "cross_entropy: expected weight of ",
               "shape ", to_string(rows), " (one per target), got ", describe(weight));
  const int64_t R = numel(rows), V = z.shape().back();
  const Tensor z2 = z.reshape({R, V}), t1 = target.reshape({R});
  const Tensor w1 = weight.defined() ? weight.reshape({R}) : Tensor();
  CrossEntropyOutput out =
      cross_entropy(z2, t1, w1, ignore_index, reduction, predictions != nullptr);
  if (predictions) *predictions = out.predictions.reshape(rows);
  if (!record_needed({&logits})) return Variable(std::move(out.loss));
  auto node = std::make_shared<CrossEntropyNode>();
  node->logits_ = z2;
  node->target_ = t1;
  node->weight_ = w1;
  node->lse_ = std::move(out.logsumexp);
  node->logits_shape_ = z.shape();
  node->ignore_index_ = ignore_index;
  node->loss_scale_ = std::move(out.loss_scale);
  return attach(std::move(out.loss), std::move(node), {&logits});
}

}  // namespace clustr
