// Differentiable arithmetic with NumPy broadcasting: add, sub, mul, div, neg and the ops with a
// scalar. The gradient of an input that was broadcast is summed back to its shape (sum_to).
// Each node saves only what its backward reads: add and sub the two input shapes, mul each
// input only when the other one requires grad, div the divisor (and the dividend when the
// divisor requires grad).
//
// For c = a op b with dc the gradient of c:
//   add: da =  dc,            db = dc
//   sub: da =  dc,            db = -dc
//   mul: da =  dc * b,        db = dc * a
//   div: da =  dc / b,        db = -dc * a / b^2
// each reduced with sum_to to the input's shape.
#include <memory>
#include <vector>

#include "autograd/node.h"
#include "autograd/ops.h"
#include "core/ops.h"

namespace clustr {

namespace {

// g summed to `shape`, or g itself when nothing was broadcast (the engine copies gradients it
// keeps, so sharing one tensor between inputs is safe).
Tensor reduce_to(const Tensor& g, const Shape& shape) {
  return g.shape() == shape ? g : sum_to(g, shape);
}

class AddNode : public Node {
 public:
  AddNode(Shape a, Shape b, bool negate_b)
      : a_shape_(std::move(a)), b_shape_(std::move(b)), negate_b_(negate_b) {}
  const char* name() const override { return negate_b_ ? "sub" : "add"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    std::vector<Tensor> out(2);
    if (needs_grad(0)) out[0] = reduce_to(g, a_shape_);
    if (needs_grad(1)) {
      out[1] = reduce_to(g, b_shape_);
      if (negate_b_) out[1] = neg(out[1]);  // negate after reducing: fewer elements
    }
    return out;
  }

 private:
  Shape a_shape_, b_shape_;
  bool negate_b_;
};

class MulNode : public Node {
 public:
  const char* name() const override { return "mul"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    std::vector<Tensor> out(2);
    if (needs_grad(0)) out[0] = reduce_to(mul(g, b_), a_shape_);
    if (needs_grad(1)) out[1] = reduce_to(mul(g, a_), b_shape_);
    return out;
  }
  void release() override { a_ = b_ = Tensor(); }

  Tensor a_, b_;  // a only when b requires grad, b only when a does
  Shape a_shape_, b_shape_;
};

class DivNode : public Node {
 public:
  const char* name() const override { return "div"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    std::vector<Tensor> out(2);
    const Tensor q = div(g, b_);  // dc / b, shared by both gradients
    if (needs_grad(0)) out[0] = reduce_to(q, a_shape_);
    if (needs_grad(1)) out[1] = neg(reduce_to(div(mul(q, a_), b_), b_shape_));
    return out;
  }
  void release() override { a_ = b_ = Tensor(); }

  Tensor a_, b_;  // b always, a only when b requires grad
  Shape a_shape_, b_shape_;
};

class NegNode : public Node {
 public:
  const char* name() const override { return "neg"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {neg(g)}; }
};

// x + s: the gradient passes through unchanged.
class AddScalarNode : public Node {
 public:
  const char* name() const override { return "add_scalar"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {g}; }
};

class MulScalarNode : public Node {
 public:
  explicit MulScalarNode(float s) : s_(s) {}
  const char* name() const override { return "mul_scalar"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {mul(g, s_)}; }

 private:
  float s_;
};

Variable add_or_sub(const Variable& a, const Variable& b, bool negate_b) {
  Tensor c = negate_b ? sub(a.data(), b.data()) : add(a.data(), b.data());
  if (!record_needed({&a, &b})) return Variable(std::move(c));
  return attach(std::move(c), std::make_shared<AddNode>(a.shape(), b.shape(), negate_b),
                {&a, &b});
}

}  // namespace

// a (sa), b (sb) -> c (broadcast of sa and sb).
Variable add(const Variable& a, const Variable& b) { return add_or_sub(a, b, false); }
Variable sub(const Variable& a, const Variable& b) { return add_or_sub(a, b, true); }

Variable mul(const Variable& a, const Variable& b) {
  Tensor c = mul(a.data(), b.data());
  if (!record_needed({&a, &b})) return Variable(std::move(c));
  auto node = std::make_shared<MulNode>();
  if (b.requires_grad()) node->a_ = a.data();
  if (a.requires_grad()) node->b_ = b.data();
  node->a_shape_ = a.shape();
  node->b_shape_ = b.shape();
  return attach(std::move(c), std::move(node), {&a, &b});
}

Variable div(const Variable& a, const Variable& b) {
  Tensor c = div(a.data(), b.data());
  if (!record_needed({&a, &b})) return Variable(std::move(c));
  auto node = std::make_shared<DivNode>();
  if (b.requires_grad()) node->a_ = a.data();
  node->b_ = b.data();
  node->a_shape_ = a.shape();
  node->b_shape_ = b.shape();
  return attach(std::move(c), std::move(node), {&a, &b});
}

Variable neg(const Variable& x) {
  Tensor y = neg(x.data());
  if (!record_needed({&x})) return Variable(std::move(y));
  return attach(std::move(y), std::make_shared<NegNode>(), {&x});
}

Variable add(const Variable& x, float s) {
  Tensor y = add(x.data(), s);
  if (!record_needed({&x})) return Variable(std::move(y));
  return attach(std::move(y), std::make_shared<AddScalarNode>(), {&x});
}

Variable mul(const Variable& x, float s) {
  Tensor y = mul(x.data(), s);
  if (!record_needed({&x})) return Variable(std::move(y));
  return attach(std::move(y), std::make_shared<MulScalarNode>(s), {&x});
}

}  // namespace clustr
