// The fine-tuning loop of `text finetune` (see finetune.h): AdamW with a linear warm-up and a
// linear decay, gradient clipping, an evaluation on dev after each epoch, metrics.csv and its
// plots, atomic checkpoints with exact resume, and Ctrl-C.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>

#include "apps/common/device.h"
#include "apps/common/metrics_file.h"
#include "apps/common/plot.h"
#include "apps/common/run_folder.h"
#include "apps/common/stop_signal.h"
#include "apps/common/training.h"
#include "apps/text/finetune.h"
#include "apps/text/pretrained.h"
#include "apps/text/schedule.h"
#include "autograd/ops.h"
#include "core/error.h"
#include "layers/checkpoint.h"
#include "optim/optimizer.h"

namespace clustr::text {

namespace {

struct Row {
  int64_t step = 0, epoch = 0;
  double train_loss = NAN, dev_loss = NAN, dev_score = NAN, lr = NAN, seconds = NAN;
};

MetricsLog<Row> metrics_log() {
  return MetricsLog<Row>({{"step", &Row::step, nullptr, nullptr},
                          {"epoch", &Row::epoch, nullptr, nullptr},
                          {"train_loss", nullptr, &Row::train_loss, "%.6g"},
                          {"dev_loss", nullptr, &Row::dev_loss, "%.6g"},
                          {"dev_score", nullptr, &Row::dev_score, "%.6g"},
                          {"lr", nullptr, &Row::lr, "%.6g"},
                          {"seconds", nullptr, &Row::seconds, "%.6g"}});
}

double main_score(Task task, const Score& s) { return task == Task::wic ? s.accuracy : s.f1; }

}  // namespace

int finetune(const FinetuneOptions& o, std::FILE* log) {
  CLUSTR_CHECK(o.epochs >= 1, "--epochs must be >= 1, got ", o.epochs);
  CLUSTR_CHECK(o.batch >= 1, "--batch must be >= 1, got ", o.batch);
  CLUSTR_CHECK(o.lr > 0 && std::isfinite(o.lr), "--lr must be > 0, got ", o.lr);
  CLUSTR_CHECK(o.warmup >= 0 && o.warmup < 1, "--warmup must be in [0, 1), got ", o.warmup);
  CLUSTR_CHECK(o.max_length >= 8 && o.max_length <= 512, "--max-length must be in [8, 512], got ",
               o.max_length);
  const Precision precision = parse_precision(o.precision);
  o.attention.validate();
  const OutMode mode = out_mode(!o.resume.empty(), o.overwrite);
  const std::string folder = choose_out_folder(o.out, o.out_given, o.resume, mode, log);
  const Device device = prepare_machine(o.machine);

  Generator gen(derive_key(o.seed, 0));
  const BertConfig config = read_pretrained_config(o.model);
  const TextTokenizer tokenizer = TextTokenizer::load(o.model);
  const int max_length = static_cast<int>(std::min<int64_t>(o.max_length, config.max_positions));
  EncodedSet train = load_split(o.task, o.data, "train", tokenizer, max_length);
  EncodedSet dev = load_split(o.task, o.data, "dev", tokenizer, max_length);
  if (o.max_train > 0 && static_cast<int64_t>(train.examples.size()) > o.max_train)
    train.examples.resize(o.max_train);
  if (o.max_dev > 0 && static_cast<int64_t>(dev.examples.size()) > o.max_dev)
    dev.examples.resize(o.max_dev);
  CLUSTR_CHECK(!train.examples.empty() && !dev.examples.empty(), "finetune: the ", task_name(o.task),
               " task at ", o.data, " has no usable train or dev examples (dropped: ",
               train.dropped_too_long + dev.dropped_too_long, " longer than ", max_length,
               " pieces, the least of --max-length and the model's ", config.max_positions,
               " positions; ", train.dropped_unaligned + dev.dropped_unaligned,
               " whose answer is not whole pieces of the context)");

  // The task model starts from the pretrained encoder's weights.
  TaskModel model(o.task, config, o.attention, gen);
  load_bert_weights(o.model + "/model.safetensors", model.bert());
  model.to(device);
  optim::AdamOptions adam = optim::adamw_defaults();
  adam.lr = o.lr;
  adam.weight_decay = o.weight_decay;
  optim::AdamW optimizer(model.named_parameters(), adam);

  const int64_t per_epoch = (static_cast<int64_t>(train.examples.size()) + o.batch - 1) / o.batch;
  // The schedule spans --epochs; --max-steps only stops the run early (a later --resume goes on
  // along the same schedule).
  const int64_t total = per_epoch * o.epochs;
  const int64_t limit = o.max_steps > 0 ? std::min(o.max_steps, total) : total;
  RunFolder run(folder, mode, {"metrics.csv", "loss.png", "dev.png", "last.safetensors",
                               "best.safetensors"}, log);
  int64_t step = 0;
  double best = -INFINITY;
  if (mode == OutMode::resume) {
    const std::map<std::string, std::string> saved =
        read_checkpoint_config(run.file("last.safetensors"));
    std::string differences;
    for (const auto& [key, value] : run_config_of(o))
      if (key != "max-steps" && (!saved.count(key) || saved.at(key) != value))
        differences += detail::cat("\n  --", key, ": the run has ",
                                   saved.count(key) ? saved.at(key) : "(absent)", ", now ", value);
    CLUSTR_CHECK(differences.empty(), "--resume ", folder, ": a resumed run goes on with the "
                 "run's own settings; these differ:", differences);
    const LoadedCheckpoint c = load_checkpoint(run.file("last.safetensors"), model);
    optimizer.load_state_dict(c.extras);
    c.restore_generator(gen);
    step = c.step;
    if (c.config.count("state.best")) best = std::stod(c.config.at("state.best"));
    logf(log, "resumed %s at step %lld\n", run.file("last.safetensors").c_str(),
         static_cast<long long>(step));
  }
  MetricsLog<Row> metrics = metrics_log();
  metrics.start(run.file("metrics.csv"), mode == OutMode::resume ? step : -1, log);
  logf(log, "task %s: %zu train, %zu dev examples (dropped: %lld too long, %lld unaligned); "
            "%lld steps of batch %lld; attention %s; device %s; products %s\n",
       task_name(o.task), train.examples.size(), dev.examples.size(),
       static_cast<long long>(train.dropped_too_long + dev.dropped_too_long),
       static_cast<long long>(train.dropped_unaligned + dev.dropped_unaligned),
       static_cast<long long>(total), static_cast<long long>(o.batch),
       attention_type_name(o.attention.type), o.machine.device.c_str(), to_string(precision));

  // last.safetensors holds what a resume needs (the optimizer's state, the stream);
  // best.safetensors only the model.
  const auto save = [&](const std::string& name) {
    CheckpointState state;
    state.step = step;
    state.config = run_config_of(o);
    state.config["state.best"] = exact_text(best);
    if (name == "last.safetensors") state.extras = optimizer.state_dict();
    state.rng = GeneratorState::of(gen);
    check_finite_state(model, state.extras, run.file(name));
    save_checkpoint(run.file(name), model, state);
  };
  const StopOnSignal stop;
  const auto t0 = Clock::now();
  double loss_sum = 0;
  int64_t loss_count = 0;
  NonFiniteSteps non_finite(10);
  while (step < limit) {
    const int64_t epoch = step / per_epoch;
    const std::vector<int64_t> order =
        epoch_order(static_cast<int64_t>(train.examples.size()), o.seed, epoch);
    for (int64_t k = step % per_epoch; k < per_epoch && step < limit; ++k) {
      const std::vector<int64_t> rows(
          order.begin() + k * o.batch,
          order.begin() + std::min<int64_t>(order.size(), (k + 1) * o.batch));
      model.train();
      optimizer.set_lr(lr_at(step, total, o.lr, o.warmup));
      const Batch b = make_batch(train.examples, rows, tokenizer.pad_id(), o.task, device);
      Variable loss;
      {
        const PrecisionScope scope(precision);
        loss = task_loss(o.task, b, task_forward(model, b, gen));
        optimizer.zero_grad();
        loss.backward();
      }
      const double value = loss.data().item();
      if (step_or_skip(optimizer, value, o.clip, step, non_finite, log,
                       run.file("last.safetensors")))
        loss_sum += value, ++loss_count;
      ++step;
      if (step % o.log_interval == 0 || step == limit) {
        const double secs = seconds_since(t0);
        logf(log, "step %lld/%lld  epoch %lld  loss %.4f  lr %.3g  %.1f examples/s\n",
             static_cast<long long>(step), static_cast<long long>(total),
             static_cast<long long>(epoch + 1), loss_sum / std::max<int64_t>(1, loss_count),
             double(optimizer.lr()), double(step * o.batch) / std::max(1e-9, secs));
      }
      if (const int sig = StopOnSignal::pending()) {
        save("last.safetensors");
        logf(log, "%s: stopped at step %lld, %s saved\n", signal_name(sig),
             static_cast<long long>(step), run.file("last.safetensors").c_str());
        return 128 + sig;
      }
    }
    // The end of an epoch (or of --max-steps): evaluate on dev, log, save.
    const Score s = evaluate_task(model, dev.examples, tokenizer, o.batch * 2, precision);
    const double score = main_score(o.task, s);
    Row row;
    row.step = step;
    row.epoch = (step + per_epoch - 1) / per_epoch;
    row.train_loss = loss_sum / std::max<int64_t>(1, loss_count);
    row.dev_loss = s.loss;
    row.dev_score = score;
    row.lr = optimizer.lr();
    row.seconds = seconds_since(t0);
    metrics.append(row);
    loss_sum = 0, loss_count = 0;
    logf(log, "epoch %lld: dev loss %.4f, %s %.4f%s (%.1f s)\n", static_cast<long long>(row.epoch),
         s.loss, o.task == Task::wic ? "accuracy" : "F1", score,
         o.task == Task::span ? detail::cat(", exact match ", s.exact_match).c_str() : "",
         s.seconds);
    if (score > best) {
      best = score;
      save("best.safetensors");
    }
    save("last.safetensors");
    plot_metrics(run.path(), "loss.png",
                 {metric_series(metrics.rows(), "train", &Row::train_loss),
                  metric_series(metrics.rows(), "dev", &Row::dev_loss)},
                 {"fine-tuning loss", "step", "loss"});
    plot_metrics(run.path(), "dev.png", {metric_series(metrics.rows(), "dev", &Row::dev_score)},
                 {o.task == Task::wic ? "dev accuracy" : "dev F1", "step", "score"});
  }
  logf(log, "done: best dev %s %.4f; checkpoints in %s\n", o.task == Task::wic ? "accuracy" : "F1",
       best, run.path().c_str());
  return 0;
}

}  // namespace clustr::text
