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

#include "apps/common/metrics_file.h"

namespace clustr::copy {

struct MetricsRow {
  int64_t step = 0;
  // NaN where not measured.
  double train_loss, train_acc, lr, ms_per_step, tokens_per_s, eval_loss, eval_acc;
  MetricsRow();
};

// metrics.csv (apps/common/metrics_file.h) with this app's columns and plots.
class MetricsLog : public clustr::MetricsLog<MetricsRow> {
 public:
  MetricsLog();
  // loss.png and accuracy.png (train and eval) in `folder`; nothing when no row has a value.
  void plot(const std::string& folder) const;
};

// "4m05s", "1h02m", "12s".
std::string format_duration(double seconds);

}  // namespace clustr::copy
