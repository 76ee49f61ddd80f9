// Module: the base of every layer. A module owns named parameters (leaf Variables that require
// grad) and named submodules; names compose with dots in registration order, as in PyTorch:
// "layers.0.attention.query.weight". train()/eval() switch dropout for the whole tree.
//
// A layer registers its parameters and submodules in its constructor, initialised from the
// run's Generator with PyTorch's default schemes (see each layer), and exposes forward().
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/variable.h"

namespace clustr {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter of this module and its submodules, depth first in registration order.
  std::vector<std::pair<std::string, Variable>> named_parameters() const;
  std::vector<Variable> parameters() const;
  int64_t parameter_count() const;  // number of scalars

  void train(bool on = true);  // this module and every submodule
  void eval() { train(false); }
  bool training() const { return training_; }

  void zero_grad();  // forgets every parameter's gradient
  // Moves every parameter's values to `device`, in place: the layers' own handles see the moved
  // tensors. Gradients are forgotten (they would be on the old device). An optimizer keeps
  // state per parameter on the parameter's device, so move the model before making one.
  // Parameters stacked side by side (stack_rows) stay so.
  void to(Device device);

 protected:
  // Registers a parameter (a leaf that requires grad) holding `value`; returns it.
  Variable register_parameter(const std::string& name, Tensor value);
  // Lays the values of `params` (one dtype, device and shape past axis 0) side by side in one
  // new storage, in order, each parameter's tensor becoming a view of its rows: concat of them
  // along axis 0 is then a view (Tensor::adjacent_rows). Values and handles are unchanged.
  static void stack_rows(const std::vector<Variable>& params);
  // Registers a submodule; returns it.
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Variable>>& out) const;

  std::vector<std::pair<std::string, Variable>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Numbered submodules of one type, registered as "0", "1", ...; a parent registers the list
// itself (e.g. as "layers"), which gives PyTorch's nn.ModuleList names "layers.0.<...>".
template <typename M>
class ModuleList : public Module {
 public:
  void push_back(std::shared_ptr<M> module) {
    items_.push_back(register_module(std::to_string(items_.size()), std::move(module)));
  }
  size_t size() const { return items_.size(); }
  M& operator[](size_t i) const { return *items_.at(i); }
  typename std::vector<std::shared_ptr<M>>::const_iterator begin() const { return items_.begin(); }
  typename std::vector<std::shared_ptr<M>>::const_iterator end() const { return items_.end(); }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

}  // namespace clustr
