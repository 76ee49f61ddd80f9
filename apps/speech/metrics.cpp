// metrics.csv and the loss/PER plots of a speech run (metrics.h).
#include "apps/speech/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "apps/common/metrics_file.h"
#include "apps/common/plot.h"
#include "core/error.h"

namespace clustr::speech {

namespace {

constexpr const char* kHeader =
    "step,epoch,train_loss,lr,ms_per_step,frames_per_s,dev_loss,dev_per,impossible";

std::string cell(double v) {
  if (std::isnan(v)) return "";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

double parse_cell(const std::string& s) {
  return s.empty() ? std::numeric_limits<double>::quiet_NaN() : std::strtod(s.c_str(), nullptr);
}

std::string format_row(const MetricsRow& r) {
  return std::to_string(r.step) + "," + std::to_string(r.epoch) + "," + cell(r.train_loss) + "," +
         cell(r.lr) + "," + cell(r.ms_per_step) + "," + cell(r.frames_per_s) + "," +
         cell(r.dev_loss) + "," + cell(r.dev_per) + "," + cell(r.impossible);
}

}  // namespace

MetricsRow::MetricsRow() {
  train_loss = lr = ms_per_step = frames_per_s = dev_loss = dev_per = impossible =
      std::numeric_limits<double>::quiet_NaN();
}

void MetricsLog::start(const std::string& path, int64_t resume_step, std::FILE* log) {
  path_ = path;
  rows_.clear();
  if (resume_step >= 0) {
    int line_no = 1;
    for (const std::string& line : read_metrics_rows(path, kHeader, log)) {
      ++line_no;
      std::vector<std::string> f;
      std::stringstream ss(line);
      std::string c;
      while (std::getline(ss, c, ',')) f.push_back(c);
      if (!line.empty() && line.back() == ',') f.emplace_back();
      CLUSTR_CHECK(f.size() == 9, path, ":", line_no, ": expected 9 comma-separated cells, got ",
                   f.size());
      MetricsRow r;
      r.step = std::strtoll(f[0].c_str(), nullptr, 10);
      r.epoch = std::strtoll(f[1].c_str(), nullptr, 10);
      r.train_loss = parse_cell(f[2]), r.lr = parse_cell(f[3]), r.ms_per_step = parse_cell(f[4]);
      r.frames_per_s = parse_cell(f[5]), r.dev_loss = parse_cell(f[6]);
      r.dev_per = parse_cell(f[7]), r.impossible = parse_cell(f[8]);
      if (r.step <= resume_step) rows_.push_back(r);
    }
  }
  std::vector<std::string> lines;
  for (const MetricsRow& r : rows_) lines.push_back(format_row(r));
  write_metrics_file(path_, kHeader, lines);
}

void MetricsLog::append(const MetricsRow& row) {
  rows_.push_back(row);
  append_metrics_row(path_, format_row(row));
}

void MetricsLog::plot(const std::string& folder) const {
  plot::Series train{"train loss", {}, {}}, dev{"dev loss", {}, {}}, per{"dev PER", {}, {}};
  for (const MetricsRow& r : rows_) {
    if (!std::isnan(r.train_loss)) train.x.push_back(double(r.step)), train.y.push_back(r.train_loss);
    if (!std::isnan(r.dev_loss)) dev.x.push_back(double(r.step)), dev.y.push_back(r.dev_loss);
    if (!std::isnan(r.dev_per)) per.x.push_back(double(r.step)), per.y.push_back(r.dev_per);
  }
  namespace fs = std::filesystem;
  if (!train.x.empty() || !dev.x.empty()) {
    std::vector<plot::Series> s;
    if (!train.x.empty()) s.push_back(train);
    if (!dev.x.empty()) s.push_back(dev);
    plot::Options o;
    o.title = "CTC loss (per label)";
    o.x_label = "step";
    o.y_label = "loss";
    plot::write_line_plot((fs::path(folder) / "loss.png").string(), s, o);
  }
  if (!per.x.empty()) {
    plot::Options o;
    o.title = "dev phone error rate (greedy)";
    o.x_label = "step";
    o.y_label = "PER";
    plot::write_line_plot((fs::path(folder) / "per.png").string(), {per}, o);
  }
}

}  // namespace clustr::speech
