// The live view of a job (issues 24 and 29): the node and incident tables
// the dashboard at `/` and `/api/nodes`, `/api/incidents` show a page at a
// time, step time by node (`/api/steptimes`), and the aggregates /metrics
// exports. The shell builds them from its machine at most once a second;
// the HTTP thread reads the last ones built, so no request walks 12,500
// nodes or touches the event loop.
#pragma once

#include <array>
#include <deque>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/report.h"
#include "core/job_machine.h"

namespace endure::controller {

enum class NodeState { kMember, kSpare, kDown, kRefused };
inline constexpr int kNumNodeStates = 4;
std::string_view NodeStateName(NodeState state);  // "member", "spare", "down", "refused"

// A node's memory tiers as it last reported them (a shard it persisted, or
// its generation's teardown).
struct NodeTiers {
  uint64_t t0_bytes = 0;
  uint64_t t1_bytes = 0;
  int64_t persisted_step = -1;  // the newest step it persisted to durable storage
  // The newest step in its T0 and T1 as its last inventory listed them (a
  // generation's teardown; -1: none listed).
  int64_t t0_step = -1;
  int64_t t1_step = -1;
};

// What the shell knows beside the machine.
struct LiveInputs {
  std::map<std::string, int> strikes;         // active strikes, by node name
  std::map<std::string, NodeTiers> tiers;     // by node name
  std::map<int, nlohmann::json> recurrences;  // the knowledge base's, by incident id
};

// One registered node, by id.
struct NodeRow {
  core::NodeId node;
  std::string name;
  NodeState state = NodeState::kDown;
  int first_rank = -1;  // members
  std::string why;      // refused
  int strikes = 0;
  NodeTiers tiers;
  // Members: the mean step compute time of its ranks over the straggler
  // window, and its slowest rank (NaN, -1: none reported yet).
  double step_s = 0;
  int slowest_rank = -1;
  double slowest_s = 0;
};

struct LiveTables {
  std::vector<NodeRow> node_rows;
  // The rows as /api/nodes pages them: "node", "name", "state",
  // "first_rank" (members), "why" (refused), "strikes", "t0_bytes",
  // "t1_bytes", "t0_step", "t1_step", "persisted_step", "step_s",
  // "slowest_rank", "slowest_s".
  std::vector<nlohmann::json> nodes;
  // One row per incident, newest first, as the report has it
  // (IncidentJson), with "recurrence" where the knowledge base has one.
  std::vector<nlohmann::json> incidents;
  std::array<int, kNumNodeStates> nodes_by_state{};
  double median_step_s = 0;  // the median rank's mean step time (NaN: none yet)
  // Up to kOutliers slowest ranks now, slowest first: "rank", "node",
  // "step_s", "vs_median", "flagged".
  nlohmann::json outliers = nlohmann::json::array();
  // /api/steptimes (StepHeat::ToJson with the outliers), set by the shell.
  nlohmann::json steptimes = nlohmann::json::object();
};
inline constexpr size_t kOutliers = 20;
LiveTables BuildLiveTables(const core::JobMachine& machine, core::TimePoint start,
                           const LiveInputs& inputs);

// The step-time heatmap over the recent past: at each sample, the member
// nodes in bands of consecutive nodes (at most kMaxBands), each band's
// slowest node's mean step time. Readable at any number of nodes: a band
// stands for up to nodes / kMaxBands nodes, and the outliers name the ranks.
class StepHeat {
 public:
  static constexpr size_t kMaxBands = 100;
  static constexpr size_t kMaxSamples = 60;

  void Add(double t_s, const LiveTables& tables);
  // /api/steptimes: "t_s", "bands", "band_max_s", "median_s" (docs/monitoring.md).
  nlohmann::json ToJson() const;

 private:
  struct Sample {
    double t_s = 0;
    std::vector<double> band_max_s;  // NaN: no node of the band reported
    double median_s = 0;
  };
  std::deque<Sample> samples_;
  nlohmann::json bands_ = nlohmann::json::array();  // the newest sample's
};

// Page `page` of `rows` (the request's "page" parameter; empty is page 0):
// {"total", "page", "pages", "page_rows", "rows"}; a page is as long as
// the report's tables. A page past the last has
// no rows. Anything but a whole number 0..1e9 is an InvalidArgument that
// says what to send.
Result<nlohmann::json> PageOf(const std::vector<nlohmann::json>& rows, std::string_view page,
                              size_t page_rows = kReportRows);

}  // namespace endure::controller
