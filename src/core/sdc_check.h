// Silent data corruption checks (cause "sdc"): the data-parallel replicas'
// parameter fingerprints after the same optimizer step must agree bit for bit.
//
// A bit flipped in one replica's parameters (a faulty GPU, memory that ECC
// does not cover) does not crash anything: the replica trains on from a
// different state and, through the allreduce, feeds wrong gradients to all
// the others. Every `sdc_check_every` steps each rank reports a fingerprint
// (16 hex digits, endure::Fingerprint over its parameters); this checker
// compares them once every rank of the world has reported a step. With three
// or more replicas a strict majority names the minority as suspects; with two,
// or with no strict majority, every replica is a suspect until a recomputation
// on another node decides.
//
// Every rank of the world is taken to be a replica of the same parameters
// (pure data parallelism, as Endure's trainers run). Sans-I/O and
// deterministic. Not thread-safe: one event loop owns a checker.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/ids.h"

namespace endure::core {

struct SdcVerdict {
  StepNumber step;
  // Every replica reported the same fingerprint (with one replica, trivially).
  bool agreed = true;
  // Ranks that disagree with the strict majority when one exists (`decided`),
  // or every replica when none does (two replicas that disagree, a 2-2 tie,
  // three different values among three). Ascending; empty when agreed.
  std::vector<Rank> suspects;
  // The verdict is certain: the replicas agreed, or a strict majority (more
  // than half of them, so at least 2 of 3) shares one fingerprint.
  bool decided = false;
  // The strict majority's fingerprint (every replica's when agreed); empty
  // when there is no strict majority.
  std::string majority_fingerprint;
  // E.g. "step 40: rank 3's fingerprint 1a2b3c4d5e6f7a8b differs from the 3
  // others' 9f8e7d6c5b4a3f2e".
  std::string reason;
};

class SdcChecker {
 public:
  SdcChecker() = default;

  // A new generation of `world_size` ranks: drops partially reported steps
  // and the per-rank duplicate guard. Keeps last_agreed(): agreement seen by
  // an earlier generation still vouches for the checkpoints before it. When
  // the new generation restores an older step, call RollBackTo(that step)
  // as well.
  void OnGenerationStart(int world_size);

  // One replica's parameter fingerprint after the optimizer step of `step`.
  // When every rank of the world has reported `step`, returns the verdict
  // (and, when the replicas agreed, advances last_agreed() to `step` if it is
  // newer). Ignored, returning nullopt: reports before the first generation,
  // ranks outside the world, a step at or below the rank's last reported one
  // (duplicates, reordering), and a malformed fingerprint (not 16 lowercase
  // hex digits: the agent refuses those too, so one here is no evidence
  // against the replica; the step stays incomplete and is eventually dropped,
  // see pending_checks()).
  std::optional<SdcVerdict> OnFingerprint(Rank rank, StepNumber step, std::string_view fingerprint);

  // The newest step at which every replica agreed (-1: none yet): a rollback
  // restores the newest checkpoint at or before it.
  StepNumber last_agreed() const { return last_agreed_; }

  // The job restored the state after `step` (a rollback, or a restart from a
  // checkpoint): the pending checks after it are abandoned, each rank may
  // report those steps again, and last_agreed() becomes min(last_agreed(),
  // step). A checkpoint at or before an agreed check is trusted (it lies on
  // the trajectory the check vouched for), so after rolling back to one,
  // `step` itself is the newest trusted state; agreement recorded after
  // `step` belonged to the abandoned trajectory and no longer counts.
  void RollBackTo(StepNumber step);

  // Steps some but not all ranks have reported. At most kMaxPendingChecks:
  // the oldest is dropped, unjudged, when a newer one would exceed it (a rank
  // that stopped reporting must not make memory grow).
  static constexpr size_t kMaxPendingChecks = 16;
  size_t pending_checks() const { return pending_.size(); }

  // Its state, for a snapshot of the job (core/job_snapshot.h).
  template <class Archive>
  void serialize(Archive& ar) {
    ar(last_reported_, pending_, last_agreed_);
  }

 private:
  struct PendingCheck {
    std::vector<std::string> fingerprints;  // by rank; empty where not reported
    int reported = 0;

    template <class Archive>
    void serialize(Archive& ar) {
      ar(fingerprints, reported);
    }
  };

  SdcVerdict Judge(StepNumber step, const std::vector<std::string>& fingerprints);

  std::vector<std::optional<StepNumber>> last_reported_;  // by rank
  std::map<StepNumber, PendingCheck> pending_;
  StepNumber last_agreed_{-1};
};

}  // namespace endure::core
