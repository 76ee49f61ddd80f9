// A run's metrics.csv: rows kept in memory, appended to the file as they come, continued when a
// run resumes, and drawn as line plots. MetricsLog<Row> is driven by the app's columns (each a
// member of Row: an integer such as the step, or a double, NaN where not measured, printed
// with a printf format and read back exactly as printed); the file functions below it do the
// I/O, with the system's reason in their errors.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "apps/common/plot.h"
#include "core/error.h"

namespace clustr {

// The lines after the header of the metrics file at `path` (none when it does not exist).
// A last line without its newline was cut short (the run was killed, or the disk was full,
// while writing it): it is dropped with a note on `log` (nullptr: silent), since it lies past
// any checkpoint. Throws when the first line is not `header`.
std::vector<std::string> read_metrics_rows(const std::string& path, const std::string& header,
                                           std::FILE* log);
// Writes the header and the rows to `path` through a temporary file renamed over it.
void write_metrics_file(const std::string& path, const std::string& header,
                        const std::vector<std::string>& rows);
// Writes `lines` (each with its newline) to `path` through a temporary file renamed over it.
void write_lines_atomically(const std::string& path, const std::vector<std::string>& lines);
// Appends one row (and its newline) to `path`.
void append_metrics_row(const std::string& path, const std::string& row);

// The points (row.step, row.*field) of the rows whose value is finite, as a plot series.
template <class Row>
plot::Series metric_series(const std::vector<Row>& rows, const std::string& label,
                           double Row::*field) {
  plot::Series s{label, {}, {}};
  for (const Row& r : rows)
    if (std::isfinite(r.*field)) s.x.push_back(double(r.step)), s.y.push_back(r.*field);
  return s;
}
// Draws the series that have points into folder/file; nothing when none has.
void plot_metrics(const std::string& folder, const std::string& file,
                  std::vector<plot::Series> series, const plot::Options& options);

// One column of metrics.csv: a member of Row, integer (`count`) or double (`value`).
template <class Row>
struct MetricsColumn {
  const char* name;
  int64_t Row::*count;
  double Row::*value;
  const char* format;  // of a value ("%.6g"); an empty cell for a value that is not finite
};

template <class Row>
class MetricsLog {
 public:
  explicit MetricsLog(std::vector<MetricsColumn<Row>> columns) : columns_(std::move(columns)) {}

  // Starts metrics.csv at `path`: afresh when resume_step < 0, else keeping the rows of an
  // existing file up to that step (a resumed run continues it; rows past the checkpoint's step,
  // written before an interruption, are dropped, and so is a last row cut short, with a note
  // on `log`). The file is rewritten atomically either way.
  void start(const std::string& path, int64_t resume_step, std::FILE* log) {
    path_ = path;
    rows_.clear();
    if (resume_step >= 0) {
      int line_no = 1;
      for (const std::string& line : read_metrics_rows(path, header(), log)) {
        const Row r = parse(line, ++line_no);
        if (r.step <= resume_step) rows_.push_back(r);
      }
    }
    std::vector<std::string> lines;
    for (const Row& r : rows_) lines.push_back(format(r));
    write_metrics_file(path_, header(), lines);
  }
  // Appends one row to the file (flushed) and to rows().
  void append(const Row& row) {
    rows_.push_back(row);
    append_metrics_row(path_, format(row));
  }
  const std::vector<Row>& rows() const { return rows_; }

 private:
  std::string header() const {
    std::string h;
    for (const auto& c : columns_) h += (h.empty() ? "" : ",") + std::string(c.name);
    return h;
  }
  std::string format(const Row& r) const {
    std::string line;
    for (size_t i = 0; i < columns_.size(); ++i) {
      const MetricsColumn<Row>& c = columns_[i];
      if (i) line += ',';
      if (c.count) {
        line += std::to_string(r.*c.count);
      } else if (std::isfinite(r.*c.value)) {
        char buf[40];
        std::snprintf(buf, sizeof buf, c.format, r.*c.value);
        line += buf;
      }
    }
    return line;
  }
  // One CSV line -> row; throws naming the file and line when malformed.
  Row parse(const std::string& line, int line_no) const {
    std::vector<std::string> cells(1);
    for (char ch : line) {
      if (ch == ',')
        cells.emplace_back();
      else
        cells.back().push_back(ch);
    }
    CLUSTR_CHECK(cells.size() == columns_.size(), path_, ":", line_no, ": expected ",
                 columns_.size(), " comma-separated cells, got ", cells.size());
    Row r;
    for (size_t i = 0; i < columns_.size(); ++i) {
      const MetricsColumn<Row>& c = columns_[i];
      const std::string& s = cells[i];
      char* end = nullptr;
      errno = 0;
      if (c.count) {
        r.*c.count = std::strtoll(s.c_str(), &end, 10);
        CLUSTR_CHECK(!s.empty() && *end == '\0' && errno == 0, path_, ":", line_no, ": '", s,
                     "' is not a whole number (", c.name, ")");
      } else {
        r.*c.value = s.empty() ? std::numeric_limits<double>::quiet_NaN()
                               : std::strtod(s.c_str(), &end);
        CLUSTR_CHECK(s.empty() || *end == '\0', path_, ":", line_no, ": '", s,
                     "' is not a number (", c.name, ")");
      }
    }
    return r;
  }

  std::vector<MetricsColumn<Row>> columns_;
  std::string path_;
  std::vector<Row> rows_;
};

}  // namespace clustr
