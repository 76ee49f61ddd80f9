// CLUSTR_ROW_CLONES marks a hot loop function to be compiled for AVX-512, AVX2 with FMA
// (x86-64-v3) and plain x86-64, the loader picking one for this CPU (GCC's target_clones: an
// ifunc); _NO_CONTRACT also keeps multiply-adds unfused in every clone, so that all of them
// round alike (the fused ones written as such, math::FusedMulAdd, are single instructions in
// the first two clones and a libm call in the third, the same bits everywhere). Where target_clones
// does not exist, or under ThreadSanitizer (the loader runs ifunc resolvers before the
// sanitizer's runtime is up, and an instrumented resolver crashes there), the function is
// compiled once, for the baseline. Below the macros: helpers that such loops share (sums in
// lanes, dot products, the row max), inline so that each clone compiles them for its own
// instruction set.
#pragma once

#if defined(__x86_64__) && defined(__ELF__) && defined(__has_attribute) && \
    !defined(__SANITIZE_THREAD__)
#if __has_attribute(target_clones)
#define CLUSTR_ROW_CLONES \
  __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#define CLUSTR_ROW_CLONES_NO_CONTRACT                                        \
  __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default"), \
                 optimize("fp-contract=off")))
#endif
#endif
#ifndef CLUSTR_ROW_CLONES
#define CLUSTR_ROW_CLONES
#define CLUSTR_ROW_CLONES_NO_CONTRACT
#endif

#include <cstdint>

#include "core/math.h"

namespace clustr::cpu {

// Independent partial sums in the row loops: element c goes to lane c % kLanes, so that a loop
// compiled for vectors runs on them (a float sum in one chain would stay scalar); the lanes are
// then added as a tree (pairs of halves): four dependent additions rather than a chain of
// sixteen, which short rows would otherwise wait on. The order depends on the length alone.
constexpr int kLanes = 16;

inline float lanes_sum(float* acc) {
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// x[0..n) . y[0..n) in lanes.
inline float dot_lanes(const float* x, const float* y, int64_t n) {
  float acc[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += x[c + k] * y[c + k];
  for (; c < n; ++c) acc[0] += x[c] * y[c];
  return lanes_sum(acc);
}

// max(x[0..n)), n >= 1, through integer keys that order like the floats (the magnitude bits
// of negative floats flipped): an integer max reduction vectorises, a float one does not
// (GCC will not reorder a float max that must honour NaN). A NaN maps beyond +-inf, and either
// way the exp pass of a softmax turns it into a NaN output.
inline int32_t order_key(int32_t bits) { return bits ^ ((bits >> 31) & 0x7fffffff); }  // involution
inline float row_max(const float* x, int64_t n) {
  int32_t key = order_key(static_cast<int32_t>(math::bits_of(x[0])));
  for (int64_t c = 1; c < n; ++c) {
    const int32_t k = order_key(static_cast<int32_t>(math::bits_of(x[c])));
    key = k > key ? k : key;
  }
  return math::float_from_bits(static_cast<uint32_t>(order_key(key)));
}

}  // namespace clustr::cpu
