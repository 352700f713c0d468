// report/svg.cpp -- see svg.h.
#include "report/svg.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>

namespace asap::svg {

std::string esc(const std::string& s) {
  std::string o;
  o.reserve(s.size() + 8);
  for (char c : s) {
    switch (c) {
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&#39;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string fmt(double v, int sig) {
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  if (v == 0) return "0";
  char b[64];
  const double a = std::fabs(v);
  if (a >= 1e-3 && a < 1e5) {
    int e = static_cast<int>(std::floor(std::log10(a)));
    const double scale = std::pow(10.0, sig - 1 - e);
    const double r = std::round(a * scale) / scale;  // the rounding may reach the next decade
    e = static_cast<int>(std::floor(std::log10(r) + 1e-12));
    std::snprintf(b, sizeof b, "%.*f", std::max(0, sig - 1 - e), v);
    return b;
  }
  std::snprintf(b, sizeof b, "%.*e", sig - 1, v);
  std::string s = b;
  const auto epos = s.find('e');
  std::string mant = s.substr(0, epos), ex = s.substr(epos + 1);
  const bool neg = ex[0] == '-';
  size_t i = (ex[0] == '-' || ex[0] == '+') ? 1 : 0;
  while (i + 1 < ex.size() && ex[i] == '0') ++i;
  return mant + "e" + (neg ? "-" : "") + ex.substr(i);
}

std::string fmt_seconds(double s) {
  if (s >= 1) return fmt(s) + " s";
  if (s >= 1e-3) return fmt(s * 1e3) + " ms";
  return fmt(s * 1e6) + " \xC2\xB5s";
}

std::string fmt_short(double v) {
  if (std::isfinite(v) && v == std::round(v) && std::fabs(v) < 1e15) {
    char b[32];
    std::snprintf(b, sizeof b, "%.0f", v);
    return b;
  }
  std::string s = fmt(v, 3);
  const auto e = s.find('e');
  std::string mant = e == std::string::npos ? s : s.substr(0, e);
  const std::string rest = e == std::string::npos ? "" : s.substr(e);
  if (mant.find('.') != std::string::npos) {
    while (!mant.empty() && mant.back() == '0') mant.pop_back();
    if (!mant.empty() && mant.back() == '.') mant.pop_back();
  }
  return mant + rest;
}

namespace {

// Tick label: shortest form up to 3 significant digits.
std::string tick_label(double v) { return fmt_short(v); }

struct Ticks {
  std::vector<double> major, minor;
};

Ticks log_ticks(double lo, double hi) {
  Ticks t;
  const int d0 = static_cast<int>(std::floor(std::log10(lo))) - 1, d1 = static_cast<int>(std::ceil(std::log10(hi))) + 1;
  auto collect = [&](const std::vector<int>& mant, int every) {
    std::vector<double> v;
    for (int d = d0; d <= d1; ++d) {
      if (((d % every) + every) % every) continue;
      for (int m : mant) {
        const double x = m * std::pow(10.0, d);
        if (x >= lo * (1 - 1e-9) && x <= hi * (1 + 1e-9)) v.push_back(x);
      }
    }
    return v;
  };
  const std::vector<int> one{1}, few{1, 2, 5}, all{1, 2, 3, 4, 5, 6, 7, 8, 9};
  const double decades = std::log10(hi / lo);
  if (decades < 1.0) {
    t.major = collect(all, 1);
  } else if (decades < 2.2) {
    t.major = collect(few, 1);
  } else {
    t.major = collect(one, 1);
    if (t.major.size() > 7) t.major = collect(one, static_cast<int>(std::ceil(t.major.size() / 6.0)));
  }
  // Unlabelled minor grid at the remaining 1..9 x decades.
  if (decades <= 6)
    for (double x : collect(all, 1))
      if (std::find(t.major.begin(), t.major.end(), x) == t.major.end()) t.minor.push_back(x);
  return t;
}

Ticks linear_ticks(double lo, double hi, bool integer) {
  Ticks t;
  const double raw = (hi - lo) / 5;
  if (!(raw > 0)) return t;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  if (integer) step = hi - lo <= 12 ? 1.0 : std::max(1.0, std::round(step));
  for (double x = std::ceil(lo / step - 1e-9) * step; x <= hi + step * 1e-9; x += step)
    t.major.push_back(std::fabs(x) < step * 1e-9 ? 0 : x);
  return t;
}

std::atomic<int> g_clip_id{0};

double text_width(const std::string& s, double font) {
  // Advance widths of a wide sans-serif face (DejaVu Sans, Verdana); narrower
  // faces (Arial, Helvetica) then leave a little extra room, never too little.
  double w = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c & 0xC0) == 0x80) continue;  // UTF-8 continuation byte
    if (c >= 0x80) {
      const bool times = c == 0xC3 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x97;
      const bool dot = c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0xB7;
      w += times ? 0.84 : dot ? 0.32 : 0.6;
    } else if (c == ' ' || c == '.' || c == ',' || c == ':' || c == ';' || c == '|' || c == '!') {
      w += 0.32;
    } else if (c == 'i' || c == 'l' || c == 'j' || c == '\'') {
      w += 0.28;
    } else if (c == 'f' || c == 't' || c == 'r' || c == '(' || c == ')' || c == '[' || c == ']' || c == '-') {
      w += 0.4;
    } else if (c == 'm') {
      w += 0.97;
    } else if (c == 'w' || c == 'W' || c == 'M') {
      w += 0.86;
    } else if (c >= '0' && c <= '9') {
      w += 0.64;
    } else if (c == '=' || c == '+' || c == '<' || c == '>') {
      w += 0.84;
    } else if (c >= 'A' && c <= 'Z') {
      w += 0.7;
    } else {
      w += 0.6;
    }
  }
  return w * font;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string num2(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}

std::string marker_svg(double x, double y, const Marker& m) {
  const std::string fill = m.filled ? m.color : "#fff";
  std::string s;
  const std::string common = " fill=\"" + fill + "\" stroke=\"" + m.color + "\" stroke-width=\"" + num(m.stroke_width) +
                             "\"" + (m.opacity < 1 ? " opacity=\"" + num2(m.opacity) + "\"" : "") +
                             (m.extra.empty() ? "" : " " + m.extra);
  const double r = m.r;
  if (m.shape == "square") {
    s = "<rect x=\"" + num(x - r * 0.9) + "\" y=\"" + num(y - r * 0.9) + "\" width=\"" + num(r * 1.8) + "\" height=\"" +
        num(r * 1.8) + "\"" + common;
  } else if (m.shape == "diamond") {
    const double q = r * 1.25;
    s = "<path d=\"M" + num(x) + " " + num(y - q) + "L" + num(x + q) + " " + num(y) + "L" + num(x) + " " + num(y + q) +
        "L" + num(x - q) + " " + num(y) + "Z\"" + common;
  } else if (m.shape == "triangle") {
    const double q = r * 1.3;
    s = "<path d=\"M" + num(x) + " " + num(y - q) + "L" + num(x + q * 0.9) + " " + num(y + q * 0.6) + "L" +
        num(x - q * 0.9) + " " + num(y + q * 0.6) + "Z\"" + common;
  } else {
    s = "<circle cx=\"" + num(x) + "\" cy=\"" + num(y) + "\" r=\"" + num(r) + "\"" + common;
  }
  if (m.title.empty()) return s + "/>";
  return s + "><title>" + esc(m.title) + "</title></" +
         (m.shape == "square"   ? "rect"
          : m.shape == "circle" ? "circle"
                                : "path") +
         ">";
}

}  // namespace

Axis auto_axis(const std::vector<double>& values, bool log, const std::string& label, double pad) {
  Axis a;
  a.log = log;
  a.label = label;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : values) {
    if (!std::isfinite(v) || (log && v <= 0)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (!std::isfinite(lo)) {
    lo = log ? 0.1 : 0;
    hi = 1;
  }
  if (log) {
    double l0 = std::log10(lo), l1 = std::log10(hi);
    if (l1 - l0 < 0.4) {  // at least a factor 2.5, so ticks exist
      const double c = (l0 + l1) / 2;
      l0 = c - 0.2;
      l1 = c + 0.2;
    }
    const double p = (l1 - l0) * pad;
    a.lo = std::pow(10.0, l0 - p);
    a.hi = std::pow(10.0, l1 + p);
  } else {
    if (hi - lo < 1e-12) {
      lo -= 0.5;
      hi += 0.5;
    }
    const double p = (hi - lo) * pad;
    a.lo = lo - p;
    a.hi = hi + p;
  }
  return a;
}

Plot::Plot(double width, double height, Axis x, Axis y) : w_(width), h_(height), x_(std::move(x)), y_(std::move(y)) {}

double Plot::legend_height() const {
  if (legend_.empty()) return 0;
  double x = ml, rows = 1;
  for (const auto& it : legend_) {
    const double w = 22 + text_width(it.label, 11) + 14;
    if (x + w > w_ - mr && x > ml) {
      x = ml;
      rows += 1;
    }
    x += w;
  }
  return rows * 16 + 4;
}

double Plot::px(double x) const {
  const double a = ml, b = w_ - mr;
  if (x_.log) return a + (std::log10(x) - std::log10(x_.lo)) / (std::log10(x_.hi) - std::log10(x_.lo)) * (b - a);
  return a + (x - x_.lo) / (x_.hi - x_.lo) * (b - a);
}

double Plot::py(double y) const {
  const double top = mt + legend_height(), bottom = h_ - mb;
  if (y_.log)
    return bottom - (std::log10(y) - std::log10(y_.lo)) / (std::log10(y_.hi) - std::log10(y_.lo)) * (bottom - top);
  return bottom - (y - y_.lo) / (y_.hi - y_.lo) * (bottom - top);
}

bool Plot::in_x(double x) const {
  return std::isfinite(x) && (!x_.log || x > 0) && x >= x_.lo - 1e-12 * std::fabs(x_.lo) &&
         x <= x_.hi * (1 + 1e-12) + 1e-300;
}
bool Plot::in_y(double y) const {
  return std::isfinite(y) && (!y_.log || y > 0) && y >= y_.lo - 1e-12 * std::fabs(y_.lo) &&
         y <= y_.hi * (1 + 1e-12) + 1e-300;
}

void Plot::line(const std::vector<std::pair<double, double>>& pts, const std::string& color, double width,
                const std::string& dash, double opacity) {
  std::vector<std::pair<double, double>> p;
  for (const auto& q : pts)
    if (std::isfinite(q.first) && std::isfinite(q.second) && (!x_.log || q.first > 0) && (!y_.log || q.second > 0))
      p.push_back(q);
  if (p.size() < 2) return;
  draw_.push_back([this, p, color, width, dash, opacity](std::string& o) {
    o += "<polyline fill=\"none\" stroke=\"" + color + "\" stroke-width=\"" + num(width) +
         "\" stroke-linejoin=\"round\"";
    if (!dash.empty()) o += " stroke-dasharray=\"" + dash + "\"";
    if (opacity < 1) o += " stroke-opacity=\"" + num(opacity) + "\"";
    o += " points=\"";
    for (const auto& q : p) o += num(px(q.first)) + "," + num(py(q.second)) + " ";
    o += "\"/>\n";
  });
  // Segments are soft obstacles for labels.
  for (size_t i = 0; i + 1 < p.size(); ++i) segments_.push_back({p[i], p[i + 1]});
}

void Plot::marker(double x, double y, const Marker& m) {
  if (!in_x(x) || !in_y(y)) return;
  markers_.push_back({x, y, m});
  draw_.push_back([this, x, y, m](std::string& o) { o += marker_svg(px(x), py(y), m) + "\n"; });
}

void Plot::label(double x, double y, const std::string& text, const std::string& color, double avoid_r, bool bold) {
  if (!in_x(x) || !in_y(y)) return;
  labels_.push_back({x, y, avoid_r, text, color, bold});
}

void Plot::vline(double x, const std::string& color, const std::string& text, const std::string& dash) {
  if (!in_x(x)) return;
  vlines_.push_back({x, color, text, dash});
}

void Plot::hline(double y, const std::string& color, const std::string& text, const std::string& dash) {
  if (!in_y(y)) return;
  draw_.push_back([this, y, color, text, dash](std::string& o) {
    const double Y = py(y);
    o += "<line x1=\"" + num(ml) + "\" x2=\"" + num(w_ - mr) + "\" y1=\"" + num(Y) + "\" y2=\"" + num(Y) +
         "\" stroke=\"" + color + "\" stroke-width=\"1.2\" stroke-dasharray=\"" + dash + "\"/>\n";
    if (!text.empty())
      o += "<text class=\"lbl\" x=\"" + num(w_ - mr - 4) + "\" y=\"" + num(Y - 4) + "\" text-anchor=\"end\" fill=\"" +
           color + "\">" + esc(text) + "</text>\n";
  });
}

void Plot::bar(double x0, double x1, double y0, double y1, const std::string& color, const std::string& title) {
  draw_.push_back([this, x0, x1, y0, y1, color, title](std::string& o) {
    const double X0 = px(x0), X1 = px(x1), Y0 = py(y0), Y1 = py(y1);
    o += "<rect x=\"" + num(std::min(X0, X1)) + "\" y=\"" + num(std::min(Y0, Y1)) + "\" width=\"" +
         num(std::fabs(X1 - X0)) + "\" height=\"" + num(std::fabs(Y1 - Y0)) + "\" fill=\"" + color + "\" rx=\"1.5\">";
    if (!title.empty()) o += "<title>" + esc(title) + "</title>";
    o += "</rect>\n";
  });
}

void Plot::dots(const std::vector<std::pair<double, double>>& pts, const std::string& color, double r, double opacity) {
  draw_.push_back([this, pts, color, r, opacity](std::string& o) {
    o += "<g fill=\"" + color + "\" fill-opacity=\"" + num2(opacity) + "\">";
    const std::string rr = num(r);
    for (const auto& q : pts) {
      if (!in_x(q.first) || !in_y(q.second)) continue;
      o += "<circle cx=\"" + num(px(q.first)) + "\" cy=\"" + num(py(q.second)) + "\" r=\"" + rr + "\"/>";
    }
    o += "</g>\n";
  });
}

void Plot::text(double x, double y, const std::string& t, const std::string& color, const std::string& anchor,
                double dy, const std::string& cls) {
  overlay_.push_back([this, x, y, t, color, anchor, dy, cls](std::string& o) {
    o += "<text class=\"" + cls + "\" x=\"" + num(px(x)) + "\" y=\"" + num(py(y) + dy) + "\" text-anchor=\"" + anchor +
         "\" fill=\"" + color + "\">" + esc(t) + "</text>\n";
  });
}

void Plot::raw(const std::string& s) { raw_.push_back(s); }

void Plot::legend(const std::vector<LegendItem>& items) { legend_ = items; }

void Plot::category_ticks(const std::vector<std::pair<double, std::string>>& ticks) {
  category_ticks_ = ticks;
  categories_ = true;
}

namespace {
struct Box {
  double x0, y0, x1, y1;
};
double overlap(const Box& a, const Box& b) {
  const double w = std::min(a.x1, b.x1) - std::max(a.x0, b.x0), h = std::min(a.y1, b.y1) - std::max(a.y0, b.y0);
  return w > 0 && h > 0 ? w * h : 0;
}
}  // namespace

std::string Plot::build(const std::string& aria_label) const {
  const int id = g_clip_id.fetch_add(1);
  const double top = mt + legend_height(), bottom = h_ - mb, left = ml, right = w_ - mr;
  std::string o;
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" viewBox=\"0 0 " + num(w_) + " " + num(h_) +
       "\" width=\"" + num(w_) + "\" height=\"" + num(h_) + "\" role=\"img\" aria-label=\"" + esc(aria_label) + "\">\n";
  o += "<defs><clipPath id=\"clip" + std::to_string(id) + "\"><rect x=\"" + num(left) + "\" y=\"" + num(top) +
       "\" width=\"" + num(right - left) + "\" height=\"" + num(bottom - top) + "\"/></clipPath></defs>\n";
  o += "<rect class=\"area\" x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(right - left) +
       "\" height=\"" + num(bottom - top) + "\"/>\n";

  // Grid and ticks.
  const Ticks xt = x_.log ? log_ticks(x_.lo, x_.hi) : linear_ticks(x_.lo, x_.hi, x_.integer_ticks);
  const Ticks yt = y_.log ? log_ticks(y_.lo, y_.hi) : linear_ticks(y_.lo, y_.hi, y_.integer_ticks);
  for (double v : yt.minor)
    o += "<line class=\"grid minor\" x1=\"" + num(left) + "\" x2=\"" + num(right) + "\" y1=\"" + num(py(v)) +
         "\" y2=\"" + num(py(v)) + "\"/>\n";
  for (double v : yt.major) {
    o += "<line class=\"grid\" x1=\"" + num(left) + "\" x2=\"" + num(right) + "\" y1=\"" + num(py(v)) + "\" y2=\"" +
         num(py(v)) + "\"/>\n";
    o += "<text class=\"tick\" x=\"" + num(left - 5) + "\" y=\"" + num(py(v) + 3.5) + "\" text-anchor=\"end\">" +
         esc(tick_label(v)) + "</text>\n";
  }
  if (categories_) {
    for (const auto& [v, t] : category_ticks_)
      o += "<text class=\"tick\" x=\"" + num(px(v)) + "\" y=\"" + num(bottom + 14) + "\" text-anchor=\"middle\">" +
           esc(t) + "</text>\n";
  } else {
    for (double v : xt.minor)
      o += "<line class=\"grid minor\" y1=\"" + num(top) + "\" y2=\"" + num(bottom) + "\" x1=\"" + num(px(v)) +
           "\" x2=\"" + num(px(v)) + "\"/>\n";
    for (double v : xt.major) {
      o += "<line class=\"grid\" y1=\"" + num(top) + "\" y2=\"" + num(bottom) + "\" x1=\"" + num(px(v)) + "\" x2=\"" +
           num(px(v)) + "\"/>\n";
      o += "<text class=\"tick\" x=\"" + num(px(v)) + "\" y=\"" + num(bottom + 14) + "\" text-anchor=\"middle\">" +
           esc(tick_label(v)) + "</text>\n";
    }
  }
  o += "<rect class=\"frame\" x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(right - left) +
       "\" height=\"" + num(bottom - top) + "\"/>\n";
  o += "<text class=\"axlabel\" x=\"" + num((left + right) / 2) + "\" y=\"" + num(h_ - 8) +
       "\" text-anchor=\"middle\">" + esc(x_.label) + "</text>\n";
  o += "<text class=\"axlabel\" transform=\"translate(" + num(13) + " " + num((top + bottom) / 2) +
       ") rotate(-90)\" text-anchor=\"middle\">" + esc(y_.label) + "</text>\n";

  // Legend in the top margin.
  if (!legend_.empty()) {
    double x = left, y = mt + 8;
    for (const auto& it : legend_) {
      const double w = 22 + text_width(it.label, 11) + 14;
      if (x + w > right && x > left) {
        x = left;
        y += 16;
      }
      if (it.kind == "line" || it.kind == "dashed")
        o += "<line x1=\"" + num(x) + "\" x2=\"" + num(x + 16) + "\" y1=\"" + num(y) + "\" y2=\"" + num(y) +
             "\" stroke=\"" + it.color + "\" stroke-width=\"1.8\"" +
             (it.kind == "dashed" ? " stroke-dasharray=\"4 3\"" : "") + "/>";
      else if (it.kind == "bar")
        o += "<rect x=\"" + num(x + 3) + "\" y=\"" + num(y - 5) + "\" width=\"10\" height=\"10\" fill=\"" + it.color +
             "\"/>";
      else {
        Marker m;
        m.color = it.color;
        m.filled = it.kind != "hollow";
        m.shape = it.shape;
        m.r = 4;
        if (it.kind == "line+marker")
          o += "<line x1=\"" + num(x) + "\" x2=\"" + num(x + 16) + "\" y1=\"" + num(y) + "\" y2=\"" + num(y) +
               "\" stroke=\"" + it.color + "\" stroke-width=\"1.6\"/>";
        o += marker_svg(x + 8, y, m);
      }
      o += "<text class=\"legend\" x=\"" + num(x + 22) + "\" y=\"" + num(y + 4) + "\">" + esc(it.label) + "</text>\n";
      x += w;
    }
  }

  // Data, clipped to the plot area.
  o += "<g clip-path=\"url(#clip" + std::to_string(id) + ")\">\n";
  for (const auto& v : vlines_) {
    const double X = px(v.x);
    o += "<line x1=\"" + num(X) + "\" x2=\"" + num(X) + "\" y1=\"" + num(top) + "\" y2=\"" + num(bottom) +
         "\" stroke=\"" + v.color + "\" stroke-width=\"1.4\" stroke-dasharray=\"" + v.dash + "\"/>\n";
  }
  for (const auto& d : draw_) d(o);
  o += "</g>\n";

  // Labels: greedy placement avoiding markers, placed labels, lines and the frame.
  std::vector<Box> placed;
  for (const auto& v : vlines_) {
    if (v.text.empty()) continue;
    const double X = px(v.x), tw = text_width(v.text, 11);
    const bool room_right = X + 4 + tw < right - 2;
    const double x0 = room_right ? X + 4 : X - 4 - tw;
    o += "<text class=\"lbl\" x=\"" + num(room_right ? X + 4 : X - 4) + "\" y=\"" + num(top + 13) +
         "\" text-anchor=\"" + (room_right ? "start" : "end") + "\" fill=\"" + v.color + "\">" + esc(v.text) +
         "</text>\n";
    placed.push_back({x0, top + 3, x0 + tw, top + 16});
  }
  std::vector<Box> marks;
  for (const auto& m : markers_) {
    const double X = px(m.x), Y = py(m.y), r = m.m.r + 1.5;
    marks.push_back({X - r, Y - r, X + r, Y + r});
  }
  std::vector<Box> segs;  // sampled line points, small boxes; reference lines too
  for (const auto& v : vlines_) segs.push_back({px(v.x) - 1.5, top, px(v.x) + 1.5, bottom});
  for (const auto& s : segments_) {
    const double x0 = px(s.first.first), y0 = py(s.first.second), x1 = px(s.second.first), y1 = py(s.second.second);
    const int n = std::max(1, static_cast<int>(std::hypot(x1 - x0, y1 - y0) / 5));
    for (int i = 0; i <= n; ++i) {
      const double t = static_cast<double>(i) / n, X = x0 + t * (x1 - x0), Y = y0 + t * (y1 - y0);
      segs.push_back({X - 1.5, Y - 1.5, X + 1.5, Y + 1.5});
    }
  }
  for (const auto& L : labels_) {
    const double X = px(L.x), Y = py(L.y), font = 11, tw = text_width(L.text, font) * (L.bold ? 1.08 : 1), th = 11;
    const double g = L.r + 3;
    // Candidate boxes and the text anchor that pins the side next to the
    // point exactly, whatever the real text width turns out to be.
    struct Cand {
      double x0, y0;
      int anchor;  // 0 start (box right of the point), 1 end (left of it), 2 middle
    };
    const double d = g * 0.75;
    const std::vector<Cand> cands{
        {X + g, Y - th / 2, 0},          {X - g - tw, Y - th / 2, 1},     {X - tw / 2, Y - g - th, 2},
        {X - tw / 2, Y + g, 2},          {X + d, Y - d - th, 0},          {X + d, Y + d, 0},
        {X - d - tw, Y - d - th, 1},     {X - d - tw, Y + d, 1},          {X + 2 * g, Y - th / 2, 0},
        {X - 2 * g - tw, Y - th / 2, 1}, {X - tw / 2, Y - 2 * g - th, 2}, {X - tw / 2, Y + 2 * g, 2}};
    double best = std::numeric_limits<double>::infinity();
    Box chosen{};
    int anchor = 0;
    for (size_t i = 0; i < cands.size(); ++i) {
      const Box b{cands[i].x0, cands[i].y0, cands[i].x0 + tw, cands[i].y0 + th};
      double score = i * 0.5;  // prefer earlier positions
      if (b.x0 < left + 1 || b.x1 > right - 1 || b.y0 < top + 1 || b.y1 > bottom - 1) score += 1e5;
      for (const auto& p : placed) score += 50 * overlap(b, p);
      for (const auto& p : marks) score += 20 * overlap(b, p);
      for (const auto& p : segs) score += 4 * overlap(b, p);
      if (score < best) {
        best = score;
        chosen = b;
        anchor = cands[i].anchor;
      }
    }
    placed.push_back(chosen);
    const double tx = anchor == 0 ? chosen.x0 : anchor == 1 ? chosen.x1 : (chosen.x0 + chosen.x1) / 2;
    o += "<text class=\"lbl" + std::string(L.bold ? " bold" : "") + "\" x=\"" + num(tx) + "\" y=\"" +
         num(chosen.y1 - 2) + "\" text-anchor=\"" +
         (anchor == 0   ? "start"
          : anchor == 1 ? "end"
                        : "middle") +
         "\" fill=\"" + L.color + "\">" + esc(L.text) + "</text>\n";
  }
  for (const auto& f : overlay_) f(o);
  for (const auto& r : raw_) o += r;
  o += "</svg>";
  return o;
}

}  // namespace asap::svg
