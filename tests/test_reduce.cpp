// Reductions and softmax against plain double loops: every axis of a rank-3 tensor with and
// without keepdim, the strided (inner > 1) and long-row kernel paths, argmax ties, empty axes,
// masked (-inf) and huge softmax rows, thread-count independence, and the error messages.
#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "check.h"
#include "core/ops.h"

using namespace clustr;
using namespace clustr::test;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Reference reduction of x (outer, len, inner) over the middle axis, in double.
struct RefReduce {
  std::vector<float> sum, mean, max, min;
  std::vector<int32_t> argmax;
};

RefReduce ref_reduce(const std::vector<float>& x, int64_t outer, int64_t len, int64_t inner) {
  RefReduce r;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      double s = 0, mx = -INFINITY, mn = INFINITY;
      int32_t at = 0;
      for (int64_t l = 0; l < len; ++l) {
        const double v = x[(o * len + l) * inner + i];
        s += v;
        if (v > mx) mx = v, at = static_cast<int32_t>(l);
        mn = std::min(mn, v);
      }
      r.sum.push_back(static_cast<float>(s));
      r.mean.push_back(static_cast<float>(s / len));
      r.max.push_back(static_cast<float>(mx));
      r.min.push_back(static_cast<float>(mn));
      r.argmax.push_back(at);
    }
  }
  return r;
}

// Every reduction of x (shape) over every axis, both keepdims, against the reference.
void check_all_axes(const Shape& shape, uint32_t seed) {
  const std::vector<float> v = random_values(numel(shape), seed);
  const Tensor x = Tensor::from_vector(v, shape);
  const int r = static_cast<int>(shape.size());
  for (int axis = -r; axis < r; ++axis) {
    const int a = axis < 0 ? axis + r : axis;
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < a; ++i) outer *= shape[i];
    for (int i = a + 1; i < r; ++i) inner *= shape[i];
    const RefReduce want = ref_reduce(v, outer, shape[a], inner);
    for (bool keepdim : {false, true}) {
      Shape out_shape = shape;
      if (keepdim)
        out_shape[a] = 1;
      else
        out_shape.erase(out_shape.begin() + a);
      INFO("shape ", to_string(shape), " axis ", axis, " keepdim ", keepdim);
      const Tensor s = sum(x, axis, keepdim), m = mean(x, axis, keepdim);
      const Tensor mx = max(x, axis, keepdim), mn = reduce(ReduceOp::min, x, axis, keepdim);
      const Tensor am = argmax(x, axis, keepdim);
      for (const Tensor* t : {&s, &m, &mx, &mn, &am}) CHECK(t->shape() == out_shape);
      CHECK(am.dtype() == DType::i32);
      // Sums accumulate in double, so they are the reference rounded once (up to the order of
      // double additions); max, min and argmax are exact.
      CHECK_CLOSE(s.to_vector(), want.sum, 1e-6, 1e-6);
      CHECK_CLOSE(m.to_vector(), want.mean, 1e-6, 1e-6);
      CHECK_CLOSE(mx.to_vector(), want.max, 0.0, 0.0);
      CHECK_CLOSE(mn.to_vector(), want.min, 0.0, 0.0);
      CHECK(am.to_int_vector() == want.argmax);
    }
  }
}

// Softmax and log-softmax of rows (rows, cols) in double; masked rows give 0 / -inf.
void ref_softmax(const std::vector<float>& x, int64_t rows, int64_t cols, std::vector<float>* sm,
                 std::vector<float>* lsm) {
  sm->assign(x.size(), 0.0f);
  lsm->assign(x.size(), -kInf);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = &x[r * cols];
    double m = -INFINITY;
    for (int64_t j = 0; j < cols; ++j) m = std::max(m, double(xr[j]));
    if (m == -INFINITY) continue;
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(double(xr[j]) - m);
    for (int64_t j = 0; j < cols; ++j) {
      (*sm)[r * cols + j] = static_cast<float>(std::exp(double(xr[j]) - m) / s);
      (*lsm)[r * cols + j] = static_cast<float>(double(xr[j]) - m - std::log(s));
    }
  }
}

void check_softmax(const std::vector<float>& v, const Shape& shape) {
  const Tensor x = Tensor::from_vector(v, shape);
  std::vector<float> sm, lsm;
  ref_softmax(v, numel(shape) / shape.back(), shape.back(), &sm, &lsm);
  const Tensor y = softmax(x), ly = log_softmax(x);
  CHECK(y.shape() == shape);
  CHECK(ly.shape() == shape);
  CHECK_CLOSE(y.to_vector(), sm, 1e-7, 1e-6);
  CHECK_CLOSE(ly.to_vector(), lsm, 1e-6, 1e-6);
  auto nans = [](const std::vector<float>& a) {
    return std::count_if(a.begin(), a.end(), [](float f) { return std::isnan(f); });
  };
  CHECK(nans(y.to_vector()) == 0);
  CHECK(nans(ly.to_vector()) == 0);
}

}  // namespace

TEST_CASE("reductions over every axis of a rank-3 tensor, keepdim both ways") {
  check_all_axes({3, 4, 5}, 1);
  check_all_axes({2, 1, 7}, 2);           // a size-1 axis
  check_all_axes({3, 17, 129}, 3);        // inner wider than one tile of 64 columns
  check_all_axes({5}, 4);                 // rank 1: reduces to shape ()
}

TEST_CASE("long rows are reduced in blocks and still match") {
  // 2 rows of 50000: the few-long-rows path (blocks across threads) when threads > 2, and the
  // row-per-thread path otherwise; both must give the reference.
  check_all_axes({2, 50000}, 5);
  check_all_axes({50000, 2}, 6);
}

TEST_CASE("sum_all returns shape () and the double-accumulated total") {
  const std::vector<float> v = random_values(1000003, 7, -1.0f, 3.0f);
  const Tensor x = Tensor::from_vector(v, {1000003});
  double want = 0;
  for (float f : v) want += f;
  const Tensor s = sum_all(x);
  CHECK(s.shape() == Shape{});
  CHECK_CLOSE(std::vector<float>{s.item()}, std::vector<float>{static_cast<float>(want)}, 0.0,
              1e-6);
  CHECK(sum_all(Tensor::zeros({0, 4})).item() == 0.0f);
  CHECK(sum_all(Tensor::scalar(2.5f)).item() == 2.5f);
}

TEST_CASE("argmax returns the first index of the maximum") {
  const Tensor x = Tensor::from_vector(std::vector<float>{1, 3, 3, 2, 7, 7, 7, 0}, {2, 4});
  CHECK(argmax(x, 1).to_int_vector() == std::vector<int32_t>{1, 0});
  CHECK(argmax(x, -1, true).shape() == Shape{2, 1});
  const Tensor t = Tensor::from_vector(std::vector<float>{5, 5, 5, 4, 5, 9}, {3, 2});
  CHECK(argmax(t, 0).to_int_vector() == std::vector<int32_t>{0, 2});
  const Tensor neg = Tensor::full({6}, -kInf);
  CHECK(argmax(neg, 0).to_int_vector() == std::vector<int32_t>{0});
}

TEST_CASE("reductions over an empty axis") {
  const Tensor x = Tensor::zeros({2, 0, 3});
  const Tensor s = sum(x, 1);
  CHECK(s.shape() == Shape{2, 3});
  CHECK(s.to_vector() == std::vector<float>(6, 0.0f));
  CHECK(sum(x, 0).shape() == Shape{0, 3});  // reducing a non-empty axis of an empty tensor
  CHECK_ERROR(mean(x, 1), "mean", "axis 1", "size 0", "(2, 0, 3)");
  CHECK_ERROR(max(x, 1), "max", "axis 1", "(2, 0, 3)");
  CHECK_ERROR(reduce(ReduceOp::min, x, -2), "min", "(2, 0, 3)");
  CHECK_ERROR(argmax(x, 1, true), "argmax", "(2, 0, 3)");
}

TEST_CASE("reductions reject bad axes, dtypes and undefined tensors") {
  const Tensor x = Tensor::zeros({2, 3});
  CHECK_ERROR(sum(x, 2), "sum", "axis 2", "rank 2");
  CHECK_ERROR(mean(x, -3), "mean", "axis -3");
  CHECK_ERROR(sum(Tensor::scalar(1.0f), 0), "sum", "rank 0");
  const Tensor ints = Tensor::from_int_vector(std::vector<int32_t>{1, 2}, {2});
  CHECK_ERROR(sum(ints, 0), "sum", "i32 (2,)");
  CHECK_ERROR(argmax(ints, 0), "argmax", "i32 (2,)");
  CHECK_ERROR(sum_all(ints), "sum_all", "i32 (2,)");
  CHECK_ERROR(max(Tensor(), 0), "max", "undefined");
}

TEST_CASE("softmax and log_softmax match double loops") {
  check_softmax(random_values(35, 20, -5.0f, 5.0f), {5, 7});
  check_softmax(random_values(198, 21, -30.0f, 30.0f), {3, 2, 33});
  check_softmax(random_values(1, 22), {1});
  check_softmax(random_values(64 * 1000, 23, -10.0f, 10.0f), {64, 1000});  // parallel
  const Tensor rows = softmax(Tensor::from_vector(random_values(50, 24), {5, 10}));
  const Tensor s = sum(rows, -1);
  CHECK_CLOSE(s.to_vector(), std::vector<float>(5, 1.0f), 1e-6, 0.0);
}

TEST_CASE("softmax of masked rows: all -inf gives 0 and -inf, one finite value gives 1 and 0") {
  const std::vector<float> v = {-kInf, -kInf, -kInf, -kInf,   // fully masked
                                -kInf, 3.5f,  -kInf, -kInf,   // one finite value
                                1.0f,  -kInf, 2.0f,  -kInf};  // partly masked
  check_softmax(v, {3, 4});
  const std::vector<float> y = softmax(Tensor::from_vector(v, {3, 4})).to_vector();
  const std::vector<float> ly = log_softmax(Tensor::from_vector(v, {3, 4})).to_vector();
  CHECK(std::vector<float>(y.begin(), y.begin() + 8) ==
        std::vector<float>{0, 0, 0, 0, 0, 1, 0, 0});
  CHECK(std::vector<float>(ly.begin(), ly.begin() + 8) ==
        std::vector<float>{-kInf, -kInf, -kInf, -kInf, -kInf, 0, -kInf, -kInf});
}

TEST_CASE("softmax does not overflow on huge values") {
  const std::vector<float> v = {1e30f, 0.0f, -1e30f,   //
                                1000.0f, 999.0f, 998.0f,  //
                                88.0f, 88.5f, 89.0f,      //
                                -1000.0f, -1001.0f, -1000.5f};
  check_softmax(v, {4, 3});
  const std::vector<float> y = softmax(Tensor::from_vector(v, {4, 3})).to_vector();
  const std::vector<float> ly = log_softmax(Tensor::from_vector(v, {4, 3})).to_vector();
  CHECK(y[0] == 1.0f);
  CHECK(y[1] == 0.0f);
  CHECK(ly[0] == 0.0f);
  CHECK(ly[2] == -2e30f);
  for (float f : y) CHECK(std::isfinite(f));
}

TEST_CASE("softmax propagates NaN instead of treating the row as masked") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = Tensor::from_vector(std::vector<float>{nan, nan, 1.0f, nan}, {2, 2});
  const std::vector<float> y = softmax(x).to_vector();
  for (float f : y) CHECK(std::isnan(f));
}

TEST_CASE("softmax rejects bad inputs") {
  CHECK_ERROR(softmax(Tensor::scalar(1.0f)), "softmax", "f32 () on cpu");
  CHECK_ERROR(log_softmax(Tensor::from_int_vector(std::vector<int32_t>{1}, {1})), "log_softmax",
              "i32 (1,)");
  CHECK(softmax(Tensor::zeros({0, 5})).shape() == Shape{0, 5});
  CHECK(log_softmax(Tensor::zeros({3, 0})).shape() == Shape{3, 0});
}

TEST_CASE("reduction and softmax results do not depend on the thread count") {
  const Tensor big = Tensor::from_vector(random_values(3 * 70000, 30), {3, 70000});
  const Tensor wide = Tensor::from_vector(random_values(40 * 30 * 70, 31), {40, 30, 70});
  const Tensor flat = Tensor::from_vector(random_values(1 << 20, 32), {1 << 20});
  auto run = [&](int threads) {
    ThreadCount tc(threads);
    std::vector<std::vector<float>> out;
    out.push_back(sum(big, 1).to_vector());
    out.push_back(mean(big, 0).to_vector());
    out.push_back(max(big, 1).to_vector());
    out.push_back(sum(wide, 1).to_vector());
    out.push_back(reduce(ReduceOp::min, wide, 0).to_vector());
    out.push_back(sum_all(flat).to_vector());
    out.push_back(sum(flat.reshape({2, -1}), 1).to_vector());
    out.push_back(softmax(wide).to_vector());
    out.push_back(log_softmax(big).to_vector());
    const std::vector<int32_t> am = argmax(wide, 1).to_int_vector();
    out.emplace_back(am.begin(), am.end());
    return out;
  };
  // With 1 thread every long row is reduced by one thread; with 2 or 3 threads a few long rows
  // (sum_all, the 2 and 3 rows above) are split into blocks across threads. Same bits.
  const auto one = run(1);
  for (int threads : {2, 3}) {
    const auto many = run(threads);
    for (size_t i = 0; i < one.size(); ++i)
      CHECK_MESSAGE(one[i] == many[i], "result ", i, " at ", threads, " threads");
  }
}
