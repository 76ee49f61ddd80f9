// The BERT-family encoder (layers/bert.h): the pretrained all-MiniLM-L6-v2 against the
// reference implementation's outputs (tests/fixtures/make_bert_fixture.py: sentence-transformers
// on the same weights), the mapping of Hugging Face's names onto clustr's (a round trip, and
// the listed errors of a file that does not fit), the config reader, mean pooling and L2
// normalisation.
//
// The tests with the pretrained weights read them from the folder data/prepare_pretrained.py
// writes (CLUSTR_PRETRAINED_DIR in the environment, else the build's default); without it they
// are skipped (ctest reports them as not run). The others build small random models.
//
// Tolerances: the reference runs the same float32 model with PyTorch's kernels (its GEMMs, its
// softmax and layer norm), which add in other orders than clustr's. Through 6 layers the token
// outputs (magnitudes up to about 6) differ by at most 2.4e-6 (measured), tested within 1e-5;
// the unit-length sentence embeddings by 1.4e-7, tested within 1e-6; the pooler's tanh outputs
// by 3e-7, tested within 2e-6.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "autograd/ops.h"
#include "autograd/variable.h"
#include "check.h"
#include "core/random.h"
#include "core/safetensors.h"
#include "layers/bert.h"
#include "pretrained.h"

#ifndef CLUSTR_FIXTURE_DIR
#error "CLUSTR_FIXTURE_DIR must name the folder of the reference fixtures (tests/CMakeLists.txt)"
#endif

using namespace clustr;
using clustr::test::random_tensor;

namespace {

using clustr::test::pretrained_dir;

bool pretrained_present() {
  return clustr::test::pretrained_has("model.safetensors") &&
         clustr::test::pretrained_has("config.json");
}

// Row b's first `len` vectors of a (B, N, D) tensor, flattened.
std::vector<float> valid_rows(const Tensor& t, const std::vector<int32_t>& lengths) {
  const std::vector<float> v = t.to_vector();
  const int64_t N = t.size(1), D = t.size(2);
  std::vector<float> out;
  for (size_t b = 0; b < lengths.size(); ++b)
    out.insert(out.end(), v.begin() + static_cast<int64_t>(b) * N * D,
               v.begin() + (static_cast<int64_t>(b) * N + lengths[b]) * D);
  return out;
}

BertConfig tiny_config() {
  BertConfig c;
  c.vocab_size = 11;
  c.hidden = 8;
  c.layers = 2;
  c.heads = 2;
  c.intermediate = 12;
  c.max_positions = 9;
  c.type_vocab_size = 2;
  return c;
}

// The model's parameters under Hugging Face's names, as a BERT checkpoint holds them.
std::vector<std::pair<std::string, Tensor>> reference_tensors(const BertModel& model,
                                                              const std::string& prefix = "") {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, p] : model.named_parameters())
    out.emplace_back(prefix + bert_reference_name(name), p.data());
  return out;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("clustr_test_bert_" + name)).string();
}

}  // namespace

TEST_CASE("bert: the pretrained MiniLM gives the reference's token outputs, sentence embeddings "
          "and pooler outputs on a padded batch (skipped without the prepared model)" *
          doctest::skip(!pretrained_present())) {
  const BertConfig config = BertConfig::read(pretrained_dir() + "/config.json");
  CHECK(config.hidden == 384);
  CHECK(config.layers == 6);
  Generator gen(1);
  BertModel model(config, AttentionConfig{}, gen);
  const BertWeightsReport report = load_bert_weights(pretrained_dir() + "/model.safetensors", model);
  CHECK(report.ignored.empty());
  model.eval();

  const SafetensorsFile f = load_safetensors(std::string(CLUSTR_FIXTURE_DIR) +
                                             "/text/bert_minilm.safetensors");
  const Tensor& lengths = f.get("lengths");
  const std::vector<int32_t> len = lengths.to_int_vector();
  const Variable tokens = model.forward(f.get("ids"), f.get("types"), lengths, gen);
  CHECK_CLOSE(valid_rows(tokens.data(), len), valid_rows(f.get("tokens"), len), 1e-5, 0.0);
  const Variable sentence = l2_normalize(mean_pool(tokens, lengths));
  CHECK_CLOSE(sentence.data().to_vector(), f.get("sentence").to_vector(), 1e-6, 0.0);
  CHECK_CLOSE(model.pool_first(tokens).data().to_vector(), f.get("pooled").to_vector(), 2e-6, 0.0);
}

TEST_CASE("bert: weights saved under Hugging Face's names load back, with or without bert., "
          "and the task heads are ignored and reported") {
  Generator gen(3);
  BertModel source(tiny_config(), AttentionConfig{}, gen);
  for (const char* prefix : {"", "bert."}) {
    INFO("prefix '" << prefix << "'");
    auto tensors = reference_tensors(source, prefix);
    tensors.emplace_back("cls.predictions.bias", Tensor::zeros({11}));
    const std::string path = temp_path("roundtrip.safetensors");
    save_safetensors(path, tensors);
    Generator other(4);
    BertModel target(tiny_config(), AttentionConfig{}, other);
    const BertWeightsReport report = load_bert_weights(path, target);
    REQUIRE(report.ignored.size() == 1);
    CHECK(report.ignored[0] == "cls.predictions.bias");
    const auto a = source.named_parameters(), b = target.named_parameters();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      INFO(a[i].first);
      CHECK(a[i].second.data().to_vector() == b[i].second.data().to_vector());
    }
    std::filesystem::remove(path);
  }
}

TEST_CASE("bert: a checkpoint that does not fit is refused listing every problem, the model "
          "unchanged") {
  Generator gen(5);
  BertModel source(tiny_config(), AttentionConfig{}, gen);
  auto tensors = reference_tensors(source);
  // One tensor missing, one of a wrong shape, one unknown.
  tensors.erase(tensors.begin() + 3);
  for (auto& [name, t] : tensors)
    if (name == "encoder.layer.1.intermediate.dense.weight") t = Tensor::zeros({12, 7});
  tensors.emplace_back("encoder.layer.2.output.dense.weight", Tensor::zeros({8, 12}));
  const std::string path = temp_path("bad.safetensors");
  save_safetensors(path, tensors);
  Generator other(6);
  BertModel target(tiny_config(), AttentionConfig{}, other);
  const std::vector<float> before = target.named_parameters()[0].second.data().to_vector();
  CHECK_ERROR(load_bert_weights(path, target), "3 problem(s)", "missing: embeddings.LayerNorm.weight",
              "mismatch: encoder.layer.1.intermediate.dense.weight is f32 (12, 7)",
              "unexpected: encoder.layer.2.output.dense.weight");
  CHECK(target.named_parameters()[0].second.data().to_vector() == before);
  std::filesystem::remove(path);
  CHECK_ERROR(load_bert_weights(temp_path("absent.safetensors"), target), "absent.safetensors");
}

TEST_CASE("bert: config.json is read, and what the model does not implement is refused by name") {
  const std::string path = temp_path("config.json");
  const std::string good =
      R"({"model_type": "bert", "hidden_act": "gelu", "vocab_size": 11, "hidden_size": 8,
          "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 12,
          "max_position_embeddings": 9, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
          "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.0})";
  clustr::test::write_text(path, good);
  const BertConfig c = BertConfig::read(path);
  CHECK(c.hidden == 8);
  CHECK(c.intermediate == 12);
  CHECK(c.attention_dropout == 0.0f);
  CHECK(c.layer_norm_eps == doctest::Approx(1e-12));
  const std::vector<std::pair<std::string, std::vector<const char*>>> bad = {
      {R"("model_type": "bert")", {"model_type \"roberta\" is not supported"}},
      {R"("hidden_act": "gelu")", {"hidden_act \"gelu_new\" is not supported"}},
      {R"("hidden_size": 8)", {"hidden 9 is not a multiple of the heads 2"}},
      {R"("num_hidden_layers": 2,)", {"has no \"num_hidden_layers\""}},
      {R"("vocab_size": 11)", {"\"vocab_size\" to be an integer, got \"11\""}},
  };
  const std::vector<std::string> replacement = {
      R"("model_type": "roberta")", R"("hidden_act": "gelu_new")", R"("hidden_size": 9)", "",
      R"("vocab_size": "11")"};
  for (size_t i = 0; i < bad.size(); ++i) {
    std::string text = good;
    text.replace(text.find(bad[i].first), bad[i].first.size(), replacement[i]);
    clustr::test::write_text(path, text);
    INFO(text);
    CHECK_ERROR(BertConfig::read(path), path.c_str(), bad[i].second[0]);
  }
  clustr::test::write_text(path, "{\"vocab_size\": ");
  CHECK_ERROR(BertConfig::read(path), "not valid JSON");
  std::filesystem::remove(path);
}

TEST_CASE("bert: mean_pool averages the valid rows only, l2_normalize gives unit rows, and both "
          "pass gradcheck") {
  // tokens (2, 3, 2): row 0 valid 2, row 1 valid 3.
  const Tensor tokens = Tensor::from_vector({1, 2, 3, 4, 100, 100, 1, 1, 2, 2, 6, 0}, {2, 3, 2});
  const Tensor lengths = Tensor::from_int_vector({2, 3}, {2});
  const Variable pooled = mean_pool(Variable(tokens), lengths);
  CHECK_CLOSE(pooled.data().to_vector(), (std::vector<float>{2, 3, 3, 1}), 1e-6, 0.0);
  const Variable unit = l2_normalize(Variable(Tensor::from_vector({3, 4, 0, 0}, {2, 2})));
  CHECK_CLOSE(unit.data().to_vector(), (std::vector<float>{0.6f, 0.8f, 0, 0}), 1e-7, 0.0);
  CHECK_ERROR(mean_pool(Variable(tokens), Tensor::from_int_vector({0, 3}, {2})),
              "row 0 has length 0");
  clustr::test::check_grad(
      "mean_pool", [&](const std::vector<Variable>& v) { return mean_pool(v[0], lengths); },
      {random_tensor({2, 3, 2}, 7)});
  clustr::test::check_grad(
      "l2_normalize", [](const std::vector<Variable>& v) { return l2_normalize(v[0]); },
      {random_tensor({3, 4}, 8, 0.5f, 2.0f)});
}

TEST_CASE("bert: the layers run on the valid tokens alone, packed: the padded batch's outputs "
          "and gradients, zeros at padding") {
  const std::vector<int32_t> len = {7, 2, 5, 1};
  const int64_t B = 4, N = 7;
  std::vector<int32_t> id(B * N), type(B * N);
  for (int64_t i = 0; i < B * N; ++i) id[i] = static_cast<int32_t>((i * 7 + 3) % 11), type[i] = i % 3 == 0;
  const Tensor ids = Tensor::from_int_vector(id, {B, N}), types = Tensor::from_int_vector(type, {B, N});
  const Tensor lengths = Tensor::from_int_vector(len, {B});
  AttentionConfig clustered;
  clustered.type = AttentionType::clustered;
  clustered.clusters = 2;
  for (const AttentionConfig& attention : {AttentionConfig{}, clustered}) {
    INFO(attention.describe());
    Generator init(21);
    BertModel model(tiny_config(), attention, init);
    model.eval();  // the same dropout masks on both sides: none
    // The padded batch through the layers (what BertModel ran before it packed), and packed.
    const auto loss_and_grads = [&](bool packed, Tensor* tokens) {
      Generator gen(4);  // the clustered types' hashing draws
      model.zero_grad();
      const Variable out =
          packed ? model.forward(ids, types, lengths, gen)
                 : model.encoder().forward(model.embeddings().forward(ids, types, gen), lengths, gen);
      *tokens = out.data();
      sum_all(mean_pool(out, lengths) * Variable(random_tensor({B, 8}, 3))).backward();
      std::vector<float> grads;
      for (const auto& [name, p] : model.named_parameters())
        if (p.grad().defined()) {
          const std::vector<float> g = p.grad().to_vector();
          grads.insert(grads.end(), g.begin(), g.end());
        }
      return grads;
    };
    Tensor padded, packed;
    const std::vector<float> g_padded = loss_and_grads(false, &padded);
    const std::vector<float> g_packed = loss_and_grads(true, &packed);
    // A token's outputs do not depend on the other rows of its products: the same bits.
    CHECK_CLOSE(valid_rows(packed, len), valid_rows(padded, len), 0.0, 0.0);
    const std::vector<float> out = packed.to_vector();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = len[b] * 8; i < N * 8; ++i) CHECK(out[b * N * 8 + i] == 0.0f);
    // Weight gradients sum over tokens: only the padding's zero terms are left out.
    REQUIRE(g_packed.size() == g_padded.size());
    CHECK_CLOSE(g_packed, g_padded, 1e-6, 1e-5);
  }
  Generator gen(1);
  BertModel model(tiny_config(), AttentionConfig{}, gen);
  CHECK_ERROR(model.forward(ids, types, Tensor::from_int_vector({7, 8, 1, 1}, {B}), gen),
              "TokenPacking: sequence 1 has length 8, expected one in [0, 7]");
  CHECK_ERROR(model.forward(ids, types, Tensor::from_int_vector({7, 7}, {2}), gen),
              "BertModel: expected lengths i32 (4)", "(2,)");
}

TEST_CASE("bert: the masked-LM head is dense, GELU, layer norm, then the tied word table plus a "
          "bias, and passes gradcheck through the table and its input") {
  Generator gen(5);
  BertConfig c = tiny_config();
  MaskedLmHead head(c, gen);
  const auto params = head.named_parameters();
  CHECK(params.size() == 5);  // transform (2), norm (2), bias
  const auto p = [&](const char* name) {
    for (const auto& [n, v] : params)
      if (n == name) return v;
    FAIL("no parameter ", name);
    return Variable();
  };
  Tensor bias = p("bias").data();
  CHECK(bias.shape() == Shape{c.vocab_size});
  normal_(bias, gen, 0.0f, 0.5f);  // non-zero, so that a missing bias shows
  const Tensor x = random_tensor({3, c.hidden}, 11);
  const Tensor table = random_tensor({c.vocab_size, c.hidden}, 12);
  const Variable dense = linear(Variable(x), p("transform.weight"), p("transform.bias"));
  const Variable h = layer_norm(gelu(dense), p("norm.weight"), p("norm.bias"), c.layer_norm_eps);
  const Variable expected = linear(h, Variable(table), p("bias"));
  CHECK_CLOSE(head.forward(Variable(x), Variable(table)).data().to_vector(),
              expected.data().to_vector(), 1e-6, 1e-6);
  clustr::test::check_grad(
      "masked-LM head", [&](const std::vector<Variable>& v) { return head.forward(v[0], v[1]); },
      {x, table});
}

TEST_CASE("bert: the embeddings refuse ids longer than the position table and types of "
          "another shape") {
  Generator gen(9);
  BertModel model(tiny_config(), AttentionConfig{}, gen);
  const Tensor ids = Tensor::from_int_vector(std::vector<int32_t>(10, 1), {1, 10});
  CHECK_ERROR(model.forward(ids, Tensor(), Tensor(), gen), "10 positions",
              "longer than the 9 positions");
  const Tensor ok = Tensor::from_int_vector({1, 2, 3}, {1, 3});
  CHECK_ERROR(model.forward(ok, Tensor::from_int_vector({0, 1}, {1, 2}), Tensor(), gen),
              "token types of the ids' shape");
  const Variable out = model.forward(ok, Tensor(), Tensor(), gen);
  CHECK(out.shape() == Shape{1, 3, 8});
}
