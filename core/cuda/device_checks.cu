// Checks of device values made on the device (cuda.h, "checks made on the device"): a kernel per
// check records the first value out of range in one device word set, which raise_device_errors
// reads back. Written against core/cuda/kernel.h, so the same code runs on a GPU and in device
// emulation.
#include <cstdint>
#include <mutex>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/cuda.h"
#include "core/cuda/kernel.h"
#include "core/error.h"
#include "core/math.h"

namespace clustr::cuda {

namespace {

// The record: [0] the failing check's site (0: none), [1] [2] the element (low and high 32
// bits), [3] its value, [4] [5] the range, [6] the value also allowed.
constexpr int kWords = 8;

struct Site {
  const char *op, *what;
  bool floats;  // check_not_below_on_device's (the value and the bound are float bits)
};

struct Checks {
  std::mutex mu;
  std::vector<Site> sites;  // site s is sites[s - 1]
  int32_t* record = nullptr;  // device, kWords int32, made once (never freed)
};

Checks& registry() {
  static Checks* c = new Checks;
  return *c;
}

thread_local bool t_deferred = false;

// Zeroes the record by a copy from the host (no kernel: making the record inside
// Graph::capture must not count as one of the step's launches).
void clear(int32_t* record) {
  const int32_t zeros[kWords] = {};
  copy_h2d(record, zeros, sizeof zeros);
}

// The record, made and zeroed on first use. Outside a capture: zeroing it inside one would
// be recorded into the graph and clear every replay's failure at the next.
int32_t* record_locked(Checks& c) {
  if (c.record == nullptr) {
    CLUSTR_CHECK(!capturing(), "cuda: the device checks' record must exist before a graph is "
                 "captured (Graph::capture makes it)");
    void* p = nullptr;
    CLUSTR_CUDA_CHECK(cudaMalloc(&p, kWords * sizeof(int32_t)));
    c.record = static_cast<int32_t*>(p);
    clear(c.record);
  }
  return c.record;
}

// Element i failed (value bits v): the first failure claims the record, the others leave it.
CLUSTR_DEVICE void record_failure(int32_t* record, int32_t site, int64_t i, int32_t v,
                                  int32_t lo, int32_t hi, int32_t also) {
  if (atomic_cas(record, 0, site) != 0) return;
  record[1] = static_cast<int32_t>(i & 0xffffffff);
  record[2] = static_cast<int32_t>(i >> 32);
  record[3] = v;
  record[4] = lo;
  record[5] = hi;
  record[6] = also;
}

struct RangeCheckKernel {
  static constexpr bool kUsesBarrier = false;
  const int32_t* values;
  int64_t n;
  int32_t lo, hi, also, site;
  int32_t* record;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) {
      const int32_t v = values[i];
      if ((v >= lo && v < hi) || v == also) continue;
      record_failure(record, site, i, v, lo, hi, also);
    }
  }
};

// values[i] >= lo (a NaN fails).
struct NotBelowCheckKernel {
  static constexpr bool kUsesBarrier = false;
  const float* values;
  int64_t n;
  float lo;
  int32_t site;
  int32_t* record;
  CLUSTR_DEVICE void operator()(const Thread& t) const {
    for (int64_t i = global_x(t); i < n; i += grid_stride_x(t)) {
      const float v = values[i];
      if (v >= lo) continue;
      record_failure(record, site, i, static_cast<int32_t>(math::bits_of(v)),
                     static_cast<int32_t>(math::bits_of(lo)), 0, 0);
    }
  }
};

// The site number of (op, what, floats), registered on first use; makes the record.
int32_t site_of(const char* op, const char* what, bool floats, int32_t** record) {
  Checks& c = registry();
  std::lock_guard<std::mutex> lock(c.mu);
  *record = record_locked(c);
  for (size_t s = 0; s < c.sites.size(); ++s)
    if (c.sites[s].op == op && c.sites[s].what == what && c.sites[s].floats == floats)
      return static_cast<int32_t>(s + 1);
  c.sites.push_back({op, what, floats});
  return static_cast<int32_t>(c.sites.size());
}

}  // namespace

DeferredChecks::DeferredChecks() : previous_(t_deferred) {
  require("cuda::DeferredChecks");
  Checks& c = registry();
  std::lock_guard<std::mutex> lock(c.mu);
  record_locked(c);
  t_deferred = true;
}

DeferredChecks::~DeferredChecks() { t_deferred = previous_; }

bool deferring_checks() { return t_deferred || capturing(); }

void make_device_check_record() {
  Checks& c = registry();
  std::lock_guard<std::mutex> lock(c.mu);
  record_locked(c);
}

void check_range_on_device(const char* op, const char* what, const int32_t* values, int64_t n,
                           int32_t lo, int32_t hi, int32_t also) {
  if (n <= 0) return;
  int32_t* record = nullptr;
  const int32_t site = site_of(op, what, false, &record);
  launch("cuda::check_range_on_device", {elementwise_blocks(n)}, {kElementwiseThreads}, 0,
         RangeCheckKernel{values, n, lo, hi, also, site, record});
}

void check_not_below_on_device(const char* op, const char* what, const float* values, int64_t n,
                               float lo) {
  if (n <= 0) return;
  int32_t* record = nullptr;
  const int32_t site = site_of(op, what, true, &record);
  launch("cuda::check_not_below_on_device", {elementwise_blocks(n)}, {kElementwiseThreads}, 0,
         NotBelowCheckKernel{values, n, lo, site, record});
}

void raise_device_errors() {
  Checks& c = registry();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.record == nullptr) return;
  int32_t r[kWords];
  copy_d2h(r, c.record, sizeof r);
  if (r[0] == 0) return;
  clear(c.record);  // reported once
  const Site& s = c.sites.at(static_cast<size_t>(r[0] - 1));
  const int64_t i = static_cast<int64_t>(static_cast<uint32_t>(r[1])) |
                    (static_cast<int64_t>(r[2]) << 32);
  const char* note =
      " (checked on the device, in a step that does not wait for the host; the results of that "
      "step are not to be trusted)";
  if (s.floats)
    throw Error(detail::cat(s.op, ": ", s.what, "[", i, "] = ",
                            math::float_from_bits(static_cast<uint32_t>(r[3])), " is not >= ",
                            math::float_from_bits(static_cast<uint32_t>(r[4])), note));
  throw Error(detail::cat(s.op, ": ", s.what, "[", i, "] = ", r[3], " is outside [", r[4], ", ",
                          r[5], ")",
                          r[6] != INT32_MIN ? detail::cat(" and is not ", r[6]) : std::string(),
                          note));
}

}  // namespace clustr::cuda
