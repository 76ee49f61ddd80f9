// The optimizers' CUDA kernels (optim/cuda/update.h): the per-element updates of SGD and the
// Adam family for many parameters per launch, one thread per element with the formula of
// optim/update_math.h, and the sum of squares behind clip_grad_norm. Written against core/cuda/kernel.h, so the same code runs on a
// GPU and in device emulation.
#include "optim/cuda/update.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"

namespace clustr::optim::cuda {

namespace {

namespace core_cuda = ::clustr::cuda;
using core_cuda::Dim3;
using core_cuda::Thread;
using core_cuda::global_x;
using core_cuda::grid_stride_x;

// Up to kTensorsPerLaunch tensors, back to back in one index space: tensor k holds the
// elements [start[k], start[k + 1]).
struct TensorList {
  TensorSlots t[kTensorsPerLaunch];
  int64_t start[kTensorsPerLaunch + 1];
  int count;
};

// One update per element of every tensor of the list (grid-stride over them all; a thread's
// indices grow, so it finds each one's tensor by walking forward). Op(slots, j) updates element
// j of one tensor.
// With dev (a step decided on the device) the scalars come from there, and a skipped step
// changes nothing.
template <class Op>
struct ManyKernel {
  static constexpr bool kUsesBarrier = false;
  TensorList list;
  Op op;
  const math::DeviceStepState* dev;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    if (dev && dev->skip) return;
    const Op o = dev ? Op::from(*dev) : op;
    int k = 0;
    const int64_t total = list.start[list.count];
    for (int64_t i = global_x(t); i < total; i += grid_stride_x(t)) {
      while (i >= list.start[k + 1]) ++k;
      o(list.t[k], i - list.start[k]);
    }
  }
};

// Element j's gradient, times the step's clip scale c: written back where c is not 1, so that
// the gradients are left clipped, as clip_grad_norm leaves them (the same bits as a scaling
// pass before the update).
CLUSTR_DEVICE float clipped(const TensorSlots& x, int64_t j, float c) {
  float g = x.g[j];
  if (c != 1.0f) {
    g *= c;
    x.g[j] = g;
  }
  return g;
}

struct SgdOp {
  math::SgdScalars s;
  float clip = 1.0f;
  CLUSTR_DEVICE static SgdOp from(const math::DeviceStepState& d) {
    return {d.scalars.sgd, d.clip_scale};
  }
  CLUSTR_DEVICE void operator()(const TensorSlots& x, int64_t j) const {
    float unused = 0.0f;
    math::sgd_update(x.p[j], clipped(x, j, clip), x.a ? x.a[j] : unused, s);
  }
};

template <bool kRAdam>
struct AdamOp {
  math::AdamScalars s;
  float clip = 1.0f;
  CLUSTR_DEVICE static AdamOp from(const math::DeviceStepState& d) {
    return {d.scalars.adam, d.clip_scale};
  }
  CLUSTR_DEVICE void operator()(const TensorSlots& x, int64_t j) const {
    const float g = clipped(x, j, clip);
    if (kRAdam)
      math::radam_update(x.p[j], g, x.a[j], x.b[j], s);
    else
      math::adam_update(x.p[j], g, x.a[j], x.b[j], s);
  }
};

// Up to kTensorsPerLaunch float arrays for one launch of a sum of squares: array k is
// x[k] (n[k] floats) and owns the launch's blocks [first[k], first[k + 1]).
struct SquaresList {
  const float* x[kTensorsPerLaunch];
  int64_t n[kTensorsPerLaunch];
  int64_t first[kTensorsPerLaunch + 1];
  int count;
};

constexpr unsigned kSumThreads = 256;

// A step decided on the device (one thread): the step's norm from the partial sums (array i's
// [first[i], first[i + 1]) added in order, then the arrays in order: clip_grad_norm's
// additions), its decision, its clip scale, its scalars (table[taken]) and its record.
struct StepDecision {
  const double* partial;
  const int64_t* first;
  int64_t arrays;
  const float* loss;
  const float* extra[math::kStepExtras];  // or null
  double max_norm;  // 0: measure only
  const math::StepScalars* table;
  int32_t window;
  math::DeviceStepState* state;
  math::StepRecord* records;
  CLUSTR_DEVICE void operator()() const {
    double sum_sq = 0.0;
    for (int64_t i = 0; i < arrays; ++i) {
      double s = 0.0;
      for (int64_t b = first[i]; b < first[i + 1]; ++b) s += partial[b];
      sum_sq += s;
    }
    const double norm = ::sqrt(sum_sq);
    const float l = *loss;
    const bool finite = math::finite(l) && math::finite(norm);
    math::DeviceStepState& st = *state;
    st.sum_sq = sum_sq;
    const int32_t q = st.queued;
    if (q >= window || st.taken >= window) {  // more steps than prepared: no update
      st.overflow = 1;
      st.skip = 1;
      return;
    }
    math::StepRecord& r = records[q];
    r.norm = norm;
    r.loss = l;
    r.skipped = finite ? 0 : 1;
    for (int e = 0; e < math::kStepExtras; ++e) r.extra[e] = extra[e] ? *extra[e] : 0.0f;
    st.queued = q + 1;
    st.skip = finite ? 0 : 1;
    if (!finite) return;
    const double coef = max_norm > 0.0 ? math::clip_coefficient(max_norm, norm) : 1.0;
    st.clip_scale = coef < 1.0 ? static_cast<float>(coef) : 1.0f;
    st.scalars = table[st.taken];
    st.taken += 1;
  }
};

// A step's decision with nothing to sum (no gradient element), in a launch of its own.
struct DecideStepKernel {
  static constexpr bool kUsesBarrier = false;
  StepDecision decide;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    if (t.thread_idx().x == 0 && t.block_idx().x == 0) decide();
  }
};

// Block b of the launch -> partial[b]: the sum of double(x)^2 over its array's elements
// j = (b - first[k]) * kSumThreads + thread, striding by the array's blocks * kSumThreads,
// combined over the block by block_reduce's fixed tree. With `arrivals` (the last launch of a
// step decided on the device), the last block to finish then makes the step's decision.
struct SumSquaresKernel {
  static constexpr bool kUsesBarrier = true;
  SquaresList list;
  double* partial;
  StepDecision decide;
  unsigned* arrivals;  // 1 counter, or null: no decision
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    const int64_t b = t.block_idx().x;
    int k = 0;
    while (b >= list.first[k + 1]) ++k;
    const int64_t n = list.n[k];
    const int64_t stride = (list.first[k + 1] - list.first[k]) * int64_t(kSumThreads);
    double acc = 0.0;
    for (int64_t i = (b - list.first[k]) * kSumThreads + t.thread_idx().x; i < n; i += stride) {
      const double xi = list.x[k][i];
      acc += xi * xi;
    }
    const double total = core_cuda::block_reduce(t, acc, t.shared<double>(), core_cuda::AddDouble{});
    if (t.thread_idx().x == 0) partial[b] = total;
    if (arrivals && core_cuda::last_to_arrive(t, arrivals, t.grid_dim().x, t.shared<int>()) &&
        t.thread_idx().x == 0)
      decide();
  }
};

static_assert(sizeof(SumSquaresKernel) <= 4096, "a sum of squares' arguments exceed 4 KiB");

// The blocks of an array of n elements in a sum of squares: one per kSumThreads elements, up
// to 256, enough to keep a GPU's memory busy. A function of n only, so the block sums, and
// their sum, are the same at every call.
int64_t sum_blocks(int64_t n) {
  constexpr int64_t kMaxBlocks = 256;
  const int64_t b = (n + kSumThreads - 1) / kSumThreads;
  return b < kMaxBlocks ? b : kMaxBlocks;
}

// x *= c for every element of every tensor of a list (the slots' p).
struct ScaleOp {
  float c;
  // (A step decided on the device scales in its update instead; ManyKernel needs from().)
  CLUSTR_DEVICE static ScaleOp from(const math::DeviceStepState& d) { return {d.clip_scale}; }
  CLUSTR_DEVICE void operator()(const TensorSlots& x, int64_t j) const { x.p[j] *= c; }
};

Dim3 grid_for(int64_t n) { return {core_cuda::elementwise_blocks(n)}; }
constexpr Dim3 kBlock{core_cuda::kElementwiseThreads};

// Device scratch from the caching allocator, returned on every path out.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : bytes_(bytes), ptr_(core_cuda::alloc(bytes)) {}
  ~Scratch() { core_cuda::free(ptr_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }

 private:
  size_t bytes_;
  void* ptr_;
};

}  // namespace

namespace {

// One launch per kTensorsPerLaunch tensors (empty ones left out).
template <class Op>
void launch_many(const char* name, const std::vector<TensorSlots>& tensors, const Op& op,
                 const math::DeviceStepState* dev = nullptr) {
  // The list travels in the kernel's arguments, which a GPU caps at 4 KiB.
  static_assert(sizeof(ManyKernel<Op>) <= 4096, "a multi-tensor launch's arguments exceed 4 KiB");
  TensorList list{};
  auto flush = [&] {
    if (list.count == 0) return;
    core_cuda::launch(name, grid_for(list.start[list.count]), kBlock, 0,
                      ManyKernel<Op>{list, op, dev});
    list = TensorList{};
  };
  for (const TensorSlots& x : tensors) {
    if (x.n == 0) continue;
    list.t[list.count] = x;
    list.start[list.count + 1] = list.start[list.count] + x.n;
    if (++list.count == kTensorsPerLaunch) flush();
  }
  flush();
}

}  // namespace

void sgd_update_many(const std::vector<TensorSlots>& tensors, const math::SgdScalars& s) {
  if (tensors.empty()) return;
  core_cuda::require("optim::cuda::sgd_update_many");
  launch_many("optim::cuda::sgd_update_many", tensors, SgdOp{s});
}

void adam_update_many(const std::vector<TensorSlots>& tensors, const math::AdamScalars& s,
                      bool radam) {
  if (tensors.empty()) return;
  core_cuda::require("optim::cuda::adam_update_many");
  if (radam)
    launch_many("optim::cuda::radam_update_many", tensors, AdamOp<true>{s});
  else
    launch_many("optim::cuda::adam_update_many", tensors, AdamOp<false>{s});
}

int64_t sum_square_blocks(const std::vector<int64_t>& ns, std::vector<int64_t>* first) {
  first->assign(ns.size() + 1, 0);  // array i's block sums: [first[i], first[i + 1])
  for (size_t i = 0; i < ns.size(); ++i) {
    CLUSTR_CHECK(ns[i] >= 0, "optim::cuda::sum_squares: array ", i, " has length ", ns[i]);
    (*first)[i + 1] = (*first)[i] + sum_blocks(ns[i]);
  }
  return first->back();
}

namespace {

// sum_squares_partials's launches; with `decide`, the last one's last block then decides the
// step, or, with nothing to sum, a launch of its own does.
void sum_squares_then(const std::vector<const float*>& xs, const std::vector<int64_t>& ns,
                      double* partial, const StepDecision* decide) {
  CLUSTR_CHECK(xs.size() == ns.size(), "optim::cuda::sum_squares: ", xs.size(),
               " arrays but ", ns.size(), " lengths");
  core_cuda::require("optim::cuda::sum_squares");
  // One launch per kTensorsPerLaunch non-empty arrays; each block writes the partial sum of
  // its array's slot range.
  std::vector<SquaresList> lists;
  SquaresList list{};
  for (size_t i = 0; i < xs.size(); ++i) {
    if (ns[i] == 0) continue;
    list.x[list.count] = xs[i];
    list.n[list.count] = ns[i];
    list.first[list.count + 1] = list.first[list.count] + sum_blocks(ns[i]);
    if (++list.count == kTensorsPerLaunch) lists.push_back(std::exchange(list, SquaresList{}));
  }
  if (list.count > 0) lists.push_back(list);
  if (lists.empty() && decide) {
    core_cuda::launch("optim::cuda::decide_step", {1}, {32}, 0, DecideStepKernel{*decide});
    return;
  }
  int64_t base = 0;  // the first partial sum of the list's first array
  for (size_t l = 0; l < lists.size(); ++l) {
    const int64_t blocks = lists[l].first[lists[l].count];
    const bool last = l + 1 == lists.size();
    SumSquaresKernel k{lists[l], partial + base, {}, nullptr};
    if (decide && last) {
      k.decide = *decide;
      k.arrivals = core_cuda::arrival_counters(1, "optim::cuda::sum_squares");
    }
    core_cuda::launch("optim::cuda::sum_squares", {static_cast<unsigned>(blocks)}, {kSumThreads},
                      kSumThreads * sizeof(double), k);
    base += blocks;
  }
}

}  // namespace

void sum_squares_partials(const std::vector<const float*>& xs, const std::vector<int64_t>& ns,
                          double* partial) {
  sum_squares_then(xs, ns, partial, nullptr);
}

std::vector<double> sum_squares(const std::vector<const float*>& xs,
                                const std::vector<int64_t>& ns) {
  std::vector<int64_t> first;
  const int64_t blocks = sum_square_blocks(ns, &first);
  std::vector<double> sums(xs.size(), 0.0);
  if (blocks == 0) return sums;
  Scratch partial(size_t(blocks) * sizeof(double));
  double* d_partial = static_cast<double*>(partial.get());
  sum_squares_partials(xs, ns, d_partial);
  std::vector<double> host(static_cast<size_t>(blocks));
  core_cuda::copy_d2h(host.data(), d_partial, host.size() * sizeof(double));
  for (size_t i = 0; i < xs.size(); ++i)
    for (int64_t b = first[i]; b < first[i + 1]; ++b) sums[i] += host[size_t(b)];
  return sums;
}

void scale_many(const std::vector<TensorSlots>& tensors, float c) {
  if (tensors.empty()) return;
  core_cuda::require("optim::cuda::scale_many");
  launch_many("optim::cuda::scale_many", tensors, ScaleOp{c});
}

void decide_step(const std::vector<const float*>& xs, const std::vector<int64_t>& ns,
                 double* partial, const int64_t* first, const float* loss,
                 const std::vector<const float*>& extras, double max_norm,
                 const math::StepScalars* table, int32_t window, math::DeviceStepState* state,
                 math::StepRecord* records) {
  core_cuda::require("optim::cuda::decide_step");
  CLUSTR_CHECK(extras.size() <= size_t(math::kStepExtras), "optim::cuda::decide_step: ",
               extras.size(), " extra values; a record holds ", math::kStepExtras);
  StepDecision d{partial, first, static_cast<int64_t>(xs.size()), loss, {}, max_norm, table,
                 window, state, records};
  for (size_t e = 0; e < extras.size(); ++e) d.extra[e] = extras[e];
  sum_squares_then(xs, ns, partial, &d);
}

void sgd_update_many(const std::vector<TensorSlots>& tensors,
                     const math::DeviceStepState* state) {
  if (tensors.empty()) return;
  core_cuda::require("optim::cuda::sgd_update_many");
  launch_many("optim::cuda::sgd_update_many", tensors, SgdOp{}, state);
}

void adam_update_many(const std::vector<TensorSlots>& tensors,
                      const math::DeviceStepState* state, bool radam) {
  if (tensors.empty()) return;
  core_cuda::require("optim::cuda::adam_update_many");
  if (radam)
    launch_many("optim::cuda::radam_update_many", tensors, AdamOp<true>{}, state);
  else
    launch_many("optim::cuda::adam_update_many", tensors, AdamOp<false>{}, state);
}

}  // namespace clustr::optim::cuda
