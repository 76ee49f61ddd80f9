// Helpers shared by the CUDA test files (tests/test_cuda*.cpp): comparisons of a device result
// with its CPU twin, in ulps or row by row relative to each row's scale.
//
// A kernel that computes the same float formula as the CPU on one element must agree bit for
// bit in emulation; on a GPU nvcc fuses a * b + c into one rounding and CUDA's libm differs from
// glibc's, so callers allow a few ulp there.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <vector>

#include "core/tensor.h"

namespace clustr::test {

// Ulps between two floats on the ordered integer line; NaN equals NaN, and +0 and -0 are 1 ulp
// apart (so that bit-exact comparisons tell the zeros apart).
inline int64_t ulp_distance(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) ? 0 : INT64_MAX;
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia == ib) return 0;
  auto ordered = [](int32_t i) -> int64_t { return i < 0 ? -int64_t(i & 0x7fffffff) : i; };
  const int64_t d = ordered(ia) - ordered(ib);
  return d == 0 ? 1 : d < 0 ? -d : d;  // d == 0 with different bits: +0 and -0
}

// actual (the device's) and expected (the cpu's) agree within max_ulps everywhere (0: bit for
// bit). The message gives the number of differing elements and the worst.
inline void check_ulps(const std::vector<float>& actual, const std::vector<float>& expected,
                       int64_t max_ulps) {
  REQUIRE(actual.size() == expected.size());
  int64_t bad = 0, worst_d = 0;
  size_t worst = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const int64_t d = ulp_distance(actual[i], expected[i]);
    if (d > max_ulps) {
      ++bad;
      if (d > worst_d) worst_d = d, worst = i;
    }
  }
  std::ostringstream os;
  os.precision(9);
  if (bad)
    os << bad << " of " << actual.size() << " elements differ by more than " << max_ulps
       << " ulp; worst at " << worst << ": device " << actual[worst] << ", cpu "
       << expected[worst] << " (" << worst_d << " ulp)";
  CHECK_MESSAGE(bad == 0, os.str());
}

// t on device d; an undefined tensor (an absent optional input) stays undefined.
inline Tensor on(const Tensor& t, Device d) { return t.defined() ? t.to(d) : Tensor(); }

// An op on the CPU and on the device, in the manner of ggml's test-backend-ops: op(inputs)
// computed from CPU tensors and from their device copies (undefined inputs stay undefined); the
// device's result must live on the device, have the CPU result's shape and be within max_ulps
// of it everywhere (0: bit for bit). One line per case:
//   compare_devices([&](const Inputs& x) { return clustr::add(x[0], x[1]); }, {a, b}, 0);
using Inputs = std::vector<Tensor>;
template <class Op>
void compare_devices(Op op, const Inputs& inputs, int64_t max_ulps) {
  Inputs device;
  for (const Tensor& t : inputs) device.push_back(on(t, Device::cuda));
  const Tensor expected = op(inputs), got = op(device);
  CHECK(got.device() == Device::cuda);
  REQUIRE(got.shape() == expected.shape());
  check_ulps(got.to_vector(), expected.to_vector(), max_ulps);
}

// How check_rows treats a row of expected (finite) values that are all 0: `scaled` gives it the
// tolerance of a tenth of the tensor's scale like any row; `exact` requires exact zeros.
enum class ZeroRows { scaled, exact };

// actual (device) against expected (cpu), viewed as rows of `width`: each element within
// row_tol times its row's scale, its largest finite |expected| but at least a tenth of the whole
// tensor's (see zero_rows for all-zero rows); an infinite expected must match. Prints the worst
// element on failure.
inline void check_rows(const char* what, const std::vector<float>& actual,
                       const std::vector<float>& expected, int64_t width, double row_tol,
                       ZeroRows zero_rows) {
  REQUIRE(actual.size() == expected.size());
  int64_t bad = 0;
  size_t worst = 0;
  double worst_excess = 0, worst_tol = 0, tensor_scale = 0;
  for (float e : expected)
    if (std::isfinite(e)) tensor_scale = std::max(tensor_scale, double(std::fabs(e)));
  const size_t w = static_cast<size_t>(std::max<int64_t>(width, 1));
  for (size_t r0 = 0; r0 < expected.size(); r0 += w) {
    const size_t r1 = std::min(r0 + w, expected.size());
    double scale = 0;
    for (size_t i = r0; i < r1; ++i)
      if (std::isfinite(expected[i])) scale = std::max(scale, double(std::fabs(expected[i])));
    const double tol = scale == 0 && zero_rows == ZeroRows::exact
                           ? 0
                           : row_tol * std::max(scale, 0.1 * tensor_scale);
    for (size_t i = r0; i < r1; ++i) {
      const double a = actual[i], e = expected[i];
      if (std::isinf(e) && a == e) continue;
      const double err = std::fabs(a - e);
      if (!(err <= tol)) {
        ++bad;
        const double excess = tol > 0 ? err / tol : INFINITY;
        if (!(excess <= worst_excess)) worst = i, worst_excess = excess, worst_tol = tol;
      }
    }
  }
  std::ostringstream os;
  os.precision(9);
  if (bad)
    os << what << ": " << bad << " of " << actual.size() << " elements outside " << row_tol
       << " of their row's scale; worst at " << worst << ": device " << actual[worst] << ", cpu "
       << expected[worst] << " (tolerance " << worst_tol << ")";
  CHECK_MESSAGE(bad == 0, os.str());
}

}  // namespace clustr::test
