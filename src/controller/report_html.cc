// The HTML report; see report_html.h. The page is also well-formed XML
// (every element closed, only XML's entities, no '<' or '&' in the CSS), so
// that tests and tools can parse it with any XML parser.
#include "controller/report_html.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "common/duration.h"
#include "common/svg_chart.h"
#include "controller/report.h"

namespace endure::controller {
namespace {

using Json = nlohmann::json;
using chart::XmlEscape;

constexpr int kChartWidth = 960;
// Above this many incidents the ETTR chart labels none of its markers (each
// keeps its tooltip and link): the labels would overlap.
constexpr size_t kLabelledMarkers = 20;

struct Category {
  const char* key;
  const char* label;
  const char* color;
};
constexpr Category kCategories[] = {{"productive", "productive", "#2ca02c"},
                                    {"checkpoint_stall", "checkpoint stall", "#bcbd22"},
                                    {"detection", "detection", "#ff7f0e"},
                                    {"recovery", "recovery", "#d62728"},
                                    {"recompute", "recompute", "#9467bd"},
                                    {"startup", "startup", "#1f77b4"},
                                    {"other", "other", "#7f7f7f"}};

// Member `key` of `j`, or null when `j` is not an object or lacks it.
const Json& At(const Json& j, const char* key) {
  static const Json kNull;
  if (!j.is_object()) return kNull;
  auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

double Number(const Json& v, double otherwise = NAN) {
  return v.is_number() ? v.get<double>() : otherwise;
}

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

// A JSON value as text, not escaped: strings as they are, integers
// exactly, other numbers to 6 significant digits, null and the rest as "-".
std::string Raw(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v.get<double>());
    return buf;
  }
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  return "-";
}

// The same, escaped for the page.
std::string Text(const Json& v) { return XmlEscape(Raw(v)); }

// Seconds as the text report shows them: milliseconds for the short
// figures detection and recovery are about.
std::string Secs(const Json& v) {
  if (!v.is_number() || !std::isfinite(v.get<double>())) return "-";
  const double s = v.get<double>();
  return Fixed(s, std::fabs(s) < 100 ? 3 : 1) + "s";
}

// Seconds, and the same in hours or days where that reads better.
std::string LongSecs(double s) {
  if (!std::isfinite(s)) return "-";
  std::string out = Secs(Json(s));
  if (s >= 120) out += " (" + FormatDuration(FromSeconds(s)) + ")";
  return out;
}

// A column of the history: numbers, and NaN for null (a gap).
std::vector<double> Column(const Json& values, double scale = 1) {
  std::vector<double> out;
  if (!values.is_array()) return out;
  out.reserve(values.size());
  for (const Json& v : values) out.push_back(Number(v) / scale);
  return out;
}

// The unit the time axes use: one in which the run lasts a readable number.
struct TimeUnit {
  double seconds;
  const char* name;
};
TimeUnit UnitFor(double max_s) {
  if (max_s >= 4 * 86400) return {86400, "days"};
  if (max_s >= 4 * 3600) return {3600, "hours"};
  if (max_s >= 600) return {60, "minutes"};
  return {1, "seconds"};
}

constexpr const char* kStyle = R"(
body { font-family: sans-serif; margin: 24px auto; max-width: 1100px; color: #222; padding: 0 12px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.verdict { margin: 4px 0; }
.warning { background: #fff4e5; border-left: 4px solid #ff7f0e; padding: 6px 10px; }
.figures { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }
.figure { border: 1px solid #ddd; border-radius: 6px; padding: 8px 14px; min-width: 110px; }
.figure .label { font-size: 12px; color: #666; }
.figure .value { font-size: 24px; font-weight: bold; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border-bottom: 1px solid #eee; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f6f6f6; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.detail td { border-bottom: 1px solid #ccc; color: #444; padding-bottom: 8px; }
tr.current td { font-weight: bold; }
pre { background: #f6f6f6; padding: 6px; overflow-x: auto; font-size: 12px; white-space: pre-wrap; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
svg { display: block; margin: 8px 0; max-width: 100%; height: auto; }
.muted { color: #777; }
)";

void Figure(std::string& out, const std::string& label, const std::string& value_html) {
  out += "<div class=\"figure\"><div class=\"label\">" + label + "</div><div class=\"value\">" +
         value_html + "</div></div>\n";
}

void Header(const Json& r, std::string& out) {
  const std::string job = Text(At(r, "job"));
  out += "<h1>Job <span id=\"job\">" + job + "</span>: " + XmlEscape(ReportOutcome(r));
  if (At(r, "exit_code").is_number_integer()) {
    out += " (exit " + std::to_string(At(r, "exit_code").get<int>()) + ")";
  }
  out += "</h1>\n";
  if (At(r, "verdict").is_string())
    out += "<p class=\"verdict\">" + Text(At(r, "verdict")) + "</p>\n";
  if (At(r, "warnings").is_array()) {
    for (const Json& w : At(r, "warnings")) {
      out += "<p class=\"verdict warning\">warning: " + Text(w) + "</p>\n";
    }
  }
  if (At(r, "final").is_boolean() && !At(r, "final").get<bool>()) {
    out +=
        "<p class=\"warning\">Not a final report: the job is still running, or its controller "
        "stopped before writing one. The figures are as last saved.</p>\n";
  }

  // The headline figures. The ETTR element carries the report's number
  // exactly as report.json has it.
  out += "<div class=\"figures\">\n";
  const Json& ettr = At(r, "ettr");
  Figure(out, "ETTR (productive / wall)",
         "<data id=\"ettr\" value=\"" + XmlEscape(ettr.is_number() ? ettr.dump() : "") + "\">" +
             (ettr.is_number() ? Fixed(ettr.get<double>(), 3) : "-") + "</data>");
  const double wall = Number(At(r, "wall_s"));
  Figure(out, "wall time",
         std::isfinite(wall) ? XmlEscape(FormatDuration(FromSeconds(wall))) : "-");
  Figure(out, "incidents",
         At(r, "incidents").is_array() ? std::to_string(At(r, "incidents").size()) : "-");
  int64_t steps_lost = 0;
  for (const Json& inc : At(r, "incidents").is_array() ? At(r, "incidents") : Json::array()) {
    if (At(inc, "steps_lost").is_number_integer())
      steps_lost += At(inc, "steps_lost").get<int64_t>();
  }
  Figure(out, "steps lost", std::to_string(steps_lost));
  Figure(out, "steps", Text(At(r, "steps")));
  Figure(out, "generations", Text(At(r, "generations")));
  out += "</div>\n";

  // The facts that do not need a chart.
  out += "<table class=\"facts\">\n";
  auto fact = [&](const char* label, const std::string& html) {
    if (html.empty() || html == "-") return;
    out += "<tr><th>" + std::string(label) + "</th><td>" + html + "</td></tr>\n";
  };
  fact("run", Text(At(r, "run")));
  fact("last loss", Text(At(r, "last_loss")));
  fact("checkpoints", Text(At(r, "checkpoints")));
  fact("parameter fingerprint", Text(At(r, "param_fingerprint")));
  fact("anomaly mode", Text(At(r, "anomaly_mode")));
  if (At(r, "nodes").is_array() && !At(r, "nodes").empty()) {
    std::string nodes;
    for (const Json& n : At(r, "nodes")) nodes += (nodes.empty() ? "" : ", ") + Text(n);
    fact("nodes", std::to_string(At(r, "nodes").size()) + ": " + nodes);
  }
  if (At(r, "refused_nodes").is_object()) {
    std::string refused;
    for (const auto& [name, why] : At(r, "refused_nodes").items()) {
      refused += (refused.empty() ? "" : "<br/>") + XmlEscape(name) + ": " + Text(why);
    }
    fact("refused nodes", refused);
  }
  const Json& c = At(r, "checkpoint");
  if (c.is_object()) {
    auto mb = [&](const char* key) { return Fixed(Number(At(c, key), 0) / (1 << 20), 1) + " MB"; };
    fact("durable checkpoints", Text(At(c, "durable_commits")) + " commits, newest step " +
                                    Text(At(c, "newest_durable_step")) + ", persist failures " +
                                    Text(At(c, "persist_failures")));
    fact("checkpoint memory",
         "peak T0 " + mb("peak_t0_bytes") + ", T1 " + mb("peak_t1_bytes") + " of budget " +
             (Number(At(c, "memory_budget_bytes"), 0) > 0 ? mb("memory_budget_bytes")
                                                          : std::string("unlimited")));
  }
  out += "</table>\n";
}

void Ledger(const Json& r, std::string& out) {
  out += "<h2 id=\"ledger\">Where the wall time went</h2>\n";
  const Json& ledger = At(r, "ledger_s");
  const Json& recovery = At(r, "recovery_s");
  const double wall = Number(At(r, "wall_s"), 0);
  auto share = [&](double s) { return wall > 0 ? Fixed(100.0 * s / wall, 1) + "%" : "-"; };
  out +=
      "<table class=\"ledger\">\n<tr><th>category</th><th class=\"n\">seconds</th>"
      "<th class=\"n\">share</th></tr>\n";
  out += "<tr><td>wall</td><td class=\"n\">" + Secs(Json(wall)) + "</td><td class=\"n\">" +
         share(wall) + "</td></tr>\n";
  chart::BarChart bars;
  bars.width = kChartWidth;
  bars.title = "Wall time by category";
  bars.max = wall > 0 ? std::optional<double>(wall) : std::nullopt;
  for (const Category& cat : kCategories) {
    const double s = Number(At(ledger, cat.key), 0);
    out += "<tr><td><span class=\"swatch\" style=\"background: " + std::string(cat.color) +
           "\"></span>" + cat.label + "</td><td class=\"n\">" + Secs(Json(s)) +
           "</td><td class=\"n\">" + share(s) + "</td></tr>\n";
    if (std::string_view(cat.key) == "recovery") {
      for (const char* part : {"teardown", "wait", "relaunch", "restore"}) {
        out += "<tr><td>&#160;&#160;&#160;&#160;" + std::string(part) + "</td><td class=\"n\">" +
               Secs(At(recovery, part)) + "</td><td></td></tr>\n";
      }
    }
    bars.bars.push_back({cat.label, s, Secs(Json(s)) + " (" + share(s) + ")", cat.color});
  }
  out += "</table>\n";
  out += chart::RenderBarChart(bars);
}

// The text of an incident's marker tooltip.
std::string IncidentSummary(const Json& inc) {
  std::string s = "incident " + Raw(At(inc, "id")) + ": ";
  s += At(inc, "cause").is_string() ? At(inc, "cause").get<std::string>() : "-";
  if (At(inc, "node").is_string() && !At(inc, "node").get<std::string>().empty()) {
    s += " on " + At(inc, "node").get<std::string>();
  }
  if (At(inc, "rank").is_number_integer() && At(inc, "rank").get<int64_t>() >= 0) {
    s += ", rank " + At(inc, "rank").dump();
  }
  if (At(inc, "route").is_string()) s += ", route " + At(inc, "route").get<std::string>();
  if (At(inc, "recovered_after_s").is_number()) {
    s += ", recovered after " + Secs(At(inc, "recovered_after_s"));
  }
  return s;  // the chart escapes it
}

// Where an incident goes on a time axis: its fault, else its detection.
double IncidentTime(const Json& inc) {
  const double fault = Number(At(inc, "fault_at_s"));
  return std::isfinite(fault) ? fault : Number(At(inc, "detected_at_s"));
}

std::string IncidentAnchor(const Json& inc) {
  const Json& id = At(inc, "id");
  return "incident-" + Raw(id);  // not escaped
}

void History(const Json& r, std::string& out) {
  out += "<h2 id=\"history\">Over time</h2>\n";
  const Json& h = At(r, "history");
  const Json& t = At(h, "t_s");
  if (!t.is_array() || t.empty()) {
    out +=
        "<p class=\"muted\" id=\"no-history\">no history recorded (a state directory from "
        "before the history was kept, or a run that ended before its first sample)</p>\n";
    return;
  }
  const std::vector<double> t_s = Column(t);
  double max_t = 0;
  for (double v : t_s) {
    if (std::isfinite(v)) max_t = std::max(max_t, v);
  }
  const Json& incidents = At(r, "incidents").is_array() ? At(r, "incidents") : Json::array();
  for (const Json& inc : incidents) {
    const double at = IncidentTime(inc);
    if (std::isfinite(at)) max_t = std::max(max_t, at);
  }
  const TimeUnit unit = UnitFor(max_t);
  const std::vector<double> x = Column(t, unit.seconds);
  const std::string x_label = std::string("time since the run started (") + unit.name + ")";

  std::vector<chart::Marker> markers;
  for (const Json& inc : incidents) {
    const double at = IncidentTime(inc);
    if (!std::isfinite(at)) continue;
    markers.push_back({at / unit.seconds, std::nullopt, "#" + Raw(At(inc, "id")),
                       IncidentSummary(inc), "#" + IncidentAnchor(inc), "#d62728"});
  }
  const bool label = markers.size() <= kLabelledMarkers;
  auto line_chart = [&](const char* id, const char* title, const char* y_label) {
    chart::LineChart c;
    c.id = id;
    c.title = title;
    c.x_label = x_label;
    c.y_label = y_label;
    c.width = kChartWidth;
    c.height = 300;
    c.x_min = 0;
    c.x_max = max_t > 0 ? max_t / unit.seconds : 1;
    c.label_markers = label;
    return c;
  };

  chart::LineChart ettr = line_chart("ettr-chart", "ETTR over the run (incidents marked)", "ETTR");
  ettr.y_min = 0;
  ettr.y_max = 1;
  ettr.series.push_back({"ETTR so far", x, Column(At(h, "ettr")), "#2ca02c"});
  ettr.markers = markers;
  out += chart::RenderLineChart(ettr);

  chart::LineChart ledger =
      line_chart("ledger-chart", "Wall time by category, cumulative", unit.name);
  ledger.y_min = 0;
  ledger.stacked.x = x;
  const Json& ledger_s = At(h, "ledger_s");
  for (const Category& cat : kCategories) {
    if (!At(ledger_s, cat.key).is_array()) continue;
    ledger.stacked.layers.push_back(
        {cat.label, Column(At(ledger_s, cat.key), unit.seconds), cat.color});
  }
  if (ledger_s.is_object()) {
    // Categories this page does not know (a newer controller's), after the known ones.
    for (const auto& item : ledger_s.items()) {
      // Named, not bound: clang 14 (the fuzz build) captures no structured binding.
      const std::string& name = item.key();
      const Json& values = item.value();
      const bool known = std::any_of(std::begin(kCategories), std::end(kCategories),
                                     [&](const Category& cat) { return name == cat.key; });
      if (!known && values.is_array()) {
        ledger.stacked.layers.push_back({name, Column(values, unit.seconds), ""});
      }
    }
  }
  out += chart::RenderLineChart(ledger);

  if (At(h, "loss").is_array()) {
    chart::LineChart loss = line_chart("loss-chart", "Loss (rank 0)", "loss");
    loss.series.push_back({"loss", x, Column(At(h, "loss")), "#1f77b4"});
    loss.markers = markers;
    loss.label_markers = false;
    out += chart::RenderLineChart(loss);
  }
  // A trainer that reports no token counts leaves the column at 0.
  const std::vector<double> tokens_per_s = Column(At(h, "tokens_per_s"));
  if (std::none_of(tokens_per_s.begin(), tokens_per_s.end(), [](double v) { return v > 0; })) {
    out += "<p class=\"muted\">no throughput reported (the trainer sends no token counts)</p>\n";
  } else {
    chart::LineChart tokens = line_chart("tokens-chart", "Throughput", "tokens/s");
    tokens.y_min = 0;
    tokens.series.push_back({"tokens/s", x, tokens_per_s, "#9467bd"});
    tokens.markers = markers;
    tokens.label_markers = false;
    out += chart::RenderLineChart(tokens);
  }
}

void Incidents(const Json& r, std::string& out) {
  const Json& incidents = At(r, "incidents").is_array() ? At(r, "incidents") : Json::array();
  out += "<h2 id=\"incidents\">Incidents: " + std::to_string(incidents.size()) + "</h2>\n";
  if (incidents.empty()) {
    out += "<p class=\"muted\">none</p>\n";
    return;
  }
  out +=
      "<p class=\"muted\">Times in seconds. Recovered after = detected after + teardown + wait + "
      "relaunch + restore (docs/report.md).</p>\n";
  out += "<table class=\"incidents\">\n<tr>";
  constexpr const char* kHeads[] = {
      "id",       "gen.",  "at",       "cause",          "rank",
      "node",     "route", "action",   "detected after", "recovered after",
      "teardown", "wait",  "relaunch", "restore",        "steps lost"};
  constexpr int kColumns = sizeof(kHeads) / sizeof(kHeads[0]);
  for (const char* head : kHeads) out += "<th>" + std::string(head) + "</th>";
  out += "</tr>\n";
  for (const Json& inc : incidents) {
    auto num = [&](const std::string& html) { return "<td class=\"n\">" + html + "</td>"; };
    auto txt = [&](const std::string& html) { return "<td>" + html + "</td>"; };
    const Json& rank = At(inc, "rank");
    out += "<tr class=\"incident\" id=\"" + XmlEscape(IncidentAnchor(inc)) + "\">";
    out += num(Text(At(inc, "id"))) + num(Text(At(inc, "generation"))) +
           num(Secs(Json(IncidentTime(inc)))) +
           txt("<b class=\"cause\">" + Text(At(inc, "cause")) + "</b>") +
           num(rank.is_number_integer() && rank.get<int64_t>() < 0 ? "-" : Text(rank)) +
           txt(Text(At(inc, "node"))) + txt(Text(At(inc, "route"))) + txt(Text(At(inc, "action"))) +
           num(Secs(At(inc, "detected_after_s"))) + num(Secs(At(inc, "recovered_after_s"))) +
           num(Secs(At(inc, "teardown_s"))) + num(Secs(At(inc, "wait_s"))) +
           num(Secs(At(inc, "relaunch_s"))) + num(Secs(At(inc, "restore_s"))) +
           num(Text(At(inc, "steps_lost")));
    out += "</tr>\n";

    // The words: why, how it came back, what it is like.
    out += "<tr class=\"detail\"><td></td><td colspan=\"" + std::to_string(kColumns - 1) + "\">";
    out += "<div class=\"reason\"><b>reason:</b> " + Text(At(inc, "reason")) + "</div>";
    auto line = [&](const char* label, const Json& v) {
      const std::string text = Text(v);
      if (text.empty() || text == "-") return;
      out += "<div><b>" + std::string(label) + ":</b> " + text + "</div>";
    };
    line("route", At(inc, "route_reason"));
    line("restore", At(inc, "restore"));
    if (At(inc, "failed_at_step").is_number() || At(inc, "restored_step").is_number()) {
      out += "<div><b>steps:</b> failed at " + Text(At(inc, "failed_at_step")) + ", restored " +
             Text(At(inc, "restored_step")) + "</div>";
    }
    if (At(inc, "suspects").is_array() && !At(inc, "suspects").empty()) {
      std::string suspects;
      for (const Json& s : At(inc, "suspects"))
        suspects += (suspects.empty() ? "" : ", ") + Text(s);
      out += "<div><b>suspects:</b> " + suspects + "</div>";
    }
    const Json& recurrence = At(inc, "recurrence");
    if (recurrence.is_object()) {
      out += "<div class=\"recurrence\"><b>knowledge base:</b> incident " +
             Text(At(recurrence, "kb_id"));
      const Json& similar = At(recurrence, "similar");
      if (similar.is_array() && !similar.empty()) {
        out += "; seen before:<ul>";
        for (const Json& s : similar) {
          out += "<li>like " + Text(At(s, "job")) + " incident " + Text(At(s, "incident")) +
                 " (kb " + Text(At(s, "kb_id")) + ", score " + Fixed(Number(At(s, "score"), 0), 2) +
                 ", cause " + Text(At(s, "cause")) + "): " + Text(At(s, "resolution"));
          if (At(s, "resolved_by_operator").is_boolean() &&
              At(s, "resolved_by_operator").get<bool>()) {
            out += " by an operator";
          }
          if (At(s, "note").is_string() && !At(s, "note").get<std::string>().empty()) {
            out += ": " + Text(At(s, "note"));
          }
          out += "</li>";
        }
        out += "</ul>";
      } else {
        out += "; nothing like it before";
      }
      out += "</div>";
    }
    if (At(inc, "log_line").is_string() && !At(inc, "log_line").get<std::string>().empty()) {
      out += "<div><b>log:</b></div><pre class=\"log\">" + Text(At(inc, "log_line")) + "</pre>";
    }
    if (At(inc, "stacks").is_array() && !At(inc, "stacks").empty()) {
      out +=
          "<details><summary>stacks (" + std::to_string(At(inc, "stacks").size()) + ")</summary>";
      for (const Json& stack : At(inc, "stacks")) out += "<pre>" + Text(stack) + "</pre>";
      out += "</details>";
    }
    out += "</td></tr>\n";
  }
  out += "</table>\n";
}

// Stragglers kept, resizes and data anomalies: lists most jobs leave empty.
void Others(const Json& r, std::string& out) {
  auto list = [&](const char* key, const char* title, std::initializer_list<const char*> columns) {
    const Json& items = At(r, key);
    if (!items.is_array() || items.empty()) return;
    out += "<h2 id=\"" + std::string(key) + "\">" + title + ": " + std::to_string(items.size()) +
           "</h2>\n<table>\n<tr>";
    for (const char* col : columns) out += "<th>" + std::string(col) + "</th>";
    out += "</tr>\n";
    for (const Json& item : items) {
      out += "<tr>";
      for (const char* col : columns) {
        const bool seconds = std::string_view(col).ends_with("_s");
        out += "<td>" + (seconds ? Secs(At(item, col)) : Text(At(item, col))) + "</td>";
      }
      out += "</tr>\n";
    }
    out += "</table>\n";
  };
  list("stragglers", "Stragglers kept (training went on)",
       {"at_s", "generation", "step", "rank", "node", "slowdown", "reason"});
  list("resizes", "Resized (no failure)",
       {"at_s", "generation", "step", "from_nodes", "to_nodes", "reason"});
  list("data_anomalies", "Loss anomalies that were the data's",
       {"step", "cause", "loss", "reason"});
  if (At(r, "skipped_steps").is_array() && !At(r, "skipped_steps").empty()) {
    std::string steps;
    for (const Json& s : At(r, "skipped_steps")) steps += (steps.empty() ? "" : ", ") + Text(s);
    out += "<p><b>Steps whose data was skipped:</b> " + steps + "</p>\n";
  }
}

void Runs(const Json& r, const Json& given, std::string& out) {
  // `runs` as `endure report --json` has it; else the report's own summary
  // of the runs before it.
  const Json& runs = given.is_array() && !given.empty() ? given : At(r, "earlier_runs");
  out += "<h2 id=\"runs\">Runs of this state directory</h2>\n";
  if (!runs.is_array() || runs.empty()) {
    out += "<p class=\"muted\">no other run recorded</p>\n";
    return;
  }
  const Json& current = At(r, "run");
  out +=
      "<table class=\"runs\">\n<tr><th class=\"n\">run</th><th>started (UTC)</th>"
      "<th>finished (UTC)</th><th class=\"n\">exit</th><th class=\"n\">incidents</th>"
      "<th class=\"n\">generations</th><th class=\"n\">wall</th><th class=\"n\">ETTR</th>"
      "<th>verdict</th></tr>\n";
  chart::BarChart bars;
  bars.width = kChartWidth;
  bars.title = "ETTR by run";
  bars.max = 1;
  for (const Json& run : runs) {
    const bool is_current = current.is_number_integer() && At(run, "run") == current;
    std::string verdict = Text(At(run, "verdict"));
    if (verdict.empty() || verdict == "-") {
      verdict = At(run, "final").is_boolean() && At(run, "final").get<bool>()
                    ? "-"
                    : "not finished (no final report)";
    }
    out += std::string("<tr") + (is_current ? " class=\"current\"" : "") + "><td class=\"n\">" +
           Text(At(run, "run")) + (is_current ? " (this report)" : "") + "</td><td>" +
           UtcTime(At(run, "started_at_unix")) + "</td><td>" +
           UtcTime(At(run, "finished_at_unix")) + "</td><td class=\"n\">" +
           Text(At(run, "exit_code")) + "</td><td class=\"n\">" + Text(At(run, "incidents")) +
           "</td><td class=\"n\">" + Text(At(run, "generations")) + "</td><td class=\"n\">" +
           XmlEscape(LongSecs(Number(At(run, "wall_s")))) + "</td><td class=\"n\">" +
           (At(run, "ettr").is_number() ? Fixed(At(run, "ettr").get<double>(), 3) : "-") +
           "</td><td>" + verdict + "</td></tr>\n";
    const double ettr = Number(At(run, "ettr"));
    bars.bars.push_back(
        {"run " + (At(run, "run").is_number_integer() ? At(run, "run").dump() : "?"), ettr,
         std::isfinite(ettr) ? Fixed(ettr, 3) : "-", is_current ? "#2ca02c" : "#9ecae1"});
  }
  out += "</table>\n";
  if (runs.size() >= 2) out += chart::RenderBarChart(bars);
}

}  // namespace

std::string RenderReportHtml(const Json& report, const Json& runs) {
  std::string out;
  out.reserve(64 * 1024);
  out +=
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n"
      "<meta name=\"generator\" content=\"endure report --html\"/>\n"
      "<title>Endure report: " +
      Text(At(report, "job")) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  Header(report, out);
  Ledger(report, out);
  History(report, out);
  Incidents(report, out);
  Others(report, out);
  Runs(report, runs, out);
  out +=
      "<p class=\"muted\">Written by <code>endure report --html</code>; every figure is defined in "
      "Endure's docs/report.md.</p>\n</body>\n</html>\n";
  return out;
}

}  // namespace endure::controller
