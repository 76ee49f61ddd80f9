// Front doors of the layout ops: permute / transpose (any rank, f32 or i32) and the embedding
// row ops gather_rows / scatter_add_rows_. Kernels in core/cpu/layout.cpp and
// core/cuda/layout.cu.
//
// Shapes: table (V, D): V rows (vocabulary), D columns (model width); index i32 of any shape.
#include <string>
#include <vector>

#include "core/cpu/kernels.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops_check.h"

namespace clustr {

namespace {

std::string perm_string(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// "index[1, 2]": the position of flat element i in a tensor of shape s.
std::string position(const Shape& s, int64_t i) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  std::string out = "index[";
  for (size_t d = 0; d < idx.size(); ++d) out += (d ? ", " : "") + std::to_string(idx[d]);
  return out + "]";
}

bool on_cuda(const Tensor& t) { return t.device() == Device::cuda; }

// Every index in [0, V); otherwise names the first bad one, where it is and what it is. The
// values are read on the host: from a copy when the index is on the device (n numbers, small
// next to the n x D rows they select), or, when the device's checks are deferred (cuda.h's
// DeferredChecks), by a kernel that records the first bad one (the kernels then keep within
// the table).
void check_indices(const char* op, const Tensor& table, const Tensor& index) {
  const int64_t V = table.shape()[0];
  if (on_cuda(index) && cuda::deferring_checks()) {
    CLUSTR_CHECK(V <= INT32_MAX, op, ": table ", describe(table), " has more rows than an i32 "
                 "index can name");
    cuda::check_range_on_device(op, "index", index.i32(), index.numel(), 0,
                                static_cast<int32_t>(V));
    return;
  }
  std::vector<int32_t> copy;
  const int32_t* p = detail::host_i32(index, copy);
  for (int64_t i = 0; i < index.numel(); ++i)
    CLUSTR_CHECK(p[i] >= 0 && p[i] < V, op, ": ", position(index.shape(), i), " = ", p[i],
                 " is outside [0, ", V, ") for table ", describe(table), " (index ",
                 describe(index), ")");
}

// table (V, D) f32, index i32 (any shape), both on one device.
void check_rows_op(const char* op, const Tensor& table, const Tensor& index) {
  detail::check_dtype(op, "table", table, DType::f32);
  detail::check_dtype(op, "index", index, DType::i32);
  CLUSTR_CHECK(table.rank() == 2, op, ": expected table of rank 2 (V, D), got ", describe(table));
  detail::check_same_device(op, table, index);
}

// x (s) -> (s[perm[0]], ..., s[perm[r-1]]); `op` names the caller in errors.
Tensor permute_as(const char* op, const Tensor& x, const std::vector<int>& perm) {
  detail::check_defined(op, "x", x);
  // The kernels move 4-byte words (so not bf16's 2-byte ones).
  CLUSTR_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::i32, op,
               ": expected an f32 or i32 tensor, got ", describe(x), detail::dtype_hint(x));
  const int r = x.rank();
  CLUSTR_CHECK(static_cast<int>(perm.size()) == r, op, ": perm ", perm_string(perm), " has ",
               perm.size(), " entries but x ", describe(x), " has rank ", r);
  std::vector<int> p(perm.size());
  std::vector<bool> seen(perm.size(), false);
  for (int i = 0; i < r; ++i) {
    const int a = perm[i] < 0 ? perm[i] + r : perm[i];
    CLUSTR_CHECK(a >= 0 && a < r && !seen[a], op, ": perm ", perm_string(perm),
                 " is not a permutation of the axes of ", describe(x), " (expected each of 0..",
                 r - 1, " exactly once)");
    seen[a] = true;
    p[i] = a;
  }
  Shape out_shape(perm.size());
  for (int i = 0; i < r; ++i) out_shape[i] = x.shape()[p[i]];
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  auto fn = on_cuda(x) ? cuda::permute : cpu::permute;
  if (y.numel() > 0)
    fn(static_cast<const uint32_t*>(x.raw()), static_cast<uint32_t*>(y.raw()), r,
       x.shape().data(), p.data());
  return y;
}

}  // namespace

Tensor permute(const Tensor& x, const std::vector<int>& perm) {
  return permute_as("permute", x, perm);
}

// x (..., a0, ..., a1, ...) -> (..., a1, ..., a0, ...).
Tensor transpose(const Tensor& x, int axis0, int axis1) {
  detail::check_defined("transpose", "x", x);
  const int a0 = normalize_axis(axis0, x.rank(), "transpose");
  const int a1 = normalize_axis(axis1, x.rank(), "transpose");
  std::vector<int> perm(static_cast<size_t>(x.rank()));
  for (int i = 0; i < x.rank(); ++i) perm[i] = i;
  std::swap(perm[a0], perm[a1]);
  return permute_as("transpose", x, perm);
}

// table (V, D), index (..., P), added (P, D) or undefined -> (..., P, D).
Tensor gather_rows(const Tensor& table, const Tensor& index, const Tensor& added) {
  const char* op = "gather_rows";
  check_rows_op(op, table, index);
  const int64_t D = table.shape()[1];
  int64_t P = 0;  // added's rows
  if (added.defined()) {
    detail::check_dtype(op, "added", added, DType::f32);
    detail::check_same_device(op, table, added);
    CLUSTR_CHECK(index.rank() >= 1 && added.shape() == (Shape{index.shape().back(), D}), op,
                 ": expected added of shape (P, D) = (",
                 index.rank() >= 1 ? index.shape().back() : 0, ", ", D,
                 ") for index ", describe(index), " and table ", describe(table), ", got ",
                 describe(added));
    P = added.size(0);
  }
  check_indices(op, table, index);
  Shape out_shape = index.shape();
  out_shape.push_back(D);
  Tensor out = Tensor::empty(out_shape, DType::f32, table.device());
  if (out.numel() == 0) return out;
  const float* add = added.defined() ? added.f32() : nullptr;
  if (on_cuda(table))
    cuda::gather_rows(table.f32(), table.shape()[0], D, index.i32(), index.numel(), add, P,
                      out.f32());
  else
    cpu::gather_rows(table.f32(), D, index.i32(), index.numel(), add, P, out.f32());
  return out;
}

namespace {

// The checks of a scatter of src (..., D) by index (...) into table (V, D).
void check_scatter(const char* op, const Tensor& table, const Tensor& index, const Tensor& src) {
  detail::check_dtype(op, "src", src, DType::f32);
  check_rows_op(op, table, index);
  detail::check_same_device(op, table, src);
  Shape want = index.shape();
  want.push_back(table.shape()[1]);
  CLUSTR_CHECK(src.shape() == want, op, ": expected src of shape ", to_string(want),
               " (index shape ", to_string(index.shape()), " then D of table ", describe(table),
               "), got ", describe(src));
  check_indices(op, table, index);
}

}  // namespace

// table (V, D) += src (..., D) scattered by index (...); repeated indices accumulate.
void scatter_add_rows_(Tensor& table, const Tensor& index, const Tensor& src) {
  check_scatter("scatter_add_rows_", table, index, src);
  auto fn = on_cuda(table) ? cuda::scatter_add_rows : cpu::scatter_add_rows;
  if (src.numel() > 0)
    fn(table.f32(), table.shape()[0], table.shape()[1], index.i32(), index.numel(), src.f32());
}

Tensor scatter_sum_rows(int64_t V, const Tensor& index, const Tensor& src) {
  const char* op = "scatter_sum_rows";
  CLUSTR_CHECK(V >= 0 && src.defined() && src.rank() >= 1, op, ": expected V >= 0 and src ",
               "(..., D), got V = ", V, " and src ",
               src.defined() ? describe(src) : std::string("undefined"));
  const int64_t D = src.shape().back();
  // The device writes every row (0 where no index points); the cpu adds into zeros.
  Tensor table = on_cuda(src) ? Tensor::empty({V, D}, DType::f32, src.device())
                              : Tensor::zeros({V, D});
  check_scatter(op, table, index, src);
  if (on_cuda(src))
    cuda::scatter_sum_rows(table.f32(), V, D, index.i32(), index.numel(), src.f32());
  else if (src.numel() > 0)
    cpu::scatter_add_rows(table.f32(), V, D, index.i32(), index.numel(), src.f32());
  return table;
}

}  // namespace clustr
