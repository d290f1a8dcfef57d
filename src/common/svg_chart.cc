// SVG charts; see svg_chart.h.
#include "common/svg_chart.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

#include "common/utf8.h"

namespace endure::chart {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Pixel coordinates: a tenth of a pixel is finer than any screen shows.
std::string Px(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return std::string(buf) == "-0.0" ? "0.0" : buf;
}

// A rough width of `text` at the charts' 12px sans-serif, for layout only.
double TextWidth(std::string_view text) {
  size_t chars = 0;
  for (unsigned char c : text) chars += (c & 0xC0) != 0x80;  // count code points
  return 6.5 * static_cast<double>(chars);
}

bool Finite(double v) { return std::isfinite(v); }

std::string KeepIdChars(std::string_view id) {
  std::string out;
  for (char c : id) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') out += c;
  }
  return out.empty() ? "chart" : out;
}

// Hands out the palette's colours in turn to whatever did not choose one.
class Colors {
 public:
  std::string Next(const std::string& chosen) {
    if (!chosen.empty()) return chosen;
    return kPalette[next_++ % kPaletteSize];
  }

 private:
  size_t next_ = 0;
};

const char* DashArray(LineStyle style) {
  switch (style) {
    case LineStyle::kDashed:
      return "6,4";
    case LineStyle::kDotted:
      return "2,3";
    default:
      return "";
  }
}

// A range [lo, hi] that is not empty: a single value v becomes v +- 10%
// (+- 1 around zero), only upwards when the caller fixed the low end and
// only downwards when it fixed the high end.
void Widen(double& lo, double& hi, bool lo_fixed, bool hi_fixed) {
  if (hi > lo) return;
  const double half = lo == 0 ? 1 : std::fabs(lo) * 0.1;
  if (lo_fixed && !hi_fixed) {
    hi = lo + 2 * half;
  } else if (hi_fixed && !lo_fixed) {
    lo = hi - 2 * half;
  } else {
    lo -= half;
    hi += half;
  }
}

struct LegendEntry {
  std::string name;
  std::string color;
  LineStyle style;
  bool area;
};

// Lays the legend out in rows under the title; returns the height it takes.
double LegendHeight(const std::vector<LegendEntry>& entries, double left, double right) {
  if (entries.empty()) return 0;
  double x = left, rows = 1;
  for (const LegendEntry& e : entries) {
    const double w = 34 + TextWidth(e.name) + 14;
    if (x + w > right && x > left) {
      ++rows;
      x = left;
    }
    x += w;
  }
  return rows * 18;
}

void DrawLegend(const std::vector<LegendEntry>& entries, double left, double right, double top,
                std::string& s) {
  double x = left, y = top + 12;
  for (const LegendEntry& e : entries) {
    const double w = 34 + TextWidth(e.name) + 14;
    if (x + w > right && x > left) {
      y += 18;
      x = left;
    }
    s += "<g class=\"legend\">";
    if (e.area) {
      s += "<rect x=\"" + Px(x) + "\" y=\"" + Px(y - 9) + "\" width=\"26\" height=\"10\" fill=\"" +
           XmlEscape(e.color) + "\" fill-opacity=\"0.7\"/>";
    } else if (e.style == LineStyle::kPoints) {
      s += "<circle cx=\"" + Px(x + 13) + "\" cy=\"" + Px(y - 4) + "\" r=\"3\" fill=\"" +
           XmlEscape(e.color) + "\"/>";
    } else {
      s += "<line x1=\"" + Px(x) + "\" x2=\"" + Px(x + 26) + "\" y1=\"" + Px(y - 4) + "\" y2=\"" +
           Px(y - 4) + "\" stroke=\"" + XmlEscape(e.color) + "\" stroke-width=\"2\"";
      if (*DashArray(e.style) != '\0') {
        s += std::string(" stroke-dasharray=\"") + DashArray(e.style) + "\"";
      }
      s += "/>";
    }
    s +=
        "<text x=\"" + Px(x + 32) + "\" y=\"" + Px(y) + "\">" + XmlEscape(e.name) + "</text></g>\n";
    x += w;
  }
}

// The opening of a chart: the <svg> element of `width` x `height`, its
// title (for screen readers and as the heading drawn), a white ground.
std::string SvgHead(double width, double height, const std::string& title) {
  std::string s = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Px(width) +
                  "\" height=\"" + Px(height) + "\" viewBox=\"0 0 " + Px(width) + " " + Px(height) +
                  "\" font-family=\"sans-serif\" font-size=\"12\" role=\"img\">\n";
  if (!title.empty()) s += "<title>" + XmlEscape(title) + "</title>\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  if (!title.empty()) {
    s += "<text class=\"title\" x=\"" + Px(width / 2) +
         "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">" + XmlEscape(title) + "</text>\n";
  }
  return s;
}

std::string NoData(double width, double height, const std::string& title) {
  return SvgHead(width, height, title) + "<text class=\"no-data\" x=\"" + Px(width / 2) +
         "\" y=\"" + Px(height / 2 + 10) +
         "\" text-anchor=\"middle\" fill=\"#777\">no data</text>\n" + "</svg>\n";
}

}  // namespace

std::string XmlEscape(std::string_view text) {
  const std::string valid = SanitizeUtf8(text);
  std::string out;
  out.reserve(valid.size());
  for (size_t i = 0; i < valid.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(valid[i]);
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '\t':
      case '\n':
      case '\r':
        out += static_cast<char>(c);
        break;
      default:
        if (c < 0x20) {
          out += kReplacement;
        } else if (c == 0xEF && i + 2 < valid.size() && valid[i + 1] == '\xBF' &&
                   (valid[i + 2] == '\xBE' || valid[i + 2] == '\xBF')) {
          // U+FFFE and U+FFFF are valid UTF-8 but not XML characters.
          out += kReplacement;
          i += 2;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

std::vector<double> NiceTicks(double lo, double hi, int target) {
  if (!Finite(lo) || !Finite(hi) || hi <= lo) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const int exponent = static_cast<int>(std::floor(std::log10(raw)));
  const double mag = std::pow(10.0, exponent);
  double multiple = 10;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (raw <= m * mag * (1 + 1e-12)) {
      multiple = m;
      break;
    }
  }
  const double step = multiple * mag;
  if (!(step > 0) || !Finite(step)) return {lo};
  // k * multiple is exact, and one division (or multiplication) by an exact
  // power of ten rounds once: 0.6, not 0.6000000000000001.
  const double inverse = exponent < 0 ? std::pow(10.0, -exponent) : 0;
  auto tick = [&](long long k) {
    const double m = static_cast<double>(k) * multiple;
    const double t = exponent < 0 ? m / inverse : m * mag;
    return t == 0 ? 0.0 : t;  // no -0
  };
  const auto first = static_cast<long long>(std::ceil(lo / step - 1e-9));
  const auto last = static_cast<long long>(std::floor(hi / step + 1e-9));
  std::vector<double> ticks;
  for (long long k = first; k <= last && ticks.size() < 1000; ++k) ticks.push_back(tick(k));
  if (ticks.empty()) ticks.push_back(lo);
  return ticks;
}

std::string TickLabel(double value, double step) {
  double scale = 1;
  const char* suffix = "";
  if (std::fabs(step) >= 1e6) {
    scale = 1e6;
    suffix = "M";
  } else if (std::fabs(step) >= 1e3) {
    scale = 1e3;
    suffix = "k";
  }
  const double v = value / scale, s = std::fabs(step / scale);
  int decimals = 0;
  for (double shifted = s; decimals < 9; ++decimals, shifted *= 10) {
    if (std::fabs(shifted - std::round(shifted)) <= 1e-9 * std::max(1.0, shifted)) break;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string out = buf;
  if (out.find_first_not_of("-0.") == std::string::npos && out[0] == '-') out.erase(0, 1);
  return out + suffix;
}

std::string RenderLineChart(const LineChart& c) {
  const double width = std::max(c.width, 200), height = std::max(c.height, 120);
  const std::string id = KeepIdChars(c.id);

  // The data's extent: finite points of the series, the stacked layers'
  // running totals from 0.
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  bool any = false;
  auto see = [&](double x, double y) {
    if (!Finite(x) || !Finite(y)) return;
    any = true;
    x_lo = std::min(x_lo, x);
    x_hi = std::max(x_hi, x);
    y_lo = std::min(y_lo, y);
    y_hi = std::max(y_hi, y);
  };
  for (const Series& s : c.series) {
    const size_t n = std::min(s.x.size(), s.y.size());
    for (size_t i = 0; i < n; ++i) {
      see(s.x[i], s.y[i]);
      if (s.style == LineStyle::kPoints && Finite(s.y[i])) {
        if (i < s.y_low.size()) see(s.x[i], s.y_low[i]);
        if (i < s.y_high.size()) see(s.x[i], s.y_high[i]);
      }
    }
  }
  // Running totals of the stacked layers, per x.
  const size_t stacked_n = c.stacked.x.size();
  std::vector<std::vector<double>> tops;
  {
    std::vector<double> total(stacked_n, 0.0);
    for (const StackedLayer& layer : c.stacked.layers) {
      for (size_t i = 0; i < stacked_n; ++i) {
        const double v = i < layer.y.size() && Finite(layer.y[i]) ? layer.y[i] : 0.0;
        total[i] += v;
      }
      tops.push_back(total);
    }
    if (!c.stacked.layers.empty()) {
      for (size_t i = 0; i < stacked_n; ++i) {
        see(c.stacked.x[i], 0);
        see(c.stacked.x[i], total[i]);
      }
    }
  }
  if (!any) return NoData(width, height, c.title);

  x_lo = c.x_min.value_or(x_lo);
  x_hi = c.x_max.value_or(x_hi);
  Widen(x_lo, x_hi, c.x_min.has_value(), c.x_max.has_value());
  y_lo = c.y_min.value_or(y_lo);
  y_hi = c.y_max.value_or(y_hi);
  Widen(y_lo, y_hi, c.y_min.has_value(), c.y_max.has_value());
  std::vector<double> y_ticks = NiceTicks(y_lo, y_hi);
  if (y_ticks.size() >= 2) {
    // Let the axis end on ticks, unless the caller fixed that end.
    const double step = y_ticks[1] - y_ticks[0];
    if (!c.y_min) y_lo = std::floor(y_lo / step + 1e-9) * step;
    if (!c.y_max) y_hi = std::ceil(y_hi / step - 1e-9) * step;
    y_ticks = NiceTicks(y_lo, y_hi);
  }
  const std::vector<double> x_ticks = NiceTicks(x_lo, x_hi, std::max(2, int(width / 110)));

  // Layout: title, legend, plot; tick labels left and below.
  std::vector<LegendEntry> legend;
  {
    Colors colors;
    for (const StackedLayer& layer : c.stacked.layers) {
      const std::string color = colors.Next(layer.color);
      if (!layer.name.empty()) legend.push_back({layer.name, color, LineStyle::kSolid, true});
    }
    for (const Series& s : c.series) {
      const std::string color = colors.Next(s.color);
      if (!s.name.empty()) legend.push_back({s.name, color, s.style, false});
    }
  }
  const double left = 64, right = width - 16;
  const double legend_top = c.title.empty() ? 6 : 30;
  const double top = legend_top + LegendHeight(legend, left, right) + 8;
  const double bottom = height - (c.x_label.empty() ? 26 : 44);
  if (bottom - top < 40) return NoData(width, height, c.title);
  auto px = [&](double x) { return left + (x - x_lo) / (x_hi - x_lo) * (right - left); };
  auto py = [&](double y) { return bottom - (y - y_lo) / (y_hi - y_lo) * (bottom - top); };

  std::string s = SvgHead(width, height, c.title);
  DrawLegend(legend, left, right, legend_top, s);
  s += "<defs><clipPath id=\"" + id + "-plot\"><rect x=\"" + Px(left) + "\" y=\"" + Px(top) +
       "\" width=\"" + Px(right - left) + "\" height=\"" + Px(bottom - top) +
       "\"/></clipPath></defs>\n";

  // Grid and ticks.
  const double y_step = y_ticks.size() >= 2 ? y_ticks[1] - y_ticks[0] : 1;
  for (double t : y_ticks) {
    if (t < y_lo - 1e-9 * y_step || t > y_hi + 1e-9 * y_step) continue;
    s += "<line class=\"grid\" x1=\"" + Px(left) + "\" x2=\"" + Px(right) + "\" y1=\"" + Px(py(t)) +
         "\" y2=\"" + Px(py(t)) + "\" stroke=\"#e5e5e5\"/>";
    s += "<text class=\"tick y\" x=\"" + Px(left - 6) + "\" y=\"" + Px(py(t) + 4) +
         "\" text-anchor=\"end\">" + TickLabel(t, y_step) + "</text>\n";
  }
  const double x_step = x_ticks.size() >= 2 ? x_ticks[1] - x_ticks[0] : 1;
  for (double t : x_ticks) {
    if (t < x_lo - 1e-9 * x_step || t > x_hi + 1e-9 * x_step) continue;
    s += "<line x1=\"" + Px(px(t)) + "\" x2=\"" + Px(px(t)) + "\" y1=\"" + Px(bottom) + "\" y2=\"" +
         Px(bottom + 5) + "\" stroke=\"#333\"/>";
    s += "<text class=\"tick x\" x=\"" + Px(px(t)) + "\" y=\"" + Px(bottom + 18) +
         "\" text-anchor=\"middle\">" + TickLabel(t, x_step) + "</text>\n";
  }

  s += "<g clip-path=\"url(#" + id + "-plot)\">\n";
  // Stacked areas: each layer is the band between its running total and
  // the one below it.
  {
    Colors colors;
    for (size_t l = 0; l < c.stacked.layers.size(); ++l) {
      const std::string color = colors.Next(c.stacked.layers[l].color);
      std::string points;
      for (size_t i = 0; i < stacked_n; ++i) {
        if (!Finite(c.stacked.x[i])) continue;
        points += Px(px(c.stacked.x[i])) + "," + Px(py(tops[l][i])) + " ";
      }
      for (size_t i = stacked_n; i-- > 0;) {
        if (!Finite(c.stacked.x[i])) continue;
        points += Px(px(c.stacked.x[i])) + "," + Px(py(l == 0 ? 0.0 : tops[l - 1][i])) + " ";
      }
      if (points.empty()) continue;
      points.pop_back();
      s += "<polygon class=\"area\" fill=\"" + XmlEscape(color) +
           "\" fill-opacity=\"0.7\" stroke=\"none\" points=\"" + points + "\"><title>" +
           XmlEscape(c.stacked.layers[l].name) + "</title></polygon>\n";
    }
    // The series take the palette's colours after the layers'.
    for (const Series& series : c.series) {
      const std::string color = colors.Next(series.color);
      const size_t n = std::min(series.x.size(), series.y.size());
      if (series.style == LineStyle::kPoints) {
        for (size_t i = 0; i < n; ++i) {
          if (!Finite(series.x[i]) || !Finite(series.y[i])) continue;
          const std::string x = Px(px(series.x[i]));
          if (i < series.y_low.size() && i < series.y_high.size() && Finite(series.y_low[i]) &&
              Finite(series.y_high[i])) {
            s += "<line class=\"error-bar\" x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" +
                 Px(py(series.y_low[i])) + "\" y2=\"" + Px(py(series.y_high[i])) + "\" stroke=\"" +
                 XmlEscape(color) + "\"/>";
          }
          s += "<circle class=\"point\" cx=\"" + x + "\" cy=\"" + Px(py(series.y[i])) +
               "\" r=\"3\" fill=\"" + XmlEscape(color) + "\"/>\n";
        }
        continue;
      }
      // One polyline per run of finite points: a gap breaks the line.
      std::string points;
      auto flush = [&] {
        if (points.empty()) return;
        points.pop_back();
        s += "<polyline class=\"line\" fill=\"none\" stroke=\"" + XmlEscape(color) +
             "\" stroke-width=\"2\" stroke-linejoin=\"round\"";
        if (*DashArray(series.style) != '\0') {
          s += std::string(" stroke-dasharray=\"") + DashArray(series.style) + "\"";
        }
        s += " points=\"" + points + "\"/>\n";
        points.clear();
      };
      for (size_t i = 0; i < n; ++i) {
        if (!Finite(series.x[i]) || !Finite(series.y[i])) {
          flush();
          continue;
        }
        points += Px(px(series.x[i])) + "," + Px(py(series.y[i])) + " ";
      }
      flush();
    }
  }
  for (const Marker& m : c.markers) {
    if (!Finite(m.x) || m.x < x_lo || m.x > x_hi) continue;
    const std::string color = XmlEscape(m.color.empty() ? "#555" : m.color);
    const std::string x = Px(px(m.x));
    const std::string tooltip = XmlEscape(m.tooltip.empty() ? m.label : m.tooltip);
    s += "<g class=\"marker\">";
    if (!m.href.empty()) s += "<a href=\"" + XmlEscape(m.href) + "\">";
    if (!tooltip.empty()) s += "<title>" + tooltip + "</title>";
    s += "<line x1=\"" + x + "\" x2=\"" + x + "\" y1=\"" + Px(top) + "\" y2=\"" + Px(bottom) +
         "\" stroke=\"" + color + "\" stroke-dasharray=\"3,3\" stroke-width=\"1.5\"/>";
    if (m.y && Finite(*m.y)) {
      s += "<circle cx=\"" + x + "\" cy=\"" + Px(py(*m.y)) + "\" r=\"5\" fill=\"none\" stroke=\"" +
           color + "\" stroke-width=\"2\"/>";
    }
    if (c.label_markers && !m.label.empty()) {
      // Right of the line, unless that runs past the plot's edge.
      const bool flip = px(m.x) + 4 + TextWidth(m.label) > right;
      s += "<text x=\"" + Px(px(m.x) + (flip ? -4 : 4)) + "\" y=\"" + Px(top + 12) + "\" fill=\"" +
           color + "\"" + (flip ? " text-anchor=\"end\"" : "") + ">" + XmlEscape(m.label) +
           "</text>";
    }
    if (!m.href.empty()) s += "</a>";
    s += "</g>\n";
  }
  s += "</g>\n";

  // Frame and axis labels last, over the data.
  s += "<rect class=\"plot\" x=\"" + Px(left) + "\" y=\"" + Px(top) + "\" width=\"" +
       Px(right - left) + "\" height=\"" + Px(bottom - top) +
       "\" fill=\"none\" stroke=\"#999\"/>\n";
  if (!c.x_label.empty()) {
    s += "<text class=\"axis-label\" x=\"" + Px((left + right) / 2) + "\" y=\"" + Px(height - 8) +
         "\" text-anchor=\"middle\">" + XmlEscape(c.x_label) + "</text>\n";
  }
  if (!c.y_label.empty()) {
    s += "<text class=\"axis-label\" transform=\"translate(14," + Px((top + bottom) / 2) +
         ") rotate(-90)\" text-anchor=\"middle\">" + XmlEscape(c.y_label) + "</text>\n";
  }
  s += "</svg>\n";
  return s;
}

std::string RenderBarChart(const BarChart& c) {
  const double width = std::max(c.width, 200);
  if (c.bars.empty()) return NoData(width, 80, c.title);
  constexpr double kRow = 22;
  double label_w = 0, value_w = 0, max = c.max.value_or(0);
  std::vector<std::string> values;
  for (const Bar& b : c.bars) {
    label_w = std::max(label_w, TextWidth(b.label));
    std::string text = b.value_text;
    if (text.empty()) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.4g", b.value);
      text = buf;
    }
    value_w = std::max(value_w, TextWidth(text));
    values.push_back(std::move(text));
    if (!c.max && Finite(b.value)) max = std::max(max, b.value);
  }
  label_w = std::min(label_w + 12, width * 0.35);
  value_w = std::min(value_w + 12, width * 0.35);
  const double top = c.title.empty() ? 6 : 30;
  const double height = top + kRow * static_cast<double>(c.bars.size()) + 8;
  const double bar_left = label_w, bar_right = width - value_w;

  std::string s = SvgHead(width, height, c.title);
  Colors colors;
  for (size_t i = 0; i < c.bars.size(); ++i) {
    const Bar& b = c.bars[i];
    const std::string color = colors.Next(b.color);
    const double y = top + kRow * static_cast<double>(i);
    const double v = Finite(b.value) && b.value > 0 ? b.value : 0;
    const double w = max > 0 ? std::min(v / max, 1.0) * (bar_right - bar_left) : 0;
    s += "<g class=\"bar\"><title>" + XmlEscape(b.label) + ": " + XmlEscape(values[i]) + "</title>";
    s += "<text x=\"" + Px(bar_left - 6) + "\" y=\"" + Px(y + 15) + "\" text-anchor=\"end\">" +
         XmlEscape(b.label) + "</text>";
    s += "<rect x=\"" + Px(bar_left) + "\" y=\"" + Px(y + 4) + "\" width=\"" + Px(w) +
         "\" height=\"" + Px(kRow - 8) + "\" fill=\"" + XmlEscape(color) + "\"/>";
    s += "<text x=\"" + Px(bar_left + w + 6) + "\" y=\"" + Px(y + 15) + "\">" +
         XmlEscape(values[i]) + "</text></g>\n";
  }
  s += "</svg>\n";
  return s;
}

}  // namespace endure::chart
