// Restore point selection across the checkpoint tiers.
//
// Every copy of every shard the job holds is described by a ShardCopy: the
// agents report their memory tiers (T0: the node's own snapshots; T1:
// replicas of a peer's), the controller lists the durable directory (T2).
// ChooseRestorePoint picks the newest step that is complete (every shard has
// a copy that verified) and takes each shard from its fastest tier. A copy
// that failed verification is never chosen; the plan's notes say what was
// refused and what that cost. Pure: no I/O.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace endure::checkpoint {

enum class Tier { kT0 = 0, kT1 = 1, kT2 = 2 };  // fastest first

std::string_view TierName(Tier tier);  // "T0", "T1", "T2"
Result<Tier> TierFromName(std::string_view name);

// One copy of one shard.
struct ShardCopy {
  int64_t step = 0;  // steps completed when it was saved
  int shard = 0;     // the rank that saved it
  int shards = 1;    // the world size it was saved with
  Tier tier = Tier::kT0;
  std::string node;     // the node holding it (T0, T1); empty for T2
  std::string path;     // where a reader on that node (anyone, for T2) finds it
  uint64_t bytes = 0;   // payload size
  uint64_t xxh3 = 0;    // payload checksum
  std::string refused;  // non-empty: it failed verification, and why

  std::string Describe() const;  // "step 42 shard 1 in T0 on node1"
};

struct RestoreSource {
  ShardCopy copy;
  int loader_rank = -1;  // the rank that reads it and broadcasts it to the others
};

struct RestorePlan {
  int64_t step = 0;                    // 0: no complete step; start fresh
  std::vector<RestoreSource> sources;  // index = shard; empty for a fresh start
  std::vector<std::string> notes;      // refused copies and skipped steps, newest first

  // "step 42 from T0 x2, T1 x1" or "fresh start".
  std::string Summary() const;
};

// The newest step at or before `limit` with a verified copy of each of its
// shards, each taken from its fastest tier. A step has the shards of the
// world that saved it (ShardCopy::shards), whatever the world that restores
// it: every rank loads every shard (an elastic job saves with fewer ranks
// after a shrink, and restores them with more after a regrow).
RestorePlan ChooseRestorePoint(const std::vector<ShardCopy>& copies, int64_t limit);

// Assigns each source a loader: for a memory copy, a rank of the node that
// holds it (`node_ranks`: node -> its ranks in the new generation; spread
// round-robin); for T2, the shard's own rank. kUnavailable when a
// memory copy's node runs no rank.
Status AssignLoaders(RestorePlan& plan, const std::map<std::string, std::vector<int>>& node_ranks);

// The plan as handed to workers (ENDURE_RESTORE_PLAN) and back.
nlohmann::json RestorePlanToJson(const RestorePlan& plan);
Result<RestorePlan> RestorePlanFromJson(std::string_view text);

}  // namespace endure::checkpoint
