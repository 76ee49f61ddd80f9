// The backward engine. From the root's node it counts, for every reachable node, how many
// edges lead into it; then it runs nodes in an order where each runs only after every node
// that feeds it a gradient (a topological order, found with explicit stacks: no recursion, so
// graph depth is unlimited). Gradients meeting at a node are summed (in place when nothing
// else uses the partial sum; where the node making a later one can add it into the sum as it
// computes it, it is offered the sum: Node::backward_adding); gradients reaching a leaf are
// accumulated into leaf.grad (+=).
// Each node drops its saved tensors and its edges as soon as it has run, so memory falls back
// while backward proceeds.
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "autograd/node.h"
#include "autograd/variable.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/ops.h"

namespace clustr {

namespace {

void check_grad_shape(const Tensor& g, const Shape& expected, const char* node, size_t input) {
  CLUSTR_CHECK(g.shape() == expected, "backward: ", node, " produced a gradient of shape ",
               to_string(g.shape()), " for its input ", input, ", expected ",
               to_string(expected));
}

// The first gradient of a leaf is taken over when nothing else uses its storage (or, with
// `exclusive`, when only other disjoint parts of it do), and copied otherwise (a gradient may
// be shared with other edges: add passes one tensor to both inputs; and the caller's own
// gradient tensor must stay as it is). Later ones are added in place.
void accumulate_leaf(VariableImpl& leaf, Tensor g, bool exclusive = false) {
  if (!leaf.grad.defined())
    leaf.grad = exclusive || g.sole_owner() ? std::move(g) : g.clone();
  else
    add_(leaf.grad, g);
}

// Which of a node's gradients are disjoint row blocks of one storage that nothing else uses
// (concat's along axis 0: the parts of one gradient, handed to the stacked parameters it was
// made of). Each may be taken over by its leaf: writes to one never reach another. Empty when
// none is (most nodes: nothing is allocated for them).
std::vector<bool> exclusive_parts(const std::vector<Tensor>& grads) {
  std::vector<bool> exclusive;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!grads[i].defined()) continue;
    bool seen = false;  // a group is looked at from its first member
    for (size_t j = 0; j < i && !seen; ++j)
      seen = grads[j].defined() && grads[j].shares_storage(grads[i]);
    if (seen) continue;
    std::vector<size_t> group{i};
    for (size_t j = i + 1; j < grads.size(); ++j)
      if (grads[j].defined() && grads[j].shares_storage(grads[i])) group.push_back(j);
    if (group.size() < 2) continue;
    std::vector<const Tensor*> parts;
    for (size_t j : group) parts.push_back(&grads[j]);
    if (!Tensor::sole_owners(parts)) continue;
    std::vector<Tensor> blocks;
    for (size_t j : group) blocks.push_back(grads[j]);
    if (!Tensor::adjacent_rows(blocks).defined()) continue;
    exclusive.resize(grads.size(), false);
    for (size_t j : group) exclusive[j] = true;
  }
  return exclusive;
}

// The sums node n is offered (Node::backward_adding) with its gradient g: for each input made
// by a node, the sum of the gradients that have reached it so far, taken out of `pending` when
// nothing else uses its storage (or only g, where n allows it: Node::SumOffer). An input reached
// through two edges of n is offered once. Undefined where there is none to offer; empty when
// there is none at all.
std::vector<Tensor> offered_sums(const Node& n, const Tensor& g,
                                 std::unordered_map<Node*, Tensor>& pending) {
  const bool after_reading = n.takes_sums() == Node::SumOffer::after_reading;
  std::vector<Tensor> sums;
  for (size_t i = 0; i < n.next.size(); ++i) {
    if (!n.next[i].node || !n.needs_grad(i)) continue;
    auto it = pending.find(n.next[i].node.get());
    if (it == pending.end() || !it->second.defined() || it->second.dtype() != DType::f32)
      continue;
    const Tensor& sum = it->second;
    if (!sum.sole_owner() && !(after_reading && Tensor::sole_owners({&sum, &g}))) continue;
    sums.resize(n.next.size());
    sums[i] = std::move(it->second);
    pending.erase(it);
  }
  return sums;
}

void run_backward(const Variable& root, const Tensor& grad) {
  CLUSTR_CHECK(root.defined(), "backward: use of an undefined Variable");
  CLUSTR_CHECK(root.requires_grad(), "backward: this Variable does not require grad (no input ",
               "of the ops that made it requires grad, or it was made under NoGradGuard)");
  CLUSTR_CHECK(grad.defined() && grad.dtype() == DType::f32 && grad.shape() == root.shape() &&
                   grad.device() == root.device(),
               "backward: the gradient must be an f32 tensor of the variable's shape and device: ",
               "variable ", describe(root.data()), ", gradient ", describe(grad));
  if (root.is_leaf()) return accumulate_leaf(*root.impl(), grad);

  const std::shared_ptr<Node>& start = root.impl()->grad_fn;
  // 1. Count the edges into every reachable node.
  std::unordered_map<Node*, int> dependencies;
  std::unordered_set<Node*> seen{start.get()};
  std::vector<Node*> stack{start.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    CLUSTR_CHECK(!n->released, "backward: the graph was already used by a backward() and has ",
                 "been freed (node ", n->name(), "); run the forward pass again");
    for (const Edge& e : n->next)
      if (e.node) {
        ++dependencies[e.node.get()];
        if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
      }
  }

  // 2. Run the nodes whose every incoming gradient has arrived.
  std::unordered_map<Node*, Tensor> pending{{start.get(), grad}};
  std::vector<std::shared_ptr<Node>> ready{start};
  while (!ready.empty()) {
    std::shared_ptr<Node> n = std::move(ready.back());
    ready.pop_back();
    Tensor g = std::move(pending[n.get()]);
    pending.erase(n.get());

    std::vector<Tensor> grads, sums;
    if (g.defined()) {  // no gradient arrived at all: nothing to propagate
      check_grad_shape(g, n->output_shape, n->name(), 0);
      if (n->takes_sums() != Node::SumOffer::none) sums = offered_sums(*n, g, pending);
      grads = sums.empty() ? n->backward(g) : n->backward_adding(g, sums);
      CLUSTR_CHECK(grads.size() == n->next.size(), "backward: ", n->name(), " returned ",
                   grads.size(), " gradients for ", n->next.size(), " inputs");
    }
    g = Tensor();  // a gradient that is a view of g (reshape) may now be its storage's only user
    grads.resize(n->next.size());
    n->release();
    n->released = true;
    std::vector<Edge> edges = std::move(n->next);
    n->next.clear();
    const std::vector<bool> exclusive = exclusive_parts(grads);

    for (size_t i = 0; i < edges.size(); ++i) {
      Edge& e = edges[i];
      Tensor& gi = grads[i];
      if (e.leaf && gi.defined()) {
        check_grad_shape(gi, e.leaf->data.shape(), n->name(), i);
        accumulate_leaf(*e.leaf, std::move(gi), i < exclusive.size() && exclusive[i]);
      }
      if (!e.node) continue;
      if (i < sums.size() && sums[i].defined()) {  // the sum taken out for the offer goes back
        Tensor& slot = pending[e.node.get()];
        if (gi.defined() && gi.shares_storage(sums[i]) && gi.raw() == sums[i].raw()) {
          check_grad_shape(gi, e.node->output_shape, n->name(), i);
          slot = std::move(gi);  // the node added its gradient into the sum
          gi = Tensor();
        } else {
          slot = std::move(sums[i]);
        }
      }
      if (gi.defined()) {
        check_grad_shape(gi, e.node->output_shape, n->name(), i);
        // Gradients meeting at a node are summed, in place when no one else sees the sum so
        // far (the same bits as add: a + b rounded once).
        Tensor& slot = pending[e.node.get()];
        if (!slot.defined())
          slot = std::move(gi);
        else if (slot.sole_owner())
          add_(slot, gi);
        else
          slot = add(slot, gi);
      }
      if (--dependencies[e.node.get()] == 0) ready.push_back(std::move(e.node));
    }
  }
}

// The gradient backward() starts from: a 1 of the variable's shape. On the CUDA device one
// kept tensor serves every backward (a fill launch a step saved), except while a graph is being
// captured (a tensor made then would belong to the graph's pool). Held here too, it is never
// the sole owner of its storage, so the engine never writes into it (sums and leaves copy).
// Made once, and waited for then, so that a backward on any stream may read it.
Tensor seed_gradient(const Shape& shape, Device device) {
  if (device != Device::cuda || cuda::capturing()) return Tensor::full(shape, 1.0f, device);
  static std::mutex mu;
  static Tensor one;
  std::lock_guard<std::mutex> lock(mu);
  if (!one.defined()) {
    Tensor made = Tensor::full({}, 1.0f, Device::cuda);
    (void)made.item();  // read back through its stream: the fill is done
    one = std::move(made);
  }
  return one.reshape(shape);
}

}  // namespace

void Variable::backward() const {
  CLUSTR_CHECK(defined(), "backward: use of an undefined Variable");
  CLUSTR_CHECK(numel() == 1, "backward: without an explicit gradient the variable must have one ",
               "element, got ", describe(data()), " (pass the upstream gradient)");
  run_backward(*this, seed_gradient(shape(), device()));
}

void Variable::backward(const Tensor& grad) const { run_backward(*this, grad); }

}  // namespace clustr
