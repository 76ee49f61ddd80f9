// The autograd engine, tested with small nodes defined here so that the engine's behaviour is
// checked independently of the op library: accumulation, shared subgraphs, freeing, no-grad,
// deep graphs, memory, error messages, and gradcheck catching a wrong backward.
#include <cmath>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "autograd/node.h"
#include "autograd/variable.h"
#include "check.h"
#include "core/error.h"
#include "core/ops.h"

using namespace clustr;

namespace {

// y = x * x, with a backward that can be made wrong on purpose.
struct SquareNode : Node {
  Tensor x;
  float factor = 2.0f;  // the correct derivative is 2x
  const char* name() const override { return "square"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {mul(mul(g, x), factor)}; }
  void release() override { x = Tensor(); }
};

Variable square(const Variable& x, float factor = 2.0f) {
  Tensor y = mul(x.data(), x.data());
  if (!record_needed({&x})) return Variable(y);
  auto node = std::make_shared<SquareNode>();
  node->x = x.data();
  node->factor = factor;
  return attach(y, node, {&x});
}

// y = a + b (same shapes).
struct AddNode : Node {
  const char* name() const override { return "add"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {g, g}; }
};

Variable plus(const Variable& a, const Variable& b) {
  Tensor y = add(a.data(), b.data());
  if (!record_needed({&a, &b})) return Variable(y);
  return attach(y, std::make_shared<AddNode>(), {&a, &b});
}

// y = s * x.
struct ScaleNode : Node {
  float s = 1.0f;
  const char* name() const override { return "scale"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {mul(g, s)}; }
};

Variable scale(const Variable& x, float s) {
  Tensor y = mul(x.data(), s);
  if (!record_needed({&x})) return Variable(y);
  auto node = std::make_shared<ScaleNode>();
  node->s = s;
  return attach(y, node, {&x});
}

// sum of all elements -> shape ().
struct SumNode : Node {
  Shape shape;
  const char* name() const override { return "sum"; }
  std::vector<Tensor> backward(const Tensor& g) override {
    return {Tensor::full(shape, g.item())};
  }
};

Variable total(const Variable& x) {
  Tensor y = sum_all(x.data());
  if (!record_needed({&x})) return Variable(y);
  auto node = std::make_shared<SumNode>();
  node->shape = x.shape();
  return attach(y, node, {&x});
}

// y = x, passing the incoming gradient itself on.
struct IdentityNode : Node {
  const char* name() const override { return "identity"; }
  std::vector<Tensor> backward(const Tensor& g) override { return {g}; }
};

Variable identity(const Variable& x) {
  if (!record_needed({&x})) return Variable(x.data());
  return attach(x.data(), std::make_shared<IdentityNode>(), {&x});
}

// y = s * x, taking the engine's offer of the sum waiting at x (Node::backward_adding) in the
// given mode, and counting the offers.
struct ScaleAddingNode : Node {
  float s = 1.0f;
  SumOffer mode = SumOffer::separate;
  int* offers = nullptr;
  const char* name() const override { return "scale_adding"; }
  SumOffer takes_sums() const override { return mode; }
  std::vector<Tensor> backward(const Tensor& g) override { return {mul(g, s)}; }
  std::vector<Tensor> backward_adding(const Tensor& g, const std::vector<Tensor>& sums) override {
    if (!sums[0].defined()) return backward(g);
    ++*offers;
    const Tensor mine = mul(g, s);  // g read before the sum is written
    Tensor sum = sums[0];
    add_(sum, mine);
    return {sums[0]};
  }
};

Variable scale_adding(const Variable& x, float s, Node::SumOffer mode, int* offers) {
  Tensor y = mul(x.data(), s);
  if (!record_needed({&x})) return Variable(y);
  auto node = std::make_shared<ScaleAddingNode>();
  node->s = s;
  node->mode = mode;
  node->offers = offers;
  return attach(y, node, {&x});
}

// A node that returns a gradient of the wrong shape.
struct BrokenNode : Node {
  const char* name() const override { return "broken"; }
  std::vector<Tensor> backward(const Tensor&) override { return {Tensor::zeros({7})}; }
};

}  // namespace

TEST_CASE("leaf gradients are computed and accumulated with +=") {
  Variable x(Tensor::from_vector({1, -2, 3}, {3}), true);
  total(square(x)).backward();
  CHECK(x.grad().to_vector() == std::vector<float>{2, -4, 6});
  total(square(x)).backward();  // a second graph adds to the same leaf
  CHECK(x.grad().to_vector() == std::vector<float>{4, -8, 12});
  x.zero_grad();
  CHECK_FALSE(x.grad().defined());
}

TEST_CASE("a shared subgraph receives the sum of its gradients (diamond)") {
  Variable x(Tensor::from_vector({1, 2}, {2}), true);
  Variable h = square(x);                      // h = x^2
  Variable y = plus(scale(h, 3.0f), h);        // y = 3h + h = 4x^2
  total(y).backward();                         // dy/dx = 8x
  CHECK(x.grad().to_vector() == std::vector<float>{8, 16});
  // The same leaf used twice by one op: d(x + x)/dx = 2.
  Variable z(Tensor::from_vector({5}, {1}), true);
  total(plus(z, z)).backward();
  CHECK(z.grad().to_vector() == std::vector<float>{2});
}

TEST_CASE("gradients summed or kept in place never change a tensor seen elsewhere") {
  // The engine adds gradients in place, and keeps a leaf's first gradient without a copy, only
  // when no other tensor uses its storage. The caller's upstream gradient passed on untouched
  // (identity) or to two edges (plus) must stay as it was through repeated backward passes.
  const std::vector<float> d = {1, -2, 3};
  const Tensor dout = Tensor::from_vector(d, {3});
  Variable x(Tensor::from_vector({0, 0, 0}, {3}), true);
  identity(x).backward(dout);
  identity(x).backward(dout);
  CHECK(x.grad().to_vector() == std::vector<float>{2, -4, 6});
  plus(x, x).backward(dout);
  CHECK(x.grad().to_vector() == std::vector<float>{4, -8, 12});
  // One gradient fanned out to two nodes (a and b) that meet again at x.
  Variable a = identity(x), b = identity(x);
  plus(plus(a, b), a).backward(dout);
  CHECK(x.grad().to_vector() == std::vector<float>{7, -14, 21});
  CHECK(dout.to_vector() == d);
}

TEST_CASE("a node offered the sum waiting at its input adds its gradient into it") {
  // x = identity... of a leaf, so that x's gradients meet at a node: the first to arrive waits
  // as a sum, and the node making the next may add its own into it in place.
  using Offer = Node::SumOffer;
  const std::vector<float> d = {1, -2, 3};
  const Tensor dout = Tensor::from_vector(d, {3});
  for (Offer mode : {Offer::separate, Offer::after_reading}) {
    CAPTURE(static_cast<int>(mode));
    Variable x0(Tensor::from_vector({1, 2, 3}, {3}), true);
    // plus hands one gradient to x and to the node: the sum is the node's own g, offered only
    // to a node that reads g before it writes.
    int offers = 0;
    Variable x = scale(x0, 1.0f);
    total(plus(x, scale_adding(x, 3.0f, mode, &offers))).backward();
    CHECK(offers == (mode == Offer::after_reading ? 1 : 0));
    CHECK(x0.grad().to_vector() == std::vector<float>{4, 4, 4});
    // A node between: the sum is held by nothing else, offered in both modes.
    offers = 0;
    x0.zero_grad();
    x = scale(x0, 1.0f);
    total(plus(x, scale(scale_adding(x, 3.0f, mode, &offers), 2.0f))).backward();
    CHECK(offers == 1);
    CHECK(x0.grad().to_vector() == std::vector<float>{7, 7, 7});
    // The sum is the caller's gradient, which must stay as it is: no offer.
    offers = 0;
    x0.zero_grad();
    x = identity(x0);
    plus(x, scale(scale_adding(x, 3.0f, mode, &offers), 2.0f)).backward(dout);
    CHECK(offers == 0);
    CHECK(x0.grad().to_vector() == std::vector<float>{7, -14, 21});
    CHECK(dout.to_vector() == d);
  }
}

TEST_CASE("leaves stacked in one storage take their parts of concat's gradient as views") {
  // concat of row blocks laid side by side is a view, and its gradient's parts go to the
  // leaves without copies when nothing else holds that gradient; later passes add into each
  // part in place without touching the others.
  const Tensor stacked = Tensor::from_vector({1, 2, 3, 4, 5}, {5});
  Variable a(stacked.rows(0, 2), true), b(stacked.rows(2, 5), true);
  const Variable ab = concat({a, b}, 0);
  CHECK(ab.data().shares_storage(stacked));
  total(square(ab)).backward();  // 2 x, made anew by square's backward
  CHECK(a.grad().shares_storage(b.grad()));
  CHECK(a.grad().to_vector() == std::vector<float>{2, 4});
  CHECK(b.grad().to_vector() == std::vector<float>{6, 8, 10});
  total(square(concat({a, b}, 0))).backward();
  CHECK(a.grad().to_vector() == std::vector<float>{4, 8});
  CHECK(b.grad().to_vector() == std::vector<float>{12, 16, 20});
  // The caller's own gradient is held elsewhere: its parts are copied, and it stays as it was.
  const std::vector<float> d = {1, -2, 3, -4, 5};
  const Tensor dout = Tensor::from_vector(d, {5});
  // Leaves in separate storages: concat copies (its gradient's parts still go out as views).
  Variable f(stacked.clone().rows(0, 2), true), e(Tensor::from_vector({1, 1, 1}, {3}), true);
  a.zero_grad();
  b.zero_grad();
  concat({a, b}, 0).backward(dout);
  concat({a, b}, 0).backward(dout);
  CHECK(a.grad().to_vector() == std::vector<float>{2, -4});
  CHECK(b.grad().to_vector() == std::vector<float>{6, -8, 10});
  CHECK(dout.to_vector() == d);
  const Variable fe = concat({f, e}, 0);
  CHECK_FALSE(fe.data().shares_storage(f.data()));
  total(square(fe)).backward();
  CHECK(f.grad().to_vector() == std::vector<float>{2, 4});
  CHECK(e.grad().to_vector() == std::vector<float>{2, 2, 2});
}

TEST_CASE("backward with an explicit upstream gradient") {
  Variable x(Tensor::from_vector({1, 2, 3}, {3}), true);
  square(x).backward(Tensor::from_vector({1, 0, -1}, {3}));
  CHECK(x.grad().to_vector() == std::vector<float>{2, 0, -6});
}

TEST_CASE("inputs that do not require grad get no gradient and cost no node") {
  Variable a(Tensor::from_vector({1, 2}, {2}), true);
  Variable b(Tensor::from_vector({3, 4}, {2}), false);
  Variable y = plus(a, b);
  total(y).backward();
  CHECK(a.grad().to_vector() == std::vector<float>{1, 1});
  CHECK_FALSE(b.grad().defined());
  Variable c = plus(b, b);
  CHECK_FALSE(c.requires_grad());
  CHECK(c.is_leaf());
}

TEST_CASE("NoGradGuard records nothing; detach cuts history") {
  Variable x(Tensor::from_vector({2}, {1}), true);
  {
    NoGradGuard guard;
    CHECK_FALSE(grad_enabled());
    Variable y = square(x);
    CHECK_FALSE(y.requires_grad());
    CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("does not require grad"), Error);
  }
  CHECK(grad_enabled());
  Variable y = square(x);
  Variable d = y.detach();
  CHECK(d.is_leaf());
  CHECK_FALSE(d.requires_grad());
  CHECK(d.data().shares_storage(y.data()));
}

TEST_CASE("the graph is freed by backward; a second backward says so") {
  Variable x(Tensor::from_vector({1, 2}, {2}), true);
  Variable y = total(square(x));
  y.backward();
  CHECK_THROWS_WITH_AS(y.backward(), doctest::Contains("already used by a backward()"), Error);
}

TEST_CASE("backward errors name the problem") {
  Variable x(Tensor::from_vector({1, 2}, {2}), true);
  CHECK_THROWS_WITH_AS(square(x).backward(), doctest::Contains("must have one element"), Error);
  CHECK_THROWS_WITH_AS(square(x).backward(Tensor::zeros({3})),
                       doctest::Contains("gradient must be an f32 tensor of the variable's shape"),
                       Error);
  Variable bad = attach(Tensor::zeros({2}), std::make_shared<BrokenNode>(), {&x});
  CHECK_THROWS_WITH_AS(bad.backward(Tensor::zeros({2})),
                       doctest::Contains("broken produced a gradient of shape (7,)"), Error);
  CHECK_THROWS_WITH_AS(Variable(Tensor::zeros({2}, DType::i32), true),
                       doctest::Contains("only f32 tensors can require grad"), Error);
  CHECK_THROWS_WITH_AS(square(x).set_requires_grad(false), doctest::Contains("only leaves"), Error);
}

TEST_CASE("deep graphs: backward and destruction need no recursion") {
  const int depth = 200000;
  Variable x(Tensor::from_vector({1.0f}, {1}), true);
  Variable y = x;
  for (int i = 0; i < depth; ++i) y = scale(y, 1.0f);
  total(y).backward();
  CHECK(x.grad().to_vector() == std::vector<float>{1.0f});
  // Dropped without backward: the destructor must not recurse either.
  Variable z = x;
  for (int i = 0; i < depth; ++i) z = scale(z, 1.0f);
  z = Variable();
  CHECK(true);
}

TEST_CASE("memory returns to the baseline after backward and after the graph is dropped") {
  Variable x(Tensor::full({256, 256}, 0.5f), true);
  const int64_t baseline = memory_stats(Device::cpu).live_bytes;
  {
    Variable y = total(square(scale(square(x), 2.0f)));
    CHECK(memory_stats(Device::cpu).live_bytes > baseline);  // saved tensors are alive
    y.backward();
  }
  // Only the leaf's new gradient remains.
  CHECK(memory_stats(Device::cpu).live_bytes == baseline + 256 * 256 * 4);
  x.zero_grad();
  CHECK(memory_stats(Device::cpu).live_bytes == baseline);
  {
    Variable y = total(square(scale(square(x), 2.0f)));
  }  // dropped without backward
  CHECK(memory_stats(Device::cpu).live_bytes == baseline);
}

TEST_CASE("gradcheck passes a correct backward and catches a wrong one") {
  Tensor x = Tensor::from_vector({0.5f, -1.5f, 2.0f, 0.25f}, {2, 2});
  auto right = [](const std::vector<Variable>& in) { return square(in[0]); };
  auto wrong = [](const std::vector<Variable>& in) { return square(in[0], 2.1f); };  // 5% off
  GradcheckResult ok = gradcheck(right, {x});
  CHECK_MESSAGE(ok.ok, ok.message);
  GradcheckResult caught = gradcheck(wrong, {x});
  CHECK_FALSE(caught.ok);
  CHECK(caught.message.find("input 0") != std::string::npos);
  MESSAGE("gradcheck on a 5% wrong backward: " << caught.message);
  // A wrong sign on one input of two is caught too.
  auto two = [](const std::vector<Variable>& in) { return plus(square(in[0]), scale(in[1], 3.0f)); };
  CHECK(gradcheck(two, {x, x}).ok);
}
