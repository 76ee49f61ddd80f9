// A pretrained sentence encoder read from its folder (see pretrained.h).
#include "apps/text/pretrained.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "autograd/variable.h"
#include "core/error.h"
#include "core/ops.h"

#ifndef CLUSTR_SOURCE_DIR
#error "CLUSTR_SOURCE_DIR must name the repository (apps/CMakeLists.txt)"
#endif

namespace clustr::text {

using Json = nlohmann::json;

std::string default_pretrained_dir() {
  const char* env = std::getenv("CLUSTR_PRETRAINED_DIR");
  return env && *env ? std::string(env) : std::string(CLUSTR_SOURCE_DIR) + "/models/all-MiniLM-L6-v2";
}

BertConfig read_pretrained_config(const std::string& dir) {
  namespace fs = std::filesystem;
  CLUSTR_CHECK(fs::is_directory(dir), "no pretrained model folder ", dir,
               " (python3 data/prepare_pretrained.py writes all-MiniLM-L6-v2 there; --model "
               "names another folder)");
  for (const char* name : {"config.json", "model.safetensors"})
    CLUSTR_CHECK(fs::exists(fs::path(dir) / name), dir, ": the pretrained model folder has no ",
                 name);
  return BertConfig::read(dir + "/config.json");
}

PretrainedModel load_pretrained(const std::string& dir, const AttentionConfig& attention,
                                Generator& gen) {
  namespace fs = std::filesystem;
  const BertConfig config = read_pretrained_config(dir);
  const auto file = [&](const char* name) { return (fs::path(dir) / name).string(); };

  PretrainedModel m;
  m.dir = dir;
  m.model = std::make_unique<BertModel>(config, attention, gen);
  load_bert_weights(file("model.safetensors"), *m.model);
  m.model->eval();

  m.tokenizer = std::make_unique<TextTokenizer>(TextTokenizer::load(dir));
  CLUSTR_CHECK(m.tokenizer->size() <= config.vocab_size, dir, ": the tokenizer has ",
               m.tokenizer->size(), " pieces, more than the model's ", config.vocab_size);

  m.max_length = config.max_positions;
  if (fs::exists(file("sentence_bert_config.json"))) {
    const Json j = read_json_file(file("sentence_bert_config.json"));
    if (j.is_object() && j.contains("max_seq_length")) {
      CLUSTR_CHECK(j["max_seq_length"].is_number_integer() && j["max_seq_length"].get<int64_t>() >= 3,
                   file("sentence_bert_config.json"),
                   ": expected max_seq_length to be an integer >= 3, got ",
                   j["max_seq_length"].dump());
      m.max_length = std::min(m.max_length, j["max_seq_length"].get<int64_t>());
    }
  }
  if (fs::exists(file("1_Pooling/config.json"))) {
    const std::string path = file("1_Pooling/config.json");
    const Json j = read_json_file(path);
    CLUSTR_CHECK(json_bool(j, "pooling_mode_mean_tokens", true, path) &&
                     !json_bool(j, "pooling_mode_cls_token", false, path) &&
                     !json_bool(j, "pooling_mode_max_tokens", false, path) &&
                     !json_bool(j, "pooling_mode_mean_sqrt_len_tokens", false, path),
                 path, ": only mean pooling (pooling_mode_mean_tokens alone) is implemented");
  }
  m.normalize = false;
  if (fs::exists(file("modules.json"))) {
    const Json j = read_json_file(file("modules.json"));
    CLUSTR_CHECK(j.is_array(), file("modules.json"), ": expected a list of modules");
    for (const Json& module : j) {
      const std::string type = module.is_object() && module.contains("type") &&
                                        module["type"].is_string()
                                    ? module["type"].get<std::string>()
                                    : "";
      if (type.size() >= 9 && type.compare(type.size() - 9, 9, "Normalize") == 0)
        m.normalize = true;
    }
  }
  return m;
}

Tensor embed(const PretrainedModel& m, const std::vector<std::string>& sentences, int64_t batch,
             Precision precision, Generator& gen, const std::function<std::string(size_t)>& name) {
  CLUSTR_CHECK(batch >= 1, "embed: expected a batch of at least 1, got ", batch);
  const int64_t S = static_cast<int64_t>(sentences.size());
  const int64_t D = m.model->config().hidden;
  std::vector<std::vector<int32_t>> ids(S);
  for (int64_t s = 0; s < S; ++s) {
    try {
      ids[s] = m.tokenizer->encode(sentences[s], nullptr, static_cast<int>(m.max_length)).ids;
    } catch (const Error& e) {
      throw Error(name ? detail::cat(name(static_cast<size_t>(s)), ": ", e.what())
                       : detail::cat("sentence ", s + 1, " of ", S, ": ", e.what()));
    }
  }
  // Longest first: each batch pads to its first sentence's length.
  std::vector<int64_t> order(S);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return ids[a].size() > ids[b].size(); });

  const Device device = m.model->embeddings().word().weight().data().device();
  const PrecisionScope scope(precision);
  const NoGradGuard no_grad;
  std::vector<float> out(static_cast<size_t>(S * D));
  for (int64_t first = 0; first < S; first += batch) {
    const int64_t B = std::min(batch, S - first);
    const int64_t N = static_cast<int64_t>(ids[order[first]].size());
    std::vector<int32_t> flat(static_cast<size_t>(B * N), m.tokenizer->pad_id()), lengths(B);
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<int32_t>& row = ids[order[first + b]];
      std::copy(row.begin(), row.end(), flat.begin() + b * N);
      lengths[b] = static_cast<int32_t>(row.size());
    }
    const Tensor len = Tensor::from_int_vector(lengths, {B}).to(device);
    const Variable tokens =
        m.model->forward(Tensor::from_int_vector(flat, {B, N}).to(device), Tensor(), len, gen);
    Variable pooled = mean_pool(tokens, len);
    if (m.normalize) pooled = l2_normalize(pooled);
    const std::vector<float> v = pooled.data().astype(DType::f32).to_vector();
    for (int64_t b = 0; b < B; ++b)
      std::copy(v.begin() + b * D, v.begin() + (b + 1) * D, out.begin() + order[first + b] * D);
  }
  return Tensor::from_vector(out, {S, D});
}

}  // namespace clustr::text
