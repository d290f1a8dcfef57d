// Strike record of the simulator; see strikes.h.
#include "sim/strikes.h"

#include <chrono>

#include "core/node_health.h"

namespace endure::sim {

bool IsHardStrikeCause(std::string_view cause) {
  return core::StrikeClassOf(cause) == core::StrikeClass::kHard;
}

StrikeRecord::StrikeRecord(int64_t soft_strikes, Duration soft_window)
    : soft_strikes_(soft_strikes), soft_window_(soft_window) {}

StrikeVerdict StrikeRecord::Strike(core::NodeId node, std::string_view cause, Duration now) {
  const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(now).count();
  std::vector<Entry>& entries = strikes_[node.value];
  entries.push_back({std::string(cause), ms});
  // All strikes since the release, as the controller's ledger passes them:
  // at most the node's failures in one run.
  std::vector<core::Strike> strikes;
  strikes.reserve(entries.size());
  for (const Entry& e : entries) strikes.push_back(core::StrikeFor(e.cause, e.unix_ms));
  core::NodeHealthOptions options;
  options.soft_strikes = static_cast<int>(soft_strikes_);
  options.soft_window = soft_window_;
  core::NodeVerdict v = core::JudgeNode(strikes, ms, options);
  StrikeVerdict out;
  out.quarantined = v.state == core::HealthState::kQuarantined;
  out.hard = core::StrikeClassOf(cause) == core::StrikeClass::kHard;
  out.reason = std::move(v.reason);
  return out;
}

void StrikeRecord::Release(core::NodeId node) { strikes_.erase(node.value); }

}  // namespace endure::sim
