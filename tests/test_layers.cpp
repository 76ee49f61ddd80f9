// The layers: Module bookkeeping (names, counts, train/eval, zero_grad, name errors), the basic
// layers' initialisation statistics and shapes, the positional encoding against its formula,
// multi-head attention and the encoder's structure, and the errors that name the layer and the
// shapes. The encoder's numbers against PyTorch are in test_encoder_fixture.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "check.h"
#include "core/random.h"
#include "core/cuda/cuda.h"
#include "core/ops.h"
#include "layers/attention/attention.h"
#include "layers/attention/full.h"
#include "layers/dropout.h"
#include "layers/embedding.h"
#include "layers/encoder.h"
#include "layers/layer_norm.h"
#include "layers/linear.h"
#include "layers/multihead_attention.h"

using namespace clustr;
using clustr::test::random_tensor;

namespace {

// A module whose registration functions are public, for the bookkeeping tests.
struct Open : Module {
  using Module::register_module;
  using Module::register_parameter;
};

std::vector<std::string> names_of(const Module& m) {
  std::vector<std::string> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.first);
  return out;
}

struct Stats {
  double mean = 0, var = 0, min = INFINITY, max = -INFINITY;
};
Stats stats_of(const Tensor& t) {
  Stats s;
  const std::vector<float> v = t.to_vector();
  for (float x : v)
    s.mean += x, s.min = std::min<double>(s.min, x), s.max = std::max<double>(s.max, x);
  s.mean /= static_cast<double>(v.size());
  for (float x : v) s.var += (x - s.mean) * (x - s.mean);
  s.var /= static_cast<double>(v.size());
  return s;
}

}  // namespace

// ---- Module ------------------------------------------------------------------------------------

TEST_CASE("module: dotted names in registration order, own parameters first") {
  auto leaf = [] {
    auto m = std::make_shared<Open>();
    m->register_parameter("w", Tensor::full({2, 3}, 1.0f));
    m->register_parameter("b", Tensor::zeros({3}));
    return m;
  };
  auto parent = std::make_shared<Open>();
  parent->register_module("first", leaf());
  parent->register_parameter("scale", Tensor::full({1}, 2.0f));
  parent->register_module("second", leaf());
  Open root;
  root.register_module("net", parent);

  const std::vector<std::string> expected = {"net.scale", "net.first.w", "net.first.b",
                                             "net.second.w", "net.second.b"};
  CHECK(names_of(root) == expected);
  CHECK(root.parameters().size() == 5);
  CHECK(root.parameter_count() == 1 + 2 * (6 + 3));
  for (const Variable& p : root.parameters()) {
    CHECK(p.requires_grad());
    CHECK(p.is_leaf());
  }
  // A parameter is the registered Variable itself, not a copy.
  Variable scale = parent->named_parameters()[0].second;
  CHECK(scale.data().shares_storage(root.parameters()[0].data()));
}

TEST_CASE("module: train and eval reach every submodule") {
  auto child = std::make_shared<Open>();
  auto grandchild = std::make_shared<Open>();
  child->register_module("inner", grandchild);
  Open root;
  root.register_module("child", child);
  CHECK(root.training());
  root.eval();
  CHECK_FALSE(root.training());
  CHECK_FALSE(child->training());
  CHECK_FALSE(grandchild->training());
  root.train();
  CHECK(grandchild->training());
  child->train(false);  // a subtree alone
  CHECK(root.training());
  CHECK_FALSE(grandchild->training());
}

TEST_CASE("module: zero_grad forgets every gradient") {
  Generator gen(3);
  FeedForward ff(4, 8, Activation::relu, 0.0f, gen);
  Variable x(random_tensor({2, 4}, 1));
  sum_all(ff.forward(x, gen)).backward();
  for (const auto& [name, p] : ff.named_parameters()) CHECK_MESSAGE(p.grad().defined(), name);
  ff.zero_grad();
  for (const auto& [name, p] : ff.named_parameters()) CHECK_MESSAGE(!p.grad().defined(), name);
}

TEST_CASE("module: bad names are errors") {
  Open m;
  m.register_parameter("w", Tensor::zeros({2}));
  m.register_module("child", std::make_shared<Open>());
  CHECK_ERROR(m.register_parameter("", Tensor::zeros({2})), "parameter name must not be empty");
  CHECK_ERROR(m.register_parameter("a.b", Tensor::zeros({2})), "'a.b'", "must not contain '.'");
  CHECK_ERROR(m.register_parameter("w", Tensor::zeros({2})), "'w'", "parameter",
              "already registered");
  CHECK_ERROR(m.register_parameter("child", Tensor::zeros({2})), "'child'", "submodule",
              "already registered");
  CHECK_ERROR(m.register_module("w", std::make_shared<Open>()), "'w'", "already registered");
  CHECK_ERROR(m.register_module("child", std::make_shared<Open>()), "'child'",
              "already registered");
  CHECK_ERROR(m.register_module("x.y", std::make_shared<Open>()), "must not contain '.'");
  CHECK_ERROR(m.register_module("", std::make_shared<Open>()), "must not be empty");
  CHECK_ERROR(m.register_module("none", std::shared_ptr<Open>()), "'none'", "null");
  CHECK_ERROR(m.register_parameter("i", Tensor::zeros({2}, DType::i32)), "'i'", "f32");
  CHECK(names_of(m) == std::vector<std::string>{"w"});  // nothing half-registered
}

TEST_CASE("module: ModuleList numbers its items") {
  Generator gen(1);
  Open root;
  auto list = std::make_shared<ModuleList<Linear>>();
  for (int i = 0; i < 3; ++i) list->push_back(std::make_shared<Linear>(2, 2, i != 1, gen));
  root.register_module("layers", list);
  CHECK(list->size() == 3);
  CHECK(names_of(root) == std::vector<std::string>{"layers.0.weight", "layers.0.bias",
                                                   "layers.1.weight", "layers.2.weight",
                                                   "layers.2.bias"});
  CHECK_FALSE((*list)[1].bias().defined());
}

// ---- Linear, LayerNorm, Embedding, Dropout
// -------------------------------------------------------

TEST_CASE("linear: PyTorch's uniform(+-1/sqrt(in)) init, reproducible from the seed") {
  Generator gen(7);
  Linear lin(256, 256, true, gen);
  const double bound = 1.0 / 16.0;
  CHECK(names_of(lin) == std::vector<std::string>{"weight", "bias"});
  CHECK(lin.parameter_count() == 256 * 256 + 256);
  const Stats w = stats_of(lin.weight().data());
  // 65536 draws: the mean's standard error is bound/sqrt(3)/256 = 1.4e-4, the variance's 0.4%.
  CHECK(w.min >= -bound);
  CHECK(w.max <= bound);
  CHECK(w.max > 0.99 * bound);
  CHECK(w.min < -0.99 * bound);
  CHECK(std::fabs(w.mean) < 7e-4);
  CHECK(w.var == doctest::Approx(bound * bound / 3).epsilon(0.02));
  const Stats b = stats_of(lin.bias().data());
  CHECK(b.min >= -bound);
  CHECK(b.max <= bound);
  CHECK(b.var > 0);

  Generator same(7), other(8);
  CHECK(Linear(256, 256, true, same).weight().data().to_vector() ==
        lin.weight().data().to_vector());
  CHECK(Linear(256, 256, true, other).weight().data().to_vector() !=
        lin.weight().data().to_vector());
  CHECK(Linear(4, 3, false, gen).named_parameters().size() == 1);
}

TEST_CASE("linear: forward is x W^T + b over leading axes") {
  Generator gen(1);
  Linear lin(3, 2, true, gen);
  const Tensor x = random_tensor({2, 4, 3}, 5);
  const Variable y = lin.forward(Variable(x));
  REQUIRE(y.shape() == Shape{2, 4, 2});
  const std::vector<float> xv = x.to_vector(), yv = y.data().to_vector();
  const std::vector<float> W = lin.weight().data().to_vector(), bv = lin.bias().data().to_vector();
  std::vector<float> expected;
  for (int r = 0; r < 8; ++r)
    for (int o = 0; o < 2; ++o) {
      double acc = bv[o];
      for (int i = 0; i < 3; ++i) acc += double(xv[r * 3 + i]) * W[o * 3 + i];
      expected.push_back(static_cast<float>(acc));
    }
  CHECK_CLOSE(yv, expected, 1e-6, 1e-6);
  CHECK_ERROR(lin.forward(Variable(Tensor::zeros({2, 5}))), "Linear(in=3, out=2)",
              "expected x (..., 3)", "(2, 5)");
  CHECK_ERROR(Linear(0, 2, true, gen), "Linear", "in=0");
}

TEST_CASE("layer norm: gamma 1, beta 0, rows normalised") {
  LayerNorm ln(16);
  CHECK(names_of(ln) == std::vector<std::string>{"weight", "bias"});
  CHECK(ln.weight().data().to_vector() == std::vector<float>(16, 1.0f));
  CHECK(ln.bias().data().to_vector() == std::vector<float>(16, 0.0f));
  CHECK(ln.eps() == 1e-5f);
  const Variable y = ln.forward(Variable(random_tensor({3, 5, 16}, 2, -3.0f, 5.0f)));
  REQUIRE(y.shape() == Shape{3, 5, 16});
  const std::vector<float> v = y.data().to_vector();
  for (int r = 0; r < 15; ++r) {
    double m = 0, s = 0;
    for (int c = 0; c < 16; ++c) m += v[r * 16 + c];
    m /= 16;
    for (int c = 0; c < 16; ++c) s += (v[r * 16 + c] - m) * (v[r * 16 + c] - m);
    CHECK(std::fabs(m) < 1e-6);
    CHECK(s / 16 == doctest::Approx(1.0).epsilon(1e-4));
  }
  CHECK_ERROR(ln.forward(Variable(Tensor::zeros({3, 15}))), "LayerNorm(16)", "expected x (..., 16)",
              "(3, 15)");
}

TEST_CASE("embedding: normal(0, 1) table and lookups") {
  Generator gen(11);
  Embedding emb(512, 128, gen);
  CHECK(names_of(emb) == std::vector<std::string>{"weight"});
  const Stats s = stats_of(emb.weight().data());
  // 65536 draws: standard errors 0.004 for the mean and 0.55% for the variance.
  CHECK(std::fabs(s.mean) < 0.02);
  CHECK(s.var == doctest::Approx(1.0).epsilon(0.03));
  const Tensor index = Tensor::from_int_vector({3, 0, 511, 3, 7, 1}, {2, 3});
  const Variable y = emb.forward(index);
  REQUIRE(y.shape() == Shape{2, 3, 128});
  const std::vector<float> table = emb.weight().data().to_vector(), yv = y.data().to_vector();
  CHECK(std::equal(yv.begin() + 2 * 128, yv.begin() + 3 * 128, table.begin() + 511 * 128));
  CHECK_ERROR(emb.forward(Tensor::zeros({2, 3})), "Embedding(V=512, D=128)", "i32", "f32");
}

TEST_CASE("dropout: the module's training flag switches it") {
  Generator gen(5);
  Dropout drop(0.5f);
  const Variable x(Tensor::full({4096}, 1.0f));
  const std::vector<float> y = drop.forward(x, gen).data().to_vector();
  const auto zeros = std::count(y.begin(), y.end(), 0.0f);
  CHECK(zeros > 1800);
  CHECK(zeros < 2300);
  CHECK(std::count(y.begin(), y.end(), 2.0f) == 4096 - zeros);
  drop.eval();
  CHECK(drop.forward(x, gen).data().to_vector() == x.data().to_vector());
  CHECK(drop.parameter_count() == 0);
  CHECK_ERROR(Dropout(1.0f), "Dropout", "[0, 1)");
}

// ---- positional encoding -----------------------------------------------------------------------

TEST_CASE("positional encoding: the sin/cos table of 'Attention is all you need'") {
  for (int64_t D : {1, 7, 16, 192}) {
    const int64_t N = 50;
    const std::vector<float> pe = sinusoidal_positional_encoding(N, D).to_vector();
    REQUIRE(pe.size() == static_cast<size_t>(N * D));
    std::vector<float> expected;
    for (int64_t pos = 0; pos < N; ++pos)
      for (int64_t c = 0; c < D; ++c) {
        const int64_t i = c / 2;  // PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos
        const double angle = pos / std::pow(10000.0, 2.0 * i / D);
        expected.push_back(static_cast<float>(c % 2 ? std::cos(angle) : std::sin(angle)));
      }
    INFO("D = ", D);
    CHECK_CLOSE(pe, expected, 1e-6, 0.0);
  }
  const std::vector<float> pe = sinusoidal_positional_encoding(2, 4).to_vector();
  CHECK(pe == std::vector<float>{0, 1, 0, 1, std::sin(1.0f), std::cos(1.0f),
                                 static_cast<float>(std::sin(0.01)),
                                 static_cast<float>(std::cos(0.01))});
}

TEST_CASE("positional encoding: the module adds PE[pos] to every sequence") {
  PositionalEncoding pos(6);
  CHECK(pos.parameter_count() == 0);
  const Tensor x = random_tensor({3, 5, 6}, 9);
  const Variable y = pos.forward(Variable(x));
  REQUIRE(y.shape() == Shape{3, 5, 6});
  const std::vector<float> pe = sinusoidal_positional_encoding(5, 6).to_vector();
  const std::vector<float> xv = x.to_vector(), yv = y.data().to_vector();
  std::vector<float> expected(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) expected[i] = xv[i] + pe[i % 30];
  CHECK_CLOSE(yv, expected, 0.0, 0.0);
  CHECK_ERROR(pos.forward(Variable(Tensor::zeros({5, 6}))), "PositionalEncoding(6)",
              "expected x (B, N, 6)", "(5, 6)");
}

// ---- feed-forward ------------------------------------------------------------------------------

TEST_CASE("feed-forward: linear1, activation, linear2") {
  Generator gen(4);
  for (Activation act : {Activation::relu, Activation::gelu}) {
    FeedForward ff(6, 10, act, 0.0f, gen);
    CHECK(names_of(ff) == std::vector<std::string>{"linear1.weight", "linear1.bias",
                                                   "linear2.weight", "linear2.bias"});
    CHECK(ff.parameter_count() == 6 * 10 + 10 + 10 * 6 + 6);
    const Variable x(random_tensor({2, 3, 6}, 4));
    const Variable y = ff.forward(x, gen);
    REQUIRE(y.shape() == Shape{2, 3, 6});
    const Variable h = ff.linear1().forward(x);
    const Variable expected = ff.linear2().forward(act == Activation::relu ? relu(h) : gelu(h));
    CHECK_CLOSE(y.data().to_vector(), expected.data().to_vector(), 0.0, 0.0);
  }
  CHECK(parse_activation("gelu") == Activation::gelu);
  CHECK(std::string(activation_name(Activation::relu)) == "relu");
  CHECK_ERROR(parse_activation("swish"), "'swish'", "relu", "gelu");
  FeedForward ff(6, 10, Activation::relu, 0.0f, gen);
  CHECK_ERROR(ff.forward(Variable(Tensor::zeros({2, 7})), gen), "FeedForward(D=6, F=10)", "(2, 7)");
}

// ---- multi-head attention and the encoder ------------------------------------------------------

TEST_CASE("multi-head attention: projections, head split and errors") {
  Generator gen(2);
  MultiHeadAttention mha(12, 3, AttentionConfig{}, gen);
  CHECK(mha.head_dim() == 4);
  CHECK(names_of(mha) == std::vector<std::string>{"query.weight", "query.bias", "key.weight",
                                                  "key.bias", "value.weight", "value.bias",
                                                  "out.weight", "out.bias"});
  CHECK(mha.parameter_count() == 4 * (12 * 12 + 12));
  CHECK_ERROR(MultiHeadAttention(10, 3, AttentionConfig{}, gen), "MultiHeadAttention", "D=10",
              "H=3", "not divisible");
  CHECK_ERROR(mha.forward(Variable(Tensor::zeros({2, 5, 8})), Tensor(), gen),
              "MultiHeadAttention(D=12, H=3)", "expected x (B, N, 12)", "(2, 5, 8)");
  CHECK_ERROR(mha.forward(Variable(Tensor::zeros({5, 12})), Tensor(), gen), "(5, 12)");
  CHECK_ERROR(mha.forward(Variable(Tensor::zeros({2, 5, 12})), Tensor::zeros({2}), gen),
              "MultiHeadAttention(D=12, H=3)", "expected lengths i32 (2,)", "f32 (2,)");
  CHECK_ERROR(mha.forward(Variable(Tensor::zeros({2, 5, 12})),
                          Tensor::from_int_vector({5, 5, 5}, {3}), gen),
              "expected lengths i32 (2,)", "i32 (3,)");
}

TEST_CASE("multi-head attention: one head over one valid key returns that key's value") {
  // With lengths 1 every valid query sees only key 0, so its output is out(value(x[0])) whatever
  // the weights; padded queries give out(0) = out.bias.
  Generator gen(6);
  MultiHeadAttention mha(8, 2, AttentionConfig{}, gen);
  const Variable x(random_tensor({2, 4, 8}, 3));
  const Tensor lengths = Tensor::from_int_vector({4, 1}, {2});
  const std::vector<float> y = mha.forward(x, lengths, gen).data().to_vector();
  const Variable x_b1_0(slice(slice(x, 0, 1, 1), 1, 0, 1).data().clone());  // (1, 1, 8)
  const std::vector<float> v = mha.out().forward(mha.value().forward(x_b1_0)).data().to_vector();
  const std::vector<float> bias = mha.out().bias().data().to_vector();
  const std::vector<float> row0(y.begin() + 32, y.begin() + 40);
  CHECK_CLOSE(row0, v, 1e-5, 1e-5);
  for (int n = 1; n < 4; ++n) {
    const std::vector<float> row(y.begin() + 32 + n * 8, y.begin() + 40 + n * 8);
    CHECK_CLOSE(row, bias, 1e-6, 0.0);
  }
}

TEST_CASE("multi-head attention: the fused projections equal split heads and full_attention") {
  // With full attention the layer runs one GEMM for q, k and v and attends over the heads in
  // place (full_attention_qkv). The reference splits and permutes the heads of three Linears
  // and runs full_attention, as the other attention types do. Padded queries, causal masking
  // and attention dropout (the same Philox blocks from the same Generator state) included.
  const int64_t B = 3, N = 7, D = 12, H = 3, E = D / H;
  const Tensor lengths = Tensor::from_int_vector({7, 4, 1}, {3});
  const Tensor x0 = random_tensor({B, N, D}, 70), dout = random_tensor({B, N, D}, 71);
  for (int variant = 0; variant < 3; ++variant) {
    AttentionConfig config;
    config.causal = variant == 1;
    config.dropout = variant == 2 ? 0.3f : 0.0f;
    Generator init(7);
    MultiHeadAttention mha(D, H, config, init);
    auto params = [&] {
      std::vector<std::vector<float>> g;
      for (const auto& [name, p] : mha.named_parameters()) g.push_back(p.grad().to_vector());
      return g;
    };
    // The layer.
    Generator gen(8);
    Variable x(x0.clone(), true);
    const Variable y = mha.forward(x, lengths, gen);
    y.backward(dout);
    const std::vector<float> y_fused = y.data().to_vector(), dx_fused = x.grad().to_vector();
    const auto dp_fused = params();
    mha.zero_grad();
    // The reference.
    Generator gen2(8);
    Variable x2(x0.clone(), true);
    auto split = [&](const Variable& t) { return permute(reshape(t, {B, N, H, E}), {0, 2, 1, 3}); };
    FullAttentionOptions options;
    options.causal = config.causal;
    if (config.dropout > 0.0f) {
      options.dropout = config.dropout;
      options.seed = gen2.seed();
      options.offset = gen2.reserve(full_attention_dropout_blocks(B, H, N, N));
    }
    const Variable heads =
        full_attention(split(mha.query().forward(x2)), split(mha.key().forward(x2)),
                       split(mha.value().forward(x2)), lengths, options);
    const Variable y2 = mha.out().forward(reshape(permute(heads, {0, 2, 1, 3}), {B, N, D}));
    y2.backward(dout);
    INFO("variant ", variant);
    // Forward: the same products and the same attention arithmetic, so the same bits.
    CHECK(y_fused == y2.data().to_vector());
    // Backward: dx sums over q, k and v in one GEMM (K = 3D) rather than three.
    CHECK_CLOSE(dx_fused, x2.grad().to_vector(), 1e-6, 1e-5);
    const auto dp_ref = params();
    for (size_t i = 0; i < dp_ref.size(); ++i) CHECK_CLOSE(dp_fused[i], dp_ref[i], 1e-6, 1e-5);
  }
}

TEST_CASE("multi-head attention: the stacked heads of the clustered types equal three split "
          "heads and attention()") {
  // Clustered, improved-clustered and oracle-top attention run one GEMM for q, k and v and split
  // the heads of all three with one permute into (3, B, H, N, E); the clustered types take it
  // whole and write their three gradients as its slices. The reference splits the heads of
  // three Linears and calls attention(), as the layer did before. Padded queries, attention
  // dropout (the same Philox blocks from the same Generator state), and the emulated device.
  const int64_t B = 3, N = 9, D = 12, H = 3, E = D / H;
  std::vector<Device> devices{Device::cpu};
  if (clustr::cuda::available()) devices.push_back(Device::cuda);
  for (Device device : devices)
    for (AttentionType type : {AttentionType::clustered, AttentionType::improved_clustered,
                               AttentionType::oracle_top})
      for (int variant = 0; variant < 2; ++variant) {
        const bool training = type != AttentionType::oracle_top;  // oracle-top: evaluation only
        if (!training && variant == 1) continue;
        AttentionConfig config;
        config.type = type;
        config.clusters = 3;
        config.topk = 3;
        config.bits = 16;
        config.dropout = variant == 1 ? 0.25f : 0.0f;
        const Tensor lengths = Tensor::from_int_vector({9, 5, 1}, {3}).to(device);
        const Tensor x0 = random_tensor({B, N, D}, 74).to(device);
        const Tensor dout = random_tensor({B, N, D}, 75).to(device);
        Generator init(11);
        MultiHeadAttention mha(D, H, config, init);
        mha.to(device);
        mha.train(training);
        std::unique_ptr<NoGradGuard> no_grad;  // oracle-top refuses to record a graph
        if (!training) no_grad = std::make_unique<NoGradGuard>();
        auto grads = [&] {
          std::vector<std::vector<float>> g;
          for (const auto& [name, p] : mha.named_parameters())
            g.push_back(training ? p.grad().to_vector() : std::vector<float>());
          return g;
        };
        Generator gen(12);
        Variable x(x0.clone(), training);
        const Variable y = mha.forward(x, lengths, gen);
        if (training) y.backward(dout);
        const std::vector<float> y_stacked = y.data().to_vector();
        const std::vector<float> dx_stacked = training ? x.grad().to_vector() : y_stacked;
        const auto dp_stacked = grads();
        mha.zero_grad();
        Generator gen2(12);
        Variable x2(x0.clone(), training);
        auto split = [&](const Variable& t) {
          return permute(reshape(t, {B, N, H, E}), {0, 2, 1, 3});
        };
        const Variable heads = attention(config, split(mha.query().forward(x2)),
                                         split(mha.key().forward(x2)),
                                         split(mha.value().forward(x2)), lengths, gen2, training);
        const Variable y2 = mha.out().forward(reshape(permute(heads, {0, 2, 1, 3}), {B, N, D}));
        if (training) y2.backward(dout);
        INFO("device ", std::string(device == Device::cuda ? "cuda" : "cpu"), ", type ",
             std::string(attention_type_name(type)), ", variant ", variant);
        // Forward: the same products per element and the same attention arithmetic.
        CHECK(y_stacked == y2.data().to_vector());
        if (!training) continue;
        // Backward: dx sums over q, k and v in one GEMM (K = 3D) rather than three.
        CHECK_CLOSE(dx_stacked, x2.grad().to_vector(), 1e-6, 1e-5);
        const auto dp_ref = grads();
        for (size_t i = 0; i < dp_ref.size(); ++i)
          CHECK_CLOSE(dp_stacked[i], dp_ref[i], 1e-6, 1e-5);
      }
}

TEST_CASE("multi-head attention: q, k and v weights stacked in one storage, so that their "
          "concat and its gradient are views, also after to()") {
  Generator init(13);
  MultiHeadAttention mha(8, 2, AttentionConfig{}, init);
  std::vector<Device> devices{Device::cpu};
  if (clustr::cuda::available()) devices.push_back(Device::cuda);
  for (Device device : devices) {
    mha.to(device);
    const Variable wq = mha.query().weight(), wk = mha.key().weight(), wv = mha.value().weight();
    const std::vector<float> values = concat(std::vector<Tensor>{wq.data(), wk.data(), wv.data()},
                                             0).to_vector();
    const Variable w = concat({wq, wk, wv}, 0);
    CHECK(w.data().shares_storage(wq.data()));
    CHECK(w.data().to_vector() == values);
    CHECK(concat({mha.query().bias(), mha.key().bias(), mha.value().bias()}, 0)
              .data()
              .shares_storage(mha.query().bias().data()));
    CHECK_FALSE(concat({wq, wv, wk}, 0).data().shares_storage(wq.data()));  // out of order: a copy
    CHECK(mha.out().weight().data().device() == device);
    // The gradient's parts are views of the gradient (the gradient of sum(w * g) is g, made
    // anew by mul's backward; a caller's own gradient tensor would be copied instead).
    const Tensor g = random_tensor({24, 8}, 76).to(device);
    sum_all(mul(w, Variable(g))).backward();
    CHECK(wq.grad().shares_storage(wk.grad()));
    CHECK(wk.grad().to_vector() == g.rows(8, 16).to_vector());
    mha.zero_grad();
  }
}

TEST_CASE("multi-head attention results are identical at 1 and 2 threads") {
  Generator init(9);
  MultiHeadAttention mha(192, 6, AttentionConfig{}, init);
  const Tensor x0 = random_tensor({4, 33, 192}, 72), dout = random_tensor({4, 33, 192}, 73);
  const Tensor lengths = Tensor::from_int_vector({33, 20, 1, 32}, {4});
  auto run = [&](int threads) {
    clustr::test::ThreadCount tc(threads);
    Generator gen(10);
    Variable x(x0.clone(), true);
    const Variable y = mha.forward(x, lengths, gen);
    y.backward(dout);
    std::vector<float> r = y.data().to_vector(), dx = x.grad().to_vector();
    r.insert(r.end(), dx.begin(), dx.end());
    for (const auto& [name, p] : mha.named_parameters()) {
      const std::vector<float> g = p.grad().to_vector();
      r.insert(r.end(), g.begin(), g.end());
    }
    mha.zero_grad();
    return r;
  };
  CHECK(run(1) == run(2));
}

TEST_CASE("encoder: layer names, counts, train/eval and the final norm of pre-norm stacks") {
  Generator gen(9);
  const int64_t D = 12, H = 2, F = 20;
  EncoderLayer layer(D, H, F, AttentionConfig{}, 0.1f, Activation::gelu, false, gen);
  const std::vector<std::string> names = names_of(layer);
  const std::vector<std::string> expected = {"attention.query.weight",
                                             "attention.query.bias",
                                             "attention.key.weight",
                                             "attention.key.bias",
                                             "attention.value.weight",
                                             "attention.value.bias",
                                             "attention.out.weight",
                                             "attention.out.bias",
                                             "feedforward.linear1.weight",
                                             "feedforward.linear1.bias",
                                             "feedforward.linear2.weight",
                                             "feedforward.linear2.bias",
                                             "norm1.weight",
                                             "norm1.bias",
                                             "norm2.weight",
                                             "norm2.bias"};
  CHECK(names == expected);
  const int64_t per_layer = 4 * (D * D + D) + (D * F + F) + (F * D + D) + 4 * D;
  CHECK(layer.parameter_count() == per_layer);

  Encoder post(3, D, H, F, AttentionConfig{}, 0.1f, Activation::relu, false, gen);
  CHECK(post.num_layers() == 3);
  CHECK(post.parameter_count() == 3 * per_layer);
  CHECK(post.named_parameters().front().first == "layers.0.attention.query.weight");
  CHECK(post.named_parameters().back().first == "layers.2.norm2.bias");
  Encoder pre(2, D, H, F, AttentionConfig{}, 0.1f, Activation::relu, true, gen);
  CHECK(pre.parameter_count() == 2 * per_layer + 2 * D);
  CHECK(pre.named_parameters().back().first == "norm.bias");
  CHECK(pre.layer(1).pre_norm());

  post.eval();
  CHECK_FALSE(post.layer(2).feedforward().linear1().training());
  CHECK_FALSE(post.layer(0).attention().training());
  post.train();
  CHECK(post.layer(1).norm2().training());

  AttentionConfig causal;
  causal.causal = true;
  post.set_attention(causal);
  for (size_t i = 0; i < post.num_layers(); ++i) CHECK(post.layer(i).attention().config.causal);
  CHECK_ERROR(Encoder(0, D, H, F, AttentionConfig{}, 0.1f, Activation::relu, false, gen), "Encoder",
              "at least one layer");
  CHECK_ERROR(layer.forward(Variable(Tensor::zeros({2, 3, 10})), Tensor(), gen),
              "EncoderLayer(D=12, H=2)", "expected x (B, N, 12)", "(2, 3, 10)");
}

TEST_CASE("encoder: forward keeps (B, N, D), is finite, and dropout follows train/eval") {
  Generator gen(10);
  Encoder enc(2, 12, 3, 24, AttentionConfig{}, 0.2f, Activation::gelu, true, gen);
  const Variable x(random_tensor({3, 6, 12}, 8));
  const Tensor lengths = Tensor::from_int_vector({6, 4, 1}, {3});
  enc.eval();
  Generator g1(1), g2(2);
  const Variable y1 = enc.forward(x, lengths, g1);
  REQUIRE(y1.shape() == Shape{3, 6, 12});
  for (float v : y1.data().to_vector()) REQUIRE(std::isfinite(v));
  CHECK(enc.forward(x, lengths, g2).data().to_vector() == y1.data().to_vector());
  enc.train();
  CHECK(enc.forward(x, lengths, g2).data().to_vector() != y1.data().to_vector());
  // Valid positions do not see padded ones: changing x beyond lengths[b] leaves them alone.
  enc.eval();
  std::vector<float> xv = x.data().to_vector();
  for (int64_t n = 4; n < 6; ++n) xv[(1 * 6 + n) * 12] += 3.0f;
  const Variable y3 = enc.forward(Variable(Tensor::from_vector(xv, {3, 6, 12})), lengths, g1);
  const std::vector<float> a = y1.data().to_vector(), b = y3.data().to_vector();
  CHECK(std::vector<float>(a.begin() + 72, a.begin() + 72 + 48) ==
        std::vector<float>(b.begin() + 72, b.begin() + 72 + 48));
}
