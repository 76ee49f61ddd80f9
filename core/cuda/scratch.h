// Device scratch memory for the duration of one op call (per-row partial sums, index tables):
// taken from the caching allocator (core/cuda/runtime.cu) and handed back when it goes out of
// scope. Handing it back while a kernel queued on it may still run is safe: the op allocates
// it, queues its kernels and frees it all on the current stream, and the allocator hands the
// block out again only to allocations on that same stream, whose work is queued after that
// kernel. (An op must not switch streams while it holds a Scratch.)
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/cuda/cuda.h"

namespace clustr::cuda {

template <class T>
class Scratch {
 public:
  explicit Scratch(int64_t n)
      : bytes_(static_cast<size_t>(n) * sizeof(T)), p_(static_cast<T*>(alloc(bytes_))) {}
  ~Scratch() { free(p_, bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  T* get() const { return p_; }

 private:
  size_t bytes_;
  T* p_;
};

}  // namespace clustr::cuda
