// The Philox generator: reproducible per seed, independent of the thread count, and with the
// distributions it claims (moments checked at several standard errors).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "check.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/random.h"

using namespace clustr;
using namespace clustr::test;

namespace {

std::vector<float> draw(void (*fill)(Tensor&, Generator&), uint64_t seed, int threads, int64_t n) {
  ThreadCount tc(threads);
  Generator gen(seed);
  Tensor t = Tensor::empty({n});
  fill(t, gen);
  return t.to_vector();
}

void fill_uniform(Tensor& t, Generator& g) { uniform_(t, g); }
void fill_normal(Tensor& t, Generator& g) { normal_(t, g); }
void fill_bernoulli(Tensor& t, Generator& g) { bernoulli_(t, g, 0.3f); }

double mean_of(const std::vector<float>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}
double var_of(const std::vector<float>& v) {
  double m = mean_of(v), s = 0;
  for (float x : v) s += (x - m) * (x - m);
  return s / static_cast<double>(v.size());
}

}  // namespace

TEST_CASE("Philox4x32-10 matches the published known-answer vectors") {
  // Random123 kat_vectors: philox4x32 10 rounds; counter 0, key 0 and counter/key all ones.
  // Our counter is (lo, hi, 0, 0), so only the all-zero vector applies directly.
  Philox4 r = philox4x32(0, 0);
  CHECK(r.v[0] == 0x6627e8d5u);
  CHECK(r.v[1] == 0xe169c58du);
  CHECK(r.v[2] == 0xbc57ac4cu);
  CHECK(r.v[3] == 0x9b00dbd8u);
}

TEST_CASE("same seed gives the same numbers at 1 and 2 threads; other seeds differ") {
  for (auto fill : {fill_uniform, fill_normal, fill_bernoulli}) {
    std::vector<float> a = draw(fill, 42, 1, 10001), b = draw(fill, 42, 2, 10001);
    CHECK(a == b);
    CHECK(draw(fill, 43, 2, 10001) != a);
  }
}

TEST_CASE("consecutive draws continue the stream instead of repeating it") {
  Generator gen(7);
  Tensor a = Tensor::empty({10}), b = Tensor::empty({10});
  uniform_(a, gen);
  uniform_(b, gen);
  CHECK(a.to_vector() != b.to_vector());
  CHECK(gen.offset() == 6);  // 3 blocks of 4 numbers for each fill of 10
  Generator again(7);
  again.set_state(7, 3);
  Tensor c = Tensor::empty({10});
  uniform_(c, again);
  CHECK(c.to_vector() == b.to_vector());
}

TEST_CASE("uniform, normal and bernoulli have the right moments") {
  const int64_t n = 200000;
  std::vector<float> u = draw(fill_uniform, 1, 2, n);
  CHECK(*std::min_element(u.begin(), u.end()) >= 0.0f);
  CHECK(*std::max_element(u.begin(), u.end()) < 1.0f);
  // Standard error of the mean: sqrt(var / n); allow 5 of them.
  CHECK(std::fabs(mean_of(u) - 0.5) < 5 * std::sqrt(1.0 / 12 / n));
  CHECK(std::fabs(var_of(u) - 1.0 / 12) < 0.002);
  std::vector<float> z = draw(fill_normal, 2, 2, n);
  CHECK(std::fabs(mean_of(z)) < 5 * std::sqrt(1.0 / n));
  CHECK(std::fabs(var_of(z) - 1.0) < 0.02);
  for (float x : z) REQUIRE(std::isfinite(x));
  std::vector<float> b = draw(fill_bernoulli, 3, 2, n);
  for (float x : b) REQUIRE((x == 0.0f || x == 1.0f));
  CHECK(std::fabs(mean_of(b) - 0.3) < 5 * std::sqrt(0.3 * 0.7 / n));
}

TEST_CASE("uniform with bounds and normal with mean and stddev") {
  Generator gen(5);
  Tensor t = Tensor::empty({50000});
  uniform_(t, gen, -3.0f, 5.0f);
  std::vector<float> v = t.to_vector();
  CHECK(*std::min_element(v.begin(), v.end()) >= -3.0f);
  CHECK(*std::max_element(v.begin(), v.end()) < 5.0f);
  normal_(t, gen, 10.0f, 0.5f);
  v = t.to_vector();
  CHECK(std::fabs(mean_of(v) - 10.0) < 0.02);
  CHECK(std::fabs(std::sqrt(var_of(v)) - 0.5) < 0.01);
}

TEST_CASE("randperm is a permutation, reproducible, and seed dependent") {
  Generator g1(11), g2(11), g3(12);
  std::vector<int32_t> p = randperm(1000, g1).to_int_vector();
  std::vector<int32_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int32_t i = 0; i < 1000; ++i) REQUIRE(sorted[i] == i);
  CHECK(randperm(1000, g2).to_int_vector() == p);
  CHECK(randperm(1000, g3).to_int_vector() != p);
  CHECK(randperm(0, g1).numel() == 0);
  CHECK(randperm(1, g1).to_int_vector() == std::vector<int32_t>{0});
}

TEST_CASE("random fills reject bad arguments") {
  Generator gen(1);
  Tensor i = Tensor::zeros({3}, DType::i32);
  CHECK_THROWS_WITH_AS(uniform_(i, gen), doctest::Contains("uniform_: expected an f32 tensor"), Error);
  Tensor f = Tensor::zeros({3});
  CHECK_THROWS_WITH_AS(bernoulli_(f, gen, 1.5f), doctest::Contains("outside [0, 1]"), Error);
  CHECK_THROWS_WITH_AS(randperm(-1, gen), doctest::Contains("randperm"), Error);
}
