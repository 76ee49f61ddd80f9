// Training, evaluation, checkpoints and the training loop of the copy task (train.h).
#include "apps/copy_task/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "apps/common/device.h"
#include "apps/common/stop_signal.h"
#include "autograd/ops.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/parallel.h"
#include "core/safetensors.h"
#include "layers/checkpoint.h"

namespace clustr::copy {

namespace fs = std::filesystem;

namespace {

constexpr const char* kCheckpointFile = "checkpoint.safetensors";
// Resume state kept in the checkpoint's config beside the flags (not compared on resume).
constexpr const char* kTrainSeconds = "state.train-seconds";

double parse_state(const std::map<std::string, std::string>& config, const char* key,
                   const std::string& file) {
  return config_number(config, key, "--resume: " + file);
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += "\n  " + l;
  return s;
}

// The most steps one window of graph replays holds (its batches are copied to the device at
// once): a window ends at the next log line, evaluation or checkpoint, or after this many.
constexpr int64_t kMaxWindow = 100;
// The device words for a step's random draws (DrawPlan): the clustered types' hash planes
// (bits x head width per layer) and offsets, and the dropout masks' stream offsets (two words
// each); far more than the presets need.
constexpr int64_t kPlanWords = 1 << 18;

// Why a run cannot replay its training step from a CUDA graph ("" when it can try): a step that
// draws from the training stream on the host would freeze the draws into the graph.
std::string graphs_reason(const RunOptions& o, Device device) {
  if (device != Device::cuda) return "the run is on the cpu";
  if (o.cuda_graphs == "off") return "--cuda-graphs off";
  return "";
}

}  // namespace

CopyTaskBatch to_device(const CopyTaskBatch& b, Device device) {
  return CopyTaskBatch{on_device(b.input, device), on_device(b.target, device),
                       on_device(b.lengths, device)};
}

std::string resolve_checkpoint(const std::string& path, const char* flag) {
  return clustr::resolve_checkpoint(path, flag, {kCheckpointFile});
}

Trainer::Trainer(const RunOptions& options, std::FILE* log)
    : TrainerBase(validated(options), options.train, log),
      options_(options),
      heldout_key_(stream_key(1)),
      final_key_(stream_key(2)),
      eval_key_(stream_key(3)) {
  // Built on the CPU, so a seed gives the same initial weights on every device; the optimizer
  // is made after the move (it keeps its state on the parameters' device).
  model_ = std::make_unique<CopyModel>(options_.model, vocab_size(options_.task), gen_);
  model_->to(device_);
  optimizer_ = make_optimizer(options_.train, model_->named_parameters());
  Generator heldout(heldout_key_);
  for (int64_t i = 0; i < options_.output.eval_batches; ++i)
    heldout_.push_back(
        to_device(make_copy_task_batch(options_.task, options_.train.batch, heldout), device_));
  graphs_off_ = graphs_reason(options_, device_);
}

Trainer::StepEvent Trainer::eager_step() {
  const auto t0 = Clock::now();
  StepEvent e;
  e.loss = train_step(&e.accuracy);
  e.skip = last_skip_;
  e.seconds = seconds_since(t0);
  return e;
}

void Trainer::step_body(bool queue) {
  const int64_t B = options_.train.batch, N = sequence_length(options_.task);
  optimizer_->zero_grad();
  model_->train();
  const Tensor input = step_inputs_.rows(0, B * N).reshape({B, N});
  const Tensor target = step_inputs_.rows(B * N, 2 * B * N).reshape({B, N});
  const Tensor lengths = step_inputs_.rows(2 * B * N, 2 * B * N + B);
  const Variable logits = model_->forward(input, lengths, gen_);  // (B, N, V)
  Tensor predictions;  // argmax over V, found by the loss's pass over the logits
  const Variable loss =
      cross_entropy(logits, target, Tensor(), kCopyTaskIgnoreIndex, Reduction::mean, &predictions);
  const Tensor correct = count_equal(predictions, target, kCopyTaskIgnoreIndex);
  const Tensor tokens = count_equal(target, target, kCopyTaskIgnoreIndex);
  loss.backward();
  if (queue) device_steps_->queue_step(loss.data(), {correct, tokens});
}

bool Trainer::capture_step() {
  const int64_t B = options_.train.batch, N = sequence_length(options_.task);
  const int64_t words = 2 * B * N + B;
  graph_stream_ = std::make_unique<cuda::Stream>();
  cuda::StreamGuard on_stream(*graph_stream_);
  // The warm-up's batch comes from no stream: token 0 everywhere, no target, full lengths.
  std::vector<int32_t> warm(static_cast<size_t>(words), 0);
  std::fill(warm.begin() + B * N, warm.begin() + 2 * B * N, kCopyTaskIgnoreIndex);
  std::fill(warm.begin() + 2 * B * N, warm.end(), static_cast<int32_t>(N));
  step_inputs_ = Tensor::from_int_vector(warm, {words}, Device::cuda);
  window_inputs_ = Tensor::empty({kMaxWindow, words}, DType::i32, Device::cuda);
  const uint64_t stream_at = gen_.offset();
  try {
    device_steps_ =
        std::make_unique<optim::DeviceSteps>(*optimizer_, options_.train.clip, kMaxWindow);
    draws_ = std::make_unique<DrawPlan>(kPlanWords, Device::cuda);
    // The warm-up: the positional table, cuBLAS, the allocator's blocks. Its draws (the
    // clustered types' hashing) are given back to the training stream.
    step_body(false);
    gen_.set_state(gen_.seed(), stream_at);
    optimizer_->zero_grad();
    gen_.record_into(draws_.get());  // the step's draws become the plan's, drawn per replay
    graph_.capture([this] { step_body(true); });
    gen_.record_into(nullptr);
    optimizer_->zero_grad();  // the graph keeps its own gradients
    if (!draws_->empty())
      window_draws_ = Tensor::empty({kMaxWindow, draws_->words()}, DType::f32, Device::cuda);
    logf(log_, "cuda graphs: on (the training step is captured and replayed; %lld random words "
         "drawn on the host per step)\n", static_cast<long long>(draws_->words()));
    return true;
  } catch (const Error& e) {
    gen_.record_into(nullptr);
    gen_.set_state(gen_.seed(), stream_at);
    optimizer_->zero_grad();
    device_steps_.reset();
    draws_.reset();
    step_inputs_ = window_inputs_ = Tensor();
    graphs_off_ = detail::cat("the step could not be captured: ", e.what());
    return false;
  }
}

void Trainer::prepare_attempts(int64_t n) {
  const int64_t B = options_.train.batch, plan_words = draws_->words();
  for (int64_t k = 0; k < n; ++k) {
    ahead_offsets_.push_back(gen_.offset());
    const CopyTaskBatch b = make_copy_task_batch(options_.task, B, gen_);
    for (const Tensor* t : {&b.input, &b.target, &b.lengths}) {
      const std::vector<int32_t> v = t->to_int_vector();
      ahead_words_.insert(ahead_words_.end(), v.begin(), v.end());
    }
    ahead_draws_.resize(ahead_draws_.size() + static_cast<size_t>(plan_words));
    draws_->fill(gen_, ahead_draws_.data() + ahead_draws_.size() - plan_words);
  }
}

uint64_t Trainer::consumed_offset() const {
  return ahead_offsets_.empty() ? gen_.offset() : ahead_offsets_.front();
}

void Trainer::rewind_prepared() {
  gen_.set_state(gen_.seed(), consumed_offset());
  ahead_offsets_.clear();
  ahead_words_.clear();
  ahead_draws_.clear();
}

std::vector<Trainer::StepEvent> Trainer::graphed_steps(int64_t steps, int64_t next_steps) {
  if (!graph_.captured() && !capture_step()) {
    logf(log_, "cuda graphs: off (%s); training without them\n", graphs_off_.c_str());
    return {eager_step()};
  }
  const auto t0 = Clock::now();
  const int64_t B = options_.train.batch, N = sequence_length(options_.task);
  const int64_t words = 2 * B * N + B, K = std::min(steps, kMaxWindow);
  const int64_t plan_words = draws_->words();
  // The window's batches and the steps' random draws, as the eager loop draws them (per
  // attempted step: the batch, then the forward's draws), mostly prepared during the window
  // before.
  const int64_t ready = static_cast<int64_t>(ahead_offsets_.size());
  if (ready < K) prepare_attempts(K - ready);
  cuda::StreamGuard on_stream(*graph_stream_);
  // The window's batches and draws through the pinned buffer: copies queued, not waited for.
  // k steps' words, then (from a 64-byte boundary) their draws.
  auto word_bytes_of = [&](int64_t k) { return static_cast<size_t>(k * words) * sizeof(int32_t); };
  auto draw_bytes_of = [&](int64_t k) {
    return static_cast<size_t>(k * plan_words) * sizeof(float);
  };
  const size_t word_bytes = word_bytes_of(K), draw_bytes = draw_bytes_of(K);
  const size_t at_draws = (word_bytes + 63) / 64 * 64;
  if (window_copied_) window_copied_->synchronize();  // the last window's copies have run
  if (window_staging_.bytes() < at_draws + draw_bytes)  // sized once, for the largest window
    window_staging_ = cuda::PinnedBuffer((word_bytes_of(kMaxWindow) + 63) / 64 * 64 +
                                         draw_bytes_of(kMaxWindow));
  char* host = static_cast<char*>(window_staging_.data());
  std::memcpy(host, ahead_words_.data(), word_bytes);
  if (draw_bytes > 0) std::memcpy(host + at_draws, ahead_draws_.data(), draw_bytes);
  cuda::copy_h2d_async(window_inputs_.i32(), host, word_bytes);
  if (draw_bytes > 0) cuda::copy_h2d_async(window_draws_.f32(), host + at_draws, draw_bytes);
  if (!window_copied_) window_copied_ = std::make_unique<cuda::Event>();
  window_copied_->record();
  ahead_offsets_.erase(ahead_offsets_.begin(), ahead_offsets_.begin() + K);
  ahead_words_.erase(ahead_words_.begin(), ahead_words_.begin() + K * words);
  ahead_draws_.erase(ahead_draws_.begin(), ahead_draws_.begin() + K * plan_words);
  const int64_t base = step();
  float current = optimizer_->lr();
  device_steps_->prepare([&](int64_t done) { return current = schedule_.lr_for(done, current); });
  Tensor plan_memory = plan_words > 0 ? draws_->memory().rows(0, plan_words) : Tensor();
  for (int64_t k = 0; k < K; ++k) {
    step_inputs_.copy_from(window_inputs_.rows(k, k + 1).reshape({words}));
    if (plan_words > 0) plan_memory.copy_from(window_draws_.rows(k, k + 1).reshape({plan_words}));
    graph_.replay();
  }
  // While the device runs the window: the next one's attempts on the host.
  const int64_t next = std::min(next_steps, kMaxWindow);
  if (next > static_cast<int64_t>(ahead_offsets_.size()))
    prepare_attempts(next - static_cast<int64_t>(ahead_offsets_.size()));
  const std::vector<optim::math::StepRecord> records = device_steps_->collect();
  cuda::raise_device_errors();
  const double seconds = seconds_since(t0) / double(K);
  std::vector<StepEvent> events;
  int64_t done = base;
  for (const optim::math::StepRecord& r : records) {
    StepEvent e;
    e.loss = r.loss;
    e.seconds = seconds;
    if (!std::isfinite(r.loss)) {
      e.skip = detail::cat("step ", done + 1, ": non-finite loss (", r.loss, ")");
    } else if (r.skipped) {
      e.skip = detail::cat("step ", done + 1, ": non-finite gradient norm (", r.norm, ")");
    } else {
      e.accuracy = r.extra[1] > 0 ? double(r.extra[0]) / double(r.extra[1]) : 0.0;
      ++done;
    }
    events.push_back(std::move(e));
  }
  return events;
}

float Trainer::train_step(double* accuracy, int64_t* tokens) {
  last_skip_.clear();
  const int64_t done = step();
  schedule_.before_step(done, *optimizer_);
  const CopyTaskBatch batch =
      to_device(make_copy_task_batch(options_.task, options_.train.batch, gen_), device_);
  model_->train();
  const Variable logits = model_->forward(batch.input, batch.lengths, gen_);  // (B, N, V)
  Tensor predictions;  // argmax over V, found by the loss's pass over the logits
  const Variable loss = cross_entropy(logits, batch.target, Tensor(), kCopyTaskIgnoreIndex,
                                      Reduction::mean, accuracy ? &predictions : nullptr);
  if (accuracy) *accuracy = masked_accuracy(predictions, batch.target);
  if (tokens) {
    *tokens = 0;
    for (int32_t t : batch.target.to_int_vector()) *tokens += t != kCopyTaskIgnoreIndex;
  }
  const float value = loss.item();
  optimizer_->zero_grad();
  if (std::isfinite(value)) {
    loss.backward();
    const double norm = clip_or_measure(optimizer_->parameters(), options_.train.clip);
    if (std::isfinite(norm)) {
      optimizer_->step();
      return value;
    }
    optimizer_->zero_grad();
    last_skip_ = detail::cat("step ", done + 1, ": non-finite gradient norm (", norm, ")");
  } else {
    last_skip_ = detail::cat("step ", done + 1, ": non-finite loss (", value, ")");
  }
  return value;
}

Evaluation Trainer::evaluate(const std::vector<CopyTaskBatch>& batches) const {
  const auto t0 = Clock::now();
  NoGradGuard no_grad;
  model_->eval();
  Generator gen(eval_key_);  // the same hashing at every evaluation
  double loss_sum = 0, correct = 0;
  int64_t tokens = 0;
  for (const CopyTaskBatch& batch : batches) {
    const CopyTaskBatch b = to_device(batch, device_);  // no copy when already there
    const Tensor logits = model_->forward(b.input, b.lengths, gen).data();  // (B, N, V)
    const int64_t V = logits.size(2);
    const CrossEntropyOutput ce =
        cross_entropy(logits.reshape({-1, V}), b.target.reshape({-1}), Tensor(),
                      kCopyTaskIgnoreIndex, Reduction::sum, /*predict=*/true);
    const auto counted = static_cast<int64_t>(std::llround(ce.weight_sum.item()));
    loss_sum += double(ce.loss.item());
    correct += masked_accuracy(ce.predictions.reshape(b.target.shape()), b.target) *
               double(counted);
    tokens += counted;
  }
  model_->train();
  Evaluation e;
  e.tokens = tokens;
  e.loss = tokens ? loss_sum / double(tokens) : 0.0;
  e.accuracy = tokens ? std::round(correct) / double(tokens) : 0.0;
  e.seconds = seconds_since(t0);
  return e;
}

std::vector<CopyTaskBatch> Trainer::final_batches(int64_t n) const {
  Generator gen(final_key_);
  std::vector<CopyTaskBatch> out;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(make_copy_task_batch(options_.task, options_.train.batch, gen));
  return out;
}

void Trainer::save(const std::string& path) const {
  CheckpointState state;
  state.step = step();
  state.config = to_config(options_);
  schedule_.save(state.config);
  char secs[40];
  std::snprintf(secs, sizeof secs, "%.3f", elapsed_before_ + run_seconds_);
  state.config[kTrainSeconds] = secs;
  state.extras = optimizer_->state_dict();
  // Attempts drawn ahead for graph replays are not consumed: the stream is saved before them.
  state.rng = GeneratorState{gen_.seed(), consumed_offset()};
  check_finite_state(*model_, state.extras, path);
  save_checkpoint(path, *model_, state);
}

void Trainer::resume(const std::string& path) {
  const std::string file = resolve_checkpoint(path, "--resume");
  // Compare the settings before loading: a different model would fail with a list of tensor
  // shapes, while the flags that differ are what the user needs to see.
  const std::map<std::string, std::string> saved = read_checkpoint_config(file);
  const std::map<std::string, std::string> now = to_config(options_);
  const std::vector<std::string> locked = config_differences(saved, now, resume_keys<RunOptions>(Resume::locked));
  CLUSTR_CHECK(locked.empty(), "--resume: ", file, " was trained with other settings, so it "
               "cannot be resumed with these (give the checkpoint's values, or start a new run "
               "in another --out folder):", join_lines(locked));
  for (const std::string& d : config_differences(saved, now, resume_keys<RunOptions>(Resume::noted)))
    logf(log_, "note: %s; continuing with the new value, so this is no exact continuation\n",
         d.c_str());

  const LoadedCheckpoint c = load_checkpoint(file, *model_);
  CLUSTR_CHECK(c.step <= options_.train.steps, "--resume: ", file, " is at step ", c.step,
               ", past --steps ", options_.train.steps, "; give --steps above ", c.step,
               " to train on (or --checkpoint ", path, " to evaluate it)");
  optimizer_->load_state_dict(c.extras);
  CLUSTR_CHECK(optimizer_->step_count() == c.step, "--resume: ", file, " is at step ", c.step,
               " but its optimizer state at step ", optimizer_->step_count());
  c.restore_generator(gen_);
  schedule_.restore(c.config, "--resume: " + file);
  if (c.config.count(kTrainSeconds)) elapsed_before_ = parse_state(c.config, kTrainSeconds, file);
  resumed_ = true;
  logf(log_, "resumed from %s at step %lld\n", file.c_str(), static_cast<long long>(c.step));
}

void Trainer::print_config(std::FILE* out) const {
  if (!out) return;
  std::fprintf(out, "copy_task configuration\n");
  for (const auto& [key, value] : config_entries(options_)) {
    const std::string flag = "--" + key;
    std::fprintf(out, "  %-26s %s\n", flag.c_str(), value.c_str());
  }
  const int64_t N = sequence_length(options_.task);
  std::fprintf(out, "  %-26s %s\n", "attention", options_.model.attention.describe().c_str());
  if (device_ == Device::cuda)
    std::fprintf(out, "  %-26s %s\n", "cuda graphs",
                 graphs_off_.empty() ? "on" : ("off (" + graphs_off_ + ")").c_str());
  std::fprintf(out, "  %-26s %lld (D = %lld, N = %lld, V = %d)\n", "parameters",
               static_cast<long long>(model_->parameter_count()),
               static_cast<long long>(options_.model.dim()), static_cast<long long>(N),
               vocab_size(options_.task));
  std::fprintf(out, "build\n");
  for (const auto& [key, value] : build_info(options_.device))
    std::fprintf(out, "  %-26s %s\n", key.c_str(), value.c_str());
  std::fflush(out);
}

const std::vector<std::string>& Trainer::run_files() {
  static const std::vector<std::string> files = {"metrics.csv", kCheckpointFile, "loss.png",
                                                 "accuracy.png"};
  return files;
}

RunResult Trainer::run(RunFolder* folder) {
  const auto t_begin = Clock::now();
  const RunOptions& o = options_;
  const OutputOptions& u = o.output;
  std::unique_ptr<RunFolder> own_folder;
  if (!folder) {
    own_folder = std::make_unique<RunFolder>(u.out, out_mode(resumed_, u.overwrite), run_files(),
                                             log_);
    folder = own_folder.get();
  }
  CLUSTR_CHECK(fs::equivalent(folder->path(), u.out), "copy_task: the run's folder ",
               folder->path(), " is not --out ", u.out);
  const StopOnSignal stop_signal;  // Ctrl-C: finish the step, save, return
  NonFiniteSteps non_finite(o.train.max_skipped_steps);
  const std::string checkpoint = (fs::path(u.out) / kCheckpointFile).string();
  MetricsLog metrics;
  const std::string csv = (fs::path(u.out) / "metrics.csv").string();
  metrics.start(csv, resumed_ ? step() : -1, log_);

  RunResult r;
  run_seconds_ = 0;
  r.start_step = step();
  r.stop_reason = "steps";
  const int64_t total = o.train.steps;
  const double tokens_per_step = double(o.train.batch) * double(sequence_length(o.task));
  double interval_loss = 0, interval_acc = 0, interval_seconds = 0;
  int64_t interval_steps = 0;
  LaunchMeter launches(device_);
  // The steps until the next log line, evaluation or checkpoint (a window of graph replays
  // ends there, so that each of them sees the model of its step).
  auto steps_to_boundary = [&](int64_t s) {
    auto next = [s](int64_t every) { return every > 0 ? (s / every + 1) * every : INT64_MAX; };
    int64_t end = std::min({total, next(u.log_interval), next(u.eval_interval)});
    if (u.write_checkpoints) end = std::min(end, next(u.checkpoint_interval));
    return std::max<int64_t>(end - s, 0);
  };
  std::vector<StepEvent> events;
  size_t next_event = 0;
  int64_t s = step();  // the optimizer steps after the event being read
  while (true) {
    if (next_event == events.size()) {
      if (step() >= total) break;
      launches.begin();
      if (graphs_off_.empty()) {
        // The window, and (assuming it skips nothing) the size of the one after it.
        const int64_t K = std::min(steps_to_boundary(step()), kMaxWindow);
        events = graphed_steps(K, steps_to_boundary(step() + K));
      } else {
        events = {eager_step()};
      }
      launches.end();
      next_event = 0;
      s = step() - static_cast<int64_t>(std::count_if(
                       events.begin(), events.end(), [](const StepEvent& e) { return e.skip.empty(); }));
    }
    const StepEvent& event = events[next_event++];
    // Time and signals are looked at after a window's last event: the model is there. (A
    // window ends at every log line, evaluation and checkpoint.)
    const bool window_end = next_event == events.size();
    if (!event.skip.empty()) {
      ++r.skipped_steps;
      non_finite.skipped(event.skip, log_,
                         u.write_checkpoints && fs::exists(checkpoint)
                             ? "the checkpoint " + checkpoint + " is left as it was"
                             : std::string("no checkpoint was written"));
      if (!window_end) continue;
      if (const int sig = StopOnSignal::pending()) {
        r.interrupted_by = sig;
        break;
      }
      continue;
    }
    non_finite.stepped();
    ++s;
    const float loss = event.loss;
    const double acc = event.accuracy, dt = event.seconds;
    r.losses.push_back(loss);
    r.train_seconds += dt;
    run_seconds_ = r.train_seconds;
    interval_loss += double(loss), interval_acc += acc, interval_seconds += dt;
    ++interval_steps;

    const bool last = s == total;
    const bool time_up =
        window_end && o.train.time_limit > 0 && r.train_seconds >= o.train.time_limit;
    const bool log_now = s % u.log_interval == 0 || last || time_up;
    const bool eval_now = s % u.eval_interval == 0 || last || time_up;
    if (!log_now && !eval_now) continue;
    MetricsRow row;
    row.step = s;
    if (log_now) {
      const double ms = 1e3 * interval_seconds / double(interval_steps);
      row.train_loss = interval_loss / double(interval_steps);
      row.train_acc = interval_acc / double(interval_steps);
      row.lr = optimizer_->lr();
      row.ms_per_step = ms;
      row.tokens_per_s = tokens_per_step * double(interval_steps) / interval_seconds;
      const std::string per_step =
          launches.report(interval_steps, r.kernel_launches_per_step, r.blas_calls_per_step);
      logf(log_,
           "step %lld/%lld  loss %.4f  acc %.3f  lr %.2e  ms/step %.1f  tok/s %.0f  left %s%s\n",
           static_cast<long long>(s), static_cast<long long>(total), row.train_loss, row.train_acc,
           row.lr, ms, row.tokens_per_s, format_duration(double(total - s) * ms * 1e-3).c_str(),
           per_step.c_str());
      interval_loss = interval_acc = interval_seconds = 0;
      interval_steps = 0;
    }
    bool stop = false;
    if (eval_now) {
      const Evaluation e = evaluate_heldout();
      r.last_eval = e;
      row.eval_loss = e.loss;
      row.eval_acc = e.accuracy;
      logf(log_,
           "eval %lld/%lld  held-out loss %.4f  acc %.4f  (%lld x %lld sequences, %lld masked "
           "tokens, %.1f s)\n",
           static_cast<long long>(s), static_cast<long long>(total), e.loss, e.accuracy,
           static_cast<long long>(heldout_.size()), static_cast<long long>(o.train.batch),
           static_cast<long long>(e.tokens), e.seconds);
      if (schedule_.at_evaluation(e.loss, s, *optimizer_))
        logf(log_, "plateau: held-out loss has not improved; lr lowered to %.2e\n",
             optimizer_->lr());
      if (o.train.target_accuracy > 0 && e.accuracy >= o.train.target_accuracy) {
        r.reached_target = true;
        r.stop_reason = "target accuracy";
        logf(log_, "reached the target held-out accuracy %.4f at step %lld: training stops\n",
             o.train.target_accuracy, static_cast<long long>(s));
        stop = true;
      }
    }
    metrics.append(row);
    if (eval_now && u.write_plots) metrics.plot(u.out);
    if (time_up && !stop) {
      r.stop_reason = "time limit";
      logf(log_, "time limit of %s reached at step %lld: training stops\n",
           format_duration(o.train.time_limit).c_str(), static_cast<long long>(s));
      stop = true;
    }
    if (u.write_checkpoints && u.checkpoint_interval > 0 && s % u.checkpoint_interval == 0 &&
        !stop && !last) {
      save(checkpoint);
    }
    if (stop) break;
    if (const int sig = StopOnSignal::pending()) {
      r.interrupted_by = sig;
      break;
    }
  }
  rewind_prepared();  // the training stream where the steps taken left it
  r.end_step = step();
  r.skipped_steps = non_finite.total();
  if (u.write_checkpoints) save(checkpoint);
  if (u.write_plots && !metrics.rows().empty()) metrics.plot(u.out);
  if (r.interrupted_by) {
    r.stop_reason = detail::cat("interrupted by ", signal_name(r.interrupted_by));
    r.total_seconds = seconds_since(t_begin);
    logf(log_, "%s at step %lld: %s; continue with --resume %s\n", r.stop_reason.c_str(),
         static_cast<long long>(r.end_step),
         u.write_checkpoints ? ("checkpoint saved: " + checkpoint).c_str()
                             : "no checkpoint (this run writes none)",
         u.out.c_str());
    return r;
  }

  r.final_eval = evaluate(final_batches(u.final_eval_batches));
  r.total_seconds = seconds_since(t_begin);
  logf(log_,
       "final held-out evaluation (%lld x %lld new sequences, %lld masked tokens): loss %.4f  "
       "masked accuracy %.4f\n",
       static_cast<long long>(u.final_eval_batches), static_cast<long long>(o.train.batch),
       static_cast<long long>(r.final_eval.tokens), r.final_eval.loss, r.final_eval.accuracy);
  logf(log_, "steps %lld..%lld (%s) in %s of training, %s in all%s%s\n",
       static_cast<long long>(r.start_step), static_cast<long long>(r.end_step),
       r.stop_reason.c_str(), format_duration(r.train_seconds).c_str(),
       format_duration(r.total_seconds).c_str(), u.write_checkpoints ? "; checkpoint " : "",
       u.write_checkpoints ? checkpoint.c_str() : "");
  return r;
}

}  // namespace clustr::copy
