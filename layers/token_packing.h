// The valid tokens of a padded batch, packed: a batch of B sequences padded to N positions
// (sequence b valid at n < lengths[b], padding after it) holds T = sum(lengths) tokens, and the
// position-wise layers of an encoder (projections, feed-forward block, layer norms, residual
// dropout) compute the same value for a token whichever other rows share its tensor. Run on the
// T packed rows rather than the B N padded ones, they skip the padding's work: for pairs of
// sentences padded to the longest in a batch of 32, half of the rows (docs/PERFORMANCE.md).
// Only the attention needs the (B, N) layout: it unpacks its inputs, with zero rows at padding,
// and packs its output again.
//
// Both directions are gathers of rows (the embedding op): unpacking gathers from the packed
// rows with one zero row appended, which every padded position reads. Gradients flow back as
// scatter-adds, so a padded position's gradient goes nowhere.
#pragma once

#include <cstdint>
#include <vector>

#include "autograd/variable.h"
#include "core/tensor.h"

namespace clustr {

class TokenPacking {
 public:
  // lengths[b] in [0, N] for each of the B sequences; the indices live on `device`.
  TokenPacking(const std::vector<int32_t>& lengths, int64_t N, Device device);

  int64_t batch() const { return B_; }
  int64_t positions() const { return N_; }
  int64_t tokens() const { return T_; }

  // x (B, N, C) -> (T, C): the valid rows in order (b, then n).
  Variable pack(const Variable& x) const;
  // y (T, C) -> (B, N, C), zeros at the padded positions.
  Variable unpack(const Variable& y) const;

 private:
  int64_t B_ = 0, N_ = 0, T_ = 0;
  Tensor pack_index_;    // i32 (T): b N + n of each valid token
  Tensor unpack_index_;  // i32 (B, N): the token's packed row, or T (the zero row) at padding
};

}  // namespace clustr
