// The CUDA runtime side of the backend: is a GPU usable, streams and events, the caching
// allocator, copies.
//
// One device (device 0, the runtime's default). Work goes on the calling host thread's current
// stream (cuda.h): the legacy default stream, or the Stream a StreamGuard has made current.
// Every kernel launch (kernel.h), cuBLAS call (blas.cu) and copy (below) is queued on it, so
// the work of one stream is ordered; work on two streams is ordered only by Events or
// synchronization. The allocator's reuse rests on that order: a block is reused only by
// allocations on the stream it was allocated on, so the host may free a block while a kernel
// may still be reading it, and the next user of the block is queued after that kernel.
// (Compiling with --default-stream per-thread would change what "the default stream" means
// and break the free list of kDefaultStream.)
// In device emulation (core/cuda/emulation.h) this file compiles unchanged against the host
// stand-in of the runtime API, so the allocator, the streams and the copies below are the code
// a GPU runs.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/cuda/check.h"
#include "core/size_class.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/random.h"

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
#if defined(CLUSTR_EMULATION_GPU_NUMERICS)
bool exact_numerics() { return false; }
#else
bool exact_numerics() {
  return emulation::current_schedule().order == emulation::Order::forward;
}
#endif
#else
bool emulated() { return false; }
bool exact_numerics() { return false; }
#endif
bool available() { return availability().ok; }
std::string unavailable_reason() { return availability().reason; }

void require(const char* what) {
  const Availability& a = availability();
  if (!a.ok) throw Error(detail::cat(what, ": no usable GPU: ", a.reason));
}

const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    require("cuda::device_info");
    int device = 0, major = 0, minor = 0, sms = 0, shared = 0;
    CLUSTR_CUDA_CHECK(cudaGetDevice(&device));
    CLUSTR_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CLUSTR_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    CLUSTR_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CLUSTR_CUDA_CHECK(
        cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    DeviceInfo d;
    d.capability = major * 10 + minor;
    d.multiprocessors = sms;
    d.max_shared_per_block = static_cast<size_t>(shared);
    return d;
  }();
  return info;
}

// ---- launch counts -----------------------------------------------------------------------------

namespace {
std::atomic<uint64_t> g_kernel_launches{0}, g_blas_calls{0}, g_graph_launches{0};
thread_local bool t_capturing = false;  // inside Graph::capture's body on this thread

// Throws when this thread captures a graph: `what` would need the host to wait for the device.
void refuse_if_capturing(const char* call, const char* what) {
  if (t_capturing)
    throw Error(detail::cat(call, " while a CUDA graph is being captured: ", what, ", which a "
                            "graph cannot hold (it would run once, at capture, not at each "
                            "replay)"));
}
}  // namespace

namespace counting {
void kernel_launch() {
  if (!t_capturing) g_kernel_launches.fetch_add(1, std::memory_order_relaxed);
}
void blas_call() {
  if (!t_capturing) g_blas_calls.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace counting

LaunchCounts launch_counts() {
  LaunchCounts c;
  c.kernels = g_kernel_launches.load(std::memory_order_relaxed);
  c.blas = g_blas_calls.load(std::memory_order_relaxed);
  c.graphs = g_graph_launches.load(std::memory_order_relaxed);
  return c;
}

bool capturing() { return t_capturing; }

// ---- the current stream ------------------------------------------------------------------------

namespace {
thread_local StreamHandle current = kDefaultStream;  // per host thread, as CUDA's own state
}  // namespace

StreamHandle current_stream() { return current; }

// ---- caching allocator -------------------------------------------------------------------------
//
// cudaMalloc and cudaFree are slow (cudaFree also synchronizes the device), and training
// allocates the same sizes every step, so freed blocks are kept in free lists by size class and
// handed out again. Sizes are rounded up to size classes (core/size_class.h). There is one set
// of free lists per stream: a block freed by the host goes back to the list of the stream it
// was allocated on and is handed out only to allocations on that stream, whose work is queued
// after whatever used the block before.

namespace {

struct Block {
  size_t size;          // rounded, as cudaMalloc'ed
  size_t requested;     // what the caller asked for: counted in live bytes
  StreamHandle stream;  // current at alloc(): the free list the block goes back to
  uint64_t pool = 0;    // a graph's pool that owns it (0: none)
};

using FreeList = std::map<size_t, std::vector<void*>>;  // rounded size -> free blocks

// A graph's private pool (Graph): its free blocks, the bytes of all its blocks, and how many
// graphs hold it (graphs captured to share it, each replayed in turn, never concurrently).
struct Pool {
  FreeList free;
  size_t bytes = 0;
  int users = 1;
  unsigned* counters = nullptr;  // the arrival counters of its graphs' kernels
};

struct Allocator {
  std::mutex mu;
  // The free lists of every live stream: the default stream's always, a Stream's from its
  // construction to its destruction. The keys are also the registry of live Streams that
  // StreamGuard and alloc() check.
  std::unordered_map<StreamHandle, FreeList> free_lists;
  std::unordered_map<void*, Block> live;  // blocks handed out
  size_t cached = 0;                      // bytes in the free lists
  MemoryStats stats;
  std::unordered_map<uint64_t, Pool> pools;            // the live graphs' pools
  std::unordered_map<StreamHandle, uint64_t> capture;  // stream -> the pool it captures into
  uint64_t next_pool = 1;
  std::unordered_map<StreamHandle, unsigned*> counters;  // each stream's arrival counters
};

// Never destroyed: tensors held in static objects are freed during static destruction, perhaps
// after this object would have been; the driver reclaims everything at process exit anyway.
Allocator& allocator() {
  static Allocator* a = [] {
    Allocator* made = new Allocator;
    made->free_lists[kDefaultStream];
    return made;
  }();
  return *a;
}

// kArrivalCounters zeroed counters (device memory of their own, outside the caching allocator,
// kept while their stream or graph pool lives), zeroed through stream s and waited for: no
// kernel can see them before.
unsigned* new_arrival_counters(StreamHandle s) {
  void* p = nullptr;
  constexpr size_t bytes = kArrivalCounters * sizeof(unsigned);
  CLUSTR_CUDA_CHECK(cudaMalloc(&p, bytes));
  static const unsigned zeros[kArrivalCounters] = {};
  cudaError_t e = cudaMemcpyAsync(p, zeros, bytes, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) {
    cudaFree(p);
    checks::throw_cuda_error(e, "zeroing the arrival counters", __FILE__, __LINE__);
  }
  return static_cast<unsigned*>(p);
}

// Gives every cached block of every stream back to the driver. Caller holds the lock. A cached
// block may still be in use by a kernel queued before the host freed it, so the device is
// synchronized first (cudaFree waits for the device too, but the order should not rest on a
// side effect).
void release_cache_locked(Allocator& a) {
  if (a.cached == 0) return;  // also the case without a GPU: nothing was ever cached
  CLUSTR_CUDA_CHECK(cudaDeviceSynchronize());
  for (auto& entry : a.free_lists) {
    FreeList& list = entry.second;
    while (!list.empty()) {
      auto it = list.begin();
      std::vector<void*>& blocks = it->second;
      while (!blocks.empty()) {
        void* p = blocks.back();
        blocks.pop_back();
        a.cached -= it->first;
        CLUSTR_CUDA_CHECK(cudaFree(p));
      }
      list.erase(it);
    }
  }
}

// The stream of a Stream or Event call; a moved-from object holds none.
StreamHandle held(StreamHandle h, const char* op) {
  CLUSTR_CHECK(h != nullptr, op, ": this cuda::Stream was moved from and holds no stream");
  return h;
}
cudaEvent_t held(cudaEvent_t h, const char* op) {
  CLUSTR_CHECK(h != nullptr, op, ": this cuda::Event was moved from and holds no event");
  return h;
}

// Waits for the stream's work, hands its blocks to the default stream and destroys it. After
// the synchronization no queued work can use its cached blocks, so any stream may reuse them;
// its live blocks are retagged so that, freed later, they go to the default stream's list and
// no block refers to a destroyed stream. Never throws (it runs in destructors): an error can
// only come from earlier work that faulted, which leaves the CUDA context unusable anyway, so
// it is reported on stderr.
void destroy_stream(StreamHandle h) noexcept {
  if (h == nullptr) return;
  cudaError_t e = cudaStreamSynchronize(h);
  try {
    Allocator& a = allocator();
    std::lock_guard<std::mutex> lock(a.mu);
    auto it = a.free_lists.find(h);
    if (it != a.free_lists.end()) {
      FreeList& to = a.free_lists[kDefaultStream];
      for (auto& [size, blocks] : it->second) to[size].insert(to[size].end(), blocks.begin(),
                                                              blocks.end());
      a.free_lists.erase(it);
    }
    for (auto& entry : a.live)
      if (entry.second.stream == h) entry.second.stream = kDefaultStream;
    auto c = a.counters.find(h);  // the stream's work is done (synchronized above)
    if (c != a.counters.end()) {
      cudaFree(c->second);
      a.counters.erase(c);
    }
  } catch (...) {
    // Out of host memory while moving the lists: the stream's cached blocks are leaked.
  }
  const cudaError_t destroyed = cudaStreamDestroy(h);
  if (e == cudaSuccess) e = destroyed;
  if (e != cudaSuccess) {
    std::fprintf(stderr, "clustr: destroying a cuda::Stream: %s (%s)\n", cudaGetErrorName(e),
                 cudaGetErrorString(e));
    cudaGetLastError();  // reported here, not again by the next launch check
  }
}

}  // namespace

// ---- Stream, StreamGuard, Event ----------------------------------------------------------------

Stream::Stream() {
  require("cuda::Stream");
  StreamHandle h = nullptr;
  CLUSTR_CUDA_CHECK(cudaStreamCreateWithFlags(&h, cudaStreamNonBlocking));
  try {
    Allocator& a = allocator();
    std::lock_guard<std::mutex> lock(a.mu);
    a.free_lists[h];  // registers the stream: allocations on it get their own free lists
  } catch (...) {
    cudaStreamDestroy(h);
    throw;
  }
  h_ = h;
}

Stream::~Stream() { destroy_stream(h_); }

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    destroy_stream(h_);
    h_ = other.h_;
    other.h_ = nullptr;
  }
  return *this;
}

StreamHandle Stream::handle() const { return held(h_, "cuda::Stream::handle"); }

void Stream::synchronize() const {
  refuse_if_capturing("cuda::Stream::synchronize", "the host waits for a stream");
  CLUSTR_CUDA_CHECK(cudaStreamSynchronize(held(h_, "cuda::Stream::synchronize")));
}

StreamGuard::StreamGuard(const Stream& s) : StreamGuard(s.handle()) {}

StreamGuard::StreamGuard(StreamHandle s) : previous_(current) {
  if (s != kDefaultStream) {
    Allocator& a = allocator();
    std::lock_guard<std::mutex> lock(a.mu);
    CLUSTR_CHECK(a.free_lists.count(s) == 1, "cuda::StreamGuard: stream ",
                 static_cast<const void*>(s), " is not that of a live cuda::Stream (destroyed, "
                 "or not made by cuda::Stream)");
  }
  current = s;
}

StreamGuard::~StreamGuard() { current = previous_; }

Event::Event() {
  require("cuda::Event");
  CLUSTR_CUDA_CHECK(cudaEventCreateWithFlags(&h_, cudaEventDisableTiming));
}

// Destroying an event whose recorded work is still pending is allowed: the runtime releases it
// when that work completes.
Event::~Event() {
  if (h_ != nullptr && cudaEventDestroy(h_) != cudaSuccess) cudaGetLastError();
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (h_ != nullptr && cudaEventDestroy(h_) != cudaSuccess) cudaGetLastError();
    h_ = other.h_;
    other.h_ = nullptr;
  }
  return *this;
}

void Event::record() {
  CLUSTR_CUDA_CHECK(cudaEventRecord(held(h_, "cuda::Event::record"), current));
}

void Event::record(const Stream& s) {
  CLUSTR_CUDA_CHECK(cudaEventRecord(held(h_, "cuda::Event::record"), s.handle()));
}

void Event::wait() const {
  CLUSTR_CUDA_CHECK(cudaStreamWaitEvent(current, held(h_, "cuda::Event::wait"), 0));
}

void Event::wait(const Stream& s) const {
  CLUSTR_CUDA_CHECK(cudaStreamWaitEvent(s.handle(), held(h_, "cuda::Event::wait"), 0));
}

bool Event::query() const {
  const cudaError_t e = cudaEventQuery(held(h_, "cuda::Event::query"));
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is an answer, not an error for the next launch check
    return false;
  }
  checks::throw_cuda_error(e, "cudaEventQuery(event)", __FILE__, __LINE__);
}

void Event::synchronize() const {
  refuse_if_capturing("cuda::Event::synchronize", "the host waits for an event");
  CLUSTR_CUDA_CHECK(cudaEventSynchronize(held(h_, "cuda::Event::synchronize")));
}

// ---- alloc and free ----------------------------------------------------------------------------

void* alloc(size_t bytes) {
  require("cuda::alloc");
  if (bytes == 0) return nullptr;
  CLUSTR_CHECK(bytes <= (size_t(1) << 56), "cuda::alloc: ", bytes,
               " bytes is not a plausible allocation size");
  size_t size = size_class(bytes);
  const StreamHandle stream = current;
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  auto list = a.free_lists.find(stream);
  CLUSTR_CHECK(list != a.free_lists.end(), "cuda::alloc: the current stream ",
               static_cast<const void*>(stream), " was destroyed (a StreamGuard outlived its "
               "cuda::Stream)");

  void* p = nullptr;
  // While the stream captures a graph, blocks come from (and new ones join) the graph's pool.
  auto capture = a.capture.find(stream);
  Pool* pool = capture == a.capture.end() ? nullptr : &a.pools.at(capture->second);
  FreeList& from = pool ? pool->free : list->second;
  auto it = from.find(size);
  if (it != from.end() && !it->second.empty()) {
    p = it->second.back();  // the most recently freed block: likeliest to be in L2
    it->second.pop_back();
    if (!pool) a.cached -= size;
#if defined(CLUSTR_CUDA_EMULATION)
    emulation::poison(p, size);  // the previous owner's values: NaN now, as fresh blocks
#endif
  } else {
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      // Memory may be held by cached blocks of other sizes or streams: give them back and try
      // once more.
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
    if (pool) pool->bytes += size;
  }

  a.live[p] = Block{size, bytes, stream, pool ? capture->second : 0};
  a.stats.live_bytes += static_cast<int64_t>(bytes);
  a.stats.peak_bytes = std::max(a.stats.peak_bytes, a.stats.live_bytes);
  a.stats.allocations += 1;
  return p;
}

// Called from Storage's destructor, possibly during static destruction at exit: never throws.
// The block goes to the free list of its stream, not to the driver, so no CUDA call can fail
// here. The sizes recorded at alloc() are used; `bytes` is only the caller's view of the same
// block.
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
#if defined(CLUSTR_CUDA_EMULATION)
    // The emulated kernels queued before this free have run: a read of the block from now on
    // (a graph replay holding a freed tensor's address) finds the poison, not the old values.
    emulation::poison(ptr, b.size);
#endif
    if (b.pool != 0) {  // kept for its graph (Graph::release retags the blocks of a dead one)
      a.pools.at(b.pool).free[b.size].push_back(ptr);
      return;
    }
    // Always found: destroy_stream retags the live blocks of a stream it destroys.
    auto list = a.free_lists.find(b.stream);
    if (list == a.free_lists.end()) list = a.free_lists.find(kDefaultStream);
    list->second[b.size].push_back(ptr);
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
  release_cache_locked(a);  // synchronizes the device first
}

size_t cached_bytes() {
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  return a.cached;
}

// ---- copies ----------------------------------------------------------------------------------
// On the current stream, after the work queued there. cudaMemcpyAsync returns early where it
// can: device to pageable host memory it returns once the copy is done, but from host memory
// the toolkit only promises that it "might be synchronous", so both host copies synchronize the
// current stream before returning: the host buffer may then be read, freed or reused at once,
// as with the synchronous cudaMemcpy (which runs on the legacy default stream, not the current
// one). Device to device copies do not wait.

void copy_h2d(void* dst, const void* src_host, size_t bytes) {
  if (bytes == 0) return;
  require("cuda::copy_h2d");
  refuse_if_capturing("cuda::copy_h2d", "a copy from host memory (a tensor moved to the device)");
  const StreamHandle s = current;
  CLUSTR_CUDA_CHECK(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, s));
  CLUSTR_CUDA_CHECK(cudaStreamSynchronize(s));
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  require("cuda::PinnedBuffer");
  if (bytes > 0) CLUSTR_CUDA_CHECK(cudaMallocHost(&p_, bytes));
}

PinnedBuffer::~PinnedBuffer() {
  if (p_ == nullptr) return;
  const cudaError_t e = cudaFreeHost(p_);  // waits for the device's work, as the toolkit's does
  if (e != cudaSuccess) {
    std::fprintf(stderr, "clustr: freeing pinned host memory: %s (%s)\n", cudaGetErrorName(e),
                 cudaGetErrorString(e));
    cudaGetLastError();
  }
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    PinnedBuffer gone(std::move(*this));
    p_ = other.p_;
    bytes_ = other.bytes_;
    other.p_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void copy_h2d_async(void* dst, const void* src_pinned, size_t bytes) {
  if (bytes == 0) return;
  require("cuda::copy_h2d_async");
  refuse_if_capturing("cuda::copy_h2d_async", "a copy from host memory");
  CLUSTR_CUDA_CHECK(cudaMemcpyAsync(dst, src_pinned, bytes, cudaMemcpyHostToDevice, current));
}

void copy_d2h(void* dst_host, const void* src, size_t bytes) {
  if (bytes == 0) return;
  require("cuda::copy_d2h");
  refuse_if_capturing("cuda::copy_d2h", "a host read of device memory (item(), to_vector(), a "
                      "tensor moved to the cpu)");
  const StreamHandle s = current;
  CLUSTR_CUDA_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, s));
  CLUSTR_CUDA_CHECK(cudaStreamSynchronize(s));
}

void copy_d2d(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  require("cuda::copy_d2d");
  CLUSTR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, current));
}

// Every stream. Without a GPU nothing can be pending, so this is a no-op there (as in
// no_cuda.cpp).
void synchronize() {
  if (!available()) return;
  refuse_if_capturing("cuda::synchronize", "the host waits for the device");
  CLUSTR_CUDA_CHECK(cudaDeviceSynchronize());
}

// ---- CUDA graphs -------------------------------------------------------------------------------

Graph::~Graph() { release(); }

Graph::Graph(Graph&& other) noexcept : exec_(other.exec_), pool_(other.pool_) {
  other.exec_ = nullptr;
  other.pool_ = 0;
}

Graph& Graph::operator=(Graph&& other) noexcept {
  if (this != &other) {
    release();
    exec_ = other.exec_;
    pool_ = other.pool_;
    other.exec_ = nullptr;
    other.pool_ = 0;
  }
  return *this;
}

// Destroys the executable and gives the pool's blocks back: the free ones to the default
// stream's cache, the live ones (tensors the body made that are still held) retagged so that
// they go there when freed. Replays may still be queued, so the device is synchronized first.
// Never throws: an error can only come from earlier work that faulted, reported on stderr.
void Graph::release() noexcept {
  if (exec_ == nullptr && pool_ == 0) return;
  cudaError_t e = cudaDeviceSynchronize();
  if (exec_ != nullptr) {
    const cudaError_t d = cudaGraphExecDestroy(exec_);
    if (e == cudaSuccess) e = d;
    exec_ = nullptr;
  }
  if (e != cudaSuccess) {
    std::fprintf(stderr, "clustr: destroying a cuda::Graph: %s (%s)\n", cudaGetErrorName(e),
                 cudaGetErrorString(e));
    cudaGetLastError();
  }
  if (pool_ == 0) return;
  try {
    Allocator& a = allocator();
    std::lock_guard<std::mutex> lock(a.mu);
    auto it = a.pools.find(pool_);
    if (it != a.pools.end() && --it->second.users > 0) it = a.pools.end();  // others hold it
    if (it != a.pools.end()) {
      FreeList& to = a.free_lists[kDefaultStream];
      for (auto& [size, blocks] : it->second.free) {
        to[size].insert(to[size].end(), blocks.begin(), blocks.end());
        a.cached += size * blocks.size();
      }
      for (auto& entry : a.live)
        if (entry.second.pool == pool_) {
          entry.second.pool = 0;
          entry.second.stream = kDefaultStream;
        }
      if (it->second.counters != nullptr) cudaFree(it->second.counters);
      a.pools.erase(it);
    }
  } catch (...) {
    // Out of host memory while moving the lists: the pool's free blocks are leaked.
  }
  pool_ = 0;
}

unsigned* arrival_counters(int64_t n, const char* kernel) {
  CLUSTR_CHECK(n >= 0 && n <= kArrivalCounters, kernel, ": needs ", n, " arrival counters, at "
               "most ", kArrivalCounters, " are kept");
  const StreamHandle s = current;
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  if (t_capturing) {
    auto c = a.capture.find(s);
    if (c != a.capture.end()) return a.pools.at(c->second).counters;
  }
  unsigned*& counters = a.counters[s];
  if (counters == nullptr) counters = new_arrival_counters(s);
  return counters;
}

size_t Graph::pool_bytes() const {
  if (pool_ == 0) return 0;
  Allocator& a = allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  auto it = a.pools.find(pool_);
  return it == a.pools.end() ? 0 : it->second.bytes;
}

void Graph::capture(const std::function<void()>& body, const Graph* share_pool_of) {
  require("cuda::Graph::capture");
  CLUSTR_CHECK(!captured(), "cuda::Graph::capture: this graph holds a capture already");
  CLUSTR_CHECK(share_pool_of == nullptr || share_pool_of->captured(), "cuda::Graph::capture: "
               "the graph whose pool this one would share holds no capture");
  CLUSTR_CHECK(!t_capturing, "cuda::Graph::capture: another graph is being captured on this "
               "host thread");
  const StreamHandle s = current;
  CLUSTR_CHECK(s != kDefaultStream, "cuda::Graph::capture: the current stream is the legacy "
               "default stream, which cannot capture; make a cuda::Stream current (StreamGuard)");
  make_device_check_record();  // the checks made on the device inside the body write there
  {
    Allocator& a = allocator();
    std::lock_guard<std::mutex> lock(a.mu);
    if (share_pool_of != nullptr) {
      pool_ = share_pool_of->pool_;
      a.pools.at(pool_).users += 1;
    } else {
      // The pool's own arrival counters: its graphs replay one after another, on any stream,
      // so they must not share a stream's with work that may run beside them.
      unsigned* counters = new_arrival_counters(s);
      pool_ = a.next_pool++;
      a.pools[pool_].counters = counters;
    }
    a.capture[s] = pool_;
  }
  // Relaxed: the allocator may take a new block (cudaMalloc) during capture; what must not
  // happen in a graph (host copies, synchronization) is refused by this runtime itself.
  cudaError_t begun = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  std::exception_ptr failed;
  if (begun == cudaSuccess) {
    t_capturing = true;
    detail::freeze_host_draws(true);
    try {
      body();
    } catch (...) {
      failed = std::current_exception();
    }
    detail::freeze_host_draws(false);
    t_capturing = false;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended =
      begun == cudaSuccess ? cudaStreamEndCapture(s, &graph) : cudaSuccess;
  {
    Allocator& a = allocator();
    std::lock_guard<std::mutex> lock(a.mu);
    a.capture.erase(s);
  }
  cudaError_t instantiated = cudaSuccess;
  if (begun == cudaSuccess && ended == cudaSuccess && !failed)
    instantiated = cudaGraphInstantiate(&exec_, graph, 0);
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (begun != cudaSuccess || ended != cudaSuccess || instantiated != cudaSuccess || failed) {
    cudaGetLastError();  // reported here, not again by the next launch check
    exec_ = nullptr;
    release();
    if (failed) {
      try {
        std::rethrow_exception(failed);
      } catch (const std::exception& e) {
        throw Error(detail::cat("capturing a CUDA graph: ", e.what()));
      }
    }
    const cudaError_t e = begun != cudaSuccess ? begun : ended != cudaSuccess ? ended
                                                                               : instantiated;
    throw Error(detail::cat("capturing a CUDA graph: ",
                            begun != cudaSuccess    ? "cudaStreamBeginCapture"
                            : ended != cudaSuccess ? "cudaStreamEndCapture"
                                                   : "cudaGraphInstantiate",
                            " failed: ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
  }
}

void Graph::replay() {
  CLUSTR_CHECK(captured(), "cuda::Graph::replay: nothing was captured");
  refuse_if_capturing("cuda::Graph::replay", "a graph launched inside another's capture");
  g_graph_launches.fetch_add(1, std::memory_order_relaxed);
  CLUSTR_CUDA_CHECK(cudaGraphLaunch(exec_, current));
#ifdef CLUSTR_CUDA_DEBUG_SYNC
  CLUSTR_CUDA_CHECK(cudaStreamSynchronize(current));
#endif
}

}  // namespace clustr::cuda
