// Comparison helpers for tests: |actual - expected| <= atol + rtol * |expected| element-wise.
// On failure the message gives the tolerance, the number of bad elements, and the worst one
// with its index, so a failing run says by how much and where.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace clustr::test {

struct CloseReport {
  bool ok = true;
  std::string message;
};

inline CloseReport compare_close(const std::vector<float>& actual,
                                 const std::vector<float>& expected, double atol, double rtol) {
  CloseReport r;
  std::ostringstream os;
  if (actual.size() != expected.size()) {
    r.ok = false;
    os << "size mismatch: actual " << actual.size() << " vs expected " << expected.size();
    r.message = os.str();
    return r;
  }
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    double a = actual[i], e = expected[i];
    bool same_special = (std::isnan(a) && std::isnan(e)) || (std::isinf(a) && a == e);
    if (same_special) continue;
    double tol = atol + rtol * std::fabs(e);
    double err = std::fabs(a - e);
    if (!(err <= tol)) {  // also catches NaN
      ++bad;
      double excess = std::isnan(err) ? INFINITY : err / tol;
      if (worst < 0 || excess > worst_excess) worst = static_cast<int64_t>(i), worst_excess = excess;
    }
  }
  if (bad) {
    r.ok = false;
    os.precision(9);
    os << bad << " of " << actual.size() << " elements outside atol=" << atol << " rtol=" << rtol
       << "; worst at index " << worst << ": actual " << actual[worst] << ", expected "
       << expected[worst] << ", |diff| " << std::fabs(double(actual[worst]) - expected[worst]);
    r.message = os.str();
  }
  return r;
}

}  // namespace clustr::test

// CHECK_CLOSE(actual_vector, expected_vector, atol, rtol)
#define CHECK_CLOSE(actual, expected, atol, rtol)                                              \
  do {                                                                                         \
    auto clustr_report_ = ::clustr::test::compare_close((actual), (expected), (atol), (rtol)); \
    CHECK_MESSAGE(clustr_report_.ok, clustr_report_.message);                                  \
  } while (0)
