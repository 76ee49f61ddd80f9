// metrics.csv and the loss/accuracy plots (metrics.h).
#include "apps/copy_task/metrics.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "apps/common/metrics_file.h"
#include "apps/common/plot.h"

namespace clustr::copy {

MetricsRow::MetricsRow() {
  train_loss = train_acc = lr = ms_per_step = tokens_per_s = eval_loss = eval_acc =
      std::numeric_limits<double>::quiet_NaN();
}

MetricsLog::MetricsLog()
    : clustr::MetricsLog<MetricsRow>({{"step", &MetricsRow::step, nullptr, nullptr},
                                      {"train_loss", nullptr, &MetricsRow::train_loss, "%.6g"},
                                      {"train_acc", nullptr, &MetricsRow::train_acc, "%.6g"},
                                      {"lr", nullptr, &MetricsRow::lr, "%.6g"},
                                      {"ms_per_step", nullptr, &MetricsRow::ms_per_step, "%.4g"},
                                      {"tokens_per_s", nullptr, &MetricsRow::tokens_per_s, "%.0f"},
                                      {"eval_loss", nullptr, &MetricsRow::eval_loss, "%.6g"},
                                      {"eval_acc", nullptr, &MetricsRow::eval_acc, "%.6g"}}) {}

void MetricsLog::plot(const std::string& folder) const {
  plot_metrics(folder, "loss.png",
               {metric_series(rows(), "train", &MetricsRow::train_loss),
                metric_series(rows(), "held-out", &MetricsRow::eval_loss)},
               {"copy task: cross-entropy on masked positions", "step", "loss", false, true});
  plot_metrics(folder, "accuracy.png",
               {metric_series(rows(), "train", &MetricsRow::train_acc),
                metric_series(rows(), "held-out", &MetricsRow::eval_acc)},
               {"copy task: masked-token accuracy", "step", "accuracy", false, false});
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = std::lround(seconds);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

}  // namespace clustr::copy
