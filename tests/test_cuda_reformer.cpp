// lsh and shared-full attention on the device (layers/attention/cuda/reformer.h) against the CPU:
// the buckets and each round's order exactly, the outputs, z and the gradients within float
// rounding, with and without dropout (the device sums in other orders), the same bits run after
// run, and the layer on the device through the dispatcher.
#include <doctest/doctest.h>

#include <vector>

#include "autograd/variable.h"
#include "check.h"
#include "core/cuda/cuda.h"
#include "core/random.h"
#include "core/tensor.h"
#include "cuda_check.h"
#include "layers/attention/attention.h"
#include "layers/attention/reformer.h"

using clustr::Device;
using clustr::ReformerOptions;
using clustr::Tensor;
using clustr::Variable;
using clustr::test::Inputs;
using clustr::test::random_tensor;
using clustr::test::Tolerance;

namespace {

// Forward and backward of one case on both devices (batch 2, H heads, E query/key and M value
// entries): inputs Q, V, lengths, rotations, dout.
void compare_case(const ReformerOptions& o, int64_t N, int32_t short_len, uint32_t seed,
                  int64_t H = 3, int64_t E = 8, int64_t M = 6) {
  const Tensor Q = random_tensor({2, H, N, E}, seed), V = random_tensor({2, H, N, M}, seed + 1);
  const Tensor lengths = Tensor::from_int_vector({int32_t(N), short_len}, {2});
  const Tensor rot =
      o.buckets > 1 ? random_tensor({o.rounds, E, o.buckets / 2}, seed + 2) : Tensor();
  const Tensor dout = random_tensor({2, H, N, M}, seed + 3);
  const Tolerance close = Tolerance::close(2e-6, 2e-5);
  clustr::test::compare_devices(
      [&](const Inputs& x) {
        const clustr::ReformerOutput f =
            clustr::reformer_attention_forward(x[0], x[1], x[2], x[3], o);
        const clustr::ReformerGrads g =
            clustr::reformer_attention_backward(x[4], x[0], x[1], x[2], f, o);
        return Inputs{clustr::reformer_buckets(x[0], x[2], x[3], o.buckets),
                      f.order,
                      f.out,
                      f.logsumexp,
                      g.dQ,
                      g.dV};
      },
      {Q, V, lengths, rot, dout},
      {{"buckets", 0},
       {"order", 0},
       {"out", close},
       {"logsumexp", close},
       {"dQ", Tolerance::close(1e-5, 1e-4)},
       {"dV", close}});
}

}  // namespace

TEST_CASE("cuda lsh attention: buckets, orders, outputs and gradients equal the cpu's") {
  SUBCASE("2 rounds of 8 buckets, chunks of 4, padding") {
    compare_case(ReformerOptions{2, 8, 4}, 29, 17, 11);
  }
  SUBCASE("4 rounds of 4 buckets, chunks of 3") {
    compare_case(ReformerOptions{4, 4, 3}, 20, 20, 21);
  }
  SUBCASE("shared-full: one bucket, one chunk") {
    compare_case(ReformerOptions{1, 1, 23}, 23, 9, 31);
  }
  SUBCASE("chunks of one: the first query has nothing but itself") {
    compare_case(ReformerOptions{1, 1, 1}, 7, 1, 41);
  }
  SUBCASE("dropout on the weights: the same mask") {
    compare_case(ReformerOptions{3, 4, 4, 0.0f, 0.3f, 5, 9}, 26, 15, 61);
  }
  SUBCASE("shared-full with dropout") {
    compare_case(ReformerOptions{1, 1, 19, 0.0f, 0.5f, 8, 1}, 19, 12, 71);
  }
  // The device's sort gives each of its 256 threads a span of positions: over 512 of them, spans
  // of 3 (a span's positions placed out of order would show). Rows of 40 and 36 entries give the
  // warps' lanes two entries each or one. Chunks of one keep the emulated attention small.
  SUBCASE("long sequences: the sort's spans, rows wider than a warp") {
    compare_case(ReformerOptions{2, 8, 1}, 600, 531, 81, 1, 40, 36);
  }
}

TEST_CASE("cuda lsh attention: the same bits run after run, through the dispatcher") {
  const Tensor Q = random_tensor({2, 2, 24, 8}, 51).to(Device::cuda);
  const Tensor V = random_tensor({2, 2, 24, 8}, 52).to(Device::cuda);
  const Tensor lengths = Tensor::from_int_vector({24, 17}, {2}).to(Device::cuda);
  clustr::AttentionConfig c;
  c.type = clustr::AttentionType::lsh;
  c.rounds = 2;
  c.buckets = 8;
  c.chunk = 8;
  std::vector<std::vector<float>> outs, grads;
  for (int run = 0; run < 2; ++run) {
    clustr::Generator gen(7);  // the same rotations both times
    Variable q(Q.clone(), true), v(V.clone(), true);
    const Variable out = clustr::attention(c, q, q, v, lengths, gen, true);
    CHECK(out.device() == Device::cuda);
    out.backward(random_tensor({2, 2, 24, 8}, 53).to(Device::cuda));
    outs.push_back(out.data().to_vector());
    grads.push_back(q.grad().to_vector());
  }
  CHECK(outs[0] == outs[1]);
  CHECK(grads[0] == grads[1]);
}
