// The copy-task app's library (apps/copy_task/): exact resume (N steps + checkpoint + M steps
// gives the losses and weights of N + M steps, bit for bit, with the warm-up and the plateau
// schedules), metrics.csv continued without duplicates, resume refused for another model,
// flag checks, config round trips, and the heatmap writer.
//
// The app executable itself (a smoke run whose loss must fall, bad flags, resume mismatch on
// the command line) is run by test_app_cli_copy.cpp.
#include <CLI/CLI.hpp>
#include <doctest/doctest.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "apps/common/flag_table.h"
#include "apps/common/metrics_file.h"
#include "apps/common/plot.h"
#include "apps/common/run_folder.h"
#include "apps/common/stop_signal.h"
#include "apps/copy_task/options.h"
#include "apps/copy_task/train.h"
#include "check.h"
#include "core/cuda/cuda.h"
#include "core/error.h"
#include "layers/checkpoint.h"

using namespace clustr;
using namespace clustr::copy;
using clustr::test::TempDir;

namespace {

// A tiny model and task: 1 layer, 2 heads x 8, L = 5 (N = 12), batch 4.
RunOptions tiny(AttentionType type, const std::string& out) {
  RunOptions o = preset_options("cpu");
  o.model.layers = 1;
  o.model.heads = 2;
  o.model.head_dim = 8;
  o.model.feedforward = 16;
  o.model.dropout = 0.1f;  // draws from the training stream, so resume must restore it
  o.model.attention.type = type;
  o.model.attention.clusters = 3;
  o.model.attention.topk = 4;  // fewer than the 12 keys: the top-k sets matter
  o.task = CopyTaskConfig{5, 4, 0.2f};
  o.train.batch = 4;
  o.train.steps = 10;
  o.train.lr = 1e-2f;
  o.train.warmup = 3;
  o.train.target_accuracy = 0.0;
  o.output.out = out;
  o.output.log_interval = 2;
  o.output.eval_interval = 2;
  o.output.eval_batches = 2;
  o.output.final_eval_batches = 2;
  o.output.checkpoint_interval = 0;
  o.output.write_plots = false;
  return o;
}

std::vector<int64_t> csv_steps(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<int64_t> steps;
  std::getline(in, line);  // header
  while (std::getline(in, line)) steps.push_back(std::stoll(line.substr(0, line.find(','))));
  return steps;
}

void check_resume_is_exact(RunOptions o, const TempDir& dir) {
  o.output.out = dir.file("whole");
  Trainer whole(o, nullptr);
  const RunResult all = whole.run();
  REQUIRE(all.losses.size() == 10);

  RunOptions first = o;
  first.output.out = dir.file("split");
  first.train.steps = 6;
  Trainer a(first, nullptr);
  const RunResult r1 = a.run();
  REQUIRE(r1.losses.size() == 6);

  RunOptions second = o;
  second.output.out = dir.file("split");
  Trainer b(second, nullptr);
  b.resume(dir.file("split"));
  CHECK(b.step() == 6);
  const RunResult r2 = b.run();
  REQUIRE(r2.losses.size() == 4);

  for (size_t i = 0; i < 10; ++i) {
    const float split = i < 6 ? r1.losses[i] : r2.losses[i - 6];
    CAPTURE(i);
    CHECK(std::memcmp(&split, &all.losses[i], sizeof(float)) == 0);  // bit for bit
  }
  const auto pw = whole.model().named_parameters(), pb = b.model().named_parameters();
  REQUIRE(pw.size() == pb.size());
  for (size_t i = 0; i < pw.size(); ++i) {
    CAPTURE(pw[i].first);
    const std::vector<float> x = pw[i].second.data().to_vector(),
                             y = pb[i].second.data().to_vector();
    REQUIRE(x.size() == y.size());
    CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
  }
  CHECK(whole.optimizer().lr() == b.optimizer().lr());
  // The final held-out evaluation sees the same model and data.
  CHECK(all.final_eval.loss == r2.final_eval.loss);
  // metrics.csv continues: the rows of steps 2..6, then 8, 10, each once.
  CHECK(csv_steps(dir.file("split") + "/metrics.csv") == std::vector<int64_t>{2, 4, 6, 8, 10});
}

}  // namespace

TEST_CASE("copy task: 6 steps + resume + 4 steps == 10 steps, improved-clustered, warm-up") {
  TempDir dir;
  check_resume_is_exact(tiny(AttentionType::improved_clustered, ""), dir);
}

TEST_CASE("copy task: 6 steps + resume + 4 steps == 10 steps, full attention, plateau") {
  TempDir dir;
  RunOptions o = tiny(AttentionType::full, "");
  o.train.optimizer = "radam";
  o.train.lr_schedule = "plateau";
  o.train.warmup = 2;
  o.train.plateau_patience = 0;   // lower the lr at most evaluations, so its state matters
  o.train.plateau_threshold = 0.5;
  o.train.plateau_cooldown = 1;
  check_resume_is_exact(o, dir);
}

TEST_CASE("copy task: the plateau schedule lowered the lr and resume keeps it") {
  TempDir dir;
  RunOptions o = tiny(AttentionType::full, dir.file("run"));
  o.train.lr_schedule = "plateau";
  o.train.warmup = 0;
  o.train.plateau_patience = 0;
  o.train.plateau_threshold = 0.9;  // nothing counts as an improvement after the first
  o.train.steps = 6;
  Trainer a(o, nullptr);
  a.run();
  CHECK(a.optimizer().lr() < o.train.lr);
  o.train.steps = 8;
  Trainer b(o, nullptr);
  b.resume(dir.file("run"));
  CHECK(b.optimizer().lr() == a.optimizer().lr());
}

TEST_CASE("copy task: resuming with another model or task is refused, naming the flags") {
  TempDir dir;
  RunOptions o = tiny(AttentionType::improved_clustered, dir.file("run"));
  o.train.steps = 2;
  Trainer(o, nullptr).run();

  RunOptions other = o;
  other.model.layers = 2;
  other.task.length = 6;
  Trainer t(other, nullptr);
  CHECK_ERROR(t.resume(dir.file("run")), "--resume", "trained with other settings",
              "--layers: checkpoint 1, now 2", "--length: checkpoint 5, now 6");
  CHECK(t.step() == 0);  // nothing was loaded

  RunOptions attention = o;
  attention.model.attention.type = AttentionType::full;
  Trainer u(attention, nullptr);
  CHECK_ERROR(u.resume(dir.file("run")), "--attention: checkpoint improved-clustered, now full");

  // Training settings may change: the run continues (with a note in the log).
  RunOptions lr = o;
  lr.train.lr = 5e-3f;
  lr.train.steps = 3;
  Trainer v(lr, nullptr);
  v.resume(dir.file("run"));
  CHECK(v.step() == 2);
}

TEST_CASE("copy task: a missing checkpoint is a clear error") {
  TempDir dir;
  CHECK_ERROR(resolve_checkpoint(dir.file("nothing"), "--resume"), "--resume",
              "no such checkpoint file or folder", "nothing");
  CHECK_ERROR(resolve_checkpoint(dir.file(""), "--resume"), "holds no checkpoint.safetensors");
}

TEST_CASE("copy task: bad option values are refused with the flag's name") {
  auto error = [](auto change) {
    RunOptions o = preset_options("cpu");
    change(o);
    return clustr::test::error_of([&] { validate(o); });
  };
  CHECK(error([](RunOptions&) {}).empty());
  CHECK(error([](RunOptions& o) { o.train.steps = -5; }) == "--steps must be >= 1, got -5");
  CHECK(error([](RunOptions& o) { o.model.attention.clusters = 0; }) ==
        "--clusters must be >= 1, got 0");
  CHECK(error([](RunOptions& o) { o.task.mask_ratio = 0.7f; }).find("--mask-ratio must be in "
                                                                   "(0, 0.5]") == 0);
  CHECK(error([](RunOptions& o) { o.train.optimizer = "lamb"; }).find("--optimizer") == 0);
  CHECK(error([](RunOptions& o) { o.train.lr_schedule = "cosine"; }).find("--lr-schedule") == 0);
  CHECK(error([](RunOptions& o) { o.device = "tpu"; }).find("--device") == 0);
  CHECK_ERROR(parse_attention_type("linear"), "unknown attention type 'linear'",
              "full, clustered, improved-clustered");
  CHECK_ERROR(preset_options("gpu"), "unknown --preset 'gpu'");
}

TEST_CASE("copy task: --device cuda is refused with the reason when no GPU is present") {
  RunOptions o = tiny(AttentionType::full, "unused");
  o.device = "cuda";
  if (cuda::available())
    CHECK(Trainer(o, nullptr).device() == Device::cuda);  // the cross-device test: test_cuda
  else
    CHECK_ERROR(Trainer(o, nullptr), "--device cuda", cuda::unavailable_reason().c_str(),
                "use --device cpu");
}

// The weights a run ends with, by name.
std::map<std::string, std::vector<float>> weights_of(Trainer& t) {
  std::map<std::string, std::vector<float>> w;
  for (const auto& [name, p] : t.model().named_parameters()) w[name] = p.data().to_vector();
  return w;
}

TEST_CASE("copy task: with --cuda-graphs on and off the losses, skipped steps and weights are "
          "the same bits; a step that cannot be captured trains without graphs") {
  if (!cuda::available()) return;
  TempDir dir;
  struct Case {
    const char* what;
    AttentionType type;
    int64_t head_dim;
    float lr;
    bool graphs;    // whether the graph is expected to be used
    float dropout;  // the model's and the attention's
  };
  // Head width 32: full attention on the tensor cores (nothing read back); 8: the blocked
  // kernels, which read the lengths on the host, so the capture is refused. lr 1e3 sends the
  // weights to infinity: steps are skipped until the run stops. The clustered types draw their
  // hashing on the host for each replay (DrawPlan); lsh draws in a way a graph cannot repeat.
  // Dropout's stream offsets are device draws too: each replay's are drawn on the host and
  // read by the masks' kernels, forward and backward.
  for (const Case& c :
       {Case{"plain", AttentionType::full, 32, 1e-2f, true, 0.0f},
        Case{"skipping", AttentionType::full, 32, 1e3f, true, 0.0f},
        Case{"host read", AttentionType::full, 8, 1e-2f, false, 0.0f},
        Case{"improved-clustered", AttentionType::improved_clustered, 32, 1e-2f, true, 0.0f},
        Case{"clustered", AttentionType::clustered, 32, 1e-2f, true, 0.0f},
        Case{"lsh", AttentionType::lsh, 32, 1e-2f, false, 0.0f},
        Case{"full, dropout", AttentionType::full, 32, 1e-2f, true, 0.1f},
        Case{"improved-clustered, dropout", AttentionType::improved_clustered, 32, 1e-2f, true,
             0.1f},
        Case{"clustered, dropout", AttentionType::clustered, 32, 1e-2f, true, 0.1f}}) {
    CAPTURE(c.what);
    std::vector<RunResult> results;
    std::vector<std::map<std::string, std::vector<float>>> weights;
    std::vector<std::string> errors, skips;
    for (const char* graphs : {"on", "off"}) {
      RunOptions o = tiny(c.type, dir.file(std::string(c.what) + graphs));
      o.device = "cuda";
      o.cuda_graphs = graphs;
      o.model.dropout = c.dropout;
      o.model.attention.dropout = c.dropout;
      o.model.head_dim = c.head_dim;
      o.train.lr = c.lr;
      o.train.steps = 9;
      o.train.max_skipped_steps = 3;
      o.output.log_interval = 4;  // windows of 2, 2, ... steps (evaluations every 2)
      o.output.eval_interval = 2;
      char* log_text = nullptr;
      size_t log_size = 0;
      std::FILE* log = open_memstream(&log_text, &log_size);
      Trainer t(o, log);
      CHECK(t.graphs_off_reason().empty() == (std::string(graphs) == "on"));
      try {
        results.push_back(t.run());
        errors.push_back("");
      } catch (const Error& e) {
        results.push_back({});
        errors.push_back(e.what());
      }
      std::fclose(log);
      // The log's lines about skipped steps.
      std::string skipped;
      for (size_t at = 0, end; at < log_size; at = end + 1) {
        end = std::string(log_text, log_size).find('\n', at);
        if (end == std::string::npos) end = log_size;
        const std::string line(log_text + at, log_text + end);
        if (line.find("skipped") != std::string::npos) skipped += line + "\n";
      }
      std::free(log_text);
      skips.push_back(skipped);
      weights.push_back(weights_of(t));
      if (std::string(graphs) == "on") CHECK(t.graphs_off_reason().empty() == c.graphs);
    }
    CHECK(errors[0] == errors[1]);
    CHECK(skips[0] == skips[1]);
    CHECK(results[0].losses == results[1].losses);
    CHECK(results[0].skipped_steps == results[1].skipped_steps);
    CHECK(weights[0] == weights[1]);
    if (std::string(c.what) == "skipping") {
      CHECK(errors[0].find("in a row") != std::string::npos);
      CHECK(skips[0].find("step skipped (3 in a row") != std::string::npos);
    }
    if (std::string(c.what) == "plain") CHECK(results[0].losses.size() == 9);
  }
}

TEST_CASE("copy task: a run replaying graphs resumes exactly (the batches it drew ahead are "
          "not saved as consumed)") {
  if (!cuda::available()) return;
  TempDir dir;
  auto options = [&](const std::string& out, int64_t steps) {
    RunOptions o = tiny(AttentionType::improved_clustered, dir.file(out));
    o.device = "cuda";
    o.model.dropout = 0.1f;  // its offsets are drawn ahead with the batches too
    o.model.attention.dropout = 0.1f;
    o.model.head_dim = 32;
    o.train.steps = steps;
    o.output.log_interval = 3;  // windows of 2 and 1 steps: the next is drawn ahead
    o.output.eval_interval = 2;
    return o;
  };
  Trainer whole(options("whole", 9), nullptr);
  const RunResult all = whole.run();
  Trainer first(options("part", 5), nullptr);
  const RunResult a = first.run();
  Trainer second(options("part", 9), nullptr);
  second.resume(dir.file("part"));
  const RunResult b = second.run();
  std::vector<float> joined = a.losses;
  joined.insert(joined.end(), b.losses.begin(), b.losses.end());
  CHECK(joined == all.losses);
  CHECK(weights_of(second) == weights_of(whole));
}

TEST_CASE("copy task: the config map round-trips the model and task") {
  RunOptions o = preset_options("paper");
  o.task.mask_ratio = 0.3f;
  o.model.dropout = 0.1f;
  o.model.attention.type = AttentionType::clustered;
  o.train.seed = 12345678901234ull;
  RunOptions back = preset_options("cpu");
  apply_checkpoint_config(to_config(o), back);
  CHECK(back.model.layers == 4);
  CHECK(back.model.heads == 6);
  CHECK(back.model.head_dim == 32);
  CHECK(back.model.feedforward == 768);
  CHECK(back.model.dropout == o.model.dropout);
  CHECK(back.model.attention.type == AttentionType::clustered);
  CHECK(back.task.mask_ratio == o.task.mask_ratio);  // exact, although 0.3 is not a float
  CHECK(back.train.seed == o.train.seed);
  CHECK(to_config(o).at("mask-ratio") == "0.3");
  std::map<std::string, std::string> broken = to_config(o);
  broken.erase("heads");
  CHECK_ERROR(apply_checkpoint_config(broken, back), "lacks 'heads'");
  broken = to_config(o);
  broken["layers"] = "four";
  CHECK_ERROR(apply_checkpoint_config(broken, back), "'layers' is \"four\", not an integer");
}

TEST_CASE("copy task: the paper preset is supp. C.2") {
  const RunOptions p = preset_options("paper");
  CHECK(p.model.layers == 4);
  CHECK(p.model.heads == 6);
  CHECK(p.model.head_dim == 32);
  CHECK(p.model.feedforward == 768);
  CHECK(p.train.optimizer == "radam");
  CHECK(p.train.lr == 2e-4f);
  CHECK(p.train.batch == 32);
  CHECK(p.train.steps == 5000);
  CHECK(p.model.attention.type == AttentionType::improved_clustered);
}

TEST_CASE("heatmap: writes a PNG, grey for missing cells; refuses mismatched sizes") {
  TempDir dir;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  plot::HeatmapOptions o;
  o.title = "test";
  plot::write_heatmap(dir.file("h.png"), {"a", "b"}, {"x", "y", "z"},
                      {{0.1, 0.5, 1.0}, {nan, 0.99, -3.0}}, o);
  std::ifstream f(dir.file("h.png"), std::ios::binary);
  char magic[8] = {};
  f.read(magic, 8);
  CHECK(std::string(magic + 1, 3) == "PNG");
  CHECK(dir.list() == std::vector<std::string>{"h.png"});  // no temporary left behind
  CHECK_ERROR(plot::write_heatmap(dir.file("bad.png"), {"a"}, {"x", "y"}, {{0.1}}, o),
              "row 0 has 1 values for 2 columns");
  CHECK_ERROR(plot::write_heatmap(dir.file("bad.png"), {"a", "b"}, {"x"}, {{0.1}}, o),
              "2 row labels but 1 rows");
  o.lo = 1, o.hi = 1;
  CHECK_ERROR(plot::write_heatmap(dir.file("bad.png"), {"a"}, {"x"}, {{0.1}}, o), "lo < hi");
}

TEST_CASE("copy task: bf16 runs resume exactly, track the f32 run and store their precision") {
  TempDir dir;
  RunOptions o = tiny(AttentionType::full, "");
  o.model.precision = Precision::bf16;
  check_resume_is_exact(o, dir);  // bf16 steps are as reproducible as f32 ones

  // The same start (weights, batches) in both precisions: the losses differ only by the
  // products' rounding, which moves each product by at most 2u = 2^-7 of its size and averages
  // out over the sums behind a loss. The first step's (same weights) within u/2 = 0.2%
  // (measured 0.003%), the later ones, which carry the earlier steps' rounding in the weights,
  // within 1% (measured at most 0.07%).
  RunOptions b = tiny(AttentionType::full, dir.file("bf16"));
  b.model.precision = Precision::bf16;
  RunOptions f = b;
  f.model.precision = Precision::fp32;
  f.output.out = dir.file("fp32");
  const RunResult rb = Trainer(b, nullptr).run(), rf = Trainer(f, nullptr).run();
  REQUIRE(rb.losses.size() == rf.losses.size());
  CHECK(rb.losses != rf.losses);  // the bf16 products did run
  for (size_t i = 0; i < rb.losses.size(); ++i) {
    INFO("step ", i, ": bf16 ", rb.losses[i], ", f32 ", rf.losses[i]);
    CHECK(std::fabs(rb.losses[i] - rf.losses[i]) <= (i == 0 ? 0.002 : 0.01) * rf.losses[i]);
  }

  // The checkpoint names its precision and keeps f32 weights: it evaluates in fp32 too, to
  // within 0.2% of its bf16 loss (measured 0.02%).
  const auto config = read_checkpoint_config(dir.file("bf16/checkpoint.safetensors"));
  CHECK(config.at("precision") == "bf16");
  RunOptions e = tiny(AttentionType::full, dir.file("eval"));
  apply_checkpoint_config(config, e);
  CHECK(e.model.precision == Precision::bf16);
  e.model.precision = Precision::fp32;
  Trainer t(e, nullptr);
  load_checkpoint(dir.file("bf16/checkpoint.safetensors"), t.model());
  const Evaluation in_f32 = t.evaluate(t.final_batches(e.output.final_eval_batches));
  INFO("bf16 ", rb.final_eval.loss, ", f32 ", in_f32.loss);
  CHECK(std::fabs(in_f32.loss - rb.final_eval.loss) <= 0.002 * rb.final_eval.loss);
  // A checkpoint from before mixed precision (no "precision" key) was trained in fp32.
  auto old = config;
  old.erase("precision");
  apply_checkpoint_config(old, e);
  CHECK(e.model.precision == Precision::fp32);
}

// ---- run folders, signals and non-finite steps (apps/common/run_folder.h, stop_signal.h,
// training.h) ------------------------------------------------------------------------------

TEST_CASE("run folder: a fresh run refuses files, --overwrite removes the app's, one live run") {
  TempDir dir;
  const std::string out = dir.file("run");
  {
    RunFolder a(out, OutMode::fresh, {"metrics.csv"}, nullptr);
    // A second run in the same folder while the first holds it (flock conflicts between two
    // open file descriptions, in one process as in two).
    const std::string holder = "is in use by another run (process " +
                               std::to_string(::getpid()) + ")";
    CHECK_ERROR(RunFolder(out, OutMode::resume, {}, nullptr), "--out", out.c_str(),
                holder.c_str());
    std::ofstream(a.file("metrics.csv")) << "x";
    std::ofstream(a.file("notes.txt")) << "mine";
  }
  CHECK_ERROR(RunFolder(out, OutMode::fresh, {"metrics.csv"}, nullptr), "--out", out.c_str(),
              "already holds files (metrics.csv, notes.txt)", "--resume", "--overwrite");
  { RunFolder resumed(out, OutMode::resume, {"metrics.csv"}, nullptr); }
  CHECK(std::filesystem::exists(out + "/metrics.csv"));
  {
    RunFolder replaced(out, OutMode::overwrite, {"metrics.csv", "checkpoint.safetensors"},
                       nullptr);
    CHECK_FALSE(std::filesystem::exists(out + "/metrics.csv"));  // the app's file: removed
    CHECK(std::filesystem::exists(out + "/notes.txt"));          // the user's: kept
  }
  CHECK_ERROR(out_mode(true, true), "--overwrite", "--resume", "give one of them");
  std::ofstream(dir.file("plain")) << "x";
  CHECK_ERROR(RunFolder(dir.file("plain"), OutMode::fresh, {}, nullptr), "exists and is not a "
              "folder");
}

TEST_CASE("run folder: temporaries of a killed run are removed; free default folders") {
  TempDir dir;
  const std::string out = dir.file("run");
  std::filesystem::create_directories(out);
  std::ofstream(out + "/checkpoint.safetensors.tmp.4242.0") << "half";
  std::ofstream(out + "/metrics.csv.tmp.4242") << "half";
  std::ofstream(out + "/a.tmp.notanumber") << "kept";
  {
    RunFolder f(out, OutMode::resume, {}, nullptr);
    CHECK(folder_entries(out) == std::vector<std::string>{"a.tmp.notanumber"});
  }
  CHECK(first_free_folder(dir.file("fresh")) == dir.file("fresh"));
  CHECK(first_free_folder(out) == out + "-2");
  std::filesystem::create_directories(out + "-2");  // empty: free
  CHECK(first_free_folder(out) == out + "-2");
  std::ofstream(out + "-2/x") << "x";
  CHECK(first_free_folder(out) == out + "-3");
}

// A write that fails names the file asked for and the temporary written first; an output file
// is checked before the work that leads to it.
TEST_CASE("run folder: a failed atomic write, and the checks of an output file") {
  TempDir dir;
  const std::string missing = dir.file("no_folder/lm.json"), sub = dir.file("sub");
  const std::string saved = dir.file("lm.json");
  const std::string through = "cannot write " + missing + " (through " + missing + ".tmp.";
  CHECK_ERROR(write_lines_atomically(missing, {"x"}), through.c_str());
  const std::string no_folder =
      "--out " + missing + ": the folder " + dir.file("no_folder") + " does not exist";
  CHECK_ERROR(check_output_file("--out", missing, false, true), no_folder.c_str());
  std::filesystem::create_directories(sub);
  const std::string folder = "--png " + sub + ": is a folder; expected the file to write";
  CHECK_ERROR(check_output_file("--png", sub, true, true), folder.c_str());
  std::ofstream(saved) << "saved";
  const std::string exists = saved + " exists: pass --overwrite to replace it";
  CHECK_ERROR(check_output_file("--out", saved, false, true), exists.c_str());
  CHECK_NOTHROW(check_output_file("--out", saved, true, true));
  CHECK_NOTHROW(check_output_file("--out", dir.file("new/lm.json"), false, false));  // made later
}

TEST_CASE("copy task: a new run refuses the folder of an earlier one") {
  TempDir dir;
  RunOptions o = tiny(AttentionType::full, dir.file("run"));
  o.train.steps = 2;
  Trainer(o, nullptr).run();
  CHECK_ERROR(Trainer(o, nullptr).run(), "already holds files", "checkpoint.safetensors",
              "metrics.csv");
  o.output.overwrite = true;
  const RunResult r = Trainer(o, nullptr).run();
  CHECK(r.end_step == 2);
}

namespace {

// A log stream that raises `sig` in this thread when a line it is given contains `text` (a
// signal at a known step: the training loop reads it after that step).
struct SignalAt {
  std::string text;
  int sig;
  bool sent = false;
};
ssize_t signal_at_write(void* cookie, const char* buf, size_t size) {
  auto* s = static_cast<SignalAt*>(cookie);
  if (!s->sent && std::string(buf, size).find(s->text) != std::string::npos) {
    s->sent = true;
    std::raise(s->sig);
  }
  return static_cast<ssize_t>(size);
}
std::FILE* signal_at_log(SignalAt& s) {
  cookie_io_functions_t io{nullptr, signal_at_write, nullptr, nullptr};
  std::FILE* f = fopencookie(&s, "w", io);
  REQUIRE(f != nullptr);
  std::setvbuf(f, nullptr, _IOLBF, 0);
  return f;
}

}  // namespace

TEST_CASE("copy task: SIGINT stops after the step with a checkpoint that resumes bit for bit") {
  TempDir dir;
  RunOptions o = tiny(AttentionType::improved_clustered, dir.file("whole"));
  o.output.log_interval = 1;
  Trainer whole(o, nullptr);
  const RunResult all = whole.run();
  REQUIRE(all.losses.size() == 10);

  for (int sig : {SIGINT, SIGTERM}) {
    CAPTURE(sig);
    const std::string out = dir.file(sig == SIGINT ? "int" : "term");
    RunOptions cut = o;
    cut.output.out = out;
    SignalAt at{"step 4/10 ", sig};
    std::FILE* log = signal_at_log(at);
    Trainer a(cut, log);
    const RunResult r1 = a.run();
    std::fclose(log);
    CHECK(r1.interrupted_by == sig);
    CHECK(r1.end_step == 4);
    CHECK(r1.stop_reason == std::string("interrupted by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM"));
    REQUIRE(std::filesystem::exists(out + "/checkpoint.safetensors"));
    // The handlers are gone after run(): the test process is not stopped by them.
    CHECK(StopOnSignal::pending() == sig);

    Trainer b(cut, nullptr);
    b.resume(out);
    CHECK(b.step() == 4);
    const RunResult r2 = b.run();
    CHECK(r2.interrupted_by == 0);
    REQUIRE(r2.losses.size() == 6);
    for (size_t i = 0; i < 10; ++i) {
      const float split = i < 4 ? r1.losses[i] : r2.losses[i - 4];
      CAPTURE(i);
      CHECK(std::memcmp(&split, &all.losses[i], sizeof(float)) == 0);
    }
    const auto pw = whole.model().named_parameters(), pb = b.model().named_parameters();
    for (size_t i = 0; i < pw.size(); ++i) {
      CAPTURE(pw[i].first);
      CHECK(pw[i].second.data().to_vector() == pb[i].second.data().to_vector());
    }
  }
}

TEST_CASE("copy task: non-finite steps are skipped, then stop the run; no NaN checkpoint") {
  TempDir dir;
  RunOptions o = tiny(AttentionType::full, dir.file("run"));
  o.train.steps = 3;
  Trainer(o, nullptr).run();
  const std::string file = dir.file("run/checkpoint.safetensors");
  std::ifstream in(file, std::ios::binary);
  const std::string before((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

  // lr 1e30 without clipping: the first step's update makes the weights overflow, every later
  // loss is NaN; the run resumed from step 3 stops after 4 skipped steps.
  o.train.steps = 30;
  o.train.lr = 1e30f;
  o.train.warmup = 0;
  o.train.clip = 0.0f;
  o.train.max_skipped_steps = 4;
  Trainer t(o, nullptr);
  t.resume(dir.file("run"));
  const std::string kept = "the checkpoint " + file + " is left as it was";
  CHECK_ERROR(t.run(), "training stopped: 4 steps in a row had a non-finite loss",
              "step 5: non-finite loss", kept.c_str(), "--max-skipped-steps");
  std::ifstream again(file, std::ios::binary);
  const std::string after((std::istreambuf_iterator<char>(again)),
                          std::istreambuf_iterator<char>());
  CHECK(after == before);
  CHECK(t.step() == 4);
  // A weight that is not finite keeps any checkpoint from being written.
  Tensor w = t.model().named_parameters().front().second.data();  // shares the storage
  std::vector<float> v = w.to_vector();
  v[1] = std::numeric_limits<float>::infinity();
  w.copy_from(Tensor::from_vector(v, w.shape()));
  CHECK_ERROR(t.save(file), "not writing the checkpoint", "holds a non-finite value (inf at "
              "element 1)");
  std::ifstream third(file, std::ios::binary);
  CHECK(std::string((std::istreambuf_iterator<char>(third)), std::istreambuf_iterator<char>()) ==
        before);
}

TEST_CASE("copy task: a metrics row cut short by a kill is dropped on resume, with a note") {
  TempDir dir;
  RunOptions o = tiny(AttentionType::full, dir.file("run"));
  o.train.steps = 6;
  Trainer(o, nullptr).run();
  {
    std::ofstream csv(dir.file("run/metrics.csv"), std::ios::app);
    csv << "8,0.51";  // the next row, cut (no newline)
  }
  o.train.steps = 10;
  std::FILE* log = std::tmpfile();
  REQUIRE(log != nullptr);
  Trainer t(o, log);
  t.resume(dir.file("run"));
  t.run();
  std::rewind(log);
  std::string text;
  for (int c; (c = std::fgetc(log)) != EOF;) text += char(c);
  std::fclose(log);
  CHECK(text.find("dropped the last line of " + dir.file("run/metrics.csv") +
                  ", which was cut short: \"8,0.51\"") != std::string::npos);
  CHECK(csv_steps(dir.file("run/metrics.csv")) == std::vector<int64_t>{2, 4, 6, 8, 10});
  // A malformed row that is not the last is still an error (the file is not ours to guess).
  std::ofstream(dir.file("run/metrics.csv"), std::ios::app) << "x,1\n12,1,1,1,1,1,1,1\n";
  o.train.steps = 14;
  Trainer u(o, nullptr);
  u.resume(dir.file("run"));
  CHECK_ERROR(u.run(), "metrics.csv:7: expected 8 comma-separated cells, got 2");
}

TEST_CASE("flag table: one declaration gives the flags, checks, config and resume rules") {
  int layers = 2;
  float lr = 1e-3f;
  bool tf32 = false;
  std::string out = "runs/x";
  uint64_t seed = 1;
  FlagTable t;
  t.add("layers", layers, "layers").at_least(1).resume(Resume::locked);
  t.add("lr", lr, "lr").within(0, 1).resume(Resume::noted);
  t.add("tf32", tf32, "tf32").when_absent("false");
  t.add("out", out, "out").not_stored();
  t.add("seed", seed, "seed").resume(Resume::noted);
  CHECK_ERROR(t.add("lr", lr, "again"), "--lr is declared twice");
  // The config: stored settings in declaration order, floats exact and short.
  lr = 0.2f;
  CHECK(t.entries() == std::vector<std::pair<std::string, std::string>>{
                           {"layers", "2"}, {"lr", "0.2"}, {"tf32", "false"}, {"seed", "1"}});
  CHECK(t.keys(Resume::locked) == std::vector<std::string>{"layers"});
  CHECK(t.keys(Resume::noted) == std::vector<std::string>{"lr", "seed"});
  // Checks name the flag and the value.
  layers = 0;
  CHECK_ERROR(t.validate(), "--layers must be >= 1, got 0");
  layers = 3;
  lr = 2.0f;
  CHECK_ERROR(t.validate(), "--lr must be in [0, 1], got 2");
  lr = 0.5f;
  t.validate();
  // From a checkpoint's config: parsed, missing keys named, a when_absent value for old ones.
  t.apply({{"layers", "7"}, {"lr", "0.25"}, {"seed", "18446744073709551615"}},
          {"layers", "lr", "tf32", "seed"});
  CHECK(layers == 7);
  CHECK(lr == 0.25f);
  CHECK_FALSE(tf32);
  CHECK(seed == 18446744073709551615ull);
  CHECK_ERROR(t.apply({}, {"layers"}), "checkpoint config lacks 'layers'");
  CHECK_ERROR(t.apply({{"layers", "four"}}, {"layers"}), "'layers' is \"four\", not an integer");
  CHECK_ERROR(t.apply({{"seed", "-1"}}, {"seed"}), "'seed' is \"-1\", not an integer");
  CHECK_ERROR(t.apply({{"tf32", "yes"}}, {"tf32"}), "not true or false");
  // A preset's values, as on the command line.
  t.set("layers=4 out=runs/y");
  CHECK_ERROR(t.set("layers"), "'layers' is not name=value");
  CHECK_ERROR(t.set("depth=3"), "no setting 'depth'");
  CHECK(layers == 4);
  CHECK(out == "runs/y");
  // The command line.
  CLI::App app;
  t.add_to(app, {"seed"});
  const char* argv[] = {"x", "--layers", "5", "--tf32", "--out", "o"};
  app.parse(6, argv);
  CHECK(layers == 5);
  CHECK(tf32);
  CHECK(out == "o");
  CHECK(app.get_option_no_throw("--seed") == nullptr);
}

TEST_CASE("error text: a failed allocation names the flags that size the run's memory") {
  note_memory_flags("--batch 32 and --length 63");
  const std::string host = error_text(Error("Tensor: out of host memory allocating 64 bytes"));
  CHECK(host == "Tensor: out of host memory allocating 64 bytes\n  this run's memory grows with "
                "--batch 32 and --length 63: lower them, or give the process more memory");
  CHECK(error_text(Error("cuda::alloc: out of device memory allocating 8 bytes")).find(
            "grows with --batch 32") != std::string::npos);
  CHECK(error_text(std::bad_alloc()).find("out of host memory (std::bad_alloc)\n  this run's "
                                          "memory grows with --batch 32") == 0);
  CHECK(error_text(Error("--layers must be >= 1, got 0")) == "--layers must be >= 1, got 0");
  note_memory_flags("");
}
