// Node: one recorded op in the graph. It saves what its backward needs (and nothing else), has
// one edge per input, and turns the gradient of its output into gradients of its inputs.
//
// Writing an op (see autograd/ops_*.cpp):
//   1. compute the output tensor with the core front doors;
//   2. if record_needed({inputs}), make the node, save what backward needs, and return
//      attach(output, node, {inputs}); otherwise return Variable(output).
// The engine calls backward() once, then release(), then drops the edges.
#pragma once

#include <initializer_list>
#include <memory>
#include <vector>

#include "autograd/variable.h"

namespace clustr {

// Where an input's gradient goes: the node that made it, or the leaf itself, or nowhere (the
// input does not require grad).
struct Edge {
  std::shared_ptr<Node> node;
  std::shared_ptr<VariableImpl> leaf;
  bool active() const { return node != nullptr || leaf != nullptr; }
};

class Node {
 public:
  virtual ~Node();
  virtual const char* name() const = 0;

  // Gradients of the inputs, in input order, given the gradient of the output (the output's
  // shape). An input whose edge is inactive may get an undefined tensor; skip the work with
  // needs_grad(i).
  virtual std::vector<Tensor> backward(const Tensor& grad_output) = 0;
  // Drops saved tensors (override when the node saves any).
  virtual void release() {}

  bool needs_grad(size_t input) const { return input < next.size() && next[input].active(); }

  std::vector<Edge> next;  // one per input
  Shape output_shape;      // checked against incoming gradients
  bool released = false;   // backward already ran; the saved state is gone
};

// True when grad mode is on and any input requires grad: only then is a node worth making.
bool record_needed(std::initializer_list<const Variable*> inputs);
// Wraps `output` with `node` as its grad_fn, linking one edge per input.
Variable attach(Tensor output, std::shared_ptr<Node> node,
                std::initializer_list<const Variable*> inputs);
// The same for a variable number of inputs (concat).
Variable attach(Tensor output, std::shared_ptr<Node> node, const std::vector<Variable>& inputs);

}  // namespace clustr
