// The optimizer base (state, checkpoints) and the SGD / Adam-family updates. Per-step scalars
// are computed here on the host; the per-element formulas live in optim/update_math.h and run
// in the CPU loops below or in the CUDA kernels of optim/cuda/update.h, by parameter device.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/cpu/row_clones.h"
#include "core/error.h"
#include "optim/cuda/update.h"
#include "optim/update_math.h"

namespace clustr::optim {

namespace {

constexpr const char* kPrefix = "optimizer.";

// Elementwise loops are split over threads only when they are long enough to pay for it; each
// element is independent, so the result does not depend on the thread count.
constexpr int64_t kParallelMin = 1 << 15;
constexpr int64_t kSpan = 1 << 14;  // elements per parallel work item

void check_lr(const char* op, float lr) {
  CLUSTR_CHECK(std::isfinite(lr) && lr >= 0.0f, op, ": lr must be a finite number >= 0, got ", lr);
}

Tensor step_tensor(int64_t step) {
  CLUSTR_CHECK(step <= INT32_MAX, "optimizer: step count ", step, " does not fit in i32");
  return Tensor::from_int_vector({static_cast<int32_t>(step)}, {});
}

int64_t read_step(const std::string& name, const Tensor& t) {
  CLUSTR_CHECK(t.dtype() == DType::i32 && t.numel() == 1, "optimizer: state ", name,
               " must be a one-element i32 tensor, got ", describe(t));
  const int32_t s = t.to_int_vector()[0];
  CLUSTR_CHECK(s >= 0, "optimizer: state ", name, " is negative (", s, ")");
  return s;
}

// Adam's (or R-Adam's) update of n elements, compiled per instruction set (row_clones.h): its
// square roots and divisions run sixteen lanes at a time with AVX-512 rather than four in the
// library's plain x86-64 build. Without contraction every clone rounds alike.
CLUSTR_ROW_CLONES_NO_CONTRACT
void adam_span(bool radam, float* p, const float* g, float* m, float* v, int64_t n,
               const math::AdamScalars& s) {
  if (radam)
    for (int64_t i = 0; i < n; ++i) math::radam_update(p[i], g[i], m[i], v[i], s);
  else
    for (int64_t i = 0; i < n; ++i) math::adam_update(p[i], g[i], m[i], v[i], s);
}

}  // namespace

NamedParameters number_parameters(const std::vector<Variable>& params) {
  NamedParameters named;
  for (size_t i = 0; i < params.size(); ++i) named.emplace_back(std::to_string(i), params[i]);
  return named;
}

// ---- base ---------------------------------------------------------------------------------------

Optimizer::Optimizer(const char* name, NamedParameters params, float lr,
                     std::vector<std::string> slots)
    : name_(name), params_(std::move(params)), lr_(lr), slot_names_(std::move(slots)),
      state_(params_.size()) {
  check_lr(name_, lr);
  std::map<std::string, int> seen;
  for (const auto& [pname, p] : params_) {
    CLUSTR_CHECK(p.defined(), name_, ": parameter '", pname, "' is an undefined Variable");
    CLUSTR_CHECK(p.is_leaf(), name_, ": parameter '", pname,
                 "' is not a leaf (optimizers update leaves; use detach())");
    CLUSTR_CHECK(p.data().dtype() == DType::f32, name_, ": parameter '", pname,
                 "' must be f32, got ", describe(p.data()));
    CLUSTR_CHECK(seen[pname]++ == 0, name_, ": parameter name '", pname, "' appears twice");
  }
}

void Optimizer::set_lr(float lr) {
  check_lr(name_, lr);
  lr_ = lr;
}

void Optimizer::zero_grad() {
  for (auto& np : params_) np.second.zero_grad();
}

void Optimizer::step() {
  // Check everything first, so that a bad parameter leaves no half-updated model.
  for (const auto& [pname, p] : params_) {
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    CLUSTR_CHECK(g.dtype() == DType::f32 && g.shape() == p.shape() && g.device() == p.device(),
                 name_, ": gradient of '", pname,
                 "' must be f32 of the parameter's shape and device, ", describe(p.data()),
                 ", got ", describe(g));
  }
  ++step_count_;
  // Parameters in order, in runs of the same device and step number: one update() per run
  // (usually one for the whole model).
  std::vector<ParamUpdate> run;
  Device run_device = Device::cpu;
  int64_t run_step = 0;
  auto flush = [&] {
    if (!run.empty()) update(run_device, run_step, run);
    run.clear();
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    const Variable& p = params_[i].second;
    const Tensor& g = p.grad();
    if (!g.defined()) continue;
    ParamState& st = state_[i];
    if (st.step == 0 && st.slots.empty())
      for (size_t k = 0; k < slot_names_.size(); ++k)
        st.slots.push_back(Tensor::zeros(p.shape(), DType::f32, p.device()));
    ++st.step;
    if (!run.empty() && (p.device() != run_device || st.step != run_step)) flush();
    run_device = p.device();
    run_step = st.step;
    ParamUpdate u{p.data().f32(), g.f32(), {}, p.numel()};
    for (const Tensor& s : st.slots) u.slots.push_back(s.f32());
    run.push_back(std::move(u));
  }
  flush();
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back(std::string(kPrefix) + "step", step_tensor(step_count_));
  out.emplace_back(std::string(kPrefix) + "lr", Tensor::scalar(lr_));
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamState& st = state_[i];
    if (st.step == 0) continue;
    const std::string base = kPrefix + params_[i].first + ".";
    out.emplace_back(base + "step", step_tensor(st.step));
    for (size_t k = 0; k < slot_names_.size(); ++k)
      out.emplace_back(base + slot_names_[k], st.slots[k].to(Device::cpu));
  }
  return out;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& state) {
  auto find = [&](const std::string& name) -> const Tensor* {
    auto it = state.find(name);
    return it == state.end() ? nullptr : &it->second;
  };
  // Every name must be one we would have written.
  std::map<std::string, bool> known{{std::string(kPrefix) + "step", true},
                                    {std::string(kPrefix) + "lr", true}};
  for (const auto& np : params_) {
    known[kPrefix + np.first + ".step"] = true;
    for (const auto& s : slot_names_) known[kPrefix + np.first + "." + s] = true;
  }
  for (const auto& kv : state)
    CLUSTR_CHECK(known.count(kv.first), name_, ".load_state_dict: unexpected state tensor '",
                 kv.first, "' (no such parameter or slot for this optimizer)");

  const Tensor* step = find(std::string(kPrefix) + "step");
  CLUSTR_CHECK(step, name_, ".load_state_dict: missing '", kPrefix, "step'");
  const int64_t step_count = read_step(std::string(kPrefix) + "step", *step);
  float lr = lr_;
  if (const Tensor* t = find(std::string(kPrefix) + "lr")) {
    CLUSTR_CHECK(t->dtype() == DType::f32 && t->numel() == 1, name_, ".load_state_dict: '",
                 kPrefix, "lr' must be a one-element f32 tensor, got ", describe(*t));
    lr = t->item();
    check_lr(name_, lr);
  }
  // Build the new state completely before replacing the old one.
  std::vector<ParamState> fresh(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [pname, p] = params_[i];
    const std::string base = kPrefix + pname + ".";
    const Tensor* ps = find(base + "step");
    if (!ps) {
      for (const auto& s : slot_names_)
        CLUSTR_CHECK(!find(base + s), name_, ".load_state_dict: '", base + s, "' without '",
                     base, "step'");
      continue;
    }
    fresh[i].step = read_step(base + "step", *ps);
    for (const auto& s : slot_names_) {
      const Tensor* t = find(base + s);
      CLUSTR_CHECK(t, name_, ".load_state_dict: missing '", base + s, "'");
      CLUSTR_CHECK(t->dtype() == DType::f32 && t->shape() == p.shape(), name_,
                   ".load_state_dict: '", base + s, "' must match the parameter, ",
                   describe(p.data()), ", got ", describe(*t));
      fresh[i].slots.push_back(t->to(p.device()));
    }
  }
  state_ = std::move(fresh);
  step_count_ = step_count;
  lr_ = lr;
}

// ---- SGD ----------------------------------------------------------------------------------------

Sgd::Sgd(NamedParameters params, const SgdOptions& o)
    : Optimizer("SGD", std::move(params), o.lr,
                o.momentum != 0.0f ? std::vector<std::string>{"momentum_buffer"}
                                   : std::vector<std::string>{}),
      options_(o) {
  CLUSTR_CHECK(o.momentum >= 0.0f && o.momentum < 1.0f, "SGD: momentum must be in [0, 1), got ",
               o.momentum);
  CLUSTR_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0f,
               "SGD: weight_decay must be >= 0, got ", o.weight_decay);
  CLUSTR_CHECK(!o.nesterov || o.momentum > 0.0f, "SGD: nesterov needs momentum > 0, got momentum ",
               o.momentum);
}

namespace {
// The parameters' pointers for the multi-tensor kernels (slots a, b: the first two, or null).
std::vector<cuda::TensorSlots> tensor_slots(const std::vector<Optimizer::ParamUpdate>& params) {
  std::vector<cuda::TensorSlots> ts;
  for (const Optimizer::ParamUpdate& u : params)
    ts.push_back({u.p, u.g, u.slots.size() > 0 ? u.slots[0] : nullptr,
                  u.slots.size() > 1 ? u.slots[1] : nullptr, u.n});
  return ts;
}
}  // namespace

math::StepScalars Sgd::scalars_at(int64_t t, float lr) const {
  math::StepScalars s{};
  s.sgd = {lr, options_.momentum, options_.weight_decay, options_.nesterov, t == 1};
  return s;
}

void Sgd::update_on_device(const std::vector<ParamUpdate>& params,
                           const math::DeviceStepState* state) {
  cuda::sgd_update_many(tensor_slots(params), state);
}

void Sgd::update(Device device, int64_t t, const std::vector<ParamUpdate>& params) {
  const math::SgdScalars s = scalars_at(t, lr()).sgd;
  if (device == Device::cuda) return cuda::sgd_update_many(tensor_slots(params), s);
  for (const ParamUpdate& u : params) {
    float* p = u.p;
    const float* g = u.g;
    float* buf = u.slots.empty() ? nullptr : u.slots[0];
#pragma omp parallel for schedule(static) if (u.n >= kParallelMin)
    for (int64_t i = 0; i < u.n; ++i) {
      float dummy = 0.0f;
      math::sgd_update(p[i], g[i], buf ? buf[i] : dummy, s);
    }
  }
}

// ---- Adam family --------------------------------------------------------------------------------

double radam_rho(double beta2, int64_t t) {
  const double rho_inf = 2.0 / (1.0 - beta2) - 1.0;
  const double b2t = std::pow(beta2, static_cast<double>(t));
  return rho_inf - 2.0 * static_cast<double>(t) * b2t / (1.0 - b2t);
}

AdamBase::AdamBase(const char* name, AdamVariant variant, NamedParameters params,
                   const AdamOptions& o)
    : Optimizer(name, std::move(params), o.lr, {"exp_avg", "exp_avg_sq"}),
      variant_(variant), options_(o) {
  CLUSTR_CHECK(o.beta1 >= 0.0f && o.beta1 < 1.0f, name, ": beta1 must be in [0, 1), got ",
               o.beta1);
  CLUSTR_CHECK(o.beta2 >= 0.0f && o.beta2 < 1.0f, name, ": beta2 must be in [0, 1), got ",
               o.beta2);
  CLUSTR_CHECK(std::isfinite(o.eps) && o.eps > 0.0f, name, ": eps must be > 0, got ", o.eps);
  CLUSTR_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0f, name,
               ": weight_decay must be >= 0, got ", o.weight_decay);
  // With beta2 this small rho_inf <= 5 and R-Adam would never rectify (PyTorch accepts it).
}

math::StepScalars AdamBase::scalars_at(int64_t t, float lr) const {
  const AdamOptions& o = options_;
  const double td = static_cast<double>(t);
  const double bc1 = 1.0 - std::pow(static_cast<double>(o.beta1), td);
  const double bc2 = 1.0 - std::pow(static_cast<double>(o.beta2), td);
  const bool decoupled = o.decay == WeightDecay::decoupled;
  math::AdamScalars s{};
  s.beta1 = o.beta1;
  s.beta2 = o.beta2;
  s.l2 = decoupled ? 0.0f : o.weight_decay;
  s.decay_factor = decoupled ? static_cast<float>(1.0 - double(lr) * o.weight_decay) : 1.0f;
  s.step_size = static_cast<float>(lr / bc1);
  s.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  s.eps = o.eps;
  const bool radam = variant_ == AdamVariant::radam;
  if (radam) {
    const double beta2 = o.beta2;
    const double rho_inf = 2.0 / (1.0 - beta2) - 1.0;
    const double rho_t = radam_rho(beta2, t);
    s.rectified = rho_t > 5.0;
    s.rect = s.rectified ? static_cast<float>(std::sqrt((rho_t - 4) * (rho_t - 2) * rho_inf /
                                                        ((rho_inf - 4) * (rho_inf - 2) * rho_t)))
                         : 1.0f;
  }
  math::StepScalars out{};
  out.adam = s;
  return out;
}

void AdamBase::update_on_device(const std::vector<ParamUpdate>& params,
                                const math::DeviceStepState* state) {
  cuda::adam_update_many(tensor_slots(params), state, variant_ == AdamVariant::radam);
}

void AdamBase::update(Device device, int64_t t, const std::vector<ParamUpdate>& params) {
  const math::AdamScalars s = scalars_at(t, lr()).adam;
  const bool radam = variant_ == AdamVariant::radam;
  if (device == Device::cuda) return cuda::adam_update_many(tensor_slots(params), s, radam);
  for (const ParamUpdate& u : params) {
    const int64_t items = (u.n + kSpan - 1) / kSpan;
#pragma omp parallel for schedule(static) if (u.n >= kParallelMin)
    for (int64_t item = 0; item < items; ++item) {
      const int64_t i0 = item * kSpan;
      adam_span(radam, u.p + i0, u.g + i0, u.slots[0] + i0, u.slots[1] + i0,
                std::min(kSpan, u.n - i0), s);
    }
  }
}

AdamOptions adamw_defaults() {
  AdamOptions o;
  o.weight_decay = 0.01f;
  o.decay = WeightDecay::decoupled;
  return o;
}

AdamW::AdamW(NamedParameters params, AdamOptions options)
    : AdamBase("AdamW", AdamVariant::adam, std::move(params),
               (options.decay = WeightDecay::decoupled, options)) {}

}  // namespace clustr::optim
