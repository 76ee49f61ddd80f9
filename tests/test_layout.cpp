// Layout ops against index arithmetic: permute of rank 4 under every permutation (block-copy and
// tiled paths), size-1 axes, i32 data, transposes of non-square matrices through the tiled path;
// gather_rows and scatter_add_rows_ with repeated indices; thread-count independence; errors.
#include <algorithm>
#include <initializer_list>
#include <numeric>
#include <random>
#include <vector>

#include "check.h"
#include "core/ops.h"

using namespace clustr;
using namespace clustr::test;

namespace {

std::vector<int32_t> random_indices(int64_t n, int32_t V, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, V - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = dist(rng);
  return v;
}

// y[j] = x[i] where the multi-index of j in the output is the multi-index of i in the input,
// reordered by perm: out_idx[d] = in_idx[perm[d]].
template <class T>
std::vector<T> ref_permute(const std::vector<T>& x, const Shape& s, const std::vector<int>& perm) {
  const size_t r = s.size();
  Shape out(r);
  for (size_t d = 0; d < r; ++d) out[d] = s[perm[d]];
  const std::vector<int64_t> in_strides = contiguous_strides(s);
  std::vector<T> y(x.size());
  for (int64_t j = 0; j < static_cast<int64_t>(y.size()); ++j) {
    int64_t rem = j, i = 0;
    for (size_t d = r; d-- > 0;) {
      i += (rem % out[d]) * in_strides[perm[d]];
      rem /= out[d];
    }
    y[j] = x[i];
  }
  return y;
}

// Every permutation of x's axes against the reference; permute is a copy, so exact.
void check_all_perms(const Shape& s, uint32_t seed) {
  const std::vector<float> v = random_values(numel(s), seed);
  const Tensor x = Tensor::from_vector(v, s);
  std::vector<int> perm(s.size());
  std::iota(perm.begin(), perm.end(), 0);
  do {
    Shape want_shape(s.size());
    for (size_t d = 0; d < s.size(); ++d) want_shape[d] = s[perm[d]];
    const Tensor y = permute(x, perm);
    INFO("shape ", to_string(s), " perm ", perm[0], perm.size() > 1 ? perm[1] : -1,
         perm.size() > 2 ? perm[2] : -1, perm.size() > 3 ? perm[3] : -1);
    CHECK(y.shape() == want_shape);
    CHECK(y.to_vector() == ref_permute(v, s, perm));
  } while (std::next_permutation(perm.begin(), perm.end()));
}

}  // namespace

TEST_CASE("permute of rank 4 matches index arithmetic under every permutation") {
  check_all_perms({2, 3, 4, 5}, 1);
  check_all_perms({1, 3, 1, 5}, 2);   // size-1 axes are dropped before planning
  check_all_perms({3, 1, 40, 37}, 3);  // tiles that do not divide the sizes
  check_all_perms({7}, 4);
  check_all_perms({}, 5);
}

TEST_CASE("permute of large tensors: block copies and tiled transposes with a batch") {
  check_all_perms({4, 64, 9, 17}, 6);  // 39168 words: the parallel paths
  check_all_perms({8, 40, 130}, 7);
}

TEST_CASE("permute moves i32 data unchanged") {
  std::vector<int32_t> v(2 * 3 * 4);
  std::iota(v.begin(), v.end(), -5);
  const Tensor x = Tensor::from_int_vector(v, {2, 3, 4});
  const Tensor y = permute(x, {2, 0, 1});
  CHECK(y.dtype() == DType::i32);
  CHECK(y.shape() == Shape{4, 2, 3});
  CHECK(y.to_int_vector() == ref_permute(v, {2, 3, 4}, {2, 0, 1}));
  CHECK(permute(x, {-1, 0, 1}).to_int_vector() == y.to_int_vector());  // negative axes
}

TEST_CASE("transpose of non-square matrices goes through the tiled path") {
  for (Shape s : {Shape{129, 67}, Shape{67, 129}, Shape{1, 300}, Shape{33, 1}, Shape{300, 2}}) {
    const std::vector<float> v = random_values(numel(s), 10);
    const Tensor x = Tensor::from_vector(v, s);
    const Tensor y = transpose(x, 0, 1);
    CHECK(y.shape() == Shape{s[1], s[0]});
    std::vector<float> want(v.size());
    for (int64_t i = 0; i < s[0]; ++i)
      for (int64_t j = 0; j < s[1]; ++j) want[j * s[0] + i] = v[i * s[1] + j];
    CHECK(y.to_vector() == want);
    CHECK(transpose(y, -1, -2).to_vector() == v);  // and back
  }
  const Shape s = {3, 129, 67};
  const std::vector<float> v = random_values(numel(s), 11);
  const Tensor x = Tensor::from_vector(v, s);
  CHECK(transpose(x, 1, 2).to_vector() == ref_permute(v, s, {0, 2, 1}));
  CHECK(transpose(x, 0, 2).to_vector() == ref_permute(v, s, {2, 1, 0}));
  CHECK(transpose(x, 1, 1).to_vector() == v);
}

TEST_CASE("permute and transpose reject bad permutations with a clear message") {
  const Tensor x = Tensor::zeros({2, 3, 4});
  CHECK_ERROR(permute(x, {0, 0, 1}), "permute", "[0, 0, 1]", "(2, 3, 4)", "exactly once");
  CHECK_ERROR(permute(x, {0, 1}), "permute", "[0, 1]", "(2, 3, 4)", "rank 3");
  CHECK_ERROR(permute(x, {0, 1, 3}), "permute", "[0, 1, 3]", "(2, 3, 4)");
  CHECK_ERROR(permute(x, {0, 1, -4}), "permute", "[0, 1, -4]");
  CHECK_ERROR(transpose(x, 0, 3), "transpose", "axis 3", "rank 3");
  CHECK_ERROR(permute(Tensor(), {}), "permute", "undefined");
}

TEST_CASE("gather_rows looks up rows, repeated indices included") {
  const int64_t V = 5, D = 3;
  const std::vector<float> tv = random_values(V * D, 20);
  const Tensor table = Tensor::from_vector(tv, {V, D});
  const std::vector<int32_t> idx = {4, 0, 4, 2, 2, 1};
  const Tensor out = gather_rows(table, Tensor::from_int_vector(idx, {2, 3}));
  CHECK(out.shape() == Shape{2, 3, D});
  std::vector<float> want;
  for (int32_t i : idx) want.insert(want.end(), tv.begin() + i * D, tv.begin() + (i + 1) * D);
  CHECK(out.to_vector() == want);
  // A scalar-shaped index gives one row of shape (D,); an empty index gives (0, D).
  const Tensor one = gather_rows(table, Tensor::from_int_vector(std::vector<int32_t>{3}, {}));
  CHECK(one.shape() == Shape{D});
  CHECK(one.to_vector() == std::vector<float>(tv.begin() + 3 * D, tv.begin() + 4 * D));
  CHECK(gather_rows(table, Tensor::zeros({0}, DType::i32)).shape() == Shape{0, D});
}

TEST_CASE("gather_rows adds a table of rows broadcast over the index's leading axes") {
  // index (2, 3), added (3, D): y[b, p] = table[index[b, p]] + added[p], the bits of the lookup
  // then add.
  const int64_t V = 5, D = 3;
  const Tensor table = Tensor::from_vector(random_values(V * D, 21), {V, D});
  const Tensor added = Tensor::from_vector(random_values(3 * D, 22), {3, D});
  const Tensor index = Tensor::from_int_vector(std::vector<int32_t>{4, 0, 4, 2, 2, 1}, {2, 3});
  const Tensor out = gather_rows(table, index, added);
  CHECK(out.shape() == Shape{2, 3, D});
  CHECK(out.to_vector() == add(gather_rows(table, index), added).to_vector());
  CHECK_ERROR(gather_rows(table, index, Tensor::zeros({2, D})), "gather_rows",
              "added of shape (P, D) = (3, 3)", "(2, 3)");
  CHECK_ERROR(gather_rows(table, index, Tensor::zeros({3, D}, DType::i32)), "gather_rows",
              "added", "f32");
  CHECK_ERROR(gather_rows(table, Tensor::from_int_vector(std::vector<int32_t>{3}, {}),
                          Tensor::zeros({1, D})),
              "gather_rows", "added of shape");
}

TEST_CASE("gather_rows reports the first index out of range, where it is and what it is") {
  const Tensor table = Tensor::zeros({5, 3});
  const Tensor bad = Tensor::from_int_vector(std::vector<int32_t>{0, 1, 2, 3, 4, 5}, {2, 3});
  CHECK_ERROR(gather_rows(table, bad), "gather_rows", "index[1, 2] = 5", "[0, 5)", "(5, 3)");
  const Tensor negative = Tensor::from_int_vector(std::vector<int32_t>{0, -1, -7}, {3});
  CHECK_ERROR(gather_rows(table, negative), "gather_rows", "index[1] = -1", "[0, 5)");
  CHECK_ERROR(gather_rows(table, Tensor::zeros({2})), "gather_rows", "i32", "f32 (2,)");
  CHECK_ERROR(gather_rows(Tensor::zeros({15}), bad), "gather_rows", "rank 2", "(15,)");
}

TEST_CASE("scatter_add_rows_ accumulates repeated indices in index order") {
  const int64_t V = 4, D = 5;
  const std::vector<float> t0 = random_values(V * D, 30);
  const std::vector<int32_t> idx = {1, 3, 1, 1, 0, 3};
  const std::vector<float> sv = random_values(6 * D, 31);
  Tensor table = Tensor::from_vector(t0, {V, D});
  scatter_add_rows_(table, Tensor::from_int_vector(idx, {2, 3}),
                    Tensor::from_vector(sv, {2, 3, D}));
  // The same float additions in the same order: exact.
  std::vector<float> want = t0;
  for (size_t i = 0; i < idx.size(); ++i)
    for (int64_t c = 0; c < D; ++c) want[idx[i] * D + c] += sv[i * D + c];
  CHECK(table.to_vector() == want);
  CHECK(want[2 * D] == t0[2 * D]);  // row 2 is never indexed and is left alone
}

TEST_CASE("scatter_add_rows_ checks shapes and indices") {
  Tensor table = Tensor::zeros({4, 5});
  const Tensor idx = Tensor::from_int_vector(std::vector<int32_t>{0, 1, 2}, {3});
  CHECK_ERROR(scatter_add_rows_(table, idx, Tensor::zeros({3, 4})), "scatter_add_rows_",
              "(3, 5)", "f32 (3, 4)");
  CHECK_ERROR(scatter_add_rows_(table, idx, Tensor::zeros({5})), "scatter_add_rows_", "(3, 5)",
              "(5,)");
  const Tensor bad = Tensor::from_int_vector(std::vector<int32_t>{0, 4, 9}, {3});
  CHECK_ERROR(scatter_add_rows_(table, bad, Tensor::zeros({3, 5})), "scatter_add_rows_",
              "index[1] = 4", "[0, 4)");
  CHECK(table.to_vector() == std::vector<float>(20, 0.0f));  // nothing written on failure
}

TEST_CASE("gather and scatter results do not depend on the thread count") {
  struct Case {
    int64_t V, D, n;
  };
  // Many rows (each thread owns a range of rows), and fewer rows than threads with wide rows
  // (each thread owns a range of columns).
  for (Case c : {Case{1000, 64, 3000}, Case{1, 40000, 7}, Case{3, 20000, 9}}) {
    const std::vector<float> t0 = random_values(c.V * c.D, 40);
    const std::vector<int32_t> idx = random_indices(c.n, static_cast<int32_t>(c.V), 41);
    const Tensor index = Tensor::from_int_vector(idx, {c.n});
    const Tensor src = Tensor::from_vector(random_values(c.n * c.D, 42), {c.n, c.D});
    auto run = [&](int threads) {
      ThreadCount tc(threads);
      Tensor table = Tensor::from_vector(t0, {c.V, c.D});
      scatter_add_rows_(table, index, src);
      std::vector<float> out = table.to_vector();
      const std::vector<float> g = gather_rows(table, index).to_vector();
      out.insert(out.end(), g.begin(), g.end());
      return out;
    };
    const std::vector<float> one = run(1);
    CHECK(one == run(2));
    CHECK(one == run(3));
  }
  const Tensor x = Tensor::from_vector(random_values(6 * 70 * 130, 43), {6, 70, 130});
  std::vector<float> one, two;
  {
    ThreadCount tc(1);
    one = permute(x, {2, 0, 1}).to_vector();
  }
  {
    ThreadCount tc(2);
    two = permute(x, {2, 0, 1}).to_vector();
  }
  CHECK(one == two);
}
