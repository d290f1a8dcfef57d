// Commits, retention and restore points for the tiered checkpoints.
#include "controller/checkpoint_coordinator.h"

#include <algorithm>

#include "common/hash.h"

namespace endure::controller {

using checkpoint::RestorePlan;
using checkpoint::ShardCopy;
using checkpoint::Tier;

CheckpointCoordinator::CheckpointCoordinator(Env* env, CoordinatorOptions options)
    : env_(env), o_(std::move(options)), dir_(env, o_.dir) {}

void CheckpointCoordinator::OnInventory(const std::string& node, std::vector<ShardCopy> copies,
                                        uint64_t t0_bytes, uint64_t t1_bytes) {
  inventories_[node] = std::move(copies);
  OnMemory(t0_bytes, t1_bytes);
}

void CheckpointCoordinator::OnNodeGone(const std::string& node) { inventories_.erase(node); }

void CheckpointCoordinator::OnMemory(uint64_t t0_bytes, uint64_t t1_bytes) {
  peak_t0_ = std::max(peak_t0_, t0_bytes);
  peak_t1_ = std::max(peak_t1_, t1_bytes);
}

Status CheckpointCoordinator::OnPersisted(int64_t step, int shard, int shards,
                                          checkpoint::ShardEntry entry) {
  if (shards != o_.world_size || step <= newest_commit_) return Status::Ok();
  std::map<int, checkpoint::ShardEntry>& got = pending_[step];
  got[shard] = entry;
  if (static_cast<int>(got.size()) < shards) return Status::Ok();
  std::vector<checkpoint::ShardEntry> entries;
  for (const auto& [s, e] : got) entries.push_back(e);
  // Older steps still incomplete never will be: their shards were skipped.
  pending_.erase(pending_.begin(), pending_.upper_bound(step));
  ENDURE_RETURN_IF_ERROR(dir_.CommitStep(step, entries));
  ++commits_;
  newest_commit_ = step;
  return dir_.Retain(o_.keep);
}

std::vector<ShardCopy> CheckpointCoordinator::DurableCopies() const {
  std::vector<ShardCopy> copies;
  for (int64_t step : dir_.ListSteps()) {
    Result<std::vector<checkpoint::ShardEntry>> shards = dir_.CommittedShards(step);
    if (!shards.ok()) continue;  // never committed
    for (size_t i = 0; i < shards->size(); ++i) {
      ShardCopy c;
      c.step = step;
      c.shard = static_cast<int>(i);
      c.shards = static_cast<int>(shards->size());
      c.tier = Tier::kT2;
      c.path = dir_.ShardPath(step, c.shard);
      c.bytes = (*shards)[i].bytes;
      c.xxh3 = (*shards)[i].xxh3;
      copies.push_back(std::move(c));
    }
  }
  return copies;
}

RestorePlan CheckpointCoordinator::Plan(const std::vector<std::string>& members,
                                        int64_t restore_step, bool rollback) {
  std::map<std::string, std::vector<int>> node_ranks;
  std::vector<ShardCopy> copies;
  for (size_t i = 0; i < members.size(); ++i) {
    for (int l = 0; l < o_.ranks_per_node; ++l) {
      node_ranks[members[i]].push_back(static_cast<int>(i) * o_.ranks_per_node + l);
    }
    auto it = inventories_.find(members[i]);
    if (it != inventories_.end()) copies.insert(copies.end(), it->second.begin(), it->second.end());
  }
  const std::vector<ShardCopy> durable = DurableCopies();
  copies.insert(copies.end(), durable.begin(), durable.end());
  const int64_t limit = restore_step < 0 ? INT64_MAX : restore_step;
  RestorePlan plan;
  if (restore_step != 0) {
    // Durable copies are verified only once a plan would use them; one that
    // fails is refused and the choice is made again.
    for (;;) {
      plan = checkpoint::ChooseRestorePoint(copies, o_.world_size, limit);
      bool refused = false;
      for (const checkpoint::RestoreSource& s : plan.sources) {
        if (s.copy.tier != Tier::kT2) continue;
        Status st = dir_.ReadShard(s.copy.step, s.copy.shard).status();
        if (st.ok()) continue;
        for (ShardCopy& c : copies) {
          if (c.tier == Tier::kT2 && c.step == s.copy.step && c.shard == s.copy.shard) {
            c.refused = st.message();
          }
        }
        refused = true;
      }
      if (!refused) break;
    }
  }
  if (!checkpoint::AssignLoaders(plan, node_ranks).ok()) plan = RestorePlan{};  // cannot happen
  for (const checkpoint::RestoreSource& s : plan.sources) {
    ++restores_by_tier_[std::string(checkpoint::TierName(s.copy.tier))];
  }
  if (rollback) {
    (void)dir_.RemoveAfter(plan.step);
    newest_commit_ = std::min(newest_commit_, plan.step);
  }
  // Shards of the abandoned steps will never complete.
  pending_.erase(pending_.upper_bound(plan.step), pending_.end());
  for (auto& [node, inv] : inventories_) {
    std::erase_if(inv, [&](const ShardCopy& c) { return c.step > plan.step; });
  }
  return plan;
}

uint64_t CheckpointCoordinator::SlotBytes() const {
  if (o_.memory_budget == 0) return 0;
  // Per rank: two T0 slots, and the peer's two replicas of a rank's shard.
  const uint64_t copies = 2 * static_cast<uint64_t>(o_.ranks_per_node) * (1 + o_.replicas);
  return o_.memory_budget / copies;
}

nlohmann::json CheckpointCoordinator::ReportJson() const {
  nlohmann::json shards = nlohmann::json::object();
  for (const auto& [tier, n] : restores_by_tier_) shards[tier] = n;
  return {{"durable_commits", commits_},
          {"newest_durable_step",
           newest_commit_ < 0 ? nlohmann::json() : nlohmann::json(newest_commit_)},
          {"persist_failures", persist_failures_},
          {"memory_budget_bytes", o_.memory_budget},
          {"peak_t0_bytes", peak_t0_},
          {"peak_t1_bytes", peak_t1_},
          {"restored_shards_by_tier", shards}};
}

}  // namespace endure::controller
