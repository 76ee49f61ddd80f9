// The optimizers' CUDA kernels (optim/cuda/update.h): the per-element updates of SGD and the
// Adam family, one thread per element with the formula of optim/update_math.h, and the sum of
// squares behind clip_grad_norm. Written against core/cuda/kernel.h, so the same code runs on a
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

// p, g, buf (n): one SGD step per element; buf null without momentum.
struct SgdKernel {
  static constexpr bool kUsesBarrier = false;
  float* p;
  const float* g;
  float* buf;
  math::SgdScalars s;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) {
      float unused = 0.0f;
      math::sgd_update(p[i], g[i], buf ? buf[i] : unused, s);
    }
  }
};

// p, g, m, v (n): one Adam (rectified = false) or R-Adam step per element.
template <bool kRAdam>
struct AdamKernel {
  static constexpr bool kUsesBarrier = false;
  float* p;
  const float* g;
  float* m;
  float* v;
  math::AdamScalars s;
  int64_t n;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) {
      if (kRAdam)
        math::radam_update(p[i], g[i], m[i], v[i], s);
      else
        math::adam_update(p[i], g[i], m[i], v[i], s);
    }
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

void sgd_update(float* p, const float* g, float* buf, const math::SgdScalars& s, int64_t n) {
  if (n == 0) return;
  core_cuda::require("optim::cuda::sgd_update");
  core_cuda::launch("optim::cuda::sgd_update", grid_for(n), kBlock, 0,
                    SgdKernel{p, g, buf, s, n});
}

void adam_update(float* p, const float* g, float* m, float* v, const math::AdamScalars& s,
                 int64_t n) {
  if (n == 0) return;
  core_cuda::require("optim::cuda::adam_update");
  core_cuda::launch("optim::cuda::adam_update", grid_for(n), kBlock, 0,
                    AdamKernel<false>{p, g, m, v, s, n});
}

void radam_update(float* p, const float* g, float* m, float* v, const math::AdamScalars& s,
                  int64_t n) {
  if (n == 0) return;
  core_cuda::require("optim::cuda::radam_update");
  core_cuda::launch("optim::cuda::radam_update", grid_for(n), kBlock, 0,
                    AdamKernel<true>{p, g, m, v, s, n});
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
