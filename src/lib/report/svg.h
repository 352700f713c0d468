// report/svg.h -- a tiny SVG plotting helper for the fidelity report: linear
// or log axes with sensible ticks, polylines, markers with <title> tooltips,
// point labels placed so they do not overlap, vertical reference lines and a
// legend in the top margin. Internal to the report; no dependencies.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace asap::svg {

// HTML/XML escaping of text and attribute values.
std::string esc(const std::string& s);
// 3 significant digits; exponent form (1.23e-7) outside [1e-3, 1e5).
std::string fmt(double v, int sig = 3);
// Integers exactly, anything else to 3 significant digits without trailing zeros.
std::string fmt_short(double v);
// Seconds as "1.23 s", "25.3 ms" or "362 µs".
std::string fmt_seconds(double s);

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  bool integer_ticks = false;  // linear axis: ticks at integers only
  std::string label;
};

// A range covering `values` (non-positive ones ignored on log axes), padded.
Axis auto_axis(const std::vector<double>& values, bool log, const std::string& label, double pad = 0.08);

struct Marker {
  std::string shape = "circle";  // circle, square, diamond, triangle
  std::string color = "#333";
  bool filled = true;
  double r = 4.5;
  double opacity = 1;
  double stroke_width = 1.5;
  std::string title;  // tooltip
  std::string extra;  // extra attributes
};

struct LegendItem {
  std::string label;
  std::string color;
  std::string kind = "marker";   // marker, hollow, line, dashed, line+marker, bar
  std::string shape = "circle";  // of the marker
};

// Primitives are recorded in data coordinates and laid out by build(), so
// margins and the legend may be set in any order.
class Plot {
 public:
  Plot(double width, double height, Axis x, Axis y);
  double ml = 58, mr = 14, mt = 14, mb = 42;  // margins (px); legend rows add to mt

  double px(double x) const;  // data -> pixel
  double py(double y) const;
  bool in_x(double x) const;  // plottable (positive on log axes, within range)
  bool in_y(double y) const;

  void line(const std::vector<std::pair<double, double>>& pts, const std::string& color, double width = 1.6,
            const std::string& dash = "", double opacity = 1);
  void marker(double x, double y, const Marker& m);
  // Text near the data point (x, y); placed at build time avoiding markers,
  // other labels and the frame. `avoid_r` is the marker radius.
  void label(double x, double y, const std::string& text, const std::string& color, double avoid_r = 5,
             bool bold = false);
  void vline(double x, const std::string& color, const std::string& text, const std::string& dash = "5 4");
  void hline(double y, const std::string& color, const std::string& text, const std::string& dash = "5 4");
  void bar(double x0, double x1, double y0, double y1, const std::string& color, const std::string& title);
  // Many small untitled dots (a scatter sample), one group.
  void dots(const std::vector<std::pair<double, double>>& pts, const std::string& color, double r = 1.7,
            double opacity = 0.3);
  // Text at a data point, offset by dy pixels, drawn above the data; anchor: start, middle, end.
  void text(double x, double y, const std::string& text, const std::string& color, const std::string& anchor = "middle",
            double dy = 0, const std::string& cls = "lbl");
  void raw(const std::string& svg_in_pixels);  // drawn last, unclipped; pixel coordinates of the final layout
  void legend(const std::vector<LegendItem>& items);
  void category_ticks(const std::vector<std::pair<double, std::string>>& ticks);  // replaces x ticks

  std::string build(const std::string& aria_label) const;

 private:
  struct PendingLabel {
    double x, y, r;
    std::string text, color;
    bool bold;
  };
  struct PendingMarker {
    double x, y;
    Marker m;
  };
  double w_, h_;
  Axis x_, y_;
  std::vector<std::function<void(std::string&)>> draw_;  // in order, after markers are known
  std::vector<PendingLabel> labels_;
  std::vector<PendingMarker> markers_;
  std::vector<std::string> raw_;
  std::vector<std::function<void(std::string&)>> overlay_;  // after the data, unclipped
  struct VLine {
    double x;
    std::string color, text, dash;
  };
  std::vector<VLine> vlines_;
  std::vector<std::pair<std::pair<double, double>, std::pair<double, double>>> segments_;
  std::vector<LegendItem> legend_;
  std::vector<std::pair<double, std::string>> category_ticks_;
  bool categories_ = false;
  double legend_height() const;
};

}  // namespace asap::svg
