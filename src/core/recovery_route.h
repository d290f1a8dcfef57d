// The recovery route: once RecoveryPolicy (or a detector's own policy) has
// decided that the job restarts, how it gets back to training.
//
//   in_process    every rank but the failed ones keeps its process and its
//                 state in memory and joins generation g+1 (a fresh
//                 rendezvous); only the failed ranks start, from warm
//                 standbys, and take the state from a data-parallel peer.
//                 Nothing is read from the checkpoint tiers; at most the
//                 step in flight is lost.
//   spare         the same, when the failed node is evicted: its ranks move
//                 to a healthy spare node and take the state from a peer.
//   shrink        the same, when nodes leave and there are not enough
//                 spares to take their places: the job goes on with fewer
//                 data-parallel ranks and the same global batch (each rank
//                 runs more micro-batches), down to [job] min_nodes; it grows
//                 back, in process, when a node returns. The gradient sums do
//                 not depend on the world size (trainer/exact_sum.h), so the
//                 parameters are those of a run that never shrank.
//   full_restart  every worker stops; generation g+1 starts all of them
//                 and restores the newest checkpoint that verifies in the
//                 tiers (T0/T1/T2).
//
// One pure function of the facts below, used by the job machine (and so by
// the controller and `endure sim`); its reason goes into the incident.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "core/recovery_policy.h"

namespace endure::core {

enum class RecoveryRoute { kInProcess, kSpare, kShrink, kFullRestart };

// "in_process", "spare", "shrink", "full_restart".
std::string_view RecoveryRouteName(RecoveryRoute route);
Result<RecoveryRoute> ParseRecoveryRoute(std::string_view name);

struct RouteFacts {
  bool in_process_enabled = true;  // [recovery] in_process
  RecoveryAction action = RecoveryAction::kRestartInPlace;
  // The restart must restore a checkpoint: a rollback after a loss anomaly
  // or corrupted replicas, whose state in memory is what is to be undone.
  bool rollback = false;
  // A hang: the stuck rank's peers are stopped so that every stack can be
  // captured and the pairwise test run.
  bool hang = false;
  // An ambiguous collective failure whose localization (the pairwise test
  // between the nodes) needs every rank stopped first.
  bool localize = false;
  bool backoff = false;  // the policy backs off before the restart
  // The generation completed a step: before that its ranks hold nothing
  // beyond the checkpoint they restored (and a failure at start-up is
  // likely to recur: the policy counts such attempts).
  bool productive = true;
  int world_size = 1;
  int failed_ranks = 0;  // ranks that lose their process (a node's, when it goes)
  // Members of the generation that leave it (lost or evicted): each needs a
  // spare to take its position.
  int nodes_to_replace = 0;
  // Of the other ranks: how many are ready in this generation and said they
  // rejoin in place, and the lowest one that did not (-1: none).
  int survivors_rejoining = 0;
  int first_not_rejoining = -1;
  // They said each rank then restores its part of the state from the tiers
  // (a sharded state), instead of a peer handing the whole state over.
  bool from_tiers = false;
  int spares_available = 0;  // healthy nodes outside the generation
  int nodes = 1;             // the generation's nodes
  // The fewest nodes the job may go on with ([job] min_nodes); 0: it needs
  // every node it was given (no shrink).
  int min_nodes = 0;
};

struct RouteDecision {
  RecoveryRoute route = RecoveryRoute::kFullRestart;
  std::string reason;
};

// The route for a restart (any action but kStop and kTolerate). Pure.
RouteDecision ChooseRoute(const RouteFacts& facts);

}  // namespace endure::core
