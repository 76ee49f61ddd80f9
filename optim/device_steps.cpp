// Steps decided on the device (optim/optimizer.h's DeviceSteps): the host prepares a window's
// scalars, the device runs the steps (optim/cuda/update.h's decide_step and the multi-tensor
// launches that read the state it leaves), the host reads the records back at the window's end.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/error.h"
#include "optim/cuda/update.h"
#include "optim/optimizer.h"

namespace clustr::optim {

namespace {

// Device memory for `bytes` bytes, held by a tensor (i32 words).
Tensor device_bytes(size_t bytes) {
  return Tensor::empty({static_cast<int64_t>((bytes + 3) / 4)}, DType::i32, Device::cuda);
}

template <class T>
T* as(const Tensor& t) {
  return static_cast<T*>(t.raw());
}

// The device state at the start of a window (queued = window: closed, every step queued then
// overflows and makes no update).
void reset_state(const Tensor& state, int32_t queued) {
  math::DeviceStepState s;
  std::memset(&s, 0, sizeof s);
  s.clip_scale = 1.0f;
  s.queued = queued;
  ::clustr::cuda::copy_h2d(state.raw(), &s, sizeof s);
}

}  // namespace

DeviceSteps::DeviceSteps(Optimizer& opt, float clip, int32_t window)
    : opt_(opt), clip_(clip), window_(window) {
  CLUSTR_CHECK(!::clustr::cuda::capturing(), "DeviceSteps: made while a graph is being captured (it "
               "allocates its state; make it before)");
  CLUSTR_CHECK(std::isfinite(clip) && clip >= 0.0f, "DeviceSteps: clip must be a finite number "
               ">= 0 (0: no clipping), got ", clip);
  CLUSTR_CHECK(window >= 1, "DeviceSteps: the window must hold at least one step, got ", window);
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < opt_.params_.size(); ++i) {
    const auto& [name, p] = opt_.params_[i];
    CLUSTR_CHECK(p.device() == Device::cuda, "DeviceSteps: parameter '", name, "' is ",
                 describe(p.data()), "; steps decided on the device need every parameter on the "
                 "CUDA device");
    Optimizer::ParamState& st = opt_.state_[i];
    if (st.slots.empty())
      for (size_t k = 0; k < opt_.slot_names_.size(); ++k)
        st.slots.push_back(Tensor::zeros(p.shape(), DType::f32, p.device()));
    sizes.push_back(p.numel());
  }
  const int64_t blocks = cuda::sum_square_blocks(sizes, &first_);
  partial_ = device_bytes(static_cast<size_t>(blocks > 0 ? blocks : 1) * sizeof(double));
  first_device_ = device_bytes(first_.size() * sizeof(int64_t));
  ::clustr::cuda::copy_h2d(first_device_.raw(), first_.data(), first_.size() * sizeof(int64_t));
  state_ = device_bytes(sizeof(math::DeviceStepState));
  table_ = device_bytes(static_cast<size_t>(window) * sizeof(math::StepScalars));
  records_ = device_bytes(static_cast<size_t>(window) * sizeof(math::StepRecord));
  reset_state(state_, window_);  // closed until prepare()
}

void DeviceSteps::prepare(const std::function<float(int64_t done)>& lr_at) {
  CLUSTR_CHECK(!::clustr::cuda::capturing(), "DeviceSteps::prepare: called while a graph is being "
               "captured (it copies the window's scalars to the device; call it between "
               "replays)");
  math::DeviceStepState before;
  ::clustr::cuda::copy_d2h(&before, state_.raw(), sizeof before);
  if (before.overflow) {
    reset_state(state_, window_);  // reported once
    throw Error("DeviceSteps::prepare: a step ran outside a prepared window (a graph replayed "
                "before prepare() or after collect()) and made no update");
  }
  base_ = opt_.step_count_;
  for (size_t i = 0; i < opt_.params_.size(); ++i)
    CLUSTR_CHECK(opt_.state_[i].step == base_, "DeviceSteps: parameter '", opt_.params_[i].first,
                 "' has taken ", opt_.state_[i].step, " steps but the optimizer ", base_,
                 "; steps decided on the device update every parameter at every step");
  lrs_.assign(static_cast<size_t>(window_), 0.0f);
  std::vector<math::StepScalars> table(static_cast<size_t>(window_));
  for (int32_t k = 0; k < window_; ++k) {
    const float lr = lr_at(base_ + k);
    CLUSTR_CHECK(std::isfinite(lr) && lr >= 0.0f, "DeviceSteps::prepare: the learning rate after ",
                 base_ + k, " steps is ", lr, "; expected a finite number >= 0");
    lrs_[static_cast<size_t>(k)] = lr;
    table[static_cast<size_t>(k)] = opt_.scalars_at(base_ + k + 1, lr);
  }
  ::clustr::cuda::copy_h2d(table_.raw(), table.data(), table.size() * sizeof(math::StepScalars));
  reset_state(state_, 0);
  prepared_ = true;
}

void DeviceSteps::queue_step(const Tensor& loss, const std::vector<Tensor>& extras) {
  // A capture may come before the first window: its replays are what prepare() precedes.
  CLUSTR_CHECK(prepared_ || ::clustr::cuda::capturing(),
               "DeviceSteps::queue_step: no window was prepared (call prepare())");
  CLUSTR_CHECK(loss.defined() && loss.dtype() == DType::f32 && loss.shape() == Shape{} &&
                   loss.device() == Device::cuda,
               "DeviceSteps::queue_step: expected the loss as an f32 scalar () on the CUDA "
               "device, got ", loss.defined() ? describe(loss) : std::string("undefined"));
  CLUSTR_CHECK(extras.size() <= size_t(math::kStepExtras), "DeviceSteps::queue_step: ",
               extras.size(), " extra values; a record holds ", math::kStepExtras);
  std::vector<const float*> extra;
  for (const Tensor& e : extras) {
    CLUSTR_CHECK(e.defined() && e.dtype() == DType::f32 && e.numel() == 1 &&
                     e.device() == Device::cuda,
                 "DeviceSteps::queue_step: expected each extra value as a one-element f32 "
                 "tensor on the CUDA device, got ", e.defined() ? describe(e) : "undefined");
    extra.push_back(e.f32());
  }
  std::vector<const float*> xs;
  std::vector<int64_t> ns;
  std::vector<Optimizer::ParamUpdate> updates;
  for (size_t i = 0; i < opt_.params_.size(); ++i) {
    const auto& [name, p] = opt_.params_[i];
    const Tensor& g = p.grad();
    CLUSTR_CHECK(g.defined(), "DeviceSteps::queue_step: parameter '", name, "' has no gradient; "
                 "steps decided on the device update every parameter at every step");
    CLUSTR_CHECK(g.dtype() == DType::f32 && g.shape() == p.shape() && g.device() == p.device(),
                 "DeviceSteps::queue_step: gradient of '", name,
                 "' must be f32 of the parameter's shape and device, ", describe(p.data()),
                 ", got ", describe(g));
    xs.push_back(g.f32());
    ns.push_back(g.numel());
    Optimizer::ParamUpdate u{p.data().f32(), g.f32(), {}, p.numel()};
    for (const Tensor& s : opt_.state_[i].slots) u.slots.push_back(s.f32());
    updates.push_back(std::move(u));
  }
  auto* state = as<math::DeviceStepState>(state_);
  // The norm's sums and the step's decision (the last sum's last block), then the update,
  // which applies the clip scale as it reads each gradient: two launches for a whole model.
  cuda::decide_step(xs, ns, as<double>(partial_), as<int64_t>(first_device_), loss.f32(), extra,
                    clip_, as<math::StepScalars>(table_), window_, state,
                    as<math::StepRecord>(records_));
  opt_.update_on_device(updates, state);
}

std::vector<math::StepRecord> DeviceSteps::collect() {
  CLUSTR_CHECK(prepared_, "DeviceSteps::collect: no window was prepared (call prepare())");
  math::DeviceStepState st;
  ::clustr::cuda::copy_d2h(&st, state_.raw(), sizeof st);
  std::vector<math::StepRecord> records(static_cast<size_t>(st.queued));
  if (st.queued > 0)
    ::clustr::cuda::copy_d2h(records.data(), records_.raw(),
                             records.size() * sizeof(math::StepRecord));
  // The updates the window made, whatever else: the optimizer then matches the parameters.
  opt_.step_count_ = base_ + st.taken;
  for (Optimizer::ParamState& ps : opt_.state_) ps.step = base_ + st.taken;
  if (st.taken > 0) opt_.lr_ = lrs_[static_cast<size_t>(st.taken - 1)];
  prepared_ = false;
  reset_state(state_, window_);  // closed: a replay before the next prepare() updates nothing
  CLUSTR_CHECK(!st.overflow, "DeviceSteps: more steps were queued than the window of ", window_,
               " holds; those past it made no update (prepare a window before each run of at "
               "most ", window_, " steps)");
  return records;
}

}  // namespace clustr::optim
