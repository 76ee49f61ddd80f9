// Shape ops against plain index loops: broadcast_to and sum_to with size-1 axes on either side
// and missing leading axes, slice / slice_add_ / concat along every axis for f32 and i32 data,
// sizes large enough for the parallel paths, thread-count independence, and error messages
// that name the op and the shapes.
#include <numeric>
#include <vector>

#include "check.h"
#include "core/ops.h"

using namespace clustr;
using clustr::test::random_values;
using clustr::test::ThreadCount;

namespace {

std::vector<int32_t> iota_ints(int64_t n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// The multi-index of flat element i in a tensor of shape s.
std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}

// The flat element of a tensor of shape s (aligned at the right of idx) that the broadcast
// multi-index idx reads: size-1 axes read element 0.
int64_t broadcast_source(const std::vector<int64_t>& idx, const Shape& s) {
  const size_t lead = idx.size() - s.size();
  int64_t flat = 0;
  for (size_t d = 0; d < s.size(); ++d) flat = flat * s[d] + (s[d] == 1 ? 0 : idx[lead + d]);
  return flat;
}

template <class T>
std::vector<T> ref_broadcast(const std::vector<T>& x, const Shape& s, const Shape& shape) {
  std::vector<T> y(static_cast<size_t>(numel(shape)));
  for (int64_t j = 0; j < numel(shape); ++j) y[j] = x[broadcast_source(unravel(j, shape), s)];
  return y;
}

// Every x element added (in double) to the y element it broadcasts from.
std::vector<float> ref_sum_to(const std::vector<float>& x, const Shape& xs, const Shape& shape) {
  std::vector<double> acc(static_cast<size_t>(numel(shape)), 0.0);
  for (int64_t i = 0; i < numel(xs); ++i) acc[broadcast_source(unravel(i, xs), shape)] += x[i];
  return std::vector<float>(acc.begin(), acc.end());
}

template <class T>
std::vector<T> ref_slice(const std::vector<T>& x, const Shape& s, int axis, int64_t start,
                         int64_t length) {
  Shape out = s;
  out[axis] = length;
  std::vector<T> y(static_cast<size_t>(numel(out)));
  const std::vector<int64_t> st = contiguous_strides(s);
  for (int64_t j = 0; j < numel(out); ++j) {
    std::vector<int64_t> idx = unravel(j, out);
    idx[axis] += start;
    int64_t i = 0;
    for (size_t d = 0; d < s.size(); ++d) i += idx[d] * st[d];
    y[j] = x[i];
  }
  return y;
}

// Checks broadcast_to(x, shape) and sum_to back against the loops, for x of shape s.
void check_broadcast_pair(const Shape& s, const Shape& shape, uint32_t seed) {
  INFO("x ", to_string(s), " target ", to_string(shape));
  const std::vector<float> v = random_values(numel(s), seed);
  const Tensor y = broadcast_to(Tensor::from_vector(v, s), shape);
  CHECK(y.shape() == shape);
  CHECK(y.to_vector() == ref_broadcast(v, s, shape));  // a copy: exact
  const std::vector<float> w = random_values(numel(shape), seed + 1);
  const Tensor z = sum_to(Tensor::from_vector(w, shape), s);
  CHECK(z.shape() == s);
  CHECK_CLOSE(z.to_vector(), ref_sum_to(w, shape, s), 1e-5, 1e-6);
}

}  // namespace

TEST_CASE("broadcast_to and sum_to with size-1 axes on either side and missing leading axes") {
  struct Case {
    Shape s, shape;
  };
  const Case cases[] = {
      {{3}, {2, 3}},          {{2, 1}, {2, 4}},       {{1, 3}, {4, 3}},
      {{}, {2, 3}},           {{1}, {5}},             {{5}, {5}},
      {{1, 1}, {3, 1, 2}},    {{2, 1, 3}, {4, 2, 5, 3}}, {{4, 1, 3}, {4, 1, 3}},
      {{3, 1}, {3, 1}},       {{1, 4, 1}, {3, 4, 5}}, {{2, 3, 4}, {2, 3, 4}},
      {{7, 1, 9}, {3, 7, 5, 9}}, {{1, 1, 1}, {2, 3, 4}}, {{}, {}},
  };
  uint32_t seed = 1;
  for (const Case& c : cases) check_broadcast_pair(c.s, c.shape, seed += 2);
}

TEST_CASE("broadcast_to and sum_to on the parallel paths") {
  check_broadcast_pair({1, 300}, {200, 300}, 50);
  check_broadcast_pair({300, 1}, {300, 200}, 51);
  check_broadcast_pair({300}, {2, 100, 300}, 52);
  check_broadcast_pair({7, 1, 9}, {13, 7, 50, 9}, 53);
  check_broadcast_pair({64, 1, 40}, {64, 70, 40}, 54);
  check_broadcast_pair({}, {200, 300}, 55);
  check_broadcast_pair({1, 3, 1}, {5000, 3, 7}, 56);  // several summed groups, long ones
}

TEST_CASE("broadcast_to moves i32 data; sum_to over an empty axis gives zeros") {
  const std::vector<int32_t> v = iota_ints(3, -1);
  const Tensor y = broadcast_to(Tensor::from_int_vector(v, {3, 1}), {2, 3, 4});
  CHECK(y.dtype() == DType::i32);
  CHECK(y.to_int_vector() == ref_broadcast(v, {3, 1}, {2, 3, 4}));
  CHECK(broadcast_to(Tensor::zeros({1, 3}), {0, 3}).shape() == Shape{0, 3});
  const Tensor z = sum_to(Tensor::zeros({2, 0, 3}), {1, 3});
  CHECK(z.shape() == Shape{1, 3});
  CHECK(z.to_vector() == std::vector<float>(3, 0.0f));
  CHECK(sum_to(Tensor::zeros({0, 3}), {0, 3}).numel() == 0);
  CHECK(sum_to(Tensor::full({4, 0}, 1.0f), {4, 1}).to_vector() == std::vector<float>(4, 0.0f));
}

TEST_CASE("slice and slice_add_ along every axis, f32 and i32") {
  const Shape s = {3, 1, 5, 4};
  const std::vector<float> v = random_values(numel(s), 60);
  const std::vector<int32_t> iv = iota_ints(numel(s), -30);
  const Tensor x = Tensor::from_vector(v, s), xi = Tensor::from_int_vector(iv, s);
  struct Case {
    int axis;
    int64_t start, length;
  };
  for (Case c : {Case{0, 1, 2}, Case{0, 0, 3}, Case{1, 0, 1}, Case{2, 1, 3}, Case{2, 4, 1},
                 Case{3, 0, 2}, Case{3, 3, 1}, Case{-1, 1, 2}, Case{2, 2, 0}}) {
    const int a = c.axis < 0 ? c.axis + 4 : c.axis;
    INFO("axis ", c.axis, " start ", c.start, " length ", c.length);
    const Tensor y = slice(x, c.axis, c.start, c.length);
    Shape want = s;
    want[a] = c.length;
    CHECK(y.shape() == want);
    CHECK(y.to_vector() == ref_slice(v, s, a, c.start, c.length));
    const Tensor yi = slice(xi, c.axis, c.start, c.length);
    CHECK(yi.dtype() == DType::i32);
    CHECK(yi.to_int_vector() == ref_slice(iv, s, a, c.start, c.length));
    // slice_add_ is accumulated: dst starts from x, and adding a slice back to zeros and
    // slicing it again gives the slice.
    const std::vector<float> sv = random_values(numel(want), 61);
    Tensor dst = x.clone();
    slice_add_(dst, c.axis, c.start, Tensor::from_vector(sv, want));
    std::vector<float> expect = v;
    const std::vector<int64_t> st = contiguous_strides(s);
    for (int64_t j = 0; j < numel(want); ++j) {
      std::vector<int64_t> idx = unravel(j, want);
      idx[a] += c.start;
      int64_t i = 0;
      for (size_t d = 0; d < s.size(); ++d) i += idx[d] * st[d];
      expect[i] += sv[j];
    }
    CHECK(dst.to_vector() == expect);
  }
}

TEST_CASE("slice and slice_add_ on the parallel paths") {
  const Shape s = {2, 50000};  // one long row per outer index
  const std::vector<float> v = random_values(numel(s), 70);
  const Tensor x = Tensor::from_vector(v, s);
  CHECK(slice(x, 1, 123, 40000).to_vector() == ref_slice(v, s, 1, 123, 40000));
  const Shape s2 = {40000, 3};  // many short rows
  const std::vector<float> v2 = random_values(numel(s2), 71);
  const Tensor x2 = Tensor::from_vector(v2, s2);
  CHECK(slice(x2, 1, 1, 2).to_vector() == ref_slice(v2, s2, 1, 1, 2));
  CHECK(slice(x2, 0, 5, 39990).to_vector() == ref_slice(v2, s2, 0, 5, 39990));
  Tensor acc = Tensor::zeros(s2);
  slice_add_(acc, 1, 1, slice(x2, 1, 1, 2));
  slice_add_(acc, 1, 0, slice(x2, 1, 0, 1));
  CHECK(acc.to_vector() == v2);  // 0 + a == a exactly
}

TEST_CASE("concat along every axis, f32 and i32, including empty pieces") {
  const Tensor a = Tensor::from_vector(random_values(2 * 3 * 4, 80), {2, 3, 4});
  for (int axis : {0, 1, 2, -1}) {
    const int ax = axis < 0 ? axis + 3 : axis;
    Shape sb = {2, 3, 4}, sc = {2, 3, 4}, se = {2, 3, 4};
    sb[ax] = 1;
    sc[ax] = 5;
    se[ax] = 0;
    const Tensor b = Tensor::from_vector(random_values(numel(sb), 81), sb);
    const Tensor c = Tensor::from_vector(random_values(numel(sc), 82), sc);
    const Tensor e = Tensor::zeros(se);
    INFO("axis ", axis);
    const Tensor y = concat({a, b, e, c}, axis);
    Shape want = {2, 3, 4};
    want[ax] = a.shape()[ax] + 1 + 5;
    CHECK(y.shape() == want);
    // Slicing the pieces back out gives them exactly.
    CHECK(slice(y, axis, 0, a.shape()[ax]).to_vector() == a.to_vector());
    CHECK(slice(y, axis, a.shape()[ax], 1).to_vector() == b.to_vector());
    CHECK(slice(y, axis, a.shape()[ax] + 1, 5).to_vector() == c.to_vector());
  }
  // i32 along the last axis, against the loop.
  const Tensor p = Tensor::from_int_vector(iota_ints(6, 0), {2, 3});
  const Tensor q = Tensor::from_int_vector(iota_ints(2, 100), {2, 1});
  const Tensor r = concat({p, q}, 1);
  CHECK(r.dtype() == DType::i32);
  CHECK(r.to_int_vector() == std::vector<int32_t>{0, 1, 2, 100, 3, 4, 5, 101});
  CHECK(concat({p}, 0).to_int_vector() == p.to_int_vector());
  CHECK(concat({Tensor::zeros({0, 3}), Tensor::zeros({0, 3})}, 0).shape() == Shape{0, 3});
}

TEST_CASE("split is concat's inverse: every axis, empty and unwanted pieces, f32 and i32") {
  const Tensor x = Tensor::from_vector(random_values(4 * 11 * 3, 95), {4, 11, 3});
  for (int axis : {0, 1, 2}) {
    INFO("axis ", axis);
    const int64_t len = x.shape()[axis];
    // Pieces 0, 1, the rest (one empty): their slices, in order.
    const std::vector<int64_t> lens = {1, 0, len - 1};
    const std::vector<Tensor> ys = split(x, axis, lens);
    REQUIRE(ys.size() == 3);
    CHECK(ys[0].to_vector() == slice(x, axis, 0, 1).to_vector());
    CHECK(ys[1].numel() == 0);
    CHECK(ys[2].to_vector() == slice(x, axis, 1, len - 1).to_vector());
    CHECK(concat(ys, axis).to_vector() == x.to_vector());
    const std::vector<Tensor> some = split(x, axis, lens, {false, true, true});
    CHECK(!some[0].defined());
    CHECK(some[2].to_vector() == ys[2].to_vector());
  }
  // Eleven pieces of one element along axis 1 (more than one device launch holds), i32.
  const Tensor i = Tensor::from_int_vector(iota_ints(2 * 11, 0), {2, 11});
  const std::vector<Tensor> cols = split(i, 1, std::vector<int64_t>(11, 1));
  CHECK(cols[10].to_int_vector() == std::vector<int32_t>{10, 21});
  CHECK(concat(cols, 1).to_int_vector() == i.to_int_vector());
  CHECK_ERROR(split(x, 1, {5, 5}), "split", "sum to 10", "11 elements along axis 1");
  CHECK_ERROR(split(x, 1, {12, -1}), "split", "piece 1", "negative");
  CHECK_ERROR(split(x, 1, {11}, {true, false}), "split", "expected 1 wanted flags");
  CHECK_ERROR(split(x, 3, {11}), "split", "axis 3");
}

TEST_CASE("concat on the parallel path") {
  const Tensor a = Tensor::from_vector(random_values(300 * 70, 90), {300, 70});
  const Tensor b = Tensor::from_vector(random_values(300 * 130, 91), {300, 130});
  const Tensor y = concat({a, b}, 1);
  CHECK(y.shape() == Shape{300, 200});
  CHECK(slice(y, 1, 0, 70).to_vector() == a.to_vector());
  CHECK(slice(y, 1, 70, 130).to_vector() == b.to_vector());
  const Tensor z = concat({a.reshape({70, 300}), b.reshape({130, 300})}, 0);
  std::vector<float> want = a.to_vector(), bv = b.to_vector();
  want.insert(want.end(), bv.begin(), bv.end());
  CHECK(z.to_vector() == want);
}

TEST_CASE("shape op results do not depend on the thread count") {
  const Tensor x = Tensor::from_vector(random_values(100 * 3 * 500 * 7, 100), {100, 3, 500, 7});
  const Tensor row = Tensor::from_vector(random_values(40000, 101), {40000});
  const Tensor part = Tensor::from_vector(random_values(100 * 3 * 200 * 7, 102), {100, 3, 200, 7});
  auto run = [&](int threads) {
    ThreadCount tc(threads);
    std::vector<std::vector<float>> out;
    out.push_back(sum_to(x, {3, 1, 7}).to_vector());  // two summed groups
    out.push_back(sum_to(x, {1}).to_vector());         // everything into one element
    out.push_back(sum_to(x, {500, 1}).to_vector());
    out.push_back(sum_to(row, {}).to_vector());
    Tensor acc = x.clone();
    slice_add_(acc, 2, 100, part);
    out.push_back(acc.to_vector());
    out.push_back(broadcast_to(row, {3, 40000}).to_vector());
    out.push_back(concat({x, x}, 2).to_vector());
    return out;
  };
  const auto one = run(1);
  CHECK(one == run(2));
  CHECK(one == run(3));
  CHECK_CLOSE(one[1], ref_sum_to(x.to_vector(), x.shape(), {1}), 1e-3, 1e-5);
}

TEST_CASE("shape op errors name the op and the shapes") {
  const Tensor x = Tensor::zeros({2, 3});
  CHECK_ERROR(broadcast_to(x, {4, 3}), "broadcast_to", "(2, 3)", "(4, 3)", "axis 0");
  CHECK_ERROR(broadcast_to(x, {3}), "broadcast_to", "(2, 3)", "(3,)", "lower rank");
  CHECK_ERROR(broadcast_to(x, {2, 2, 1}), "broadcast_to", "(2, 3)", "(2, 2, 1)", "axis 2");
  CHECK_ERROR(sum_to(x, {3, 3}), "sum_to", "(3, 3)", "(2, 3)", "axis 0");
  CHECK_ERROR(sum_to(x, {1, 2, 3}), "sum_to", "(1, 2, 3)", "(2, 3)", "higher rank");
  CHECK_ERROR(sum_to(x, {2}), "sum_to", "(2,)", "(2, 3)");
  CHECK_ERROR(sum_to(Tensor::zeros({2}, DType::i32), {1}), "sum_to", "f32", "i32 (2,)");
  CHECK_ERROR(slice(x, 1, 2, 2), "slice", "[2, 4)", "axis 1", "[0, 3)", "(2, 3)");
  CHECK_ERROR(slice(x, 0, -1, 1), "slice", "[-1, 0)", "(2, 3)");
  CHECK_ERROR(slice(x, 2, 0, 1), "slice", "axis 2", "rank 2");
  CHECK_ERROR(slice(Tensor::scalar(1.0f), 0, 0, 1), "slice", "at least one axis", "()");
  Tensor dst = Tensor::zeros({4, 3});
  CHECK_ERROR(slice_add_(dst, 0, 0, Tensor::zeros({2, 2})), "slice_add_", "(2, 2)", "(4, 3)",
              "every axis but axis 0");
  CHECK_ERROR(slice_add_(dst, 0, 3, Tensor::zeros({2, 3})), "slice_add_", "[3, 5)", "(4, 3)",
              "(2, 3)");
  CHECK_ERROR(slice_add_(dst, 0, 0, Tensor::zeros({3})), "slice_add_", "(3,)", "(4, 3)");
  CHECK(dst.to_vector() == std::vector<float>(12, 0.0f));  // nothing written on failure
  CHECK_ERROR(concat({}, 0), "concat", "at least one");
  CHECK_ERROR(concat({x, Tensor::zeros({2, 4})}, 0), "concat", "xs[1]", "(2, 4)", "(2, 3)",
              "axis 0");
  CHECK_ERROR(concat({x, Tensor::zeros({2})}, 1), "concat", "xs[1]", "(2,)", "(2, 3)");
  CHECK_ERROR(concat({x, Tensor::zeros({2, 3}, DType::i32)}, 0), "concat", "xs[1]", "i32",
              "dtype");
  CHECK_ERROR(concat({x, Tensor()}, 0), "concat", "xs[1]", "undefined");
  CHECK_ERROR(concat({x, x}, 2), "concat", "axis 2", "rank 2");
}
