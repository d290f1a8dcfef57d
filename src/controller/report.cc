// The job report; see report.h and docs/report.md for the definitions.
#include "controller/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <optional>
#include <sstream>

#include "controller/state_store.h"
#include "core/ettr_ledger.h"

namespace endure::controller {
namespace {

using Json = nlohmann::json;

// An optional number as JSON: null when absent.
Json OrNull(const std::optional<double>& v) { return v ? Json(*v) : Json(nullptr); }

std::optional<double> Between(const std::optional<core::TimePoint>& a,
                              const std::optional<core::TimePoint>& b) {
  if (!a || !b) return std::nullopt;
  return Seconds(*b - *a);
}

}  // namespace

// One incident's figures. The phases partition the time to recover:
//   recovered_after = detected_after + teardown + wait + relaunch + restore.
Json IncidentJson(const core::Incident& inc, core::TimePoint start) {
  const std::optional<core::TimePoint> fault = inc.fault_at, detected = inc.detected_at;
  const std::optional<double> detected_after = Between(fault, detected);
  const std::optional<double> teardown = Between(detected, inc.stopped_at);
  const std::optional<double> wait = Between(inc.stopped_at, inc.relaunched_at);
  const std::optional<double> restore =
      inc.ready_at ? std::optional<double>(inc.restore_s) : std::nullopt;
  std::optional<double> relaunch = Between(inc.relaunched_at, inc.recovered_at);
  if (relaunch) relaunch = std::max(0.0, *relaunch - inc.restore_s);
  Json j;
  j["id"] = inc.id;
  j["generation"] = inc.generation.value;
  j["cause"] = inc.cause.name;
  j["rank"] = inc.rank.value;
  j["node"] = inc.node_name;
  j["injected_at_s"] = OrNull(Between(start, inc.injected_at));
  j["fault_at_s"] = Seconds(inc.fault_at - start);
  j["detected_at_s"] = Seconds(inc.detected_at - start);
  j["detected_after_s"] = OrNull(detected_after);
  j["recovered_after_s"] = OrNull(Between(fault, inc.recovered_at));
  j["teardown_s"] = OrNull(teardown);
  j["wait_s"] = OrNull(wait);
  j["relaunch_s"] = OrNull(relaunch);
  j["restore_s"] = OrNull(restore);
  j["failed_at_step"] = inc.failed_at_step.value;
  j["restored_step"] = inc.restored_step.value;
  j["steps_lost"] = inc.steps_lost();
  j["action"] = inc.action;
  // How the job got back to training (core/recovery_route.h); null: it did not restart.
  j["route"] = inc.route ? Json(std::string(core::RecoveryRouteName(*inc.route))) : Json();
  j["route_reason"] = inc.route_reason;
  j["reason"] = inc.reason;
  j["restore"] = inc.restore;
  j["log_line"] = inc.log_line;
  j["stacks"] = inc.stacks;
  j["suspects"] = inc.suspects;
  return j;
}

namespace {

// Fills the ledger, ETTR, recovery totals and incidents into `report`.
// `ledger_s` holds every category; `wall_s` is their sum.
void AddAccounting(Json& report, const std::map<std::string, double>& ledger_s, double wall_s,
                   const std::vector<core::Incident>& incidents, core::TimePoint start) {
  report["wall_s"] = wall_s;
  Json ledger = Json::object();
  for (int i = 0; i < core::kNumLedgerCategories; ++i) {
    const std::string name(core::LedgerCategoryName(static_cast<core::LedgerCategory>(i)));
    auto it = ledger_s.find(name);
    ledger[name] = it == ledger_s.end() ? 0.0 : it->second;
  }
  report["ettr"] = wall_s > 0 ? ledger["productive"].get<double>() / wall_s : 0.0;
  report["ledger_s"] = ledger;
  double teardown = 0, wait = 0, relaunch = 0, restore = 0;
  Json list = Json::array();
  for (const core::Incident& inc : incidents) {
    Json j = IncidentJson(inc, start);
    auto add = [&](const char* key, double& sum) {
      if (j[key].is_number()) sum += j[key].get<double>();
    };
    add("teardown_s", teardown);
    add("wait_s", wait);
    add("relaunch_s", relaunch);
    add("restore_s", restore);
    list.push_back(std::move(j));
  }
  report["recovery_s"] = {
      {"teardown", teardown}, {"wait", wait}, {"relaunch", relaunch}, {"restore", restore}};
  report["incidents"] = std::move(list);
}

// ---- Rendering ----

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

// Seconds for the table: millisecond resolution for the short figures that
// detection and recovery are about.
std::string Secs(const Json& v) {
  if (!v.is_number()) return "-";
  const double s = v.get<double>();
  return Fixed(s, std::fabs(s) < 100 ? 3 : 1) + "s";
}

std::string Str(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number()) return Fixed(v.get<double>(), 4);
  return "-";
}

// Columns separated by two spaces; `right[i]` right-aligns column i.
std::string Table(const std::vector<std::vector<std::string>>& rows, const std::vector<bool>& right,
                  const std::string& indent) {
  std::vector<size_t> width(right.size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line = indent;
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      const std::string pad(width[i] - row[i].size(), ' ');
      if (i > 0) line += "  ";
      line += right[i] ? pad + row[i] : row[i] + (i + 1 < row.size() ? pad : "");
    }
    line.erase(line.find_last_not_of(' ') + 1);
    out += line + "\n";
  }
  return out;
}

}  // namespace

Json BuildReport(const ReportInputs& in) {
  const core::JobMachine& m = in.machine;
  const core::EttrLedger& ledger = m.ledger();
  std::map<std::string, double> ledger_s;
  for (int i = 0; i < core::kNumLedgerCategories; ++i) {
    const auto c = static_cast<core::LedgerCategory>(i);
    ledger_s[std::string(core::LedgerCategoryName(c))] = Seconds(ledger.total(c));
  }
  // The ledger stops at the machine's last event; the rest up to `end`
  // (stopping the workers, writing the report) is "other".
  double wall_s = Seconds(ledger.wall());
  const double tail = Seconds(in.end - in.start) - wall_s;
  if (tail > 0) {
    ledger_s["other"] += tail;
    wall_s += tail;
  }

  Json report;
  report["job"] = in.job;
  report["final"] = true;
  report["exit_code"] = in.exit_code;
  report["verdict"] = in.verdict;
  report["completed"] = in.exit_code == 0 && in.stopped_by.empty();
  report["stopped_by"] = in.stopped_by.empty() ? Json(nullptr) : Json(in.stopped_by);
  report["param_fingerprint"] = in.param_fingerprint;
  report["steps"] = in.steps;
  report["last_loss"] = std::isfinite(in.last_loss) ? Json(in.last_loss) : Json(nullptr);
  report["generations"] = m.generations_started();
  report["checkpoints"] = m.checkpoints().totals().copies_taken;
  report["nodes"] = in.nodes;
  // Nodes that registered but may not run the job, and why.
  Json refused = Json::object();
  for (const auto& [name, why] : in.machine.RefusedNodes()) refused[name] = why;
  report["refused_nodes"] = refused;
  // Stragglers flagged and kept (moved ones are incidents).
  Json stragglers = Json::array();
  for (const core::StragglerReport& s : m.stragglers()) {
    stragglers.push_back({{"generation", s.generation.value},
                          {"rank", s.rank.value},
                          {"node", s.node_name},
                          {"step", s.step.value},
                          {"at_s", Seconds(s.at - in.start)},
                          {"slowdown", s.slowdown},
                          {"reason", s.reason}});
  }
  report["stragglers"] = std::move(stragglers);
  // How loss anomalies were judged ("replay": every rank said its program is
  // deterministic), and those a replay showed to be the data's.
  report["anomaly_mode"] = std::string(m.anomaly_mode());
  Json data_anomalies = Json::array();
  for (const core::DataAnomaly& a : m.data_anomalies()) {
    data_anomalies.push_back({{"step", a.step.value},
                              {"cause", std::string(core::LossAnomalyCause(a.kind))},
                              {"loss", std::isfinite(a.loss) ? Json(a.loss) : Json(nullptr)},
                              {"reason", a.reason}});
  }
  report["data_anomalies"] = std::move(data_anomalies);
  Json skipped = Json::array();
  for (core::StepNumber s : m.skipped_steps()) skipped.push_back(s.value);
  report["skipped_steps"] = std::move(skipped);
  // A shrunk job growing back (the shrink itself is an incident's route).
  Json resizes = Json::array();
  for (const core::Resize& z : m.resizes()) {
    resizes.push_back({{"generation", z.generation.value},
                       {"at_s", Seconds(z.at - in.start)},
                       {"step", z.step.value},
                       {"from_nodes", z.from_nodes},
                       {"to_nodes", z.to_nodes},
                       {"reason", z.reason}});
  }
  report["resizes"] = std::move(resizes);
  AddAccounting(report, ledger_s, wall_s, m.incidents(), in.start);
  for (Json& inc : report["incidents"]) {
    auto it = in.recurrences.find(inc.value("id", -1));
    if (it != in.recurrences.end()) inc["recurrence"] = it->second;
  }
  return report;
}

namespace {

// The report of run `run` (kCurrentRun: the store's current one), without
// the history.
Result<Json> RunReport(StateStore& store, int run) {
  Result<Json> saved = store.LoadReport(run);
  if (saved.ok() || saved.status().code() != StatusCode::kNotFound) return saved;

  ENDURE_ASSIGN_OR_RETURN(JobRecord job, store.LoadJob(run));
  ENDURE_ASSIGN_OR_RETURN(auto ledger_s, store.LoadLedger(run));
  // Stored times are seconds since the run's start; any origin will do.
  const core::TimePoint start{};
  ENDURE_ASSIGN_OR_RETURN(std::vector<core::Incident> incidents, store.LoadIncidents(start, run));
  ENDURE_ASSIGN_OR_RETURN(std::vector<GenerationRecord> generations, store.LoadGenerations(run));
  double wall_s = 0;
  for (const auto& [category, seconds] : ledger_s) wall_s += seconds;

  Json report;
  report["job"] = job.name;
  report["final"] = false;
  report["exit_code"] = job.exit_code ? Json(*job.exit_code) : Json(nullptr);
  report["verdict"] = job.verdict.empty()
                          ? std::string(
                                "no final report: the job is still running, or its "
                                "controller stopped before writing one; figures are "
                                "as last saved")
                          : job.verdict;
  report["completed"] = false;  // not known to have completed without the final report
  report["stopped_by"] = nullptr;
  report["param_fingerprint"] = job.param_fingerprint;
  report["steps"] = nullptr;
  report["last_loss"] = nullptr;
  report["generations"] = generations.size();
  report["checkpoints"] = nullptr;
  report["nodes"] = Json::array();
  AddAccounting(report, ledger_s, wall_s, incidents, start);
  return report;
}

void SetHistory(Json& report, int run, const Json& runs) {
  Json earlier = Json::array();
  for (const Json& r : runs) {
    if (r["run"].get<int>() < run) earlier.push_back(r);
  }
  report["run"] = run;
  report["earlier_runs"] = std::move(earlier);
}

}  // namespace

std::string UtcTime(const Json& unix_s) {
  if (!unix_s.is_number()) return "-";
  const auto t = static_cast<std::time_t>(unix_s.get<double>());
  std::tm tm{};
  if (gmtime_r(&t, &tm) == nullptr) return "-";
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string ReportOutcome(const Json& report) {
  const auto at = [&](const char* key) {
    return report.is_object() && report.contains(key) ? report[key] : Json();
  };
  if (at("final").is_boolean() && !at("final").get<bool>()) return "not finished";
  const Json code = at("exit_code");
  if (!code.is_number_integer()) return "not finished";
  if (at("stopped_by").is_string()) return "stopped by " + at("stopped_by").get<std::string>();
  switch (code.get<int>()) {
    case 0:
      return "completed";
    case 3:
      return "gave up";
    default:
      return "failed";
  }
}

Result<Json> ReportFromStore(StateStore& store, int run) {
  ENDURE_ASSIGN_OR_RETURN(Json report, RunReport(store, run));
  ENDURE_ASSIGN_OR_RETURN(Json runs, RunHistory(store));
  SetHistory(report, run == StateStore::kCurrentRun ? store.run() : run, runs);
  // ETTR, the ledger, step, loss and tokens/s over time, as the dashboard
  // showed them (none in a database from before schema version 7).
  ENDURE_ASSIGN_OR_RETURN(std::optional<Json> series, store.LoadHistory(run));
  if (series) report["history"] = std::move(*series);
  return report;
}

Result<Json> RunHistory(StateStore& store) {
  ENDURE_ASSIGN_OR_RETURN(std::vector<RunSummary> runs, store.LoadRuns());
  Json out = Json::array();
  for (const RunSummary& r : runs) {
    double wall_s = 0;
    for (const auto& [category, seconds] : r.ledger_s) wall_s += seconds;
    auto productive = r.ledger_s.find("productive");
    double ettr = wall_s > 0 && productive != r.ledger_s.end() ? productive->second / wall_s : 0.0;
    size_t incidents = static_cast<size_t>(r.incidents);
    // The final report's figures, as its own report shows them: they count
    // the run's tail (stopping, writing the report) that the ledger in the
    // store does not.
    if (r.has_report) {
      ENDURE_ASSIGN_OR_RETURN(Json report, store.LoadReport(r.run));
      if (report.value("wall_s", Json()).is_number()) wall_s = report["wall_s"].get<double>();
      if (report.value("ettr", Json()).is_number()) ettr = report["ettr"].get<double>();
      if (report.value("incidents", Json()).is_array()) incidents = report["incidents"].size();
    }
    Json j;
    j["run"] = r.run;
    j["job"] = r.job.name;
    j["started_at_unix"] = r.job.started_at_unix;
    j["finished_at_unix"] = OrNull(r.job.finished_at_unix);
    j["exit_code"] = r.job.exit_code ? Json(*r.job.exit_code) : Json(nullptr);
    j["verdict"] = r.job.verdict;
    j["final"] = r.has_report;
    j["incidents"] = incidents;
    j["generations"] = r.generations;
    j["wall_s"] = wall_s;
    j["ettr"] = ettr;
    out.push_back(std::move(j));
  }
  return out;
}

Status AddRunHistory(StateStore& store, Json& report) {
  ENDURE_ASSIGN_OR_RETURN(Json runs, RunHistory(store));
  SetHistory(report, store.run(), runs);
  return Status::Ok();
}

namespace {

// One line per run before this one; nothing when there is none.
std::string RenderEarlierRuns(const Json& r) {
  const Json runs = r.value("earlier_runs", Json::array());
  if (!runs.is_array() || runs.empty()) return "";
  std::vector<std::vector<std::string>> rows = {
      {"run", "started (UTC)", "exit", "incidents", "ETTR", "verdict"}};
  for (const Json& run : runs) {
    std::string verdict = Str(run.value("verdict", Json()));
    if (verdict.empty() || verdict == "-") {
      verdict = run.value("final", false) ? "-" : "not finished (no final report)";
    }
    // What happened, not the advice that may follow it: up to a "; ".
    if (size_t cut = verdict.find("; "); cut != std::string::npos) verdict.resize(cut);
    constexpr size_t kVerdictChars = 64;
    if (verdict.size() > kVerdictChars) verdict = verdict.substr(0, kVerdictChars - 3) + "...";
    rows.push_back({Str(run.value("run", Json())), UtcTime(run.value("started_at_unix", Json())),
                    Str(run.value("exit_code", Json())), Str(run.value("incidents", Json())),
                    Fixed(run.value("ettr", 0.0), 3), verdict});
  }
  return "\nEarlier runs: " + std::to_string(runs.size()) +
         " (endure report STATE_DIR --run N prints one)\n" +
         Table(rows, {true, false, true, true, true, false}, "  ");
}

// The report of one run, without its history.
// The last `rows` of `items` (all of them when `rows` is 0), and how many
// are left out before them.
std::pair<Json, size_t> Newest(const Json& items, size_t rows) {
  if (rows == 0 || items.size() <= rows) return {items, 0};
  Json kept = Json::array();
  for (size_t i = items.size() - rows; i < items.size(); ++i) kept.push_back(items[i]);
  return {kept, items.size() - rows};
}

std::string LeftOut(size_t count, const char* what) {
  return count == 0 ? ""
                    : "  (" + std::to_string(count) + " earlier " + what +
                          " not shown: `endure report --all` shows them, --json has them all)\n";
}

std::string RenderRunReport(const Json& r, size_t max_rows) {
  std::ostringstream out;
  out << "Job " << Str(r.value("job", Json())) << ": " << ReportOutcome(r);
  if (r.contains("exit_code") && r["exit_code"].is_number_integer()) {
    out << " (exit " << r["exit_code"].get<int>() << ")";
  }
  out << "\n";
  if (r.contains("verdict") && !Str(r["verdict"]).empty()) out << "  " << Str(r["verdict"]) << "\n";
  if (r.contains("warnings") && r["warnings"].is_array()) {
    for (const Json& w : r["warnings"]) out << "  warning: " << Str(w) << "\n";
  }
  std::vector<std::string> facts;
  if (r.contains("run") && r["run"].is_number()) facts.push_back("run " + Str(r["run"]));
  if (r.contains("steps") && r["steps"].is_number()) facts.push_back("steps " + Str(r["steps"]));
  if (r.contains("last_loss") && r["last_loss"].is_number()) {
    facts.push_back("last loss " + Str(r["last_loss"]));
  }
  if (r.contains("generations") && r["generations"].is_number()) {
    facts.push_back("generations " + Str(r["generations"]));
  }
  if (r.contains("checkpoints") && r["checkpoints"].is_number()) {
    facts.push_back("checkpoints " + Str(r["checkpoints"]));
  }
  if (r.contains("nodes") && r["nodes"].is_array() && !r["nodes"].empty()) {
    std::string nodes;
    size_t shown = 0;
    for (const Json& n : r["nodes"]) {
      if (max_rows > 0 && shown++ == max_rows) {
        nodes += " and " + std::to_string(r["nodes"].size() - max_rows) + " more";
        break;
      }
      nodes += (nodes.empty() ? "" : ",") + Str(n);
    }
    facts.push_back("nodes " + nodes);
  }
  if (r.contains("refused_nodes") && r["refused_nodes"].is_object()) {
    size_t shown = 0;
    for (const auto& [name, why] : r["refused_nodes"].items()) {
      if (max_rows > 0 && shown++ == max_rows) {
        facts.push_back(std::to_string(r["refused_nodes"].size() - max_rows) + " more refused");
        break;
      }
      facts.push_back("refused " + name + " (" + Str(why) + ")");
    }
  }
  if (!facts.empty()) {
    std::string joined;
    for (const std::string& f : facts) joined += (joined.empty() ? "" : "; ") + f;
    out << "  " << joined << "\n";
  }
  if (r.contains("checkpoint") && r["checkpoint"].is_object()) {
    // The tiers: what is durable, and the memory they held.
    const Json& c = r["checkpoint"];
    auto mb = [&](const char* key) { return Fixed(c.value(key, 0.0) / (1 << 20), 1) + " MB"; };
    out << "  checkpoints: " << Str(c.value("durable_commits", Json()))
        << " durable commits, newest step " << Str(c.value("newest_durable_step", Json()))
        << ", persist failures " << Str(c.value("persist_failures", Json())) << "; memory peak T0 "
        << mb("peak_t0_bytes") << ", T1 " << mb("peak_t1_bytes") << " of budget "
        << (c.value("memory_budget_bytes", 0.0) > 0 ? mb("memory_budget_bytes") : "unlimited")
        << "\n";
  }
  const std::string fingerprint = Str(r.value("param_fingerprint", Json()));
  out << "  param_fingerprint " << (fingerprint.empty() || fingerprint == "-" ? "-" : fingerprint)
      << "\n\n";

  const Json ledger = r.value("ledger_s", Json::object());
  const Json recovery = r.value("recovery_s", Json::object());
  const double wall = r.value("wall_s", 0.0);
  auto share = [&](double s) { return wall > 0 ? Fixed(100.0 * s / wall, 1) + "%" : "-"; };
  std::vector<std::vector<std::string>> rows = {{"time", "seconds", "share"},
                                                {"wall", Secs(wall), share(wall)}};
  const std::pair<const char*, const char*> kCategories[] = {
      {"productive", "productive"},
      {"checkpoint_stall", "checkpoint stall"},
      {"detection", "detection"},
      {"recovery", "recovery"},
      {"recompute", "recompute"},
      {"startup", "startup"},
      {"other", "other"}};
  for (const auto& [key, label] : kCategories) {
    const double s = ledger.value(key, 0.0);
    rows.push_back({label, Secs(s), share(s)});
    if (std::string_view(key) == "recovery") {
      for (const char* part : {"teardown", "wait", "relaunch", "restore"}) {
        if (std::string_view(part) == "wait" && recovery.value(part, 0.0) == 0.0) continue;
        rows.push_back({std::string("  ") + part, Secs(recovery.value(part, Json())), ""});
      }
    }
  }
  out << Table(rows, {false, true, true}, "  ");
  out << "  ETTR " << Fixed(r.value("ettr", 0.0), 3) << " (productive / wall)\n";

  const auto [stragglers, earlier_stragglers] =
      Newest(r.value("stragglers", Json::array()), max_rows);
  if (!stragglers.empty()) {
    out << "\nStragglers kept (training went on): " << stragglers.size() + earlier_stragglers
        << "\n"
        << LeftOut(earlier_stragglers, "stragglers");
    for (const Json& s : stragglers) {
      out << "  step " << Str(s.value("step", Json())) << ": " << Str(s.value("reason", Json()))
          << "\n";
    }
  }
  const auto [resizes, earlier_resizes] = Newest(r.value("resizes", Json::array()), max_rows);
  if (!resizes.empty()) {
    out << "\nResized (no failure): " << resizes.size() + earlier_resizes << "\n"
        << LeftOut(earlier_resizes, "resizes");
    for (const Json& z : resizes) {
      out << "  at " << Secs(z.value("at_s", Json())) << ": " << Str(z.value("reason", Json()))
          << "\n";
    }
  }
  const auto [incidents, earlier_incidents] = Newest(r.value("incidents", Json::array()), max_rows);
  out << "\nIncidents: " << incidents.size() + earlier_incidents << "\n"
      << LeftOut(earlier_incidents, "incidents");
  if (incidents.empty()) return out.str();
  std::vector<std::vector<std::string>> table = {{"id", "cause", "rank", "node", "injected at",
                                                  "detected after", "recovered after", "steps lost",
                                                  "action"}};
  for (const Json& inc : incidents) {
    table.push_back({Str(inc.value("id", Json())), Str(inc.value("cause", Json())),
                     inc.value("rank", -1) >= 0 ? Str(inc["rank"]) : "-",
                     Str(inc.value("node", Json())), Secs(inc.value("injected_at_s", Json())),
                     Secs(inc.value("detected_after_s", Json())),
                     Secs(inc.value("recovered_after_s", Json())),
                     Str(inc.value("steps_lost", Json())), Str(inc.value("action", Json()))});
  }
  const std::string rendered =
      Table(table, {true, false, true, false, true, true, true, true, false}, "  ");
  // The header, then each incident's row followed by its details.
  std::istringstream lines(rendered);
  std::string line;
  std::getline(lines, line);
  out << line << "\n";
  for (const Json& inc : incidents) {
    std::getline(lines, line);
    out << line << "\n";
    const std::string pad = "      ";
    auto detail = [&](const std::string& label, const std::string& text) {
      if (!text.empty() && text != "-") out << pad << label << ": " << text << "\n";
    };
    detail("reason", Str(inc.value("reason", Json())));
    std::string suspects;
    for (const Json& s : inc.value("suspects", Json::array())) {
      suspects += (suspects.empty() ? "" : ", ") + Str(s);
    }
    detail("suspects", suspects);
    // The earlier incident most like it, and what resolved that one.
    const Json& similar = inc.contains("recurrence")
                              ? inc["recurrence"].value("similar", Json::array())
                              : Json::array();
    if (!similar.empty()) {
      const Json& s = similar[0];
      char score[16];
      std::snprintf(score, sizeof score, "%.2f", s.value("score", 0.0));
      detail("seen before", "like " + Str(s["job"]) + " incident " +
                                std::to_string(s.value("incident", 0)) + " (score " + score +
                                "): " + Str(s["resolution"]) +
                                (s.value("resolved_by_operator", false) ? " by an operator" : "") +
                                (Str(s["note"]).empty() ? "" : ": " + Str(s["note"])));
    }
    // The route back to training, and why that one.
    const std::string route = Str(inc.value("route", Json()));
    const std::string route_reason = Str(inc.value("route_reason", Json()));
    detail("route",
           route_reason.empty() || route_reason == "-" ? route : route + ": " + route_reason);
    detail("restore", Str(inc.value("restore", Json())));
    std::string phases;
    for (const char* key : {"teardown_s", "wait_s", "relaunch_s", "restore_s"}) {
      const Json& v = inc.value(key, Json());
      if (!v.is_number()) continue;
      if (std::string_view(key) == "wait_s" && v.get<double>() == 0.0) continue;
      const std::string name(key, std::string_view(key).size() - 2);
      phases += (phases.empty() ? "" : ", ") + name + " " + Secs(v);
    }
    detail("recovery", phases);
    detail("log", Str(inc.value("log_line", Json())));
    for (const Json& stack : inc.value("stacks", Json::array())) {
      std::istringstream stack_lines(Str(stack));
      std::string first;
      std::getline(stack_lines, first);
      out << pad << "stack " << first << "\n";
      std::string frame;
      constexpr int kFrames = 5;
      int shown = 0;
      while (std::getline(stack_lines, frame)) {
        if (shown++ == kFrames) {
          out << pad << "  ...\n";
          break;
        }
        out << pad << "  " << frame << "\n";
      }
    }
  }
  return out.str();
}

}  // namespace

std::string RenderReport(const Json& r, size_t rows) {
  return RenderRunReport(r, rows) + RenderEarlierRuns(r);
}

}  // namespace endure::controller
