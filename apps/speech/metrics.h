// The speech run's metrics: rows kept in memory, appended to metrics.csv as they come, drawn as
// PNG line plots (loss.png: training and dev loss; per.png: dev phone error rate).
//
// metrics.csv columns (empty where not measured at that row):
//   step, epoch, train_loss, lr, ms_per_step, frames_per_s, dev_loss, dev_per, impossible
// train_loss is the mean over the steps since the previous progress line; frames are 10 ms
// input frames (before stacking); impossible counts the epoch's unalignable utterances.
#pragma once

#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "apps/common/metrics_file.h"

namespace clustr::speech {

struct MetricsRow {
  int64_t step = 0, epoch = 0;
  double train_loss, lr, ms_per_step, frames_per_s, dev_loss, dev_per, impossible;  // NaN: none
  MetricsRow();
};

// metrics.csv (apps/common/metrics_file.h) with this app's columns and plots.
class MetricsLog : public clustr::MetricsLog<MetricsRow> {
 public:
  MetricsLog();
  // loss.png and per.png in `folder` (nothing for a plot without values).
  void plot(const std::string& folder) const;
};

}  // namespace clustr::speech
