// Commits, retention and restore points for the tiered checkpoints.
#include "controller/checkpoint_coordinator.h"

#include <algorithm>
#include <cstdio>

#include "checkpoint/snapshot_file.h"
#include "common/hash.h"

namespace endure::controller {

using checkpoint::RestorePlan;
using checkpoint::ShardCopy;
using checkpoint::Tier;

CheckpointCoordinator::CheckpointCoordinator(Env* env, CoordinatorOptions options)
    : env_(env), o_(std::move(options)), dir_(env, o_.dir) {
  for (int64_t step : dir_.ListSteps()) {
    if (dir_.CommittedShards(step).ok()) found_.push_back(step);
  }
  if (!found_.empty()) newest_commit_ = found_.back();
}

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
  // A step has the shards of the world that saved it: fewer after a shrink.
  if (shards < 1 || step <= newest_commit_) return Status::Ok();
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
  committed_.insert(step);
  abandoned_.erase(step);  // rewritten by this timeline
  RetryAbandoned();
  // The agents hashed the bytes they wrote and this manifest lists exactly
  // those checksums: retention takes the step as verified rather than
  // re-reading every shard on the controller's event loop. Plans still
  // verify every durable copy they would use.
  ENDURE_RETURN_IF_ERROR(dir_.Retain(o_.keep, step));
  const std::vector<int64_t> present = dir_.ListSteps();
  std::erase_if(committed_,
                [&](int64_t s) { return !std::binary_search(present.begin(), present.end(), s); });
  return Status::Ok();
}

std::vector<ShardCopy> CheckpointCoordinator::DurableCopies() const {
  std::vector<ShardCopy> copies;
  for (int64_t step : dir_.ListSteps()) {
    if (abandoned_.count(step)) continue;
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

std::vector<std::string> CheckpointCoordinator::RemoveAbandoned(int64_t from) {
  std::vector<std::string> notes;
  for (int64_t step : dir_.ListSteps()) {
    if (step < from) continue;
    const Status committed = dir_.CommittedShards(step).status();
    // Ours (it holds the anomalous update), or no commit at all (leftover
    // shards of an unfinished save, never loadable).
    const bool removable = committed_.count(step) > 0 || committed.code() == StatusCode::kDataLoss;
    if (!removable) {
      if (committed.ok()) {
        // Committed before this timeline's restore point, by another run:
        // not computed from the anomalous step.
        notes.push_back("kept durable step " + std::to_string(step) +
                        ": committed by another run, not part of this timeline");
      } else {
        notes.push_back("kept durable step " + std::to_string(step) +
                        ": its manifest cannot be read (" + committed.message() + ")");
      }
      continue;
    }
    Status st = dir_.RemoveStep(step);
    if (st.ok()) {
      committed_.erase(step);
      abandoned_.erase(step);
      continue;
    }
    abandoned_.insert(step);
    notes.push_back("could not remove abandoned durable step " + std::to_string(step) + " (" +
                    st.message() + "); it is never restored, and its removal is retried");
    std::fprintf(stderr, "endure controller: %s\n", notes.back().c_str());
  }
  return notes;
}

void CheckpointCoordinator::RetryAbandoned() {
  for (auto it = abandoned_.begin(); it != abandoned_.end();) {
    if (dir_.RemoveStep(*it).ok()) {
      committed_.erase(*it);
      it = abandoned_.erase(it);
    } else {
      ++it;
    }
  }
}

RestorePlan CheckpointCoordinator::Plan(const std::vector<std::string>& members,
                                        int64_t restore_step, int64_t abandoned_from) {
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
      plan = checkpoint::ChooseRestorePoint(copies, limit);
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
  if (Status st = checkpoint::AssignLoaders(plan, node_ranks); !st.ok()) {
    // Only memory copies of the members were offered, so every one has a
    // loader; should that ever fail, a fresh start says why.
    plan = RestorePlan{};
    plan.notes.push_back("no restore: " + st.message());
  }
  for (const checkpoint::RestoreSource& s : plan.sources) {
    ++restores_by_tier_[std::string(checkpoint::TierName(s.copy.tier))];
  }
  if (abandoned_from >= 0) {
    for (std::string& note : RemoveAbandoned(std::max(abandoned_from, plan.step + 1))) {
      plan.notes.push_back(std::move(note));
    }
  }
  // The new timeline starts at the restore point: what it persists from
  // there is new, and steps it commits from there are the ones a later
  // rollback may remove.
  newest_commit_ = std::min(newest_commit_, plan.step);
  std::erase_if(committed_, [&](int64_t s) { return s <= plan.step; });
  // Shards of the abandoned steps will never complete.
  pending_.erase(pending_.upper_bound(plan.step), pending_.end());
  for (auto& [node, inv] : inventories_) {
    std::erase_if(inv, [&](const ShardCopy& c) { return c.step > plan.step; });
  }
  return plan;
}

uint64_t CheckpointCoordinator::SlotBytes() const {
  if (o_.memory_budget == 0) return 0;
  // Per rank: its T0 slots, and the peer's two replicas of a rank's shard.
  const uint64_t copies = static_cast<uint64_t>(o_.ranks_per_node) *
                          (checkpoint::kT0Slots + 2 * static_cast<uint64_t>(o_.replicas));
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
