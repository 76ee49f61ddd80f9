// Shape: the sizes of a tensor's axes, outermost first (row-major). Axis arguments may be
// negative and count from the end, as in PyTorch.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace clustr {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s);
std::string to_string(const Shape& s);  // "(2, 3, 4)"

// Maps a possibly negative axis to [0, rank); throws naming `op` when out of range.
int normalize_axis(int axis, int rank, const char* op);

// Row-major strides in elements: strides[i] = prod(shape[i+1:]).
std::vector<int64_t> contiguous_strides(const Shape& s);

// Shape that a and b broadcast to (NumPy rules: align at the right, sizes equal or 1).
// Throws naming `op` and both shapes when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace clustr
