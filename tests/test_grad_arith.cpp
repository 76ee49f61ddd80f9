// Gradients of the arithmetic ops (add, sub, mul, div with broadcasting; neg; ops with a
// scalar) and of the products (matmul with every transpose combination, rank 2 and batched;
// linear with and without bias; embedding with repeated indices), checked by gradcheck
// against central differences. Also: an input that does not require grad gets no gradient,
// and an input used twice gets both contributions.
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

struct ShapePair {
  Shape a, b;
};

// Broadcasting in both directions: size-1 axes on either side, missing leading axes, scalars.
const ShapePair kBroadcastCases[] = {
    {{2, 3}, {2, 3}}, {{2, 3}, {3}},       {{3}, {2, 3}},          {{2, 1}, {1, 3}},
    {{}, {2, 3}},     {{2, 3}, {}},        {{4, 1, 3}, {2, 1}},    {{3, 1, 2}, {3, 4, 1}},
    {{1, 1}, {2, 3}}, {{2, 1, 1}, {1, 3}},
};

std::string describe_pair(const char* op, const ShapePair& p) {
  return std::string(op) + " " + to_string(p.a) + " with " + to_string(p.b);
}

}  // namespace

TEST_CASE("add, sub, mul, div: gradients with broadcasting") {
  uint32_t seed = 1;
  for (const ShapePair& p : kBroadcastCases) {
    const Tensor a = random_tensor(p.a, seed++), b = random_tensor(p.b, seed++);
    const Tensor pos = random_tensor(p.b, seed++, 0.5f, 2.0f);  // a divisor away from 0
    check_grad(describe_pair("add", p), [](auto& v) { return add(v[0], v[1]); }, {a, b});
    check_grad(describe_pair("sub", p), [](auto& v) { return v[0] - v[1]; }, {a, b});
    check_grad(describe_pair("mul", p), [](auto& v) { return v[0] * v[1]; }, {a, b});
    check_grad(describe_pair("div", p), [](auto& v) { return div(v[0], v[1]); }, {a, pos});
    const Tensor neg_pos = mul(pos, -1.0f);
    check_grad(describe_pair("div (negative divisor)", p), [](auto& v) { return v[0] / v[1]; },
               {a, neg_pos});
  }
}

TEST_CASE("arithmetic forward values are the core ops'") {
  const Tensor a = random_tensor({2, 3}, 10), b = random_tensor({3}, 11, 0.5f, 2.0f);
  const Variable va(a), vb(b);
  CHECK((va + vb).data().to_vector() == add(a, b).to_vector());
  CHECK((va - vb).data().to_vector() == sub(a, b).to_vector());
  CHECK((va * vb).data().to_vector() == mul(a, b).to_vector());
  CHECK((va / vb).data().to_vector() == div(a, b).to_vector());
  CHECK((-va).data().to_vector() == neg(a).to_vector());
  CHECK((va + 1.5f).data().to_vector() == add(a, 1.5f).to_vector());
  CHECK((va - 1.5f).data().to_vector() == add(a, -1.5f).to_vector());
  CHECK((2.5f * va).data().to_vector() == mul(a, 2.5f).to_vector());
  CHECK(!(va * vb).requires_grad());  // no input requires grad: no graph
}

TEST_CASE("neg and the scalar ops") {
  const Tensor x = random_tensor({3, 4}, 20);
  check_grad("neg", [](auto& v) { return -v[0]; }, {x});
  check_grad("add scalar", [](auto& v) { return v[0] + 0.75f; }, {x});
  check_grad("sub scalar", [](auto& v) { return v[0] - 3.0f; }, {x});
  check_grad("mul scalar", [](auto& v) { return v[0] * -1.25f; }, {x});
  check_grad("div scalar", [](auto& v) { return v[0] / 4.0f; }, {x});
  check_grad("scalar shape ()", [](auto& v) { return 2.0f * v[0] + 1.0f; },
             {Tensor::scalar(0.3f)});
}

TEST_CASE("an input that is used twice gets both contributions") {
  const Tensor a = random_tensor({2, 3}, 30), b = random_tensor({3}, 31, 0.5f, 2.0f);
  check_grad("a * a + a / b - b", [](auto& v) { return v[0] * v[0] + v[0] / v[1] - v[1]; },
             {a, b});
  check_grad("add(a, a)", [](auto& v) { return add(v[0], v[0]); }, {a});
  // d/da sum(a * a) = 2a, exactly.
  Variable va(a, true);
  sum_all(va * va).backward();
  CHECK(va.grad().to_vector() == mul(a, 2.0f).to_vector());
}

TEST_CASE("an input that does not require grad gets no gradient") {
  const Tensor a = random_tensor({2, 3}, 40), b = random_tensor({1, 3}, 41, 0.5f, 2.0f);
  for (int op = 0; op < 4; ++op) {
    Variable va(a, true), vb(b, false);
    Variable c = op == 0 ? va + vb : op == 1 ? va - vb : op == 2 ? va * vb : va / vb;
    c.backward(Tensor::full(c.shape(), 1.0f));
    INFO("op ", op);
    CHECK(va.grad().defined());
    CHECK(va.grad().shape() == a.shape());
    CHECK(!vb.grad().defined());
    // And the other way round.
    Variable wa(a, false), wb(b, true);
    Variable d = op == 0 ? wa + wb : op == 1 ? wa - wb : op == 2 ? wa * wb : wa / wb;
    d.backward(Tensor::full(d.shape(), 1.0f));
    CHECK(!wa.grad().defined());
    CHECK(wb.grad().shape() == b.shape());
  }
  // mul: d(sum(a * b))/da = b broadcast, exactly.
  Variable va(a, true), vb(b, false);
  sum_all(va * vb).backward();
  CHECK(va.grad().to_vector() == broadcast_to(b, a.shape()).to_vector());
  check_grad("mul, only b checked", [](auto& v) { return v[0] * v[1]; }, {a, b}, {false, true});
  check_grad("div, only a checked", [](auto& v) { return v[0] / v[1]; }, {a, b}, {true, false});
}

TEST_CASE("matmul: every transpose combination, rank 2 and batched") {
  const int64_t M = 3, K = 4, N = 5, B = 2;
  uint32_t seed = 50;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      const Shape sa = ta ? Shape{K, M} : Shape{M, K}, sb = tb ? Shape{N, K} : Shape{K, N};
      const Tensor A = random_tensor(sa, seed++), Bm = random_tensor(sb, seed++);
      const std::string tag = "ta=" + std::to_string(ta) + " tb=" + std::to_string(tb);
      auto f = [ta, tb](auto& v) { return matmul(v[0], v[1], ta != 0, tb != 0); };
      check_grad("matmul " + tag, f, {A, Bm});
      check_grad("matmul, only A " + tag, f, {A, Bm}, {true, false});
      check_grad("matmul, only B " + tag, f, {A, Bm}, {false, true});
      const Shape ba = ta ? Shape{B, K, M} : Shape{B, M, K};
      const Shape bb = tb ? Shape{B, N, K} : Shape{B, K, N};
      const Tensor bA = random_tensor(ba, seed++), bB = random_tensor(bb, seed++);
      check_grad("batched matmul " + tag, f, {bA, bB});
    }
  // Forward: the core product.
  const Tensor A = random_tensor({M, K}, 60), Bm = random_tensor({N, K}, 61);
  CHECK(matmul(Variable(A), Variable(Bm), false, true).data().to_vector() ==
        matmul(A, Bm, false, true).to_vector());
}

TEST_CASE("linear: with and without bias, rank 1, 2 and 3 inputs") {
  const int64_t in = 4, out = 3;
  const Tensor W = random_tensor({out, in}, 70), b = random_tensor({out}, 71);
  for (const Shape& xs : {Shape{5, in}, Shape{2, 3, in}, Shape{in}}) {
    const Tensor x = random_tensor(xs, 72);
    check_grad("linear with bias, x " + to_string(xs),
               [](auto& v) { return linear(v[0], v[1], v[2]); }, {x, W, b});
    check_grad("linear without bias, x " + to_string(xs),
               [](auto& v) { return linear(v[0], v[1], Variable()); }, {x, W});
    check_grad("linear, only the bias, x " + to_string(xs),
               [](auto& v) { return linear(v[0], v[1], v[2]); }, {x, W, b},
               {false, false, true});
  }
  // Forward against x W^T + b; shape (..., out).
  const Tensor x = random_tensor({2, 3, in}, 73);
  const Variable y = linear(Variable(x), Variable(W), Variable(b));
  CHECK(y.shape() == Shape{2, 3, out});
  const Tensor want = add(matmul(x.reshape({6, in}), W, false, true), b).reshape({2, 3, out});
  CHECK_CLOSE(y.data().to_vector(), want.to_vector(), 1e-6, 1e-6);
  // x does not require grad: no gradient for it, and W's is dY^T X.
  Variable vx(x, false), vW(W, true), vb(b, true);
  linear(vx, vW, vb).backward(Tensor::full({2, 3, out}, 1.0f));
  CHECK(!vx.grad().defined());
  CHECK(vW.grad().shape() == W.shape());
  CHECK_CLOSE(vb.grad().to_vector(), std::vector<float>(out, 6.0f), 0.0, 0.0);
}

TEST_CASE("linear reports mismatched shapes") {
  const Variable x(Tensor::zeros({2, 4})), W(Tensor::zeros({3, 5})), b(Tensor::zeros({4}));
  CHECK_ERROR(linear(x, W, Variable()), "linear", "(3, 5)", "(2, 4)");
  CHECK_ERROR(linear(x, Variable(Tensor::zeros({3, 4})), b), "linear", "bias", "(3,)", "(4,)");
  CHECK_ERROR(linear(x, Variable(Tensor::zeros({12})), b), "linear", "rank 2", "(12,)");
}

TEST_CASE("embedding: gradients with repeated indices") {
  const int64_t V = 5, D = 3;
  const Tensor table = random_tensor({V, D}, 80);
  const Tensor index = Tensor::from_int_vector({4, 0, 4, 2, 2, 4}, {2, 3});
  check_grad("embedding", [&](auto& v) { return embedding(v[0], index); }, {table});
  // d sum(embedding)/d table: each row counts how often its index occurs.
  Variable vt(table, true);
  const Variable y = embedding(vt, index);
  CHECK(y.shape() == Shape{2, 3, D});
  CHECK(y.data().to_vector() == gather_rows(table, index).to_vector());
  sum_all(y).backward();
  const std::vector<float> counts = {1, 0, 2, 0, 3};
  std::vector<float> want;
  for (float c : counts) want.insert(want.end(), D, c);
  CHECK(vt.grad().to_vector() == want);
  // Rows added as they are looked up (a constant): the same gradient.
  const Tensor added = random_tensor({3, D}, 81);
  check_grad("embedding + added", [&](auto& v) { return embedding(v[0], index, added); },
             {table});
  Variable va(table, true);
  const Variable ya = embedding(va, index, added);
  CHECK(ya.data().to_vector() == add(gather_rows(table, index), added).to_vector());
  sum_all(ya).backward();
  CHECK(va.grad().to_vector() == want);
}
