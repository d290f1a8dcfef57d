// Small charts as standalone SVG, for reports people open in a browser
// (`endure report --html`, `endure sim --sweep --svg`): line charts with
// gaps, stacked areas, point series with error bars, vertical markers, axes
// with round-numbered ticks, a legend; and horizontal bar charts. No script,
// no external reference: the text can be written to a .svg file or inlined
// in an HTML page. Every caller-given string is XML-escaped, so text from
// logs or users cannot break out of the element it is in.
//
// All functions are pure and thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace endure::chart {

// `text` made safe for XML content and double- or single-quoted attribute
// values: & < > " ' as entities, ill-formed UTF-8 and the control characters
// XML 1.0 forbids (all below U+0020 but tab, newline and carriage return)
// replaced by U+FFFD.
std::string XmlEscape(std::string_view text);

// About `target` tick positions covering [lo, hi], at round numbers: a step
// of 1, 2, 2.5 or 5 times a power of ten, every tick a multiple of it. One
// tick (lo) when hi <= lo or either is not finite.
std::vector<double> NiceTicks(double lo, double hi, int target = 5);

// A tick's label: with as many decimals as `step` needs ("0.25", "40"),
// and thousands or millions as "k" or "M" when the step is that large
// ("12.5k").
std::string TickLabel(double value, double step);

enum class LineStyle { kSolid, kDashed, kDotted, kPoints };

// One series of (x, y). A point whose x or y is not finite (NaN for a JSON
// null) is a gap: the line stops before it and starts again after it.
struct Series {
  std::string name;  // in the legend; empty: not listed
  std::vector<double> x;
  std::vector<double> y;  // as long as x (extra values on either are ignored)
  std::string color;      // a CSS colour; empty: the next of the palette
  LineStyle style = LineStyle::kSolid;
  // kPoints only, optional: an error bar per point from y_low to y_high
  // (each as long as y, or empty).
  std::vector<double> y_low, y_high;
};

// Layers stacked bottom-up over one x axis (e.g. the ledger's categories
// over time); a value that is not finite counts as 0.
struct StackedLayer {
  std::string name;
  std::vector<double> y;  // as long as StackedAreas::x
  std::string color;      // empty: the next of the palette
};
struct StackedAreas {
  std::vector<double> x;
  std::vector<StackedLayer> layers;
};

// A vertical line across the plot at x (an incident, an optimum), with an
// optional point on it. Markers outside the x range are not drawn.
struct Marker {
  double x = 0;
  std::optional<double> y;  // a ring at (x, y)
  std::string label;        // drawn at the top of the line when labels are on; a tooltip always
  std::string tooltip;      // a longer hover text; empty: the label
  std::string href;         // a link for the line (e.g. "#incident-3"); empty: none
  std::string color;        // empty: grey
};

struct LineChart {
  // Unique among the charts of one page: it names the chart's clip path.
  // Letters, digits, '-' and '_' are kept, anything else dropped.
  std::string id = "chart";
  std::string title;
  std::string x_label;
  std::string y_label;
  int width = 720;
  int height = 320;
  // The axes' ranges; by default the data's extent (markers not counted),
  // the y axis widened to round ticks. Data outside is clipped.
  std::optional<double> x_min, x_max, y_min, y_max;
  std::vector<Series> series;
  StackedAreas stacked;  // drawn below the series
  std::vector<Marker> markers;
  bool label_markers = true;  // false: markers' labels only as tooltips (many markers)
};

// The chart as one <svg> element (with xmlns, so that it is also a valid
// standalone file). With no finite point in any series or layer it is the
// frame, the title and "no data".
std::string RenderLineChart(const LineChart& chart);

struct Bar {
  std::string label;
  double value = 0;        // not finite or negative: an empty bar
  std::string value_text;  // shown after the bar; empty: the value
  std::string color;       // empty: the next of the palette
};

// Horizontal bars, one row each, scaled to the largest value (or `max`).
struct BarChart {
  std::string title;
  std::vector<Bar> bars;
  std::optional<double> max;
  int width = 720;
};

// As one <svg> element; with no bars, the title and "no data".
std::string RenderBarChart(const BarChart& chart);

}  // namespace endure::chart
