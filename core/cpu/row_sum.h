// The CPU kernels' row sums: sum over j < n of term(j) in double, with kLanes partial sums
// combined in a fixed order, so a row's sum is the same whichever thread computes it and
// whichever instruction set the caller was compiled for (it is always inlined into the caller,
// so a target_clones version vectorises it for its own ISA).
#pragma once

#include <cstdint>

namespace clustr::cpu {

constexpr int kRowSumLanes = 8;  // independent partial sums (ILP, SIMD)

template <class Term>
__attribute__((always_inline)) inline double row_sum(int64_t n, Term term) {
  constexpr int L = kRowSumLanes;
  double acc[L] = {};
  int64_t j = 0;
  for (; j + L <= n; j += L)
    for (int k = 0; k < L; ++k) acc[k] += term(j + k);
  for (int k = 0; j < n; ++j, ++k) acc[k] += term(j);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace clustr::cpu
