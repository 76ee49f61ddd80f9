// The paper's Figure 5 on the masked copy task: held-out accuracy of clustered and
// improved-clustered attention for each sequence length x number of clusters, with full
// attention at each length as the reference, and Reformer's lsh-X rows (--attentions full
// lsh-1 lsh-4 lsh-8 lsh-16: X hashing rounds, one run per length). Every cell is one training
// run (apps/copy_task/).
//
//   copy_sweep                   the CPU grid: L in {31, 63} (N = 64, 128), C in {15, 30, 60},
//                                the copy_task default model (2 layers, 4 x 32, ff 256, Adam
//                                1e-3 with 100 warm-up steps), 1200 steps per run: 14 runs,
//                                about 20-25 minutes on two quiet cores
//   copy_sweep --preset paper    the paper's grid: L in {31, 63, 127, 255}, C in
//                                {15, 30, 60, 100}, 4 layers, 6 x 32, ff 768, R-Adam lr 2e-4,
//                                batch 32, 5000 steps
//   copy_sweep --lengths 7 --clusters 3 --steps 20      a quick check
//
// Writes into --out: sweep.csv (one row per run: attention, length, N, clusters, steps,
// held-out accuracy and loss, seconds), accuracy.png (the heatmap: rows attention x clusters,
// columns N) and one folder per run with its metrics.csv, plots and log. Both files are
// rewritten after every run, so an interrupted sweep keeps what it finished.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "apps/common/metrics_file.h"
#include "apps/common/plot.h"
#include "apps/common/device.h"
#include "apps/common/flags.h"
#include "apps/common/run_folder.h"
#include "apps/common/training.h"
#include "apps/common/stop_signal.h"
#include "apps/copy_task/metrics.h"
#include "apps/copy_task/options.h"
#include "apps/copy_task/train.h"
#include "core/error.h"

namespace {

using namespace clustr;
using namespace clustr::copy;
namespace fs = std::filesystem;

struct Grid {
  std::vector<int> lengths;
  std::vector<int> clusters;
  std::vector<std::string> attentions;
};

// The base run options and the grid of a sweep preset.
void sweep_preset(const std::string& name, RunOptions& o, Grid& g) {
  o = preset_options(name);
  g.attentions = {"full", "clustered", "improved-clustered"};
  o.train.target_accuracy = 0.0;  // every cell trains the same number of steps, as the paper
  o.train.time_limit = 0.0;
  o.output.out = "runs/copy_sweep";
  o.output.checkpoint_interval = 0;
  o.output.write_checkpoints = false;
  o.output.final_eval_batches = 16;
  if (name == "paper") {
    g.lengths = {31, 63, 127, 255};
    g.clusters = {15, 30, 60, 100};
    o.output.out = "runs/copy_sweep_paper";
    return;
  }
  g.lengths = {31, 63};
  g.clusters = {15, 30, 60};
  o.train.steps = 1200;
  o.output.eval_interval = 300;
}

struct Cell {
  std::string attention;         // a type name, or lsh-X
  int length = 0, clusters = 0;  // clusters 0: a type without clusters (full, lsh-X)
  RunResult result;
  bool done = false;
};

bool has_clusters(const std::string& attention) {
  return uses_clusters(parse_attention_name(attention).type);
}

// The cell's attention in its run options.
void set_attention(const Cell& c, RunOptions& o) {
  const NamedAttention a = parse_attention_name(c.attention);
  o.model.attention.type = a.type;
  if (a.rounds > 0) o.model.attention.rounds = a.rounds;
  if (c.clusters) o.model.attention.clusters = c.clusters;
}

std::string label_of(const Cell& c) {
  if (!has_clusters(c.attention)) return c.attention;
  return std::string(c.attention == "clustered" ? "clustered" : "i-clustered") + " C=" +
         std::to_string(c.clusters);
}

void write_csv(const std::string& path, const std::vector<Cell>& cells) {
  std::vector<std::string> lines{"attention,length,N,clusters,steps,heldout_accuracy,"
                                 "heldout_loss,train_seconds,total_seconds"};
  for (const Cell& c : cells) {
    if (!c.done) continue;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s,%d,%d,%s,%lld,%.6f,%.6f,%.1f,%.1f",
                    c.attention.c_str(), c.length, 2 * c.length + 2,
                    c.clusters ? std::to_string(c.clusters).c_str() : "",
                    static_cast<long long>(c.result.end_step), c.result.final_eval.accuracy,
                    c.result.final_eval.loss, c.result.train_seconds, c.result.total_seconds);
    lines.push_back(buf);
  }
  write_lines_atomically(path, lines);
}

void write_heatmap(const std::string& path, const std::vector<Cell>& cells, const Grid& g,
                   int64_t steps) {
  std::vector<std::string> rows, cols;
  for (int L : g.lengths) cols.push_back("N=" + std::to_string(2 * L + 2));
  for (const Cell& c : cells) {
    const std::string l = label_of(c);
    bool seen = false;
    for (const std::string& r : rows) seen = seen || r == l;
    if (!seen) rows.push_back(l);
  }
  std::vector<std::vector<double>> values(
      rows.size(), std::vector<double>(cols.size(), std::numeric_limits<double>::quiet_NaN()));
  for (const Cell& c : cells) {
    if (!c.done) continue;
    size_t r = 0, k = 0;
    while (rows[r] != label_of(c)) ++r;
    while (g.lengths[k] != c.length) ++k;
    values[r][k] = c.result.final_eval.accuracy;
  }
  plot::HeatmapOptions o;
  o.title = "masked copy task: held-out accuracy after " + std::to_string(steps) + " steps";
  o.x_label = "sequence length N";
  o.y_label = "attention";
  o.format = "%.3f";
  plot::write_heatmap(path, rows, cols, values, o);
}

}  // namespace

int main(int argc, char** argv) try {
  RunOptions base;
  Grid grid;
  sweep_preset(find_preset(argc, argv), base, grid);
  CLI::App app{"clustr masked copy task sweep (the paper's Figure 5): held-out accuracy per "
               "sequence length x clusters for clustered, improved-clustered and full attention"};
  add_flags(app, base, /*grid_axes=*/false);
  app.add_option("--lengths", grid.lengths, "symbols per copy L (N = 2L + 2)")
      ->capture_default_str();
  app.add_option("--clusters", grid.clusters, "cluster counts C")->capture_default_str();
  app.add_option("--attentions", grid.attentions,
                 "attention types, lsh-X for lsh with X hashing rounds (full and lsh-X run "
                 "once per length)")->capture_default_str();
  if (const int status = clustr::parse_or_exit(app, argc, argv); status >= 0) return status;
  check_integer_flags(app);
  note_memory_flags(detail::cat("--batch ", base.train.batch, ", --lengths, --layers ",
                                base.model.layers, ", --heads ", base.model.heads,
                                " x --head-dim ", base.model.head_dim, ", --feedforward ",
                                base.model.feedforward, " and --final-eval-batches ",
                                base.output.final_eval_batches));
  CLUSTR_CHECK(!grid.lengths.empty() && !grid.attentions.empty(),
               "copy_sweep: --lengths and --attentions must not be empty");

  std::vector<Cell> cells;
  for (const std::string& a : grid.attentions) {
    if (!has_clusters(a)) continue;  // (a clear error for a bad name before anything runs)
    CLUSTR_CHECK(!grid.clusters.empty(), "copy_sweep: --clusters must not be empty");
    for (int C : grid.clusters)
      for (int L : grid.lengths) cells.push_back({a, L, C, {}, false});
  }
  for (const std::string& a : grid.attentions)
    if (!has_clusters(a))
      for (int L : grid.lengths) cells.push_back({a, L, 0, {}, false});
  // Check the device and every cell's options before the first run.
  resolve_device(base.device);
  for (const Cell& c : cells) {
    RunOptions o = base;
    o.task.length = c.length;
    set_attention(c, o);
    validate(o);
  }

  if (app.count("--out") == 0 && !base.output.overwrite)
    base.output.out = first_free_folder(base.output.out);
  RunFolder sweep_folder(base.output.out, out_mode(false, base.output.overwrite),
                         {"sweep.csv", "accuracy.png"}, stdout);
  const std::string csv = (fs::path(base.output.out) / "sweep.csv").string();
  const std::string png = (fs::path(base.output.out) / "accuracy.png").string();
  std::printf("copy_sweep: %zu runs of %lld steps into %s\n", cells.size(),
              static_cast<long long>(base.train.steps), base.output.out.c_str());
  for (const auto& [key, value] : build_info(base.device))
    std::printf("  %-20s %s\n", key.c_str(), value.c_str());
  std::fflush(stdout);
  for (size_t i = 0; i < cells.size(); ++i) {
    Cell& c = cells[i];
    RunOptions o = base;
    o.task.length = c.length;
    set_attention(c, o);
    std::string name = c.attention + "-L" + std::to_string(c.length);
    if (c.clusters) name += "-C" + std::to_string(c.clusters);
    o.output.out = (fs::path(base.output.out) / name).string();
    std::vector<std::string> cell_files = Trainer::run_files();
    cell_files.push_back("train.log");
    RunFolder cell_folder(o.output.out, out_mode(false, base.output.overwrite), cell_files,
                          nullptr);
    const std::string log_path = (fs::path(o.output.out) / "train.log").string();
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> log(std::fopen(log_path.c_str(), "w"),
                                                        &std::fclose);
    CLUSTR_CHECK(log, "copy_sweep: cannot write ", log_path, ": ", std::strerror(errno));
    std::printf("[%zu/%zu] %-42s N=%-5d ", i + 1, cells.size(),
                o.model.attention.describe().c_str(), 2 * c.length + 2);
    std::fflush(stdout);
    Trainer trainer(o, log.get());
    trainer.print_config(log.get());
    c.result = trainer.run(&cell_folder);
    if (c.result.interrupted_by) {
      std::printf("interrupted by %s: the sweep stops (its finished runs are in %s)\n",
                  signal_name(c.result.interrupted_by), csv.c_str());
      return 128 + c.result.interrupted_by;
    }
    c.done = true;
    std::printf("held-out accuracy %.4f  loss %.4f  (%lld steps, %s)\n",
                c.result.final_eval.accuracy, c.result.final_eval.loss,
                static_cast<long long>(c.result.end_step),
                format_duration(c.result.total_seconds).c_str());
    std::fflush(stdout);
    write_csv(csv, cells);
    write_heatmap(png, cells, grid, base.train.steps);
  }
  std::printf("wrote %s and %s\n", csv.c_str(), png.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fflush(stdout);
  std::fprintf(stderr, "copy_sweep: error: %s\n", error_text(e).c_str());
  return 1;
}
