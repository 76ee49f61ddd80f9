// The CUDA runtime side of the backend: is a GPU usable, the caching allocator, copies.
//
// One device (device 0, the runtime's default) and one stream (the legacy default stream) are
// used throughout. Every kernel, cuBLAS call and cudaMemcpy is therefore ordered on that stream,
// which is what makes the allocator's reuse safe: a block freed by the host while a kernel may
// still be reading it is handed out again only to work that is queued after that kernel.
// (Compiling with --default-stream per-thread, or adding streams, would break this.)
// In device emulation (core/cuda/emulation.h) this file compiles unchanged against the host
// stand-in of the runtime API, so the allocator and the copies below are the code a GPU runs.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cuda/check.h"
#include "core/size_class.h"
#include "core/cuda/cuda.h"
#include "core/error.h"

namespace clustr::cuda {

// ---- is a GPU usable? --------------------------------------------------------------------------

namespace {

struct Availability {
  bool ok = false;
  std::string reason;
};

// Asked once: the answer cannot change during a run, and the first CUDA call is slow (it loads
// the driver and creates a context). A machine without a GPU or without libcuda makes the
// runtime return an error code here (cudaErrorNoDevice, cudaErrorInsufficientDriver, ...), never
// crash, so this never throws.
const Availability& availability() {
  static const Availability a = [] {
    Availability r;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e == cudaSuccess && count == 0) e = cudaErrorNoDevice;
    // Creating the context now finds devices that exist but cannot be used (exclusive-mode GPUs
    // held by another process, a driver too old for this runtime) before any tensor is made.
    if (e == cudaSuccess) e = cudaFree(nullptr);
    if (e != cudaSuccess) {
      r.reason = detail::cat(cudaGetErrorString(e), " (", cudaGetErrorName(e), ")");
      cudaGetLastError();  // do not leave the error for the next launch check to report
      return r;
    }
    r.ok = true;
    return r;
  }();
  return a;
}

}  // namespace

bool compiled() { return true; }
#if defined(CLUSTR_CUDA_EMULATION)
bool emulated() { return true; }
#else
bool emulated() { return false; }
#endif
bool available() { return availability().ok; }
std::string unavailable_reason() { return availability().reason; }

void require(const char* what) {
  const Availability& a = availability();
  if (!a.ok) throw Error(detail::cat(what, ": no usable GPU: ", a.reason));
}

// ---- caching allocator -------------------------------------------------------------------------
//
// cudaMalloc and cudaFree are slow (cudaFree also synchronizes the device), and training
// allocates the same sizes every step, so freed blocks are kept in free lists by size class and
// handed out again. Sizes are rounded up to size classes (core/size_class.h).

namespace {


struct Block {
  size_t size;       // rounded, as cudaMalloc'ed
  size_t requested;  // what the caller asked for: counted in live bytes
};

struct Allocator {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> cache;  // rounded size -> free blocks of that size
  std::unordered_map<void*, Block> live;       // blocks handed out
  size_t cached = 0;                           // bytes in `cache`
  MemoryStats stats;
};

// Never destroyed: tensors held in static objects are freed during static destruction, perhaps
// after this object would have been; the driver reclaims everything at process exit anyway.
Allocator& allocator() {
  static Allocator* a = new Allocator;
  return *a;
}

// Gives every cached block back to the driver. Caller holds the lock.
void release_cache_locked(Allocator& a) {
  while (!a.cache.empty()) {
    auto it = a.cache.begin();
    std::vector<void*>& blocks = it->second;
    while (!blocks.empty()) {
      void* p = blocks.back();
      blocks.pop_back();
      a.cached -= it->first;
      CLUSTR_CUDA_CHECK(cudaFree(p));
    }
    a.cache.erase(it);
  }
}

}  // namespace

void* alloc(size_t bytes) {
  require("cuda::alloc");
  if (bytes == 0) return nullptr;
  CLUSTR_CHECK(bytes <= (size_t(1) << 56), "cuda::alloc: ", bytes,
               " bytes is not a plausible allocation size");
  size_t size = size_class(bytes);
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);

  void* p = nullptr;
  auto it = a.cache.find(size);
  if (it != a.cache.end() && !it->second.empty()) {
    p = it->second.back();  // the most recently freed block: likeliest to be in L2
    it->second.pop_back();
    a.cached -= size;
  } else {
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      // Memory may be held by cached blocks of other sizes: give them back and try once more.
      cudaGetLastError();  // clear it, or the next launch check would report it
      size_t cached_before = a.cached;
      release_cache_locked(a);
      e = cudaMalloc(&p, size);
      if (e != cudaSuccess) {
        cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) cudaGetLastError();
        throw Error(detail::cat("cuda::alloc: out of device memory allocating ", bytes,
                                " bytes (a block of ", size, "); tensors hold ",
                                a.stats.live_bytes, " bytes, the cache held ", cached_before,
                                " bytes (released before retrying); the device has ", free_b,
                                " of ", total_b, " bytes free: ", cudaGetErrorName(e), " (",
                                cudaGetErrorString(e), ")"));
      }
    }
    if (e != cudaSuccess) checks::throw_cuda_error(e, "cudaMalloc(&p, size)", __FILE__, __LINE__);
  }

  a.live[p] = Block{size, bytes};
  a.stats.live_bytes += static_cast<int64_t>(bytes);
  a.stats.peak_bytes = std::max(a.stats.peak_bytes, a.stats.live_bytes);
  a.stats.allocations += 1;
  return p;
}

// Called from Storage's destructor, possibly during static destruction at exit: never throws.
// The block goes to the cache, not to the driver, so no CUDA call can fail here. The sizes
// recorded at alloc() are used; `bytes` is only the caller's view of the same block.
void free(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  try {
    Allocator& a = allocator();
    std::lock_guard<std::mutex> lock(a.mu);
    auto it = a.live.find(ptr);
    if (it == a.live.end()) {
      std::fprintf(stderr, "clustr: cuda::free of %zu bytes at %p, which cuda::alloc did not "
                   "hand out (or was freed twice); ignored\n", bytes, ptr);
      return;
    }
    Block b = it->second;
    a.live.erase(it);
    a.stats.live_bytes -= static_cast<int64_t>(b.requested);
    a.cache[b.size].push_back(ptr);
    a.cached += b.size;
  } catch (...) {
    // Out of host memory for the free list, or a broken mutex: the block is leaked, which is
    // better than terminating from a destructor.
  }
}

MemoryStats memory_stats() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  return a.stats;
}

void reset_peak() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  a.stats.peak_bytes = a.stats.live_bytes;
}

void empty_cache() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  release_cache_locked(a);  // no-op without a GPU: nothing was ever cached
}

size_t cached_bytes() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  return a.cached;
}

// ---- copies ----------------------------------------------------------------------------------
// cudaMemcpy is ordered on the default stream after every queued kernel; to and from pageable
// host memory it returns only when the host buffer may be reused, so callers need no sync.

void copy_h2d(void* dst, const void* src_host, size_t bytes) {
  if (bytes == 0) return;
  require("cuda::copy_h2d");
  CLUSTR_CUDA_CHECK(cudaMemcpy(dst, src_host, bytes, cudaMemcpyHostToDevice));
}

void copy_d2h(void* dst_host, const void* src, size_t bytes) {
  if (bytes == 0) return;
  require("cuda::copy_d2h");
  CLUSTR_CUDA_CHECK(cudaMemcpy(dst_host, src, bytes, cudaMemcpyDeviceToHost));
}

void copy_d2d(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  require("cuda::copy_d2d");
  CLUSTR_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

// Without a GPU nothing can be pending, so this is a no-op there (as in no_cuda.cpp).
void synchronize() {
  if (!available()) return;
  CLUSTR_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace clustr::cuda
