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

namespace clustr::speech {

struct MetricsRow {
  int64_t step = 0, epoch = 0;
  double train_loss, lr, ms_per_step, frames_per_s, dev_loss, dev_per, impossible;  // NaN: none
  MetricsRow();
};

class MetricsLog {
 public:
  // Starts metrics.csv at `path`; `resume_step` >= 0 keeps the rows of an existing file up to
  // that step (a resumed run continues it), < 0 starts afresh.
  // A last row cut short (no newline) is dropped with a note on `log`.
  void start(const std::string& path, int64_t resume_step, std::FILE* log = nullptr);
  void append(const MetricsRow& row);
  const std::vector<MetricsRow>& rows() const { return rows_; }
  // loss.png and per.png in `folder` (nothing for a plot without values).
  void plot(const std::string& folder) const;

 private:
  std::string path_;
  std::vector<MetricsRow> rows_;
};

}  // namespace clustr::speech
