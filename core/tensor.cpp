#include "core/tensor.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <vector>
#include <cstdlib>
#include <cstring>

#include "core/bf16.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/size_class.h"

namespace clustr {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::i32: return 4;
    case DType::bf16: return 2;
  }
  throw Error(detail::cat("dtype_size: unknown DType value ", static_cast<int>(t)));
}

const char* to_string(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::i32: return "i32";
    case DType::bf16: return "bf16";
  }
  return "unknown dtype";  // for error messages: never throws
}
const char* to_string(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

// ---- CPU allocation with statistics and a cache of large blocks ----------------------------
//
// Training allocates the same large sizes every step. Returned to the system, such blocks come
// back as fresh pages that fault and are zeroed on first touch (several percent of a small
// model's step), so blocks of at least kCacheMin bytes are kept in free lists by size class
// (core/size_class.h) and handed out again, up to kCacheMax bytes in all. Live and peak bytes
// count what tensors use, not what the cache holds.

namespace {
constexpr size_t kAlign = 64;  // one cache line, and one AVX-512 register
constexpr size_t kCacheMin = 64 * 1024;
constexpr size_t kCacheMax = size_t(1) << 30;

struct HostAllocator {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> cache;  // size class -> free blocks
  size_t cached = 0;
  int64_t live = 0, peak = 0, count = 0;
};

// Never destroyed: tensors in static objects may be freed during static destruction.
HostAllocator& host_allocator() {
  static HostAllocator* a = new HostAllocator;
  return *a;
}

size_t host_block_size(size_t bytes) {
  return bytes >= kCacheMin ? size_class(bytes) : (bytes + kAlign - 1) / kAlign * kAlign;
}

void* host_alloc(size_t bytes) {
  HostAllocator& a = host_allocator();
  size_t size = host_block_size(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(a.mu);
    a.live += static_cast<int64_t>(bytes);
    a.peak = std::max(a.peak, a.live);
    ++a.count;
    auto it = a.cache.find(size);
    if (it != a.cache.end() && !it->second.empty()) {
      p = it->second.back();  // the most recently freed: likeliest to be in cache
      it->second.pop_back();
      a.cached -= size;
      return p;
    }
  }
  p = std::aligned_alloc(kAlign, size);
  if (!p) {
    std::lock_guard<std::mutex> lock(a.mu);
    a.live -= static_cast<int64_t>(bytes);
    throw Error(detail::cat("Tensor: out of host memory allocating ", bytes, " bytes"));
  }
  return p;
}

void host_free(void* p, size_t bytes) {
  HostAllocator& a = host_allocator();
  size_t size = host_block_size(bytes);
  {
    std::lock_guard<std::mutex> lock(a.mu);
    a.live -= static_cast<int64_t>(bytes);
    if (bytes >= kCacheMin && a.cached + size <= kCacheMax) {
      a.cache[size].push_back(p);
      a.cached += size;
      return;
    }
  }
  std::free(p);
}
}  // namespace

MemoryStats memory_stats(Device d) {
  if (d == Device::cuda) return cuda::memory_stats();
  HostAllocator& a = host_allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  return MemoryStats{a.live, a.peak, a.count};
}

void reset_peak_memory(Device d) {
  if (d == Device::cuda) return cuda::reset_peak();
  HostAllocator& a = host_allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  a.peak = a.live;
}

void empty_host_cache() {
  HostAllocator& a = host_allocator();
  std::lock_guard<std::mutex> lock(a.mu);
  for (auto& [size, blocks] : a.cache)
    for (void* p : blocks) std::free(p);
  a.cache.clear();
  a.cached = 0;
}

Storage::Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
  if (bytes == 0) return;
  data_ = device == Device::cuda ? cuda::alloc(bytes) : host_alloc(bytes);
}

Storage::~Storage() {
  if (!data_) return;
  if (device_ == Device::cuda)
    cuda::free(data_, bytes_);
  else
    host_free(data_, bytes_);
}

// ---- Tensor ------------------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape)
    CLUSTR_CHECK(d >= 0, "Tensor::empty: negative size in shape ", to_string(shape));
  Tensor t;
  t.shape_ = shape;
  t.numel_ = clustr::numel(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  const size_t bytes = static_cast<size_t>(t.numel_) * dtype_size(dtype);
  if (device != Device::cuda) {
    t.storage_ = std::make_shared<Storage>(bytes, device);
    return t;
  }
  try {
    t.storage_ = std::make_shared<Storage>(bytes, device);
  } catch (const Error& e) {
    // Which tensor did not fit says which setting to lower (the apps add their flags).
    if (std::string(e.what()).find("out of device memory") == std::string::npos) throw;
    throw Error(detail::cat("a ", to_string(dtype), " tensor of shape ", to_string(shape),
                            " does not fit on the device: ", e.what()));
  }
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(0.0f);
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, Device device) {
  Tensor t = empty(shape, DType::f32, device);
  t.fill(value);
  return t;
}

Tensor Tensor::scalar(float value, Device device) { return full({}, value, device); }

namespace {
template <typename T>
Tensor from_host(const std::vector<T>& values, const Shape& shape, DType dtype, Device device) {
  CLUSTR_CHECK(static_cast<int64_t>(values.size()) == numel(shape), "Tensor::from_vector: ",
               values.size(), " values do not fill shape ", to_string(shape), " (",
               numel(shape), " elements)");
  Tensor t = Tensor::empty(shape, dtype, device);
  if (t.nbytes() == 0) return t;
  if (device == Device::cpu)
    std::memcpy(t.raw(), values.data(), t.nbytes());
  else
    cuda::copy_h2d(t.raw(), values.data(), t.nbytes());
  return t;
}
}  // namespace

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, Device device) {
  return from_host(values, shape, DType::f32, device);
}

Tensor Tensor::from_int_vector(const std::vector<int32_t>& values, const Shape& shape,
                               Device device) {
  return from_host(values, shape, DType::i32, device);
}

int64_t Tensor::size(int axis) const {
  return shape_[normalize_axis(axis, rank(), "Tensor::size")];
}

void* Tensor::raw() const {
  CLUSTR_CHECK(defined(), "Tensor: use of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_);
}

float* Tensor::f32() const {
  CLUSTR_CHECK(dtype_ == DType::f32, "Tensor::f32: tensor ", describe(*this), " is not f32");
  return static_cast<float*>(raw());
}

int32_t* Tensor::i32() const {
  CLUSTR_CHECK(dtype_ == DType::i32, "Tensor::i32: tensor ", describe(*this), " is not i32");
  return static_cast<int32_t*>(raw());
}

uint16_t* Tensor::bf16() const {
  CLUSTR_CHECK(dtype_ == DType::bf16, "Tensor::bf16: tensor ", describe(*this), " is not bf16");
  return static_cast<uint16_t*>(raw());
}

Tensor Tensor::reshape(const Shape& shape) const {
  CLUSTR_CHECK(defined(), "reshape: use of an undefined tensor");
  Shape s = shape;
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      CLUSTR_CHECK(infer < 0, "reshape: more than one -1 in ", to_string(shape));
      infer = static_cast<int>(i);
    } else {
      CLUSTR_CHECK(s[i] >= 0, "reshape: negative size in ", to_string(shape));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    CLUSTR_CHECK(known > 0 && numel_ % known == 0, "reshape: cannot reshape ", to_string(shape_),
                 " (", numel_, " elements) to ", to_string(shape));
    s[infer] = numel_ / known;
  }
  CLUSTR_CHECK(clustr::numel(s) == numel_, "reshape: cannot reshape ", to_string(shape_), " (",
               numel_, " elements) to ", to_string(shape), " (", clustr::numel(s), " elements)");
  Tensor t = *this;
  t.shape_ = s;
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  CLUSTR_CHECK(rank() >= 1, "rows: tensor ", describe(*this), " has no axis 0");
  CLUSTR_CHECK(0 <= begin && begin <= end && end <= shape_[0], "rows: range [", begin, ", ", end,
               ") is outside axis 0 of ", describe(*this));
  Tensor t = *this;
  int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  t.offset_ = offset_ + begin * row;
  t.shape_[0] = end - begin;
  t.numel_ = row * (end - begin);
  return t;
}

Tensor Tensor::adjacent_rows(const std::vector<Tensor>& xs) {
  if (xs.size() < 2 || !xs[0].defined() || xs[0].rank() < 1) return Tensor();
  const Tensor& x0 = xs[0];
  Tensor t = x0;
  t.shape_[0] = 0;
  t.numel_ = 0;
  for (const Tensor& x : xs) {
    if (!x.defined() || x.storage_ != x0.storage_ || x.dtype_ != x0.dtype_ ||
        x.rank() != x0.rank() || x.offset_ != x0.offset_ + t.numel_)
      return Tensor();
    for (int i = 1; i < x.rank(); ++i)
      if (x.shape_[i] != x0.shape_[i]) return Tensor();
    t.shape_[0] += x.shape_[0];
    t.numel_ += x.numel_;
  }
  return t;
}

bool Tensor::sole_owners(const std::vector<const Tensor*>& views) {
  if (views.empty() || views[0]->storage_ == nullptr) return false;
  for (const Tensor* v : views)
    if (v->storage_ != views[0]->storage_) return false;
  return views[0]->storage_.use_count() == static_cast<long>(views.size());
}

Tensor Tensor::clone() const { return to(device_); }

Tensor Tensor::to(Device device) const {
  CLUSTR_CHECK(defined(), "Tensor::to: use of an undefined tensor");
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  CLUSTR_CHECK(defined() && src.defined(), "copy_from: use of an undefined tensor");
  CLUSTR_CHECK(shape_ == src.shape_ && dtype_ == src.dtype_, "copy_from: destination ",
               describe(*this), " and source ", describe(src), " differ in shape or dtype");
  size_t n = nbytes();
  if (n == 0) return;
  if (device_ == Device::cpu && src.device_ == Device::cpu)
    std::memmove(raw(), src.raw(), n);
  else if (device_ == Device::cuda && src.device_ == Device::cpu)
    cuda::copy_h2d(raw(), src.raw(), n);
  else if (device_ == Device::cpu && src.device_ == Device::cuda)
    cuda::copy_d2h(raw(), src.raw(), n);
  else
    cuda::copy_d2d(raw(), src.raw(), n);
}

namespace {
// Below this many elements a host conversion runs on one thread: a parallel region costs more
// than it saves (the element-wise kernels' threshold, core/cpu/elementwise.cpp).
[[maybe_unused]] constexpr int64_t kParallelMin = 32768;  // unused without OpenMP

void host_f32_to_bf16(const float* x, uint16_t* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
}

void host_bf16_to_f32(const uint16_t* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
}
}  // namespace

void Tensor::fill(float value) {
  if (numel_ == 0) return;
  switch (dtype_) {
    case DType::f32: {
      float* p = f32();
      if (device_ == Device::cuda) return cuda::fill_f32(p, value, numel_);
      for (int64_t i = 0; i < numel_; ++i) p[i] = value;
      return;
    }
    case DType::i32: {
      int32_t* p = i32();
      auto v = static_cast<int32_t>(value);
      if (device_ == Device::cuda) return cuda::fill_i32(p, v, numel_);
      for (int64_t i = 0; i < numel_; ++i) p[i] = v;
      return;
    }
    case DType::bf16: {
      uint16_t* p = bf16();
      const uint16_t v = float_to_bf16(value);
      if (device_ == Device::cuda) return cuda::fill_u16(p, v, numel_);
      for (int64_t i = 0; i < numel_; ++i) p[i] = v;
      return;
    }
  }
  throw Error(detail::cat("Tensor::fill: tensor ", describe(*this), " has an unknown dtype"));
}

Tensor Tensor::astype(DType dtype) const {
  CLUSTR_CHECK(defined(), "Tensor::astype: use of an undefined tensor");
  if (dtype == dtype_) return clone();
  const bool to_bf16 = dtype_ == DType::f32 && dtype == DType::bf16;
  const bool from_bf16 = dtype_ == DType::bf16 && dtype == DType::f32;
  CLUSTR_CHECK(to_bf16 || from_bf16, "Tensor::astype: cannot convert ", describe(*this), " to ",
               to_string(dtype), "; astype converts f32 <-> bf16 (or copies a tensor to its own ",
               "dtype), and i32 converts to nothing else");
  Tensor out = empty(shape_, dtype, device_);
  if (numel_ == 0) return out;
  const bool on_cuda = device_ == Device::cuda;
  if (to_bf16)
    (on_cuda ? cuda::f32_to_bf16 : host_f32_to_bf16)(f32(), out.bf16(), numel_);
  else
    (on_cuda ? cuda::bf16_to_f32 : host_bf16_to_f32)(bf16(), out.f32(), numel_);
  return out;
}

std::vector<float> Tensor::to_vector() const {
  CLUSTR_CHECK(defined(), "Tensor::to_vector: use of an undefined tensor");
  CLUSTR_CHECK(dtype_ == DType::f32 || dtype_ == DType::bf16, "Tensor::to_vector: tensor ",
               describe(*this), " is not f32 or bf16 (read i32 tensors with to_int_vector())");
  Tensor host = device_ == Device::cpu ? *this : to(Device::cpu);
  std::vector<float> out(static_cast<size_t>(numel_));
  if (dtype_ == DType::bf16) {
    host_bf16_to_f32(host.bf16(), out.data(), numel_);
  } else if (numel_ > 0) {
    std::memcpy(out.data(), host.f32(), static_cast<size_t>(numel_) * sizeof(float));
  }
  return out;
}

std::vector<int32_t> Tensor::to_int_vector() const {
  CLUSTR_CHECK(defined(), "Tensor::to_int_vector: use of an undefined tensor");
  Tensor host = device_ == Device::cpu ? *this : to(Device::cpu);
  const int32_t* p = host.i32();
  return std::vector<int32_t>(p, p + numel_);
}

float Tensor::item() const {
  CLUSTR_CHECK(numel_ == 1, "item: tensor ", describe(*this), " does not have exactly one element");
  CLUSTR_CHECK(dtype_ == DType::f32 || dtype_ == DType::bf16, "item: tensor ", describe(*this),
               " is not f32 or bf16 (read an i32 element with to_int_vector())");
  return to_vector()[0];
}

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  return detail::cat(to_string(t.dtype()), " ", to_string(t.shape()), " on ",
                     to_string(t.device()));
}

}  // namespace clustr
