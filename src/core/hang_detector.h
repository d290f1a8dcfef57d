// HangDetector: decides that a training job has stopped making progress.
//
// A hang is "no step progress within a timeout". The timeout is learned from
// the step times the job has shown so far,
//
//   timeout = max(floor, k × p99 of the most recent `window` step durations),
//
// so a job with 150 ms steps is declared hung after the 2 s floor, and one with
// 40 s steps after about two minutes, without anyone tuning it. Before the
// first step of a generation (process start, restore, NCCL/Gloo set-up, first
// compilation) a separate, much longer start-up timeout applies.
//
// Phases. A rank may say which phase of its loop it is in (the client's
// session.phase("eval"), "checkpoint", "data", any name; "train" is the
// default). Time a rank spends in a phase other than "train" is judged by
// that phase's own timeout, learned the same way from the phase's earlier
// durations (max(floor, k x p99 of them)), and `phase_first_timeout` the
// first time the phase is seen. A long evaluation is then never taken for a
// hang, and a hang inside one still is. While one rank is in such a phase,
// the others (waiting for it at the next collective) are given until its
// deadline too, and their step clocks restart when it ends; the step that
// held the phase is no step-time sample.
//
// The detector is a sans-I/O decision core: it reads no clock and starts no
// timers. The caller passes `now` (steady-clock time; the simulator passes
// simulated time) to every call, and sleeps until
// NextDeadline() before calling Check(). Not thread-safe: one event loop owns
// an instance.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "core/ids.h"

namespace endure::core {

// The default phase: training steps, judged by the step timeout.
inline constexpr std::string_view kTrainPhase = "train";
// A rank between its last training step and its exit (JobMachine enters it
// when a rank reports the step its total_steps names).
inline constexpr std::string_view kFinishPhase = "finish";

struct HangDetectorOptions {
  // Lower bound of the learned timeout: jitter in fast jobs never trips it.
  Duration floor = std::chrono::seconds(2);
  // Multiplier applied to the p99 step duration.
  double k = 3.0;
  // Number of most recent step durations the p99 is taken over.
  int window = 100;
  // Until this many step durations have been observed (across generations),
  // the start-up timeout is used instead of the learned one: the first steps
  // of a job are often slow (lazy initialisation, autotuning, compilation).
  int min_samples = 5;
  // Allowed time from a generation's start until every rank has finished its
  // first step: start-up plus one step (and the time allowed per step while
  // warming up).
  Duration startup_timeout = std::chrono::seconds(60);
  // Allowed time in a phase (other than "train") the first time it is seen;
  // later occurrences get max(floor, k x p99 of its earlier durations).
  Duration phase_first_timeout = std::chrono::minutes(10);

  // Names the first invalid field and its accepted range.
  Status Validate() const;
};

struct HangVerdict {
  int generation = 0;
  bool during_startup = false;  // no rank had made it through start-up
  // The timeout that was exceeded (its derivation is spelled out in `reason`).
  Duration timeout{};
  // Earliest last-progress time among the stalled ranks (the generation start
  // for ranks that never finished a step): the best estimate of when the hang
  // began, for the detection-latency figure.
  TimePoint stalled_since{};
  // Ranks whose own deadline passed, ascending.
  std::vector<int> stalled_ranks;
  // The phase the first stalled rank was in ("train": a step).
  std::string phase = std::string(kTrainPhase);
  // Lowest step any rank of the generation reached (nullopt when some rank has
  // not finished a step yet), and the ranks sitting at it: in a synchronous job
  // the culprit is among these. Ascending.
  std::optional<StepNumber> lowest_step;
  std::vector<int> behind_ranks;
  // One line for the incident log, e.g. "no step progress from ranks 0-3 for
  // 2.0s (timeout 2.0s = max(floor 2.0s, 3 x p99 150ms)); behind: rank 2 at
  // step 40 (highest step 41)".
  std::string reason;
};

class HangDetector {
 public:
  // `options` must be valid (ENDURE_CHECK).
  explicit HangDetector(HangDetectorOptions options);

  // A new generation of `world_size` ranks (0 .. world_size-1) starts at `now`:
  // per-rank progress is forgotten and the start-up timeout applies until every
  // rank has finished a step. Learned step durations are kept, since the model
  // and hardware usually stay the same across restarts.
  void OnGenerationStart(int generation, int world_size, TimePoint now);

  // `rank` finished training step `step` at `now`. Reports of a step at or
  // below the rank's last one are ignored (duplicates, reordering). Returns
  // InvalidArgument for a rank outside the current world, or before the first
  // generation.
  Status OnStepEnd(int rank, StepNumber step, TimePoint now);

  // `rank` enters phase `phase` at `now` ("train": back to steps). The
  // phase it leaves, unless "train", ends: its duration is a sample of that
  // phase, and it counts as progress. A rank in kFinishPhase stays in it
  // (what it does after its last step is its finish, whatever it calls it).
  // Same errors as OnStepEnd.
  Status OnPhase(int rank, std::string_view phase, TimePoint now);

  // `rank` finished training (its process ended with code 0): it is no
  // longer watched, and nobody waits for it. Same errors as OnStepEnd.
  Status OnRankFinished(int rank);

  // The timeout for phase `phase` (not "train") now: the first-time one, or
  // the learned one.
  Duration PhaseTimeout(std::string_view phase) const;

  // The watcher was away until `now` (a controller that carried on after
  // its own outage): no rank is blamed for the silence meanwhile. Each
  // rank's progress clock restarts at `now`; the learned step times stay,
  // and the gap is no step-time sample.
  void Resume(TimePoint now);

  // Returns a verdict when some rank has passed its deadline. A hang is
  // reported once: after a verdict, Check returns nullopt and NextDeadline
  // nullopt until progress is made or a new generation starts.
  std::optional<HangVerdict> Check(TimePoint now);

  // The earliest time at which Check could return a verdict, or nullopt when
  // nothing is being watched (no generation, or a hang was already reported).
  std::optional<TimePoint> NextDeadline() const;

  // The step timeout currently in force once start-up is over (the learned
  // one, or the start-up timeout while warming up).
  Duration StepTimeout() const;

  // Whether some watched rank is in a phase other than "train" (an
  // evaluation, a save): its silence is not a training step's.
  bool AnyRankInOtherPhase() const;

  // p99 of the recorded step durations, or nullopt when none are recorded.
  std::optional<Duration> P99StepDuration() const;

  const HangDetectorOptions& options() const { return options_; }

  // Its state, for a snapshot of the job (core/job_snapshot.h); the options
  // come from the job's configuration.
  template <class Archive>
  void serialize(Archive& ar) {
    ar(active_, generation_, generation_start_, ranks_, ranks_done_startup_, reported_,
       frontier_step_, frontier_time_, samples_, next_sample_, total_samples_, cached_p99_, phases_,
       in_phase_, train_by_base_, phased_by_base_, train_by_timeout_, within_by_base_,
       beyond_by_own_, grouped_at_, shift_, phases_taken_out_until_);
  }

 private:
  struct RankProgress {
    std::optional<StepNumber> last_step;
    // Its last progress less shift_ (Progress(): base + shift_), so that
    // phase time taken out of every rank's clock is one addition.
    TimePoint base{};
    // The rank's own most recent step duration: a rank that is slow but keeps
    // going gets k times that, even when it is slower than the job's p99.
    std::optional<Duration> last_duration;
    std::string phase = std::string(kTrainPhase);  // the rank's current phase
    bool finished = false;                         // ended with code 0: not watched
    TimePoint phase_since{};                       // when it entered it
    // The index it is filed in, by `base`: train_by_base_ (watched, in
    // "train"), phased_by_base_ (watched, in another phase), or none
    // (finished).
    enum class Filed { kNone, kTrain, kPhased } filed = Filed::kNone;
    // While filed in train: k x last_duration (0 when it has none), and
    // whether that is beyond the job's timeout the groups were made at
    // (beyond_by_own_) or not (within_by_base_).
    Duration own_timeout{0};
    bool beyond = false;

    template <class Archive>
    void serialize(Archive& ar) {
      ar(last_step, base, last_duration, phase, finished, phase_since, filed, own_timeout, beyond);
    }
  };
  struct PhaseStats {
    std::vector<Duration> samples;  // the most recent `window`, a ring
    size_t next = 0;

    template <class Archive>
    void serialize(Archive& ar) {
      ar(samples, next);
    }
  };

  // A phase other than "train" that `p` is in, and its deadline.
  bool InOtherPhase(const RankProgress& p) const { return p.phase != kTrainPhase; }
  TimePoint PhaseDeadlineOf(const RankProgress& p) const;
  // The latest deadline of a rank in another phase: every rank waits for it.
  // O(phases), from in_phase_.
  std::optional<TimePoint> LatestPhaseDeadline() const;
  // Files `p` in in_phase_ when it is watched and in another phase; and
  // takes it out.
  void FileInPhase(const RankProgress& p);
  void UnfileInPhase(const RankProgress& p);
  TimePoint Progress(const RankProgress& p) const { return p.base + shift_; }
  void SetProgress(int r, TimePoint progress);
  // Files rank `r` again after its progress, phase or end changed.
  void Refile(int r);
  void Unfile(int r);
  void RebuildProgressIndex();
  // Every rank's progress is at most `cap` (phase time taken out never
  // moves a clock past now): the ranks beyond it, the newest of each index,
  // come down to it. And at least `floor` (Resume): the oldest go up.
  void CapProgress(TimePoint cap);
  void FloorProgress(TimePoint floor);
  // The earliest deadline of a rank in "train" (without the wait for a
  // phase): a rank's is base + max(the job's timeout, its own), so the
  // earliest is the oldest base of within_by_base_ + the job's timeout, or
  // the first of beyond_by_own_. O(1).
  std::optional<TimePoint> EarliestTrainDeadline() const;
  // After the job's timeout changed (at most once a step): the ranks whose
  // own timeout lies between the one the groups were made at and the new
  // one change groups.
  void Regroup();
  // Files train rank `r` in its group by its own timeout against
  // grouped_at_ (setting `beyond`); and takes it out of the one it is in.
  void Group(int r);
  void Ungroup(int r);
  // Ends `p`'s current phase (unless "train") at `now`: a sample and progress.
  void EndPhase(int rank, TimePoint now);

  Status CheckRank(int rank, std::string_view what) const;
  bool InStartup() const { return ranks_done_startup_ < static_cast<int>(ranks_.size()); }
  // `waiting`: LatestPhaseDeadline(), which the caller computes once for
  // all ranks (a rank in "train" waits for the latest phase deadline).
  TimePoint DeadlineOf(const RankProgress& p, std::optional<TimePoint> waiting) const;
  void RecordStepDuration(Duration d);
  std::string DescribeTimeout() const;

  HangDetectorOptions options_;
  bool active_ = false;
  int generation_ = 0;
  TimePoint generation_start_{};
  std::vector<RankProgress> ranks_;
  int ranks_done_startup_ = 0;
  bool reported_ = false;

  // The step-time estimate follows the frontier: the highest step any rank has
  // finished. Each advance of the frontier after start-up yields one sample per
  // step, independent of the world size.
  StepNumber frontier_step_{0};
  TimePoint frontier_time_{};

  std::vector<Duration> samples_;  // ring buffer of `window` durations
  size_t next_sample_ = 0;
  int64_t total_samples_ = 0;
  Duration cached_p99_{};
  std::map<std::string, PhaseStats, std::less<>> phases_;  // durations per phase
  // The watched ranks in a phase other than "train", by phase: when each
  // entered it (what the latest phase deadline needs, without a walk over
  // every rank).
  std::map<std::string, std::multiset<TimePoint>, std::less<>> in_phase_;
  // The watched ranks by their progress (less shift_), oldest first, those
  // in "train" and those in another phase apart: the next deadline, and the
  // phase time taken out of every clock, without a walk over every rank.
  std::set<std::pair<TimePoint, int>> train_by_base_, phased_by_base_;
  // The ranks in train_by_base_ again: by own timeout; those whose own
  // timeout is at most grouped_at_ by base, the others by base + own
  // timeout (their own deadline less shift_).
  std::set<std::pair<Duration, int>> train_by_timeout_;
  std::set<std::pair<TimePoint, int>> within_by_base_, beyond_by_own_;
  Duration grouped_at_{0};  // StepTimeout() when the groups were last made
  Duration shift_{0};       // phase time taken out of every rank's clock
  // Phase time up to here has been taken out of the step clocks (EndPhase).
  TimePoint phases_taken_out_until_{};
};

}  // namespace endure::core
