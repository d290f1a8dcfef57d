// Restore point selection: newest complete, verified step; fastest tier.
#include "checkpoint/restore_plan.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <optional>
#include <set>

#include "common/hash.h"

namespace endure::checkpoint {

std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kT0:
      return "T0";
    case Tier::kT1:
      return "T1";
    case Tier::kT2:
      return "T2";
  }
  return "?";
}

Result<Tier> TierFromName(std::string_view name) {
  for (Tier t : {Tier::kT0, Tier::kT1, Tier::kT2}) {
    if (TierName(t) == name) return t;
  }
  return InvalidArgument("unknown checkpoint tier '" + std::string(name) + "' (T0, T1 or T2)");
}

std::string ShardCopy::Describe() const {
  std::string s = "step " + std::to_string(step) + " shard " + std::to_string(shard) + " in " +
                  std::string(TierName(tier));
  if (!node.empty()) s += " on " + node;
  return s;
}

std::string RestorePlan::Summary() const {
  if (sources.empty()) return "fresh start";
  std::map<Tier, int> count;
  for (const RestoreSource& s : sources) ++count[s.copy.tier];
  std::string s = "step " + std::to_string(step) + " from ";
  bool first = true;
  for (const auto& [tier, n] : count) {
    s += (first ? "" : ", ") + std::string(TierName(tier)) + " x" + std::to_string(n);
    first = false;
  }
  return s;
}

RestorePlan ChooseRestorePoint(const std::vector<ShardCopy>& copies, int64_t limit) {
  // A copy's shard count comes from an agent's report: bounded before it
  // sizes anything (no job has more ranks).
  constexpr int kMaxShards = 1 << 20;
  RestorePlan plan;
  // Each step with the world size it was saved with, newest first.
  std::set<std::pair<int64_t, int>, std::greater<>> steps;
  for (const ShardCopy& c : copies) {
    if (c.shards >= 1 && c.shards <= kMaxShards && c.step <= limit && c.step > 0) {
      steps.insert({c.step, c.shards});
    }
  }
  for (const auto& [step, shards] : steps) {
    // The best verified copy of each shard, and what was refused on the way.
    std::vector<std::optional<ShardCopy>> best(static_cast<size_t>(shards));
    std::vector<std::string> refused;
    for (const ShardCopy& c : copies) {
      if (c.step != step || c.shards != shards || c.shard < 0 || c.shard >= shards) continue;
      if (!c.refused.empty()) {
        refused.push_back("refused " + c.Describe() + ": " + c.refused);
        continue;
      }
      std::optional<ShardCopy>& b = best[static_cast<size_t>(c.shard)];
      if (!b || c.tier < b->tier) b = c;
    }
    std::sort(refused.begin(), refused.end());
    plan.notes.insert(plan.notes.end(), refused.begin(), refused.end());
    std::vector<int> missing;
    for (int s = 0; s < shards; ++s) {
      if (!best[static_cast<size_t>(s)]) missing.push_back(s);
    }
    if (!missing.empty()) {
      std::string m;
      for (int s : missing) m += (m.empty() ? "" : ", ") + std::to_string(s);
      plan.notes.push_back("step " + std::to_string(step) +
                           " incomplete: no verified copy of shard " + m);
      continue;
    }
    plan.step = step;
    for (auto& b : best) plan.sources.push_back(RestoreSource{std::move(*b), -1});
    return plan;
  }
  return plan;
}

Status AssignLoaders(RestorePlan& plan, const std::map<std::string, std::vector<int>>& node_ranks) {
  std::map<std::string, size_t> next;
  size_t world = 0;
  for (const auto& [node, ranks] : node_ranks) world += ranks.size();
  for (RestoreSource& s : plan.sources) {
    if (s.copy.tier == Tier::kT2) {
      // Spread over the ranks there are: the step may have been saved by a
      // larger world than the one restoring it.
      if (world == 0) return Unavailable(s.copy.Describe() + ": no rank to load it");
      s.loader_rank = static_cast<int>(static_cast<size_t>(s.copy.shard) % world);
      continue;
    }
    auto it = node_ranks.find(s.copy.node);
    if (it == node_ranks.end() || it->second.empty()) {
      return Unavailable(s.copy.Describe() + ": its node runs no rank of this generation");
    }
    s.loader_rank = it->second[next[s.copy.node]++ % it->second.size()];
  }
  return Status::Ok();
}

nlohmann::json RestorePlanToJson(const RestorePlan& plan) {
  nlohmann::json j = {{"step", plan.step}, {"sources", nlohmann::json::array()}};
  for (const RestoreSource& s : plan.sources) {
    j["sources"].push_back({{"shard", s.copy.shard},
                            {"shards", s.copy.shards},
                            {"tier", TierName(s.copy.tier)},
                            {"node", s.copy.node},
                            {"path", s.copy.path},
                            {"bytes", s.copy.bytes},
                            {"xxh3", HexU64(s.copy.xxh3)},
                            {"loader_rank", s.loader_rank}});
  }
  return j;
}

Result<RestorePlan> RestorePlanFromJson(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& why) {
    return InvalidArgument("restore plan: " + why + " in '" + std::string(text.substr(0, 200)) +
                           "'");
  };
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
      !j.contains("sources") || !j["sources"].is_array()) {
    return bad("not an object with a step and sources");
  }
  RestorePlan plan;
  plan.step = j["step"].get<int64_t>();
  if (plan.step < 0) return bad("a negative step");
  for (const nlohmann::json& s : j["sources"]) {
    if (!s.is_object()) return bad("a source is not an object");
    // Every field's type and range is checked before get<>(), which throws
    // on a mistyped field and is undefined for a number out of its type's
    // range (a float such as 1e22 read as an integer).
    auto integer = [&](const char* key, int64_t lo, int64_t* out) -> Status {
      if (!s.contains(key) || !s[key].is_number_integer() ||
          (s[key].is_number_unsigned() && s[key].get<uint64_t>() > INT_MAX) ||
          s[key].get<int64_t>() < lo || s[key].get<int64_t>() > INT_MAX) {
        return bad(std::string("a source's '") + key + "' is not an integer from " +
                   std::to_string(lo) + " to " + std::to_string(INT_MAX));
      }
      *out = s[key].get<int64_t>();
      return Status::Ok();
    };
    auto string = [&](const char* key, std::string* out) -> Status {
      if (!s.contains(key) || !s[key].is_string()) {
        return bad(std::string("a source's '") + key + "' is not a string");
      }
      *out = s[key].get<std::string>();
      return Status::Ok();
    };
    RestoreSource src;
    src.copy.step = plan.step;
    int64_t shard = 0;
    int64_t shards = 0;
    int64_t loader_rank = 0;
    ENDURE_RETURN_IF_ERROR(integer("shard", 0, &shard));
    ENDURE_RETURN_IF_ERROR(integer("shards", 1, &shards));
    ENDURE_RETURN_IF_ERROR(integer("loader_rank", -1, &loader_rank));
    if (shard >= shards) return bad("a source's shard is not below its shards");
    src.copy.shard = static_cast<int>(shard);
    src.copy.shards = static_cast<int>(shards);
    src.loader_rank = static_cast<int>(loader_rank);
    std::string tier;
    ENDURE_RETURN_IF_ERROR(string("tier", &tier));
    ENDURE_ASSIGN_OR_RETURN(src.copy.tier, TierFromName(tier));
    ENDURE_RETURN_IF_ERROR(string("node", &src.copy.node));
    ENDURE_RETURN_IF_ERROR(string("path", &src.copy.path));
    if (!s.contains("bytes") || !s["bytes"].is_number_unsigned()) {
      return bad("a source's 'bytes' is not an integer >= 0");
    }
    src.copy.bytes = s["bytes"].get<uint64_t>();
    std::string xxh3;
    ENDURE_RETURN_IF_ERROR(string("xxh3", &xxh3));
    const auto [end, ec] =
        std::from_chars(xxh3.data(), xxh3.data() + xxh3.size(), src.copy.xxh3, 16);
    if (xxh3.size() != 16 || ec != std::errc() || end != xxh3.data() + xxh3.size()) {
      return bad("a source's 'xxh3' is not 16 hex digits");
    }
    if (src.copy.shard != static_cast<int>(plan.sources.size())) return bad("shards out of order");
    plan.sources.push_back(std::move(src));
  }
  return plan;
}

}  // namespace endure::checkpoint
