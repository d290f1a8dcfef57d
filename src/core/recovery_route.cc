#include "core/recovery_route.h"

#include <algorithm>
#include <array>
#include <utility>

namespace endure::core {
namespace {

constexpr std::array<std::pair<RecoveryRoute, std::string_view>, 4> kNames = {{
    {RecoveryRoute::kInProcess, "in_process"},
    {RecoveryRoute::kSpare, "spare"},
    {RecoveryRoute::kShrink, "shrink"},
    {RecoveryRoute::kFullRestart, "full_restart"},
}};

RouteDecision Full(std::string why) {
  return {RecoveryRoute::kFullRestart, "full restart from the checkpoint tiers: " + std::move(why)};
}

}  // namespace

std::string_view RecoveryRouteName(RecoveryRoute route) {
  for (const auto& [r, name] : kNames) {
    if (r == route) return name;
  }
  return "full_restart";
}

Result<RecoveryRoute> ParseRecoveryRoute(std::string_view name) {
  for (const auto& [r, n] : kNames) {
    if (n == name) return r;
  }
  return InvalidArgument("unknown recovery route '" + std::string(name) +
                         "' (in_process, spare, shrink, full_restart)");
}

RouteDecision ChooseRoute(const RouteFacts& f) {
  if (!f.in_process_enabled) return Full("in-process restart is off ([recovery] in_process)");
  if (f.rollback) return Full("the state in memory is what the rollback undoes");
  if (f.hang) return Full("a hang stops every rank to capture its stack");
  if (f.localize) {
    return Full("the pairwise test finds who broke the collective with every rank stopped");
  }
  if (f.backoff) return Full("the policy backs off before restarting");
  if (!f.productive) {
    return Full(
        "the generation had not completed a step: its ranks hold nothing beyond the "
        "checkpoint they restored");
  }
  const bool moves = f.nodes_to_replace > 0;
  const bool short_of_spares = moves && f.spares_available < f.nodes_to_replace;
  // Without enough spares, the nodes left (and the spares there are).
  const int left = f.nodes - f.nodes_to_replace + std::min(f.spares_available, f.nodes_to_replace);
  const bool shrink = short_of_spares && f.min_nodes > 0 && left >= f.min_nodes;
  if (f.action == RecoveryAction::kWaitForRepair && !shrink) {
    return Full("the job waits for a repair before it restarts");
  }
  if (short_of_spares && !shrink) {
    return Full(std::to_string(f.spares_available) + " spare nodes ready for the " +
                std::to_string(f.nodes_to_replace) + " that leave" +
                (f.min_nodes > 0
                     ? ", and " + std::to_string(left) +
                           " nodes are fewer than [job] min_nodes = " + std::to_string(f.min_nodes)
                     : std::string(" (set [job] min_nodes to go on with fewer)")));
  }
  const int survivors = f.world_size - f.failed_ranks;
  if (survivors <= 0) return Full("no rank kept its process to hold the state");
  if (f.survivors_rejoining < survivors) {
    return Full("rank " + std::to_string(f.first_not_rejoining) +
                " cannot rejoin in place (not ready, or its program does not rejoin: "
                "endure::Session::Rejoin)");
  }
  const std::string kept = std::to_string(survivors) + " of " + std::to_string(f.world_size) +
                           " ranks keep their process and state; ";
  if (shrink) {
    return {RecoveryRoute::kShrink,
            "shrink: " + kept + "the job goes on with " + std::to_string(left) + " of " +
                std::to_string(f.nodes) +
                " nodes and the same global batch (more micro-batches per rank), " +
                (f.spares_available > 0 ? "a spare taking what it can, " : std::string()) +
                "and grows back when a node returns"};
  }
  const bool one = moves ? f.nodes_to_replace == 1 : f.failed_ranks == 1;
  const std::string state =
      f.from_tiers
          ? ", and every rank restores its part of the (sharded) state from the tiers"
          : std::string(one ? " and takes" : " and take") + " the state from a data-parallel peer";
  if (moves) {
    return {RecoveryRoute::kSpare,
            "spare node: " + kept + "the ranks of the " +
                (one ? std::string("node that left start on a spare")
                     : "nodes that left start on spares") +
                (f.from_tiers ? state : " and take the state from a data-parallel peer")};
  }
  return {RecoveryRoute::kInProcess,
          "in-process restart: " + kept + "the failed " +
              (one ? std::string("rank starts (in a warm standby where its node keeps one)")
                   : "ranks start (in warm standbys where their nodes keep them)") +
              state};
}

}  // namespace endure::core
