// The job report: where every second of the job's wall time went (the ETTR
// ledger), what ETTR that makes, and for each incident its cause, where it
// hit, how long detection and each phase of the recovery took, and how many
// steps it cost. BuildReport makes the JSON (STATE_DIR/report.json and the
// state store); RenderReport turns it into the table `endure run` and
// `endure report` print. docs/report.md defines every figure. A report names
// its run ("run") and sums up the runs before it in the same state directory
// ("earlier_runs", as RunHistory).
//
// BuildReport and RenderReport are pure functions, safe to call from any
// thread (BuildReport only reads the JobMachine, which its owner must not
// step meanwhile); the functions that take a StateStore use it from the
// caller's thread, as the store requires.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "controller/state_store.h"
#include "core/ids.h"
#include "core/job_machine.h"

namespace endure::controller {

struct ReportInputs {
  // The job's decision core, after its last event: incidents(), ledger(),
  // checkpoints(), generation(). Must outlive the BuildReport call.
  const core::JobMachine& machine;
  std::string job;                // the job's name
  core::TimePoint start;          // when the job started (the machine's start)
  core::TimePoint end;            // when it ended; time after the ledger's last entry is "other"
  int exit_code = 0;              // 0 completed, 3 gave up, ...
  std::string verdict;            // why it ended (FinishAction::reason)
  std::string param_fingerprint;  // the trainer's final one; empty if unknown
  int64_t steps = 0;              // steps completed
  double last_loss = 0;
  std::vector<std::string> nodes;  // names of the nodes that took part
  std::string stopped_by;          // "SIGTERM" when a signal stopped the job; empty otherwise
  // By incident id: its id in the incident knowledge base and the earlier
  // incidents like it ({"kb_id", "similar": [...]}), as the controller found.
  std::map<int, nlohmann::json> recurrences;
};

// The report as JSON; keys in docs/report.md. "final" is true; "completed"
// is true only when training completed; "stopped_by" names the signal that
// stopped the job (null otherwise).
nlohmann::json BuildReport(const ReportInputs& inputs);

// The report of run `run` (the store's current one by default, the newest
// after Open) from its state store: the final report when one was saved;
// otherwise one built from the stored job, ledger and incidents (a run still
// going, or whose controller died), with "final": false. Either way with
// "run" and "earlier_runs" as of now, and "history" (live_history.h) where one was
// saved. NotFound when the store holds no job,
// or no such run.
Result<nlohmann::json> ReportFromStore(StateStore& store, int run = StateStore::kCurrentRun);

// A Unix time (seconds) as the reports show it: UTC, to the second; "-"
// for anything but a number.
std::string UtcTime(const nlohmann::json& unix_s);

// How the run ended, as the report says it: "completed", "gave up",
// "failed", "stopped by SIGNAL" or "not finished" (a report that is not
// final, or without an exit code).
std::string ReportOutcome(const nlohmann::json& report);

// Every run in the store, ascending, one JSON object each: "run", "job",
// "started_at_unix", "finished_at_unix" and "exit_code" (null while not
// finished), "verdict", "final" (its final report was saved), "incidents",
// "generations", "wall_s" and "ettr" (the final report's, else from the
// ledger as last saved).
Result<nlohmann::json> RunHistory(StateStore& store);

// Sets `report`'s "run" to the store's current run and "earlier_runs" to
// RunHistory's entries before it. On failure `report` is unchanged.
Status AddRunHistory(StateStore& store, nlohmann::json& report);

// One incident as the report and the live tables show it: cause, rank,
// node, route, its timings (seconds from `start`, and each phase of the
// recovery), steps lost, the reason, its log line and stacks.
nlohmann::json IncidentJson(const core::Incident& inc, core::TimePoint start);

// The human table: the ledger with ETTR, then one row per incident with its
// reason, log line and the first lines of its stacks, then one line per
// earlier run (when, exit code, incidents, ETTR, verdict).
// At a large job's scale the table stays readable: the nodes, refused
// nodes, stragglers, resizes and incidents beyond `rows` are left out (the
// newest kept) and counted; 0 shows every one.
inline constexpr size_t kReportRows = 50;
std::string RenderReport(const nlohmann::json& report, size_t rows = kReportRows);

}  // namespace endure::controller
