// Pairwise collective tests (Acme, NSDI'24): when a collective fails or
// times out on several ranks at once and no stack stands out, every rank
// is a victim of one node's network, and the job's own collective cannot
// say whose. A short allreduce between two nodes can: it fails or is slow
// only when one of the two is at fault. Two rounds find the node:
//
//   round 1  disjoint pairs of neighbours, (n0, n1), (n2, n3), ...; with an
//            odd count the last node is paired with the first as well. The
//            nodes of a failed or slow pair are the suspects; those of a
//            pair that passed are healthy.
//   round 2  each suspect with a healthy node. A suspect that fails again is
//            faulty, one that is slow again is slow; one that passes was a
//            victim of its round-1 partner.
//
// The decision core only: the agents run the allreduces and the caller
// passes their results. Not thread-safe: one event loop owns an instance.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"
#include "core/ids.h"

namespace endure::core {

// One pair's allreduce: `a` and `b` in either order.
struct PairResult {
  NodeId a, b;
  bool ok = true;
  double seconds = 0;  // how long it took (or ran until it failed)
  std::string error;   // why it failed, e.g. "Connection reset by peer"
};

struct PairwiseOptions {
  // A pair that passed is slow at > slow_factor x the reference time (round
  // 1: the median of the round's passing pairs, the lower middle one of an
  // even count, so that one slow pair of two stands out; round 2: that of
  // round 1's pairs that passed without being slow) and > min_slow_s, so
  // that the jitter of a test of milliseconds is no finding.
  double slow_factor = 3.0;
  double min_slow_s = 0.05;

  // Names the first invalid field: "slow_factor must be in (1, 1000], got
  // 0.5", "min_slow_s must be >= 0, got -1".
  Status Validate() const;
};

struct PairwiseVerdict {
  // Nodes found at fault in round 2, in the order the nodes were given.
  std::vector<NodeId> faulty;  // failed again with a healthy partner
  std::vector<NodeId> slow;    // slow again with a healthy partner
  // Round 1's suspects: the nodes of its failed or slow pairs, in node
  // order. When the verdict is unresolved these are whom the evidence
  // points at (an over-evicting caller takes them all out).
  std::vector<NodeId> suspects;
  // Round 2 named a faulty or slow node, or round 1 found nothing wrong
  // (every pair passed: faulty, slow and suspects empty). False when round 1
  // left no healthy node to re-pair the suspects with (two nodes, or every
  // pair failed) or when round 1's failures did not recur in round 2.
  bool resolved = false;
  // Which pairs failed or were slow in which round, with their times, and
  // the conclusion, e.g. "round 1 (median 0.100s): node 2 + node 3 failed
  // after 0.012s (Connection reset by peer); round 2 (reference 0.100s):
  // node 2 + node 0 failed after 0.011s (Connection reset by peer); node 3
  // + node 1 passed in 0.101s: node 2 is faulty".
  std::string reason;
};

class PairwiseTest {
 public:
  using Pairs = std::vector<std::pair<NodeId, NodeId>>;

  // `nodes`: at least two distinct nodes (ENDURE_CHECK), in the order that
  // decides round 1's neighbours (the caller's: rack order, say). `options`
  // must be valid (ENDURE_CHECK).
  // `names`: how reasons call the nodes ("node0"); "node N" for the others.
  PairwiseTest(std::vector<NodeId> nodes, PairwiseOptions options,
               std::map<NodeId, std::string> names = {});

  // Round 1's pairs. With an odd count the first node is in two pairs: the
  // caller runs those one after the other, or accepts that they share it.
  Pairs FirstRound() const;

  // The results of the current round's pairs. A result for a pair that was
  // not asked for is ignored (only the first one for a pair counts); an
  // asked pair without a result counts as failed ("no result"). Returns the
  // next round's pairs (after round 1: each suspect, in node order, with a
  // healthy node, spread over the healthy nodes in turn; a healthy node may
  // serve several suspects when there are fewer of them) or the verdict.
  // Once a verdict was returned, returns it again.
  std::variant<Pairs, PairwiseVerdict> OnResults(const std::vector<PairResult>& results);

  // The round whose results OnResults expects (1 or 2), or, once done(), the
  // round that gave the verdict.
  int round() const { return round_; }
  bool done() const { return done_; }
  // The pairs of the current round.
  const Pairs& pairs() const { return pairs_; }

  // An empty test, for a snapshot to load into.
  PairwiseTest() = default;
  // Its state, for a snapshot of the job (core/job_snapshot.h).
  template <class Archive>
  void serialize(Archive& ar) {
    ar(nodes_, options_, names_, round_, done_, pairs_, suspects_, reference_s_, round1_reason_,
       verdict_);
  }

 private:
  struct Outcome {
    NodeId a, b;
    bool ok = false;
    bool slow = false;
    double seconds = 0;
    std::string error;
  };

  std::vector<Outcome> Collect(const std::vector<PairResult>& results) const;
  int IndexOf(NodeId node) const;
  std::variant<Pairs, PairwiseVerdict> FinishRound1(std::vector<Outcome> outcomes);
  PairwiseVerdict FinishRound2(std::vector<Outcome> outcomes);
  PairwiseVerdict Done(PairwiseVerdict verdict);

  std::vector<NodeId> nodes_;
  PairwiseOptions options_;
  std::map<NodeId, std::string> names_;
  int round_ = 1;
  bool done_ = false;
  Pairs pairs_;
  std::vector<NodeId> suspects_;  // round 1's, in node order
  double reference_s_ = 0;        // round 1's healthy pairs' median
  std::string round1_reason_;
  PairwiseVerdict verdict_;
};

}  // namespace endure::core
