// The speech training loop and evaluation (train.h).
#include "apps/speech/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>

#include "apps/common/device.h"
#include "apps/common/metrics_file.h"
#include "apps/common/stop_signal.h"
#include "apps/speech/metrics.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/safetensors.h"
#include "layers/checkpoint.h"
#include "layers/ctc.h"

namespace clustr::speech {

namespace fs = std::filesystem;

namespace {

constexpr const char* kBest = "best.safetensors";
constexpr const char* kSkippedFile = "skipped.txt";  // every utterance left out, and why
constexpr const char* kLast = "last.safetensors";
// Run state kept in the checkpoint's config beside the flags.
constexpr const char* kEpoch = "state.epoch";
constexpr const char* kBatch = "state.batch";
constexpr const char* kBestPer = "state.best-per";
constexpr const char* kTrainSeconds = "state.train-seconds";
constexpr const char* kClasses = "classes";
constexpr const char* kFeatures = "features";
// The token table, tokens joined by single spaces (a token holds no whitespace).
constexpr const char* kTokenTable = "token-table";
// --cuda-graphs on: the most steps between two reads of the device (a window ends earlier at a
// log line, the epoch's end or --max-steps).
constexpr int32_t kMaxWindow = 100;

std::string join_tokens(const std::vector<std::string>& tokens) {
  std::string s;
  for (const std::string& t : tokens) s += (s.empty() ? "" : " ") + t;
  return s;
}

std::vector<std::string> split_tokens(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t j = std::min(s.find(' ', i), s.size());
    out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

// Throws unless `file` (read from `path`) is `trained`, token for token.
void check_same_tokens(const std::vector<std::string>& trained, const TokenTable& file,
                       const std::string& path, const std::string& checkpoint) {
  const size_t n = std::min(trained.size(), file.tokens.size());
  for (size_t i = 0; i < n; ++i)
    CLUSTR_CHECK(trained[i] == file.tokens[i], "the tokens file ", path, " is not the token "
                 "table ", checkpoint, " was trained with: token ", i, " is '", file.tokens[i],
                 "' there and '", trained[i], "' in the checkpoint (the model's outputs would "
                 "be read as other phones); give the tokens file of its training corpus");
  CLUSTR_CHECK(trained.size() == file.tokens.size(), "the tokens file ", path, " has ",
               file.tokens.size(), " tokens but ", checkpoint, " was trained with ",
               trained.size());
}

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

double parse_state(const std::map<std::string, std::string>& c, const char* key,
                   const std::string& file) {
  return config_number(c, key, file);
}

std::string manifest_dir(const std::string& manifest) {
  const fs::path p = fs::path(manifest).parent_path();
  return p.empty() ? std::string(".") : p.string();
}

}  // namespace

TokenTable model_tokens(const std::vector<std::string>& trained, int64_t classes,
                        const std::string& path, bool given, const std::string& checkpoint) {
  std::error_code ec;
  if (!given && !trained.empty() && !fs::exists(path, ec)) {
    TokenTable t;  // no tokens file: the checkpoint's own table
    for (const std::string& tok : trained) {
      t.index.emplace(tok, t.size());
      t.tokens.push_back(tok);
    }
    return t;
  }
  TokenTable t = read_tokens(path);
  if (!trained.empty()) {
    check_same_tokens(trained, t, path, checkpoint);
  } else {
    CLUSTR_CHECK(t.size() == classes, "the tokens file ", path, " has ", t.size(),
                 " tokens but ", checkpoint, " was trained with ", classes, " classes");
  }
  return t;
}

std::string default_tokens(const std::string& manifest) {
  return (fs::path(manifest_dir(manifest)) / "tokens.txt").string();
}
std::string default_cache(const std::string& manifest) {
  return (fs::path(manifest_dir(manifest)) / "fbank-cache").string();
}

Evaluation evaluate_set(SpeechModel& model, const SpeechSet& set, int64_t max_frames, int beam,
                        uint64_t hash_seed, const std::vector<LmFusion>& fusions) {
  CLUSTR_CHECK(fusions.empty() || beam > 1,
               "a language model is used by the beam search: it needs --beam >= 2");
  const auto t0 = Clock::now();
  NoGradGuard no_grad;
  const bool was_training = model.training();
  model.eval();
  Generator gen(hash_seed);
  Evaluation e;
  e.fused.resize(fusions.size());
  e.hypotheses.resize(set.examples.size());
  std::vector<int64_t> lengths;
  for (const SpeechExample& x : set.examples) lengths.push_back(x.features.size(0));
  BucketOptions bo;
  bo.max_frames = max_frames > 0 ? max_frames : 4000;
  double loss_sum = 0;
  int64_t counted = 0;
  const Device device = device_of(model);
  for (const std::vector<size_t>& idx : make_length_buckets(lengths, bo)) {
    const SpeechBatch b = collate_speech(set.examples, idx);  // on the cpu
    const Tensor features = on_device(b.features, device), lens = on_device(b.lengths, device);
    synchronize_device(device);
    const auto f0 = Clock::now();
    const Tensor logits = model.forward(features, lens, gen).data();  // (B, T, V)
    synchronize_device(device);
    e.forward_seconds += seconds_since(f0);
    // The CTC loss reads its lengths and targets from host copies: they stay on the cpu.
    const CtcOutput ctc = ctc_loss_forward(logits, b.lengths, b.targets, b.target_lengths,
                                           /*blank=*/0, /*want_grad=*/false);
    e.impossible += ctc.impossible;
    const std::vector<float> l = ctc.loss.to_vector();
    const std::vector<int32_t> tl = b.target_lengths.to_int_vector();
    for (size_t r = 0; r < idx.size(); ++r) {
      if (!std::isfinite(l[r])) continue;
      loss_sum += double(l[r]) / double(std::max<int32_t>(tl[r], 1));
      ++counted;
    }
    const Tensor host_logits = on_device(logits, Device::cpu);  // the decoders run on the host
    const std::vector<LabelSequence> greedy = ctc_greedy_decode(host_logits, b.lengths);
    std::vector<LabelSequence> beamed;
    if (beam > 1)
      for (CtcHypothesis& h : ctc_beam_search(host_logits, b.lengths, beam))
        beamed.push_back(std::move(h.labels));
    for (size_t r = 0; r < idx.size(); ++r) {
      const LabelSequence& ref = set.examples[idx[r]].labels;
      e.greedy.add(ref, greedy[r]);
      if (beam > 1) e.beam.add(ref, beamed[r]);
      e.hypotheses[idx[r]] = beam > 1 ? beamed[r] : greedy[r];
    }
    for (size_t i = 0; i < fusions.size(); ++i) {
      const std::vector<CtcHypothesis> h =
          ctc_beam_search(host_logits, b.lengths, beam, /*blank=*/0, fusions[i]);
      for (size_t r = 0; r < idx.size(); ++r) {
        e.fused[i].add(set.examples[idx[r]].labels, h[r].labels);
        if (i == 0) e.hypotheses[idx[r]] = h[r].labels;
      }
    }
    e.utterances += int64_t(idx.size());
    e.input_frames += b.input_frames;
  }
  e.loss = counted ? loss_sum / double(counted) : std::numeric_limits<double>::quiet_NaN();
  model.train(was_training);
  e.seconds = seconds_since(t0);
  return e;
}

std::string resolve_checkpoint(const std::string& path, const char* flag) {
  return clustr::resolve_checkpoint(path, flag, {kBest, kLast});
}

LoadedModel load_trained_model(const std::string& path, const char* flag, Device device,
                               bool strict, std::FILE* log) {
  LoadedModel m;
  m.file = resolve_checkpoint(path, flag);
  m.config = read_checkpoint_config(m.file);
  m.options = model_from_config(m.config);
  const auto classes = int64_t(parse_state(m.config, kClasses, m.file));
  const auto features = int64_t(parse_state(m.config, kFeatures, m.file));
  Generator gen(0);
  m.model = std::make_unique<SpeechModel>(m.options, features, classes, gen);
  if (m.config.count(kTokenTable)) {
    m.tokens = split_tokens(m.config.at(kTokenTable));
    CLUSTR_CHECK(int64_t(m.tokens.size()) == classes, m.file, ": its token table has ",
                 m.tokens.size(), " tokens but its model ", classes, " classes");
  }
  CheckpointLoadOptions lo;
  lo.strict = strict;  // the optimizer state of last.safetensors is allowed either way
  const LoadedCheckpoint c = load_checkpoint(m.file, *m.model, lo);
  m.step = c.step;
  m.missing = c.missing;
  m.unexpected = c.unexpected;
  if (log && !strict && (!m.missing.empty() || !m.unexpected.empty())) {
    std::string list;
    for (const std::string& n : m.missing) list += "\n  missing (left at its initial value): " + n;
    for (const std::string& n : m.unexpected) list += "\n  unexpected (ignored): " + n;
    std::fprintf(log, "note: --non-strict load of %s:%s\n", m.file.c_str(), list.c_str());
  }
  m.model->to(device);
  m.model->eval();
  return m;
}

Trainer::Trainer(const RunOptions& options, std::FILE* log)
    : TrainerBase(validated(options), options.train, log),
      options_(options),
      order_key_(stream_key(1)),
      eval_key_(stream_key(2)),
      augment_key_(stream_key(3)) {
  DataOptions& d = options_.data;
  if (d.train.empty()) d.train = (fs::path(d.corpus) / "train.tsv").string();
  if (d.dev.empty()) d.dev = (fs::path(d.corpus) / "dev.tsv").string();
  if (d.tokens.empty()) d.tokens = default_tokens(d.train);
  if (d.cache.empty()) d.cache = default_cache(d.train);
  tokens_ = read_tokens(d.tokens);
  cache_ = std::make_unique<FeatureCache>(d.cache);
  const int k = options_.model.stacking;
  const auto t0 = Clock::now();
  train_ = load_speech_set(d.train, tokens_, *cache_, k, d.max_train, log_);
  dev_ = load_speech_set(d.dev, tokens_, *cache_, k, d.max_dev, log_);
  logf(log_, "features: %lld computed, %lld from the cache %s (%.1f s)\n",
       static_cast<long long>(cache_->misses()), static_cast<long long>(cache_->hits()),
       d.cache.c_str(), seconds_since(t0));
  CLUSTR_CHECK(!train_.examples.empty(), d.train, ": no usable training utterances (",
               train_.summary(), ")");
  CLUSTR_CHECK(!dev_.examples.empty(), d.dev, ": no usable dev utterances (", dev_.summary(), ")");
  const int64_t F = int64_t(k) * cache_->fbank().num_bins();
  // Built on the CPU, so a seed gives the same initial weights on every device; the optimizer
  // is made after the move (it keeps its state on the parameters' device).
  model_ = std::make_unique<SpeechModel>(options_.model, F, tokens_.size(), gen_);
  model_->to(device_);
  optimizer_ = make_optimizer(options_.train, model_->named_parameters());
  std::vector<int64_t> lengths;
  for (const SpeechExample& e : train_.examples) lengths.push_back(e.features.size(0));
  buckets_ = make_length_buckets(lengths, {options_.train.batch, options_.train.max_frames});
  if (device_ != Device::cuda)
    graphs_off_ = "the run is on the cpu";
  else if (options_.cuda_graphs == "off")
    graphs_off_ = "--cuda-graphs off";
}

SpeechBatch Trainer::next_batch(const std::vector<SpeechExample>& examples,
                                const std::vector<size_t>& indices) {
  SpeechBatch b = collate_speech(examples, indices);
  // From the training stream: a resumed run masks as the uninterrupted one would.
  spec_augment(b, cache_->fbank().num_bins(), options_.model.stacking, options_.train.spec, gen_);
  return b;
}

Trainer::StepEvent Trainer::eager_step(const std::vector<SpeechExample>& examples,
                                       const std::vector<size_t>& indices) {
  const SpeechBatch b = next_batch(examples, indices);
  StepEvent e = event_of(b);
  schedule_.before_step(step(), *optimizer_);
  model_->train();
  const Variable logits =  // (B, T, V)
      model_->forward(on_device(b.features, device_), on_device(b.lengths, device_), gen_);
  CtcOptions co;
  co.zero_infinity = true;
  const CtcLoss loss = ctc_loss(logits, b.lengths, b.targets, b.target_lengths, co);
  e.impossible = loss.impossible;
  e.loss = loss.loss.item();
  e.skipped = !std::isfinite(e.loss);
  if (!e.skipped) {
    optimizer_->zero_grad();
    loss.loss.backward();
    e.norm = clip_or_measure(optimizer_->parameters(), options_.train.clip);
    e.skipped = !std::isfinite(e.norm);
  }
  if (e.skipped)
    optimizer_->zero_grad();
  else
    optimizer_->step();
  return e;
}

std::vector<Trainer::StepEvent> Trainer::graphed_steps(
    const std::vector<SpeechExample>& examples, const std::vector<std::vector<size_t>>& order,
    int64_t steps) {
  float current = optimizer_->lr();
  graphs_->begin([&](int64_t done) { return current = schedule_.lr_for(done, current); });
  std::vector<StepEvent> events;
  for (int64_t k = 0; k < steps && graphs_->off_reason().empty(); ++k) {
    const SpeechBatch b = next_batch(examples, order[size_t(batch_in_epoch_ + k)]);
    const CtcLayout layout =
        ctc_layout(b.features.size(1), model_->classes(), b.lengths, b.targets, b.target_lengths);
    events.push_back(event_of(b));
    events.back().impossible = layout.impossible;
    graphs_->step(b, layout);  // a capture that fails ends the window: no graphs from there
  }
  const std::vector<optim::math::StepRecord> records = graphs_->end();
  CLUSTR_CHECK(records.size() == events.size(), "speech: ", events.size(), " steps were queued ",
               "on the device but it recorded ", records.size());
  for (size_t k = 0; k < events.size(); ++k) {
    events[k].loss = records[k].loss;
    events[k].norm = records[k].norm;
    events[k].skipped = !std::isfinite(records[k].loss) || records[k].skipped;
  }
  return events;
}

Trainer::StepEvent Trainer::event_of(const SpeechBatch& b) {
  StepEvent e;
  e.first = b.indices.front();
  e.utterances = b.indices.size();
  e.input_frames = b.input_frames;
  return e;
}

const std::vector<SpeechExample>& Trainer::training_examples() const {
  return options_.train.wave.enabled() ? augmented_ : train_.examples;
}

double Trainer::prepare_epoch() {
  const WaveAugmentOptions& w = options_.train.wave;
  if (!w.enabled() || augmented_epoch_ == epoch_) return 0.0;
  const auto t0 = Clock::now();
  const int k = options_.model.stacking;
  const uint64_t epoch_key = derive_key(augment_key_, uint64_t(epoch_));
  const std::vector<SpeechExample>& clean = train_.examples;
  const auto n = int64_t(clean.size());
  augmented_.assign(clean.size(), SpeechExample{});
  std::vector<std::string> errors(clean.size());
  std::vector<char> kept_clean(clean.size(), 0);
  // Each utterance from its own stream: the same draws for any thread count or schedule.
#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t i = 0; i < n; ++i) {
    const SpeechExample& c = clean[size_t(i)];
    SpeechExample& a = augmented_[size_t(i)];
    a.id = c.id;
    a.labels = c.labels;
    try {
      Generator gen(derive_key(epoch_key, uint64_t(i)));
      const Tensor raw = augmented_features(train_.audio[size_t(i)], cache_->fbank(), w, gen);
      a.frames = raw.size(0);
      a.features = stack_frames(normalize_utterance(raw), k);
      // Sped up too far for its labels: this epoch it trains on its unaugmented features.
      if (a.features.size(0) < ctc_min_frames(a.labels)) {
        a.frames = c.frames;
        a.features = c.features;
        kept_clean[size_t(i)] = 1;
      }
    } catch (const std::exception& e) {
      errors[size_t(i)] = e.what();
    }
  }
  for (size_t i = 0; i < errors.size(); ++i)
    CLUSTR_CHECK(errors[i].empty(), "augmenting training utterance '", clean[i].id, "' (",
                 train_.manifest, ":", train_.lines[i], ") in epoch ", epoch_, ": ", errors[i]);
  std::vector<int64_t> lengths;
  for (const SpeechExample& e : augmented_) lengths.push_back(e.features.size(0));
  buckets_ = make_length_buckets(lengths, {options_.train.batch, options_.train.max_frames});
  augmented_epoch_ = epoch_;
  int64_t unaugmented = 0;
  for (char c : kept_clean) unaugmented += c;
  logf(log_, "epoch %lld: %lld training utterances augmented in %.1f s (%lld too short for "
       "their labels once sped up: unaugmented), %zu batches\n",
       static_cast<long long>(epoch_), static_cast<long long>(n - unaugmented),
       seconds_since(t0), static_cast<long long>(unaugmented), buckets_.size());
  return seconds_since(t0);
}

void Trainer::save(const std::string& path, bool with_state) const {
  CheckpointState s;
  s.step = step();
  s.config = to_config(options_);
  s.config[kClasses] = std::to_string(model_->classes());
  s.config[kFeatures] = std::to_string(model_->features());
  s.config[kTokenTable] = join_tokens(tokens_.tokens);
  s.config[kEpoch] = std::to_string(epoch_);
  s.config[kBatch] = std::to_string(batch_in_epoch_);
  s.config[kBestPer] = num(best_per_);
  s.config[kTrainSeconds] = num(elapsed_before_);
  schedule_.save(s.config);
  if (with_state) {
    s.extras = optimizer_->state_dict();
    s.rng = GeneratorState::of(gen_);
  }
  check_finite_state(*model_, s.extras, path);
  save_checkpoint(path, *model_, s);
}

std::string resume_file(const std::string& path) {
  std::error_code ec;
  const std::string file = fs::is_directory(path, ec) ? (fs::path(path) / kLast).string() : path;
  CLUSTR_CHECK(fs::is_regular_file(file, ec), "--resume: no such checkpoint: ", file);
  return file;
}

void Trainer::resume(const std::string& path) {
  const std::string file = resume_file(path);
  const std::map<std::string, std::string> saved = read_checkpoint_config(file);
  std::map<std::string, std::string> now = to_config(options_);
  std::vector<std::string> diff = config_differences(saved, now, resume_keys<RunOptions>(Resume::locked));
  CLUSTR_CHECK(diff.empty(), "--resume: ", file, " was trained with other settings:",
               [&] {
                 std::string s;
                 for (const std::string& l : diff) s += "\n  " + l;
                 return s;
               }());
  if (saved.count(kTokenTable))
    check_same_tokens(split_tokens(saved.at(kTokenTable)), tokens_, options_.data.tokens, file);
  const LoadedCheckpoint c = load_checkpoint(file, *model_);
  CLUSTR_CHECK(!c.extras.empty() && c.rng, "--resume: ", file,
               " has no optimizer or generator state (resume from last.safetensors)");
  CLUSTR_CHECK(options_.train.max_steps == 0 || c.step <= options_.train.max_steps, "--resume: ",
               file, " is at step ", c.step, ", past --max-steps ", options_.train.max_steps,
               "; give --max-steps above ", c.step, " (or 0: no limit) to train on");
  optimizer_->load_state_dict(c.extras);
  c.restore_generator(gen_);
  epoch_ = int64_t(parse_state(c.config, kEpoch, file));
  batch_in_epoch_ = int64_t(parse_state(c.config, kBatch, file));
  best_per_ = parse_state(c.config, kBestPer, file);
  elapsed_before_ = parse_state(c.config, kTrainSeconds, file);
  schedule_.restore(c.config, file);
  resumed_ = true;
  logf(log_, "resumed from %s at step %lld (epoch %lld, batch %lld)\n", file.c_str(),
       static_cast<long long>(c.step), static_cast<long long>(epoch_),
       static_cast<long long>(batch_in_epoch_));
}

void Trainer::print_config(std::FILE* out) const {
  if (!out) return;
  std::fprintf(out, "speech configuration\n");
  for (const auto& [key, value] : config_entries(options_)) {
    const std::string flag = "--" + key;
    std::fprintf(out, "  %-26s %s\n", flag.c_str(), value.c_str());
  }
  std::fprintf(out, "  %-26s %s\n", "attention", options_.model.attention.describe().c_str());
  std::fprintf(out, "  %-26s %lld (model width %lld, %lld features, %lld classes)\n",
               "parameters",
               static_cast<long long>(model_->parameter_count()),
               static_cast<long long>(options_.model.dim()),
               static_cast<long long>(model_->features()),
               static_cast<long long>(model_->classes()));
  std::fprintf(out, "  %-26s %zu per epoch, %zu training utterances\n", "batches",
               buckets_.size(), train_.examples.size());
  const std::string graphs =
      graphs_off_.empty() ? detail::cat("on (a graph per batch shape seen twice, at most ",
                                        options_.train.max_graphs, " kept)")
                          : "off (" + graphs_off_ + ")";
  std::fprintf(out, "  %-26s %s\n", "cuda graphs", graphs.c_str());
  std::fprintf(out, "build\n");
  for (const auto& [key, value] : build_info(options_.device))
    std::fprintf(out, "  %-26s %s\n", key.c_str(), value.c_str());
  std::fflush(out);
}

const std::vector<std::string>& Trainer::run_files() {
  static const std::vector<std::string> files = {"metrics.csv", kBest,     kLast,
                                                 "loss.png",    "per.png", kSkippedFile};
  return files;
}

TrainResult Trainer::run(RunFolder* folder) {
  const RunOptions& o = options_;
  const TrainOptions& t = o.train;
  std::unique_ptr<RunFolder> own_folder;
  if (!folder) {
    own_folder = std::make_unique<RunFolder>(o.output.out, out_mode(resumed_, o.output.overwrite),
                                             run_files(), log_);
    folder = own_folder.get();
  }
  CLUSTR_CHECK(fs::equivalent(folder->path(), o.output.out), "speech: the run's folder ",
               folder->path(), " is not --out ", o.output.out);
  const StopOnSignal stop_signal;  // Ctrl-C: finish the step, save last.safetensors, return
  // The log shows the first few utterances left out; the run folder gets them all.
  if (!train_.problems.empty() || !dev_.problems.empty()) {
    const std::string path = folder->file(kSkippedFile);
    std::vector<std::string> lines = train_.problems;
    lines.insert(lines.end(), dev_.problems.begin(), dev_.problems.end());
    write_lines_atomically(path, lines);
    logf(log_,
         "%zu utterances left out (bad manifest lines, unreadable audio, too short): all "
         "listed in %s\n",
         lines.size(), path.c_str());
  }
  NonFiniteSteps non_finite(t.max_skipped_steps);
  const std::string last_file = (fs::path(o.output.out) / kLast).string();
  const std::string best = (fs::path(o.output.out) / kBest).string();
  MetricsLog metrics;
  metrics.start((fs::path(o.output.out) / "metrics.csv").string(), resumed_ ? step() : -1, log_);

  TrainResult r;
  const int64_t start_step = step();
  double interval_loss = 0, interval_seconds = 0;
  int64_t interval_steps = 0, interval_frames = 0, total_frames = 0;
  bool first_interval = true, stop = false;
  double run_seconds = 0;
  LaunchMeter launches(device_);
  if (graphs_off_.empty() && !graphs_)
    graphs_ = std::make_unique<GraphedSteps>(*model_, *optimizer_, t.clip, gen_, kMaxWindow,
                                             static_cast<size_t>(t.max_graphs));
  for (; epoch_ <= t.epochs && !stop; ++epoch_, batch_in_epoch_ = 0) {
    run_seconds += prepare_epoch();  // training time: the time limit and frames/s count it
    const std::vector<SpeechExample>& examples = training_examples();
    std::vector<std::vector<size_t>> order = buckets_;
    Generator order_gen(derive_key(order_key_, uint64_t(epoch_)));
    shuffle_batches(order, order_gen);
    int64_t impossible = 0;
    while (batch_in_epoch_ < int64_t(order.size()) && !stop) {
      // The next steps: one op by op, or with graphs a window of them that ends at the next log
      // line, the epoch's end or --max-steps at the latest.
      const auto t0 = Clock::now();
      const int64_t first_step = step();
      launches.begin();
      std::vector<StepEvent> events;
      if (graphs_) {
        int64_t K = std::min<int64_t>(graphs_->window(), int64_t(order.size()) - batch_in_epoch_);
        K = std::min(K, o.output.log_interval - first_step % o.output.log_interval);
        if (t.max_steps > 0) K = std::min(K, t.max_steps - first_step);
        events = graphed_steps(examples, order, K);
      } else {
        events.push_back(eager_step(examples, order[size_t(batch_in_epoch_)]));
      }
      launches.end();
      const double seconds = seconds_since(t0) / double(events.size());
      int64_t s = first_step;
      for (size_t i = 0; i < events.size(); ++i) {
        const StepEvent& ev = events[i];
        // The clock and signals are looked at where a window ends (its steps are all taken).
        const bool last = i + 1 == events.size();
        impossible += ev.impossible;
        ++batch_in_epoch_;  // this batch is done with
        if (ev.skipped) {
          const SpeechExample& e0 = examples[ev.first];
          non_finite.skipped(
              detail::cat("epoch ", epoch_, " batch ", batch_in_epoch_, ": non-finite ",
                          std::isfinite(ev.loss) ? "gradient norm" : "loss", " (",
                          std::isfinite(ev.loss) ? ev.norm : double(ev.loss), ", ",
                          ev.utterances, " utterances from '", e0.id, "')"),
              log_,
              fs::exists(last_file) ? "the checkpoints in " + o.output.out +
                                          " are left as they were"
                                    : std::string("no checkpoint was written"));
          r.skipped_steps = non_finite.total();
          if (last) r.interrupted_by = StopOnSignal::pending();
          stop = r.interrupted_by != 0;
          continue;
        }
        non_finite.stepped();
        ++s;
        r.losses.push_back(ev.loss);
        run_seconds += seconds;
        interval_loss += double(ev.loss), interval_seconds += seconds;
        interval_frames += ev.input_frames, total_frames += ev.input_frames;
        ++interval_steps;

        const bool time_up =
            last && t.time_limit > 0 && elapsed_before_ + run_seconds >= t.time_limit;
        const bool steps_up = t.max_steps > 0 && s >= t.max_steps;
        if (last) r.interrupted_by = StopOnSignal::pending();
        stop = time_up || steps_up || r.interrupted_by;
        if (s % o.output.log_interval == 0 || stop) {
          MetricsRow row;
          row.step = s, row.epoch = epoch_;
          row.train_loss = interval_loss / double(interval_steps);
          row.lr = optimizer_->lr();
          row.ms_per_step = 1e3 * interval_seconds / double(interval_steps);
          row.frames_per_s = double(interval_frames) / interval_seconds;
          const std::string per_step =
              launches.report(interval_steps, r.kernel_launches_per_step, r.blas_calls_per_step);
          logf(log_, "epoch %lld  step %lld  loss %.4f  lr %.2e  ms/step %.0f  frames/s %.0f%s\n",
               static_cast<long long>(epoch_), static_cast<long long>(s), row.train_loss, row.lr,
               row.ms_per_step, row.frames_per_s, per_step.c_str());
          if (first_interval) r.first_loss = row.train_loss, first_interval = false;
          r.last_loss = row.train_loss;
          metrics.append(row);
          interval_loss = interval_seconds = 0;
          interval_steps = interval_frames = 0;
        }
        if (stop && !r.interrupted_by)
          logf(log_, "%s reached at step %lld: training stops\n",
               time_up ? "time limit" : "--max-steps", static_cast<long long>(s));
      }
      if (graphs_ && !graphs_->off_reason().empty()) {
        graphs_off_ = graphs_->off_reason();
        graphs_.reset();
        logf(log_, "cuda graphs: off (%s); training without them\n", graphs_off_.c_str());
      }
    }
    r.impossible += impossible;
    if (r.interrupted_by) {
      // No dev evaluation: save where the next step begins and return at once.
      const bool epoch_done = batch_in_epoch_ >= int64_t(order.size());
      const int64_t saved_epoch = epoch_, saved_batch = batch_in_epoch_;
      if (epoch_done) ++epoch_, batch_in_epoch_ = 0;
      const double before = elapsed_before_;
      elapsed_before_ += run_seconds;
      save(last_file, true);
      elapsed_before_ = before;
      epoch_ = saved_epoch, batch_in_epoch_ = saved_batch;
      if (o.output.write_plots && !metrics.rows().empty()) metrics.plot(o.output.out);
      logf(log_,
           "interrupted by %s at step %lld: checkpoint saved: %s; continue with --resume %s\n",
           signal_name(r.interrupted_by), static_cast<long long>(step()), last_file.c_str(),
           o.output.out.c_str());
      stop = true;
      break;
    }
    // The dev set after each epoch (and where training stops).
    const Evaluation e = evaluate_set(*model_, dev_, t.max_frames, 1, eval_key_);
    r.last_dev = e;
    const double per = e.greedy.rate();
    logf(log_,
         "epoch %lld done: dev loss %.4f  PER %.4f (%lld edits / %lld phones)  impossible "
         "alignments %lld train, %lld dev  (dev %.1f s)\n",
         static_cast<long long>(epoch_), e.loss, per, static_cast<long long>(e.greedy.edits),
         static_cast<long long>(e.greedy.reference_length), static_cast<long long>(impossible),
         static_cast<long long>(e.impossible), e.seconds);
    for (int64_t i = 0; i < o.output.examples && i < int64_t(dev_.examples.size()); ++i) {
      const SpeechExample& x = dev_.examples[size_t(i)];
      logf(log_, "  %s ref: %s\n  %s hyp: %s\n", x.id.c_str(),
           label_string(tokens_, x.labels).c_str(), x.id.c_str(),
           label_string(tokens_, e.hypotheses[size_t(i)]).c_str());
    }
    MetricsRow row;
    row.step = step(), row.epoch = epoch_;
    row.dev_loss = e.loss, row.dev_per = per, row.impossible = double(impossible);
    metrics.append(row);
    if (schedule_.at_evaluation(e.loss, step(), *optimizer_))
      logf(log_, "plateau: dev loss has not improved; lr lowered to %.2e\n", optimizer_->lr());
    const bool improved = best_per_ < 0 || per < best_per_;
    if (improved) best_per_ = per;
    // The checkpoint records where the next step begins.
    const bool epoch_done = batch_in_epoch_ >= int64_t(order.size());
    const int64_t saved_epoch = epoch_, saved_batch = batch_in_epoch_;
    if (epoch_done) ++epoch_, batch_in_epoch_ = 0;
    const double before = elapsed_before_;
    elapsed_before_ += run_seconds;
    if (improved) save(best, false);
    save(last_file, true);
    elapsed_before_ = before;
    epoch_ = saved_epoch, batch_in_epoch_ = saved_batch;
    if (improved) logf(log_, "dev PER improved to %.4f: saved %s\n", per, best.c_str());
    if (o.output.write_plots) metrics.plot(o.output.out);
  }
  r.best_per = best_per_;
  r.steps = step();
  r.train_seconds = run_seconds;
  r.frames_per_second = run_seconds > 0 ? double(total_frames) / run_seconds : 0;
  logf(log_,
       "trained %lld steps (this run %lld, in %.1f s, %.0f frames/s, %lld steps skipped); best "
       "dev PER %.4f; checkpoints %s, %s\n",
       static_cast<long long>(r.steps), static_cast<long long>(r.steps - start_step), run_seconds,
       r.frames_per_second, static_cast<long long>(r.skipped_steps), best_per_, best.c_str(),
       last_file.c_str());
  return r;
}

}  // namespace clustr::speech
