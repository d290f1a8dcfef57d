// What the controller makes of an agent's event: the core's event (a
// JobEvent for JobMachine) and what the controller's shell alone needs of it
// (the log match that explains the exit that follows, a worker's last
// parameter fingerprint, a step's tokens, the node's checkpoint inventory).
// Pure: the controller's shell reads every event of an agent's stream through
// it, and the cluster simulation (sim/cluster_sim.h) reads what its nodes'
// cores (NodeMachine) send through it too. Input from another host is
// hostile until checked: values out of the worker contract's bounds are
// dropped, a damaged phase or fingerprint makes no event.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>

#include "common/clock.h"
#include "core/job_machine.h"
#include "proto/endure.pb.h"

namespace endure::core {

struct AgentEventContext {
  // The node registered under a name (a pair test names its peer so);
  // nullopt: none.
  std::function<std::optional<NodeId>(const std::string& name)> node_named;
  // The job spec's fault ids: only those are remembered as fired.
  const std::set<std::string>* fault_ids = nullptr;
  // Now on the controller's two clocks: a worker's wall-clock time stamp is
  // mapped onto the steady one.
  TimePoint now;
  double wall_now_s = 0;
};

struct AgentEventRead {
  std::optional<JobEvent> event;                               // none: nothing for the machine
  std::optional<proto::LogMatch> log_match;                    // explains the exit that follows
  std::optional<proto::ProgressUnmatched> progress_unmatched;  // a warning, once a generation
  std::string fingerprint;                                     // from a worker's last words
  int64_t tokens = 0;                                          // tokens of a step
  std::optional<proto::GenerationStopped> stopped;  // with the node's checkpoint inventory
};

// Reads `event`, sent on the stream of `node` (registered, its token checked).
AgentEventRead ReadAgentEvent(const proto::AgentEvent& event, NodeId node,
                              const AgentEventContext& context);

// A node the controller held (its stream dropped) registers again resuming
// `resumed` (-1: none) while the job runs generation `current` in `phase`:
// whether it is a member of that newer generation whose start went out while
// its stream was down. Such a node is no lost node: it is taken back, its
// stale workers stopped and the start sent again (a controller that restarts
// starts a generation as soon as its first agents resume; the others resume
// a moment later).
bool MissedItsStart(int64_t resumed, int64_t current, JobPhase phase, bool member);

}  // namespace endure::core
