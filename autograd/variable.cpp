#include "autograd/variable.h"

#include "autograd/node.h"
#include "core/error.h"

namespace clustr {

namespace {
thread_local bool g_grad_enabled = true;

const VariableImpl& checked(const std::shared_ptr<VariableImpl>& impl, const char* what) {
  CLUSTR_CHECK(impl != nullptr, what, ": use of an undefined Variable");
  return *impl;
}
}  // namespace

bool grad_enabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = previous_; }

Variable::Variable(Tensor data, bool requires_grad) : impl_(std::make_shared<VariableImpl>()) {
  CLUSTR_CHECK(data.defined(), "Variable: cannot wrap an undefined tensor");
  CLUSTR_CHECK(!requires_grad || data.dtype() == DType::f32,
               "Variable: only f32 tensors can require grad, got ", describe(data));
  impl_->data = std::move(data);
  impl_->requires_grad = requires_grad;
}

Variable Variable::from_impl(std::shared_ptr<VariableImpl> impl) {
  Variable v;
  v.impl_ = std::move(impl);
  return v;
}

const Tensor& Variable::data() const { return checked(impl_, "Variable::data").data; }
bool Variable::requires_grad() const { return checked(impl_, "requires_grad").requires_grad; }
bool Variable::is_leaf() const { return checked(impl_, "is_leaf").grad_fn == nullptr; }
const Tensor& Variable::grad() const { return checked(impl_, "Variable::grad").grad; }

void Variable::set_requires_grad(bool requires_grad) {
  checked(impl_, "set_requires_grad");
  CLUSTR_CHECK(is_leaf(), "set_requires_grad: only leaves can change requires_grad (this ",
               "Variable was made by ", impl_->grad_fn->name(), "; use detach())");
  CLUSTR_CHECK(!requires_grad || impl_->data.dtype() == DType::f32,
               "set_requires_grad: only f32 tensors can require grad, got ", describe(impl_->data));
  impl_->requires_grad = requires_grad;
}

void Variable::zero_grad() {
  checked(impl_, "zero_grad");
  impl_->grad = Tensor();
}

Variable Variable::detach() const { return Variable(data(), false); }

}  // namespace clustr
