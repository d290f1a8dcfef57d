// CheckpointBook: what the job knows of its checkpoints, in one place, and
// every decision about them. Pure: no I/O, no clock; JobMachine owns one and
// steps it with the events below, and the book's I/O (listing the durable
// directory, writing a step's manifest, removing a step) is asked for as
// actions that the controller's shell carries out, their results coming back
// as events, journaled like every other input of the machine.
//
// What it keeps:
//   - the copies taken: the steps whose snapshot reached node memory (T0), as
//     rank 0 reports them, in this timeline — the ETTR ledger's first event
//     ("a copy taken": the productive time before it survives a restart);
//   - the durable steps (T2): committed when every shard of a step is durable
//     and its manifest is written — the second event ("a durable step
//     committed") — with where each came from: this timeline, before it (an
//     earlier run, or this run before its restore point), or another
//     timeline (beyond a restore point: never restored, never removed but by
//     retention);
//   - retention: the newest `keep` committed steps stay (and the one just
//     committed, whatever `keep` says); uncommitted leftovers older than the
//     newest committed step go;
//   - each node's memory tiers (T0, T1) as its agent last reported them, and
//     the replica peer of each node (the next member of the generation);
//   - the durable cadence (every `persist_every_steps`-th copy is due in T2);
//   - the restore point: the newest step at or before a limit with a verified
//     copy of every shard, each from its fastest tier (checkpoint/
//     restore_plan.h), never from a refused copy, a step whose removal
//     failed, or another timeline;
//   - the rollback target: a loss anomaly's or an SDC's rollback to step R
//     abandons every checkpoint after R that this timeline wrote (they hold
//     the bad update); they are removed, and steps another run wrote there
//     are kept but never restored.
//
// Not thread-safe: one owner (the machine) steps it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "checkpoint/restore_plan.h"
#include "common/status.h"
#include "core/ids.h"

namespace endure::core {

struct CheckpointBookOptions {
  int keep = 3;                     // committed durable steps retention keeps (>= 1)
  int replicas = 1;                 // peer-memory (T1) replicas of each node's copies: 0 or 1
  int64_t persist_every_steps = 0;  // every N-th copy is due in T2; 0: every copy
  int ranks_per_node = 1;
  uint64_t memory_budget = 0;  // T0 + T1 bytes per node; 0: no limit
  // The most shards a step can have: the job's largest world (an agent's
  // report of more is refused, so that it cannot grow a pending step
  // without bound). 0: no bound.
  int max_shards = 0;

  Status Validate() const;
};

// ---- What the book is told (JobEvents; the machine hands them on) ----

// One committed step of a listing, with the shards its manifest lists.
struct ListedStep {
  StepNumber step;
  int shards = 0;
  friend bool operator==(const ListedStep&, const ListedStep&) = default;
};
// The durable directory, listed (ListDurableAction): its committed steps,
// and its leftovers (a step directory without a manifest: an unfinished
// save, never loadable). Steps whose manifest could not be read for another
// reason (EIO, EACCES) are in neither: they may hide a good step, so they are
// neither counted nor removed.
struct DurableListed {
  std::vector<ListedStep> committed;  // ascending
  std::vector<StepNumber> leftovers;  // ascending
};
// A shard of `step` is durable (written and synced by the agent of `node`),
// with the checksum of the bytes it wrote; the node's memory tiers hold
// t0_bytes and t1_bytes now.
struct ShardPersisted {
  Generation generation;
  NodeId node;
  StepNumber step;
  int shard = 0;
  int shards = 1;  // the world size that saved the step
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
  uint64_t t0_bytes = 0;
  uint64_t t1_bytes = 0;
};
// The result of a WriteManifestAction: empty `error` means committed.
struct ManifestWritten {
  StepNumber step;
  std::string error;
};
// The result of a RemoveStepAction: empty `error` means removed.
struct StepRemoved {
  StepNumber step;
  std::string error;
};
// A node's memory tiers, as its agent reported them when its workers
// stopped (each copy verified there; `refused` says why one did not).
struct InventoryReported {
  NodeId node;
  std::vector<checkpoint::ShardCopy> copies;
  uint64_t t0_bytes = 0;
  uint64_t t1_bytes = 0;
};
// A durable shard a plan would have used failed verification when the shell
// read it: never planned from again (unless this timeline rewrites it).
struct ShardRefused {
  StepNumber step;
  int shard = 0;
  std::string why;
};

// ---- What the book asks for (JobActions; the shell carries them out) ----

// List the durable directory; the result is a DurableListed. The shell asks
// it of itself when the job starts and when a controller carries it on.
struct ListDurableAction {};
// Write `step`'s manifest over these shards (index = shard; the checksums
// the agents reported), making it committed; the result is a
// ManifestWritten.
struct WriteManifestAction {
  StepNumber step;
  std::vector<std::pair<uint64_t, uint64_t>> shards;  // (bytes, xxh3) by shard
};
enum class RemoveReason {
  kRetention,  // older than the newest `keep` committed steps
  kLeftover,   // an unfinished save older than the newest committed step
  kAbandoned,  // after a rollback's target: it holds the update rolled back
};
std::string_view RemoveReasonName(RemoveReason reason);  // "retention", ...
// Remove `step`'s directory, committed or not; the result is a StepRemoved.
struct RemoveStepAction {
  StepNumber step;
  RemoveReason reason = RemoveReason::kRetention;
};
using BookAction = std::variant<ListDurableAction, WriteManifestAction, RemoveStepAction>;

// What the report says of the checkpoints.
struct CheckpointTotals {
  int64_t copies_taken = 0;       // checkpoints taken (T0 copies rank 0 reported)
  int64_t durable_commits = 0;    // manifests this run wrote
  StepNumber newest_durable{-1};  // the newest committed step of this timeline; -1: none
  int64_t persist_failures = 0;   // shards that failed to persist, manifests that failed
  uint64_t peak_t0_bytes = 0;     // the most one node's tiers held
  uint64_t peak_t1_bytes = 0;
  std::map<std::string, int> restored_shards_by_tier;  // "T0", "T1", "T2"
};

class CheckpointBook {
 public:
  // A book for a job that does not checkpoint: it holds nothing.
  CheckpointBook() = default;
  // `options` must be valid (CHECKed).
  explicit CheckpointBook(CheckpointBookOptions options);

  // Steps listed that the book did not know are committed before this
  // timeline (or, beyond its restore point, another timeline's); steps it
  // knew that are gone are forgotten; a manifest or a removal it asked for
  // and never heard of (a controller that died in between) is settled by
  // what the listing shows. Nothing is removed for a listing: retention
  // runs when this run commits a step.
  void OnListed(const DurableListed& listed);

  // Rank 0 took a copy of `step` (T0): whether it is newer than every copy
  // of this timeline (the ledger's "copy taken").
  bool OnCopyTaken(StepNumber step);

  // When the shard completes its step: the manifest to write. Ignored: a
  // shard out of range (more shards than max_shards), a step at or below
  // the newest commit of this timeline, and a shard of the
  // timeline a rollback abandons (one at or after its abandoned step, or of
  // a generation before the restore that is beyond the restore point).
  std::vector<BookAction> OnShardPersisted(const ShardPersisted& shard);
  void OnPersistFailed() { ++totals_.persist_failures; }
  // A manifest written is the step committed (the second event): retention
  // then applies, trusting the step just committed, and removals that failed
  // before are tried again. Returns whether the step was committed.
  std::vector<BookAction> OnManifestWritten(const ManifestWritten& written, bool* committed);
  void OnStepRemoved(const StepRemoved& removed);
  void OnInventory(const InventoryReported& inventory, const std::string& node_name);
  void OnNodeGone(const std::string& node_name);
  void OnShardRefused(const ShardRefused& refused);

  // A rollback is decided: the job restores the newest checkpoint at or
  // before `target`; every checkpoint from `abandoned_from` (> target) holds
  // the update rolled back. The ones this timeline wrote are removed (the
  // actions); the others are kept and never restored, which `notes` says.
  std::vector<BookAction> OnRollback(StepNumber target, StepNumber abandoned_from,
                                     std::vector<std::string>* notes);

  // Generation `generation` restored step `step` (0: a fresh start) with
  // `by_tier` shards from each tier: the new timeline begins there. What is
  // newer is not this timeline's any more: copies and pending shards are
  // forgotten, durable steps beyond it become another timeline's.
  void OnRestored(Generation generation, StepNumber step,
                  const std::map<std::string, int>& by_tier);

  // The restore point for a generation whose nodes are `node_ranks` (node
  // name -> its ranks): the newest step at or before `limit` (-1: any; 0: a
  // fresh start) with a copy of every shard, across the members' memory
  // tiers and the durable steps of this timeline. Durable copies carry no
  // path or checksum here: the shell reads them from the manifest when it
  // verifies them before use (and tells the book of one that fails).
  checkpoint::RestorePlan Plan(const std::map<std::string, std::vector<int>>& node_ranks,
                               StepNumber limit) const;

  // The checkpoints a rollback may restore, ascending: the copies and the
  // durable steps of this timeline.
  std::vector<StepNumber> Restorable() const;
  StepNumber Newest() const;  // the newest of Restorable(); -1: none
  // The newest copy rank 0 took of this timeline (T0, and its replica in
  // T1 once sent); -1: none.
  StepNumber NewestCopy() const { return copies_.empty() ? StepNumber{-1} : *copies_.rbegin(); }
  // Whether `step`'s copy is due in durable storage.
  bool DurableDue(StepNumber step) const;
  // The most bytes one T0 slot may hold so that T0 and T1 fit the budget
  // (0: no limit).
  uint64_t SlotBytes() const;
  // Shard reports waiting for the rest of their step, over every step.
  size_t pending_shards() const;
  // With newest_durable: the newest committed step of this timeline.
  CheckpointTotals totals() const;
  const CheckpointBookOptions& options() const { return options_; }

  // Its state, for a snapshot of the job (core/job_snapshot.h); the options
  // come from the job's configuration.
  template <class Archive>
  void serialize(Archive& ar) {
    ar(copies_, durable_, leftovers_, pending_, pending_shards_, writing_, removing_, abandoned_,
       refused_, inventories_, newest_commit_, abandoned_from_, restored_step_,
       restored_generation_, totals_);
  }

 private:
  enum class Origin {
    kBefore,    // committed before this timeline began (an earlier run, or
                // this run at or before the restore point)
    kTimeline,  // committed by this run in this timeline: a rollback removes it
    kOther,     // beyond the restore point, not rewritten: another timeline's
  };
  struct Durable {
    int shards = 0;
    Origin origin = Origin::kBefore;
    bool this_run = false;  // committed by this run (a rollback may remove it)

    template <class Archive>
    void serialize(Archive& ar) {
      ar(shards, origin, this_run);
    }
  };
  // Retention after `committed` (trusted) was committed; and retries of
  // abandoned removals.
  std::vector<BookAction> Retain(StepNumber committed);
  void Remove(StepNumber step, RemoveReason reason, std::vector<BookAction>& out);

  CheckpointBookOptions options_;
  // T0 copies of this timeline: the newest kMaxCopies (a node's memory
  // holds far fewer; without a bound the book, and with it every snapshot
  // of the job, would grow by each copy for as long as the job runs).
  std::set<StepNumber> copies_;
  static constexpr size_t kMaxCopies = 1024;
  std::map<StepNumber, Durable> durable_;  // committed, in the directory
  std::set<StepNumber> leftovers_;         // uncommitted, in the directory
  std::map<StepNumber, std::map<int, std::pair<uint64_t, uint64_t>>> pending_;
  std::map<StepNumber, int> pending_shards_;     // the world each pending step was saved by
  std::map<StepNumber, int> writing_;            // manifests asked for, with their shards
  std::map<StepNumber, RemoveReason> removing_;  // removals asked for
  std::set<StepNumber> abandoned_;               // abandoned steps whose removal failed
  std::map<std::pair<int64_t, int>, std::string> refused_;                 // (step, shard) -> why
  std::map<std::string, std::vector<checkpoint::ShardCopy>> inventories_;  // by node name
  StepNumber newest_commit_{-1};              // of this timeline: shards at or below it are ignored
  std::optional<StepNumber> abandoned_from_;  // a rollback decided, not yet restored
  std::optional<StepNumber> restored_step_;   // the timeline's start; none before a restore
  Generation restored_generation_;
  CheckpointTotals totals_;
};

// Whether the snapshot of `step` is due in durable storage when every
// `persist_every_steps`-th step is (0 or less: every snapshot): the agents
// persist by it (core/snapshot_queue.h), the book reports by it.
bool DurableStepDue(int64_t step, int64_t persist_every_steps);

// The node that holds `nodes[i]`'s replicas (T1): the next member, never the
// node itself; nullopt with no replicas or a single node.
std::optional<NodeId> ReplicaPeerOf(const std::vector<NodeId>& nodes, size_t i, int replicas);

}  // namespace endure::core
