// The apps on the CUDA device against the CPU: one or two training steps of a tiny copy-task
// model and of a tiny speech model (on a synthetic tone corpus), run from the same seed with
// --device cpu and --device cuda. The models are built on the CPU from the seed and then moved,
// dropout masks come from the same Philox words on both devices, so the losses agree to float
// rounding and the parameters after the steps stay close. SGD keeps a parameter's change
// proportional to its gradient (Adam's first step is lr * sign(g), which would turn a rounding
// difference in a gradient near zero into a difference of 2 lr).
//
// Tolerances: the devices sum in other orders (cuBLAS against the CPU GEMM's blocking, the
// reductions' trees), so a loss may differ by a few float ulps of its value; after SGD steps
// with lr 0.05 a parameter moves by lr * g, so its difference is lr times a gradient's rounding
// difference. The worst parameter difference is printed.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "apps/copy_task/options.h"
#include "apps/copy_task/train.h"
#include "apps/speech/options.h"
#include "apps/speech/train.h"
#include "check.h"
#include "core/cuda/cuda.h"
#include "core/tensor.h"
#include "tone_corpus.h"

using namespace clustr;
using clustr::test::TempDir;

namespace {

constexpr double kLossTolerance = 1e-5;   // relative
constexpr double kParamTolerance = 1e-5;  // absolute, after the steps

double relative_difference(double a, double b) {
  return std::fabs(a - b) / std::max(1e-12, std::max(std::fabs(a), std::fabs(b)));
}

// Counts of argmax decisions (correct predictions, edits of a greedy decode) on the device and
// on the cpu: the same with the emulator's exact numerics. Elsewhere (a GPU, the GPU-like
// emulation) logits that agree within kLossTolerance may still fall on either side of a near
// tie, so one decision may go the other way: the counts then differ by at most `per_flip`.
void check_same_decisions(double device_count, double cpu_count, double per_flip) {
  INFO("device " << device_count << ", cpu " << cpu_count);
  if (cuda::exact_numerics())
    CHECK(device_count == cpu_count);
  else
    CHECK(std::fabs(device_count - cpu_count) <= per_flip + 1e-9);
}

using NamedValues = std::vector<std::pair<std::string, std::vector<float>>>;

NamedValues host_parameters(const Module& model) {
  NamedValues out;
  for (const auto& [name, p] : model.named_parameters())
    out.emplace_back(name, p.data().to_vector());  // a host copy on either device
  return out;
}

// Every parameter of `cuda` within kParamTolerance of `cpu`; prints the worst.
void check_parameters_close(const NamedValues& cuda, const NamedValues& cpu) {
  REQUIRE(cuda.size() == cpu.size());
  double worst = 0;
  std::string where;
  for (size_t i = 0; i < cpu.size(); ++i) {
    REQUIRE(cuda[i].first == cpu[i].first);
    REQUIRE(cuda[i].second.size() == cpu[i].second.size());
    for (size_t j = 0; j < cpu[i].second.size(); ++j) {
      const double d = std::fabs(double(cuda[i].second[j]) - double(cpu[i].second[j]));
      if (!(d <= worst)) {  // NaN counts as the worst
        worst = d;
        where = cpu[i].first + "[" + std::to_string(j) + "]: cuda " +
                std::to_string(cuda[i].second[j]) + ", cpu " + std::to_string(cpu[i].second[j]);
      }
    }
  }
  MESSAGE("largest parameter difference " << worst << " at " << where);
  CHECK_MESSAGE(worst <= kParamTolerance, "largest parameter difference " << worst << " at "
                                                                         << where << " (allowed "
                                                                         << kParamTolerance << ")");
}

// A copy-task run small enough for the emulated device: one layer of 2 heads x 8, sequences of
// 12 tokens, batch 4.
copy::RunOptions tiny_copy_run() {
  copy::RunOptions o = copy::preset_options("cpu");
  o.model.layers = 1;
  o.model.heads = 2;
  o.model.head_dim = 8;
  o.model.feedforward = 16;
  o.task = CopyTaskConfig{5, 4, 0.2f};
  o.train.batch = 4;
  return o;
}

}  // namespace

TEST_CASE("apps: two copy-task training steps on cuda match the cpu") {
  TempDir dir;
  copy::RunOptions o = tiny_copy_run();
  o.model.dropout = 0.1f;  // the same masks on both devices
  o.model.attention.type = AttentionType::full;
  o.train.optimizer = "sgd";
  o.train.momentum = 0.9f;
  o.train.lr = 0.05f;
  o.train.warmup = 0;
  o.train.clip = 1.0f;
  o.output.out = dir.file("run");
  o.output.eval_batches = 2;

  std::vector<float> losses[2];
  std::vector<double> accuracies[2];
  std::vector<int64_t> tokens[2];
  double eval_loss[2] = {0, 0};
  NamedValues params[2];
  for (int d = 0; d < 2; ++d) {
    o.device = d == 0 ? "cpu" : "cuda";
    copy::Trainer trainer(o, nullptr);
    CHECK(trainer.device() == (d == 0 ? Device::cpu : Device::cuda));
    for (int s = 0; s < 2; ++s) {
      double acc = 0;
      int64_t n = 0;
      losses[d].push_back(trainer.train_step(&acc, &n));
      accuracies[d].push_back(acc);
      tokens[d].push_back(n);
    }
    eval_loss[d] = trainer.evaluate_heldout().loss;
    params[d] = host_parameters(trainer.model());
  }
  for (size_t s = 0; s < 2; ++s) {
    INFO("step " << s + 1 << ": loss cuda " << losses[1][s] << ", cpu " << losses[0][s]);
    CHECK(relative_difference(losses[1][s], losses[0][s]) <= kLossTolerance);
    REQUIRE(tokens[1][s] == tokens[0][s]);  // the same batch
    check_same_decisions(accuracies[1][s] * double(tokens[1][s]),
                         accuracies[0][s] * double(tokens[0][s]), 1.0);
  }
  INFO("held-out loss cuda " << eval_loss[1] << ", cpu " << eval_loss[0]);
  CHECK(relative_difference(eval_loss[1], eval_loss[0]) <= kLossTolerance);
  check_parameters_close(params[1], params[0]);
}

TEST_CASE("apps: a copy-task run on cuda reports its kernel launches and cuBLAS calls per step") {
  TempDir dir;
  copy::RunOptions o = tiny_copy_run();
  o.train.steps = 3;
  o.train.target_accuracy = 0;
  o.output.log_interval = 1;
  o.output.eval_interval = 2;  // an evaluation inside the run, whose launches are not counted
  o.output.eval_batches = 1;
  o.output.final_eval_batches = 1;
  o.output.write_plots = false;
  o.cuda_graphs = "off";  // launch by launch (with graphs the step is one replay: below)
  double kernels[2] = {0, 0}, blas[2] = {0, 0};
  for (int d = 0; d < 2; ++d) {
    o.device = d == 0 ? "cpu" : "cuda";
    o.output.out = dir.file(o.device);
    copy::Trainer trainer(o, nullptr);
    const copy::RunResult r = trainer.run();
    kernels[d] = r.kernel_launches_per_step, blas[d] = r.blas_calls_per_step;
  }
  CHECK(kernels[0] == 0);  // nothing is launched on the cpu
  CHECK(blas[0] == 0);
  // One step on the device, counted directly: the run's last interval (one step) is the same.
  o.device = "cuda";
  o.output.out = dir.file("direct");
  copy::Trainer trainer(o, nullptr);
  double acc = 0;
  trainer.train_step(&acc);  // the first step (the optimizer state is made lazily)
  const cuda::LaunchCounts before = cuda::launch_counts();
  trainer.train_step(&acc);
  const cuda::LaunchCounts after = cuda::launch_counts();
  INFO("per step: " << kernels[1] << " kernels, " << blas[1] << " cuBLAS calls");
  CHECK(kernels[1] == double(after.kernels - before.kernels));
  CHECK(blas[1] == double(after.blas - before.blas));
  CHECK(kernels[1] > 0);
  CHECK(blas[1] > 0);
  // With graphs the last interval's step launched nothing of its own: one replay.
  o.cuda_graphs = "on";
  o.output.out = dir.file("graphs");
  copy::Trainer graphed(o, nullptr);
  const cuda::LaunchCounts start = cuda::launch_counts();
  const copy::RunResult r = graphed.run();
  CHECK(graphed.graphs_off_reason() == "");
  CHECK(r.kernel_launches_per_step == 0);
  CHECK(r.blas_calls_per_step == 0);
  CHECK(cuda::launch_counts().graphs - start.graphs == 3);
}

TEST_CASE("apps: two speech training steps on cuda match the cpu") {
  TempDir corpus, out;
  clustr::test::write_tone_corpus(corpus.file("corpus"), 8, 2, /*bad=*/false);
  speech::RunOptions o = speech::preset_options("cpu");
  o.data.corpus = corpus.file("corpus");
  o.model.layers = 1;
  o.model.heads = 2;
  o.model.head_dim = 8;
  o.model.feedforward = 16;
  o.model.dropout = 0.1f;
  o.model.stacking = 2;
  o.model.attention.type = AttentionType::full;
  o.train.batch = 4;
  o.train.epochs = 1;
  o.train.max_steps = 2;
  o.train.optimizer = "radam";  // its first steps are momentum SGD (no adaptive term yet)
  o.train.lr = 0.05f;
  o.train.warmup = 0;
  o.train.lr_schedule = "constant";
  o.output.log_interval = 1;
  o.output.examples = 0;
  o.output.write_plots = false;

  speech::TrainResult r[2];
  NamedValues params[2];
  for (int d = 0; d < 2; ++d) {
    o.device = d == 0 ? "cpu" : "cuda";
    o.output.out = out.file(o.device);
    speech::Trainer trainer(o, nullptr);
    r[d] = trainer.run();
    params[d] = host_parameters(trainer.model());
  }
  REQUIRE(r[0].steps == 2);
  CHECK(r[1].steps == r[0].steps);
  INFO("first loss cuda " << r[1].first_loss << ", cpu " << r[0].first_loss << "; second "
                          << r[1].last_loss << ", " << r[0].last_loss << "; dev "
                          << r[1].last_dev.loss << ", " << r[0].last_dev.loss);
  CHECK(relative_difference(r[1].first_loss, r[0].first_loss) <= kLossTolerance);
  CHECK(relative_difference(r[1].last_loss, r[0].last_loss) <= kLossTolerance);
  CHECK(relative_difference(r[1].last_dev.loss, r[0].last_dev.loss) <= kLossTolerance);
  // One greedy frame decided the other way changes the decoded tokens by at most two edits.
  check_same_decisions(double(r[1].last_dev.greedy.edits), double(r[0].last_dev.greedy.edits),
                       2.0);
  check_parameters_close(params[1], params[0]);
  // The launches of a step are counted on the device only.
  CHECK(r[0].kernel_launches_per_step == 0);
  CHECK(r[0].blas_calls_per_step == 0);
  CHECK(r[1].kernel_launches_per_step > 0);
  CHECK(r[1].blas_calls_per_step > 0);
}

TEST_CASE("apps: speech training with --cuda-graphs on and off gives the same losses, skipped "
          "steps and weights, bit for bit; a step that cannot be captured trains without graphs") {
  TempDir corpus, out;
  // 12 utterances and 11 copies of the first in batches of 4: the copies make at least two
  // batches of one shape, so epoch 1 runs the shapes op by op but captures that one; epoch 2
  // captures the others. The dev set's extra utterance is longer than any training one: the
  // evaluation after epoch 1 makes the positional table anew, which drops the graph captured
  // before it. With 2 graphs kept, the least recently used one is dropped for a third shape.
  clustr::test::write_tone_corpus(corpus.file("corpus"), 12, 2, /*bad=*/false);
  {
    std::ifstream first(corpus.file("corpus") + "/train.tsv");
    std::string line;
    std::getline(first, line);
    const std::string rest = line.substr(line.find('\t'));  // the same wav and labels
    std::ofstream train(corpus.file("corpus") + "/train.tsv", std::ios::app);
    for (int i = 0; i < 11; ++i) train << "copy" << i << rest << "\n";
    std::mt19937 rng(11);
    const std::vector<int32_t> labels = {1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2};
    const std::vector<float> samples = clustr::test::tone_utterance(labels, rng);
    write_wav_pcm16(corpus.file("corpus") + "/wav/long.wav", samples, 16000);
    std::ofstream dev(corpus.file("corpus") + "/dev.tsv", std::ios::app);
    dev << "long\twav/long.wav\t" << double(samples.size()) / 16000.0
        << "\tA B C D E A B C D E A B\n";
  }
  // (The clustered type's kernels with the lengths on the device only, as in a capture, are
  // checked against the cpu in test_cuda_clustered.cpp.)
  struct Case {
    const char* what;
    AttentionType type;
    int64_t head_dim;  // 8: the blocked attention kernels read the lengths on the host
    float lr, dropout;
    bool graphs;  // whether graphs are expected to be used to the end
    int64_t max_graphs = 16;  // --max-graphs
  };
  for (const Case& c :
       {Case{"full, dropout, 2 graphs kept", AttentionType::full, 32, 1e-2f, 0.1f, true, 2},
        Case{"improved-clustered, dropout", AttentionType::improved_clustered, 32, 1e-2f, 0.1f,
             true},
        Case{"skipping", AttentionType::full, 32, 1e3f, 0.0f, true},
        Case{"host read", AttentionType::full, 8, 1e-2f, 0.0f, false}}) {
    INFO("case: " << std::string(c.what));
    std::vector<float> losses[2];
    NamedValues params[2];
    std::string errors[2];
    double dev_loss[2] = {0, 0};
    int64_t skipped[2] = {0, 0};
    for (int g = 0; g < 2; ++g) {
      speech::RunOptions o = speech::preset_options("cpu");
      o.data.corpus = corpus.file("corpus");
      o.model.layers = 1;
      o.model.heads = 2;
      o.model.head_dim = c.head_dim;
      o.model.feedforward = 16;
      o.model.dropout = c.dropout;
      o.model.stacking = 2;
      o.model.attention.type = c.type;
      o.model.attention.clusters = 3;
      o.model.attention.topk = 4;
      o.train.batch = 4;
      o.train.epochs = 2;
      o.train.lr = c.lr;
      o.train.max_skipped_steps = 4;
      o.train.max_graphs = c.max_graphs;
      o.output.log_interval = 3;  // windows of 3 replays (inside epochs too)
      o.output.examples = 0;
      o.output.write_plots = false;
      o.device = "cuda";
      o.cuda_graphs = g == 0 ? "on" : "off";
      o.output.out = out.file(std::string(c.what) + o.cuda_graphs);
      speech::Trainer trainer(o, nullptr);
      try {
        const speech::TrainResult r = trainer.run();
        losses[g] = r.losses;
        dev_loss[g] = r.last_dev.loss;
        skipped[g] = r.skipped_steps;
      } catch (const Error& e) {
        errors[g] = e.what();  // the run folder's name left out
        for (size_t at; (at = errors[g].find(o.output.out)) != std::string::npos;)
          errors[g].replace(at, o.output.out.size(), "<out>");
      }
      params[g] = host_parameters(trainer.model());
      if (g == 0) {
        INFO("graphs off: " << trainer.graphs_off_reason());
        CHECK(trainer.graphs_off_reason().empty() == c.graphs);
        if (c.graphs) {
          REQUIRE(trainer.graphed_steps() != nullptr);
          const speech::GraphedSteps::Counts& n = trainer.graphed_steps()->counts();
          INFO("op by op " << n.op_by_op << ", captures " << n.captures << ", replays "
                           << n.replays << ", evicted " << n.evicted << ", invalidated "
                           << n.invalidated);
          CHECK(n.captures >= 1);
          CHECK(trainer.graphed_steps()->graphs() <= size_t(c.max_graphs));
          if (errors[g].empty()) {
            CHECK(n.replays >= 3);
            CHECK(n.op_by_op + n.replays == int64_t(losses[g].size()) + skipped[g]);
            CHECK(n.invalidated >= 1);
            CHECK((n.evicted > 0) == (c.max_graphs < 16));
          }
        } else {
          CHECK(trainer.graphs_off_reason().find("could not be captured") != std::string::npos);
        }
      }
    }
    CHECK(errors[0] == errors[1]);
    CHECK(skipped[0] == skipped[1]);
    REQUIRE(losses[0].size() == losses[1].size());
    // The clustered types' products span all S keys in a graph (the lengths are on the device
    // only) and each run of equal lengths without: sums with extra zero terms, the same bits
    // where the products sum in order (the emulator), not necessarily on a GPU's cuBLAS.
    if (c.type != AttentionType::full && !cuda::exact_numerics()) {
      for (size_t i = 0; i < losses[0].size(); ++i) {
        INFO("step " << i + 1 << ": graphs " << losses[0][i] << ", none " << losses[1][i]);
        CHECK(relative_difference(losses[0][i], losses[1][i]) <= 1e-3);
      }
      continue;
    }
    for (size_t i = 0; i < losses[0].size(); ++i) {
      INFO("step " << i + 1 << ": graphs " << losses[0][i] << ", none " << losses[1][i]);
      CHECK(std::memcmp(&losses[0][i], &losses[1][i], sizeof(float)) == 0);
    }
    CHECK(std::memcmp(&dev_loss[0], &dev_loss[1], sizeof(double)) == 0);
    REQUIRE(params[0].size() == params[1].size());
    for (size_t i = 0; i < params[0].size(); ++i) {
      INFO(params[0][i].first);
      CHECK(params[0][i].second == params[1][i].second);
    }
  }
}
