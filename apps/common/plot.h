// Line plots and heatmaps as PNG files, for the benchmarks and apps (loss curves, the paper's
// Figures 4 and 5). Line plots:
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

// A heatmap (the paper's Figure 5): a grid of cells coloured by value on a perceptually uniform
// scale (viridis) from `lo` to `hi`, each cell labelled with its value (printf `format`), row
// labels on the left, column labels below, a colour bar on the right. NaN cells are grey and
// unlabelled (not run yet).
struct HeatmapOptions {
  std::string title, x_label, y_label;
  double lo = 0.0, hi = 1.0;  // the colour scale; values outside are clamped
  std::string format = "%.3f";
  int cell_width = 120, cell_height = 44;
};

// values[r][c] for row_labels[r], column_labels[c]. Throws clustr::Error naming the file when
// the sizes disagree, the grid is empty, lo >= hi, or the file cannot be written.
void write_heatmap(const std::string& path, const std::vector<std::string>& row_labels,
                   const std::vector<std::string>& column_labels,
                   const std::vector<std::vector<double>>& values, const HeatmapOptions& options);

// Images side by side (the paper's Figure 8, attention maps): each panel is a rows x cols grid of
// values in [0, 1] (row-major), drawn with the heatmap's colour scale, `scale` pixels per value,
// its title above it; row and column indices are ticked along the first panel's left edge and
// under every panel, x_label under and y_label left of the panels. Every panel must have the
// same size.
struct Panel {
  std::string title;
  int rows = 0, cols = 0;
  std::vector<double> values;  // rows * cols
};
struct PanelOptions {
  std::string title, x_label, y_label;
  int scale = 1;
};

// Throws clustr::Error naming the file when there is no panel, the panels' sizes disagree, a
// panel's values do not match its size, the scale is below 1, or the file cannot be written.
void write_image_panels(const std::string& path, const std::vector<Panel>& panels,
                        const PanelOptions& options);

}  // namespace clustr::plot
