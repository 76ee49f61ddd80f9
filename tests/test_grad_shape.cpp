// Gradients of the shape ops and reductions (reshape, permute, transpose, slice, concat, sum,
// mean, sum_all, mean_all), checked by gradcheck against central differences, plus the exact
// gradients that need no difference quotient and the inputs that get no gradient.
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "check.h"
#include "core/ops.h"

using namespace clustr;
using clustr::test::random_tensor;

namespace {

using Fn = test::GradFn;
using test::check_grad;

}  // namespace

TEST_CASE("reshape: gradient and a view of the input") {
  const Tensor x = random_tensor({2, 3, 4}, 1);
  check_grad("reshape to (6, 4)", [](auto& v) { return reshape(v[0], {6, 4}); }, {x});
  check_grad("reshape to (4, -1)", [](auto& v) { return reshape(v[0], {4, -1}); }, {x});
  // A product after the reshape, so that the gradient is not just the weights.
  check_grad("reshape then multiply",
             [](auto& v) { return reshape(v[0], {3, 8}) * reshape(v[0], {3, 8}); }, {x});
  const Variable vx(x);
  CHECK(reshape(vx, {24}).data().shares_storage(x));
}

TEST_CASE("permute and transpose: gradient is the inverse permutation") {
  const Tensor x = random_tensor({2, 3, 4}, 10);
  const std::vector<std::vector<int>> perms = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                               {1, 2, 0}, {2, 0, 1}, {2, 1, 0}, {-1, 0, -2}};
  for (const std::vector<int>& p : perms) {
    std::string tag = "permute";
    for (int a : p) tag += " " + std::to_string(a);
    check_grad(tag, [&](auto& v) { return permute(v[0], p) * permute(v[0], p); }, {x});
  }
  check_grad("transpose 0 2", [](auto& v) { return transpose(v[0], 0, 2); }, {x});
  check_grad("transpose -1 -2", [&](auto& v) { return transpose(v[0], -1, -2) * v[0]; },
             {random_tensor({3, 3}, 12)});
  const Variable w(random_tensor({2, 4, 3}, 13));
  check_grad("transpose 1 2 with a weight", [&](auto& v) { return transpose(v[0], 1, 2) * w; },
             {x});
}

TEST_CASE("slice: gradient lands in the sliced range, zeros elsewhere") {
  const Tensor x = random_tensor({3, 4, 5}, 20);
  struct Case {
    int axis;
    int64_t start, length;
  };
  for (Case c : {Case{0, 1, 2}, Case{1, 0, 1}, Case{1, 1, 3}, Case{2, 4, 1}, Case{-1, 0, 5},
                 Case{2, 2, 0}}) {
    const std::string tag = "slice axis " + std::to_string(c.axis) + " [" +
                            std::to_string(c.start) + ", +" + std::to_string(c.length) + ")";
    check_grad(tag, [c](auto& v) { return slice(v[0], c.axis, c.start, c.length) *
                                          slice(v[0], c.axis, c.start, c.length); },
               {x});
  }
  Variable vx(x, true);
  sum_all(slice(vx, 1, 1, 2)).backward();
  std::vector<float> want(60, 0.0f);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 1; j < 3; ++j)
      for (int64_t k = 0; k < 5; ++k) want[(i * 4 + j) * 5 + k] = 1.0f;
  CHECK(vx.grad().to_vector() == want);
}

TEST_CASE("concat: each input gets its slice of the gradient") {
  for (int axis : {0, 1, -1}) {
    const int a = axis < 0 ? axis + 2 : axis;
    Shape s0 = {2, 3}, s1 = {2, 3}, s2 = {2, 3};
    s1[a] = 1;
    s2[a] = 4;
    const std::vector<Tensor> xs = {random_tensor(s0, 30), random_tensor(s1, 31),
                                    random_tensor(s2, 32)};
    const std::string tag = "concat axis " + std::to_string(axis);
    auto f = [axis](auto& v) {
      const Variable y = concat({v[0], v[1], v[2]}, axis);
      return y * y;
    };
    check_grad(tag, f, xs);
    check_grad(tag + ", middle input not checked", f, xs, {true, false, true});
  }
  // An input that does not require grad gets none; the others get exact slices of dy.
  Variable a(random_tensor({2, 2}, 33), true), b(random_tensor({2, 3}, 34), false);
  const Variable y = concat({a, b}, 1);
  const Tensor dy = random_tensor({2, 5}, 35);
  y.backward(dy);
  CHECK(a.grad().to_vector() == slice(dy, 1, 0, 2).to_vector());
  CHECK(!b.grad().defined());
  CHECK(!concat({b, b}, 0).requires_grad());
}

TEST_CASE("sum and mean over an axis, with and without keepdim") {
  const Tensor x = random_tensor({2, 3, 4}, 40);
  for (int axis : {0, 1, 2, -1})
    for (bool keepdim : {false, true}) {
      const std::string tag =
          "axis " + std::to_string(axis) + (keepdim ? " keepdim" : " no keepdim");
      auto s = [axis, keepdim](auto& v) {
        const Variable y = sum(v[0], axis, keepdim);
        return y * y;
      };
      auto m = [axis, keepdim](auto& v) {
        const Variable y = mean(v[0], axis, keepdim);
        return y * y;
      };
      check_grad("sum " + tag, s, {x});
      check_grad("mean " + tag, m, {x});
    }
  // Shapes of the results, and the exact gradient of a mean: 1/len everywhere.
  const Variable vx(x, true);
  CHECK(sum(vx, 1).shape() == Shape{2, 4});
  CHECK(sum(vx, 1, true).shape() == Shape{2, 1, 4});
  sum_all(mean(vx, 2)).backward();
  CHECK(vx.grad().to_vector() == std::vector<float>(24, 0.25f));
}

TEST_CASE("sum_all and mean_all") {
  const Tensor x = random_tensor({3, 5}, 50);
  check_grad("sum_all", [](auto& v) { return sum_all(v[0] * v[0]); }, {x});
  check_grad("mean_all", [](auto& v) { return mean_all(v[0] * v[0]); }, {x});
  check_grad("mean_all of a scalar", [](auto& v) { return mean_all(v[0] * v[0]); },
             {Tensor::scalar(0.7f)});
  const Variable vx(x, true);
  const Variable m = mean_all(vx);
  CHECK(m.shape() == Shape{});
  CHECK(m.item() == doctest::Approx(sum_all(x).item() / 15.0f).epsilon(1e-6));
  m.backward();
  CHECK(vx.grad().to_vector() == std::vector<float>(15, 1.0f / 15.0f));
  CHECK_ERROR(mean_all(Variable(Tensor::zeros({0, 3}))), "mean_all", "(0, 3)", "no elements");
}

TEST_CASE("a chain of shape ops and arithmetic") {
  // (B, S, H*E) -> (B, H, S, E) as in attention, a weighted sum, and back.
  const Tensor x = random_tensor({2, 3, 4}, 60), w = random_tensor({2, 2, 3, 2}, 61);
  check_grad("split heads, weight, merge, mean",
             [&](auto& v) {
               const Variable h = permute(reshape(v[0], {2, 3, 2, 2}), {0, 2, 1, 3});
               const Variable y = reshape(permute(h * Variable(w), {0, 2, 1, 3}), {2, 3, 4});
               return mean(y * v[0], 1);
             },
             {x});
}
