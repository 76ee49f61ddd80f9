// The optimizers' CUDA kernels (optim/cuda/update.h): the per-element updates of SGD and the
// Adam family for many parameters per launch, one thread per element with the formula of
// optim/update_math.h, and the sum of squares behind clip_grad_norm. Written against core/cuda/kernel.h, so the same code runs on a
// GPU and in device emulation.
#include "optim/cuda/update.h"

#include <cstdint>
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
template <class Op>
struct ManyKernel {
  static constexpr bool kUsesBarrier = false;
  TensorList list;
  Op op;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    int k = 0;
    const int64_t total = list.start[list.count];
    for (int64_t i = global_x(t); i < total; i += grid_stride_x(t)) {
      while (i >= list.start[k + 1]) ++k;
      op(list.t[k], i - list.start[k]);
    }
  }
};

struct SgdOp {
  math::SgdScalars s;
  CLUSTR_DEVICE void operator()(const TensorSlots& x, int64_t j) const {
    float unused = 0.0f;
    math::sgd_update(x.p[j], x.g[j], x.a ? x.a[j] : unused, s);
  }
};

template <bool kRAdam>
struct AdamOp {
  math::AdamScalars s;
  CLUSTR_DEVICE void operator()(const TensorSlots& x, int64_t j) const {
    if (kRAdam)
      math::radam_update(x.p[j], x.g[j], x.a[j], x.b[j], s);
    else
      math::adam_update(x.p[j], x.g[j], x.a[j], x.b[j], s);
  }
};

struct AddDouble {
  CLUSTR_HD double operator()(double a, double b) const { return a + b; }
};

// x (n) -> partial (grid): partial[b] = sum of double(x)^2 over block b's grid-stride share,
// combined over the block by block_reduce's fixed tree.
struct SumSquaresKernel {
  static constexpr bool kUsesBarrier = true;
  const float* x;
  int64_t n;
  double* partial;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    double acc = 0.0;
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) {
      const double xi = x[i];
      acc += xi * xi;
    }
    const double total = core_cuda::block_reduce(t, acc, t.shared<double>(), AddDouble{});
    if (t.thread_idx().x == 0) partial[t.block_idx().x] = total;
  }
};

// The launch of a sum of squares over n elements: a power of two from 32 (one warp) to 256
// threads, no more than the elements need (a bias of 17 needs one warp), and up to 256 blocks,
// enough to keep a GPU's memory busy. Both are functions of n only, so the block sums, and
// their sum, are the same at every call.
unsigned sum_threads(int64_t n) {
  unsigned t = 32;
  while (t < 256 && t < n) t *= 2;
  return t;
}
unsigned sum_blocks(int64_t n) {
  constexpr int64_t kMaxBlocks = 256;
  const int64_t threads = sum_threads(n);
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < kMaxBlocks ? b : kMaxBlocks);
}

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
void launch_many(const char* name, const std::vector<TensorSlots>& tensors, const Op& op) {
  TensorList list{};
  auto flush = [&] {
    if (list.count == 0) return;
    core_cuda::launch(name, grid_for(list.start[list.count]), kBlock, 0,
                      ManyKernel<Op>{list, op});
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

std::vector<double> sum_squares(const std::vector<const float*>& xs,
                                const std::vector<int64_t>& ns) {
  CLUSTR_CHECK(xs.size() == ns.size(), "optim::cuda::sum_squares: ", xs.size(),
               " arrays but ", ns.size(), " lengths");
  std::vector<size_t> first(xs.size() + 1, 0);  // array i's block sums: [first[i], first[i+1])
  for (size_t i = 0; i < xs.size(); ++i) first[i + 1] = first[i] + sum_blocks(ns[i]);
  std::vector<double> sums(xs.size(), 0.0);
  if (first.back() == 0) return sums;
  core_cuda::require("optim::cuda::sum_squares");
  Scratch partial(first.back() * sizeof(double));
  double* d_partial = static_cast<double*>(partial.get());
  for (size_t i = 0; i < xs.size(); ++i) {
    const unsigned threads = sum_threads(ns[i]);
    core_cuda::launch("optim::cuda::sum_squares", {sum_blocks(ns[i])}, {threads},
                      threads * sizeof(double),
                      SumSquaresKernel{xs[i], ns[i], d_partial + first[i]});
  }
  std::vector<double> host(first.back());
  core_cuda::copy_d2h(host.data(), d_partial, host.size() * sizeof(double));
  for (size_t i = 0; i < xs.size(); ++i)
    for (size_t b = first[i]; b < first[i + 1]; ++b) sums[i] += host[b];
  return sums;
}

}  // namespace clustr::optim::cuda
