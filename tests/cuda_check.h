// Helpers shared by the CUDA test files (tests/test_cuda*.cpp): comparisons in ulps of a
// device result with its CPU twin.
//
// A kernel that computes the same float formula as the CPU on one element must agree bit for
// bit in emulation; on a GPU nvcc fuses a * b + c into one rounding and CUDA's libm differs from
// glibc's, so callers allow a few ulp there.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <vector>

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

}  // namespace clustr::test
