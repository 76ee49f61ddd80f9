// CPU kernels of the shape ops (broadcast_to, sum_to, slice, slice_add_, concat): raw pointers,
// no validation (the front doors in core/ops_shape.cpp did it), OpenMP inside. Every output is
// overwritten unless the comment says it is accumulated (+=). Copies move 4-byte words, so the
// same kernel serves f32 and i32.
//
// The axis ops view a tensor around `axis` as (outer, len, inner):
//   outer = prod(shape[:axis]), len = shape[axis], inner = prod(shape[axis+1:]).
#pragma once

#include <cstdint>

namespace clustr::cpu {

// out[idx] = x[idx . x_strides] over every index idx of out_shape (rank dims, row-major). A
// stride of 0 repeats x along that axis.
void broadcast_to(const uint32_t* x, const int64_t* x_strides, int rank, const int64_t* out_shape,
                  uint32_t* out);

// y = x summed over every axis a with keep[a] == 0; x (x_shape, rank dims), y (x_shape with the
// summed axes set to 1). Every y element is summed in a fixed order (double accumulation within
// each run of adjacent summed axes, rounded to float between runs), so the result does not
// depend on the thread count.
void sum_to(const float* x, int rank, const int64_t* x_shape, const uint8_t* keep, float* y);

// x (outer, len, inner) -> y (outer, length, inner) = x[:, start:start+length, :].
void slice(const uint32_t* x, int64_t outer, int64_t len, int64_t inner, int64_t start,
           int64_t length, uint32_t* y);

// dst (outer, len, inner)[:, start:start+length, :] += src (outer, length, inner) (accumulated).
void slice_add(float* dst, int64_t outer, int64_t len, int64_t inner, int64_t start,
               const float* src, int64_t length);

// y (outer, sum(lens), inner) = the n inputs xs[k] (outer, lens[k], inner) joined along the
// middle axis.
void concat(int n, const uint32_t* const* xs, const int64_t* lens, int64_t outer, int64_t inner,
            uint32_t* y);

// The inverse: ys[k] (outer, lens[k], inner) = x's pieces along the middle axis, for each
// non-null ys[k].
void split(const uint32_t* x, int64_t outer, int64_t inner, int n, const int64_t* lens,
           uint32_t* const* ys);

}  // namespace clustr::cpu
