// The job report: where every second of the job's wall time went (the ETTR
// ledger), what ETTR that makes, and for each incident its cause, where it
// hit, how long detection and each phase of the recovery took, and how many
// steps it cost. BuildReport makes the JSON (STATE_DIR/report.json and the
// state store); RenderReport turns it into the table `endure run` and
// `endure report` print. docs/report.md defines every figure.
//
// Pure functions; safe to call from any thread (BuildReport only reads the
// JobMachine, which its owner must not step meanwhile).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "core/ids.h"
#include "core/job_machine.h"

namespace endure::controller {

class StateStore;

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
};

// The report as JSON; keys in docs/report.md. "final" is true; "completed"
// is true only when training completed; "stopped_by" names the signal that
// stopped the job (null otherwise).
nlohmann::json BuildReport(const ReportInputs& inputs);

// The report of a job from its state store: the final report when one was
// saved; otherwise one built from the stored job, ledger and incidents (a job
// still running, or whose controller died), with "final": false. NotFound
// when the store holds no job.
Result<nlohmann::json> ReportFromStore(StateStore& store);

// The human table: the ledger with ETTR, then one row per incident with its
// reason, log line and the first lines of its stacks.
std::string RenderReport(const nlohmann::json& report);

}  // namespace endure::controller
