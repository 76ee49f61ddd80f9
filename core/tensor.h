// Tensor: a shape, a dtype, a device, and a reference-counted block of contiguous row-major
// storage. Views made with reshape() or rows() share the storage (and so see each other's
// writes); every other op allocates its result. Copies between devices are explicit: to().
//
// Dtypes: f32 (float), i32 (int32_t), and bf16, a storage dtype: bfloat16 elements held as
// their bit patterns in uint16_t (core/bf16.h), half the bytes of f32. A bf16 tensor can be
// created, filled, viewed, copied, converted (astype), read (to_vector, item) and saved
// (core/safetensors.h); an op that does not take bf16 rejects it with an error naming the op
// (convert with astype(DType::f32) first).
//
// Dimension legend used across the project: B batch, N queries, S keys, H heads, E per-head
// dim, C clusters, T frames, V vocabulary, D model width.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/shape.h"

namespace clustr {

enum class DType : uint8_t { f32, i32, bf16 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType t);      // bytes per element: 4, 4, 2
const char* to_string(DType t);  // "f32" | "i32" | "bf16"
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

  // Factories. Contents of empty() are unspecified; zeros() works for every dtype.
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
  uint16_t* bf16() const;  // the bf16 bit patterns (core/bf16.h)
  void* raw() const;

  // A view with a new shape and the same elements; one size may be -1 (inferred).
  Tensor reshape(const Shape& shape) const;
  // A view of rows [begin, end) along axis 0.
  Tensor rows(int64_t begin, int64_t end) const;
  // The inverse of rows(): when every xs[k] (at least two) is a block of rows of one storage,
  // xs[k + 1] starting where xs[k] ends, all of one dtype and with one shape past axis 0, a
  // view spanning them (their concatenation along axis 0, without a copy); else an undefined
  // tensor.
  static Tensor adjacent_rows(const std::vector<Tensor>& xs);

  Tensor clone() const;                 // a deep copy on the same device
  Tensor to(Device device) const;       // a deep copy on `device` (a clone when it is the same)
  void copy_from(const Tensor& src);    // same shape and dtype, any devices (a bitwise copy)
  // Every element = value: converted to int32_t for i32, rounded to nearest even for bf16
  // (float_to_bf16).
  void fill(float value);
  // A new tensor of `dtype` on this tensor's device holding this one's values: f32 -> bf16
  // rounds to nearest even (float_to_bf16; NaN stays NaN, overflow goes to inf), bf16 -> f32 is
  // exact; the same dtype gives a clone. A conversion to or from i32 throws clustr::Error.
  // The device converts bit for bit as the cpu does.
  Tensor astype(DType dtype) const;

  // Host copies of the elements, for tests and I/O. Work from any device. to_vector() reads f32
  // and bf16 tensors (a bf16 element's exact value), to_int_vector() i32 ones.
  std::vector<float> to_vector() const;
  std::vector<int32_t> to_int_vector() const;
  float item() const;  // the single element of a one-element f32 or bf16 tensor

  // True when both tensors use the same storage block.
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }
  // True when no other tensor or view uses this one's storage, so that an in-place update
  // cannot be seen anywhere else (the autograd engine then sums gradients in place).
  bool sole_owner() const { return storage_ != nullptr && storage_.use_count() == 1; }
  // The same for a set of views: true when they are all of one storage and nothing else uses it.
  static bool sole_owners(const std::vector<const Tensor*>& views);

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
