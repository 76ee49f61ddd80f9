// Shape utilities and the error messages built on them: every message names the op and the
// shapes or values involved.
#include "check.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/shape.h"

using namespace clustr;

TEST_CASE("shape helpers") {
  CHECK(numel(Shape{}) == 1);
  CHECK(numel(Shape{2, 0, 3}) == 0);
  CHECK(to_string(Shape{}) == "()");
  CHECK(to_string(Shape{4}) == "(4,)");
  CHECK(to_string(Shape{2, 3}) == "(2, 3)");
  CHECK(contiguous_strides({2, 3, 4}) == std::vector<int64_t>{12, 4, 1});
  CHECK(normalize_axis(-1, 3, "op") == 2);
  CHECK(broadcast_shapes({2, 1, 4}, {3, 1}, "op") == Shape{2, 3, 4});
  CHECK(broadcast_shapes({}, {5}, "op") == Shape{5});
  CHECK(broadcast_shapes({1}, {0}, "op") == Shape{0});
}

TEST_CASE("shape errors name the op, the shapes and the axis") {
  CHECK_THROWS_WITH_AS(broadcast_shapes({2, 3}, {4, 3}, "add"),
                       "add: shapes (2, 3) and (4, 3) do not broadcast (axis 0 of the result: 2 vs 4)",
                       Error);
  CHECK_THROWS_WITH_AS(normalize_axis(3, 3, "sum"),
                       "sum: axis 3 is out of range for a tensor of rank 3 (expected -3 <= axis < 3)",
                       Error);
}

TEST_CASE("front doors report mismatched shapes with both shapes in the message") {
  Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3, 2});
  CHECK_THROWS_WITH_AS(add(a, b), doctest::Contains("(2, 3) and (3, 2)"), Error);
  CHECK_THROWS_WITH_AS(mul(a, b), doctest::Contains("mul"), Error);
  CHECK_THROWS_WITH_AS(matmul(a, a), doctest::Contains("gemm: inner sizes differ: A is 2 x 3"), Error);
  Tensor idx = Tensor::from_int_vector({0, 5}, {2});
  CHECK_THROWS_WITH_AS(gather_rows(a, idx), doctest::Contains("5"), Error);
}
