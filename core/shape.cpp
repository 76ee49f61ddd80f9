#include "core/shape.h"

#include <algorithm>

#include "core/error.h"

namespace clustr {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string to_string(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  if (s.size() == 1) out += ",";
  return out + ")";
}

int normalize_axis(int axis, int rank, const char* op) {
  int a = axis < 0 ? axis + rank : axis;
  CLUSTR_CHECK(a >= 0 && a < rank, op, ": axis ", axis, " is out of range for a tensor of rank ",
               rank, " (expected ", -rank, " <= axis < ", rank, ")");
  return a;
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    CLUSTR_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", to_string(a), " and ",
                 to_string(b), " do not broadcast (axis ", i, " of the result: ", da, " vs ", db,
                 ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace clustr
