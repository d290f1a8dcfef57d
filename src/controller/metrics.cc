// The controller's Prometheus metrics; see metrics.h and docs/monitoring.md.
#include "controller/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <cmath>
#include <vector>

#include "common/duration.h"
#include "core/cause.h"
#include "core/recovery_route.h"

#ifndef ENDURE_REVISION
#define ENDURE_REVISION "unknown"
#endif
#ifndef ENDURE_VERSION
#define ENDURE_VERSION "unknown"
#endif

namespace endure::controller {
JobMetrics::JobMetrics(const std::string& job_name, int run)
    : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::BuildGauge()
      .Name("endure_build_info")
      .Help("The controller's build: 1, with its version and revision as labels.")
      .Register(*registry_)
      .Add({{"version", ENDURE_VERSION}, {"revision", ENDURE_REVISION}})
      .Set(1);
  prometheus::BuildGauge()
      .Name("endure_job_info")
      .Help("The job this controller runs: 1, with its name and run number as labels.")
      .Register(*registry_)
      .Add({{"name", job_name}, {"run", std::to_string(run)}})
      .Set(1);
  phase_ = &prometheus::BuildGauge()
                .Name("endure_phase")
                .Help("1 for the job's current phase, 0 for the others.")
                .Register(*registry_);
  ledger_ = &prometheus::BuildGauge()
                 .Name("endure_ledger_seconds")
                 .Help(
                     "Wall time so far by ETTR ledger category (a rollback moves time "
                     "booked productive to recompute, so not a counter).")
                 .Register(*registry_);
  nodes_ = &prometheus::BuildGauge()
                .Name("endure_nodes")
                .Help("Registered nodes by state: member, spare, down, refused.")
                .Register(*registry_);
  incidents_ = &prometheus::BuildCounter()
                    .Name("endure_incidents_total")
                    .Help("Failures detected, by cause.")
                    .Register(*registry_);
  restarts_ = &prometheus::BuildCounter()
                   .Name("endure_restarts_total")
                   .Help("Recoveries begun, by route (in_process, spare, shrink, full_restart).")
                   .Register(*registry_);
  // Every known cause and route starts at zero, so that the first incident
  // is an increase (rate() and increase() see nothing in a series that
  // appears with its first value).
  for (const std::string& cause : core::CauseLabels()) incidents_->Add({{"cause", cause}});
  for (core::RecoveryRoute route :
       {core::RecoveryRoute::kInProcess, core::RecoveryRoute::kSpare, core::RecoveryRoute::kShrink,
        core::RecoveryRoute::kFullRestart}) {
    restarts_->Add({{"route", std::string(core::RecoveryRouteName(route))}});
  }
  node_step_ = &prometheus::BuildGauge()
                    .Name("endure_node_step_seconds")
                    .Help("A member node's mean step compute time over the straggler window.")
                    .Register(*registry_);
  node_slowest_ = &prometheus::BuildGauge()
                       .Name("endure_node_slowest_rank_step_seconds")
                       .Help(
                           "A member node's slowest rank's mean step compute time over the "
                           "straggler window.")
                       .Register(*registry_);
  tier_bytes_ = &prometheus::BuildGauge()
                     .Name("endure_tier_bytes")
                     .Help("Checkpoint bytes a node's memory tiers hold, as last reported.")
                     .Register(*registry_);
  detection_ = &prometheus::BuildHistogram()
                    .Name("endure_detection_seconds")
                    .Help("Fault to detection, per incident.")
                    .Register(*registry_)
                    .Add({}, prometheus::Histogram::BucketBoundaries{0.1, 0.25, 0.5, 1, 2, 5, 10,
                                                                     30, 60, 120, 300});
  recovery_ = &prometheus::BuildHistogram()
                   .Name("endure_recovery_seconds")
                   .Help("Fault to the first productive step after it, per incident.")
                   .Register(*registry_)
                   .Add({}, prometheus::Histogram::BucketBoundaries{0.5, 1, 2, 5, 10, 30, 60, 120,
                                                                    300, 600, 1800});
}

JobMetrics::~JobMetrics() = default;

prometheus::Gauge& JobMetrics::Job(const char* name, const char* help) {
  prometheus::Gauge*& g = gauges_[name];
  if (g == nullptr) {
    g = &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add({});
  }
  return *g;
}

prometheus::Counter& JobMetrics::Count(const char* name, const char* help) {
  prometheus::Counter*& c = counters_[name];
  if (c == nullptr) {
    c = &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add({});
  }
  return *c;
}

void JobMetrics::CountUpTo(const char* name, const char* help, double total) {
  prometheus::Counter& c = Count(name, help);
  double& counted = counted_[name];
  if (total > counted) {
    c.Increment(total - counted);
    counted = total;
  }
}

void JobMetrics::CountIncidents(const core::JobMachine& machine) {
  const std::vector<core::Incident>& incidents = machine.incidents();
  for (; incidents_counted_ < incidents.size(); ++incidents_counted_) {
    const core::Incident& inc = incidents[incidents_counted_];
    incidents_->Add({{"cause", core::CauseLabel(inc.cause.name)}}).Increment();
    detection_->Observe(std::max(0.0, Seconds(inc.detected_at - inc.fault_at)));
    awaiting_restart_.insert(inc.id);
    awaiting_recovery_.insert(inc.id);
  }
  // The restart (its route, once the next generation starts) and the
  // recovery (its first step) come later than the incident, each counted
  // once when it does.
  int64_t steps_lost = 0;
  for (const core::Incident& inc : incidents) {
    steps_lost += inc.steps_lost();
    if (inc.route && (inc.relaunched_at || inc.recovered_at) && awaiting_restart_.erase(inc.id)) {
      restarts_->Add({{"route", std::string(core::RecoveryRouteName(*inc.route))}}).Increment();
    }
    if (inc.recovered_at && awaiting_recovery_.erase(inc.id)) {
      recovery_->Observe(std::max(0.0, Seconds(*inc.recovered_at - inc.fault_at)));
    }
  }
  CountUpTo("endure_steps_lost_total", "Steps redone after incidents.", double(steps_lost));
}

void JobMetrics::UpdateNodes(const LiveTables& tables) {
  std::set<std::string> seen;
  for (const NodeRow& row : tables.node_rows) {
    seen.insert(row.name);
    NodeGauges& g = node_gauges_[row.name];
    if (g.t0 == nullptr) {
      g.t0 = &tier_bytes_->Add({{"node", row.name}, {"tier", "T0"}});
      g.t1 = &tier_bytes_->Add({{"node", row.name}, {"tier", "T1"}});
    }
    g.t0->Set(double(row.tiers.t0_bytes));
    g.t1->Set(double(row.tiers.t1_bytes));
    // Step times only for members that reported: a series that is absent
    // says "not training here", where a stale value would mislead.
    const bool timed = row.state == NodeState::kMember && std::isfinite(row.step_s);
    if (timed && g.step == nullptr) {
      g.step = &node_step_->Add({{"node", row.name}});
      g.slowest = &node_slowest_->Add({{"node", row.name}});
    } else if (!timed && g.step != nullptr) {
      node_step_->Remove(g.step);
      node_slowest_->Remove(g.slowest);
      g.step = g.slowest = nullptr;
    }
    if (timed) {
      g.step->Set(row.step_s);
      g.slowest->Set(row.slowest_s);
    }
  }
  for (auto it = node_gauges_.begin(); it != node_gauges_.end();) {
    if (seen.contains(it->first)) {
      ++it;
      continue;
    }
    tier_bytes_->Remove(it->second.t0);
    tier_bytes_->Remove(it->second.t1);
    if (it->second.step != nullptr) {
      node_step_->Remove(it->second.step);
      node_slowest_->Remove(it->second.slowest);
    }
    it = node_gauges_.erase(it);
  }
  for (int s = 0; s < kNumNodeStates; ++s) {
    nodes_->Add({{"state", std::string(NodeStateName(static_cast<NodeState>(s)))}})
        .Set(tables.nodes_by_state[s]);
  }
  Job("endure_step_seconds_median",
      "The median rank's mean step compute time over the straggler window.")
      .Set(tables.median_step_s);
  // The job's slowest rank now (the first outlier): which, and how slow.
  const bool any = !tables.outliers.empty();
  Job("endure_slowest_rank", "The rank with the longest mean step compute time now (-1: none).")
      .Set(any ? tables.outliers[0]["rank"].get<double>() : -1);
  Job("endure_slowest_rank_step_seconds", "That rank's mean step compute time over the window.")
      .Set(any ? tables.outliers[0]["step_s"].get<double>() : std::nan(""));
}

void JobMetrics::Update(const core::JobMachine& machine, const nlohmann::json& status,
                        const DurableView& durable) {
  for (core::JobPhase p :
       {core::JobPhase::kWaitingForNodes, core::JobPhase::kRunning, core::JobPhase::kStopping,
        core::JobPhase::kTesting, core::JobPhase::kWaiting, core::JobPhase::kDone}) {
    phase_->Add({{"phase", std::string(core::JobPhaseName(p))}}).Set(machine.phase() == p ? 1 : 0);
  }
  for (int c = 0; c < core::kNumLedgerCategories; ++c) {
    const auto category = static_cast<core::LedgerCategory>(c);
    ledger_->Add({{"category", std::string(core::LedgerCategoryName(category))}})
        .Set(Seconds(machine.ledger().total(category)));
  }
  Job("endure_generation", "The worker set's generation.").Set(machine.generation().value);
  Job("endure_step", "Steps every rank has completed.").Set(double(machine.step().value));
  Job("endure_loss", "Rank 0's loss at its last step.").Set(machine.last_loss());
  Job("endure_steps_per_second", "Training steps per second.")
      .Set(status.value("steps_per_s", 0.0));
  Job("endure_tokens_per_second", "Training throughput in tokens per second.")
      .Set(status.value("tokens_per_s", 0.0));
  Job("endure_ettr", "Effective training time ratio so far: productive / wall time (0..1).")
      .Set(machine.ledger().Ettr());
  Job("endure_skipped_steps", "Steps whose data the job skips after a loss anomaly.")
      .Set(double(machine.skipped_steps().size()));

  CountIncidents(machine);

  const core::CheckpointTotals book = machine.checkpoints().totals();
  CountUpTo("endure_checkpoints_taken_total", "Checkpoints taken (T0 copies).",
            double(book.copies_taken));
  CountUpTo("endure_persist_failures_total", "Shards or manifests that failed to persist.",
            double(book.persist_failures));
  CountUpTo("endure_durable_commits_total", "Durable checkpoints this run committed.",
            double(durable.commits));
  Job("endure_durable_checkpoint_step", "The newest committed durable step (-1: none).")
      .Set(double(durable.step));
  Job("endure_durable_checkpoint_age_seconds",
      "Time since the newest durable checkpoint was committed (since the job started when "
      "there is none).")
      .Set(durable.age_s);
  CountUpTo("endure_stragglers_flagged_total", "Stragglers flagged and kept.",
            double(machine.stragglers().size()));
  CountUpTo("endure_data_anomalies_total",
            "Loss anomalies whose replay reproduced them bit for bit (the data's), trained "
            "through.",
            double(machine.data_anomalies().size()));

  const nlohmann::json& c = status.value("controller", nlohmann::json::object());
  Job("endure_controller_queued_inputs", "Inputs waiting for the controller's event loop.")
      .Set(c.value("queued", 0.0));
  Job("endure_controller_behind_seconds",
      "How long the oldest queued input has waited for the event loop.")
      .Set(c.value("behind_s", 0.0));
  Job("endure_controller_overloaded",
      "1 while the controller is overloaded (its oldest queued input waited over 2s).")
      .Set(c.value("overloaded", false) ? 1 : 0);
  CountUpTo("endure_controller_overloaded_seconds_total", "Time the controller spent overloaded.",
            c.value("overloaded_s", 0.0));
  Job("endure_journal_bytes_since_snapshot",
      "The controller's journal since its last snapshot: what a restart replays.")
      .Set(c.value("journal_bytes_since_snapshot", 0.0));
  Job("endure_snapshot_bytes", "Size of the controller's last snapshot of its decision core.")
      .Set(c.value("snapshot_bytes", 0.0));
  CountUpTo("endure_snapshots_total", "Snapshots this controller took.", c.value("snapshots", 0.0));
}

std::string JobMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace endure::controller
