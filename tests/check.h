// Helpers shared by the test suites.
//
// CHECK_CLOSE compares element-wise: |actual - expected| <= atol + rtol * |expected|. On failure
// the message gives the tolerance, the number of bad elements, and the worst one with its
// index, so a failing run says by how much and where.
//
// CHECK_ERROR checks that an expression throws clustr::Error whose message contains given
// parts; random_values / random_tensor make reproducible inputs; ThreadCount sets the OpenMP
// thread count for one scope.
#pragma once

#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "autograd/gradcheck.h"
#include "core/tensor.h"

namespace clustr::test {

// n values uniform in [lo, hi), the same for the same seed (std::mt19937).
inline std::vector<float> random_values(int64_t n, uint32_t seed, float lo = -2.0f,
                                        float hi = 2.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// A cpu f32 tensor of shape s holding random_values(numel(s), seed, lo, hi).
inline Tensor random_tensor(const Shape& s, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  return Tensor::from_vector(random_values(numel(s), seed, lo, hi), s);
}

// A cpu i32 vector tensor of the values v.
inline Tensor ints(const std::vector<int32_t>& v) {
  return Tensor::from_int_vector(v, {static_cast<int64_t>(v.size())});
}

// The what() of the clustr::Error that f throws; "" when it throws none.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

inline bool contains_all(const std::string& s, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    if (s.find(p) == std::string::npos) return false;
  return true;
}

// Sets the OpenMP thread count for one scope.
struct ThreadCount {
  int saved = num_threads();
  explicit ThreadCount(int n) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved); }
};

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

// CHECK_ERROR(expr, "part", ...): expr throws clustr::Error and what() contains every part.
#define CHECK_ERROR(expr, ...)                                                                 \
  do {                                                                                         \
    const std::string clustr_msg_ = ::clustr::test::error_of([&] { (void)(expr); });           \
    CHECK_MESSAGE(                                                                             \
        (!clustr_msg_.empty() && ::clustr::test::contains_all(clustr_msg_, {__VA_ARGS__})),    \
        "error message: \"" << clustr_msg_ << "\"");                                           \
  } while (0)

namespace clustr::test {

using GradFn = std::function<Variable(const std::vector<Variable>&)>;

// gradcheck(f, inputs, requires_grad) with the default tolerances (autograd/gradcheck.h)
// passes; on failure the message names the case and the worst element.
inline void check_grad(const std::string& what, const GradFn& f, const std::vector<Tensor>& inputs,
                       const std::vector<bool>& requires_grad = {}) {
  const GradcheckResult r = gradcheck(f, inputs, requires_grad);
  INFO(what);
  CHECK_MESSAGE(r.ok, r.message);
}

}  // namespace clustr::test

namespace clustr::test {

// Writes `text` to `path` as it is (binary, truncating).
inline void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  REQUIRE(f.good());
}

// Two tones (440 and 1230 Hz, 0.3 each) at `rate` Hz, n samples.
inline std::vector<float> tones(int rate, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double t = double(i) / rate;
    x[size_t(i)] = float(0.3 * std::sin(2 * M_PI * 440 * t) + 0.3 * std::sin(2 * M_PI * 1230 * t));
  }
  return x;
}

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("clustr_test." + std::to_string(::getpid()) + "." + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::vector<std::string> list() const {  // file names, sorted
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace clustr::test
