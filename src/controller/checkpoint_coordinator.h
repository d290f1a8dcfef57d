// CheckpointCoordinator: the controller's part of the checkpoint engine.
//
// It keeps what each node's memory tiers held when its workers last
// stopped (their inventories, verified by the agents), commits durable steps
// (T2) once every rank's shard of a step is durable, applies retention, and,
// for each new generation, chooses the restore point across T0, T1 and T2
// (src/checkpoint/restore_plan.h): durable copies are verified here before
// a plan may use them. Owned by the controller's loop thread.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/restore_plan.h"
#include "common/env.h"

namespace endure::controller {

struct CoordinatorOptions {
  std::string dir;  // durable directory (T2), absolute
  int keep = 3;
  int world_size = 1;
  int ranks_per_node = 1;
  uint64_t memory_budget = 0;  // bytes per node; 0: no limit
  int replicas = 1;
};

class CheckpointCoordinator {
 public:
  CheckpointCoordinator(Env* env, CoordinatorOptions options);

  // A node's memory tiers as it reported them after its workers stopped.
  void OnInventory(const std::string& node, std::vector<checkpoint::ShardCopy> copies,
                   uint64_t t0_bytes, uint64_t t1_bytes);
  // The node is gone, and its memory with it.
  void OnNodeGone(const std::string& node);
  // Memory a node's tiers hold now (for the peak in the report).
  void OnMemory(uint64_t t0_bytes, uint64_t t1_bytes);

  // A shard of `step` is durable. When it completes the step, commits it
  // (the manifest) and applies retention. Returns an error when that fails.
  Status OnPersisted(int64_t step, int shard, int shards, checkpoint::ShardEntry entry);
  void OnPersistFailed() { ++persist_failures_; }

  // The restore point for a generation of `members` (node names, in rank
  // order): `restore_step` -1 for the newest, 0 for a fresh start, N for the
  // newest at or before N. A rollback (N >= 0 after generation 0) also
  // drops the durable steps after the restore point.
  checkpoint::RestorePlan Plan(const std::vector<std::string>& members, int64_t restore_step,
                               bool rollback);

  // The most bytes one T0 slot may hold so that T0 and T1 fit the budget.
  uint64_t SlotBytes() const;

  // "checkpoint" in the report: commits, the newest, memory peaks, budget.
  nlohmann::json ReportJson() const;

 private:
  std::vector<checkpoint::ShardCopy> DurableCopies() const;

  Env* env_;
  CoordinatorOptions o_;
  checkpoint::CheckpointDir dir_;
  std::map<std::string, std::vector<checkpoint::ShardCopy>> inventories_;
  std::map<int64_t, std::map<int, checkpoint::ShardEntry>> pending_;  // step -> shard -> entry
  int64_t commits_ = 0;
  int64_t newest_commit_ = -1;
  int64_t persist_failures_ = 0;
  uint64_t peak_t0_ = 0, peak_t1_ = 0;
  std::map<std::string, int> restores_by_tier_;
};

}  // namespace endure::controller
