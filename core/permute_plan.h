// A permutation reduced to its essentials, shared by the permute kernels of both backends
// (core/cpu/layout.cpp, core/cuda/layout.cu): size-1 axes dropped, and input axes that stay
// adjacent and in order in the output merged into one (a (B, H, S, E) -> (B, S, H, E) permute
// becomes (B, H, S, E) with E kept as a contiguous block). Host code only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

namespace clustr::detail {

// shape: the simplified input's sizes; perm: output axis i reads simplified input axis perm[i].
struct PermutePlan {
  std::vector<int64_t> shape;
  std::vector<int> perm;
};

// in_shape (rank), perm (rank, a permutation of 0..rank-1) -> the simplified problem.
inline PermutePlan simplify_permute(int rank, const int64_t* in_shape, const int* perm) {
  // Renumber the input axes that are not size 1.
  std::vector<int> renum(static_cast<size_t>(rank), -1);
  int kept = 0;
  for (int a = 0; a < rank; ++a)
    if (in_shape[a] != 1) renum[a] = kept++;
  std::vector<int> p;
  std::vector<int64_t> s(static_cast<size_t>(kept));
  for (int a = 0; a < rank; ++a)
    if (renum[a] >= 0) s[renum[a]] = in_shape[a];
  for (int i = 0; i < rank; ++i)
    if (renum[perm[i]] >= 0) p.push_back(renum[perm[i]]);
  // Runs p[k], p[k]+1, ... in output order are groups; number the groups in input order.
  std::vector<int> first;       // first input axis of each group, in output order
  std::vector<int64_t> size;    // size of each group
  for (size_t k = 0; k < p.size();) {
    int start = p[k];
    int64_t n = s[start];
    size_t e = k + 1;
    while (e < p.size() && p[e] == p[e - 1] + 1) n *= s[p[e++]];
    first.push_back(start);
    size.push_back(n);
    k = e;
  }
  const size_t g = first.size();
  std::vector<int> by_input(g);
  std::iota(by_input.begin(), by_input.end(), 0);
  std::sort(by_input.begin(), by_input.end(), [&](int x, int y) { return first[x] < first[y]; });
  PermutePlan out;
  out.shape.resize(g);
  out.perm.resize(g);
  for (size_t in_pos = 0; in_pos < g; ++in_pos) {
    out.shape[in_pos] = size[by_input[in_pos]];
    out.perm[by_input[in_pos]] = static_cast<int>(in_pos);
  }
  return out;
}

}  // namespace clustr::detail
