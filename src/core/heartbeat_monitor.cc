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

void HeartbeatMonitor::Register(NodeId node, TimePoint now) {
  members_[node] = Member{.last_heartbeat = now, .dropped_at = std::nullopt, .lost = false};
}

void HeartbeatMonitor::Remove(NodeId node) { members_.erase(node); }

bool HeartbeatMonitor::OnHeartbeat(NodeId node, TimePoint now) {
  auto it = members_.find(node);
  if (it == members_.end() || it->second.lost) return false;
  it->second.last_heartbeat = std::max(it->second.last_heartbeat, now);
  return true;
}

void HeartbeatMonitor::OnStreamDropped(NodeId node, TimePoint now) {
  auto it = members_.find(node);
  if (it == members_.end() || it->second.lost || it->second.dropped_at.has_value()) return;
  it->second.dropped_at = now;
}

bool HeartbeatMonitor::OnStreamReconnected(NodeId node, TimePoint now) {
  auto it = members_.find(node);
  if (it == members_.end() || it->second.lost) return false;
  it->second.dropped_at.reset();
  it->second.last_heartbeat = std::max(it->second.last_heartbeat, now);
  return true;
}

void HeartbeatMonitor::Resume(TimePoint now) {
  for (auto& [node, m] : members_) {
    if (m.lost) continue;
    m.dropped_at.reset();
    m.last_heartbeat = std::max(m.last_heartbeat, now);
  }
}

std::optional<TimePoint> HeartbeatMonitor::LastHeard(NodeId node) const {
  auto it = members_.find(node);
  if (it == members_.end() || it->second.lost) return std::nullopt;
  return it->second.last_heartbeat;
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
  std::vector<CrashReport> lost;
  for (auto& [node, m] : members_) {
    if (m.lost || DeadlineOf(m) > now) continue;
    m.lost = true;
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
  std::optional<TimePoint> earliest;
  for (const auto& [node, m] : members_) {
    if (m.lost) continue;
    const TimePoint d = DeadlineOf(m);
    if (!earliest.has_value() || d < *earliest) earliest = d;
  }
  return earliest;
}

bool HeartbeatMonitor::IsLost(NodeId node) const {
  auto it = members_.find(node);
  return it != members_.end() && it->second.lost;
}

}  // namespace endure::core
