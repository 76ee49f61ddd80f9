// metrics.csv and the loss/accuracy plots (metrics.h).
#include "apps/copy_task/metrics.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "apps/common/metrics_file.h"
#include "apps/common/plot.h"
#include "core/error.h"

namespace clustr::copy {

namespace {

constexpr const char* kHeader =
    "step,train_loss,train_acc,lr,ms_per_step,tokens_per_s,eval_loss,eval_acc";
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string cell(double v, const char* format) {
  if (!std::isfinite(v)) return "";
  char buf[40];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string format_row(const MetricsRow& r) {
  std::ostringstream os;
  os << r.step << ',' << cell(r.train_loss, "%.6g") << ',' << cell(r.train_acc, "%.6g") << ','
     << cell(r.lr, "%.6g") << ',' << cell(r.ms_per_step, "%.4g") << ','
     << cell(r.tokens_per_s, "%.0f") << ',' << cell(r.eval_loss, "%.6g") << ','
     << cell(r.eval_acc, "%.6g");
  return os.str();
}

// One CSV line -> row; throws naming the file and line when malformed.
MetricsRow parse_row(const std::string& line, const std::string& path, int line_no) {
  std::vector<std::string> cells;
  std::stringstream ss(line);
  std::string c;
  while (std::getline(ss, c, ',')) cells.push_back(c);
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  CLUSTR_CHECK(cells.size() == 8, path, ":", line_no, ": expected 8 comma-separated cells, got ",
               cells.size());
  auto number = [&](const std::string& s) {
    if (s.empty()) return kNaN;
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    CLUSTR_CHECK(*end == '\0', path, ":", line_no, ": '", s, "' is not a number");
    return v;
  };
  MetricsRow r;
  r.step = static_cast<int64_t>(number(cells[0]));
  double* fields[] = {&r.train_loss, &r.train_acc, &r.lr, &r.ms_per_step, &r.tokens_per_s,
                      &r.eval_loss, &r.eval_acc};
  for (int i = 0; i < 7; ++i) *fields[i] = number(cells[static_cast<size_t>(i) + 1]);
  return r;
}

}  // namespace

MetricsRow::MetricsRow()
    : train_loss(kNaN), train_acc(kNaN), lr(kNaN), ms_per_step(kNaN), tokens_per_s(kNaN),
      eval_loss(kNaN), eval_acc(kNaN) {}

void MetricsLog::start(const std::string& path) {
  path_ = path;
  rows_.clear();
  rewrite();
}

void MetricsLog::resume(const std::string& path, int64_t step, std::FILE* log) {
  path_ = path;
  rows_.clear();
  int line_no = 1;
  for (const std::string& line : read_metrics_rows(path, kHeader, log)) {
    MetricsRow r = parse_row(line, path, ++line_no);
    if (r.step <= step) rows_.push_back(r);
  }
  rewrite();
}

void MetricsLog::rewrite() const {
  std::vector<std::string> lines;
  for (const MetricsRow& r : rows_) lines.push_back(format_row(r));
  write_metrics_file(path_, kHeader, lines);
}

void MetricsLog::append(const MetricsRow& row) {
  rows_.push_back(row);
  append_metrics_row(path_, format_row(row));
}

void MetricsLog::plot(const std::string& folder) const {
  auto series = [&](const char* label, double MetricsRow::*field) {
    plot::Series s{label, {}, {}};
    for (const MetricsRow& r : rows_)
      if (std::isfinite(r.*field)) s.x.push_back(double(r.step)), s.y.push_back(r.*field);
    return s;
  };
  auto draw = [&](const std::string& file, std::vector<plot::Series> all, plot::Options o) {
    std::vector<plot::Series> kept;
    for (auto& s : all)
      if (!s.x.empty()) kept.push_back(std::move(s));
    if (!kept.empty()) plot::write_line_plot(folder + "/" + file, kept, o);
  };
  draw("loss.png",
       {series("train", &MetricsRow::train_loss), series("held-out", &MetricsRow::eval_loss)},
       {"copy task: cross-entropy on masked positions", "step", "loss", false, true});
  draw("accuracy.png",
       {series("train", &MetricsRow::train_acc), series("held-out", &MetricsRow::eval_acc)},
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
