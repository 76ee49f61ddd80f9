// Helpers shared by the CUDA test files (tests/test_cuda*.cpp): comparisons of a device result
// with its CPU twin, in ulps, within atol + rtol, or row by row relative to each row's scale, and
// compare_devices, which runs an op on both devices and compares every output.
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
#include <string>
#include <type_traits>
#include <vector>

#include "check.h"
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

// How a device result must agree with the cpu's: within a number of ulps everywhere (an integer
// converts: 0 is bit for bit), or, made by Tolerance::close(atol, rtol), within
// atol + rtol |cpu| everywhere (CHECK_CLOSE's rule: NaN where the cpu has NaN, the same
// infinity). i32 results must be equal whatever the tolerance.
struct Tolerance {
  template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  Tolerance(T max_ulps) : ulps(static_cast<int64_t>(max_ulps)) {}  // NOLINT: implicit on purpose
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Tolerance(T) = delete;  // ulps are whole; an absolute or relative one is Tolerance::close
  static Tolerance close(double atol, double rtol) {
    Tolerance t(0);
    t.relative = true;
    t.atol = atol;
    t.rtol = rtol;
    return t;
  }
  int64_t ulps = 0;
  bool relative = false;
  double atol = 0, rtol = 0;
};

// Indices from the device against the cpu's, exactly; the message names the first difference.
inline void check_ints(const std::vector<int32_t>& actual, const std::vector<int32_t>& expected) {
  REQUIRE(actual.size() == expected.size());
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < actual.size(); ++i)
    if (actual[i] != expected[i] && bad++ == 0) first = i;
  std::ostringstream os;
  if (bad)
    os << bad << " of " << actual.size() << " integers differ; first at " << first << ": device "
       << actual[first] << ", cpu " << expected[first];
  CHECK_MESSAGE(bad == 0, os.str());
}

// got (the device's result) against expected (the cpu's): both undefined (an output that was not
// asked for), or got on the device with expected's dtype and shape and its values within tol.
inline void check_output(const Tensor& got, const Tensor& expected, const Tolerance& tol) {
  REQUIRE_MESSAGE(got.defined() == expected.defined(),
                  "defined on the device: " << got.defined() << ", on the cpu: "
                                            << expected.defined());
  if (!expected.defined()) return;
  CHECK(got.device() == Device::cuda);
  REQUIRE_MESSAGE(got.dtype() == expected.dtype(),
                  "device dtype " << clustr::to_string(got.dtype()) << ", cpu "
                                  << clustr::to_string(expected.dtype()));
  REQUIRE_MESSAGE(got.shape() == expected.shape(),
                  "device shape " << clustr::to_string(got.shape()) << ", cpu "
                                  << clustr::to_string(expected.shape()));
  if (expected.dtype() == DType::i32)
    check_ints(got.to_int_vector(), expected.to_int_vector());
  else if (tol.relative)
    CHECK_CLOSE(got.to_vector(), expected.to_vector(), tol.atol, tol.rtol);
  else
    check_ulps(got.to_vector(), expected.to_vector(), tol.ulps);
}

// t on device d; an undefined tensor (an absent optional input) stays undefined.
inline Tensor on(const Tensor& t, Device d) { return t.defined() ? t.to(d) : Tensor(); }

// What compare_devices computed, for checks of its own that a caller adds.
template <class R>
struct Compared {
  R cpu, device;
};

// An op on the CPU and on the device, in the manner of ggml's test-backend-ops: op(inputs)
// computed from CPU tensors and then from their device copies (undefined inputs stay undefined;
// the copies are made before op first runs, so an op may write to a clone of its inputs); the
// device's result must live on the device, have the CPU result's dtype and shape and be within
// max_ulps of it everywhere (0: bit for bit), or within the Tolerance given. One line per case:
//   compare_devices([&](const Inputs& x) { return clustr::add(x[0], x[1]); }, {a, b}, 0);
using Inputs = std::vector<Tensor>;
template <class Op>
Compared<Tensor> compare_devices(Op op, const Inputs& inputs, const Tolerance& tol) {
  Inputs device;
  for (const Tensor& t : inputs) device.push_back(on(t, Device::cuda));
  Tensor expected = op(inputs), got = op(device);
  REQUIRE(expected.defined());
  check_output(got, expected, tol);
  return {expected, got};
}

// One output of an op with several, and how its device value must agree with the cpu's.
struct Output {
  const char* name;
  Tolerance tol;
};

// The same for an op that returns several tensors (a forward's outputs, a backward's
// gradients), in the order of `outputs`: each compared with its own tolerance, the message
// naming it. An output may be undefined (a gradient not asked for), on both devices alike.
//   compare_devices([&](const Inputs& x) { const auto g = f_backward(x[0], x[1]);
//                                          return Inputs{g.dx, g.dw}; },
//                   {dy, x}, {{"dx", 0}, {"dw", Tolerance::close(1e-6, 1e-6)}});
template <class Op>
Compared<Inputs> compare_devices(Op op, const Inputs& inputs, const std::vector<Output>& outputs) {
  Inputs device;
  for (const Tensor& t : inputs) device.push_back(on(t, Device::cuda));
  Inputs expected = op(inputs), got = op(device);
  REQUIRE(expected.size() == outputs.size());
  REQUIRE(got.size() == outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    INFO("output " << std::string(outputs[i].name));
    check_output(got[i], expected[i], outputs[i].tol);
  }
  return {expected, got};
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
