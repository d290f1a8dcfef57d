// Replica fingerprint comparison; see sdc_check.h.
#include "core/sdc_check.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "common/status.h"
#include "contract/worker_contract.h"

namespace endure::core {
namespace {

struct Group {
  std::string fingerprint;
  std::vector<Rank> ranks;  // ascending
};

// Reasons list at most this many groups: with thousands of replicas and
// many different values, the incident line must stay readable.
constexpr size_t kGroupsInReason = 4;

std::string DescribeGroups(const std::vector<Group>& groups) {
  std::string out;
  for (size_t i = 0; i < groups.size() && i < kGroupsInReason; ++i) {
    if (i > 0) out += "; ";
    out += FormatRanks(groups[i].ranks) + ": " + groups[i].fingerprint;
  }
  if (groups.size() > kGroupsInReason) {
    out += "; and " + std::to_string(groups.size() - kGroupsInReason) + " more values";
  }
  return out;
}

}  // namespace

void SdcChecker::OnGenerationStart(int world_size) {
  ENDURE_CHECK(world_size >= 1);
  last_reported_.assign(world_size, std::nullopt);
  pending_.clear();
}

std::optional<SdcVerdict> SdcChecker::OnFingerprint(Rank rank, StepNumber step,
                                                    std::string_view fingerprint) {
  const int world = static_cast<int>(last_reported_.size());
  if (rank.value < 0 || rank.value >= world) return std::nullopt;
  if (!contract::IsFingerprint(fingerprint)) return std::nullopt;
  std::optional<StepNumber>& last = last_reported_[rank.value];
  if (last.has_value() && step <= *last) return std::nullopt;
  last = step;

  auto [it, inserted] = pending_.try_emplace(step);
  PendingCheck& p = it->second;
  if (inserted) {
    p.fingerprints.assign(world, std::string());
    if (pending_.size() > kMaxPendingChecks) {
      // `step` is the newest or the oldest; the oldest is the one whose
      // missing reports are least likely still to come.
      const bool dropping_self = pending_.begin() == it;
      pending_.erase(pending_.begin());
      if (dropping_self) return std::nullopt;
    }
  }
  p.fingerprints[rank.value] = std::string(fingerprint);
  if (++p.reported < world) return std::nullopt;

  std::vector<std::string> fingerprints = std::move(p.fingerprints);
  pending_.erase(it);
  SdcVerdict verdict = Judge(step, fingerprints);
  if (verdict.agreed) last_agreed_ = std::max(last_agreed_, step);
  return verdict;
}

SdcVerdict SdcChecker::Judge(StepNumber step, const std::vector<std::string>& fingerprints) {
  // Grouped through a hash of the fingerprints: as many groups as ranks
  // (replicas that all disagree) costs no more than one.
  std::vector<Group> groups;
  std::unordered_map<std::string_view, size_t> group_of;
  for (size_t r = 0; r < fingerprints.size(); ++r) {
    auto [it, added] = group_of.try_emplace(fingerprints[r], groups.size());
    if (added) groups.push_back(Group{fingerprints[r], {}});
    groups[it->second].ranks.push_back(Rank{static_cast<int32_t>(r)});
  }
  // Largest group first; among equals, the one with the lowest rank.
  std::stable_sort(groups.begin(), groups.end(),
                   [](const Group& a, const Group& b) { return a.ranks.size() > b.ranks.size(); });

  const size_t n = fingerprints.size();
  const std::string at = "step " + std::to_string(step.value) + ": ";
  SdcVerdict v;
  v.step = step;
  v.agreed = groups.size() == 1;
  if (v.agreed) {
    v.decided = true;
    v.majority_fingerprint = groups[0].fingerprint;
    v.reason = at + "all " + std::to_string(n) + " replicas agree (" + groups[0].fingerprint + ")";
    return v;
  }

  const Group& largest = groups[0];
  if (2 * largest.ranks.size() > n) {
    v.decided = true;
    v.majority_fingerprint = largest.fingerprint;
    for (size_t i = 1; i < groups.size(); ++i) {
      v.suspects.insert(v.suspects.end(), groups[i].ranks.begin(), groups[i].ranks.end());
    }
    std::sort(v.suspects.begin(), v.suspects.end());
    const std::vector<Group> minority(groups.begin() + 1, groups.end());
    const std::string others =
        " the " + std::to_string(largest.ranks.size()) + " others' " + largest.fingerprint;
    if (v.suspects.size() == 1) {
      v.reason = at + FormatRanks(v.suspects) + "'s fingerprint " + minority[0].fingerprint +
                 " differs from" + others;
    } else {
      v.reason = at + FormatRanks(v.suspects) + " differ from" + others + " (" +
                 DescribeGroups(minority) + ")";
    }
    return v;
  }

  // No strict majority: nothing tells the corrupted replicas from the good
  // ones, so each is a suspect until a recomputation elsewhere decides.
  for (size_t r = 0; r < n; ++r) v.suspects.push_back(Rank{static_cast<int32_t>(r)});
  if (n == 2) {
    v.reason = at + "the 2 replicas disagree (" + DescribeGroups(groups) +
               "); both are suspects until a recomputation on another node decides";
  } else {
    v.reason = at + "no strict majority among " + std::to_string(n) + " replicas (" +
               DescribeGroups(groups) + "); all are suspects";
  }
  return v;
}

void SdcChecker::RollBackTo(StepNumber step) {
  pending_.erase(pending_.upper_bound(step), pending_.end());
  for (std::optional<StepNumber>& last : last_reported_) {
    if (last.has_value() && *last > step) last = step;
  }
  last_agreed_ = std::min(last_agreed_, step);
}

}  // namespace endure::core
