// Runs the built `endure report` against state directories written here with
// the StateStore: the table, --json, --html, a job without a final report,
// earlier runs and --run N, and the usage errors (exit 2) for a missing
// directory, database, run or output directory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/subprocess.h"
#include "controller/state_store.h"
#include "tests/support/test_support.h"

namespace endure {
namespace {

using testing::HasSubstr;
using testing::Not;

using Outcome = testing_support::CommandOutcome;

Outcome RunEndure(std::vector<std::string> args) {
  args.insert(args.begin(), ENDURE_BIN);
  return testing_support::RunCommand(args);
}

// `name`, a new directory in `scratch` (the test's own).
std::string FreshDir(const testing_support::ScratchDir& scratch, const std::string& name) {
  EXPECT_FALSE(scratch.path().empty());
  const std::string dir = scratch.Path(name);
  EXPECT_TRUE(Env::Default()->CreateDirs(dir).ok());
  return dir;
}

nlohmann::json SampleReport() {
  return nlohmann::json::parse(R"({
    "job": "demo", "final": true, "exit_code": 0, "verdict": "training completed",
    "param_fingerprint": "c0ffee", "steps": 300, "last_loss": 2.25, "generations": 2,
    "checkpoints": 30, "nodes": ["node0", "node1"], "wall_s": 60.0, "ettr": 0.9,
    "ledger_s": {"productive": 54.0, "checkpoint_stall": 1.0, "detection": 0.5,
                 "recovery": 1.5, "recompute": 1.0, "startup": 2.0, "other": 0.0},
    "recovery_s": {"teardown": 0.25, "wait": 0.0, "relaunch": 1.0, "restore": 0.25},
    "incidents": [{"id": 1, "generation": 0, "cause": "signal 9 SIGKILL", "rank": 1,
                   "node": "node1", "injected_at_s": 12.5, "fault_at_s": 12.5,
                   "detected_at_s": 12.52, "detected_after_s": 0.02,
                   "recovered_after_s": 1.52, "teardown_s": 0.25, "wait_s": 0.0,
                   "relaunch_s": 1.0, "restore_s": 0.25, "failed_at_step": 42,
                   "restored_step": 40, "steps_lost": 2, "action": "restart_in_place",
                   "reason": "rank 1 was killed by signal 9", "log_line": "", "stacks": []}]
  })");
}

TEST(EndureReportCli, PrintsTheStoredReport) {
  testing_support::ScratchDir scratch("endure_report_test");
  const std::string dir = FreshDir(scratch, "final");
  {
    Result<controller::StateStore> store =
        controller::StateStore::Open(controller::StateStore::PathIn(dir));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE(store->BeginRun({"demo", "demo.toml", "", 1.7e9, 1.7e9 + 60, 0, "ok", ""}).ok());
    ASSERT_TRUE(store->SaveReport(SampleReport()).ok());
  }
  Outcome o = RunEndure({"report", dir});
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("Job demo: completed (exit 0)"));
  EXPECT_THAT(o.output, HasSubstr("param_fingerprint c0ffee"));
  EXPECT_THAT(o.output, HasSubstr("ETTR 0.900"));
  EXPECT_THAT(o.output, HasSubstr("signal 9 SIGKILL"));
  EXPECT_THAT(o.output, HasSubstr("12.500s"));  // injected at
  EXPECT_THAT(o.output, HasSubstr("1.520s"));   // recovered after

  Outcome j = RunEndure({"report", dir, "--json"});
  ASSERT_EQ(j.code, 0) << j.output;
  nlohmann::json parsed = nlohmann::json::parse(j.output, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << j.output;
  EXPECT_EQ(parsed["run"], 1);
  EXPECT_EQ(parsed["earlier_runs"], nlohmann::json::array());
  ASSERT_EQ(parsed["runs"].size(), 1u);
  EXPECT_EQ(parsed["runs"][0]["verdict"], "ok");
  for (const char* history : {"run", "earlier_runs", "runs"}) parsed.erase(history);
  EXPECT_EQ(parsed, SampleReport());
}

TEST(EndureReportCli, EarlierRunsAndOneRunsReport) {
  testing_support::ScratchDir scratch("endure_report_test");
  const std::string dir = FreshDir(scratch, "runs");
  {
    Result<controller::StateStore> store =
        controller::StateStore::Open(controller::StateStore::PathIn(dir));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    // Run 1 completed, with one incident; 2023-11-14 22:13:20 UTC.
    ASSERT_TRUE(store
                    ->BeginRun({"demo", "demo.toml", "", 1.7e9, 1.7e9 + 60, 0, "training completed",
                                "c0ffee"})
                    .ok());
    ASSERT_TRUE(store->SaveReport(SampleReport()).ok());
    // Run 2, an hour later, gave up without an incident.
    ASSERT_TRUE(store
                    ->BeginRun({"demo", "demo.toml", "", 1.7e9 + 3600, 1.7e9 + 3630, 3,
                                "gave up: no node came back", ""})
                    .ok());
    nlohmann::json second = SampleReport();
    second["exit_code"] = 3;
    second["verdict"] = "gave up: no node came back";
    second["ettr"] = 0.5;
    second["incidents"] = nlohmann::json::array();
    ASSERT_TRUE(store->SaveReport(second).ok());
  }
  Outcome o = RunEndure({"report", dir});
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("Job demo: gave up (exit 3)"));
  EXPECT_THAT(o.output, HasSubstr("run 2; steps 300"));
  EXPECT_THAT(o.output, HasSubstr("Incidents: 0"));
  EXPECT_THAT(o.output, HasSubstr("Earlier runs: 1"));
  EXPECT_THAT(o.output,
              HasSubstr("    1  2023-11-14 22:13:20     0          1  0.900  training completed"));

  Outcome one = RunEndure({"report", dir, "--run", "1"});
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_THAT(one.output, HasSubstr("Job demo: completed (exit 0)"));
  EXPECT_THAT(one.output, HasSubstr("run 1; steps 300"));
  EXPECT_THAT(one.output, HasSubstr("signal 9 SIGKILL"));
  EXPECT_THAT(one.output, Not(HasSubstr("Earlier runs")));

  Outcome j = RunEndure({"report", dir, "--json"});
  ASSERT_EQ(j.code, 0) << j.output;
  nlohmann::json parsed = nlohmann::json::parse(j.output, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << j.output;
  EXPECT_EQ(parsed["run"], 2);
  EXPECT_EQ(parsed["exit_code"], 3);
  ASSERT_EQ(parsed["earlier_runs"].size(), 1u);
  EXPECT_EQ(parsed["earlier_runs"][0]["incidents"], 1);
  EXPECT_EQ(parsed["earlier_runs"][0]["verdict"], "training completed");
  ASSERT_EQ(parsed["runs"].size(), 2u);
  EXPECT_EQ(parsed["runs"][1]["run"], 2);
  EXPECT_EQ(parsed["runs"][1]["exit_code"], 3);
  EXPECT_DOUBLE_EQ(parsed["runs"][1]["ettr"].get<double>(), 0.5);

  Outcome missing = RunEndure({"report", dir, "--run", "3"});
  EXPECT_EQ(missing.code, 2) << missing.output;
  EXPECT_THAT(missing.output, HasSubstr("no run 3 (runs 1 to 2 are recorded)"));
  Outcome zero = RunEndure({"report", dir, "--run", "0"});
  EXPECT_EQ(zero.code, 2) << zero.output;
  EXPECT_THAT(zero.output, HasSubstr("--run"));
}

TEST(EndureReportCli, JobWithoutAFinalReport) {
  testing_support::ScratchDir scratch("endure_report_test");
  const std::string dir = FreshDir(scratch, "running");
  {
    Result<controller::StateStore> store =
        controller::StateStore::Open(controller::StateStore::PathIn(dir));
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(store->BeginRun({"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""}).ok());
  }
  Outcome o = RunEndure({"report", dir});
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("Job demo: not finished"));
  EXPECT_THAT(o.output, HasSubstr("no final report"));
}

TEST(EndureReportCli, MissingDirectoryOrDatabaseIsAUsageError) {
  Outcome none = RunEndure({"report", "/nonexistent/endure/state"});
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_THAT(none.output, HasSubstr("/nonexistent/endure/state: no such directory; pass the "
                                     "state directory of a job"));

  testing_support::ScratchDir scratch("endure_report_test");
  const std::string empty = FreshDir(scratch, "empty");
  Outcome no_db = RunEndure({"report", empty});
  EXPECT_EQ(no_db.code, 2) << no_db.output;
  EXPECT_THAT(no_db.output, HasSubstr("no controller database"));
  EXPECT_THAT(no_db.output, HasSubstr(empty + "/controller.db"));
  EXPECT_FALSE(Env::Default()->Exists(empty + "/controller.db"));

  // A database without a job (the controller died before saving one).
  const std::string bare = FreshDir(scratch, "bare");
  ASSERT_TRUE(controller::StateStore::Open(controller::StateStore::PathIn(bare)).ok());
  Outcome no_job = RunEndure({"report", bare});
  EXPECT_EQ(no_job.code, 2) << no_job.output;
  EXPECT_THAT(no_job.output, HasSubstr("no job recorded yet"));

  Outcome no_arg = RunEndure({"report"});
  EXPECT_EQ(no_arg.code, 2) << no_arg.output;
  EXPECT_THAT(no_arg.output, HasSubstr("state_dir"));
  EXPECT_THAT(no_arg.output, Not(HasSubstr("Job ")));
}

// A finished job's state directory as `endure run` leaves it: the final
// report in the store and in report.json. Three incidents, and the history.
std::string FinishedJob(const testing_support::ScratchDir& scratch, const nlohmann::json& report) {
  const std::string dir = FreshDir(scratch, "finished");
  Result<controller::StateStore> store =
      controller::StateStore::Open(controller::StateStore::PathIn(dir));
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  if (!store.ok()) return dir;
  EXPECT_TRUE(store->BeginRun({"demo", "demo.toml", "", 1.7e9, 1.7e9 + 60, 0, "ok", ""}).ok());
  EXPECT_TRUE(store->SaveReport(report).ok());
  EXPECT_TRUE(
      WriteFileAtomically(Env::Default(), dir + "/report.json", report.dump(2) + "\n").ok());
  return dir;
}

nlohmann::json ThreeIncidents() {
  nlohmann::json r = SampleReport();
  r["ledger_s"]["productive"] = 53.9;
  r["ledger_s"]["other"] = 0.1;
  r["ettr"] = 53.9 / 60.0;  // 0.8983333333333333: every digit must survive
  nlohmann::json second = r["incidents"][0];
  second["id"] = 2;
  second["cause"] = "nan_loss";
  second["fault_at_s"] = 30.25;
  second["reason"] = "rank 0 reported a NaN loss at step 120";
  nlohmann::json third = second;
  third["id"] = 3;
  third["cause"] = "hang";
  third["fault_at_s"] = 48.0;
  third["reason"] = "ranks 0 and 1 made no progress for 30s";
  r["incidents"].push_back(second);
  r["incidents"].push_back(third);
  r["history"] = {{"t_s", {0, 20, 40, 60}},
                  {"ettr", {0, 0.8, 0.88, 0.9}},
                  {"step", {0, 100, 200, 300}},
                  {"loss", {nullptr, 3.1, 2.6, 2.25}},
                  {"tokens_per_s", {0, 1000, 1010, 990}},
                  {"ledger_s", {{"productive", {0, 16, 35.2, 54}}, {"startup", {0, 2, 2, 2}}}}};
  return r;
}

// What an XML parser (Debian's Python's, which scripts/install-deps
// brings) finds in the page: "ettr VALUE", then "incident ID CAUSE" per row.
// The page is also XML, so a parse error here is a broken page.
Outcome ParseHtml(const std::string& path) {
  return testing_support::RunCommand({"/usr/bin/python3", "-c", R"(
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
for e in root.iter():
    if e.get('id') == 'ettr':
        print('ettr', e.get('value'))
    if e.get('class') == 'incident':
        print('incident', e.get('id'), ''.join(e.find(".//b[@class='cause']").itertext()))
)",
                                      path});
}

TEST(EndureReportCli, HtmlOfAFinishedJobHasEveryIncidentAndTheEttrOfReportJson) {
  testing_support::ScratchDir scratch("endure_report_test");
  const std::string dir = FinishedJob(scratch, ThreeIncidents());
  Outcome o = RunEndure({"report", dir, "--html"});
  ASSERT_EQ(o.code, 0) << o.output;
  const std::string path = dir + "/report.html";
  EXPECT_EQ(o.output, path + "\n");
  Result<std::string> html = Env::Default()->ReadFile(path);
  ASSERT_TRUE(html.ok()) << html.status().ToString();

  Result<std::string> report_text = Env::Default()->ReadFile(dir + "/report.json");
  ASSERT_TRUE(report_text.ok());
  const nlohmann::json report = nlohmann::json::parse(*report_text);
  ASSERT_EQ(report["incidents"].size(), 3u);
  std::string expected = "ettr " + report["ettr"].dump() + "\n";
  for (const nlohmann::json& inc : report["incidents"]) {
    expected +=
        "incident incident-" + inc["id"].dump() + " " + inc["cause"].get<std::string>() + "\n";
    EXPECT_THAT(*html, HasSubstr(inc["reason"].get<std::string>()));
  }
  Outcome parsed = ParseHtml(path);
  ASSERT_EQ(parsed.code, 0) << parsed.output;
  EXPECT_EQ(parsed.output, expected);
  // The figure is the JSON's number, not a rounding of it.
  const std::string figure = parsed.output.substr(5, parsed.output.find('\n') - 5);
  EXPECT_EQ(std::stod(figure), report["ettr"].get<double>());
  EXPECT_THAT(*html, HasSubstr(">0.898</data>"));  // and, rounded, for people

  // The history's ETTR chart with the incidents marked, the ledger, the run.
  EXPECT_THAT(*html, HasSubstr("ETTR over the run (incidents marked)"));
  EXPECT_THAT(*html, HasSubstr("<a href=\"#incident-3\">"));
  EXPECT_THAT(*html, HasSubstr("Wall time by category"));
  EXPECT_THAT(*html, HasSubstr("1 (this report)"));
  EXPECT_THAT(*html, Not(HasSubstr("<script")));

  // -o writes elsewhere and prints that path.
  const std::string elsewhere = scratch.Path("page.html");
  Outcome o2 = RunEndure({"report", dir, "--html", "-o", elsewhere});
  ASSERT_EQ(o2.code, 0) << o2.output;
  EXPECT_EQ(o2.output, elsewhere + "\n");
  Result<std::string> again = Env::Default()->ReadFile(elsewhere);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *html);
}

TEST(EndureReportCli, HtmlEscapesHostileStrings) {
  testing_support::ScratchDir scratch("endure_report_test");
  nlohmann::json report = ThreeIncidents();
  report["job"] = "<script>alert(1)</script>";
  report["incidents"][0]["reason"] = "</td></tr></table><img src=x onerror=alert(2)>";
  report["incidents"][1]["log_line"] = std::string("Error: <bad> & \"worse\" \x07\x1b[0m");
  report["incidents"][2]["node"] = "node\" onmouseover=\"alert(3)";
  const std::string dir = FinishedJob(scratch, report);
  Outcome o = RunEndure({"report", dir, "--html"});
  ASSERT_EQ(o.code, 0) << o.output;
  Result<std::string> html = Env::Default()->ReadFile(dir + "/report.html");
  ASSERT_TRUE(html.ok());
  EXPECT_THAT(*html, Not(HasSubstr("<script")));
  EXPECT_THAT(*html, Not(HasSubstr("<img")));
  EXPECT_THAT(*html, Not(HasSubstr("\" onmouseover=\"")));
  EXPECT_THAT(*html, HasSubstr("&lt;script&gt;alert(1)&lt;/script&gt;"));
  EXPECT_THAT(*html, HasSubstr("&lt;/td&gt;&lt;/tr&gt;&lt;/table&gt;&lt;img src=x"));
  EXPECT_THAT(*html,
              HasSubstr("Error: &lt;bad&gt; &amp; &quot;worse&quot; \xEF\xBF\xBD\xEF\xBF\xBD[0m"));
  // Still one well-formed page with its three incidents.
  Outcome parsed = ParseHtml(dir + "/report.html");
  ASSERT_EQ(parsed.code, 0) << parsed.output;
  EXPECT_THAT(parsed.output, HasSubstr("incident incident-3 hang\n"));
}

TEST(EndureReportCli, HtmlOfAJobStillRunningSaysSo) {
  testing_support::ScratchDir scratch("endure_report_test");
  const std::string dir = FreshDir(scratch, "running");
  {
    Result<controller::StateStore> store =
        controller::StateStore::Open(controller::StateStore::PathIn(dir));
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(store->BeginRun({"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""}).ok());
  }
  Outcome o = RunEndure({"report", dir, "--html"});
  ASSERT_EQ(o.code, 0) << o.output;
  Result<std::string> html = Env::Default()->ReadFile(dir + "/report.html");
  ASSERT_TRUE(html.ok());
  EXPECT_THAT(*html, HasSubstr("Job <span id=\"job\">demo</span>: not finished"));
  EXPECT_THAT(*html, HasSubstr("Not a final report"));
  EXPECT_THAT(*html, HasSubstr("Incidents: 0"));
}

TEST(EndureReportCli, HtmlToABadPathIsAUsageError) {
  testing_support::ScratchDir scratch("endure_report_test");
  const std::string dir = FinishedJob(scratch, SampleReport());
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--html", "-o", "/nonexistent/endure/page.html"},
       "-o /nonexistent/endure/page.html: no such directory /nonexistent/endure; pass a file in "
       "an existing directory"},
      {{"--html", "-o", scratch.path()}, ": is a directory; pass the file to write"},
      {{"-o", scratch.Path("page.html")}, "--html"},  // -o alone
      {{"--html", "--json"}, "--json"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"report", dir};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Outcome o = RunEndure(args);
    EXPECT_EQ(o.code, 2) << c.message << "\n" << o.output;
    EXPECT_THAT(o.output, HasSubstr(c.message));
  }
  EXPECT_FALSE(Env::Default()->Exists(dir + "/report.html"));
  EXPECT_FALSE(Env::Default()->Exists(scratch.Path("page.html")));
}

}  // namespace
}  // namespace endure
