// Spare pool and node health ledger; see spare_pool.h.
#include "core/spare_pool.h"

#include <algorithm>

#include "common/status.h"

namespace endure::core {

SparePool::SparePool(int32_t active_nodes, int32_t spares) {
  ENDURE_CHECK(active_nodes >= 0 && spares >= 0);
  state_.assign(static_cast<size_t>(active_nodes) + spares, NodeState::kActive);
  spares_.reserve(spares);
  // Hand out the lowest-numbered spare first: push in reverse.
  for (int32_t i = active_nodes + spares - 1; i >= active_nodes; --i) {
    state_[i] = NodeState::kSpare;
    spares_.push_back(NodeId{i});
  }
}

void SparePool::Evict(NodeId node) {
  NodeState& s = state_.at(node.value);
  ENDURE_CHECK(s != NodeState::kRepairing);
  if (s == NodeState::kSpare) {
    spares_.erase(std::find(spares_.begin(), spares_.end(), node));
  }
  s = NodeState::kRepairing;
  ++repairing_;
}

std::optional<NodeId> SparePool::Acquire() {
  if (spares_.empty()) return std::nullopt;
  NodeId node = spares_.back();
  spares_.pop_back();
  state_[node.value] = NodeState::kActive;
  return node;
}

void SparePool::MarkRepaired(NodeId node) {
  NodeState& s = state_.at(node.value);
  ENDURE_CHECK(s == NodeState::kRepairing);
  s = NodeState::kSpare;
  --repairing_;
  spares_.push_back(node);
}

}  // namespace endure::core
