// Fine-tuning and evaluating a pretrained BERT model on the WordNet tasks (see finetune.h).
#include "apps/text/finetune.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>

#include "apps/common/device.h"
#include "apps/common/metrics_file.h"
#include "apps/common/run_folder.h"
#include "apps/common/stop_signal.h"
#include "apps/common/training.h"
#include "apps/text/pretrained.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "layers/checkpoint.h"
#include "optim/optimizer.h"

namespace clustr::text {

Task parse_task(const std::string& name) {
  if (name == "wic") return Task::wic;
  if (name == "span") return Task::span;
  throw Error(detail::cat("unknown task '", name, "' (expected wic or span)"));
}

const char* task_name(Task task) { return task == Task::wic ? "wic" : "span"; }

TaskModel::TaskModel(Task task, const BertConfig& config, const AttentionConfig& attention,
                     Generator& gen)
    : task_(task) {
  bert_ = register_module("bert", std::make_shared<BertModel>(config, attention, gen));
  head_ = register_module("head", std::make_shared<Linear>(config.hidden, 2, true, gen));
  // BERT's initialisation of a task head: normal(0, 0.02) weights, zero bias.
  Tensor w = head_->weight().data(), b = head_->bias().data();
  normal_(w, gen, 0.0f, 0.02f);
  b.fill(0.0f);
}

// ---- encoding --------------------------------------------------------------------------------

EncodedSet encode_wic(const std::vector<WicExample>& examples, const TextTokenizer& tokenizer,
                      int max_length) {
  EncodedSet out;
  for (const WicExample& e : examples) {
    const std::string a = e.lemma + " : " + e.sentence1;
    const BertEncoding enc = tokenizer.encode(a, &e.sentence2, max_length);
    Encoded x;
    x.ids = enc.ids;
    x.types = enc.type_ids;
    x.label = e.label;
    out.examples.push_back(std::move(x));
  }
  return out;
}

EncodedSet encode_span(const std::vector<SpanExample>& examples, const TextTokenizer& tokenizer,
                       int max_length) {
  EncodedSet out;
  for (const SpanExample& e : examples) {
    const std::vector<int32_t> q = tokenizer.encode(e.question);
    const std::vector<int32_t> before = tokenizer.encode(e.context.substr(0, e.answer.begin));
    const std::vector<int32_t> answer = tokenizer.encode(e.answer_text);
    const std::vector<int32_t> after = tokenizer.encode(e.context.substr(e.answer.end));
    std::vector<int32_t> context = before;
    context.insert(context.end(), answer.begin(), answer.end());
    context.insert(context.end(), after.begin(), after.end());
    if (q.size() + context.size() + 3 > static_cast<size_t>(max_length)) {
      ++out.dropped_too_long;
      continue;
    }
    if (answer.empty() || context != tokenizer.encode(e.context)) {
      ++out.dropped_unaligned;
      continue;
    }
    Encoded x;
    x.ids.push_back(tokenizer.cls_id());
    x.ids.insert(x.ids.end(), q.begin(), q.end());
    x.ids.push_back(tokenizer.sep_id());
    x.types.assign(x.ids.size(), 0);
    x.context_begin = static_cast<int32_t>(x.ids.size());
    x.ids.insert(x.ids.end(), context.begin(), context.end());
    x.context_end = static_cast<int32_t>(x.ids.size());
    x.ids.push_back(tokenizer.sep_id());
    x.types.resize(x.ids.size(), 1);
    x.start = x.context_begin + static_cast<int32_t>(before.size());
    x.end = x.start + static_cast<int32_t>(answer.size()) - 1;
    x.answer = e.answer_text;
    out.examples.push_back(std::move(x));
  }
  return out;
}

EncodedSet load_split(Task task, const std::string& data_dir, const std::string& split,
                      const TextTokenizer& tokenizer, int max_length) {
  const std::string path = data_dir + "/" + task_name(task) + "/" + split + ".jsonl";
  CLUSTR_CHECK(std::filesystem::exists(path), "no ", split, " split of the ", task_name(task),
               " task at ", path, " (`text tasks --out ", data_dir, "` builds the tasks)");
  return task == Task::wic ? encode_wic(read_wic_jsonl(path), tokenizer, max_length)
                           : encode_span(read_span_jsonl(path), tokenizer, max_length);
}

// ---- batches, forward, loss ------------------------------------------------------------------

Batch make_batch(const std::vector<Encoded>& examples, const std::vector<int64_t>& rows,
                 int32_t pad_id, Task task, Device device) {
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t N = 0;
  for (int64_t r : rows) N = std::max<int64_t>(N, static_cast<int64_t>(examples[r].ids.size()));
  std::vector<int32_t> ids(B * N, pad_id), types(B * N, 0), lengths(B), target(B), end(B);
  std::vector<float> mask(task == Task::span ? B * N : 0, -1e4f);
  for (int64_t b = 0; b < B; ++b) {
    const Encoded& e = examples[rows[b]];
    std::copy(e.ids.begin(), e.ids.end(), ids.begin() + b * N);
    std::copy(e.types.begin(), e.types.end(), types.begin() + b * N);
    lengths[b] = static_cast<int32_t>(e.ids.size());
    target[b] = task == Task::wic ? e.label : e.start;
    end[b] = e.end;
    if (task == Task::span)
      std::fill(mask.begin() + b * N + e.context_begin, mask.begin() + b * N + e.context_end, 0.0f);
  }
  Batch batch;
  batch.ids = Tensor::from_int_vector(ids, {B, N}).to(device);
  batch.types = Tensor::from_int_vector(types, {B, N}).to(device);
  batch.lengths = Tensor::from_int_vector(lengths, {B}).to(device);
  batch.target = Tensor::from_int_vector(target, {B}).to(device);
  if (task == Task::span) {
    batch.target_end = Tensor::from_int_vector(end, {B}).to(device);
    batch.mask = Tensor::from_vector(mask, {B, N}).to(device);
  }
  return batch;
}

Variable task_forward(const TaskModel& model, const Batch& batch, Generator& gen) {
  const Variable tokens = model.bert().forward(batch.ids, batch.types, batch.lengths, gen);
  if (model.task() == Task::wic) return model.head().forward(model.bert().pool_first(tokens));
  return model.head().forward(tokens);
}

namespace {

// The start (which 0) or end (1) logits of a span output (B, N, 2), masked: (B, N).
Variable span_logits(const Variable& output, const Batch& batch, int which) {
  const int64_t B = output.size(0), N = output.size(1);
  return reshape(slice(output, 2, which, 1), {B, N}) + Variable(batch.mask);
}

}  // namespace

Variable task_loss(Task task, const Batch& batch, const Variable& output) {
  if (task == Task::wic) return cross_entropy(output, batch.target);
  return (cross_entropy(span_logits(output, batch, 0), batch.target) +
          cross_entropy(span_logits(output, batch, 1), batch.target_end)) *
         0.5f;
}

// ---- evaluation ------------------------------------------------------------------------------

namespace {

// The best span of row b: max start + end logit over context positions with
// start <= end < start + kMaxAnswerPieces.
std::pair<int64_t, int64_t> best_span(const std::vector<float>& start,
                                      const std::vector<float>& end, int64_t N, int64_t b,
                                      const Encoded& e) {
  std::pair<int64_t, int64_t> best{e.context_begin, e.context_begin};
  float best_score = -INFINITY;
  for (int64_t s = e.context_begin; s < e.context_end; ++s)
    for (int64_t t = s; t < std::min<int64_t>(e.context_end, s + kMaxAnswerPieces); ++t) {
      const float score = start[b * N + s] + end[b * N + t];
      if (score > best_score) best_score = score, best = {s, t};
    }
  return best;
}

}  // namespace

Score evaluate_task(const TaskModel& model, const std::vector<Encoded>& examples,
                    const TextTokenizer& tokenizer, int64_t batch, Precision precision) {
  CLUSTR_CHECK(!examples.empty(), "evaluate: no examples");
  const auto t0 = Clock::now();
  const Device device = device_of(model);
  std::vector<int64_t> order(examples.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return examples[a].ids.size() > examples[b].ids.size();
  });
  const PrecisionScope scope(precision);
  const NoGradGuard no_grad;
  Generator gen(0);  // unused in evaluation: no dropout; the clustering's hashes only
  Score score;
  double loss_sum = 0, correct = 0, em = 0, f1 = 0;
  for (size_t first = 0; first < order.size(); first += batch) {
    const std::vector<int64_t> rows(order.begin() + first,
                                    order.begin() + std::min(order.size(), first + batch));
    const Batch b = make_batch(examples, rows, tokenizer.pad_id(), model.task(), device);
    const Variable out = task_forward(model, b, gen);
    const int64_t B = static_cast<int64_t>(rows.size());
    loss_sum += double(task_loss(model.task(), b, out).data().item()) * double(B);
    if (model.task() == Task::wic) {
      const std::vector<float> logits = out.data().astype(DType::f32).to_vector();
      for (int64_t r = 0; r < B; ++r)
        correct += (logits[2 * r + 1] > logits[2 * r] ? 1 : 0) == examples[rows[r]].label;
    } else {
      const int64_t N = out.size(1);
      const std::vector<float> s = span_logits(out, b, 0).data().astype(DType::f32).to_vector();
      const std::vector<float> e = span_logits(out, b, 1).data().astype(DType::f32).to_vector();
      for (int64_t r = 0; r < B; ++r) {
        const Encoded& x = examples[rows[r]];
        const auto [first_piece, last_piece] = best_span(s, e, N, r, x);
        const std::string text = tokenizer.text(x.ids, first_piece, last_piece);
        em += squad_exact_match(text, {x.answer});
        f1 += squad_f1(text, {x.answer});
      }
    }
  }
  const double n = static_cast<double>(examples.size());
  score.examples = static_cast<int64_t>(examples.size());
  score.loss = loss_sum / n;
  score.accuracy = correct / n;
  score.exact_match = em / n;
  score.f1 = f1 / n;
  synchronize_device(device);
  score.seconds = seconds_since(t0);
  return score;
}

// ---- checkpoints ------------------------------------------------------------------------------

std::map<std::string, std::string> run_config_of(const FinetuneOptions& o) {
  return {{"task", task_name(o.task)},
          {"model", o.model},
          {"data", o.data},
          {"max-length", std::to_string(o.max_length)},
          {"attention", attention_type_name(o.attention.type)},
          {"clusters", std::to_string(o.attention.clusters)},
          {"topk", std::to_string(o.attention.topk)},
          {"bits", std::to_string(o.attention.bits)},
          {"iterations", std::to_string(o.attention.iterations)},
          {"epochs", std::to_string(o.epochs)},
          {"batch", std::to_string(o.batch)},
          {"lr", exact_text(o.lr)},
          {"weight-decay", exact_text(o.weight_decay)},
          {"warmup", exact_text(o.warmup)},
          {"clip", exact_text(o.clip)},
          {"max-train", std::to_string(o.max_train)},
          {"max-dev", std::to_string(o.max_dev)},
          {"seed", std::to_string(o.seed)},
          {"precision", o.precision}};
}

namespace {

const std::string& config_value(const std::map<std::string, std::string>& config,
                                const char* key, const std::string& file) {
  const auto it = config.find(key);
  CLUSTR_CHECK(it != config.end(), file, ": not a text finetune checkpoint (no '", key,
               "' in its config)");
  return it->second;
}

}  // namespace

FinetunedModel load_finetuned(const std::string& path, const std::string& model_dir,
                              const AttentionConfig& attention) {
  FinetunedModel f;
  f.checkpoint = resolve_checkpoint(path, "--checkpoint", {"best.safetensors", "last.safetensors"});
  const std::map<std::string, std::string> config = read_checkpoint_config(f.checkpoint);
  f.task = parse_task(config_value(config, "task", f.checkpoint));
  f.model_dir = model_dir.empty() ? config_value(config, "model", f.checkpoint) : model_dir;
  f.data = config_value(config, "data", f.checkpoint);
  f.max_length = static_cast<int>(config_number(config, "max-length", f.checkpoint));
  const std::string cfg = f.model_dir + "/config.json";
  CLUSTR_CHECK(std::filesystem::exists(cfg), f.checkpoint, " was fine-tuned from ", f.model_dir,
               ", which has no config.json (--model names the pretrained model's folder)");
  Generator gen(0);
  f.model = std::make_unique<TaskModel>(f.task, BertConfig::read(cfg), attention, gen);
  load_checkpoint(f.checkpoint, *f.model);
  f.model->eval();
  f.tokenizer = std::make_unique<TextTokenizer>(TextTokenizer::load(f.model_dir));
  return f;
}

}  // namespace clustr::text
