// Front doors for matrix products: shape/device checks, then cpu:: or cuda:: GEMM, in f32 or
// with bf16 operands (core/precision.h).
#include "core/cpu/gemm.h"
#include "core/cpu/gemm_bf16.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/ops_check.h"

namespace clustr {

namespace {

// op(X) of a matrix or a batch of matrices: (rows, cols) after the optional transpose.
struct MatView {
  int64_t batch, rows, cols, ld, stride;
};

MatView view(const Tensor& x, bool trans) {
  int r = x.rank();
  int64_t stored_rows = x.size(r - 2), stored_cols = x.size(r - 1);
  MatView v;
  v.batch = r == 3 ? x.size(0) : 1;
  v.rows = trans ? stored_cols : stored_rows;
  v.cols = trans ? stored_rows : stored_cols;
  v.ld = stored_cols;
  v.stride = stored_rows * stored_cols;
  return v;
}

const char* t_suffix(bool t) { return t ? "^T" : ""; }

cpu::Operand operand_of(const Tensor& t) {
  return t.dtype() == DType::bf16 ? cpu::Operand::bf16 : cpu::Operand::f32;
}

// The bf16 elements of a device operand: its own, or a rounded copy (kept in `copy`).
const uint16_t* device_bf16(const Tensor& t, Tensor& copy) {
  if (t.dtype() == DType::bf16) return t.bf16();
  copy = t.astype(DType::bf16);
  return copy.bf16();
}

// The product with bf16 operands (gemm's checks done; a, b, c as gemm computed them).
void gemm_bf16(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B,
               float beta, Tensor& C, const MatView& a, const MatView& b, const MatView& c) {
  if (C.device() == Device::cuda) {
    Tensor a_copy, b_copy;
    const uint16_t* ah = device_bf16(A, a_copy);
    const uint16_t* bh = device_bf16(B, b_copy);
    if (A.rank() == 2)
      return cuda::gemm_bf16(trans_a, trans_b, a.rows, b.cols, a.cols, alpha, ah, a.ld, bh, b.ld,
                             beta, C.f32(), c.ld);
    return cuda::gemm_bf16_strided_batched(trans_a, trans_b, a.rows, b.cols, a.cols, alpha, ah,
                                           a.ld, a.stride, bh, b.ld, b.stride, beta, C.f32(),
                                           c.ld, c.stride, a.batch);
  }
  if (A.rank() == 2)
    return cpu::gemm_bf16_call({trans_a, trans_b, a.rows, b.cols, a.cols, alpha, A.raw(),
                                operand_of(A), a.ld, B.raw(), operand_of(B), b.ld, beta, C.f32(),
                                c.ld, cpu::GemmEpilogue{}, nullptr, nullptr});
  cpu::gemm_bf16_strided_batched(trans_a, trans_b, a.rows, b.cols, a.cols, alpha, A.raw(),
                                 operand_of(A), a.ld, a.stride, B.raw(), operand_of(B), b.ld,
                                 b.stride, beta, C.f32(), c.ld, c.stride, a.batch);
}

}  // namespace

void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta,
          Tensor& C, Precision precision) {
  detail::check_product_operand("gemm", "A", A);
  detail::check_product_operand("gemm", "B", B);
  detail::check_f32("gemm", "C", C);
  CLUSTR_CHECK((A.rank() == 2 || A.rank() == 3) && A.rank() == B.rank() && A.rank() == C.rank(),
               "gemm: expected A, B, C all of rank 2 (matrices) or all of rank 3 (batches), got A ",
               to_string(A.shape()), ", B ", to_string(B.shape()), ", C ", to_string(C.shape()));
  CLUSTR_CHECK(A.device() == B.device() && A.device() == C.device(),
               "gemm: tensors on different devices: A ", describe(A), ", B ", describe(B), ", C ",
               describe(C));
  MatView a = view(A, trans_a), b = view(B, trans_b), c = view(C, false);
  CLUSTR_CHECK(a.cols == b.rows, "gemm: inner sizes differ: A", t_suffix(trans_a), " is ",
               a.rows, " x ", a.cols, " (A ", to_string(A.shape()), ") but B", t_suffix(trans_b),
               " is ", b.rows, " x ", b.cols, " (B ", to_string(B.shape()), ")");
  CLUSTR_CHECK(a.batch == b.batch, "gemm: batch sizes differ: A ", to_string(A.shape()), ", B ",
               to_string(B.shape()));
  Shape expected = A.rank() == 2 ? Shape{a.rows, b.cols} : Shape{a.batch, a.rows, b.cols};
  CLUSTR_CHECK(C.shape() == expected, "gemm: C is ", to_string(C.shape()), " but A",
               t_suffix(trans_a), " ", to_string(A.shape()), " times B", t_suffix(trans_b), " ",
               to_string(B.shape()), " is ", to_string(expected));
  if (precision == Precision::bf16 || A.dtype() == DType::bf16 || B.dtype() == DType::bf16)
    return gemm_bf16(trans_a, trans_b, alpha, A, B, beta, C, a, b, c);
  const bool cuda = C.device() == Device::cuda;
  if (A.rank() == 2) {
    auto fn = cuda ? cuda::gemm : cpu::gemm;
    fn(trans_a, trans_b, a.rows, b.cols, a.cols, alpha, A.f32(), a.ld, B.f32(), b.ld, beta,
       C.f32(), c.ld);
    return;
  }
  auto fn = cuda ? cuda::gemm_strided_batched : cpu::gemm_strided_batched;
  fn(trans_a, trans_b, a.rows, b.cols, a.cols, alpha, A.f32(), a.ld, a.stride, B.f32(), b.ld,
     b.stride, beta, C.f32(), c.ld, c.stride, a.batch);
}

Tensor matmul(const Tensor& A, const Tensor& B, bool trans_a, bool trans_b,
              Precision precision) {
  CLUSTR_CHECK(A.defined() && B.defined(), "matmul: use of an undefined tensor");
  CLUSTR_CHECK((A.rank() == 2 || A.rank() == 3) && A.rank() == B.rank(),
               "matmul: expected two matrices or two batches of matrices, got A ",
               to_string(A.shape()), " and B ", to_string(B.shape()));
  MatView a = view(A, trans_a), b = view(B, trans_b);
  Shape out = A.rank() == 2 ? Shape{a.rows, b.cols} : Shape{a.batch, a.rows, b.cols};
  Tensor C = Tensor::empty(out, DType::f32, A.device());
  gemm(trans_a, trans_b, 1.0f, A, B, 0.0f, C, precision);
  return C;
}

}  // namespace clustr
