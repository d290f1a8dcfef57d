// Fail-slow stragglers (cause "straggler"): a rank whose compute time, before
// it waits in the allreduce, stays above its peers', and the decision whether
// replacing it is worth what the move costs.
//
// In a synchronous job every step waits for the slowest rank, so one node a
// few percent slow costs the whole job that much throughput (Guard, MLSys'26).
// The detector compares each rank's compute time with the median of its
// peers' in the same step, which cancels what all ranks share (a longer batch,
// a slower phase of the model, a busier storage system), and flags a rank only
// when it is slow in M of its last N judged steps, so that single-step spikes
// (a page fault, a garbage collection) never raise an incident.
//
// "Slow" is relative to the job's own noise, too: a rank is slow in a step
// when its compute exceeds (1 + theta) x its peers' median *and* the 90th
// percentile of the ratios its peers showed over their last N steps. On a
// quiet cluster (ratios within a few percent) theta decides; where every
// rank's step time wanders by more (oversubscribed cores, a noisy
// neighbour), a rank must stand out from what its peers do at their worst
// one step in ten, so that the shared noise raises nothing while a rank that
// is persistently slower than that still is flagged.
//
// Both parts are sans-I/O and deterministic: the detector keeps counts, the
// decision is a pure function. Not thread-safe: one event loop owns a detector.
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "core/ids.h"

namespace endure::core {

struct StragglerOptions {
  bool enabled = true;
  // A rank is slow in a step when its compute > (1 + theta) x the median of
  // its peers' compute in that step (and above the peers' own 90th
  // percentile ratio: see above). "Peers" are all the other ranks of the
  // world: the rank's own time does not pull the reference towards itself,
  // which matters in small worlds (with 2 ranks, the other one's time).
  double theta = 0.10;
  // N: the last N judged steps of a rank (steps every rank reported).
  int window = 20;
  // M: a rank is flagged when slow in >= M of its last N judged steps (also
  // before N steps were judged: M slow steps suffice).
  int min_slow = 12;
  // Steps whose median compute over all ranks is below this are not judged:
  // at a few milliseconds, timer resolution and scheduling noise dominate.
  double min_compute_s = 0.005;
  // ... and a rank is slow in a step only when its compute also exceeds its
  // peers' median by this many seconds: below it the difference is timer
  // resolution and scheduling (a rank that logs or copies a checkpoint
  // shard does a millisecond more every step), and it costs the job nothing
  // worth a strike. A ratio alone would flag 7 ms against 6 ms.
  double min_excess_s = 0.010;

  // Names the first invalid field and its accepted range, e.g.
  // "straggler detector: theta must be in (0, 10], got 0".
  Status Validate() const;
};

struct StragglerFlag {
  Rank rank;
  StepNumber step;  // the step at which it was flagged
  // Slow in `slow_steps` of the last `window` judged steps (`window` is less
  // than the option's N while fewer steps have been judged).
  int slow_steps = 0;
  int window = 0;
  // Median over the window of (rank compute / peers' median compute).
  double slowdown = 1;
  // Medians over the window of the rank's compute and of its peers' median.
  double rank_compute_s = 0;
  double peers_compute_s = 0;
  // "rank 3 computed 1.52x the peers' median (151ms vs 99ms); slower than
  // 1.10x of it in 18 of the last 20 steps"
  std::string reason;
};

class StragglerDetector {
 public:
  // `options` must be valid (ENDURE_CHECK).
  explicit StragglerDetector(StragglerOptions options);

  // A new generation of `world_size` ranks (0 .. world_size-1): forgets the
  // pending steps, every rank's window and the flags raised so far (the
  // world's ranks may now run on other nodes). A restore from a checkpoint
  // starts a new generation: within one, each rank's steps only increase.
  void OnGenerationStart(int world_size);

  // Records `rank`'s compute time (seconds, before the allreduce wait) for
  // `step`. When every rank of the world has reported that step, judges it
  // and returns the ranks newly flagged, ascending (each rank at most once per
  // generation). Ignored, with nothing returned: reports while disabled or
  // before the first generation, ranks outside the world, a step at or below
  // the rank's last reported one (duplicates, reordering), a compute time that
  // is negative or not finite, and steps more than 2 x window behind the
  // newest step reported (see pending_steps()).
  std::vector<StragglerFlag> OnStepCompute(Rank rank, StepNumber step, double compute_s);

  // Steps some but not all ranks have reported. Bounded: a step more than
  // 2 x window behind the newest step any rank reported is dropped unjudged,
  // so a rank that stops reporting (lost datagrams, a dead process the hang
  // detector will catch) costs at most 2 x window + 1 pending steps.
  size_t pending_steps() const { return pending_.size(); }

  // Each rank's mean compute time (seconds) over its window of judged
  // steps, by rank; NaN where a rank has none yet. What the live view shows
  // (step time by node); O(world x window).
  std::vector<double> RecentComputeByRank() const;
  // Whether `rank` was flagged in this generation.
  bool flagged(Rank rank) const {
    return rank.value >= 0 && rank.value < static_cast<int>(ranks_.size()) &&
           ranks_[rank.value].flagged;
  }

  const StragglerOptions& options() const { return options_; }

  // Its state, for a snapshot of the job (core/job_snapshot.h); the options
  // come from the job's configuration.
  template <class Archive>
  void serialize(Archive& ar) {
    ar(ranks_, pending_, newest_reported_);
  }

 private:
  struct Judged {
    bool slow = false;
    double rank_s = 0;
    double peers_s = 0;
    double threshold = 0;  // the ratio above which the step counted as slow

    template <class Archive>
    void serialize(Archive& ar) {
      ar(slow, rank_s, peers_s, threshold);
    }
  };
  struct RankState {
    std::deque<Judged> window;  // oldest first, at most options_.window
    int slow_in_window = 0;
    std::optional<StepNumber> last_reported;
    bool flagged = false;

    template <class Archive>
    void serialize(Archive& ar) {
      ar(window, slow_in_window, last_reported, flagged);
    }
  };
  struct PendingStep {
    std::vector<double> compute_s;  // by rank; valid where reported
    int reported = 0;

    template <class Archive>
    void serialize(Archive& ar) {
      ar(compute_s, reported);
    }
  };

  std::vector<StragglerFlag> Judge(StepNumber step, const std::vector<double>& compute_s);
  // Per rank, the 90th percentile of the other ranks' ratios (compute /
  // their peers' median) over their windows; 0 where there are none yet.
  std::vector<double> PeerNoise() const;
  StragglerFlag MakeFlag(Rank rank, StepNumber step, const RankState& state) const;
  int64_t PendingBound() const { return 2 * static_cast<int64_t>(options_.window); }

  StragglerOptions options_;
  std::vector<RankState> ranks_;
  std::map<StepNumber, PendingStep> pending_;
  std::optional<StepNumber> newest_reported_;
};

// The move's price against keeping the straggler (all durations of wall time;
// negative ones count as zero).
struct StragglerCosts {
  double slowdown = 1;           // the job's step time with it / without it (>= 1)
  Duration step_time{0};         // the job's current step time (context for the caller)
  Duration remaining{0};         // the job's remaining training time at the current speed
  Duration restart_cost{0};      // stop + relaunch + restore (measured, or the configured estimate)
  Duration lost_work{0};         // work since the newest checkpoint, redone after a restart
  int spares = 0;                // healthy nodes ready to take its place now
  Duration replacement_wait{0};  // with no spare: how long the job waits for a replacement node
};

enum class StragglerMove { kKeep, kSwapSpare, kEvictAndWait };

// "keep", "swap_spare", "evict_and_wait".
std::string_view StragglerMoveName(StragglerMove move);

struct StragglerDecision {
  StragglerMove move = StragglerMove::kKeep;
  // Throughput lost over `remaining` if kept: remaining x (1 - 1/slowdown).
  Duration keep_cost{0};
  // restart_cost + lost_work (+ replacement_wait with no spare).
  Duration move_cost{0};
  // States the numbers: "keeping it costs 41m03s of the remaining 2h00m
  // (1.52x); a swap costs 35.0s (restart 30.0s + lost work 5.0s): swap in a
  // spare".
  std::string reason;
};

// Pure. A move only when keep_cost > move_cost: with a spare, kSwapSpare;
// without one, kEvictAndWait (the move's cost then includes the wait for a
// replacement). Otherwise kKeep: the job keeps running and the flag is
// reported. A slowdown below 1, or NaN, counts as 1 (nothing to gain).
StragglerDecision DecideStraggler(const StragglerCosts& costs);

}  // namespace endure::core
