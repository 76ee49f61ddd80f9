// The masked copy task (paper supp. C.2): trains a transformer encoder with full, clustered or
// improved-clustered attention to fill in masked symbols of `0 w 0 w` sequences.
//
//   copy_task                                 the default run: an improved-clustered model on a
//                                             CPU-sized task, until 99.5% held-out accuracy
//   copy_task --preset paper                  the paper's settings (4 layers, 6 x 32, 5000 steps)
//   copy_task --resume runs/copy_task --steps 6000     continue a run exactly
//   copy_task --checkpoint runs/copy_task --evaluate-with full
//                                             evaluate a trained model with another attention
//   copy_task --device cuda                   train on the GPU (the model is initialised on
//                                             the CPU from the seed, then moved)
//   copy_task --precision bf16                matrix products with bf16 operands (f32 weights,
//                                             optimizer, softmax, norms and loss)
//
// Output in --out: metrics.csv, loss.png, accuracy.png, checkpoint.safetensors. A new run
// refuses a folder holding files (--overwrite replaces them, --resume continues the run there);
// without --out it takes the first free one of runs/copy_task, runs/copy_task-2, ...
// Ctrl-C (SIGINT) or SIGTERM stops training after the current step with a checkpoint.
// apps/copy_task/ holds the model, the training loop and the flags (shared with copy_sweep).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <map>
#include <string>

#include "apps/common/device.h"
#include "apps/common/flags.h"
#include "apps/common/train_command.h"
#include "apps/common/training.h"
#include "apps/copy_task/options.h"
#include "apps/copy_task/train.h"
#include "core/error.h"
#include "layers/checkpoint.h"

namespace {

using namespace clustr;
using namespace clustr::copy;

// --checkpoint [--evaluate-with TYPE]: held-out accuracy of a trained model with the attention
// it was trained with and with TYPE (the attention flags given on the command line override
// the checkpoint's clusters, topk, bits, iterations, rounds, buckets, chunk). No training.
int evaluate_checkpoint(RunOptions o, const CLI::App& app, const std::string& path,
                        const std::string& evaluate_with) {
  const std::string file = resolve_checkpoint(path, "--checkpoint");
  const AttentionConfig given = o.model.attention;
  const Precision given_precision = o.model.precision;
  const std::map<std::string, std::string> given_config = to_config(o);
  apply_checkpoint_config(read_checkpoint_config(file), o);
  // The model and task flags come from the checkpoint: say so for those given otherwise.
  const std::map<std::string, std::string> used = to_config(o);
  for (const auto& [key, value] : given_config)
    if (key != "precision" && app.count("--" + key) && used.at(key) != value)
      std::printf("note: --%s %s is not used: %s was trained with --%s %s\n", key.c_str(),
                  value.c_str(), file.c_str(), key.c_str(), used.at(key).c_str());
  const Precision trained_precision = o.model.precision;
  // The weights are f32 either way: a model trained in one precision evaluates in the other.
  if (app.count("--precision")) o.model.precision = given_precision;
  const AttentionConfig trained = o.model.attention;
  AttentionConfig with = given;
  if (!evaluate_with.empty()) with.type = parse_attention_type(evaluate_with);
  const AttentionConfig other =
      override_attention(trained, with, [&](const std::string& flag) {
        return flag == "--attention" ? !evaluate_with.empty() : app.count(flag) > 0;
      });
  o.output.write_checkpoints = false;
  o.output.write_plots = false;

  Trainer trainer(o, stdout);
  const LoadedCheckpoint c = load_checkpoint(file, trainer.model());
  const auto batches = trainer.final_batches(o.output.final_eval_batches);
  std::printf("checkpoint %s (step %lld): %lld parameters, L = %d, S = %d, mask ratio %g\n",
              file.c_str(), static_cast<long long>(c.step),
              static_cast<long long>(trainer.model().parameter_count()), o.task.length,
              o.task.symbols, double(o.task.mask_ratio));
  std::printf("held-out set: %lld x %lld sequences; products in %s (trained in %s)\n",
              static_cast<long long>(o.output.final_eval_batches),
              static_cast<long long>(o.train.batch), to_string(o.model.precision),
              to_string(trained_precision));
  const Evaluation a = trainer.evaluate(batches);
  std::printf("trained with   %-45s loss %.4f  masked accuracy %.4f  (%.1f s)\n",
              trained.describe().c_str(), a.loss, a.accuracy, a.seconds);
  trainer.model().set_attention(other);
  const Evaluation b = trainer.evaluate(batches);
  std::printf("evaluated with %-45s loss %.4f  masked accuracy %.4f  (%.1f s)\n",
              other.describe().c_str(), b.loss, b.accuracy, b.seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  RunOptions o = preset_options(find_preset(argc, argv));
  CLI::App app{"clustr masked copy task (Vyas et al. 2020, supp. C.2): train a transformer "
               "encoder with full, clustered or improved-clustered attention"};
  add_flags(app, o);
  std::string resume, checkpoint, evaluate_with;
  app.add_option("--resume", resume,
                 "continue from a checkpoint file, or a folder holding checkpoint.safetensors "
                 "(--out defaults to its folder)");
  app.add_option("--checkpoint", checkpoint,
                 "evaluate this checkpoint (file or folder) on held-out data; no training");
  app.add_option("--evaluate-with", evaluate_with,
                 "with --checkpoint: also evaluate with this attention type (full, clustered, "
                 "improved-clustered)");
  if (const int status = clustr::parse_or_exit(app, argc, argv); status >= 0) return status;
  check_integer_flags(app);
  note_memory_flags(detail::cat(
      "--batch ", o.train.batch, ", --length ", o.task.length, ", --layers ", o.model.layers,
      ", --heads ", o.model.heads, " x --head-dim ", o.model.head_dim, ", --feedforward ",
      o.model.feedforward, ", --eval-batches ", o.output.eval_batches, " and --final-eval-batches ",
      o.output.final_eval_batches));

  if (!evaluate_with.empty() || !checkpoint.empty()) {
    CLUSTR_CHECK(!checkpoint.empty(), "--evaluate-with needs --checkpoint (the trained model)");
    CLUSTR_CHECK(resume.empty(), "--checkpoint evaluates and --resume trains: give one of them");
    return evaluate_checkpoint(o, app, checkpoint, evaluate_with);
  }
  const RunResult r = train_command<Trainer>(o, resume, app.count("--out") > 0);
  if (r.interrupted_by) return 128 + r.interrupted_by;
  if (o.train.target_accuracy > 0 && r.final_eval.accuracy < o.train.target_accuracy)
    std::printf("note: the final held-out accuracy %.4f is below --target-accuracy %.4f\n",
                r.final_eval.accuracy, o.train.target_accuracy);
  return 0;
} catch (const std::exception& e) {
  std::fflush(stdout);
  std::fprintf(stderr, "copy_task: error: %s\n", error_text(e).c_str());
  return 1;
}
