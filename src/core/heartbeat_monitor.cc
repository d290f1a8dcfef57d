// Lost-node detection from heartbeats and stream state; see heartbeat_monitor.h.
#include "core/heartbeat_monitor.h"

#include <algorithm>

namespace endure::core {

Status HeartbeatMonitorOptions::Validate() const {
  if (timeout <= Duration::zero()) {
    return InvalidArgument("heartbeat monitor: timeout must be positive, got " +
                           FormatDuration(timeout));
  }
  if (drop_grace < Duration::zero() || drop_grace > timeout) {
    return InvalidArgument("heartbeat monitor: drop_grace must be in [0, timeout=" +
                           FormatDuration(timeout) + "], got " + FormatDuration(drop_grace));
  }
  return Status::Ok();
}

HeartbeatMonitor::HeartbeatMonitor(HeartbeatMonitorOptions options) : options_(options) {
  ENDURE_CHECK(options_.Validate().ok());
}

void HeartbeatMonitor::Refile(NodeId node, Member& m) {
  if (m.filed) deadlines_.erase({*m.filed, node});
  if (m.heard) heard_.erase({*m.heard, node});
  m.filed.reset();
  m.heard.reset();
  if (m.lost) return;
  m.filed = DeadlineOf(m);
  deadlines_.insert({*m.filed, node});
  m.heard = m.last_heartbeat;
  heard_.insert({*m.heard, node});
}

void HeartbeatMonitor::Register(NodeId node, TimePoint now) {
  Remove(node);
  Member& m = members_[node];
  m.last_heartbeat = now;
  Refile(node, m);
}

void HeartbeatMonitor::Remove(NodeId node) {
  auto it = members_.find(node);
  if (it == members_.end()) return;
  if (it->second.filed) deadlines_.erase({*it->second.filed, node});
  if (it->second.heard) heard_.erase({*it->second.heard, node});
  members_.erase(it);
}

bool HeartbeatMonitor::OnHeartbeat(NodeId node, TimePoint now) {
  auto it = members_.find(node);
  if (it == members_.end() || it->second.lost) return false;
  it->second.last_heartbeat = std::max(it->second.last_heartbeat, now);
  Refile(node, it->second);
  return true;
}

void HeartbeatMonitor::OnStreamDropped(NodeId node, TimePoint now) {
  auto it = members_.find(node);
  if (it == members_.end() || it->second.lost || it->second.dropped_at.has_value()) return;
  it->second.dropped_at = now;
  Refile(node, it->second);
}

bool HeartbeatMonitor::OnStreamReconnected(NodeId node, TimePoint now) {
  auto it = members_.find(node);
  if (it == members_.end() || it->second.lost) return false;
  it->second.dropped_at.reset();
  it->second.last_heartbeat = std::max(it->second.last_heartbeat, now);
  Refile(node, it->second);
  return true;
}

void HeartbeatMonitor::Resume(TimePoint now) {
  for (auto& [node, m] : members_) {
    if (m.lost) continue;
    m.dropped_at.reset();
    m.last_heartbeat = std::max(m.last_heartbeat, now);
    Refile(node, m);
  }
}

std::optional<TimePoint> HeartbeatMonitor::LastHeard(NodeId node) const {
  auto it = members_.find(node);
  if (it == members_.end() || it->second.lost) return std::nullopt;
  return it->second.last_heartbeat;
}

bool HeartbeatMonitor::AnyHeardBy(TimePoint when, const std::function<bool(NodeId)>& counts) const {
  for (auto it = heard_.begin(); it != heard_.end() && it->first <= when; ++it) {
    if (counts(it->second)) return true;
  }
  return false;
}

TimePoint HeartbeatMonitor::DeadlineOf(const Member& m) const {
  TimePoint deadline = m.last_heartbeat + options_.timeout;
  // A heartbeat that arrives after the drop (over a path that survived) also
  // restarts the grace.
  if (m.dropped_at.has_value()) {
    deadline = std::min(deadline, std::max(*m.dropped_at, m.last_heartbeat) + options_.drop_grace);
  }
  return deadline;
}

std::vector<CrashReport> HeartbeatMonitor::Check(TimePoint now) {
  std::vector<NodeId> due;
  for (auto it = deadlines_.begin(); it != deadlines_.end() && it->first <= now; ++it) {
    due.push_back(it->second);
  }
  std::sort(due.begin(), due.end());
  std::vector<CrashReport> lost;
  for (NodeId node : due) {
    Member& m = members_.at(node);
    m.lost = true;
    Refile(node, m);
    CrashReport r;
    r.kind = CrashKind::kNodeLost;
    r.cause = "node_lost";
    r.node = node;
    r.last_seen = m.last_heartbeat;
    const std::string silent = FormatDuration(now - m.last_heartbeat);
    if (m.dropped_at.has_value() &&
        std::max(*m.dropped_at, m.last_heartbeat) + options_.drop_grace <= now) {
      r.reason = "node " + std::to_string(node.value) + ": stream dropped " +
                 FormatDuration(now - *m.dropped_at) + " ago without reconnecting (grace " +
                 FormatDuration(options_.drop_grace) + "); last heartbeat " + silent + " ago";
    } else {
      r.reason = "node " + std::to_string(node.value) + ": no heartbeat for " + silent +
                 (m.dropped_at.has_value() ? "" : " while its stream stayed open") + " (timeout " +
                 FormatDuration(options_.timeout) + ")";
    }
    lost.push_back(std::move(r));
  }
  return lost;
}

std::optional<TimePoint> HeartbeatMonitor::NextDeadline() const {
  if (deadlines_.empty()) return std::nullopt;
  return deadlines_.begin()->first;
}

bool HeartbeatMonitor::IsLost(NodeId node) const {
  auto it = members_.find(node);
  return it != members_.end() && it->second.lost;
}

}  // namespace endure::core
