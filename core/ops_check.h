// The argument checks shared by the op front doors (core/ops_*.cpp). Each throws clustr::Error
// with a message that starts with the op's name: `op` is that name ("add", "gather_rows") and
// `what` names the argument in the message ("a", "table").
#pragma once

#include <vector>

#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/tensor.h"

namespace clustr::detail {

inline void check_defined(const char* op, const char* what, const Tensor& t) {
  CLUSTR_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

// bf16 is a storage dtype (core/tensor.h): an op that computes in f32 says how to get there.
inline const char* dtype_hint(const Tensor& t) {
  return t.dtype() == DType::bf16 ? " (bf16 is a storage dtype; convert with astype(DType::f32))"
                                  : "";
}

inline void check_dtype(const char* op, const char* what, const Tensor& t, DType want) {
  check_defined(op, what, t);
  CLUSTR_CHECK(t.dtype() == want, op, ": expected ", what, " to be ", to_string(want), ", got ",
               describe(t), dtype_hint(t));
}

inline void check_f32(const char* op, const char* what, const Tensor& t) {
  check_dtype(op, what, t, DType::f32);
}

// An operand of a matrix product: f32, or bf16 (which the product reads as it is stored).
inline void check_product_operand(const char* op, const char* what, const Tensor& t) {
  check_defined(op, what, t);
  CLUSTR_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, op, ": expected ", what,
               " to be f32 or bf16, got ", describe(t));
}

inline void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  CLUSTR_CHECK(a.device() == b.device(), op, ": inputs are on different devices: ", describe(a),
               " and ", describe(b), " (move one with .to())");
}

// For ops that have no CUDA kernel yet: say so instead of touching device memory.
inline void require_cpu(const char* op, const Tensor& t) {
  CLUSTR_CHECK(t.device() == Device::cpu, op, ": no CUDA kernel for this op yet; tensor ",
               describe(t), " (copy it to the cpu with .to(Device::cpu))");
}

// The elements of t for a check that reads values on the host (targets, indices, weights): t's
// own memory on the cpu; for a device tensor a host copy, kept in `copy`. A device pointer is
// never dereferenced on the host, and the copy is small next to the op's data.
inline const int32_t* host_i32(const Tensor& t, std::vector<int32_t>& copy) {
  if (t.device() == Device::cpu) return t.i32();
  copy = t.to_int_vector();
  return copy.data();
}
inline const float* host_f32(const Tensor& t, std::vector<float>& copy) {
  const float* p = t.f32();  // throws unless f32 on either device (to_vector() also reads bf16)
  if (t.device() == Device::cpu) return p;
  copy = t.to_vector();
  return copy.data();
}

// Sequence lengths: i32 (batch) on `like`'s device, every value in [0, limit]. The messages
// name the bound ("S", "N") and the tensor whose axis it bounds (`like_name` and `like`).
inline void check_lengths(const char* op, const Tensor& lengths, int64_t batch, int64_t limit,
                          const char* limit_name, const char* like_name, const Tensor& like) {
  check_dtype(op, "lengths", lengths, DType::i32);
  check_same_device(op, like, lengths);
  CLUSTR_CHECK(lengths.shape() == Shape{batch}, op, ": expected lengths of shape (", batch,
               ",) (one per sequence of ", like_name, " ", describe(like), "), got ",
               describe(lengths));
  const std::vector<int32_t> len = lengths.to_int_vector();  // host copy: any device
  for (int64_t b = 0; b < batch; ++b)
    CLUSTR_CHECK(len[b] >= 0 && len[b] <= limit, op, ": lengths[", b, "] = ", len[b],
                 " is outside [0, ", limit_name, " = ", limit, "] (", like_name, " ",
                 describe(like), ")");
}

// As check_lengths, but checked by a kernel when the device's checks are deferred (cuda.h's
// DeferredChecks): for ops whose device kernels read the lengths on the device and keep within
// [0, limit] (and that check any host copy they make themselves).
inline void check_lengths_deferrable(const char* op, const Tensor& lengths, int64_t batch,
                                     int64_t limit, const char* limit_name,
                                     const char* like_name, const Tensor& like) {
  if (lengths.device() != Device::cuda || !cuda::deferring_checks() || limit >= INT32_MAX) {
    check_lengths(op, lengths, batch, limit, limit_name, like_name, like);
    return;
  }
  check_dtype(op, "lengths", lengths, DType::i32);
  check_same_device(op, like, lengths);
  CLUSTR_CHECK(lengths.shape() == Shape{batch}, op, ": expected lengths of shape (", batch,
               ",) (one per sequence of ", like_name, " ", describe(like), "), got ",
               describe(lengths));
  cuda::check_range_on_device(op, "lengths", lengths.i32(), batch, 0,
                              static_cast<int32_t>(limit + 1));
}

}  // namespace clustr::detail
