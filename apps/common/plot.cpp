#include "apps/common/plot.h"

// stb_easy_font is a header of static functions written for C; quiet its warnings here only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include <stb/stb_easy_font.h>
#pragma GCC diagnostic pop
#include <stb/stb_image_write.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace clustr::plot {

namespace {

struct Rgb {
  unsigned char r, g, b;
};

constexpr Rgb kWhite{255, 255, 255}, kBlack{20, 20, 20}, kGrid{225, 225, 225};
// Colour-blind-safe palette (Okabe-Ito).
constexpr Rgb kPalette[] = {{0, 114, 178},  {213, 94, 0},   {0, 158, 115}, {204, 121, 167},
                            {230, 159, 0},  {86, 180, 233}, {240, 228, 66}, {0, 0, 0}};

class Canvas {
 public:
  Canvas(int w, int h) : w_(w), h_(h), px_(static_cast<size_t>(w) * h * 3, 255) {}

  void set(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
    unsigned char* p = &px_[(static_cast<size_t>(y) * w_ + x) * 3];
    p[0] = c.r, p[1] = c.g, p[2] = c.b;
  }
  void rect(int x0, int y0, int x1, int y1, Rgb c) {  // filled, inclusive
    for (int y = std::max(0, y0); y <= std::min(h_ - 1, y1); ++y)
      for (int x = std::max(0, x0); x <= std::min(w_ - 1, x1); ++x) set(x, y, c);
  }
  // A line `thick` pixels wide (Bresenham with a square pen).
  void line(int x0, int y0, int x1, int y1, Rgb c, int thick = 1) {
    int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1, err = dx + dy;
    for (;;) {
      rect(x0 - thick / 2, y0 - thick / 2, x0 + (thick - 1) / 2, y0 + (thick - 1) / 2, c);
      if (x0 == x1 && y0 == y1) break;
      int e2 = 2 * err;
      if (e2 >= dy) err += dy, x0 += sx;
      if (e2 <= dx) err += dx, y0 += sy;
    }
  }
  // Text at (x, y) top-left, `scale` pixels per font unit.
  void text(int x, int y, const std::string& s, Rgb c, int scale = 2) {
    std::vector<float> quads(s.size() * 270 + 64);  // stb's bound: about 270 bytes a character
    std::string copy = s;
    for (char& ch : copy)  // the font covers printable ASCII only
      if (ch != '\n' && (ch < 32 || ch > 126)) ch = '?';
    int n = stb_easy_font_print(0, 0, copy.data(), nullptr, quads.data(),
                                static_cast<int>(quads.size() * sizeof(float)));
    for (int q = 0; q < n; ++q) {
      const float* v = quads.data() + q * 16;  // 4 vertices of (x, y, z, rgba) = 16 floats
      float qx0 = v[0], qy0 = v[1], qx1 = v[8], qy1 = v[9];
      rect(x + int(qx0 * scale), y + int(qy0 * scale), x + int(qx1 * scale) - 1,
           y + int(qy1 * scale) - 1, c);
    }
  }
  static int text_width(const std::string& s, int scale = 2) {
    std::string copy = s;
    return stb_easy_font_width(copy.data()) * scale;
  }
  const unsigned char* data() const { return px_.data(); }

 private:
  int w_, h_;
  std::vector<unsigned char> px_;
};

// Maps data values to pixels along one axis, linear or log10.
struct Axis {
  double lo, hi;
  bool log;
  int p0, p1;  // pixel of lo and of hi
  double t(double v) const { return log ? std::log10(v) : v; }
  int pixel(double v) const {
    double a = t(lo), b = t(hi);
    return p0 + static_cast<int>(std::lround((t(v) - a) / (b - a) * (p1 - p0)));
  }
  // Tick values: powers of ten on a log axis, 1/2/5 steps on a linear one.
  std::vector<double> ticks() const {
    std::vector<double> out;
    if (log) {  // 1, 2, 5 times powers of ten; only the powers when that is too many
      for (int pass = 0; pass < 2 && (out.empty() || out.size() > 10); ++pass) {
        out.clear();
        for (int e = int(std::floor(std::log10(lo))); e <= int(std::ceil(std::log10(hi))); ++e)
          for (double m : pass == 0 ? std::vector<double>{1, 2, 5} : std::vector<double>{1}) {
            double v = m * std::pow(10.0, e);
            if (v >= lo * 0.999 && v <= hi * 1.001) out.push_back(v);
          }
      }
      return out;
    }
    double raw = (hi - lo) / 6, mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
    for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push_back(v);
    return out;
  }
};

std::string label_of(double v) {
  char buf[32];
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3))
    std::snprintf(buf, sizeof buf, "%.0e", v);
  else
    std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

bool usable(double v, bool log) { return std::isfinite(v) && (!log || v > 0); }

// Writes the canvas to a temporary file and renames it over `path`.
void write_png(const std::string& path, const Canvas& c, int width, int height) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  CLUSTR_CHECK(stbi_write_png(tmp.c_str(), width, height, 3, c.data(), width * 3) != 0,
               "plot: cannot write ", tmp, ": ", std::strerror(errno));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(detail::cat("plot: cannot rename ", tmp, " to ", path, ": ",
                            std::strerror(errno)));
  }
}

// Viridis at t in [0, 1], linear between nine samples of matplotlib's table.
Rgb viridis(double t) {
  static constexpr Rgb stops[] = {{68, 1, 84},    {71, 45, 123},  {59, 82, 139},
                                  {44, 114, 142}, {33, 145, 140}, {39, 173, 129},
                                  {92, 200, 99},  {170, 220, 50}, {253, 231, 37}};
  constexpr int n = sizeof stops / sizeof stops[0];
  t = std::clamp(t, 0.0, 1.0) * (n - 1);
  const int i = std::min(static_cast<int>(t), n - 2);
  const double f = t - i;
  auto mix = [f](unsigned char a, unsigned char b) {
    return static_cast<unsigned char>(std::lround(a + (b - a) * f));
  };
  return {mix(stops[i].r, stops[i + 1].r), mix(stops[i].g, stops[i + 1].g),
          mix(stops[i].b, stops[i + 1].b)};
}

}  // namespace

void write_line_plot(const std::string& path, const std::vector<Series>& series,
                     const Options& o) {
  double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
  for (const Series& s : series)
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i)
      if (usable(s.x[i], o.log_x) && usable(s.y[i], o.log_y)) {
        xlo = std::min(xlo, s.x[i]), xhi = std::max(xhi, s.x[i]);
        ylo = std::min(ylo, s.y[i]), yhi = std::max(yhi, s.y[i]);
      }
  CLUSTR_CHECK(std::isfinite(xlo), "plot: no drawable point for ", path);
  if (xhi == xlo) xhi = o.log_x ? xlo * 10 : xlo + 1;
  if (yhi == ylo) yhi = o.log_y ? ylo * 10 : ylo + 1;
  if (o.log_y) ylo /= 1.5, yhi *= 1.5;
  else {
    double pad = (yhi - ylo) * 0.05;
    ylo -= pad, yhi += pad;
  }

  Canvas c(o.width, o.height);
  const int left = 90, right = o.width - 30, top = 70, bottom = o.height - 70;
  Axis ax{xlo, xhi, o.log_x, left, right}, ay{ylo, yhi, o.log_y, bottom, top};
  for (double v : ax.ticks()) {
    int x = ax.pixel(v);
    c.line(x, top, x, bottom, kGrid);
    c.line(x, bottom, x, bottom + 5, kBlack);
    std::string l = label_of(v);
    c.text(x - Canvas::text_width(l) / 2, bottom + 10, l, kBlack);
  }
  for (double v : ay.ticks()) {
    int y = ay.pixel(v);
    c.line(left, y, right, y, kGrid);
    c.line(left - 5, y, left, y, kBlack);
    std::string l = label_of(v);
    c.text(left - 10 - Canvas::text_width(l), y - 6, l, kBlack);
  }
  c.line(left, bottom, right, bottom, kBlack, 2);
  c.line(left, top, left, bottom, kBlack, 2);
  c.text((left + right - Canvas::text_width(o.title)) / 2, 12, o.title, kBlack);
  c.text((left + right - Canvas::text_width(o.x_label)) / 2, bottom + 38, o.x_label, kBlack);
  c.text(left - 40, top - 30, o.y_label, kBlack);

  int legend_width = 0;
  for (const Series& s : series) legend_width = std::max(legend_width, Canvas::text_width(s.label));
  const int legend_x = right - 50 - legend_width;
  for (size_t k = 0; k < series.size(); ++k) {
    const Series& s = series[k];
    Rgb col = kPalette[k % (sizeof kPalette / sizeof kPalette[0])];
    int px = -1, py = -1;
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!usable(s.x[i], o.log_x) || !usable(s.y[i], o.log_y)) continue;
      int x = ax.pixel(s.x[i]), y = ay.pixel(s.y[i]);
      if (px >= 0) c.line(px, py, x, y, col, 3);
      c.rect(x - 3, y - 3, x + 3, y + 3, col);
      px = x, py = y;
    }
    int ly = top + 10 + static_cast<int>(k) * 24;
    c.line(legend_x, ly + 6, legend_x + 30, ly + 6, col, 3);
    c.text(legend_x + 40, ly, s.label, kBlack);
  }

  write_png(path, c, o.width, o.height);
}

void write_heatmap(const std::string& path, const std::vector<std::string>& rows,
                   const std::vector<std::string>& cols,
                   const std::vector<std::vector<double>>& values, const HeatmapOptions& o) {
  CLUSTR_CHECK(!rows.empty() && !cols.empty(), "heatmap ", path, ": no rows or no columns");
  CLUSTR_CHECK(values.size() == rows.size(), "heatmap ", path, ": ", rows.size(),
               " row labels but ", values.size(), " rows of values");
  for (size_t r = 0; r < values.size(); ++r)
    CLUSTR_CHECK(values[r].size() == cols.size(), "heatmap ", path, ": row ", r, " has ",
                 values[r].size(), " values for ", cols.size(), " columns");
  CLUSTR_CHECK(o.lo < o.hi, "heatmap ", path, ": the colour scale needs lo < hi, got ", o.lo,
               " and ", o.hi);
  CLUSTR_CHECK(o.cell_width >= 20 && o.cell_height >= 16, "heatmap ", path,
               ": cells must be at least 20 x 16 pixels");

  int label_width = Canvas::text_width(o.y_label);
  for (const std::string& l : rows) label_width = std::max(label_width, Canvas::text_width(l));
  const int left = 30 + label_width, top = 60;
  const int grid_w = o.cell_width * static_cast<int>(cols.size());
  const int grid_h = o.cell_height * static_cast<int>(rows.size());
  const int bar_x = left + grid_w + 30, bar_w = 24;
  const int width = std::max(bar_x + bar_w + 90, left + Canvas::text_width(o.title) + 30);
  const int height = top + grid_h + 80;
  Canvas c(width, height);

  for (size_t r = 0; r < rows.size(); ++r) {
    const int y0 = top + static_cast<int>(r) * o.cell_height;
    c.text(left - 12 - Canvas::text_width(rows[r]), y0 + o.cell_height / 2 - 7, rows[r], kBlack);
    for (size_t k = 0; k < cols.size(); ++k) {
      const int x0 = left + static_cast<int>(k) * o.cell_width;
      const double v = values[r][k];
      const bool has = std::isfinite(v);
      const double t = (v - o.lo) / (o.hi - o.lo);
      const Rgb fill = has ? viridis(t) : kGrid;
      c.rect(x0, y0, x0 + o.cell_width - 1, y0 + o.cell_height - 1, fill);
      if (has) {
        char buf[32];
        std::snprintf(buf, sizeof buf, o.format.c_str(), v);
        // Dark text on the light (yellow-green) end of the scale, white on the dark end.
        const Rgb ink = t > 0.6 ? kBlack : kWhite;
        c.text(x0 + (o.cell_width - Canvas::text_width(buf)) / 2, y0 + o.cell_height / 2 - 7,
               buf, ink);
      }
    }
  }
  // Thin white lines between cells.
  for (size_t k = 0; k <= cols.size(); ++k) {
    const int x = left + static_cast<int>(k) * o.cell_width;
    c.line(x, top, x, top + grid_h, kWhite, 2);
  }
  for (size_t r = 0; r <= rows.size(); ++r) {
    const int y = top + static_cast<int>(r) * o.cell_height;
    c.line(left, y, left + grid_w, y, kWhite, 2);
  }
  for (size_t k = 0; k < cols.size(); ++k) {
    const int xc = left + static_cast<int>(k) * o.cell_width + o.cell_width / 2;
    c.text(xc - Canvas::text_width(cols[k]) / 2, top + grid_h + 10, cols[k], kBlack);
  }
  c.text(left + (grid_w - Canvas::text_width(o.x_label)) / 2, top + grid_h + 40, o.x_label,
         kBlack);
  c.text(12, top - 26, o.y_label, kBlack);
  c.text(left + (grid_w - Canvas::text_width(o.title)) / 2, 14, o.title, kBlack);

  // Colour bar: hi at the top, lo at the bottom, five labels.
  for (int y = 0; y < grid_h; ++y)
    c.rect(bar_x, top + y, bar_x + bar_w - 1, top + y,
           viridis(1.0 - double(y) / std::max(1, grid_h - 1)));
  for (int i = 0; i <= 4; ++i) {
    const double v = o.hi - (o.hi - o.lo) * i / 4.0;
    const int y = top + static_cast<int>(std::lround((grid_h - 1) * i / 4.0));
    c.line(bar_x + bar_w, y, bar_x + bar_w + 5, y, kBlack);
    c.text(bar_x + bar_w + 9, y - 6, label_of(v), kBlack);
  }
  write_png(path, c, width, height);
}

void write_image_panels(const std::string& path, const std::vector<Panel>& panels,
                        const PanelOptions& o) {
  CLUSTR_CHECK(!panels.empty(), "image panels ", path, ": no panel");
  const int rows = panels[0].rows, cols = panels[0].cols;
  CLUSTR_CHECK(rows >= 1 && cols >= 1, "image panels ", path, ": panel 0 is ", rows, " x ",
               cols, "; expected at least 1 x 1");
  for (size_t p = 0; p < panels.size(); ++p) {
    CLUSTR_CHECK(panels[p].rows == rows && panels[p].cols == cols, "image panels ", path,
                 ": panel ", p, " is ", panels[p].rows, " x ", panels[p].cols, ", panel 0 is ",
                 rows, " x ", cols);
    CLUSTR_CHECK(panels[p].values.size() == size_t(rows) * size_t(cols), "image panels ", path,
                 ": panel ", p, " has ", panels[p].values.size(), " values for ", rows, " x ",
                 cols);
  }
  CLUSTR_CHECK(o.scale >= 1, "image panels ", path, ": scale must be >= 1, got ", o.scale);

  // Index ticks: 0, the last index, and round steps between that stay 40 pixels apart.
  auto ticks = [&](int n) {
    std::vector<int> out;
    const int steps[] = {1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000};
    int step = steps[sizeof steps / sizeof steps[0] - 1];
    for (int s : steps)
      if (s * o.scale >= 40) {
        step = s;
        break;
      }
    for (int i = 0; i < n; i += step) out.push_back(i);
    if (out.back() != n - 1 && (n - 1 - out.back()) * o.scale >= 40) out.push_back(n - 1);
    return out;
  };
  const int side_w = cols * o.scale, side_h = rows * o.scale, gap = 40;
  const int left = 80, top = 90, n = static_cast<int>(panels.size());
  const int width = std::max(left + n * side_w + (n - 1) * gap + 30,
                             left + Canvas::text_width(o.title) + 30);
  const int height = top + side_h + 80;
  Canvas c(width, height);
  for (int p = 0; p < n; ++p) {
    const int x0 = left + p * (side_w + gap);
    const Panel& panel = panels[size_t(p)];
    for (int y = 0; y < side_h; ++y)
      for (int x = 0; x < side_w; ++x)
        c.set(x0 + x, top + y, viridis(panel.values[size_t(y / o.scale) * cols + x / o.scale]));
    c.text(x0 + (side_w - Canvas::text_width(panel.title)) / 2, top - 24, panel.title, kBlack);
    for (int k : ticks(cols)) {  // a tick at the middle of column k
      const int x = x0 + k * o.scale + o.scale / 2;
      c.line(x, top + side_h, x, top + side_h + 4, kBlack);
      const std::string l = std::to_string(k);
      c.text(x - Canvas::text_width(l) / 2, top + side_h + 8, l, kBlack);
    }
  }
  for (int k : ticks(rows)) {
    const int y = top + k * o.scale + o.scale / 2;
    c.line(left - 5, y, left - 1, y, kBlack);
    const std::string l = std::to_string(k);
    c.text(left - 9 - Canvas::text_width(l), y - 6, l, kBlack);
  }
  const int all_w = n * side_w + (n - 1) * gap;
  c.text(left + (all_w - Canvas::text_width(o.x_label)) / 2, top + side_h + 36, o.x_label,
         kBlack);
  c.text(8, top - 50, o.y_label, kBlack);
  c.text(left + (all_w - Canvas::text_width(o.title)) / 2, 10, o.title, kBlack);
  write_png(path, c, width, height);
}

}  // namespace clustr::plot
