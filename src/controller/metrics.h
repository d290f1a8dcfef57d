// The controller's Prometheus metrics (issue 29, docs/monitoring.md):
// prometheus-cpp's registry, updated by the event loop once a second from
// the live tables and the machine, serialized by the HTTP thread on each
// scrape. Counters follow the machine's incidents (each counted once,
// by cause and route; detection and recovery times observed once each).
#pragma once

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "controller/live_tables.h"
#include "core/job_machine.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace endure::controller {

// What the shell knows of the checkpoints beside the machine.
struct DurableView {
  int64_t step = -1;    // the newest committed durable step (-1: none)
  double age_s = 0;     // since it was committed (since the start: none)
  int64_t commits = 0;  // committed by this run
};

class JobMetrics {
 public:
  JobMetrics(const std::string& job_name, int run);
  ~JobMetrics();
  JobMetrics(const JobMetrics&) = delete;
  JobMetrics& operator=(const JobMetrics&) = delete;

  // From the event loop, with each live status (/api/status) it publishes.
  void Update(const core::JobMachine& machine, const nlohmann::json& status,
              const DurableView& durable);
  // From the event loop, with each live view it builds (once a second): the
  // series by node, and the median step time.
  void UpdateNodes(const LiveTables& tables);
  // The text format 0.0.4, from any thread.
  std::string Text() const;

 private:
  struct NodeGauges {
    prometheus::Gauge* step = nullptr;     // members only
    prometheus::Gauge* slowest = nullptr;  // members only
    prometheus::Gauge* t0 = nullptr;
    prometheus::Gauge* t1 = nullptr;
  };
  void CountIncidents(const core::JobMachine& machine);
  prometheus::Gauge& Job(const char* name, const char* help);
  prometheus::Counter& Count(const char* name, const char* help);

  std::shared_ptr<prometheus::Registry> registry_;
  std::map<std::string, prometheus::Gauge*> gauges_;      // unlabelled, by name
  std::map<std::string, prometheus::Counter*> counters_;  // unlabelled, by name
  prometheus::Family<prometheus::Gauge>* phase_ = nullptr;
  prometheus::Family<prometheus::Gauge>* ledger_ = nullptr;
  prometheus::Family<prometheus::Gauge>* nodes_ = nullptr;
  prometheus::Family<prometheus::Counter>* incidents_ = nullptr;
  prometheus::Family<prometheus::Counter>* restarts_ = nullptr;
  prometheus::Family<prometheus::Gauge>* node_step_ = nullptr;
  prometheus::Family<prometheus::Gauge>* node_slowest_ = nullptr;
  prometheus::Family<prometheus::Gauge>* tier_bytes_ = nullptr;
  prometheus::Histogram* detection_ = nullptr;
  prometheus::Histogram* recovery_ = nullptr;
  std::map<std::string, NodeGauges> node_gauges_;  // by node name
  size_t incidents_counted_ = 0;
  // Incident ids counted whose restart, and whose recovery, is not yet.
  std::set<int> awaiting_restart_, awaiting_recovery_;
  // Totals that only the machine keeps (checkpoints taken, stragglers...),
  // as far as counted into their counter, by metric name.
  std::map<std::string, double> counted_;
  void CountUpTo(const char* name, const char* help, double total);
};

}  // namespace endure::controller
