// Tensor basics: factories, views that share storage, copies, memory statistics.
#include "check.h"
#include "core/error.h"
#include "core/cuda/cuda.h"
#include "core/tensor.h"

using namespace clustr;

TEST_CASE("factories fill and report shape, dtype, device") {
  Tensor z = Tensor::zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.numel() == 6);
  CHECK(z.rank() == 2);
  CHECK(z.size(-1) == 3);
  CHECK(z.dtype() == DType::f32);
  CHECK(z.device() == Device::cpu);
  CHECK(z.to_vector() == std::vector<float>(6, 0.0f));
  CHECK(Tensor::full({4}, 2.5f).to_vector() == std::vector<float>(4, 2.5f));
  Tensor s = Tensor::scalar(7.0f);
  CHECK(s.rank() == 0);
  CHECK(s.item() == 7.0f);
  Tensor i = Tensor::from_int_vector({3, -1, 4}, {3});
  CHECK(i.dtype() == DType::i32);
  CHECK(i.to_int_vector() == std::vector<int32_t>{3, -1, 4});
  CHECK(Tensor::zeros({0, 5}).numel() == 0);
  CHECK(describe(z) == "f32 (2, 3) on cpu");
}

TEST_CASE("reshape and rows are views of the same storage") {
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor r = t.reshape({3, -1});
  CHECK(r.shape() == Shape{3, 2});
  CHECK(r.shares_storage(t));
  r.f32()[0] = 42.0f;
  CHECK(t.to_vector()[0] == 42.0f);

  Tensor row1 = t.rows(1, 2);
  CHECK(row1.shape() == Shape{1, 3});
  CHECK(row1.to_vector() == std::vector<float>{3, 4, 5});
  row1.fill(-1.0f);
  CHECK(t.to_vector() == std::vector<float>{42, 1, 2, -1, -1, -1});
  // A view of a view keeps the offset.
  CHECK(row1.reshape({3}).rows(1, 3).to_vector() == std::vector<float>{-1, -1});
}

TEST_CASE("adjacent_rows joins row blocks laid side by side, and nothing else") {
  const Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  const Tensor a = t.rows(0, 1), b = t.rows(1, 3), c = t.rows(3, 4);
  const Tensor abc = Tensor::adjacent_rows({a, b, c});
  REQUIRE(abc.defined());
  CHECK(abc.shape() == Shape{4, 2});
  CHECK(abc.shares_storage(t));
  CHECK(abc.to_vector() == t.to_vector());
  const Tensor bc = Tensor::adjacent_rows({b, c});
  REQUIRE(bc.defined());
  CHECK(bc.to_vector() == std::vector<float>{2, 3, 4, 5, 6, 7});
  // Out of order, with a gap, repeated, from another storage, another row shape or dtype, or
  // a single piece: no view.
  CHECK_FALSE(Tensor::adjacent_rows({b, a}).defined());
  CHECK_FALSE(Tensor::adjacent_rows({a, c}).defined());
  CHECK_FALSE(Tensor::adjacent_rows({a, a}).defined());
  CHECK_FALSE(Tensor::adjacent_rows({a, t.clone().rows(1, 2)}).defined());
  CHECK_FALSE(Tensor::adjacent_rows({a, t.reshape({8}).rows(2, 4)}).defined());
  CHECK_FALSE(Tensor::adjacent_rows({a}).defined());
  CHECK_FALSE(Tensor::adjacent_rows({a, Tensor()}).defined());
  const Tensor words = Tensor::from_int_vector({1, 2, 3, 4}, {4});
  CHECK(Tensor::adjacent_rows({words.rows(0, 1), words.rows(1, 4)}).to_int_vector() ==
        words.to_int_vector());
}

TEST_CASE("clone and copy_from are deep copies") {
  Tensor t = Tensor::from_vector({1, 2, 3}, {3});
  Tensor c = t.clone();
  CHECK_FALSE(c.shares_storage(t));
  c.fill(0.0f);
  CHECK(t.to_vector() == std::vector<float>{1, 2, 3});
  Tensor d = Tensor::zeros({3});
  d.copy_from(t);
  CHECK(d.to_vector() == std::vector<float>{1, 2, 3});
  CHECK(t.to(Device::cpu).to_vector() == std::vector<float>{1, 2, 3});
}

TEST_CASE("memory statistics count live bytes and return to the baseline") {
  MemoryStats before = memory_stats(Device::cpu);
  {
    Tensor a = Tensor::empty({1000});
    Tensor view = a.reshape({10, 100});  // a view allocates nothing
    MemoryStats during = memory_stats(Device::cpu);
    CHECK(during.live_bytes == before.live_bytes + 4000);
    CHECK(during.peak_bytes >= during.live_bytes);
    CHECK(during.allocations == before.allocations + 1);
  }
  CHECK(memory_stats(Device::cpu).live_bytes == before.live_bytes);
  reset_peak_memory(Device::cpu);
  CHECK(memory_stats(Device::cpu).peak_bytes == before.live_bytes);
}

TEST_CASE("tensor misuse gives clear errors") {
  Tensor t = Tensor::zeros({2, 3});
  CHECK_THROWS_WITH_AS(t.reshape({4, 2}), doctest::Contains("cannot reshape (2, 3)"), Error);
  CHECK_THROWS_WITH_AS(t.reshape({-1, -1}), doctest::Contains("more than one -1"), Error);
  CHECK_THROWS_WITH_AS(t.reshape({5, -1}), doctest::Contains("cannot reshape"), Error);
  CHECK_THROWS_WITH_AS(t.rows(1, 3), doctest::Contains("outside axis 0"), Error);
  CHECK_THROWS_WITH_AS(t.i32(), doctest::Contains("is not i32"), Error);
  CHECK_THROWS_WITH_AS(t.item(), doctest::Contains("exactly one element"), Error);
  CHECK_THROWS_WITH_AS(t.size(2), doctest::Contains("axis 2 is out of range"), Error);
  CHECK_THROWS_WITH_AS(Tensor::from_vector({1, 2, 3}, {2, 2}),
                       doctest::Contains("3 values do not fill shape (2, 2)"), Error);
  CHECK_THROWS_WITH_AS(Tensor::empty({2, -3}), doctest::Contains("negative size"), Error);
  Tensor d = Tensor::zeros({3, 2});
  CHECK_THROWS_WITH_AS(d.copy_from(t), doctest::Contains("differ in shape"), Error);
  CHECK_THROWS_WITH_AS(Tensor().f32(), doctest::Contains("undefined"), Error);
}

TEST_CASE("cuda tensors without a usable GPU fail with a clear message") {
  if (cuda::available()) return;  // covered by the cuda test suite
  CHECK_THROWS_AS(Tensor::zeros({2}, DType::f32, Device::cuda), Error);
  CHECK_THROWS_AS(Tensor::zeros({2}).to(Device::cuda), Error);
}
