// Device emulation (see core/cuda/emulation.h): the CUDA runtime subset on the host (device
// memory in its arena, copies, streams, events). The kernel launcher and its schedules are
// emulation_launch.cpp, the cuBLAS subset emulation_blas.cpp. Compiled only with
// -DCLUSTR_CUDA=EMULATE.
#include "core/cuda/emulation.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define CLUSTR_ASAN_ARENA 1
#endif

#include "core/cuda/emulation_state.h"
#include "core/error.h"

// ---- device memory -------------------------------------------------------------------------------

namespace {

thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

// The emulated device's memory: one arena of address space reserved at the first allocation
// (the host's physical memory in size, MAP_NORESERVE: only pages written cost memory), carved
// first fit into 256-byte aligned blocks, each followed by a 256-byte gap. The arena is
// inaccessible (PROT_NONE) except while the device works on it (a launch, a copy, a GEMM, a
// fill: DeviceAccess below), so host code that reads or writes device memory directly faults,
// and the handler below names it. Under AddressSanitizer every byte outside a live block
// (the gaps, freed blocks) is poisoned, so a kernel that runs past its block, or reads a freed
// one, is reported there as on the heap.
constexpr size_t kAlign = 256, kGap = 256;

struct DeviceMemory {
  std::mutex mu;
  std::map<uintptr_t, size_t> blocks;  // base address -> bytes, every live cudaMalloc block
  std::map<uintptr_t, size_t> spans;   // base address -> bytes taken in the arena (gap included)
  std::map<uintptr_t, size_t> free;    // base address -> bytes, the free parts of the arena
  size_t in_use = 0;
  size_t capacity = 0;
  char* base = nullptr;     // the arena, reserved at the first allocation
  size_t reserved = 0;
  size_t high_water = 0;    // bytes from base that were ever handed out (page-rounded)
  // DeviceAccess: how many scopes have the arena open, and how far it is open.
  std::mutex access_mu;
  int open_scopes = 0;
  size_t open_extent = 0;

  DeviceMemory() {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    capacity = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page)
                                     : (size_t(16) << 30);
    // CLUSTR_EMULATION_MEMORY caps the emulated device's memory, so that running out of
    // device memory can be tried on any machine: bytes, or a number with K, M or G (2^10,
    // 2^20, 2^30).
    if (const char* v = std::getenv("CLUSTR_EMULATION_MEMORY")) {
      char* end = nullptr;
      const double n = std::strtod(v, &end);
      double unit = 1;
      if (end && *end)
        unit = *end == 'K' ? 0x1p10 : *end == 'M' ? 0x1p20 : *end == 'G' ? 0x1p30 : 0;
      if (end == v || !(n > 0) || unit == 0 || (end && *end && end[1] != '\0') ||
          n * unit > double(capacity))
        throw clustr::Error(clustr::detail::cat(
            "CLUSTR_EMULATION_MEMORY='", v, "': expected a positive number of bytes, with K, M "
            "or G after it or not, at most the host's ", capacity, " bytes"));
      capacity = static_cast<size_t>(n * unit);
    }
  }

  // True when [p, p + bytes) lies inside one live block (bytes == 0: p inside or at its end).
  bool contains_locked(const void* p, size_t bytes) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = blocks.upper_bound(a);
    if (it == blocks.begin()) return false;
    --it;
    return a >= it->first && a - it->first <= it->second && bytes <= it->second - (a - it->first);
  }
  bool contains(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    return contains_locked(p, bytes);
  }
  // True when any byte of [p, p + bytes) is device memory.
  bool touches(const void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    const auto a = reinterpret_cast<uintptr_t>(p);
    auto it = blocks.upper_bound(a + bytes - 1);
    if (it == blocks.begin()) return false;
    --it;
    return it->first + it->second > a;
  }
  bool in_arena(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(base);
    return base != nullptr && a >= b && a - b < reserved;
  }

  // A block of `bytes` (> 0) from the arena, or null; caller holds mu.
  void* take_locked(size_t bytes);
  void give_back_locked(void* p);
};

DeviceMemory& device_memory();

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// Opens the arena for the device's own work (see DeviceMemory); scopes nest and may overlap
// across host threads (the arena stays open until the last one closes).
void open_arena(size_t from, size_t to) {
  DeviceMemory& m = device_memory();
  if (to > from && mprotect(m.base + from, to - from, PROT_READ | PROT_WRITE) != 0) {
    std::perror("clustr device emulation: mprotect of the device arena");
    std::abort();
  }
}

// Pinned host memory (cudaMallocHost): each block its own pages, read-only while a copy from it
// may still be queued on a GPU (emulation.h). A copy's entry stays in `in_flight` until the host
// waits for its stream's work up to it.
struct PinnedBlock {
  size_t bytes = 0;   // page-rounded
  int in_flight = 0;  // copies from it the host has not waited for
};
struct InFlightCopy {
  cudaStream_t stream;
  uint64_t seq;  // the stream's count of pinned copies, this one included
  uintptr_t block;
};
struct PinnedMemory {
  std::mutex mu;
  std::map<uintptr_t, PinnedBlock> blocks;
  std::vector<InFlightCopy> in_flight;
  std::map<cudaStream_t, uint64_t> copies;  // pinned copies queued on each stream so far
  std::map<cudaEvent_t, std::pair<cudaStream_t, uint64_t>> recorded;  // where each event stands
};
PinnedMemory& pinned_memory() {
  static PinnedMemory* p = new PinnedMemory;  // never destroyed, like the device memory
  return *p;
}

void set_read_only(uintptr_t base, size_t bytes, bool read_only) {
  if (mprotect(reinterpret_cast<void*>(base), bytes,
               read_only ? PROT_READ : PROT_READ | PROT_WRITE) != 0) {
    std::perror("clustr device emulation: mprotect of pinned host memory");
    std::abort();
  }
}

// The host waited for the copies on `stream` up to `seq` (every stream's, all of them, when
// `all`): their blocks are writable again once no other copy from them is in flight. Caller
// holds mu.
void waited_locked(PinnedMemory& pm, bool all, cudaStream_t stream, uint64_t seq) {
  auto keep = pm.in_flight.begin();
  for (const InFlightCopy& c : pm.in_flight) {
    if (all || (c.stream == stream && c.seq <= seq)) {
      PinnedBlock& b = pm.blocks.at(c.block);
      if (--b.in_flight == 0) set_read_only(c.block, b.bytes, false);
    } else {
      *keep++ = c;
    }
  }
  pm.in_flight.erase(keep, pm.in_flight.end());
}
void waited(bool all, cudaStream_t stream, uint64_t seq = UINT64_MAX) {
  PinnedMemory& pm = pinned_memory();
  std::lock_guard<std::mutex> lock(pm.mu);
  waited_locked(pm, all, stream, seq);
}

// The pinned block a faulting address lies in while copies from it are in flight (0: none). Read
// without the lock: a signal handler must not wait for one, and the process ends either way.
uintptr_t pinned_fault(const void* addr) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  for (const auto& [base, b] : pinned_memory().blocks)
    if (a >= base && a < base + b.bytes && b.in_flight > 0) return base;
  return 0;
}

// A fault inside the arena while it is closed: host code touched device memory.
struct sigaction previous_segv;

// Ends the process on the fault, after `what` (a format with one %p: the address) and a
// backtrace on stderr.
void fault_named(const char* what, const void* addr) {
  char msg[400];
  const int n = std::snprintf(msg, sizeof msg, what, addr);
  if (n > 0) (void)!write(STDERR_FILENO, msg, std::min(static_cast<size_t>(n), sizeof msg - 1));
  void* frames[48];
  backtrace_symbols_fd(frames, backtrace(frames, 48), STDERR_FILENO);
  signal(SIGSEGV, SIG_DFL);
  raise(SIGSEGV);
}

void on_segv(int sig, siginfo_t* info, void* context) {
  DeviceMemory& m = device_memory();
  if (info != nullptr && m.in_arena(info->si_addr))
    return fault_named("clustr device emulation: host code read or wrote device memory at %p "
                       "outside a copy or a kernel (device memory is reachable only through "
                       "copies: Tensor::to, cudaMemcpyAsync); where:\n",
                       info->si_addr);
  if (info != nullptr && pinned_fault(info->si_addr) != 0)
    return fault_named("clustr device emulation: host code wrote pinned memory at %p while a "
                       "copy from it to the device may not have run yet (a GPU runs it when its "
                       "stream gets there): wait for an event recorded after the copy, or "
                       "synchronize its stream, before writing it again; where:\n",
                       info->si_addr);
  // Not ours: whoever handled SIGSEGV before (a sanitizer), or the default action.
  if (previous_segv.sa_flags & SA_SIGINFO) {
    if (previous_segv.sa_sigaction != nullptr) return previous_segv.sa_sigaction(sig, info, context);
  } else if (previous_segv.sa_handler != SIG_DFL && previous_segv.sa_handler != SIG_IGN &&
             previous_segv.sa_handler != nullptr) {
    return previous_segv.sa_handler(sig);
  }
  signal(SIGSEGV, SIG_DFL);  // returning re-runs the access, which now ends the process
}

// on_segv before whatever handled SIGSEGV until now (a sanitizer), once.
void install_segv_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
  });
}

// Reserves the arena (caller holds mu): false when the address space cannot be had.
bool reserve_locked(DeviceMemory& m) {
  if (m.base != nullptr) return true;
  const size_t huge = size_t(2) << 20;
  const size_t size = (m.capacity + huge - 1) / huge * huge;
  void* p = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  m.base = static_cast<char*>(p);
  m.reserved = size;
  m.free[reinterpret_cast<uintptr_t>(p)] = size;
#if defined(CLUSTR_ASAN_ARENA)
  ASAN_POISON_MEMORY_REGION(p, size);
#endif
  install_segv_handler();
  return true;
}

void* DeviceMemory::take_locked(size_t bytes) {
  if (!reserve_locked(*this)) return nullptr;
  const size_t span = (bytes + kAlign - 1) / kAlign * kAlign + kGap;
  for (auto it = free.begin(); it != free.end(); ++it) {
    if (it->second < span) continue;
    const uintptr_t a = it->first;
    const size_t rest = it->second - span;
    free.erase(it);
    if (rest > 0) free[a + span] = rest;
    spans[a] = span;
    const size_t end = a + span - reinterpret_cast<uintptr_t>(base);
    {
      std::lock_guard<std::mutex> lock(access_mu);
      const size_t hw = (end + page_size() - 1) / page_size() * page_size();
      if (hw > high_water) {
        if (open_scopes > 0) {  // open now: the new pages open too
          open_arena(open_extent, hw);
          open_extent = hw;
        }
        high_water = hw;
      }
    }
#if defined(CLUSTR_ASAN_ARENA)
    ASAN_UNPOISON_MEMORY_REGION(reinterpret_cast<void*>(a), bytes);
#endif
    return reinterpret_cast<void*>(a);
  }
  return nullptr;
}

void DeviceMemory::give_back_locked(void* p) {
  auto s = spans.find(reinterpret_cast<uintptr_t>(p));
  uintptr_t a = s->first;
  size_t size = s->second;
  spans.erase(s);
#if defined(CLUSTR_ASAN_ARENA)
  ASAN_POISON_MEMORY_REGION(p, size);
#endif
  auto next = free.lower_bound(a);  // coalesce with the free neighbours
  if (next != free.end() && a + size == next->first) {
    size += next->second;
    next = free.erase(next);
  }
  if (next != free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == a) {
      a = prev->first;
      size += prev->second;
      free.erase(prev);
    }
  }
  free[a] = size;
}

// Never destroyed: tensors freed during static destruction still find it.
DeviceMemory& device_memory() {
  static DeviceMemory* m = new DeviceMemory;
  return *m;
}

bool no_devices() {
  const char* v = std::getenv("CLUSTR_CUDA_EMULATION_DEVICES");
  return v != nullptr && std::strcmp(v, "0") == 0;
}

// Streams and events are numbered handles, never dereferenced and never reused (see
// emulation.h). They share one numbering, so an event passed as a stream is refused too.
struct Handles {
  std::mutex mu;
  std::set<uintptr_t> streams, events;  // the live ones
  uintptr_t next = 0x1000;              // clear of the toolkit's special stream values (1, 2)

  uintptr_t add(std::set<uintptr_t>& to) {
    std::lock_guard<std::mutex> lock(mu);
    const uintptr_t id = next;
    next += 0x10;
    to.insert(id);
    return id;
  }
  bool remove(std::set<uintptr_t>& from, uintptr_t id) {
    std::lock_guard<std::mutex> lock(mu);
    return from.erase(id) == 1;
  }
  bool has(const std::set<uintptr_t>& in, uintptr_t id) {
    std::lock_guard<std::mutex> lock(mu);
    return in.count(id) == 1;
  }
};

// Never destroyed, like the device memory: a Stream held in a static object is destroyed
// during static destruction.
Handles& handles() {
  static Handles* h = new Handles;
  return *h;
}

uintptr_t id_of(const void* handle) { return reinterpret_cast<uintptr_t>(handle); }

// The null stream is the legacy default stream, always there.
bool live_stream(cudaStream_t s) {
  return s == nullptr || handles().has(handles().streams, id_of(s));
}
bool live_event(cudaEvent_t e) { return e != nullptr && handles().has(handles().events, id_of(e)); }

}  // namespace

namespace clustr::cuda::emulation::state {
DeviceAccess::DeviceAccess() {
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.access_mu);
  if (m.open_scopes++ == 0) {
    open_arena(0, m.high_water);
    m.open_extent = m.high_water;
  }
}
DeviceAccess::~DeviceAccess() {
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.access_mu);
  if (--m.open_scopes == 0 && m.open_extent > 0) {
    if (mprotect(m.base, m.open_extent, PROT_NONE) != 0) {
      std::perror("clustr device emulation: mprotect of the device arena");
      std::abort();
    }
    m.open_extent = 0;
  }
}
bool no_devices() { return ::no_devices(); }
bool live_stream(cudaStream_t s) { return ::live_stream(s); }
bool in_one_allocation(const void* p, size_t bytes) { return device_memory().contains(p, bytes); }
}  // namespace clustr::cuda::emulation::state

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (device emulation)";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
  }
  return "unknown error";
}

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = no_devices() ? 0 : 1;
  return *count == 0 ? fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = 0;
  return no_devices() ? fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr || device != 0) return fail(cudaErrorInvalidValue);
  if (no_devices()) return fail(cudaErrorNoDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 132; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(clustr::cuda::emulation::kMaxSharedPerBlock);
      return cudaSuccess;
  }
  return fail(cudaErrorInvalidValue);
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (no_devices()) return fail(cudaErrorNoDevice);
  if (bytes == 0) return cudaSuccess;
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  if (bytes > m.capacity - m.in_use) return fail(cudaErrorMemoryAllocation);
  void* p = m.take_locked(bytes);
  if (p == nullptr) return fail(cudaErrorMemoryAllocation);
  {
    // Fresh device memory holds whatever was there before; here NaN bytes (see emulation.h).
    clustr::cuda::emulation::state::DeviceAccess open;
    std::memset(p, 0xff, bytes);
  }
  m.blocks[reinterpret_cast<uintptr_t>(p)] = bytes;
  m.in_use += bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return no_devices() ? fail(cudaErrorNoDevice) : cudaSuccess;
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  auto it = m.blocks.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == m.blocks.end()) return fail(cudaErrorInvalidValue);
  m.in_use -= it->second;
  m.blocks.erase(it);
  m.give_back_locked(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!live_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue);
  namespace st = clustr::cuda::emulation::state;
  if (st::capturing(stream) && kind != cudaMemcpyDeviceToDevice)
    return st::refuse_in_capture(stream, "cudaMemcpyAsync",
                                 kind == cudaMemcpyDeviceToHost
                                     ? "a copy of device memory to the host (a host read)"
                                     : "a copy from host memory");
  DeviceMemory& m = device_memory();
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool dst_ok = dst_device ? m.contains(dst, bytes) : !m.touches(dst, bytes);
  const bool src_ok = src_device ? m.contains(src, bytes) : !m.touches(src, bytes);
  if (!dst_ok || !src_ok) {
    std::fprintf(stderr,
                 "clustr device emulation: cudaMemcpyAsync of %zu bytes (kind %d): the %s "
                 "pointer %p is not %s memory\n",
                 bytes, static_cast<int>(kind), dst_ok ? "source" : "destination",
                 dst_ok ? src : static_cast<const void*>(dst),
                 (dst_ok ? src_device : dst_device) ? "device" : "host");
    return fail(cudaErrorInvalidValue);
  }
  if (kind == cudaMemcpyDeviceToDevice) {
    const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
    if (d < s + bytes && s < d + bytes) {
      std::fprintf(stderr,
                   "clustr device emulation: cudaMemcpyAsync device to device of %zu bytes "
                   "from %p to %p: the two ranges overlap (the result is undefined on a GPU)\n",
                   bytes, src, dst);
      return fail(cudaErrorInvalidValue);
    }
  }
  if (st::capturing(stream)) {  // recorded, copied when the graph runs
    st::record(stream, [dst, src, bytes] {
      st::DeviceAccess open;
      std::memcpy(dst, src, bytes);
      return true;
    });
    return cudaSuccess;
  }
  {
    st::DeviceAccess open;
    std::memcpy(dst, src, bytes);
  }
  if (kind == cudaMemcpyHostToDevice) {  // from pinned memory: in flight until waited for
    PinnedMemory& pm = pinned_memory();
    std::lock_guard<std::mutex> lock(pm.mu);
    const auto s = reinterpret_cast<uintptr_t>(src);
    auto it = pm.blocks.upper_bound(s);  // the first block past src; the one before may hold it
    if (it != pm.blocks.begin()) {
      --it;
      if (s < it->first + it->second.bytes) {
        if (it->second.in_flight++ == 0) set_read_only(it->first, it->second.bytes, true);
        pm.in_flight.push_back({stream, ++pm.copies[stream], it->first});
      }
    }
  }
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  if (ptr == nullptr) return fail(cudaErrorInvalidValue);
  if (no_devices()) return fail(cudaErrorNoDevice);
  const size_t rounded = std::max<size_t>((bytes + page_size() - 1) / page_size(), 1) * page_size();
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return fail(cudaErrorMemoryAllocation);
  install_segv_handler();
  PinnedMemory& pm = pinned_memory();
  std::lock_guard<std::mutex> lock(pm.mu);
  pm.blocks[reinterpret_cast<uintptr_t>(p)].bytes = rounded;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  PinnedMemory& pm = pinned_memory();
  std::lock_guard<std::mutex> lock(pm.mu);
  auto it = pm.blocks.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == pm.blocks.end()) return fail(cudaErrorInvalidValue);
  if (it->second.in_flight > 0) waited_locked(pm, true, nullptr, 0);  // it waits, as a GPU's
  munmap(ptr, it->second.bytes);
  pm.blocks.erase(it);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return fail(cudaErrorInvalidValue);
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  *total_bytes = m.capacity;
  *free_bytes = m.capacity - m.in_use;
  return cudaSuccess;
}

// Every emulated launch and copy completes before it returns: nothing is ever pending. (Not
// while a stream captures: the host would wait for work that is only recorded.)
cudaError_t cudaDeviceSynchronize() {
  namespace st = clustr::cuda::emulation::state;
  if (st::capturing_any())
    return st::refuse_in_capture(nullptr, "cudaDeviceSynchronize",
                                 "the host waits for the device (a host read of a result)");
  waited(true, nullptr);
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

// ---- streams and events ------------------------------------------------------------------------
// Work has finished when its call returns, so only the handles need checking.

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0)
    return fail(cudaErrorInvalidValue);
  if (no_devices()) return fail(cudaErrorNoDevice);
  Handles& h = handles();
  *stream = reinterpret_cast<cudaStream_t>(h.add(h.streams));
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  Handles& h = handles();
  if (stream == nullptr || !h.remove(h.streams, id_of(stream)))
    return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!live_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  namespace st = clustr::cuda::emulation::state;
  if (st::capturing(stream))
    return st::refuse_in_capture(stream, "cudaStreamSynchronize",
                                 "the host waits for the stream (a host read of a result)");
  waited(false, stream);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags) {
  if (flags != 0) return fail(cudaErrorInvalidValue);  // cudaEventWaitDefault is all we know
  if (!live_stream(stream) || !live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  namespace st = clustr::cuda::emulation::state;
  if (st::capturing(stream))
    return st::refuse_in_capture(stream, "cudaStreamWaitEvent", "events are not emulated in "
                                 "a captured graph");
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  // The toolkit's flags: blocking sync 0x1, disable timing 0x2, interprocess 0x4.
  if (event == nullptr || (flags & ~0x7u) != 0) return fail(cudaErrorInvalidValue);
  if (no_devices()) return fail(cudaErrorNoDevice);
  Handles& h = handles();
  *event = reinterpret_cast<cudaEvent_t>(h.add(h.events));
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  Handles& h = handles();
  if (event == nullptr || !h.remove(h.events, id_of(event)))
    return fail(cudaErrorInvalidResourceHandle);
  PinnedMemory& pm = pinned_memory();
  std::lock_guard<std::mutex> lock(pm.mu);
  pm.recorded.erase(event);
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!live_event(event) || !live_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  namespace st = clustr::cuda::emulation::state;
  if (st::capturing(stream))
    return st::refuse_in_capture(stream, "cudaEventRecord", "events are not emulated in a "
                                 "captured graph");
  PinnedMemory& pm = pinned_memory();
  std::lock_guard<std::mutex> lock(pm.mu);
  pm.recorded[event] = {stream, pm.copies[stream]};
  return cudaSuccess;
}

namespace {
// The host learnt that an event's work is done: the pinned copies before it have run.
cudaError_t event_done(cudaEvent_t event) {
  if (!live_event(event)) return fail(cudaErrorInvalidResourceHandle);
  PinnedMemory& pm = pinned_memory();
  std::lock_guard<std::mutex> lock(pm.mu);
  auto it = pm.recorded.find(event);
  if (it != pm.recorded.end()) waited_locked(pm, false, it->second.first, it->second.second);
  return cudaSuccess;
}
}  // namespace

// The emulated work has finished when its call returns: every event is complete.
cudaError_t cudaEventQuery(cudaEvent_t event) { return event_done(event); }
cudaError_t cudaEventSynchronize(cudaEvent_t event) { return event_done(event); }

// ---- device memory, continued ---------------------------------------------------------------

namespace clustr::cuda::emulation {

size_t device_bytes_in_use() {
  DeviceMemory& m = device_memory();
  std::lock_guard<std::mutex> lock(m.mu);
  return m.in_use;
}

void poison(void* device_ptr, size_t bytes) {
  if (device_ptr == nullptr || bytes == 0) return;
  if (!device_memory().contains(device_ptr, bytes))
    throw Error(detail::cat("device emulation: poison of ", bytes, " bytes at ", device_ptr,
                            ", which is not inside one device allocation"));
  state::DeviceAccess open;
  std::memset(device_ptr, 0xff, bytes);
}

namespace state {
void record_error(cudaError_t e) { last_error = e; }
}  // namespace state

}  // namespace clustr::cuda::emulation
