// Tensor: a shape, a dtype, a device, and a reference-counted block of contiguous row-major
// storage. Views made with reshape() or rows() share the storage (and so see each other's
// writes); every other op allocates its result. Copies between devices are explicit: to().
//
// Dimension legend used across the project: B batch, N queries, S keys, H heads, E per-head
// dim, C clusters, T frames, V vocabulary, D model width.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/shape.h"

namespace clustr {

enum class DType : uint8_t { f32, i32 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType t);
const char* to_string(DType t);
const char* to_string(Device d);

// Live and peak bytes of tensor storage on a device, counted by the allocator.
struct MemoryStats {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t allocations = 0;  // number of storages allocated so far
};
MemoryStats memory_stats(Device d);
void reset_peak_memory(Device d);  // sets peak to the current live bytes
// Freed host blocks of 64 KiB and more are cached for reuse (up to 1 GiB); this returns them to
// the system. (cuda::empty_cache does the same for the device.)
void empty_host_cache();

// A block of bytes on one device. Freed when the last tensor that uses it goes away.
class Storage {
 public:
  Storage(size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor; defined() is false

  // Factories. Contents of empty() are unspecified.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu);
  static Tensor full(const Shape& shape, float value, Device device = Device::cpu);
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            Device device = Device::cpu);
  static Tensor from_int_vector(const std::vector<int32_t>& values, const Shape& shape,
                                Device device = Device::cpu);
  static Tensor scalar(float value, Device device = Device::cpu);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t size(int axis) const;  // negative axes count from the end
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }

  // Raw element pointers (host or device memory, as device() says). Throws on a dtype mismatch.
  float* f32() const;
  int32_t* i32() const;
  void* raw() const;

  // A view with a new shape and the same elements; one size may be -1 (inferred).
  Tensor reshape(const Shape& shape) const;
  // A view of rows [begin, end) along axis 0.
  Tensor rows(int64_t begin, int64_t end) const;

  Tensor clone() const;                 // a deep copy on the same device
  Tensor to(Device device) const;       // a deep copy on `device` (a clone when it is the same)
  void copy_from(const Tensor& src);    // same shape and dtype, any devices
  void fill(float value);               // every element = value (converted for i32)

  // Host copies of the elements, for tests and I/O. Work from any device.
  std::vector<float> to_vector() const;
  std::vector<int32_t> to_int_vector() const;
  float item() const;  // the single element of a one-element f32 tensor

  // True when both tensors use the same storage block.
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }
  // True when no other tensor or view uses this one's storage, so that an in-place update
  // cannot be seen anywhere else (the autograd engine then sums gradients in place).
  bool sole_owner() const { return storage_ != nullptr && storage_.use_count() == 1; }

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

// "f32 (2, 3) on cpu", for error messages.
std::string describe(const Tensor& t);

}  // namespace clustr
