// HeartbeatMonitor: decides that a node is lost because it stopped talking.
//
// Each node's agent holds a stream to the controller and sends heartbeats on
// it. A node is lost when
//   - its stream dropped and it has neither reconnected nor sent a heartbeat
//     within `drop_grace` of the drop (a dead agent's socket closes at once; a
//     network blip reconnects within the grace), or
//   - it sent no heartbeat for `timeout`, even though its stream looks open (a
//     frozen agent, or a partition the transport has not noticed yet).
// A lost node is reported once and stays lost, ignoring its heartbeats, until
// it is registered again: a node that comes back must rejoin explicitly, so it
// cannot slip into a generation it was evicted from.
//
// Sans-I/O: the caller passes `now` and sleeps until NextDeadline(). Not
// thread-safe.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "core/crash_detector.h"
#include "core/ids.h"

namespace endure::core {

struct HeartbeatMonitorOptions {
  // Silence after which a node with an open stream is lost.
  Duration timeout = std::chrono::seconds(10);
  // Time a node whose stream dropped has to reconnect or send a heartbeat.
  Duration drop_grace = std::chrono::seconds(2);

  // Names the first invalid field and its accepted range.
  Status Validate() const;
};

class HeartbeatMonitor {
 public:
  // `options` must be valid (ENDURE_CHECK).
  explicit HeartbeatMonitor(HeartbeatMonitorOptions options);

  // `node` joined (or rejoined after being lost) at `now`, stream open.
  void Register(NodeId node, TimePoint now);
  // `node` left on purpose (job end, eviction): no longer watched.
  void Remove(NodeId node);

  // A heartbeat from `node`. Returns false when the node is not registered or
  // was declared lost: the caller should drop the message and fence the node.
  bool OnHeartbeat(NodeId node, TimePoint now);
  // The node's stream closed or failed at `now`.
  void OnStreamDropped(NodeId node, TimePoint now);
  // The node reconnected its stream at `now` (within the grace: not lost).
  // Returns false, like OnHeartbeat, for an unknown or lost node.
  bool OnStreamReconnected(NodeId node, TimePoint now);

  // The watcher was away until `now` (a controller that carried on after
  // its own outage): the silence meanwhile is not the nodes'. Every node not
  // yet lost is judged afresh from `now`, its stream taken as open.
  void Resume(TimePoint now);
  // Nodes that became lost by `now`, each reported once (cause "node_lost"),
  // ordered by node id.
  std::vector<CrashReport> Check(TimePoint now);

  // The earliest time Check could report a node, or nullopt when no node is
  // watched. O(1): the deadlines are kept in order as they change (a
  // heartbeat costs O(log n), a Check O(log n) per node it reports).
  std::optional<TimePoint> NextDeadline() const;

  bool IsLost(NodeId node) const;
  // When `node` was last heard from (registered, a heartbeat, reconnected);
  // nullopt for a node not watched or lost.
  std::optional<TimePoint> LastHeard(NodeId node) const;
  // Whether a node that `counts` was last heard from at or before `when`
  // (not lost). O(log n + the nodes heard from before `when` that do not
  // count): the nodes are kept in order of when they were last heard.
  bool AnyHeardBy(TimePoint when, const std::function<bool(NodeId)>& counts) const;

  const HeartbeatMonitorOptions& options() const { return options_; }

  // Its state, for a snapshot of the job (core/job_snapshot.h); the options
  // come from the job's configuration.
  template <class Archive>
  void serialize(Archive& ar) {
    ar(members_, deadlines_, heard_);
  }

 private:
  struct Member {
    TimePoint last_heartbeat{};
    std::optional<TimePoint> dropped_at;
    bool lost = false;
    std::optional<TimePoint> filed;  // its entry in deadlines_ (none once lost)
    std::optional<TimePoint> heard;  // its entry in heard_ (none once lost)

    template <class Archive>
    void serialize(Archive& ar) {
      ar(last_heartbeat, dropped_at, lost, filed, heard);
    }
  };
  TimePoint DeadlineOf(const Member& m) const;
  // Files `m`'s deadline again after it changed (removes it once lost).
  void Refile(NodeId node, Member& m);

  HeartbeatMonitorOptions options_;
  std::map<NodeId, Member> members_;
  std::set<std::pair<TimePoint, NodeId>> deadlines_;  // of the members not lost
  std::set<std::pair<TimePoint, NodeId>> heard_;      // their last heartbeats
};

}  // namespace endure::core
