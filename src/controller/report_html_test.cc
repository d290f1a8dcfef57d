// The HTML report of a hand-made report JSON: every incident with its
// timings, the ETTR figure exactly as the JSON has it, the history's charts
// with the incidents marked, the runs; hostile strings stay text; old
// reports without a history still render.
#include "controller/report_html.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>
#include <string>

namespace endure::controller {
namespace {

using Json = nlohmann::json;
using testing::HasSubstr;
using testing::Not;

size_t Count(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern);
  return static_cast<size_t>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

Json Incident(int id, const std::string& cause, double fault_at_s) {
  return {{"id", id},
          {"generation", id - 1},
          {"cause", cause},
          {"rank", id % 2},
          {"node", "node" + std::to_string(id % 2)},
          {"injected_at_s", nullptr},
          {"fault_at_s", fault_at_s},
          {"detected_at_s", fault_at_s + 0.25},
          {"detected_after_s", 0.25},
          {"recovered_after_s", 1.5},
          {"teardown_s", 0.125},
          {"wait_s", 0.0},
          {"relaunch_s", 1.0},
          {"restore_s", 0.125},
          {"failed_at_step", 42},
          {"restored_step", 40},
          {"steps_lost", 2},
          {"action", "restart_in_place"},
          {"route", "in_process"},
          {"route_reason", "every node is still healthy"},
          {"reason", "rank " + std::to_string(id % 2) + " failed: " + cause},
          {"restore", "step 40 from T0 x2"},
          {"log_line", ""},
          {"stacks", Json::array()},
          {"suspects", Json::array()}};
}

Json SampleReport() {
  Json r = {
      {"job", "pretrain"},
      {"final", true},
      {"exit_code", 0},
      {"verdict", "training completed"},
      {"completed", true},
      {"stopped_by", nullptr},
      {"steps", 300},
      {"last_loss", 2.25},
      {"generations", 4},
      {"checkpoints", 30},
      {"nodes", {"node0", "node1"}},
      {"wall_s", 62.41},
      {"ettr", 0.80291619932703088},
      {"ledger_s",
       {{"productive", 50.11},
        {"checkpoint_stall", 0.91},
        {"detection", 2.3},
        {"recovery", 4.02},
        {"recompute", 2.65},
        {"startup", 2.37},
        {"other", 0.05}}},
      {"recovery_s", {{"teardown", 0.375}, {"wait", 0.0}, {"relaunch", 3.0}, {"restore", 0.375}}},
      {"run", 2}};
  r["incidents"] = {Incident(1, "signal 9 SIGKILL", 6.87), Incident(2, "nan_loss", 20.5),
                    Incident(3, "hang", 41.0)};
  r["incidents"][2]["recurrence"] = {{"kb_id", 17},
                                     {"similar",
                                      {{{"kb_id", 4},
                                        {"score", 0.91},
                                        {"job", "older-job"},
                                        {"incident", 1},
                                        {"cause", "hang"},
                                        {"resolution", "evict_node"},
                                        {"resolved_by_operator", true},
                                        {"note", "HCA replaced"}}}}};
  r["incidents"][2]["stacks"] = {"rank 0 (pid 7):\n  File train.py, line 3"};
  // Columns as docs/monitoring.md's "History" has them.
  r["history"] = {{"t_s", {0, 10, 20, 30, 40, 50, 60}},
                  {"ettr", {0, 0.6, 0.7, 0.75, 0.78, 0.8, 0.803}},
                  {"step", {0, 40, 90, 140, 190, 250, 300}},
                  {"loss", {nullptr, 4.1, 3.5, 3.0, 2.7, 2.4, 2.25}},
                  {"tokens_per_s", {0, 1200, 1250, 1240, 1260, 1255, 1250}},
                  {"ledger_s",
                   {{"productive", {0, 6, 14, 22, 31, 40, 50}},
                    {"startup", {0, 2.37, 2.37, 2.37, 2.37, 2.37, 2.37}},
                    {"recovery", {0, 1, 2, 3, 4, 4, 4}}}}};
  return r;
}

Json SampleRuns() {
  return Json::array({{{"run", 1},
                       {"job", "pretrain"},
                       {"started_at_unix", 1.7e9},
                       {"finished_at_unix", 1.7e9 + 60},
                       {"exit_code", 130},
                       {"verdict", "stopped by SIGINT at step 120"},
                       {"final", true},
                       {"incidents", 1},
                       {"generations", 2},
                       {"wall_s", 58.7},
                       {"ettr", 0.712}},
                      {{"run", 2},
                       {"job", "pretrain"},
                       {"started_at_unix", 1.7e9 + 3600},
                       {"finished_at_unix", 1.7e9 + 3662},
                       {"exit_code", 0},
                       {"verdict", "training completed"},
                       {"final", true},
                       {"incidents", 3},
                       {"generations", 4},
                       {"wall_s", 62.41},
                       {"ettr", 0.80291619932703088}}});
}

TEST(ReportHtml, ShowsEveryIncidentAndTheEttrOfTheReport) {
  const Json report = SampleReport();
  const std::string html = RenderReportHtml(report, SampleRuns());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_THAT(html, HasSubstr("<title>Endure report: pretrain</title>"));
  EXPECT_THAT(html, HasSubstr("Job <span id=\"job\">pretrain</span>: completed (exit 0)"));
  // The figure as report.json writes it, and rounded for people.
  EXPECT_THAT(html,
              HasSubstr("<data id=\"ettr\" value=\"" + report["ettr"].dump() + "\">0.803</data>"));
  EXPECT_EQ(report["ettr"].dump(), "0.8029161993270308");  // every digit

  EXPECT_EQ(Count(html, "<tr class=\"incident\""), 3u);
  for (const Json& inc : report["incidents"]) {
    const std::string id = std::to_string(inc["id"].get<int>());
    EXPECT_THAT(html, HasSubstr("<tr class=\"incident\" id=\"incident-" + id + "\">"));
    EXPECT_THAT(html, HasSubstr("<b class=\"cause\">" + inc["cause"].get<std::string>() + "</b>"));
    EXPECT_THAT(html, HasSubstr(inc["reason"].get<std::string>()));
  }
  // Its timings: detected after, recovered after, teardown, wait, relaunch, restore, steps lost.
  EXPECT_THAT(html, HasSubstr("<td class=\"n\">0.250s</td><td class=\"n\">1.500s</td>"
                              "<td class=\"n\">0.125s</td><td class=\"n\">0.000s</td>"
                              "<td class=\"n\">1.000s</td><td class=\"n\">0.125s</td>"
                              "<td class=\"n\">2</td>"));
  EXPECT_THAT(html, HasSubstr("<td>in_process</td>"));
  EXPECT_THAT(html, HasSubstr("like older-job incident 1 (kb 4, score 0.91, cause hang): "
                              "evict_node by an operator: HCA replaced"));
  EXPECT_THAT(html, HasSubstr("<summary>stacks (1)</summary>"));

  // The ledger: table and bars.
  EXPECT_THAT(html,
              HasSubstr("productive</td><td class=\"n\">50.110s</td><td class=\"n\">80.3%</td>"));
  EXPECT_THAT(html, HasSubstr("<title>Wall time by category</title>"));

  // The history: ETTR with the three incidents marked and linked, the
  // ledger stacked, loss and throughput.
  EXPECT_THAT(html, Not(HasSubstr("no history recorded")));
  EXPECT_THAT(html, HasSubstr("<title>ETTR over the run (incidents marked)</title>"));
  EXPECT_EQ(Count(html, "<g class=\"marker\"><a href=\"#incident-1\">"), 3u);  // ETTR, loss, tokens
  EXPECT_THAT(html, HasSubstr(">#3</text>"));
  EXPECT_EQ(Count(html, "<polygon class=\"area\""), 3u);
  EXPECT_THAT(html, HasSubstr("<title>Loss (rank 0)</title>"));
  EXPECT_THAT(html, HasSubstr("time since the run started (seconds)"));
  EXPECT_THAT(html, HasSubstr("<title>Throughput</title>"));

  // The runs, this one marked.
  EXPECT_THAT(html, HasSubstr("<tr class=\"current\"><td class=\"n\">2 (this report)</td>"
                              "<td>2023-11-14 23:13:20</td>"));
  EXPECT_THAT(html, HasSubstr("stopped by SIGINT at step 120"));
  EXPECT_THAT(html, HasSubstr("<title>ETTR by run</title>"));

  // Self-contained: no script, nothing fetched.
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("<link")));
  EXPECT_THAT(html, Not(HasSubstr(" src=")));
  EXPECT_EQ(Count(html, "https?://"), Count(html, "xmlns=\"http://www.w3.org/2000/svg\""));
}

TEST(ReportHtml, EscapesEveryStringFromTheReport) {
  Json report = SampleReport();
  report["job"] = "<script>alert('job')</script>";
  report["verdict"] = "gave up & \"quit\"";
  report["nodes"] = {"<img src=x onerror=alert(1)>"};
  report["refused_nodes"] = {{"<b>n</b>", "health check </td></table><script>"}};
  Json& inc = report["incidents"][0];
  inc["cause"] = "</b><script>alert(1)</script>";
  inc["node"] = "node\" onclick=\"x";
  inc["reason"] = "</td></tr></table><iframe src=//evil>";
  inc["log_line"] = std::string("Traceback <module>\x01\x1b[31m \xff\xfe end");
  inc["id"] = "1\"><script>\xff";  // not even UTF-8: dump() would throw
  report["incidents"][2]["recurrence"]["similar"][0]["note"] = "<style>body{display:none}</style>";
  report["history"]["ledger_s"]["<svg onload=x>"] = {0, 1, 1, 1, 1, 1, 1};
  Json runs = SampleRuns();
  runs[0]["verdict"] = "<marquee>";

  const std::string html = RenderReportHtml(report, runs);
  for (const char* tag : {"<script", "<img", "<iframe", "<marquee", "<svg onload", "<b>n"}) {
    EXPECT_THAT(html, Not(HasSubstr(tag))) << tag;
  }
  EXPECT_EQ(Count(html, "<style>"), 1u);  // the page's own
  EXPECT_THAT(html, HasSubstr("&lt;script&gt;alert(&#39;job&#39;)&lt;/script&gt;"));
  EXPECT_THAT(html, HasSubstr("gave up &amp; &quot;quit&quot;"));
  EXPECT_THAT(html, HasSubstr("<td>node&quot; onclick=&quot;x</td>"));
  EXPECT_THAT(html, HasSubstr("&lt;/td&gt;&lt;/tr&gt;&lt;/table&gt;&lt;iframe src=//evil&gt;"));
  EXPECT_THAT(html, HasSubstr("id=\"incident-1&quot;&gt;&lt;script&gt;\xEF\xBF\xBD\""));
  EXPECT_THAT(html, HasSubstr("&lt;marquee&gt;"));
  // Control characters and bytes that are not UTF-8 become U+FFFD.
  EXPECT_THAT(html, HasSubstr("Traceback &lt;module&gt;\xEF\xBF\xBD\xEF\xBF\xBD[31m "));
  EXPECT_THAT(html, Not(HasSubstr("\x01")));
  EXPECT_THAT(html, Not(HasSubstr("\xff")));
}

TEST(ReportHtml, WithoutHistoryItSaysSo) {
  Json report = SampleReport();
  report.erase("history");
  std::string html = RenderReportHtml(report, Json::array());
  EXPECT_THAT(html, HasSubstr("no history recorded"));
  EXPECT_THAT(html, Not(HasSubstr("ETTR over the run")));
  EXPECT_EQ(Count(html, "<tr class=\"incident\""), 3u);

  report["history"] = {{"t_s", Json::array()}, {"ettr", Json::array()}};
  EXPECT_THAT(RenderReportHtml(report, nullptr), HasSubstr("no history recorded"));

  // A trainer that sends no token counts: no empty throughput chart.
  report = SampleReport();
  report["history"]["tokens_per_s"] = {0, 0, 0, 0, 0, 0, 0};
  html = RenderReportHtml(report, nullptr);
  EXPECT_THAT(html, HasSubstr("no throughput reported"));
  EXPECT_THAT(html, Not(HasSubstr("<title>Throughput</title>")));

  // A report built from the store of a run still going: nulls everywhere.
  const Json running = {{"job", "demo"},
                        {"final", false},
                        {"exit_code", nullptr},
                        {"steps", nullptr},
                        {"checkpoints", nullptr},
                        {"wall_s", 0.0},
                        {"ettr", 0.0},
                        {"ledger_s", Json::object()},
                        {"incidents", Json::array()},
                        {"run", 1},
                        {"earlier_runs", Json::array()}};
  html = RenderReportHtml(running, nullptr);
  EXPECT_THAT(html, HasSubstr("Job <span id=\"job\">demo</span>: not finished</h1>"));
  EXPECT_THAT(html, HasSubstr("Not a final report"));
  EXPECT_THAT(html, HasSubstr("<data id=\"ettr\" value=\"0.0\">0.000</data>"));
  EXPECT_THAT(html, HasSubstr("Incidents: 0"));
  EXPECT_THAT(html, HasSubstr("no other run recorded"));

  // Not even an object: a page all the same.
  EXPECT_THAT(RenderReportHtml(Json("garbage"), Json(3)), HasSubstr("</html>"));
}

TEST(ReportHtml, ListsEveryIncidentOfALongRunAndMarksThemUnlabelled) {
  Json report = SampleReport();
  report["incidents"] = Json::array();
  for (int i = 1; i <= 240; ++i) report["incidents"].push_back(Incident(i, "hang", i * 0.25));
  const std::string html = RenderReportHtml(report, nullptr);
  EXPECT_THAT(html, HasSubstr("Incidents: 240"));
  EXPECT_EQ(Count(html, "<tr class=\"incident\""), 240u);
  EXPECT_THAT(html, HasSubstr("id=\"incident-240\""));
  EXPECT_EQ(Count(html, "<a href=\"#incident-240\">"), 3u);
  EXPECT_THAT(html, Not(HasSubstr(">#240</text>")));  // too many to label
}

TEST(ReportHtml, EarlierRunsFromTheReportWhenNoRunsAreGiven) {
  Json report = SampleReport();
  report["earlier_runs"] = Json::array({SampleRuns()[0]});
  const std::string html = RenderReportHtml(report, Json::array());
  EXPECT_THAT(html, HasSubstr("stopped by SIGINT at step 120"));
  EXPECT_THAT(html, Not(HasSubstr("(this report)")));
  EXPECT_THAT(html, Not(HasSubstr("ETTR by run")));  // one run: no chart
}

}  // namespace
}  // namespace endure::controller
