// The run's metrics: one row per log or evaluation step, kept in memory, appended to
// metrics.csv as they come and drawn as PNG line plots (loss and accuracy against the step).
//
// metrics.csv columns (an empty cell where a value was not measured at that step):
//   step, train_loss, train_acc, lr, ms_per_step, tokens_per_s, eval_loss, eval_acc
// train_* are means over the training batches since the previous log line; eval_* are over the
// fixed held-out batches.
#pragma once

#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

namespace clustr::copy {

struct MetricsRow {
  int64_t step = 0;
  // NaN where not measured.
  double train_loss, train_acc, lr, ms_per_step, tokens_per_s, eval_loss, eval_acc;
  MetricsRow();
};

class MetricsLog {
 public:
  // Starts a fresh metrics.csv at `path` (an existing one is replaced).
  void start(const std::string& path);
  // Keeps the rows of an existing metrics.csv up to `step` (a resumed run continues it; rows
  // after the checkpoint's step, written before an interruption, are dropped), rewrites it
  // atomically and appends from there. A missing file starts a fresh one.
  // A last row cut short (no newline) is dropped with a note on `log`.
  void resume(const std::string& path, int64_t step, std::FILE* log = nullptr);
  // Appends one row to the file (flushed) and to rows().
  void append(const MetricsRow& row);
  const std::vector<MetricsRow>& rows() const { return rows_; }
  // loss.png and accuracy.png (train and eval) in `folder`; nothing when no row has a value.
  void plot(const std::string& folder) const;

 private:
  void rewrite() const;
  std::string path_;
  std::vector<MetricsRow> rows_;
};

// "4m05s", "1h02m", "12s".
std::string format_duration(double seconds);

}  // namespace clustr::copy
