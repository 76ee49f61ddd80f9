// The argument checks shared by the op front doors (core/ops_*.cpp). Each throws clustr::Error
// with a message that starts with the op's name: `op` is that name ("add", "gather_rows") and
// `what` names the argument in the message ("a", "table").
#pragma once

#include "core/error.h"
#include "core/tensor.h"

namespace clustr::detail {

inline void check_defined(const char* op, const char* what, const Tensor& t) {
  CLUSTR_CHECK(t.defined(), op, ": ", what, " is an undefined tensor");
}

inline void check_dtype(const char* op, const char* what, const Tensor& t, DType want) {
  check_defined(op, what, t);
  CLUSTR_CHECK(t.dtype() == want, op, ": expected ", what, " to be ", to_string(want), ", got ",
               describe(t));
}

inline void check_f32(const char* op, const char* what, const Tensor& t) {
  check_dtype(op, what, t, DType::f32);
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

}  // namespace clustr::detail
