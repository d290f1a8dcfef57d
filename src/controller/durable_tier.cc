// The checkpoint book's I/O; see durable_tier.h.
#include "controller/durable_tier.h"

#include <sys/stat.h>

#include <cstdio>
#include <map>

namespace endure::controller {

DurableTier::DurableTier(Env* env, std::string dir) : dir_(env, std::move(dir)) {}

bool IsCheckpointAction(const core::JobAction& action) {
  return std::holds_alternative<core::ListDurableAction>(action) ||
         std::holds_alternative<core::WriteManifestAction>(action) ||
         std::holds_alternative<core::RemoveStepAction>(action);
}

core::DurableListed DurableTier::List() const {
  core::DurableListed listed;
  for (int64_t step : dir_.ListSteps()) {
    Result<std::vector<checkpoint::ShardEntry>> shards = dir_.CommittedShards(step);
    if (shards.ok() && !shards->empty()) {
      listed.committed.push_back({core::StepNumber{step}, static_cast<int>(shards->size())});
    } else if (shards.ok() || shards.status().code() == StatusCode::kDataLoss) {
      // No manifest, or a malformed one: never loadable.
      listed.leftovers.push_back(core::StepNumber{step});
    }
    // Any other error (EIO, EACCES) may hide a good step: neither.
  }
  return listed;
}

std::optional<core::JobEvent> DurableTier::CarryOut(const core::JobAction& action) {
  if (std::holds_alternative<core::ListDurableAction>(action)) {
    core::DurableListed listed = List();
    if (!listed.committed.empty()) {
      std::fprintf(stderr,
                   "endure controller: the durable directory holds %zu committed step(s), "
                   "the newest %lld\n",
                   listed.committed.size(),
                   static_cast<long long>(listed.committed.back().step.value));
    }
    return listed;
  }
  if (const auto* w = std::get_if<core::WriteManifestAction>(&action)) {
    std::vector<checkpoint::ShardEntry> entries;
    for (const auto& [bytes, xxh3] : w->shards) entries.push_back({bytes, xxh3});
    const Status st = dir_.CommitStep(w->step.value, entries);
    if (!st.ok()) {
      std::fprintf(stderr, "endure controller: committing step %lld failed: %s\n",
                   static_cast<long long>(w->step.value), st.message().c_str());
    }
    return core::ManifestWritten{w->step, st.ok() ? "" : st.message()};
  }
  if (const auto* r = std::get_if<core::RemoveStepAction>(&action)) {
    const Status st = dir_.RemoveStep(r->step.value);
    if (!st.ok()) {
      std::fprintf(stderr, "endure controller: could not remove %s durable step %lld (%s)%s\n",
                   std::string(core::RemoveReasonName(r->reason)).c_str(),
                   static_cast<long long>(r->step.value), st.message().c_str(),
                   r->reason == core::RemoveReason::kAbandoned
                       ? "; it is never restored, and its removal is retried"
                       : "");
    }
    return core::StepRemoved{r->step, st.ok() ? "" : st.message()};
  }
  return std::nullopt;
}

std::vector<core::ShardRefused> DurableTier::Verify(checkpoint::RestorePlan& plan) const {
  std::vector<core::ShardRefused> refused;
  std::map<int64_t, Result<std::vector<checkpoint::ShardEntry>>> manifests;
  for (checkpoint::RestoreSource& s : plan.sources) {
    checkpoint::ShardCopy& c = s.copy;
    if (c.tier != checkpoint::Tier::kT2) continue;
    const Result<std::vector<checkpoint::ShardEntry>>& shards =
        manifests.try_emplace(c.step, dir_.CommittedShards(c.step)).first->second;
    Status st = shards.status();
    if (st.ok()) st = dir_.ReadListedShard(c.step, c.shard, *shards).status();
    if (!st.ok()) {
      refused.push_back(core::ShardRefused{core::StepNumber{c.step}, c.shard, st.message()});
      continue;
    }
    c.path = dir_.ShardPath(c.step, c.shard);
    c.bytes = (*shards)[c.shard].bytes;
    c.xxh3 = (*shards)[c.shard].xxh3;
  }
  return refused;
}

checkpoint::RestorePlan VerifiedPlan(const core::JobMachine& machine, const DurableTier& tier,
                                     const core::StartGenerationAction& start,
                                     const std::function<void(const core::JobEvent&)>& input) {
  // Each pass refuses at least one copy for good, or returns.
  for (;;) {
    checkpoint::RestorePlan plan = machine.PlanRestore(start);
    const std::vector<core::ShardRefused> refused = tier.Verify(plan);
    if (refused.empty()) return plan;
    for (const core::ShardRefused& r : refused) input(r);
  }
}

core::RestoreChosen RestoreChosenFor(core::Generation generation,
                                     const checkpoint::RestorePlan& plan) {
  std::string text = plan.Summary();
  for (const std::string& n : plan.notes) text += "; " + n;
  core::RestoreChosen chosen{generation, text, core::StepNumber{plan.step}};
  for (const checkpoint::RestoreSource& s : plan.sources) {
    switch (s.copy.tier) {
      case checkpoint::Tier::kT0:
        ++chosen.from_t0;
        break;
      case checkpoint::Tier::kT1:
        ++chosen.from_t1;
        break;
      case checkpoint::Tier::kT2:
        ++chosen.from_t2;
        break;
    }
  }
  return chosen;
}

std::optional<double> DurableTier::CommittedAtUnix(core::StepNumber step) const {
  struct stat st;
  if (::stat(dir_.StepDir(step.value).c_str(), &st) != 0) return std::nullopt;
  return double(st.st_mtim.tv_sec) + double(st.st_mtim.tv_nsec) * 1e-9;
}

}  // namespace endure::controller
