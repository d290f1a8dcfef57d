// The node health ledger of a job with warm spares: which physical nodes are
// in the job, which wait as spares, and which are out for repair. The
// recovery policy decides whether a failed node is evicted; this pool says
// whether a spare can take its place at once or the job has to wait until a
// node comes back from repair. Memory is one byte per node plus the spare
// list. Not thread-safe; one owner drives it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/ids.h"

namespace endure::core {

enum class NodeState : uint8_t { kActive, kSpare, kRepairing };

class SparePool {
 public:
  // Nodes 0 .. active_nodes-1 start in the job, the next `spares` nodes start
  // as warm spares. Both counts must be >= 0 (CHECKed).
  SparePool(int32_t active_nodes, int32_t spares);

  int32_t size() const { return static_cast<int32_t>(state_.size()); }
  NodeState state(NodeId node) const { return state_.at(node.value); }
  int32_t spares_available() const { return static_cast<int32_t>(spares_.size()); }
  int32_t repairing() const { return repairing_; }

  // Takes an active node or a spare out of service for repair. Evicting a
  // node already in repair is a bug (CHECKed).
  void Evict(NodeId node);

  // Moves a spare into the job and returns it; nullopt when there is none.
  // The most recently returned spare is handed out first.
  std::optional<NodeId> Acquire();

  // A node came back from repair and waits as a spare. It must be in repair.
  void MarkRepaired(NodeId node);

 private:
  std::vector<NodeState> state_;
  std::vector<NodeId> spares_;
  int32_t repairing_ = 0;
};

}  // namespace endure::core
