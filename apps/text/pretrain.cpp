// Pretraining a BERT-family encoder as a masked language model (see pretrain.h).
#include "apps/text/pretrain.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "apps/common/device.h"
#include "apps/common/metrics_file.h"
#include "apps/common/run_folder.h"
#include "apps/common/stop_signal.h"
#include "apps/common/training.h"
#include "apps/text/schedule.h"
#include "apps/text/tokenizer.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/precision.h"
#include "core/safetensors.h"
#include "layers/checkpoint.h"
#include "optim/optimizer.h"

namespace clustr::text {

namespace fs = std::filesystem;

// ---- the corpus ------------------------------------------------------------------------------

std::vector<std::string> default_corpus() {
  std::vector<std::string> out;
  if (fs::is_directory("/usr/share/games/fortunes")) out.push_back("/usr/share/games/fortunes");
  // python3-doc installs the documentation of Debian's Python, /usr/share/doc/python3.X.
  std::vector<std::string> docs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/share/doc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("python3.", 0) == 0 && fs::is_directory(e.path() / "html" / "_sources"))
      docs.push_back((e.path() / "html" / "_sources").string());
  }
  std::sort(docs.begin(), docs.end());
  if (!docs.empty()) out.push_back(docs.back());
  return out;
}

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Appends the paragraphs of `text` to `out` (see pretrain.h).
void split_paragraphs(const std::string& text, Corpus& out) {
  std::string paragraph;
  const auto flush = [&] {
    if (paragraph.empty()) return;
    (fnv1a(paragraph) % 100 == 0 ? out.dev : out.train).push_back(paragraph);
    paragraph.clear();
  };
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::string words;
    std::istringstream ls(line);
    for (std::string w; ls >> w;) words += (words.empty() ? "" : " ") + w;
    if (words.empty() || words == "%") {
      flush();
      continue;
    }
    paragraph += (paragraph.empty() ? "" : " ") + words;
  }
  flush();
}

}  // namespace

Corpus read_corpus(const std::vector<std::string>& paths, int64_t max_bytes) {
  CLUSTR_CHECK(!paths.empty(), "pretrain: no corpus (--corpus names text files or folders; by "
               "default the fortune files and the Python documentation, from Debian's fortunes "
               "and python3-doc, where installed)");
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    CLUSTR_CHECK(fs::exists(p), "--corpus: ", p, " does not exist");
    if (!fs::is_directory(p)) {
      files.push_back(p);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& e : fs::recursive_directory_iterator(p))
      if (e.is_regular_file() && !e.is_symlink()) found.push_back(e.path().string());
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  Corpus corpus;
  for (const std::string& f : files) {
    if (max_bytes > 0 && corpus.bytes >= max_bytes) break;
    std::ifstream in(f, std::ios::binary);
    CLUSTR_CHECK(in, "--corpus: cannot read ", f);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    std::string text = bytes.str();
    if (text.find('\0') != std::string::npos || utf8_error_offset(text) >= 0) {
      ++corpus.skipped_files;
      continue;
    }
    if (max_bytes > 0 && static_cast<int64_t>(text.size()) > max_bytes - corpus.bytes) {
      size_t cut = size_t(max_bytes - corpus.bytes);
      while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
      text.resize(cut);  // at a character's first byte
    }
    ++corpus.files;
    corpus.bytes += static_cast<int64_t>(text.size());
    split_paragraphs(text, corpus);
  }
  CLUSTR_CHECK(!corpus.train.empty(), "pretrain: the corpus (", files.size(), " files, ",
               corpus.skipped_files, " of them not UTF-8 text) holds no paragraph to train on");
  return corpus;
}

// ---- the model -------------------------------------------------------------------------------

MaskedLmModel::MaskedLmModel(const BertConfig& config, const AttentionConfig& attention,
                             Generator& gen) {
  bert_ = register_module("bert", std::make_shared<BertModel>(config, attention, gen));
  mlm_ = register_module("mlm", std::make_shared<MaskedLmHead>(config, gen));
}

MaskedBatch mask_sequences(const std::vector<std::vector<int32_t>>& sequences,
                           const std::vector<int64_t>& rows, float fraction, int32_t mask_id,
                           int32_t first_plain, int32_t vocab, uint64_t key, Device device) {
  CLUSTR_CHECK(!rows.empty() && fraction > 0 && fraction < 1 && first_plain < vocab,
               "mask_sequences: ", rows.size(), " rows, fraction ", fraction, ", plain ids [",
               first_plain, ", ", vocab, ")");
  const int64_t B = static_cast<int64_t>(rows.size());
  const int64_t L = static_cast<int64_t>(sequences[rows[0]].size());
  std::vector<int32_t> ids(B * L), positions, targets;
  for (int64_t b = 0; b < B; ++b) {
    const std::vector<int32_t>& s = sequences[rows[b]];
    CLUSTR_CHECK(static_cast<int64_t>(s.size()) == L && L >= 3, "mask_sequences: sequence ",
                 rows[b], " has ", s.size(), " pieces, expected ", L, " (at least 3)");
    std::copy(s.begin(), s.end(), ids.begin() + b * L);
    std::mt19937_64 rng(derive_key(key, static_cast<uint64_t>(rows[b])));
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::vector<int64_t> chosen;
    for (int64_t n = 1; n + 1 < L; ++n)
      if (u(rng) < fraction) chosen.push_back(n);
    if (chosen.empty()) chosen.push_back(1 + static_cast<int64_t>(rng() % uint64_t(L - 2)));
    for (int64_t n : chosen) {
      positions.push_back(static_cast<int32_t>(b * L + n));
      targets.push_back(s[n]);
      const double r = u(rng);
      if (r < 0.8)
        ids[b * L + n] = mask_id;
      else if (r < 0.9)
        ids[b * L + n] = first_plain + static_cast<int32_t>(rng() % uint64_t(vocab - first_plain));
    }
  }
  const int64_t M = static_cast<int64_t>(positions.size());
  return {Tensor::from_int_vector(ids, {B, L}).to(device),
          Tensor::from_int_vector(positions, {M}).to(device),
          Tensor::from_int_vector(targets, {M}).to(device)};
}

MaskedLmOutput masked_lm_forward(const MaskedLmModel& model, const MaskedBatch& batch,
                                 Generator& gen) {
  const int64_t B = batch.ids.size(0), L = batch.ids.size(1);
  const Variable tokens = model.bert().forward(batch.ids, Tensor(), Tensor(), gen);
  // Only the chosen positions go through the head: a row lookup in the (B L, D) outputs.
  const Variable chosen = embedding(reshape(tokens, {B * L, tokens.size(2)}), batch.positions);
  MaskedLmOutput out;
  out.logits = model.mlm().forward(chosen, model.bert().embeddings().word().weight());
  out.loss = cross_entropy(out.logits, batch.targets);
  return out;
}

// ---- the run ---------------------------------------------------------------------------------

std::map<std::string, std::string> pretrain_config_of(const PretrainOptions& o) {
  std::string corpus;
  for (const std::string& c : o.corpus) corpus += (corpus.empty() ? "" : ":") + c;
  return {{"corpus", corpus},
          {"max-corpus-bytes", std::to_string(o.max_corpus_bytes)},
          {"vocab", std::to_string(o.vocab)},
          {"layers", std::to_string(o.layers)},
          {"hidden", std::to_string(o.hidden)},
          {"heads", std::to_string(o.heads)},
          {"intermediate", std::to_string(o.intermediate)},
          {"length", std::to_string(o.length)},
          {"batch", std::to_string(o.batch)},
          {"steps", std::to_string(o.steps)},
          {"lr", exact_text(o.lr)},
          {"weight-decay", exact_text(o.weight_decay)},
          {"warmup", exact_text(o.warmup)},
          {"clip", exact_text(o.clip)},
          {"mask", exact_text(o.mask)},
          {"dropout", exact_text(o.dropout)},
          {"eval-interval", std::to_string(o.eval_interval)},
          {"max-dev", std::to_string(o.max_dev)},
          {"attention", attention_type_name(o.attention.type)},
          {"clusters", std::to_string(o.attention.clusters)},
          {"topk", std::to_string(o.attention.topk)},
          {"seed", std::to_string(o.seed)},
          {"precision", o.precision}};
}

namespace {

struct Row {
  int64_t step = 0;
  double train_loss = NAN, dev_loss = NAN, dev_accuracy = NAN, lr = NAN, seconds = NAN;
};

MetricsLog<Row> metrics_log() {
  return MetricsLog<Row>({{"step", &Row::step, nullptr, nullptr},
                          {"train_loss", nullptr, &Row::train_loss, "%.6g"},
                          {"dev_loss", nullptr, &Row::dev_loss, "%.6g"},
                          {"dev_accuracy", nullptr, &Row::dev_accuracy, "%.6g"},
                          {"lr", nullptr, &Row::lr, "%.6g"},
                          {"seconds", nullptr, &Row::seconds, "%.6g"}});
}

// A split's paragraphs encoded, concatenated and cut into [CLS] L-2 pieces [SEP].
std::vector<std::vector<int32_t>> make_sequences(const std::vector<std::string>& paragraphs,
                                                 const TextTokenizer& tokenizer, int length) {
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> current{tokenizer.cls_id()};
  for (const std::string& p : paragraphs)
    for (int32_t id : tokenizer.encode(p)) {
      current.push_back(id);
      if (static_cast<int>(current.size()) == length - 1) {
        current.push_back(tokenizer.sep_id());
        out.push_back(std::move(current));
        current = {tokenizer.cls_id()};
      }
    }
  return out;
}

uint64_t sequences_hash(const std::vector<std::vector<int32_t>>& sequences) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& s : sequences)
    for (int32_t id : s) h = (h ^ static_cast<uint32_t>(id)) * 1099511628211ull;
  return h;
}

// The Hugging Face name of a MaskedLmModel parameter (BertForMaskedLM's).
std::string reference_name(const std::string& name) {
  if (name.rfind("bert.", 0) == 0) return "bert." + bert_reference_name(name.substr(5));
  static const std::map<std::string, std::string> head = {
      {"mlm.transform.weight", "cls.predictions.transform.dense.weight"},
      {"mlm.transform.bias", "cls.predictions.transform.dense.bias"},
      {"mlm.norm.weight", "cls.predictions.transform.LayerNorm.weight"},
      {"mlm.norm.bias", "cls.predictions.transform.LayerNorm.bias"},
      {"mlm.bias", "cls.predictions.bias"}};
  const auto it = head.find(name);
  CLUSTR_CHECK(it != head.end(), "pretrain: no reference name for parameter ", name);
  return it->second;
}

struct DevScore {
  double loss = 0, accuracy = 0;
};

DevScore evaluate_dev(const MaskedLmModel& model, const std::vector<std::vector<int32_t>>& dev,
                      const TextTokenizer& tokenizer, const PretrainOptions& o, Device device,
                      Precision precision) {
  const PrecisionScope scope(precision);
  const NoGradGuard no_grad;
  Generator gen(0);  // no dropout in evaluation
  double loss = 0, correct = 0, count = 0;
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(dev.size()), o.max_dev);
  for (int64_t first = 0; first < n; first += o.batch) {
    std::vector<int64_t> rows;
    for (int64_t r = first; r < std::min(n, first + o.batch); ++r) rows.push_back(r);
    const MaskedBatch b = mask_sequences(dev, rows, o.mask, tokenizer.mask_id(),
                                         int32_t(kSpecialPieces.size()) + 1, tokenizer.size(),
                                         derive_key(o.seed, 3), device);
    const MaskedLmOutput out = masked_lm_forward(model, b, gen);
    const int64_t M = b.targets.numel(), V = out.logits.size(1);
    loss += double(out.loss.data().item()) * double(M);
    const std::vector<float> logits = out.logits.data().astype(DType::f32).to_vector();
    const std::vector<int32_t> targets = b.targets.to(Device::cpu).to_int_vector();
    for (int64_t m = 0; m < M; ++m) {
      const float* row = logits.data() + m * V;
      correct += (std::max_element(row, row + V) - row) == targets[m];
    }
    count += double(M);
  }
  return {loss / std::max(1.0, count), correct / std::max(1.0, count)};
}

}  // namespace

int pretrain(const PretrainOptions& o_in, std::FILE* log) {
  PretrainOptions o = o_in;
  if (o.corpus.empty()) o.corpus = default_corpus();
  CLUSTR_CHECK(o.length >= 8 && o.length <= 4096, "--length must be in [8, 4096], got ", o.length);
  CLUSTR_CHECK(o.batch >= 1, "--batch must be >= 1, got ", o.batch);
  CLUSTR_CHECK(o.steps >= 1, "--steps must be >= 1, got ", o.steps);
  CLUSTR_CHECK(o.lr > 0 && std::isfinite(o.lr), "--lr must be > 0, got ", o.lr);
  CLUSTR_CHECK(o.warmup >= 0 && o.warmup < 1, "--warmup must be in [0, 1), got ", o.warmup);
  CLUSTR_CHECK(o.mask > 0 && o.mask < 1, "--mask must be in (0, 1), got ", o.mask);
  CLUSTR_CHECK(o.dropout >= 0 && o.dropout < 1, "--dropout must be in [0, 1), got ", o.dropout);
  CLUSTR_CHECK(o.vocab >= 16, "--vocab must be >= 16, got ", o.vocab);
  CLUSTR_CHECK(o.eval_interval >= 1 && o.max_dev >= 1, "--eval-interval and --max-dev must be "
               ">= 1, got ", o.eval_interval, " and ", o.max_dev);
  const Precision precision = parse_precision(o.precision);
  o.attention.validate();
  const auto t_corpus = Clock::now();
  const Corpus corpus = read_corpus(o.corpus, o.max_corpus_bytes);
  const OutMode mode = out_mode(!o.resume.empty(), o.overwrite);
  const std::string folder = choose_out_folder(o.out, o.out_given, o.resume, mode, log);
  const Device device = prepare_machine(o.machine);
  RunFolder run(folder, mode, {"metrics.csv", "loss.png", "last.safetensors", "model.safetensors",
                               "config.json", "pieces.model", "sentence_bert_config.json"}, log);

  CLUSTR_CHECK(!corpus.dev.empty(), "pretrain: the corpus is too small to hold out dev "
               "paragraphs (one in 100 is held out; it has ", corpus.train.size(), ")");
  // A new run learns the vocabulary; a resumed one reads the run's own.
  if (mode != OutMode::resume) {
    WordPieceOptions wo;
    wo.normalization = "nmt_nfkc_cf";
    wo.control_symbols = kSpecialPieces;
    wo.character_coverage = 0.9995;
    WordPieces::train(corpus.train, o.vocab, wo).save(run.file("pieces.model"));
  }
  const TextTokenizer tokenizer = TextTokenizer::load(run.path());
  const std::vector<std::vector<int32_t>> train = make_sequences(corpus.train, tokenizer, o.length);
  const std::vector<std::vector<int32_t>> dev = make_sequences(corpus.dev, tokenizer, o.length);
  CLUSTR_CHECK(static_cast<int64_t>(train.size()) >= o.batch && !dev.empty(), "pretrain: the "
               "corpus gives ", train.size(), " training and ", dev.size(), " dev sequences of ",
               o.length, " pieces; expected at least --batch (", o.batch, ") and 1");
  logf(log, "corpus: %lld files (%lld skipped: not UTF-8 text), %.1f MB, %zu + %zu paragraphs; "
            "%zu train and %zu dev sequences of %d pieces; vocabulary %d (%.1f s)\n",
       static_cast<long long>(corpus.files), static_cast<long long>(corpus.skipped_files),
       double(corpus.bytes) / 1e6, corpus.train.size(), corpus.dev.size(), train.size(),
       dev.size(), o.length, tokenizer.size(), seconds_since(t_corpus));

  BertConfig config;
  config.vocab_size = tokenizer.size();
  config.hidden = o.hidden;
  config.layers = o.layers;
  config.heads = o.heads;
  config.intermediate = o.intermediate;
  config.max_positions = o.length;
  config.dropout = config.attention_dropout = o.dropout;
  Generator gen(derive_key(o.seed, 0));
  MaskedLmModel model(config, o.attention, gen);
  model.to(device);
  optim::AdamOptions adam = optim::adamw_defaults();
  adam.lr = o.lr;
  adam.weight_decay = o.weight_decay;
  optim::AdamW optimizer(model.named_parameters(), adam);

  std::map<std::string, std::string> settings = pretrain_config_of(o);
  const std::string data_hash = std::to_string(sequences_hash(train));
  int64_t step = 0;
  if (mode == OutMode::resume) {
    const std::map<std::string, std::string> saved =
        read_checkpoint_config(run.file("last.safetensors"));
    std::string differences;
    for (const auto& [key, value] : settings)
      if (!saved.count(key) || saved.at(key) != value)
        differences += detail::cat("\n  --", key, ": the run has ",
                                   saved.count(key) ? saved.at(key) : "(absent)", ", now ", value);
    CLUSTR_CHECK(differences.empty(), "--resume ", folder, ": a resumed run goes on with the "
                 "run's own settings; these differ:", differences);
    CLUSTR_CHECK(saved.count("state.sequences") && saved.at("state.sequences") == data_hash,
                 "--resume ", folder, ": the corpus no longer gives the sequences the run "
                 "trained on (its files changed)");
    const LoadedCheckpoint c = load_checkpoint(run.file("last.safetensors"), model);
    optimizer.load_state_dict(c.extras);
    c.restore_generator(gen);
    step = c.step;
    logf(log, "resumed %s at step %lld\n", run.file("last.safetensors").c_str(),
         static_cast<long long>(step));
  }
  MetricsLog<Row> metrics = metrics_log();
  metrics.start(run.file("metrics.csv"), mode == OutMode::resume ? step : -1, log);
  logf(log, "model: %lld layers, D %lld, %lld heads, F %lld, %lld parameters; %lld steps of "
            "batch %lld; attention %s; device %s; products %s\n",
       static_cast<long long>(o.layers), static_cast<long long>(o.hidden),
       static_cast<long long>(o.heads), static_cast<long long>(o.intermediate),
       static_cast<long long>(model.parameter_count()), static_cast<long long>(o.steps),
       static_cast<long long>(o.batch), attention_type_name(o.attention.type),
       o.machine.device.c_str(), to_string(precision));

  // The model folder's files: config, weights under their reference names, sentence length.
  const auto save_model = [&] {
    write_lines_atomically(run.file("config.json"), {config.to_json()});
    write_lines_atomically(run.file("sentence_bert_config.json"),
                           {detail::cat("{\"max_seq_length\": ", o.length, "}\n")});
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& [name, p] : model.named_parameters())
      tensors.emplace_back(reference_name(name), p.data());
    save_safetensors(run.file("model.safetensors"), tensors, {{"format", "pt"}});
  };
  const auto save_last = [&] {
    CheckpointState state;
    state.step = step;
    state.config = settings;
    state.config["state.sequences"] = data_hash;
    state.extras = optimizer.state_dict();
    state.rng = GeneratorState::of(gen);
    check_finite_state(model, state.extras, run.file("last.safetensors"));
    save_checkpoint(run.file("last.safetensors"), model, state);
  };

  const int64_t per_epoch = static_cast<int64_t>(train.size()) / o.batch;
  const int64_t limit = o.max_steps > 0 ? std::min(o.max_steps, o.steps) : o.steps;
  const int32_t first_plain = static_cast<int32_t>(kSpecialPieces.size()) + 1;
  const StopOnSignal stop;
  const auto t0 = Clock::now();
  const int64_t first_step = step;
  double loss_sum = 0;
  int64_t loss_count = 0;
  NonFiniteSteps non_finite(10);
  std::vector<int64_t> order;
  int64_t order_epoch = -1;
  while (step < limit) {
    const int64_t epoch = step / per_epoch, k = step % per_epoch;
    if (epoch != order_epoch)
      order = epoch_order(static_cast<int64_t>(train.size()), o.seed, epoch), order_epoch = epoch;
    const std::vector<int64_t> rows(order.begin() + k * o.batch, order.begin() + (k + 1) * o.batch);
    model.train();
    optimizer.set_lr(lr_at(step, o.steps, o.lr, o.warmup));
    const MaskedBatch b =
        mask_sequences(train, rows, o.mask, tokenizer.mask_id(), first_plain, tokenizer.size(),
                       derive_key(o.seed, 2000 + epoch), device);
    Variable loss;
    {
      const PrecisionScope scope(precision);
      loss = masked_lm_forward(model, b, gen).loss;
      optimizer.zero_grad();
      loss.backward();
    }
    const double value = loss.data().item();
    if (step_or_skip(optimizer, value, o.clip, step, non_finite, log, run.file("last.safetensors")))
      loss_sum += value, ++loss_count;
    ++step;
    if (step % o.log_interval == 0 || step == limit) {
      const double secs = seconds_since(t0);
      const double rate = double(step - first_step) / std::max(1e-9, secs);
      logf(log, "step %lld/%lld  epoch %lld  loss %.4f  lr %.3g  %.0f pieces/s  ETA %.0f s\n",
           static_cast<long long>(step), static_cast<long long>(limit),
           static_cast<long long>(epoch + 1), loss_sum / std::max<int64_t>(1, loss_count),
           double(optimizer.lr()), rate * double(o.batch * o.length),
           double(limit - step) / std::max(1e-9, rate));
    }
    if (const int sig = StopOnSignal::pending()) {
      save_last();
      logf(log, "%s: stopped at step %lld, %s saved\n", signal_name(sig),
           static_cast<long long>(step), run.file("last.safetensors").c_str());
      return 128 + sig;
    }
    if (step % o.eval_interval == 0 || step == limit) {
      const DevScore s = evaluate_dev(model, dev, tokenizer, o, device, precision);
      Row row;
      row.step = step;
      row.train_loss = loss_sum / std::max<int64_t>(1, loss_count);
      row.dev_loss = s.loss;
      row.dev_accuracy = s.accuracy;
      row.lr = optimizer.lr();
      row.seconds = seconds_since(t0);
      metrics.append(row);
      loss_sum = 0, loss_count = 0;
      logf(log, "step %lld: dev loss %.4f, masked pieces right %.4f\n",
           static_cast<long long>(step), s.loss, s.accuracy);
      save_model();
      save_last();
      plot_metrics(run.path(), "loss.png",
                   {metric_series(metrics.rows(), "train", &Row::train_loss),
                    metric_series(metrics.rows(), "dev", &Row::dev_loss)},
                   {"masked language model loss", "step", "loss"});
    }
  }
  logf(log, "done: the model folder is %s (text finetune --model %s)\n", run.path().c_str(),
       run.path().c_str());
  return 0;
}

}  // namespace clustr::text
