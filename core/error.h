// Errors that a user can cause (bad shapes, dtypes, devices, files) are reported by throwing
// clustr::Error with a message that names the op and the expected and actual values. The checks
// stay on in release builds; nothing on a user-reachable path uses assert() or abort().
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace clustr {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
// Concatenates any streamable values into one message: cat("matmul: ", 3, " vs ", 4).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace clustr

// CLUSTR_CHECK(cond, "op: what was expected, got ", value, ...) throws clustr::Error when cond
// is false. The message parts are only formatted on failure.
#define CLUSTR_CHECK(cond, ...)                                          \
  do {                                                                   \
    if (!(cond)) throw ::clustr::Error(::clustr::detail::cat(__VA_ARGS__)); \
  } while (0)
