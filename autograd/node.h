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
  // The same, with an offer from the engine: where other gradients have already reached input
  // i and their sum waits there (f32, the input's shape, used by nothing else), sums[i] is that
  // sum, and the node may add its own gradient for input i into it in place and return sums[i]
  // itself as that gradient: the addition then costs nothing (a product with beta = 1, e.g. a
  // layer's input gradient meeting the residual branch's). sums[i] is undefined elsewhere; a
  // gradient returned as another tensor is added by the engine as usual. Offered only to nodes
  // that say, by takes_sums(), that they may take the offer:
  //   separate       a sum is offered where nothing else uses it;
  //   after_reading  also where grad_output is the sum itself (the other user of its storage:
  //                  an add passes one tensor to both of its inputs, as the residual's layer norm
  //                  does): the node reads grad_output for the last time before it writes into
  //                  the sum.
  enum class SumOffer { none, separate, after_reading };
  virtual SumOffer takes_sums() const { return SumOffer::none; }
  virtual std::vector<Tensor> backward_adding(const Tensor& grad_output,
                                              const std::vector<Tensor>& sums) {
    (void)sums;
    return backward(grad_output);
  }
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
