// Flags, presets, checks and config maps of a copy-task run (options.h).
#include "apps/copy_task/options.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <set>

#include "apps/common/training.h"
#include "core/error.h"

namespace clustr::copy {

namespace {

// The held-out sets are drawn at once and kept: bounded by what they hold, in tokens (8 bytes
// each, input and target), so that a typo cannot take the machine's memory.
constexpr double kMaxHeldOutTokens = 1e8;

// The keys a checkpoint's config sets besides the locked ones: what rebuilds the trained model
// (dropout, precision) and its held-out sets (batch, seed).
const std::vector<std::string> kRebuildKeys = {"dropout", "precision", "batch", "seed"};

}  // namespace

RunOptions preset_options(const std::string& name) {
  return preset_of<RunOptions>(
      name,
      {// The defaults of options.h, with 30 clusters, not 15: at N = 128, 15 clusters held some
       // seeds near 99.2% held-out accuracy for 1000 steps (the same weights scored 99.9% with
       // full attention), 30 reach 99.5% in about 600 steps at nearly the same cost per step.
       {"cpu", "attention=improved-clustered topk=32 clusters=30"},
       // Supplementary C.2. The paper gives no warm-up, clipping or schedule for R-Adam.
       {"paper",
        "attention=improved-clustered topk=32 clusters=15 layers=4 heads=6 head-dim=32 "
        "feedforward=768 optimizer=radam lr=2e-4 batch=32 steps=5000 lr-schedule=constant "
        "warmup=0 clip=0 target-accuracy=0 time-limit=0 eval-interval=500 "
        "checkpoint-interval=1000 out=runs/copy_task_paper"}});
}

FlagTable settings_table(RunOptions& o) {
  FlagTable f;
  f.add("preset", o.preset, "cpu (the default run) or paper (supp. C.2 settings); other flags "
        "override the preset's values");
  add_encoder_settings(f, o.model, "dropout on residual branches and feed-forward");
  TrainOptions& t = o.train;
  OutputOptions& u = o.output;
  // The task.
  f.add("length", o.task.length, "symbols per copy L (sequence length N = 2L + 2)")
      .within(1, 1000000)
      .resume(Resume::locked);
  f.add("symbols", o.task.symbols, "alphabet size S (symbols 1..S)")
      .within(1, 1000)
      .resume(Resume::locked);
  f.add("mask-ratio", o.task.mask_ratio, "fraction of symbol positions masked")
      .check([&o] { return o.task.mask_ratio > 0.0f && o.task.mask_ratio <= 0.5f; },
             "must be in (0, 0.5] (a word position is masked in at most one of its two copies, "
             "so that it stays recoverable)")
      .resume(Resume::locked);
  // Training.
  f.add("batch", t.batch, "sequences per step").at_least(1).resume(Resume::noted);
  f.add("steps", t.steps, "optimizer steps in all (a resumed run continues to it)").at_least(1);
  add_optimizer_settings(f, t, {"radam", "adam", "adamw", "sgd"}, "evaluations");
  f.add("target-accuracy", t.target_accuracy,
        "stop when the held-out masked accuracy reaches this (0: run all steps)")
      .within(0, 1);
  add_run_settings(f, t, "seed of the model, data and held-out streams");
  add_machine_settings(f, o);
  // Output.
  add_out_settings(f, u.out, u.overwrite, "runs/copy_task",
                   "metrics.csv, checkpoint.safetensors, PNGs");
  f.add("log-interval", u.log_interval, "steps per log line").at_least(1);
  f.add("eval-interval", u.eval_interval, "steps between held-out evaluations")
      .at_least(1)
      .resume(Resume::noted);
  auto held_out = [&o](int64_t batches) {
    const double n = 2.0 * double(o.task.length) + 2.0;
    return double(batches) * double(o.train.batch) * n <= kMaxHeldOutTokens;
  };
  const std::string bound = detail::cat("x --batch x N must be at most ",
                                        int64_t(kMaxHeldOutTokens), " held-out tokens (",
                                        int64_t(kMaxHeldOutTokens) * 8 / (1 << 20),
                                        " MiB; give fewer batches)");
  f.add("eval-batches", u.eval_batches, "held-out batches per evaluation")
      .at_least(1)
      .check([&u, held_out] { return held_out(u.eval_batches); }, bound)
      .resume(Resume::noted);
  f.add("final-eval-batches", u.final_eval_batches,
        "batches of the larger held-out set evaluated after training")
      .at_least(1)
      .check([&u, held_out] { return held_out(u.final_eval_batches); }, bound);
  f.add("checkpoint-interval", u.checkpoint_interval,
        "steps between checkpoints (0: only the final one)")
      .at_least(0);
  return f;
}

void add_flags(CLI::App& app, RunOptions& o, bool grid_axes) {
  const std::set<std::string> grid = {"attention", "clusters", "length"};
  settings_table(o).add_to(app, grid_axes ? std::set<std::string>{} : grid);
}

void validate(const RunOptions& o) {
  RunOptions copy = o;
  settings_table(copy).validate();
  o.model.attention.validate();
  CLUSTR_CHECK(o.model.attention.type != AttentionType::oracle_top,
               "--attention oracle-top is for evaluation only: it chooses each query's keys "
               "from full attention's weights and has no gradient "
               "(evaluate a trained model with it: --checkpoint DIR --evaluate-with oracle-top)");
}

void apply_checkpoint_config(const std::map<std::string, std::string>& config, RunOptions& o) {
  FlagTable f = settings_table(o);
  std::vector<std::string> keys;
  for (const std::string& k : f.keys(Resume::locked))
    if (k != "optimizer") keys.push_back(k);
  keys.insert(keys.end(), kRebuildKeys.begin(), kRebuildKeys.end());
  f.apply(config, keys);
}


}  // namespace clustr::copy
