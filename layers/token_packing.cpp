// Packing the valid tokens of a padded batch (see token_packing.h).
#include "layers/token_packing.h"

#include "autograd/ops.h"
#include "core/error.h"

namespace clustr {

TokenPacking::TokenPacking(const std::vector<int32_t>& lengths, int64_t N, Device device)
    : B_(static_cast<int64_t>(lengths.size())), N_(N) {
  CLUSTR_CHECK(N >= 0 && N <= INT32_MAX / std::max<int64_t>(B_, 1), "TokenPacking: ", B_,
               " sequences of ", N, " positions do not fit i32 row indices");
  std::vector<int32_t> pack, unpack(static_cast<size_t>(B_ * N), 0);
  for (int64_t b = 0; b < B_; ++b) {
    CLUSTR_CHECK(lengths[b] >= 0 && lengths[b] <= N, "TokenPacking: sequence ", b,
                 " has length ", lengths[b], ", expected one in [0, ", N, "]");
    for (int64_t n = 0; n < lengths[b]; ++n) {
      unpack[b * N + n] = static_cast<int32_t>(pack.size());
      pack.push_back(static_cast<int32_t>(b * N + n));
    }
  }
  T_ = static_cast<int64_t>(pack.size());
  for (int64_t b = 0; b < B_; ++b)
    for (int64_t n = lengths[b]; n < N; ++n) unpack[b * N + n] = static_cast<int32_t>(T_);
  pack_index_ = Tensor::from_int_vector(pack, {T_}).to(device);
  unpack_index_ = Tensor::from_int_vector(unpack, {B_, N}).to(device);
}

Variable TokenPacking::pack(const Variable& x) const {
  CLUSTR_CHECK(x.defined() && x.rank() == 3 && x.size(0) == B_ && x.size(1) == N_,
               "TokenPacking::pack: expected x (", B_, ", ", N_, ", C), got ",
               x.defined() ? describe(x.data()) : std::string("an undefined Variable"));
  return embedding(reshape(x, {B_ * N_, x.size(2)}), pack_index_);
}

Variable TokenPacking::unpack(const Variable& y) const {
  CLUSTR_CHECK(y.defined() && y.rank() == 2 && y.size(0) == T_, "TokenPacking::unpack: expected y (",
               T_, ", C), got ",
               y.defined() ? describe(y.data()) : std::string("an undefined Variable"));
  const Tensor zero_row =
      Tensor::zeros({1, y.size(1)}, y.data().dtype(), y.data().device());
  return embedding(concat({y, Variable(zero_row)}, 0), unpack_index_);
}

}  // namespace clustr
