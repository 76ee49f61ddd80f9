// Query clustering (layers/attention/clustering.h, the paper's sec. 3.2.2): planted groups are
// recovered exactly; a seed fixes the result, bit for bit at 1 and 2 threads on both parallel
// paths; padded queries get -1 and do not matter; edge cases (C = 1, C > N, N = 1, lengths 0,
// identical queries); counts agree with the assignment; the plain reference
// (layers/attention/reference.h) gives the same clusters from the same generator; the generator
// advances by the documented number of blocks; the Hamming-distance kernel that
// CLUSTR_HAMMING_KERNEL names runs (ctest runs the suite with each); argument errors.
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "check.h"
#include "layers/attention/clustering.h"
#include "layers/attention/reference.h"

using namespace clustr;
using clustr::test::random_tensor;
using clustr::test::random_values;

namespace {

Clustering run(const Tensor& Q, const Tensor& lengths, ClusteringOptions o, uint64_t seed) {
  Generator gen(seed);
  return cluster_queries(Q, lengths, o, gen);
}

// Every (b, h): counts match the assignment, valid queries get a cluster in [0, C), padded -1.
void check_consistent(const Clustering& c, const Tensor& Q, const std::vector<int32_t>& len,
                      int C) {
  const int64_t B = Q.size(0), H = Q.size(1), N = Q.size(2);
  REQUIRE(c.assignment.shape() == Shape{B, H, N});
  REQUIRE(c.counts.shape() == Shape{B, H, C});
  std::vector<int32_t> a = c.assignment.to_int_vector(), n = c.counts.to_int_vector();
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t V = len.empty() ? N : len[static_cast<size_t>(bh / H)];
    std::vector<int32_t> tally(static_cast<size_t>(C), 0);
    for (int64_t i = 0; i < N; ++i) {
      int32_t k = a[static_cast<size_t>(bh * N + i)];
      if (i >= V) {
        CHECK_MESSAGE(k == -1, "padded query ", i, " of pair ", bh, " got cluster ", k);
        continue;
      }
      REQUIRE_MESSAGE((k >= 0 && k < C), "query ", i, " of pair ", bh, " got cluster ", k);
      ++tally[static_cast<size_t>(k)];
    }
    for (int k = 0; k < C; ++k) CHECK(n[static_cast<size_t>(bh * C + k)] == tally[static_cast<size_t>(k)]);
  }
}

// Q (B, H, N, E): query i of every (b, h) is centre[group(i)] + small noise; groups are
// interleaved so that no contiguous range is one group.
int group_of(int64_t i) { return static_cast<int>((i % 4) ^ ((i / 4) % 4)); }
Tensor planted(int64_t B, int64_t H, int64_t N, int64_t E, uint32_t seed) {
  std::vector<float> centres = random_values(B * H * 4 * E, seed, -2.0f, 2.0f);
  std::vector<float> q = random_values(B * H * N * E, seed + 1, -0.02f, 0.02f);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t e = 0; e < E; ++e)
        q[static_cast<size_t>((bh * N + i) * E + e)] +=
            centres[static_cast<size_t>((bh * 4 + group_of(i)) * E + e)];
  return Tensor::from_vector(q, {B, H, N, E});
}

}  // namespace

TEST_CASE("planted groups of queries are recovered exactly (C = 4, several seeds)") {
  const int64_t B = 2, H = 3, N = 64, E = 16;
  Tensor Q = planted(B, H, N, E, 11);
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    Clustering c = run(Q, Tensor(), {4, 63, 10}, seed);
    check_consistent(c, Q, {}, 4);
    std::vector<int32_t> a = c.assignment.to_int_vector();
    for (int64_t bh = 0; bh < B * H; ++bh) {
      std::vector<int32_t> cluster_of_group(4, -1);
      std::set<int32_t> used;
      for (int64_t i = 0; i < N; ++i) {
        int32_t k = a[static_cast<size_t>(bh * N + i)];
        int32_t& g = cluster_of_group[static_cast<size_t>(group_of(i))];
        if (g < 0) g = k, used.insert(k);
        CHECK_MESSAGE(g == k, "seed ", seed, " pair ", bh, ": group ", group_of(i),
                      " split between clusters ", g, " and ", k);
      }
      CHECK_MESSAGE(used.size() == 4u, "seed ", seed, " pair ", bh, ": groups merged");
    }
    for (int32_t n : c.counts.to_int_vector()) CHECK(n == 16);
  }
}

TEST_CASE("a seed fixes the result, identical at 1 and 2 threads; other seeds differ") {
  // (B H = 6 pairs: parallel over pairs) and (one pair, N = 300 and 9000: parallel inside the
  // pair; 9000 spans several pieces of the loops over queries and is long enough for a shared
  // seeding, and many clusters make the seeding walk across pieces).
  for (Shape shape : {Shape{2, 3, 40, 8}, Shape{1, 1, 300, 8}, Shape{1, 1, 9000, 8}}) {
    INFO("Q shape (", shape[0], ", ", shape[1], ", ", shape[2], ", ", shape[3], ")");
    Tensor Q = random_tensor(shape, 3);
    Tensor lengths = Tensor::from_int_vector(
        shape[0] == 2 ? std::vector<int32_t>{37, 40}
                      : std::vector<int32_t>{static_cast<int32_t>(shape[2]) - 9},
        {shape[0]});
    ClusteringOptions o{shape[2] == 9000 ? 120 : 10, 63, 10};
    Clustering one, two;
    {
      clustr::test::ThreadCount threads(1);
      one = run(Q, lengths, o, 42);
    }
    {
      clustr::test::ThreadCount threads(2);
      two = run(Q, lengths, o, 42);
    }
    Clustering again = run(Q, lengths, o, 42);
    CHECK(one.assignment.to_int_vector() == two.assignment.to_int_vector());
    CHECK(one.counts.to_int_vector() == two.counts.to_int_vector());
    CHECK(one.assignment.to_int_vector() == again.assignment.to_int_vector());
    check_consistent(one, Q, lengths.to_int_vector(), o.clusters);
    Clustering other = run(Q, lengths, o, 43);
    CHECK(one.assignment.to_int_vector() != other.assignment.to_int_vector());
  }
}

TEST_CASE("padded queries get -1 and their content changes nothing") {
  const int64_t B = 2, H = 2, N = 20, E = 6;
  Tensor Q = random_tensor({B, H, N, E}, 5);
  Tensor lengths = Tensor::from_int_vector({13, 20}, {B});
  ClusteringOptions o{5, 31, 10};
  Clustering c = run(Q, lengths, o, 7);
  check_consistent(c, Q, {13, 20}, 5);
  Tensor Q2 = Q.clone();
  std::vector<float> noise = random_values(N * E, 99, -50.0f, 50.0f);
  float* p = Q2.f32();
  for (int64_t h = 0; h < H; ++h)  // rows 13..19 of batch 0
    for (int64_t i = 13; i < N; ++i)
      for (int64_t e = 0; e < E; ++e) p[(h * N + i) * E + e] = noise[static_cast<size_t>(i * E + e)];
  Clustering c2 = run(Q2, lengths, o, 7);
  CHECK(c.assignment.to_int_vector() == c2.assignment.to_int_vector());
  CHECK(c.counts.to_int_vector() == c2.counts.to_int_vector());
}

TEST_CASE("edge cases: C = 1, C > N, N = 1, lengths 0, identical queries, iterations 0") {
  Tensor Q = random_tensor({1, 2, 5, 4}, 8);
  SUBCASE("C = 1: everyone in cluster 0") {
    Clustering c = run(Q, Tensor(), {1, 63, 10}, 1);
    CHECK(c.assignment.to_int_vector() == std::vector<int32_t>(10, 0));
    CHECK(c.counts.to_int_vector() == std::vector<int32_t>{5, 5});
  }
  SUBCASE("C > N: one cluster per (distinct) query, the rest empty") {
    Clustering c = run(Q, Tensor(), {8, 63, 10}, 1);
    check_consistent(c, Q, {}, 8);
    std::vector<int32_t> n = c.counts.to_int_vector();
    for (int64_t bh = 0; bh < 2; ++bh)
      for (int64_t k = 0; k < 8; ++k) CHECK(n[static_cast<size_t>(bh * 8 + k)] == (k < 5 ? 1 : 0));
  }
  SUBCASE("N = 1") {
    Tensor q1 = random_tensor({2, 1, 1, 3}, 9);
    Clustering c = run(q1, Tensor(), {3, 63, 10}, 1);
    CHECK(c.assignment.to_int_vector() == std::vector<int32_t>{0, 0});
    CHECK(c.counts.to_int_vector() == std::vector<int32_t>{1, 0, 0, 1, 0, 0});
  }
  SUBCASE("lengths 0: no valid query") {
    Clustering c = run(Q, Tensor::from_int_vector({0}, {1}), {3, 63, 10}, 1);
    CHECK(c.assignment.to_int_vector() == std::vector<int32_t>(10, -1));
    CHECK(c.counts.to_int_vector() == std::vector<int32_t>(6, 0));
  }
  SUBCASE("identical queries: one cluster") {
    Tensor same = Tensor::full({1, 1, 7, 4}, 0.5f);
    Clustering c = run(same, Tensor(), {3, 63, 10}, 1);
    CHECK(c.assignment.to_int_vector() == std::vector<int32_t>(7, 0));
    CHECK(c.counts.to_int_vector() == std::vector<int32_t>{7, 0, 0});
  }
  SUBCASE("iterations 0 and 1 bit still give a consistent result") {
    Tensor big = random_tensor({2, 1, 50, 4}, 10);
    Clustering c = run(big, Tensor::from_int_vector({50, 17}, {2}), {6, 1, 0}, 1);
    check_consistent(c, big, {50, 17}, 6);
  }
}

TEST_CASE("cluster_queries is the plain reference of sec. 3.2.2, at 1 and 2 threads") {
  struct Shape4 {
    int64_t B, H, N, E;
    int C, bits, iterations;
    std::vector<int32_t> lengths;
  };
  // Both paths of the threads (over pairs; inside one pair from N = 256), lengths, C > N,
  // few bits (ties), no Lloyd round, identical queries (fewer distinct codes than C).
  const std::vector<Shape4> shapes = {{2, 3, 17, 8, 4, 63, 10, {17, 5}},
                                      {1, 1, 700, 16, 30, 63, 10, {}},
                                      {2, 1, 300, 5, 9, 7, 3, {300, 0}},
                                      {1, 2, 5, 4, 8, 63, 10, {}},
                                      {1, 1, 64, 3, 5, 63, 0, {}}};
  uint32_t seed = 3;
  for (const Shape4& c : shapes) {
    INFO("(B, H, N, E) = (", c.B, ", ", c.H, ", ", c.N, ", ", c.E, "), C = ", c.C,
         ", bits = ", c.bits, ", L = ", c.iterations);
    const Tensor Q = random_tensor({c.B, c.H, c.N, c.E}, seed++);
    const Tensor L =
        c.lengths.empty() ? Tensor() : Tensor::from_int_vector(c.lengths, {c.B});
    const ClusteringOptions o{c.C, c.bits, c.iterations};
    Generator g(77);
    const Clustering want = cluster_queries_reference(Q, L, o, g);
    for (int threads : {1, 2}) {
      const clustr::test::ThreadCount scope(threads);
      const Clustering got = run(Q, L, o, 77);
      CHECK(got.assignment.to_int_vector() == want.assignment.to_int_vector());
      CHECK(got.counts.to_int_vector() == want.counts.to_int_vector());
    }
  }
  // Identical queries: one distinct code, so one seeded cluster.
  const Tensor same = Tensor::full({1, 1, 9, 4}, 0.5f);
  Generator g(5);
  const Clustering one = cluster_queries_reference(same, Tensor(), {3, 63, 10}, g);
  CHECK(one.counts.to_int_vector() == std::vector<int32_t>{9, 0, 0});
  CHECK(one.assignment.to_int_vector() ==
        run(same, Tensor(), {3, 63, 10}, 5).assignment.to_int_vector());
}

TEST_CASE("the generator advances by the documented number of blocks") {
  Tensor Q = random_tensor({2, 3, 10, 5}, 4);
  Generator gen(1);
  cluster_queries(Q, Tensor::from_int_vector({3, 0}, {2}), {7, 13, 2}, gen);
  // ceil(K E / 4) planes + B H K thresholds + B H C seeding draws, whatever the lengths.
  CHECK(gen.offset() == static_cast<uint64_t>((13 * 5 + 3) / 4 + 6 * 13 + 6 * 7));
}

TEST_CASE("CLUSTR_HAMMING_KERNEL picks the Hamming-distance kernel it names") {
  // ctest runs this suite again with CLUSTR_HAMMING_KERNEL=popcnt and =generic
  // (tests/CMakeLists.txt); the suite's other cases then check that kernel's clusters.
  const char* forced = std::getenv("CLUSTR_HAMMING_KERNEL");
  const std::string name = hamming_kernel_name();
  if (forced && *forced) {
    CHECK(name == forced);
    return;
  }
  // Unforced: the widest this CPU has.
#if defined(__x86_64__) && defined(__GNUC__)
  const char* widest = __builtin_cpu_supports("avx512f") &&
                               __builtin_cpu_supports("avx512vpopcntdq")
                           ? "avx512"
                       : __builtin_cpu_supports("popcnt") ? "popcnt"
                                                          : "generic";
#else
  const char* widest = "generic";
#endif
  CHECK(name == widest);
}

TEST_CASE("cluster_queries rejects bad arguments with clear messages") {
  Tensor Q = random_tensor({2, 1, 4, 3}, 1);
  Generator gen(0);
  CHECK_ERROR(cluster_queries(Q.reshape({2, 4, 3}), Tensor(), {}, gen), "cluster_queries",
              "(B, H, N, E)");
  CHECK_ERROR(cluster_queries(Tensor::zeros({2, 1, 4, 3}, DType::i32), Tensor(), {}, gen),
              "cluster_queries", "expected Q to be f32");
  CHECK_ERROR(cluster_queries(Tensor::zeros({2, 1, 4, 0}), Tensor(), {}, gen), "E >= 1");
  CHECK_ERROR(cluster_queries(Q, Tensor(), {0, 63, 10}, gen), "clusters >= 1, got 0");
  CHECK_ERROR(cluster_queries(Q, Tensor(), {4, 0, 10}, gen), "bits in [1, 63]", "got 0");
  CHECK_ERROR(cluster_queries(Q, Tensor(), {4, 64, 10}, gen), "bits in [1, 63]", "got 64");
  CHECK_ERROR(cluster_queries(Q, Tensor(), {4, 63, -1}, gen), "iterations >= 0, got -1");
  CHECK_ERROR(cluster_queries(Q, Tensor::from_int_vector({4}, {1}), {}, gen),
              "lengths of shape (2,)");
  CHECK_ERROR(cluster_queries(Q, Tensor::from_int_vector({4, 5}, {2}), {}, gen),
              "lengths[1] = 5", "[0, N = 4]");
  CHECK_ERROR(cluster_queries(Q, Tensor::from_int_vector({-1, 2}, {2}), {}, gen),
              "lengths[0] = -1");
  CHECK_ERROR(cluster_queries(Q, Tensor::from_vector({1, 2}, {2}), {}, gen),
              "expected lengths to be i32");
  CHECK(gen.offset() == 0);  // a rejected call draws nothing
}
