// The checkpoint book; see checkpoint_book.h.
#include "core/checkpoint_book.h"

#include <algorithm>
#include <cstdint>

#include "checkpoint/snapshot_file.h"

namespace endure::core {
namespace {

// Steps a save was begun for and never completed (a node that never
// persists its shard) are dropped when a newer step completes; this bounds
// them when none ever does.
constexpr size_t kMaxPendingSteps = 64;

}  // namespace

Status CheckpointBookOptions::Validate() const {
  if (keep < 1) return InvalidArgument("checkpoint book: keep must be at least 1");
  if (replicas < 0 || replicas > 1) {
    return InvalidArgument("checkpoint book: replicas must be 0 or 1");
  }
  if (persist_every_steps < 0) {
    return InvalidArgument("checkpoint book: persist_every_steps must not be negative");
  }
  if (ranks_per_node < 1) {
    return InvalidArgument("checkpoint book: ranks_per_node must be at least 1");
  }
  if (max_shards < 0) return InvalidArgument("checkpoint book: max_shards must not be negative");
  return Status::Ok();
}

std::string_view RemoveReasonName(RemoveReason reason) {
  switch (reason) {
    case RemoveReason::kRetention:
      return "retention";
    case RemoveReason::kLeftover:
      return "leftover";
    case RemoveReason::kAbandoned:
      return "abandoned";
  }
  return "retention";
}

CheckpointBook::CheckpointBook(CheckpointBookOptions options) : options_(options) {
  ENDURE_CHECK(options_.Validate().ok());
}

void CheckpointBook::OnListed(const DurableListed& listed) {
  std::set<StepNumber> present;
  for (const ListedStep& s : listed.committed) {
    if (s.shards < 1) continue;
    present.insert(s.step);
    auto [it, added] = durable_.try_emplace(s.step);
    it->second.shards = s.shards;
    if (writing_.count(s.step)) {
      // A manifest this book asked for, whose result was never heard (the
      // controller died in between): it was written, by this timeline.
      it->second.origin = Origin::kTimeline;
      it->second.this_run = true;
      ++totals_.durable_commits;
    } else if (added) {
      // Beyond the restore point of this timeline: another timeline's.
      it->second.origin =
          restored_step_ && s.step > *restored_step_ ? Origin::kOther : Origin::kBefore;
    }
    if (it->second.origin != Origin::kOther) newest_commit_ = std::max(newest_commit_, s.step);
  }
  std::erase_if(durable_, [&](const auto& d) { return !present.count(d.first); });
  leftovers_ = std::set<StepNumber>(listed.leftovers.begin(), listed.leftovers.end());
  for (StepNumber s : present) leftovers_.erase(s);
  // What was asked for and never answered is settled by the listing: a
  // manifest not there was not written (its shards are a leftover), a
  // removal was done or is asked again by the next retention; an abandoned
  // step still there stays abandoned.
  writing_.clear();
  for (auto it = removing_.begin(); it != removing_.end();) {
    if (it->second == RemoveReason::kAbandoned && present.count(it->first)) {
      abandoned_.insert(it->first);
    }
    it = removing_.erase(it);
  }
}

bool CheckpointBook::OnCopyTaken(StepNumber step) {
  if (!copies_.empty() && step <= *copies_.rbegin()) return false;
  copies_.insert(step);
  if (copies_.size() > kMaxCopies) copies_.erase(copies_.begin());
  ++totals_.copies_taken;
  return true;
}

std::vector<BookAction> CheckpointBook::OnShardPersisted(const ShardPersisted& p) {
  totals_.peak_t0_bytes = std::max(totals_.peak_t0_bytes, p.t0_bytes);
  totals_.peak_t1_bytes = std::max(totals_.peak_t1_bytes, p.t1_bytes);
  // A step has the shards of the world that saved it: fewer after a shrink.
  if (p.shards < 1 || p.shard < 0 || p.shard >= p.shards || p.step.value < 1) return {};
  if (options_.max_shards > 0 && p.shards > options_.max_shards) return {};
  if (p.step <= newest_commit_ || writing_.count(p.step)) return {};
  // The timeline a rollback abandons, saved on the way out: its files are
  // an unfinished save, which retention removes once a newer step commits.
  if ((abandoned_from_ && p.step >= *abandoned_from_) ||
      (restored_step_ && p.generation < restored_generation_ && p.step > *restored_step_)) {
    if (!durable_.count(p.step)) leftovers_.insert(p.step);
    return {};
  }
  std::map<int, std::pair<uint64_t, uint64_t>>& got = pending_[p.step];
  got[p.shard] = {p.bytes, p.xxh3};
  pending_shards_[p.step] = p.shards;
  if (static_cast<int>(got.size()) < p.shards) {
    while (pending_.size() > kMaxPendingSteps) {
      pending_shards_.erase(pending_.begin()->first);
      pending_.erase(pending_.begin());
    }
    return {};
  }
  WriteManifestAction write{p.step, {}};
  for (const auto& [shard, entry] : got) write.shards.push_back(entry);
  writing_[p.step] = p.shards;
  // Older steps still incomplete never will be: their shards were skipped.
  pending_.erase(pending_.begin(), pending_.upper_bound(p.step));
  pending_shards_.erase(pending_shards_.begin(), pending_shards_.upper_bound(p.step));
  return {std::move(write)};
}

std::vector<BookAction> CheckpointBook::OnManifestWritten(const ManifestWritten& written,
                                                          bool* committed) {
  *committed = false;
  auto it = writing_.find(written.step);
  if (it == writing_.end()) return {};  // not asked for: a replayed or stray result
  const int shards = it->second;
  writing_.erase(it);
  if (!written.error.empty()) {
    ++totals_.persist_failures;
    return {};
  }
  durable_[written.step] = Durable{shards, Origin::kTimeline, true};
  leftovers_.erase(written.step);
  abandoned_.erase(written.step);  // rewritten by this timeline
  std::erase_if(refused_, [&](const auto& r) { return r.first.first == written.step.value; });
  ++totals_.durable_commits;
  newest_commit_ = std::max(newest_commit_, written.step);
  *committed = true;
  return Retain(written.step);
}

std::vector<BookAction> CheckpointBook::Retain(StepNumber committed) {
  std::vector<BookAction> out;
  for (StepNumber step : abandoned_) Remove(step, RemoveReason::kAbandoned, out);
  std::vector<StepNumber> kept;
  for (const auto& [step, d] : durable_) {
    if (!removing_.count(step)) kept.push_back(step);
  }
  const size_t keep = static_cast<size_t>(options_.keep);
  // The step just committed is kept whatever `keep` says: its shards'
  // checksums are the ones the agents reported, so it stands verified.
  for (size_t i = 0; i + keep < kept.size(); ++i) {
    if (kept[i] != committed) Remove(kept[i], RemoveReason::kRetention, out);
  }
  if (!durable_.empty()) {
    const StepNumber newest = durable_.rbegin()->first;
    for (StepNumber step : leftovers_) {
      if (step < newest) Remove(step, RemoveReason::kLeftover, out);
    }
  }
  return out;
}

void CheckpointBook::Remove(StepNumber step, RemoveReason reason, std::vector<BookAction>& out) {
  if (!removing_.emplace(step, reason).second) return;
  out.push_back(RemoveStepAction{step, reason});
}

void CheckpointBook::OnStepRemoved(const StepRemoved& removed) {
  auto it = removing_.find(removed.step);
  if (it == removing_.end()) return;  // not asked for
  const RemoveReason reason = it->second;
  removing_.erase(it);
  if (removed.error.empty()) {
    durable_.erase(removed.step);
    leftovers_.erase(removed.step);
    abandoned_.erase(removed.step);
    std::erase_if(refused_, [&](const auto& r) { return r.first.first == removed.step.value; });
    return;
  }
  // An abandoned step that stays is never restored, and its removal is
  // tried again at the next commit; a step retention could not remove is
  // simply still there (retention asks again next time).
  if (reason == RemoveReason::kAbandoned) abandoned_.insert(removed.step);
}

void CheckpointBook::OnInventory(const InventoryReported& inventory, const std::string& node_name) {
  inventories_[node_name] = inventory.copies;
  totals_.peak_t0_bytes = std::max(totals_.peak_t0_bytes, inventory.t0_bytes);
  totals_.peak_t1_bytes = std::max(totals_.peak_t1_bytes, inventory.t1_bytes);
}

void CheckpointBook::OnNodeGone(const std::string& node_name) { inventories_.erase(node_name); }

void CheckpointBook::OnShardRefused(const ShardRefused& refused) {
  refused_[{refused.step.value, refused.shard}] = refused.why;
}

std::vector<BookAction> CheckpointBook::OnRollback(StepNumber target, StepNumber abandoned_from,
                                                   std::vector<std::string>* notes) {
  abandoned_from_ = abandoned_from;
  std::erase_if(copies_, [&](StepNumber s) { return s > target; });
  pending_.erase(pending_.upper_bound(target), pending_.end());
  pending_shards_.erase(pending_shards_.upper_bound(target), pending_shards_.end());
  std::vector<BookAction> out;
  for (auto& [step, d] : durable_) {
    if (step < abandoned_from) continue;
    // This run's, after the timeline's start: it holds the update rolled back.
    if (d.this_run && d.origin != Origin::kBefore) {
      Remove(step, RemoveReason::kAbandoned, out);
      continue;
    }
    // Committed by another run: not computed from the anomalous step.
    if (d.origin != Origin::kOther) {
      notes->push_back("kept durable step " + std::to_string(step.value) +
                       ": committed by another run, not part of this timeline");
    }
    d.origin = Origin::kOther;
  }
  // Leftovers there are shards of an unfinished save: never loadable.
  for (StepNumber step : leftovers_) {
    if (step >= abandoned_from) Remove(step, RemoveReason::kAbandoned, out);
  }
  return out;
}

void CheckpointBook::OnRestored(Generation generation, StepNumber step,
                                const std::map<std::string, int>& by_tier) {
  restored_step_ = step;
  restored_generation_ = generation;
  abandoned_from_.reset();
  for (const auto& [tier, n] : by_tier) totals_.restored_shards_by_tier[tier] += n;
  std::erase_if(copies_, [&](StepNumber s) { return s > step; });
  pending_.erase(pending_.upper_bound(step), pending_.end());
  pending_shards_.erase(pending_shards_.upper_bound(step), pending_shards_.end());
  for (auto& [node, copies] : inventories_) {
    std::erase_if(copies, [&](const checkpoint::ShardCopy& c) { return c.step > step.value; });
  }
  for (auto& [s, d] : durable_) {
    if (s > step) {
      d.origin = Origin::kOther;
    } else if (d.origin == Origin::kTimeline) {
      d.origin = Origin::kBefore;
    }
  }
  newest_commit_ = std::min(newest_commit_, step);
}

checkpoint::RestorePlan CheckpointBook::Plan(
    const std::map<std::string, std::vector<int>>& node_ranks, StepNumber limit) const {
  checkpoint::RestorePlan plan;
  if (limit.value == 0) return plan;  // a fresh start
  std::vector<checkpoint::ShardCopy> copies;
  for (const auto& [node, ranks] : node_ranks) {
    auto it = inventories_.find(node);
    if (it != inventories_.end()) copies.insert(copies.end(), it->second.begin(), it->second.end());
  }
  for (const auto& [step, d] : durable_) {
    if (d.origin == Origin::kOther || abandoned_.count(step) || removing_.count(step)) continue;
    for (int shard = 0; shard < d.shards; ++shard) {
      checkpoint::ShardCopy c;
      c.step = step.value;
      c.shard = shard;
      c.shards = d.shards;
      c.tier = checkpoint::Tier::kT2;
      if (auto r = refused_.find({step.value, shard}); r != refused_.end()) c.refused = r->second;
      copies.push_back(std::move(c));
    }
  }
  plan = checkpoint::ChooseRestorePoint(copies, limit.value < 0 ? INT64_MAX : limit.value);
  if (Status st = checkpoint::AssignLoaders(plan, node_ranks); !st.ok()) {
    // Only memory copies of the members were offered, so every one has a
    // loader; should that ever fail, a fresh start says why.
    plan = checkpoint::RestorePlan{};
    plan.notes.push_back("no restore: " + st.message());
  }
  return plan;
}

std::vector<StepNumber> CheckpointBook::Restorable() const {
  std::set<StepNumber> steps = copies_;
  for (const auto& [step, d] : durable_) {
    if (d.origin != Origin::kOther && !abandoned_.count(step) && !removing_.count(step)) {
      steps.insert(step);
    }
  }
  return {steps.begin(), steps.end()};
}

StepNumber CheckpointBook::Newest() const {
  const std::vector<StepNumber> steps = Restorable();
  return steps.empty() ? StepNumber{-1} : steps.back();
}

bool CheckpointBook::DurableDue(StepNumber step) const {
  return DurableStepDue(step.value, options_.persist_every_steps);
}

uint64_t CheckpointBook::SlotBytes() const {
  if (options_.memory_budget == 0) return 0;
  // Per rank: its T0 slots, and the peer's two replicas of a rank's shard.
  const uint64_t copies = static_cast<uint64_t>(options_.ranks_per_node) *
                          (checkpoint::kT0Slots + 2 * static_cast<uint64_t>(options_.replicas));
  return options_.memory_budget / copies;
}

size_t CheckpointBook::pending_shards() const {
  size_t n = 0;
  for (const auto& [step, shards] : pending_) n += shards.size();
  return n;
}

CheckpointTotals CheckpointBook::totals() const {
  CheckpointTotals t = totals_;
  for (auto it = durable_.rbegin(); it != durable_.rend(); ++it) {
    if (it->second.origin != Origin::kOther && !abandoned_.count(it->first)) {
      t.newest_durable = it->first;
      break;
    }
  }
  return t;
}

bool DurableStepDue(int64_t step, int64_t persist_every_steps) {
  return persist_every_steps <= 0 || step % persist_every_steps == 0;
}

std::optional<NodeId> ReplicaPeerOf(const std::vector<NodeId>& nodes, size_t i, int replicas) {
  if (replicas <= 0 || nodes.size() < 2 || i >= nodes.size()) return std::nullopt;
  return nodes[(i + 1) % nodes.size()];
}

}  // namespace endure::core
