// Module: parameter and submodule bookkeeping (see module.h).
#include "layers/module.h"

#include "core/error.h"
#include "core/ops.h"

namespace clustr {

namespace {

// A name is one path component: "weight", "query", "0". Dots join components, so a name that
// held one would make two different trees print the same dotted names.
void check_name(const char* what, const std::string& name,
                const std::vector<std::pair<std::string, Variable>>& params,
                const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children) {
  CLUSTR_CHECK(!name.empty(), "Module: ", what, " name must not be empty");
  CLUSTR_CHECK(name.find('.') == std::string::npos, "Module: ", what, " name '", name,
               "' must not contain '.' (dots join the names of nested modules)");
  for (const auto& p : params)
    CLUSTR_CHECK(p.first != name, "Module: cannot register ", what, " '", name,
                 "': a parameter of that name is already registered");
  for (const auto& c : children)
    CLUSTR_CHECK(c.first != name, "Module: cannot register ", what, " '", name,
                 "': a submodule of that name is already registered");
}

}  // namespace

std::vector<std::pair<std::string, Variable>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Variable>> out;
  collect("", out);
  return out;
}

// Own parameters first, then each submodule's, depth first: PyTorch's order for a module that
// registers its parameters before its submodules.
void Module::collect(const std::string& prefix,
                     std::vector<std::pair<std::string, Variable>>& out) const {
  for (const auto& p : params_) out.emplace_back(prefix + p.first, p.second);
  for (const auto& c : children_) c.second->collect(prefix + c.first + ".", out);
}

std::vector<Variable> Module::parameters() const {
  std::vector<Variable> out;
  for (auto& p : named_parameters()) out.push_back(std::move(p.second));
  return out;
}

int64_t Module::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : named_parameters()) n += p.second.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& c : children_) c.second->train(on);
}

void Module::zero_grad() {
  for (auto& p : named_parameters()) p.second.zero_grad();
}

void Module::to(Device device) {
  const auto params = named_parameters();
  std::vector<bool> moved(params.size(), false);
  for (size_t i = 0; i < params.size(); ++i) {
    if (moved[i]) continue;
    // The parameters stacked with this one (stack_rows), in storage order, move as one block.
    std::vector<size_t> group{i};
    for (size_t j = i + 1; j < params.size(); ++j)
      if (params[j].second.data().shares_storage(params[i].second.data())) group.push_back(j);
    std::vector<Tensor> parts;
    for (size_t j : group) parts.push_back(params[j].second.data());
    const Tensor block = Tensor::adjacent_rows(parts);
    if (!block.defined()) {
      group = {i};  // not a stack: each moves on its own
    } else if (block.device() != device) {
      const Tensor moved_block = block.to(device);
      int64_t row = 0;
      for (size_t j : group) {
        VariableImpl& v = *params[j].second.impl();
        v.data = moved_block.rows(row, row + v.data.size(0));
        row += v.data.size(0);
      }
    }
    for (size_t j : group) {
      VariableImpl& v = *params[j].second.impl();
      if (v.data.device() != device) v.data = v.data.to(device);
      v.grad = Tensor();
      moved[j] = true;
    }
  }
}

void Module::stack_rows(const std::vector<Variable>& params) {
  std::vector<Tensor> parts;
  for (const Variable& p : params) parts.push_back(p.data());
  const Tensor stacked = concat(parts, 0);  // validates dtypes, devices and shapes
  int64_t row = 0;
  for (const Variable& p : params) {
    VariableImpl& v = *p.impl();
    v.data = stacked.rows(row, row + v.data.size(0));
    row += v.data.size(0);
  }
}

Variable Module::register_parameter(const std::string& name, Tensor value) {
  check_name("parameter", name, params_, children_);
  CLUSTR_CHECK(value.defined(), "Module: parameter '", name, "' is an undefined tensor");
  CLUSTR_CHECK(value.dtype() == DType::f32, "Module: parameter '", name, "' must be f32, got ",
               describe(value));
  Variable v(std::move(value), /*requires_grad=*/true);
  params_.emplace_back(name, v);
  return v;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_name("submodule", name, params_, children_);
  CLUSTR_CHECK(module != nullptr, "Module: submodule '", name, "' is null");
  CLUSTR_CHECK(module.get() != this, "Module: submodule '", name, "' is the module itself");
  children_.emplace_back(name, std::move(module));
}

}  // namespace clustr
