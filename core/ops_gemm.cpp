// Front doors for matrix products: shape/device checks, then cpu:: or cuda:: GEMM.
#include "core/cpu/gemm.h"
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

}  // namespace

void gemm(bool trans_a, bool trans_b, float alpha, const Tensor& A, const Tensor& B, float beta,
          Tensor& C) {
  detail::check_f32("gemm", "A", A);
  detail::check_f32("gemm", "B", B);
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

Tensor matmul(const Tensor& A, const Tensor& B, bool trans_a, bool trans_b) {
  CLUSTR_CHECK(A.defined() && B.defined(), "matmul: use of an undefined tensor");
  CLUSTR_CHECK((A.rank() == 2 || A.rank() == 3) && A.rank() == B.rank(),
               "matmul: expected two matrices or two batches of matrices, got A ",
               to_string(A.shape()), " and B ", to_string(B.shape()));
  MatView a = view(A, trans_a), b = view(B, trans_b);
  Shape out = A.rank() == 2 ? Shape{a.rows, b.cols} : Shape{a.batch, a.rows, b.cols};
  Tensor C = Tensor::empty(out, DType::f32, A.device());
  gemm(trans_a, trans_b, 1.0f, A, B, 0.0f, C);
  return C;
}

}  // namespace clustr
