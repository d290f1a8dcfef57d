// CheckpointCoordinator: the controller's part of the checkpoint engine.
//
// It learns what exists from the tiers themselves: the committed steps of
// the durable directory (T2) when it is made — an earlier run in the same
// state directory may have left them — and again whenever it plans a
// restore, plus what each node's memory tiers held when its workers last
// stopped (their inventories, verified by the agents). It commits durable
// steps once every rank's shard of a step is durable, applies retention, and,
// for each new generation, chooses the restore point across T0, T1 and T2
// (src/checkpoint/restore_plan.h): durable copies are verified here before
// a plan may use them, never to decide retention.
//
// Durable data is never deleted but by retention (older steps, once a newer
// one this coordinator committed exists) and by a rollback after a loss
// anomaly, which removes the steps that hold the anomalous update: those at
// or after the anomaly's step that this coordinator committed, and
// uncommitted leftovers there (docs/checkpoints.md, "Rollback"). Owned by
// the controller's loop thread; not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/restore_plan.h"
#include "common/env.h"

namespace endure::controller {

struct CoordinatorOptions {
  std::string dir;  // durable directory (T2), absolute
  int keep = 3;
  int ranks_per_node = 1;
  uint64_t memory_budget = 0;  // bytes per node; 0: no limit
  int replicas = 1;
};

class CheckpointCoordinator {
 public:
  // Lists the durable directory (manifests only, no shard is read).
  CheckpointCoordinator(Env* env, CoordinatorOptions options);

  // The committed durable steps found when this coordinator was made,
  // ascending: what earlier runs left (each is verified before a plan uses it).
  const std::vector<int64_t>& found_steps() const { return found_; }

  // A node's memory tiers as it reported them after its workers stopped.
  void OnInventory(const std::string& node, std::vector<checkpoint::ShardCopy> copies,
                   uint64_t t0_bytes, uint64_t t1_bytes);
  // The node is gone, and its memory with it.
  void OnNodeGone(const std::string& node);
  // Memory a node's tiers hold now (for the peak in the report).
  void OnMemory(uint64_t t0_bytes, uint64_t t1_bytes);

  // A shard of `step` is durable. When it completes the step, commits it
  // (the manifest) and applies retention, trusting the checksums the agents
  // reported for the step it just committed (no shard is re-read). Returns
  // an error when that fails.
  Status OnPersisted(int64_t step, int shard, int shards, checkpoint::ShardEntry entry);
  void OnPersistFailed() { ++persist_failures_; }

  // The restore point for a generation of `members` (node names, in rank
  // order): `restore_step` -1 for the newest, 0 for a fresh start, N for the
  // newest at or before N, across the memory inventories and a fresh listing
  // of the durable directory. `abandoned_from` >= 0: the generation rolls
  // back from a loss anomaly at that step, whose update every checkpoint of
  // that step or later holds: the durable ones this coordinator committed,
  // and uncommitted leftovers, are removed (steps another run committed are
  // kept: they were never part of this timeline). -1: nothing is removed.
  // What could not be removed is never planned from; the plan's notes say so.
  checkpoint::RestorePlan Plan(const std::vector<std::string>& members, int64_t restore_step,
                               int64_t abandoned_from);

  // The most bytes one T0 slot may hold so that T0 and T1 fit the budget.
  uint64_t SlotBytes() const;

  // "checkpoint" in the report: commits, the newest, memory peaks, budget.
  nlohmann::json ReportJson() const;

 private:
  std::vector<checkpoint::ShardCopy> DurableCopies() const;
  // Removes the durable steps at or after `from` that hold an abandoned
  // timeline (see Plan); returns notes on what it kept or could not remove.
  std::vector<std::string> RemoveAbandoned(int64_t from);
  // Retries the removals that failed before.
  void RetryAbandoned();

  Env* env_;
  CoordinatorOptions o_;
  checkpoint::CheckpointDir dir_;
  std::vector<int64_t> found_;
  std::map<std::string, std::vector<checkpoint::ShardCopy>> inventories_;
  std::map<int64_t, std::map<int, checkpoint::ShardEntry>> pending_;  // step -> shard -> entry
  // Steps this coordinator committed that still exist, after the latest
  // restore point: the only committed steps a rollback may remove.
  std::set<int64_t> committed_;
  // Abandoned steps whose removal failed: excluded from every plan.
  std::set<int64_t> abandoned_;
  int64_t commits_ = 0;
  int64_t newest_commit_ = -1;
  int64_t persist_failures_ = 0;
  uint64_t peak_t0_ = 0, peak_t1_ = 0;
  std::map<std::string, int> restores_by_tier_;
};

}  // namespace endure::controller
