// metrics.csv and the loss/PER plots of a speech run (metrics.h).
#include "apps/speech/metrics.h"

#include <limits>

#include "apps/common/metrics_file.h"
#include "apps/common/plot.h"

namespace clustr::speech {

MetricsRow::MetricsRow() {
  train_loss = lr = ms_per_step = frames_per_s = dev_loss = dev_per = impossible =
      std::numeric_limits<double>::quiet_NaN();
}

MetricsLog::MetricsLog()
    : clustr::MetricsLog<MetricsRow>({{"step", &MetricsRow::step, nullptr, nullptr},
                                      {"epoch", &MetricsRow::epoch, nullptr, nullptr},
                                      {"train_loss", nullptr, &MetricsRow::train_loss, "%.6g"},
                                      {"lr", nullptr, &MetricsRow::lr, "%.6g"},
                                      {"ms_per_step", nullptr, &MetricsRow::ms_per_step, "%.6g"},
                                      {"frames_per_s", nullptr, &MetricsRow::frames_per_s, "%.6g"},
                                      {"dev_loss", nullptr, &MetricsRow::dev_loss, "%.6g"},
                                      {"dev_per", nullptr, &MetricsRow::dev_per, "%.6g"},
                                      {"impossible", nullptr, &MetricsRow::impossible, "%.6g"}}) {}

void MetricsLog::plot(const std::string& folder) const {
  plot_metrics(folder, "loss.png",
               {metric_series(rows(), "train loss", &MetricsRow::train_loss),
                metric_series(rows(), "dev loss", &MetricsRow::dev_loss)},
               {"CTC loss (per label)", "step", "loss", false, false});
  plot_metrics(folder, "per.png", {metric_series(rows(), "dev PER", &MetricsRow::dev_per)},
               {"dev phone error rate (greedy)", "step", "PER", false, false});
}

}  // namespace clustr::speech
