// Variable: a tensor that remembers how it was made, so that gradients can flow back to the
// leaves (parameters, inputs) that require them. Graphs are built as the code runs (define by
// run): every differentiable op (autograd/ops.h) that sees an input requiring grad records a
// Node holding what its backward needs and edges to its inputs' nodes.
//
// Ownership: a Variable holds its Node; a Node holds its input nodes (and the leaves it feeds),
// never the input Variables' values unless its backward needs them. Dropping the last Variable
// of a graph frees it; backward() frees it too (saved tensors and edges), leaving leaf grads.
#pragma once

#include <memory>

#include "core/tensor.h"

namespace clustr {

class Node;

struct VariableImpl {
  Tensor data;
  Tensor grad;  // undefined until a backward reaches this leaf
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;  // null for leaves
};

class Variable {
 public:
  Variable() = default;
  // A leaf. Parameters are leaves with requires_grad = true.
  explicit Variable(Tensor data, bool requires_grad = false);

  bool defined() const { return impl_ != nullptr; }
  const Tensor& data() const;
  const Shape& shape() const { return data().shape(); }
  int rank() const { return data().rank(); }
  int64_t size(int axis) const { return data().size(axis); }
  int64_t numel() const { return data().numel(); }
  Device device() const { return data().device(); }
  float item() const { return data().item(); }

  bool requires_grad() const;
  bool is_leaf() const;  // made by the user, not by an op
  // Leaves only: parameters switch it on.
  void set_requires_grad(bool requires_grad);

  // The accumulated gradient of a leaf (undefined before any backward reaches it).
  const Tensor& grad() const;
  void zero_grad();  // forgets the gradient (the next backward starts it afresh)

  // Backpropagates d(self)/d(self) = 1 from a one-element variable, or `grad` (self's shape)
  // from any variable; leaf gradients are accumulated (+=). Frees the graph afterwards.
  void backward() const;
  void backward(const Tensor& grad) const;

  // The same values as a new leaf with no history (shares storage).
  Variable detach() const;

  // For op implementations and the engine.
  const std::shared_ptr<VariableImpl>& impl() const { return impl_; }
  static Variable from_impl(std::shared_ptr<VariableImpl> impl);

 private:
  std::shared_ptr<VariableImpl> impl_;
};

// Gradient recording is on by default; while a NoGradGuard lives (on this thread), ops record
// nothing and their results do not require grad (evaluation, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};
bool grad_enabled();

}  // namespace clustr
