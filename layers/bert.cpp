// The BERT-family encoder and its weight loading (see bert.h).
#include "layers/bert.h"

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "autograd/ops.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/safetensors.h"

namespace clustr {

// ---- config ----------------------------------------------------------------------------------

namespace {

using Json = nlohmann::json;

int64_t json_int(const Json& j, const char* key, const std::string& path) {
  CLUSTR_CHECK(j.contains(key), path, ": the BERT config has no \"", key, "\"");
  CLUSTR_CHECK(j[key].is_number_integer(), path, ": expected \"", key,
               "\" to be an integer, got ", j[key].dump());
  return j[key].get<int64_t>();
}

float json_float(const Json& j, const char* key, const std::string& path) {
  CLUSTR_CHECK(j.contains(key), path, ": the BERT config has no \"", key, "\"");
  CLUSTR_CHECK(j[key].is_number(), path, ": expected \"", key, "\" to be a number, got ",
               j[key].dump());
  return j[key].get<float>();
}

std::string json_string(const Json& j, const char* key, const std::string& fallback,
                        const std::string& path) {
  if (!j.contains(key)) return fallback;
  CLUSTR_CHECK(j[key].is_string(), path, ": expected \"", key, "\" to be a string, got ",
               j[key].dump());
  return j[key].get<std::string>();
}

}  // namespace

BertConfig BertConfig::read(const std::string& path) {
  std::ifstream in(path);
  CLUSTR_CHECK(in, "cannot open the BERT config ", path);
  Json j;
  try {
    j = Json::parse(in);
  } catch (const Json::exception& e) {
    throw Error(detail::cat(path, ": not valid JSON (", e.what(), ")"));
  }
  CLUSTR_CHECK(j.is_object(), path, ": expected a JSON object, got ", j.type_name());
  const std::string type = json_string(j, "model_type", "bert", path);
  CLUSTR_CHECK(type == "bert", path, ": model_type \"", type,
               "\" is not supported (expected bert; RoBERTa's offset positions, for one, differ)");
  const std::string act = json_string(j, "hidden_act", "gelu", path);
  CLUSTR_CHECK(act == "gelu" || act == "relu", path, ": hidden_act \"", act,
               "\" is not supported (expected gelu, the exact erf form, or relu)");
  const std::string positions = json_string(j, "position_embedding_type", "absolute", path);
  CLUSTR_CHECK(positions == "absolute", path, ": position_embedding_type \"", positions,
               "\" is not supported (expected absolute)");
  BertConfig c;
  c.vocab_size = json_int(j, "vocab_size", path);
  c.hidden = json_int(j, "hidden_size", path);
  c.layers = json_int(j, "num_hidden_layers", path);
  c.heads = json_int(j, "num_attention_heads", path);
  c.intermediate = json_int(j, "intermediate_size", path);
  c.max_positions = json_int(j, "max_position_embeddings", path);
  c.type_vocab_size = json_int(j, "type_vocab_size", path);
  c.layer_norm_eps = json_float(j, "layer_norm_eps", path);
  c.dropout = json_float(j, "hidden_dropout_prob", path);
  c.attention_dropout = json_float(j, "attention_probs_dropout_prob", path);
  c.activation = parse_activation(act);
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(detail::cat(path, ": ", e.what()));
  }
  return c;
}

void BertConfig::validate() const {
  CLUSTR_CHECK(vocab_size > 0 && hidden > 0 && layers > 0 && heads > 0 && intermediate > 0 &&
                   max_positions > 0 && type_vocab_size > 0,
               "BertConfig: expected positive sizes, got vocab_size=", vocab_size,
               " hidden=", hidden, " layers=", layers, " heads=", heads,
               " intermediate=", intermediate, " max_positions=", max_positions,
               " type_vocab_size=", type_vocab_size);
  CLUSTR_CHECK(hidden % heads == 0, "BertConfig: hidden ", hidden,
               " is not a multiple of the heads ", heads);
  CLUSTR_CHECK(layer_norm_eps > 0.0f && std::isfinite(layer_norm_eps),
               "BertConfig: expected layer_norm_eps > 0, got ", layer_norm_eps);
  CLUSTR_CHECK(dropout >= 0.0f && dropout < 1.0f && attention_dropout >= 0.0f &&
                   attention_dropout < 1.0f,
               "BertConfig: expected dropout probabilities in [0, 1), got ", dropout, " and ",
               attention_dropout);
}

// ---- the model -------------------------------------------------------------------------------

BertEmbeddings::BertEmbeddings(const BertConfig& c, Generator& gen) {
  word_ = register_module("word", std::make_shared<Embedding>(c.vocab_size, c.hidden, gen));
  position_ =
      register_module("position", std::make_shared<Embedding>(c.max_positions, c.hidden, gen));
  token_type_ = register_module("token_type",
                                std::make_shared<Embedding>(c.type_vocab_size, c.hidden, gen));
  norm_ = register_module("norm", std::make_shared<LayerNorm>(c.hidden, c.layer_norm_eps));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

Variable BertEmbeddings::forward(const Tensor& ids, const Tensor& types, Generator& gen) const {
  const int64_t P = position_->num_embeddings();
  CLUSTR_CHECK(ids.defined() && ids.dtype() == DType::i32 && ids.rank() == 2,
               "BertEmbeddings: expected ids i32 (B, N), got ",
               ids.defined() ? describe(ids) : std::string("an undefined tensor"));
  const int64_t N = ids.size(1);
  CLUSTR_CHECK(N <= P, "BertEmbeddings: a sequence of ", N, " positions is longer than the ", P,
               " positions the model knows");
  if (types.defined())
    CLUSTR_CHECK(types.shape() == ids.shape(), "BertEmbeddings: expected token types of the ids' ",
                 "shape ", describe(ids), ", got ", describe(types));
  // (B, N, D) + (N, D) + either (B, N, D) or (1, D): broadcasting adds the position rows to every
  // sequence and type 0's row to every token when no types are given.
  Variable x = word_->forward(ids) + slice(position_->weight(), 0, 0, N);
  x = x + (types.defined() ? token_type_->forward(types) : slice(token_type_->weight(), 0, 0, 1));
  return dropout_->forward(norm_->forward(x), gen);
}

BertModel::BertModel(const BertConfig& c, const AttentionConfig& attention, Generator& gen)
    : config_(c) {
  c.validate();
  AttentionConfig a = attention;
  a.dropout = c.attention_dropout;
  embeddings_ = register_module("embeddings", std::make_shared<BertEmbeddings>(c, gen));
  encoder_ = register_module(
      "encoder", std::make_shared<Encoder>(c.layers, c.hidden, c.heads, c.intermediate, a,
                                           c.dropout, c.activation, /*pre_norm=*/false, gen,
                                           c.layer_norm_eps));
  pooler_ = register_module("pooler", std::make_shared<Linear>(c.hidden, c.hidden, true, gen));
  // BERT's initialisation (BertPreTrainedModel._init_weights), drawn in parameter order.
  for (const auto& [name, p] : named_parameters()) {
    Tensor t = p.data();  // shares the parameter's storage
    const bool norm = name.find("norm") != std::string::npos;
    const bool bias = name.size() >= 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (bias)
      t.fill(0.0f);
    else if (norm)
      t.fill(1.0f);
    else
      normal_(t, gen, 0.0f, 0.02f);
  }
}

std::string BertConfig::to_json() const {
  const Json j = {{"model_type", "bert"},
                  {"architectures", {"BertForMaskedLM"}},
                  {"vocab_size", vocab_size},
                  {"hidden_size", hidden},
                  {"num_hidden_layers", layers},
                  {"num_attention_heads", heads},
                  {"intermediate_size", intermediate},
                  {"max_position_embeddings", max_positions},
                  {"type_vocab_size", type_vocab_size},
                  {"layer_norm_eps", layer_norm_eps},
                  {"hidden_dropout_prob", dropout},
                  {"attention_probs_dropout_prob", attention_dropout},
                  {"hidden_act", activation_name(activation)},
                  {"position_embedding_type", "absolute"}};
  return j.dump(2) + "\n";
}

MaskedLmHead::MaskedLmHead(const BertConfig& c, Generator& gen) : config_(c) {
  transform_ =
      register_module("transform", std::make_shared<Linear>(c.hidden, c.hidden, true, gen));
  norm_ = register_module("norm", std::make_shared<LayerNorm>(c.hidden, c.layer_norm_eps));
  bias_ = register_parameter("bias", Tensor::zeros({c.vocab_size}));
  Tensor w = transform_->weight().data(), b = transform_->bias().data();
  normal_(w, gen, 0.0f, 0.02f);
  b.fill(0.0f);
}

Variable MaskedLmHead::forward(const Variable& x, const Variable& table) const {
  Variable h = transform_->forward(x);
  h = config_.activation == Activation::gelu ? gelu(h) : relu(h);
  return linear(norm_->forward(h), table, bias_);
}

Variable BertModel::forward(const Tensor& ids, const Tensor& types, const Tensor& lengths,
                            Generator& gen) const {
  const Variable x = embeddings_->forward(ids, types, gen);
  if (!lengths.defined()) return encoder_->forward(x, lengths, gen);
  const int64_t B = x.size(0), N = x.size(1);
  CLUSTR_CHECK(lengths.dtype() == DType::i32 && lengths.shape() == Shape{B},
               "BertModel: expected lengths i32 (", B, ") for ids ", describe(ids), ", got ",
               describe(lengths));
  // The layers run on the valid tokens alone (layers/token_packing.h): padding is most of the
  // rows of a batch of short and long inputs.
  const TokenPacking packing(lengths.to_int_vector(), N, x.data().device());
  if (packing.tokens() == B * N) return encoder_->forward(x, lengths, gen);
  return packing.unpack(encoder_->forward(packing.pack(x), lengths, gen, &packing));
}

Variable BertModel::pool_first(const Variable& tokens) const {
  CLUSTR_CHECK(tokens.defined() && tokens.rank() == 3 && tokens.size(1) > 0,
               "BertModel::pool_first: expected tokens (B, N, D) with N > 0, got ",
               tokens.defined() ? describe(tokens.data()) : std::string("an undefined Variable"));
  const int64_t B = tokens.size(0), D = tokens.size(2);
  return tanh(pooler_->forward(reshape(slice(tokens, 1, 0, 1), {B, D})));
}

Variable mean_pool(const Variable& tokens, const Tensor& lengths) {
  CLUSTR_CHECK(tokens.defined() && tokens.rank() == 3, "mean_pool: expected tokens (B, N, D), got ",
               tokens.defined() ? describe(tokens.data()) : std::string("an undefined Variable"));
  const int64_t B = tokens.size(0), N = tokens.size(1);
  CLUSTR_CHECK(lengths.defined() && lengths.dtype() == DType::i32 && lengths.shape() == Shape{B},
               "mean_pool: expected lengths i32 (", B, "), got ",
               lengths.defined() ? describe(lengths) : std::string("an undefined tensor"));
  const std::vector<int32_t> len = lengths.to_int_vector();
  // The weights 1 / length at valid positions and 0 past them: one product and one sum give the
  // mean, with the padded rows' gradient zero.
  std::vector<float> w(static_cast<size_t>(B * N), 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    CLUSTR_CHECK(len[b] >= 1 && len[b] <= N, "mean_pool: row ", b, " has length ", len[b],
                 ", expected one in [1, ", N, "]");
    for (int64_t n = 0; n < len[b]; ++n) w[b * N + n] = 1.0f / static_cast<float>(len[b]);
  }
  Tensor weights = Tensor::from_vector(w, {B, N, 1}).to(tokens.data().device());
  if (tokens.data().dtype() != DType::f32) weights = weights.astype(tokens.data().dtype());
  return sum(tokens * Variable(weights), 1);
}

Variable l2_normalize(const Variable& x) {
  CLUSTR_CHECK(x.defined() && x.rank() == 2, "l2_normalize: expected x (B, D), got ",
               x.defined() ? describe(x.data()) : std::string("an undefined Variable"));
  // 1e-24 under the root keeps a zero row finite (0 / 1e-12) and moves no other norm: it is far
  // below an ulp of any squared norm of a real embedding.
  return x / sqrt(add(sum(x * x, 1, /*keepdim=*/true), 1e-24f));
}

// ---- names and loading -----------------------------------------------------------------------

std::string bert_reference_name(const std::string& name) {
  static const std::vector<std::pair<std::regex, std::string>> rules = {
      {std::regex(R"(embeddings\.word\.weight)"), "embeddings.word_embeddings.weight"},
      {std::regex(R"(embeddings\.position\.weight)"), "embeddings.position_embeddings.weight"},
      {std::regex(R"(embeddings\.token_type\.weight)"), "embeddings.token_type_embeddings.weight"},
      {std::regex(R"(embeddings\.norm\.(weight|bias))"), "embeddings.LayerNorm.$1"},
      {std::regex(R"(encoder\.layers\.(\d+)\.attention\.(query|key|value)\.(weight|bias))"),
       "encoder.layer.$1.attention.self.$2.$3"},
      {std::regex(R"(encoder\.layers\.(\d+)\.attention\.out\.(weight|bias))"),
       "encoder.layer.$1.attention.output.dense.$2"},
      {std::regex(R"(encoder\.layers\.(\d+)\.norm1\.(weight|bias))"),
       "encoder.layer.$1.attention.output.LayerNorm.$2"},
      {std::regex(R"(encoder\.layers\.(\d+)\.feedforward\.linear1\.(weight|bias))"),
       "encoder.layer.$1.intermediate.dense.$2"},
      {std::regex(R"(encoder\.layers\.(\d+)\.feedforward\.linear2\.(weight|bias))"),
       "encoder.layer.$1.output.dense.$2"},
      {std::regex(R"(encoder\.layers\.(\d+)\.norm2\.(weight|bias))"),
       "encoder.layer.$1.output.LayerNorm.$2"},
      {std::regex(R"(pooler\.(weight|bias))"), "pooler.dense.$1"},
  };
  for (const auto& [pattern, replacement] : rules)
    if (std::regex_match(name, pattern)) return std::regex_replace(name, pattern, replacement);
  throw Error(detail::cat("bert_reference_name: no BERT name for the parameter '", name, "'"));
}

BertWeightsReport load_bert_weights(const std::string& path, BertModel& model) {
  const SafetensorsFile file = load_safetensors(path);
  // The file's names without the "bert." prefix of the task models.
  std::map<std::string, const Tensor*> tensors;
  for (const auto& [name, tensor] : file.tensors) {
    const bool prefixed = name.rfind("bert.", 0) == 0;
    tensors[prefixed ? name.substr(5) : name] = &tensor;
  }
  std::vector<std::string> problems;
  std::vector<std::pair<Tensor, Tensor>> copies;  // (parameter, its new value)
  std::map<std::string, bool> used;
  for (const auto& [name, p] : model.named_parameters()) {
    const std::string ref = bert_reference_name(name);
    const auto it = tensors.find(ref);
    if (it == tensors.end()) {
      problems.push_back(detail::cat("missing: ", ref, " (", name, ", ", describe(p.data()), ")"));
      continue;
    }
    used[ref] = true;
    const Tensor& t = *it->second;
    if (t.shape() != p.data().shape() ||
        (t.dtype() != DType::f32 && t.dtype() != DType::bf16)) {
      problems.push_back(detail::cat("mismatch: ", ref, " is ", describe(t), ", expected ",
                                     describe(p.data()), " (", name, ")"));
      continue;
    }
    copies.emplace_back(p.data(), t.dtype() == p.data().dtype() ? t : t.astype(p.data().dtype()));
  }
  BertWeightsReport report;
  for (const auto& [name, tensor] : tensors) {
    if (used.count(name)) continue;
    const bool known = name == "embeddings.position_ids" || name.rfind("cls.", 0) == 0;
    if (known)
      report.ignored.push_back(name);
    else
      problems.push_back(detail::cat("unexpected: ", name, " ", describe(*tensor)));
  }
  if (!problems.empty()) {
    std::ostringstream os;
    os << path << ": not a checkpoint of this BERT model (" << model.config().layers
       << " layers, D " << model.config().hidden << ", V " << model.config().vocab_size
       << "); " << problems.size() << " problem(s):";
    for (const auto& p : problems) os << "\n  " << p;
    throw Error(os.str());
  }
  for (auto& [dst, src] : copies) dst.copy_from(src);
  return report;
}

}  // namespace clustr
