// The SVG charts: points land where the axes say, ticks are round numbers,
// gaps break lines, text is escaped, and a chart without data says so. Every
// chart is checked to be well-formed XML.
#include "common/svg_chart.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

namespace endure::chart {
namespace {

using testing::ElementsAre;
using testing::HasSubstr;
using testing::Not;

// Whether `xml` is well-formed as far as these charts go: every element
// closed in order, every '&' an entity, no '<' inside a tag.
bool WellFormed(const std::string& xml, std::string* why) {
  std::vector<std::string> open;
  for (size_t i = 0; i < xml.size(); ++i) {
    if (xml[i] == '&') {
      static const std::regex kEntity("^&(amp|lt|gt|quot|#39|#[0-9]+);");
      if (!std::regex_search(xml.substr(i, 8), kEntity)) {
        *why = "bare & at " + std::to_string(i);
        return false;
      }
      continue;
    }
    if (xml[i] != '<') continue;
    const size_t end = xml.find('>', i);
    if (end == std::string::npos) {
      *why = "unterminated tag at " + std::to_string(i);
      return false;
    }
    const std::string tag = xml.substr(i + 1, end - i - 1);
    if (tag.find('<') != std::string::npos) {
      *why = "'<' inside tag " + tag;
      return false;
    }
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) {
        *why = "</" + tag.substr(1) + "> closes " + (open.empty() ? "nothing" : open.back());
        return false;
      }
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find_first_of(" \n")));
    }
    i = end;
  }
  if (!open.empty()) *why = "<" + open.back() + "> not closed";
  return open.empty();
}

#define EXPECT_WELL_FORMED(xml)                                 \
  do {                                                          \
    std::string why;                                            \
    EXPECT_TRUE(WellFormed(xml, &why)) << why << "\n" << (xml); \
  } while (0)

double Attr(const std::string& element, const std::string& name) {
  std::smatch m;
  const std::regex re(" " + name + "=\"([-0-9.]+)\"");
  EXPECT_TRUE(std::regex_search(element, m, re)) << name << " in " << element;
  return m.empty() ? NAN : std::atof(m[1].str().c_str());
}

std::vector<std::string> Elements(const std::string& svg, const std::string& pattern) {
  std::vector<std::string> out;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator();
       ++it) {
    out.push_back(it->str());
  }
  return out;
}

std::vector<std::pair<double, double>> Points(const std::string& polyline) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(polyline, m, std::regex(" points=\"([^\"]*)\"")));
  std::vector<std::pair<double, double>> out;
  const std::string text = m[1].str();
  const std::regex pair_re("([-0-9.]+),([-0-9.]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pair_re);
       it != std::sregex_iterator(); ++it) {
    out.emplace_back(std::atof((*it)[1].str().c_str()), std::atof((*it)[2].str().c_str()));
  }
  return out;
}

TEST(SvgChart, PolylineHasThePointsScaledIntoThePlot) {
  LineChart c;
  c.title = "ETTR";
  c.x_min = 0;
  c.x_max = 10;
  c.y_min = 0;
  c.y_max = 1;
  c.series.push_back({"ettr", {0, 5, 10}, {0, 0.5, 1}});
  const std::string svg = RenderLineChart(c);
  EXPECT_WELL_FORMED(svg);

  const std::vector<std::string> plot = Elements(svg, "<rect class=\"plot\"[^>]*>");
  ASSERT_EQ(plot.size(), 1u) << svg;
  const double left = Attr(plot[0], "x"), top = Attr(plot[0], "y");
  const double right = left + Attr(plot[0], "width"), bottom = top + Attr(plot[0], "height");
  EXPECT_GT(right - left, 500);
  EXPECT_GT(bottom - top, 150);

  const std::vector<std::string> lines = Elements(svg, "<polyline class=\"line\"[^>]*>");
  ASSERT_EQ(lines.size(), 1u) << svg;
  const auto points = Points(lines[0]);
  ASSERT_EQ(points.size(), 3u);
  // (0, 0) at the bottom left corner, (10, 1) at the top right, (5, 0.5) in the middle.
  EXPECT_NEAR(points[0].first, left, 0.06);
  EXPECT_NEAR(points[0].second, bottom, 0.06);
  EXPECT_NEAR(points[1].first, (left + right) / 2, 0.06);
  EXPECT_NEAR(points[1].second, (top + bottom) / 2, 0.06);
  EXPECT_NEAR(points[2].first, right, 0.06);
  EXPECT_NEAR(points[2].second, top, 0.06);
}

TEST(SvgChart, NonFinitePointsAreGapsAndTheAxesFollowTheData) {
  LineChart c;
  c.series.push_back({"loss", {0, 1, 2, 3, 4, 5}, {4, 3.5, NAN, 3, INFINITY, 2.6}});
  const std::string svg = RenderLineChart(c);
  EXPECT_WELL_FORMED(svg);
  const std::vector<std::string> lines = Elements(svg, "<polyline class=\"line\"[^>]*>");
  ASSERT_EQ(lines.size(), 3u) << svg;
  EXPECT_EQ(Points(lines[0]).size(), 2u);
  EXPECT_EQ(Points(lines[1]).size(), 1u);
  EXPECT_EQ(Points(lines[2]).size(), 1u);
  // The y axis is widened to round ticks around 2.6..4: 2.5 to 4.
  std::vector<std::string> labels;
  for (const std::string& t : Elements(svg, "<text class=\"tick y\"[^>]*>[^<]*")) {
    labels.push_back(t.substr(t.find('>') + 1));
  }
  EXPECT_THAT(labels, ElementsAre("2.5", "3.0", "3.5", "4.0"));
}

TEST(SvgChart, TicksAreRoundNumbers) {
  EXPECT_THAT(NiceTicks(0, 0.93), ElementsAre(0, 0.2, 0.4, 0.6, 0.8));
  EXPECT_THAT(NiceTicks(3, 97), ElementsAre(20, 40, 60, 80));
  EXPECT_THAT(NiceTicks(0, 10, 4), ElementsAre(0, 2.5, 5, 7.5, 10));
  EXPECT_THAT(NiceTicks(-1, 1), ElementsAre(-1, -0.5, 0, 0.5, 1));
  EXPECT_THAT(NiceTicks(0.0012, 0.0032), ElementsAre(0.0015, 0.002, 0.0025, 0.003));
  EXPECT_THAT(NiceTicks(100, 12500), ElementsAre(2500, 5000, 7500, 10000, 12500));
  EXPECT_THAT(NiceTicks(5, 5), ElementsAre(5));
  EXPECT_THAT(NiceTicks(NAN, 1), testing::SizeIs(1));

  EXPECT_EQ(TickLabel(0.6, 0.2), "0.6");
  EXPECT_EQ(TickLabel(7.5, 2.5), "7.5");
  EXPECT_EQ(TickLabel(0.0025, 0.0005), "0.0025");
  EXPECT_EQ(TickLabel(40, 20), "40");
  EXPECT_EQ(TickLabel(12500, 2500), "12.5k");
  EXPECT_EQ(TickLabel(3e6, 1e6), "3M");
  EXPECT_EQ(TickLabel(-1e-17, 0.5), "0.0");
}

TEST(SvgChart, EscapesText) {
  EXPECT_EQ(XmlEscape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
  // Control characters XML forbids and ill-formed UTF-8 become U+FFFD;
  // tab and newline stay, and so does valid UTF-8.
  EXPECT_EQ(XmlEscape(std::string("x\x01y\tz\n\xC3\xA9\xFF", 9)),
            "x\xEF\xBF\xBDy\tz\n\xC3\xA9\xEF\xBF\xBD");

  LineChart c;
  c.id = "a\"b<c>";
  c.title = "</svg><script>alert(1)</script>";
  c.x_label = "t & \"s\"";
  c.series.push_back({"<b>bold</b>", {0, 1}, {0, 1}, "red\"/><script"});
  c.markers.push_back({0.5, 0.5, "#1 <x>", "' onmouseover='x", "javascript:\"x\""});
  const std::string svg = RenderLineChart(c);
  EXPECT_WELL_FORMED(svg);
  EXPECT_THAT(svg, Not(HasSubstr("<script")));
  EXPECT_THAT(svg, Not(HasSubstr("<b>")));
  EXPECT_THAT(svg, HasSubstr("&lt;/svg&gt;&lt;script&gt;alert(1)&lt;/script&gt;"));
  EXPECT_THAT(svg, HasSubstr("t &amp; &quot;s&quot;"));
  EXPECT_THAT(svg, HasSubstr("clip-path=\"url(#abc-plot)\""));
  EXPECT_THAT(svg, HasSubstr("stroke=\"red&quot;/&gt;&lt;script\""));
  EXPECT_THAT(svg, HasSubstr("<title>&#39; onmouseover=&#39;x</title>"));

  BarChart bars;
  bars.title = "<i>";
  bars.bars.push_back({"a&b", 1, "<1>"});
  const std::string bar_svg = RenderBarChart(bars);
  EXPECT_WELL_FORMED(bar_svg);
  EXPECT_THAT(bar_svg, HasSubstr("a&amp;b"));
  EXPECT_THAT(bar_svg, Not(HasSubstr("<i>")));
}

TEST(SvgChart, EmptyDataGivesAChartSayingNoData) {
  LineChart none;
  none.title = "ETTR over time";
  const std::string svg = RenderLineChart(none);
  EXPECT_WELL_FORMED(svg);
  EXPECT_THAT(svg, HasSubstr(">no data</text>"));
  EXPECT_THAT(svg, HasSubstr("ETTR over time"));
  EXPECT_THAT(svg, Not(HasSubstr("<polyline")));

  LineChart gaps;
  gaps.series.push_back({"x", {0, 1}, {NAN, NAN}});
  gaps.series.push_back({"y", {}, {}});
  gaps.markers.push_back({0.5});
  EXPECT_THAT(RenderLineChart(gaps), HasSubstr(">no data</text>"));

  const std::string bars = RenderBarChart({});
  EXPECT_WELL_FORMED(bars);
  EXPECT_THAT(bars, HasSubstr(">no data</text>"));
}

TEST(SvgChart, StackedAreasAddUpAndMarkersAreDrawnInRange) {
  LineChart c;
  c.y_min = 0;
  c.y_max = 10;
  c.stacked.x = {0, 10};
  c.stacked.layers.push_back({"productive", {0, 6}});
  c.stacked.layers.push_back({"recovery", {0, NAN}});  // NaN counts as 0
  c.stacked.layers.push_back({"other", {0, 4}});
  c.markers.push_back({5, std::nullopt, "#1", "incident 1", "#incident-1", "#d62728"});
  c.markers.push_back({11, std::nullopt, "#2"});  // past the axis: not drawn
  const std::string svg = RenderLineChart(c);
  EXPECT_WELL_FORMED(svg);
  const std::vector<std::string> areas = Elements(svg, "<polygon class=\"area\"[^>]*>");
  ASSERT_EQ(areas.size(), 3u);
  const std::vector<std::string> plot = Elements(svg, "<rect class=\"plot\"[^>]*>");
  ASSERT_EQ(plot.size(), 1u);
  const double top = Attr(plot[0], "y"), bottom = top + Attr(plot[0], "height");
  // The top layer reaches 6 + 0 + 4 = 10, the top of the axis, at x = 10.
  const auto last = Points(areas[2]);
  ASSERT_EQ(last.size(), 4u);
  EXPECT_NEAR(last[1].second, top, 0.06);
  EXPECT_NEAR(Points(areas[0])[1].second, bottom - 0.6 * (bottom - top), 0.06);
  EXPECT_THAT(svg, HasSubstr(">productive</text>"));  // the legend

  const std::vector<std::string> markers = Elements(svg, "<g class=\"marker\">.*</g>");
  ASSERT_EQ(markers.size(), 1u) << svg;
  EXPECT_THAT(markers[0], HasSubstr("<a href=\"#incident-1\">"));
  EXPECT_THAT(markers[0], HasSubstr("<title>incident 1</title>"));
  EXPECT_THAT(markers[0], HasSubstr(">#1</text>"));

  c.label_markers = false;
  EXPECT_THAT(RenderLineChart(c), Not(HasSubstr(">#1</text>")));
}

TEST(SvgChart, AFlatSeriesGetsARangeThatKeepsAFixedEnd) {
  LineChart c;
  c.y_min = 0;
  c.series.push_back({"tokens/s", {0, 1, 2}, {0, 0, 0}});
  const std::string svg = RenderLineChart(c);
  EXPECT_WELL_FORMED(svg);
  std::vector<std::string> labels;
  for (const std::string& t : Elements(svg, "<text class=\"tick y\"[^>]*>[^<]*")) {
    labels.push_back(t.substr(t.find('>') + 1));
  }
  ASSERT_FALSE(labels.empty());
  EXPECT_EQ(labels.front(), "0.0");  // nothing below the fixed 0
  EXPECT_EQ(labels.back(), "2.0");
}

TEST(SvgChart, PointsWithErrorBarsAndBars) {
  LineChart c;
  Series sim{"simulated", {1, 2}, {0.8, 0.9}, "", LineStyle::kPoints};
  sim.y_low = {0.7, 0.85};
  sim.y_high = {0.9, 0.95};
  c.series.push_back(sim);
  const std::string svg = RenderLineChart(c);
  EXPECT_WELL_FORMED(svg);
  EXPECT_EQ(Elements(svg, "<circle class=\"point\"").size(), 2u);
  EXPECT_EQ(Elements(svg, "<line class=\"error-bar\"").size(), 2u);

  BarChart b;
  b.bars = {{"productive", 50, "50.0 s"}, {"recovery", 25, "25.0 s"}, {"other", NAN, "-"}};
  const std::string bars = RenderBarChart(b);
  EXPECT_WELL_FORMED(bars);
  std::vector<double> widths;
  for (const std::string& r : Elements(bars, "<rect x=[^>]*>")) widths.push_back(Attr(r, "width"));
  ASSERT_EQ(widths.size(), 3u);
  EXPECT_NEAR(widths[1], widths[0] / 2, 0.1);
  EXPECT_EQ(widths[2], 0);
}

}  // namespace
}  // namespace endure::chart
