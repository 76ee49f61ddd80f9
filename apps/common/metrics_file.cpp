// metrics.csv on disk (metrics_file.h).
#include "apps/common/metrics_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace clustr {

std::vector<std::string> read_metrics_rows(const std::string& path, const std::string& header,
                                           std::FILE* log) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::ostringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start);
    if (end == std::string::npos) {
      if (log)
        std::fprintf(log, "note: dropped the last line of %s, which was cut short: \"%s\"\n",
                     path.c_str(), text.substr(start).c_str());
      break;
    }
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  if (lines.empty()) return {};
  CLUSTR_CHECK(lines.front() == header, path, ":1: not this app's metrics file (header \"",
               lines.front(), "\", expected \"", header, "\")");
  lines.erase(lines.begin());
  std::vector<std::string> rows;
  for (std::string& l : lines)
    if (!l.empty()) rows.push_back(std::move(l));
  return rows;
}

void write_lines_atomically(const std::string& path, const std::vector<std::string>& lines) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const std::string& l : lines) out << l << '\n';  // nothing happens if it did not open
    out.flush();
    if (!out.good()) {  // no half-written temporary file is left behind
      const int err = errno;
      out.close();
      std::remove(tmp.c_str());
      throw Error(detail::cat("cannot write ", path, " (through ", tmp, "): ",
                              std::strerror(err)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw Error(detail::cat("cannot rename ", tmp, " to ", path, ": ", std::strerror(err)));
  }
}

void write_metrics_file(const std::string& path, const std::string& header,
                        const std::vector<std::string>& rows) {
  std::vector<std::string> lines{header};
  lines.insert(lines.end(), rows.begin(), rows.end());
  write_lines_atomically(path, lines);
}

void plot_metrics(const std::string& folder, const std::string& file,
                  std::vector<plot::Series> series, const plot::Options& options) {
  std::vector<plot::Series> kept;
  for (plot::Series& s : series)
    if (!s.x.empty()) kept.push_back(std::move(s));
  if (!kept.empty()) plot::write_line_plot(folder + "/" + file, kept, options);
}

void append_metrics_row(const std::string& path, const std::string& row) {
  std::ofstream out(path, std::ios::app);
  CLUSTR_CHECK(out.good(), "metrics: cannot append to ", path, ": ", std::strerror(errno));
  out << row << '\n';
  out.flush();
  CLUSTR_CHECK(out.good(), "metrics: cannot append to ", path, ": ", std::strerror(errno));
}

}  // namespace clustr
