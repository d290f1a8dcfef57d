// One simulated run of a data-parallel training job under failures: a
// discrete-event simulation in which nodes fail as Poisson processes, a
// failure is detected after its cause's latency, the recovery decision comes
// from core::RecoveryPolicy, replacements from core::SparePool, and every
// nanosecond is booked in core::EttrLedger. Deterministic for a given seed.
//
// Model (docs/sim.md has the details):
//  - The job trains in segments of `ckpt_interval` of training followed by a
//    blocking checkpoint of `ckpt_write`; the checkpoint commits the segment.
//  - A failure while training or checkpointing loses the uncommitted segment.
//  - The job is then down: detection, the policy's backoff, waiting for a
//    spare or a repair, then `restart`. A failure while down starts the
//    detection over (the restart itself can fail), as in the exact model.
//  - Elastic (min_nodes): with no spare, the job goes on with fewer nodes at
//    a proportionally slower step, and grows back in process when a node is
//    free again.
//  - Implicit failures: stragglers flagged after the detector's window and
//    decided by core::DecideStraggler; silent data corruption found by the
//    SDC check (or, without one, by a loss spike much later); strikes per
//    node judged by core::JudgeNode; health checks before a node joins.
//  - Work in flight at the end of the run counts as productive (a final
//    checkpoint is assumed). A job that gives up books the rest as other.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/duration.h"
#include "core/ettr_ledger.h"
#include "core/recovery_policy.h"
#include "core/recovery_route.h"
#include "core/straggler.h"
#include "sim/scenario.h"

namespace endure::sim {

// Which core decision an incident records.
enum class IncidentKind {
  kFailure,      // core::RecoveryPolicy::Step on a detected failure
  kStraggler,    // core::DecideStraggler on a flagged straggler
  kSdc,          // silent data corruption found (core::SdcChecker's verdict, or a loss spike)
  kQuarantine,   // core::JudgeNode quarantined a node the other decisions kept
  kHealthCheck,  // a node failed the health check and was not admitted
};
// "failure", "straggler", "sdc", "quarantine", "health_check".
std::string_view IncidentKindName(IncidentKind kind);

// One decision, for the incident log: what the simulator did and the core's
// reason for it. `action` is core::RecoveryActionName (kFailure),
// core::StragglerMoveName (kStraggler), "rollback_and_evict" or "rollback"
// (kSdc), "quarantine" or "refuse" (kQuarantine, kHealthCheck).
struct Incident {
  Duration time{0};  // when the decision was taken
  Duration detection{0};
  core::NodeId node;
  IncidentKind kind = IncidentKind::kFailure;
  std::string cause;
  std::string action;
  std::string reason;
  // kStraggler: the inputs DecideStraggler was given, so that a test can
  // recompute the decision.
  core::StragglerCosts straggler_costs;
  // kFailure that restarts: how the job gets back to training, and why
  // (core::ChooseRoute, as the controller's job machine decides it).
  std::optional<core::RecoveryRoute> route;
  std::string route_reason;
};

struct RunResult {
  uint64_t seed = 0;
  std::array<Duration, core::kNumLedgerCategories> ledger{};
  Duration wall{0};
  int64_t failures = 0;  // faults that hit a node of the job, including while it was down
  std::vector<int64_t> failures_by_cause;  // indexed like SimConfig::causes
  int64_t stragglers = 0;                  // slow nodes that joined the job
  int64_t stragglers_flagged = 0;          // flags raised (a node again in each generation)
  int64_t straggler_moves = 0;             // flags DecideStraggler acted on (swap or evict)
  int64_t sdc_events = 0;                  // corruptions of a training replica
  int64_t sdc_detected = 0;                // found by the SDC check
  int64_t sdc_undetected = 0;              // found late, by a loss spike
  int64_t quarantines = 0;                 // nodes JudgeNode removed that the policy kept
  int64_t health_check_refusals = 0;       // nodes refused before joining
  int64_t checkpoints = 0;
  int64_t restarts = 0;
  int64_t in_process_restarts = 0;  // of them, in process (SimConfig::in_process)
  int64_t shrinks = 0;              // recoveries that went on with fewer nodes (route shrink)
  int64_t regrows = 0;              // returns of a shrunk job to more nodes, in process
  int64_t replacements = 0;         // nodes swapped into the job (spares, repaired nodes)
  int64_t events = 0;               // discrete events processed
  bool gave_up = false;
  std::string stop_reason;
  std::vector<Incident> incidents;  // the first `max_incidents`

  Duration category(core::LedgerCategory c) const { return ledger[static_cast<int>(c)]; }
  double ettr() const;
};

// Simulates one run. `config` must have passed Finalize(). Keeps the first
// `max_incidents` decisions in RunResult::incidents.
RunResult SimulateRun(const SimConfig& config, uint64_t seed, int max_incidents = 0);

// The seed of run `index` of an experiment seeded with `seed` (SplitMix64).
uint64_t RunSeed(uint64_t seed, int64_t index);

}  // namespace endure::sim
