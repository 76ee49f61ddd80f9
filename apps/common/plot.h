// Line plots as PNG files, for the benchmarks and apps (loss curves, the paper's Figure 4):
// axes with ticks and grid lines (linear or log10), one coloured line with markers per series,
// a legend, a title. Text is drawn with stb_easy_font, the file written with stb_image_write
// (Debian's libstb), to a temporary file that is then renamed, so a crash never leaves half a
// PNG. Points with non-finite values (or <= 0 on a log axis) are skipped.
#pragma once

#include <string>
#include <vector>

namespace clustr::plot {

struct Series {
  std::string label;
  std::vector<double> x, y;
};

struct Options {
  std::string title, x_label, y_label;
  bool log_x = false, log_y = false;
  int width = 900, height = 600;
};

// Throws clustr::Error naming the file when it cannot be written or there is nothing to draw.
void write_line_plot(const std::string& path, const std::vector<Series>& series,
                     const Options& options);

}  // namespace clustr::plot
