#include "autograd/node.h"

#include "autograd/variable.h"
#include "core/error.h"

namespace clustr {

// Dropping the last reference to a long chain of nodes would destroy them recursively (each
// node's destructor releasing the next), which overflows the stack for graphs of some
// hundred thousand ops. Instead each destructor takes over the edges of every node that it is
// the last owner of and lets go of them one at a time.
Node::~Node() {
  std::vector<std::shared_ptr<Node>> pending;
  for (Edge& e : next)
    if (e.node) pending.push_back(std::move(e.node));
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    if (n.use_count() == 1)  // we hold the last reference: adopt its edges before it dies
      for (Edge& e : n->next)
        if (e.node) pending.push_back(std::move(e.node));
  }
}

bool record_needed(std::initializer_list<const Variable*> inputs) {
  if (!grad_enabled()) return false;
  for (const Variable* v : inputs)
    if (v->defined() && v->requires_grad()) return true;
  return false;
}

namespace {
Edge edge_to(const Variable& v) {
  Edge e;
  if (!v.defined() || !v.requires_grad()) return e;
  if (v.impl()->grad_fn)
    e.node = v.impl()->grad_fn;
  else
    e.leaf = v.impl();
  return e;
}

Variable finish(Tensor output, std::shared_ptr<Node> node) {
  node->output_shape = output.shape();
  auto impl = std::make_shared<VariableImpl>();
  impl->data = std::move(output);
  impl->requires_grad = true;
  impl->grad_fn = std::move(node);
  return Variable::from_impl(std::move(impl));
}
}  // namespace

Variable attach(Tensor output, std::shared_ptr<Node> node,
                std::initializer_list<const Variable*> inputs) {
  node->next.clear();
  for (const Variable* v : inputs) node->next.push_back(edge_to(*v));
  return finish(std::move(output), std::move(node));
}

Variable attach(Tensor output, std::shared_ptr<Node> node, const std::vector<Variable>& inputs) {
  node->next.clear();
  for (const Variable& v : inputs) node->next.push_back(edge_to(v));
  return finish(std::move(output), std::move(node));
}

}  // namespace clustr
