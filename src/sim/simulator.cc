// Discrete-event simulation of one run; see simulator.h for the model.
#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <queue>
#include <utility>

#include "core/failure_decision.h"
#include "core/recovery_route.h"
#include "core/sdc_check.h"
#include "core/spare_pool.h"
#include "sim/strikes.h"

namespace endure::sim {
namespace {

using core::At;
using core::LedgerCategory;
using core::NodeId;
using core::RecoveryAction;
using core::StepNumber;

constexpr Duration kNever = Duration::max();

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// xoshiro256++: fast, and the same stream on every platform (unlike the
// standard library's distributions), so a seed reproduces a run everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : s_) s = SplitMix64(seed);
  }
  uint64_t Next() {
    uint64_t result = Rotl(s_[0] + s_[3], 23) + s_[0];
    uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n) for n <= 2^32 (bias below 2^-32).
  uint64_t Below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
  }
  // Exponential with mean 1.
  double Exponential() { return -std::log1p(-Uniform()); }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

enum class Phase {
  kStartup,     // ledger: startup
  kTraining,    // productive (recompute after a rollback)
  kCheckpoint,  // checkpoint_stall
  kDetect,      // detection
  kBackoff,     // other
  kWaitSpare,   // other: a slot is empty and no spare is left
  kWaitRepair,  // other: a component the job needs is being repaired
  kRestart,     // recovery
  kStopped,     // other: the policy gave up
};

struct PendingFailure {
  NodeId node;
  int cause;
  StepNumber step;
  bool during_recovery;
};

// A slow node in the job. `milestone` is the training progress (committed +
// in-segment training time) at which the detector has seen it slow for its
// window in the current generation.
struct SlowNode {
  int32_t node;
  double factor;
  Duration milestone;
  bool flagged = false;
};

// A corruption in the replicas' parameters, from `at` (training progress)
// until training progress reaches `found` (the next check, or a loss spike).
struct Corruption {
  bool active = false;
  NodeId node;
  Duration at{0};
  Duration at_wall{0};
  Duration found{0};
};

using TimedNode = std::pair<Duration, int32_t>;
using TimedNodeQueue = std::priority_queue<TimedNode, std::vector<TimedNode>, std::greater<>>;

// Independent random streams per mechanism, so that switching one mechanism
// off leaves the others' draws alone (common random numbers: the comparison
// of a mechanism on and off is paired).
uint64_t StreamSeed(uint64_t seed, uint64_t stream) {
  uint64_t state = seed ^ (0xd1b54a32d192ed03ULL * (stream + 1));
  return SplitMix64(state);
}

class Run {
 public:
  Run(const SimConfig& config, uint64_t seed, int max_incidents)
      : c_(config),
        rng_(seed),
        rng_nodes_(StreamSeed(seed, 1)),
        rng_sdc_(StreamSeed(seed, 2)),
        rng_flaky_(StreamSeed(seed, 3)),
        rng_check_(StreamSeed(seed, 4)),
        policy_(config.policy),
        pool_(static_cast<int32_t>(config.nodes), static_cast<int32_t>(config.spares)),
        ledger_(At(Duration(0))),
        strikes_(config.soft_strikes, config.soft_window),
        max_incidents_(max_incidents) {
    result_.seed = seed;
    result_.failures_by_cause.assign(c_.causes.size(), 0);
    double total_weight = 0, flaky_weight = 0;
    for (size_t i = 0; i < c_.causes.size(); ++i) {
      const CauseSpec& s = c_.causes[i];
      total_weight += s.weight;
      cumulative_weight_.push_back(total_weight);
      // A flaky node fails more often with what a bad node can be blamed
      // for softly: not software, not a hard cause (that would be broken).
      if (core::ClassifyCause(s.name) != core::CauseClass::kSoftware &&
          !IsHardStrikeCause(s.name)) {
        flaky_weight += s.weight;
        flaky_causes_.push_back(static_cast<int>(i));
        flaky_cumulative_.push_back(flaky_weight);
      }
    }
    // The job fails at nodes * rate; a failure picks a slot uniformly and is
    // dropped when the slot is empty (thinning), which keeps the rate per
    // present node exact.
    const double per_node_s = c_.FailureRate() / 1000.0 / 86400.0;
    double per_second = static_cast<double>(c_.nodes) * per_node_s;
    mean_gap_s_ = per_second > 0 ? 1.0 / per_second : 0;
    double sdc_per_second = static_cast<double>(c_.nodes) * c_.sdc_rate / 1000.0 / 86400.0;
    sdc_gap_s_ = sdc_per_second > 0 ? 1.0 / sdc_per_second : 0;
    slot_node_.assign(c_.nodes, -1);
    node_slot_.assign(pool_.size(), -1);
    flaky_.assign(pool_.size(), 0);
    if (c_.flaky_share > 0) {
      for (int32_t n = 0; n < pool_.size(); ++n) {
        if (rng_flaky_.Uniform() < c_.flaky_share) {
          flaky_[n] = 1;
          flaky_list_.push_back(n);
        }
      }
    }
    // Flaky nodes' extra failures: (factor - 1) x their soft share of the
    // rate, as one stream over the nodes flaky at the start, thinned to those
    // still flaky and in the job.
    if (total_weight > 0 && !flaky_list_.empty() && c_.flaky_factor > 1) {
      double extra = (c_.flaky_factor - 1) * per_node_s * flaky_weight / total_weight *
                     static_cast<double>(flaky_list_.size());
      flaky_gap_s_ = extra > 0 ? 1.0 / extra : 0;
    }
  }

  RunResult Execute() {
    const Duration horizon = c_.duration;
    for (int32_t i = 0; i < c_.nodes; ++i) {
      if (!Join(NodeId{i}, i)) vacant_.push_back(i);
    }
    next_failure_ = NextGap(rng_, mean_gap_s_);
    next_sdc_ = NextGap(rng_sdc_, sdc_gap_s_);
    next_flaky_ = NextGap(rng_flaky_, flaky_gap_s_);
    ProceedWhileDown();
    while (phase_ != Phase::kStopped) {
      const Duration t_flag = c_.straggler_mitigation ? WallAt(NextStragglerMilestone()) : kNever;
      const Duration t_found = corruption_.active ? WallAt(corruption_.found) : kNever;
      const Duration t_script =
          script_next_ < c_.script.size() ? c_.script[script_next_].at : kNever;
      Duration t = std::min({next_failure_, next_sdc_, next_flaky_, phase_end_, Top(repairs_),
                             t_flag, t_found, t_script});
      if (t >= horizon) break;
      now_ = t;
      ++result_.events;
      // A check or a flag at the end of a segment comes before the
      // checkpoint: the step's fingerprints precede its save.
      if (t == t_found) {
        OnCorruptionFound();
      } else if (t == t_flag) {
        OnStragglerFlags();
      } else if (t == phase_end_) {
        OnPhaseEnd();
      } else if (t == t_script) {
        OnScripted(c_.script[script_next_++]);
      } else if (t == next_failure_) {
        OnFailure();
      } else if (t == next_sdc_) {
        OnSdc();
      } else if (t == next_flaky_) {
        OnFlakyFailure();
      } else {
        OnRepaired();
      }
    }
    now_ = std::max(now_, horizon);
    if (phase_ == Phase::kTraining || phase_ == Phase::kCheckpoint) {
      // The final checkpoint at the end of the run (copies are numbered: the
      // simulator restores the newest, and never an older one).
      ledger_.CopyTaken(core::StepNumber{result_.checkpoints + 1}, At(horizon));
    } else {
      ledger_.Advance(At(horizon));
    }
    for (int i = 0; i < core::kNumLedgerCategories; ++i) {
      result_.ledger[i] = ledger_.total(static_cast<LedgerCategory>(i));
    }
    // Checkpointed work that a corruption made worthless: it was booked
    // productive when committed, and has to be trained again. The ledger
    // only rolls back uncommitted work, so the move is made here.
    Duration& productive = result_.ledger[static_cast<int>(LedgerCategory::kProductive)];
    const Duration voided = std::min(voided_, productive);
    productive -= voided;
    result_.ledger[static_cast<int>(LedgerCategory::kRecompute)] += voided;
    result_.wall = ledger_.wall();
    return std::move(result_);
  }

 private:
  static Duration Top(const TimedNodeQueue& q) { return q.empty() ? kNever : q.top().first; }

  Duration NextGap(Rng& rng, double mean_gap_s) const {
    return mean_gap_s > 0 ? now_ + FromSeconds(rng.Exponential() * mean_gap_s) : kNever;
  }

  void Enter(Phase phase, LedgerCategory category, Duration length) {
    phase_ = phase;
    ledger_.Enter(category, At(now_));
    phase_end_ = length == kNever ? kNever : now_ + length;
  }

  int SampleCause() {
    double u = rng_.Uniform() * cumulative_weight_.back();
    auto it = std::upper_bound(cumulative_weight_.begin(), cumulative_weight_.end(), u);
    return static_cast<int>(
        std::min<ptrdiff_t>(it - cumulative_weight_.begin(), cumulative_weight_.size() - 1));
  }

  StepNumber CurrentStep() const { return StepNumber{(committed_ + segment_done_) / c_.step_time}; }
  Duration Progress() const { return committed_ + segment_done_; }

  // When training reaches `progress`, if it does in the current segment.
  Duration WallAt(Duration progress) const {
    if (phase_ != Phase::kTraining || progress == kNever) return kNever;
    const Duration in_segment = progress - committed_;
    if (in_segment > c_.ckpt_interval) return kNever;
    return train_since_ + Scaled(std::max(Duration(0), in_segment - segment_done_));
  }

  bool Detectable(const SlowNode& s) const { return s.factor > 1 + c_.straggler_theta; }

  Duration NextStragglerMilestone() const {
    Duration next = kNever;
    for (const SlowNode& s : slow_) {
      if (!s.flagged && Detectable(s)) next = std::min(next, s.milestone);
    }
    return next;
  }

  Duration WindowLength() const { return c_.step_time * c_.straggler_window; }

  // --- Nodes, slots and stragglers ---------------------------------------

  // Admits `node` to `slot` after the health check; false when it fails the
  // check (it goes to repair and the slot stays empty).
  bool Join(NodeId node, int32_t slot) {
    if (c_.health_check && flaky_[node.value] && rng_check_.Uniform() < c_.health_check_recall) {
      ++result_.health_check_refusals;
      std::string reason = "node " + std::to_string(node.value) +
                           " failed the health check before joining; not admitted";
      if (c_.multi_strike) {
        StrikeVerdict v = strikes_.Strike(node, kHealthCheckCause, now_);
        reason += ": " + v.reason;
      }
      Log({now_,
           Duration(0),
           node,
           IncidentKind::kHealthCheck,
           std::string(kHealthCheckCause),
           "refuse",
           reason,
           {}});
      pool_.Evict(node);
      repairs_.push({now_ + c_.repair, node.value});
      return false;
    }
    slot_node_[slot] = node.value;
    node_slot_[node.value] = slot;
    joined_since_restart_ = true;
    if (c_.straggler_share > 0 && rng_nodes_.Uniform() < c_.straggler_share) {
      double f = c_.straggler_factor +
                 (c_.StragglerFactorMax() - c_.straggler_factor) * rng_nodes_.Uniform();
      MakeSlow(node, f);
      ++result_.stragglers;
    }
    return true;
  }

  // `node` runs `factor` times slower from now on; the detector sees it for
  // its window from now (or from the next generation's start).
  void MakeSlow(NodeId node, double factor) {
    SyncProgress();
    for (SlowNode& s : slow_) {
      if (s.node == node.value) {
        s.factor = factor;
        UpdateSpeed();
        return;
      }
    }
    slow_.push_back({node.value, factor, Progress() + WindowLength(), false});
    UpdateSpeed();
  }

  void ClearSlowness(NodeId node) {
    auto it = std::find_if(slow_.begin(), slow_.end(),
                           [&](const SlowNode& s) { return s.node == node.value; });
    if (it == slow_.end()) return;
    slow_.erase(it);
    UpdateSpeed();
  }

  bool InJob(NodeId node) const { return node_slot_[node.value] >= 0; }

  // Takes `node` out of the job for repair; its slot stays empty until filled.
  void Evict(NodeId node, Duration repair) {
    int32_t slot = node_slot_[node.value];
    ClearSlowness(node);
    slot_node_[slot] = -1;
    node_slot_[node.value] = -1;
    vacant_.push_back(slot);
    pool_.Evict(node);
    repairs_.push({now_ + repair, node.value});
  }

  // Spares not yet promised to an empty slot.
  int32_t SparesFree() const {
    return std::max<int32_t>(0, pool_.spares_available() - static_cast<int32_t>(vacant_.size()));
  }

  void FillVacancies() {
    while (!vacant_.empty()) {
      std::optional<NodeId> spare = pool_.Acquire();
      if (!spare) return;
      int32_t slot = vacant_.back();
      vacant_.pop_back();
      if (Join(*spare, slot)) {
        ++result_.replacements;
      } else {
        vacant_.push_back(slot);
      }
    }
  }

  // Training speed follows the slowest node; while a straggler is not yet
  // flagged in this generation the lost share is detection time, afterwards
  // other.
  void UpdateSpeed() {
    double factor = 1.0;
    bool unflagged = false;
    for (const SlowNode& s : slow_) {
      factor = std::max(factor, s.factor);
      unflagged = unflagged || !s.flagged;
    }
    // A shrunk job computes the same global batch on fewer nodes.
    if (!vacant_.empty()) {
      factor *= static_cast<double>(c_.nodes) /
                static_cast<double>(c_.nodes - static_cast<int64_t>(vacant_.size()));
    }
    LedgerCategory lost_to = unflagged ? LedgerCategory::kDetection : LedgerCategory::kOther;
    if (factor == speed_ && lost_to == lost_to_) return;
    SyncProgress();
    speed_ = factor;
    lost_to_ = lost_to;
    ledger_.SetSlowdown(speed_, lost_to_, At(now_));
    if (phase_ == Phase::kTraining) phase_end_ = now_ + Scaled(c_.ckpt_interval - segment_done_);
  }

  Duration Scaled(Duration work) const {
    return speed_ == 1.0 ? work : FromSeconds(Seconds(work) * speed_);
  }

  void SyncProgress() {
    if (phase_ != Phase::kTraining) return;
    Duration elapsed = now_ - train_since_;
    segment_done_ += speed_ == 1.0 ? elapsed : FromSeconds(Seconds(elapsed) / speed_);
    segment_done_ = std::min(segment_done_, c_.ckpt_interval);
    train_since_ = now_;
  }

  // The job stops training now and restarts from its newest checkpoint: the
  // segment is lost, and so is a corruption that came after that checkpoint.
  void LoseSegment() {
    ledger_.RollBack(At(now_));
    segment_done_ = Duration(0);
    if (corruption_.active && corruption_.at >= committed_) corruption_.active = false;
  }

  // Rolls back to the checkpoint at training progress `target` (<= the
  // committed progress): committed work after it is voided.
  void RollBackTo(Duration target) {
    LoseSegment();
    target = std::min(target, committed_);
    voided_ += committed_ - target;
    committed_ = target;
    corruption_.active = false;
  }

  // --- Events --------------------------------------------------------------

  void OnPhaseEnd() {
    switch (phase_) {
      case Phase::kStartup:
      case Phase::kRestart:
        StartTraining(/*new_generation=*/true);
        break;
      case Phase::kTraining:
        segment_done_ = c_.ckpt_interval;
        Enter(Phase::kCheckpoint, LedgerCategory::kCheckpointStall, c_.ckpt_write);
        break;
      case Phase::kCheckpoint:
        ledger_.CopyTaken(core::StepNumber{result_.checkpoints + 1}, At(now_));
        committed_ += c_.ckpt_interval;
        segment_done_ = Duration(0);
        ++result_.checkpoints;
        StartTraining(/*new_generation=*/false);
        MaybeRegrow();  // a node freed while the checkpoint was written
        break;
      case Phase::kDetect:
        Decide();
        break;
      case Phase::kBackoff:
      case Phase::kWaitRepair:
        ProceedWhileDown();
        break;
      case Phase::kWaitSpare:
      case Phase::kStopped:
        break;
    }
  }

  void StartTraining(bool new_generation) {
    // An in-process restart goes on with the segment it kept in memory.
    const Duration kept = resume_in_place_ ? segment_done_ : Duration(0);
    resume_in_place_ = segment_at_stake_ = false;
    segment_done_ = kept;
    train_since_ = now_;
    segment_started_ = now_;
    if (new_generation) {
      // The detector starts over with every generation (the world's ranks
      // may run on other nodes): each straggler is flagged anew.
      for (SlowNode& s : slow_) {
        s.flagged = false;
        s.milestone = committed_ + WindowLength();
      }
    }
    Enter(Phase::kTraining, LedgerCategory::kProductive, Scaled(c_.ckpt_interval - kept));
    UpdateSpeed();
  }

  void OnFailure() {
    int32_t node = slot_node_[rng_.Below(c_.nodes)];
    next_failure_ = NextGap(rng_, mean_gap_s_);
    if (node < 0) return;  // an empty slot: nothing there to fail
    FailNode(NodeId{node}, SampleCause());
  }

  void OnFlakyFailure() {
    int32_t node = flaky_list_[rng_flaky_.Below(flaky_list_.size())];
    double u = rng_flaky_.Uniform() * flaky_cumulative_.back();
    auto it = std::upper_bound(flaky_cumulative_.begin(), flaky_cumulative_.end(), u);
    int cause = flaky_causes_[std::min<ptrdiff_t>(it - flaky_cumulative_.begin(),
                                                  flaky_causes_.size() - 1)];
    next_flaky_ = NextGap(rng_flaky_, flaky_gap_s_);
    if (!flaky_[node] || !InJob(NodeId{node})) return;
    FailNode(NodeId{node}, cause);
  }

  void OnScripted(const ScriptedEvent& e) {
    if (!InJob(e.node)) return;
    switch (e.kind) {
      case ScriptedEvent::Kind::kFailure: {
        int cause = 0;
        while (c_.causes[cause].name != e.cause) ++cause;  // Finalize() checked it exists
        FailNode(e.node, cause);
        break;
      }
      case ScriptedEvent::Kind::kStraggler:
        if (e.factor > 1) MakeSlow(e.node, e.factor);
        break;
      case ScriptedEvent::Kind::kSdc:
        if (phase_ == Phase::kTraining && !corruption_.active) Corrupt(e.node);
        break;
    }
  }

  void FailNode(NodeId node, int cause) {
    // Only a running program fails with a software cause: while the job
    // waits (for detection, a backoff, a spare or a repair) only the
    // hardware can (thinning keeps the other causes' rate per running hour).
    const bool running = phase_ == Phase::kTraining || phase_ == Phase::kCheckpoint ||
                         phase_ == Phase::kStartup || phase_ == Phase::kRestart;
    if (!running && core::ClassifyCause(c_.causes[cause].name) != core::CauseClass::kHardware) {
      return;
    }
    ++result_.failures;
    ++result_.failures_by_cause[cause];

    PendingFailure f{node, cause, StepNumber{committed_ / c_.step_time}, true};
    if (phase_ == Phase::kTraining || phase_ == Phase::kCheckpoint) {
      SyncProgress();
      f.step = CurrentStep();
      f.during_recovery = false;
      // Lost unless the recovery's route keeps the state in memory
      // (Decide): the segment is at stake until then.
      segment_at_stake_ = true;
    }
    pending_.push_back(f);
    // The job is down from now on. Any recovery under way starts over once
    // this failure is detected; decisions already taken (evictions, waits,
    // backoff) stand.
    Duration detected = now_ + c_.DetectFor(c_.causes[cause]);
    if (phase_ == Phase::kDetect) detected = std::max(detected, phase_end_);
    Enter(Phase::kDetect, LedgerCategory::kDetection, detected - now_);
  }

  // Strikes `node` for `cause` and, when JudgeNode quarantines it and it is
  // still in the job, takes it out. True when it did.
  bool StrikeAndJudge(NodeId node, std::string_view cause, std::string_view context) {
    if (!c_.multi_strike || core::ClassifyCause(cause) == core::CauseClass::kSoftware) {
      return false;
    }
    StrikeVerdict v = strikes_.Strike(node, cause, now_);
    if (!v.quarantined || !InJob(node)) return false;
    ++result_.quarantines;
    Log({now_,
         Duration(0),
         node,
         IncidentKind::kQuarantine,
         std::string(cause),
         "quarantine",
         "node " + std::to_string(node.value) + " quarantined after " + std::string(context) +
             ": " + v.reason,
         {}});
    Evict(node, c_.repair);
    return true;
  }

  // The facts of the job for the route of a restart after `f`, as the job
  // machine gives them (core::DecideFailure asks): the node's ranks fail,
  // the others kept their state when the job was training.
  core::RouteFacts RouteFactsOf(const PendingFailure& f, bool node_leaves, int32_t spares) const {
    core::RouteFacts facts;
    facts.in_process_enabled = c_.in_process;
    facts.hang = c_.causes[f.cause].name == "hang";
    // The job's nodes when it failed (the failed node is evicted only after
    // this decision).
    const int64_t members = c_.nodes - static_cast<int64_t>(vacant_.size());
    facts.world_size = static_cast<int>(std::min<int64_t>(members * c_.gpus_per_node, 1 << 30));
    facts.failed_ranks = static_cast<int>(c_.gpus_per_node);
    facts.nodes = static_cast<int>(std::min<int64_t>(members, 1 << 30));
    facts.min_nodes = static_cast<int>(c_.min_nodes);
    facts.nodes_to_replace = node_leaves ? 1 : 0;
    facts.spares_available = spares;
    facts.productive = !f.during_recovery;
    if (f.during_recovery) {
      facts.first_not_rejoining = 0;  // nobody is training: no state in memory
    } else {
      facts.survivors_rejoining = facts.world_size - facts.failed_ranks;
    }
    return facts;
  }

  void Decide() {
    std::vector<PendingFailure> pending;
    pending.swap(pending_);
    // In process only when every failure detected now allows it.
    bool in_place = !pending.empty();
    for (const PendingFailure& f : pending) {
      const CauseSpec& cause = c_.causes[f.cause];
      // The failure policies, combined as the job machine combines them.
      core::FailureFacts facts;
      facts.event.node = f.node;
      facts.event.cause = cause.name;
      facts.event.step = f.step;
      facts.event.during_recovery = f.during_recovery;
      facts.event.spares_available = SparesFree();
      facts.strikes = c_.multi_strike;
      const core::FailureDecision d =
          core::DecideFailure(policy_, facts, At(now_), [&](RecoveryAction, bool node_leaves) {
            return RouteFactsOf(f, node_leaves, facts.event.spares_available);
          });
      Incident incident{now_,       c_.DetectFor(cause),
                        f.node,     IncidentKind::kFailure,
                        cause.name, std::string(core::RecoveryActionName(d.action)),
                        d.reason,   {},
                        {},         {}};
      if (d.route) {
        in_place = in_place && d.route->route != core::RecoveryRoute::kFullRestart;
        if (d.route->route == core::RecoveryRoute::kShrink) ++result_.shrinks;
        incident.route = d.route->route;
        incident.route_reason = d.route->reason;
      } else {
        in_place = false;
      }
      Log(std::move(incident));
      backoff_until_ = std::max(backoff_until_, now_ + d.delay);
      switch (d.action) {
        case RecoveryAction::kRestartInPlace:
        case RecoveryAction::kTolerate:
          break;
        case RecoveryAction::kReplaceWithSpare:
        case RecoveryAction::kEvictAndWaitForRepair:
          // The node may already be out: it failed twice before detection.
          if (InJob(f.node)) Evict(f.node, c_.RepairFor(cause));
          break;
        case RecoveryAction::kWaitForRepair:
          repair_wait_until_ = std::max(repair_wait_until_, now_ + c_.RepairFor(cause));
          break;
        case RecoveryAction::kStop:
          Stop(d.reason);
          return;
      }
      if (d.strike) StrikeAndJudge(f.node, cause.name, cause.name);
    }
    resume_in_place_ = in_place && segment_at_stake_;
    if (!resume_in_place_ && segment_at_stake_) {
      LoseSegment();
      segment_at_stake_ = false;
    }
    ProceedWhileDown();
  }

  // The next stage of a recovery: backoff, then refill empty slots (waiting
  // for repaired nodes if no spare is left), then wait for component repairs,
  // then restart (or the first start), with the health check when a node
  // joined.
  void ProceedWhileDown() {
    FillVacancies();
    if (now_ < backoff_until_) {
      Enter(Phase::kBackoff, LedgerCategory::kOther, backoff_until_ - now_);
    } else if (static_cast<int64_t>(vacant_.size()) > Shrinkable()) {
      Enter(Phase::kWaitSpare, LedgerCategory::kOther, kNever);
    } else if (now_ < repair_wait_until_) {
      Enter(Phase::kWaitRepair, LedgerCategory::kOther, repair_wait_until_ - now_);
    } else {
      Duration check =
          c_.health_check && joined_since_restart_ ? c_.health_check_time : Duration(0);
      joined_since_restart_ = false;
      if (started_ && resume_in_place_) {
        // The spare (if one joined) was health-checked while it waited.
        ++result_.restarts;
        ++result_.in_process_restarts;
        Enter(Phase::kRestart, LedgerCategory::kRecovery, c_.in_process_restart);
      } else if (started_) {
        ++result_.restarts;
        Enter(Phase::kRestart, LedgerCategory::kRecovery, c_.restart + check);
      } else {
        started_ = true;
        Enter(Phase::kStartup, LedgerCategory::kStartup, c_.startup_or_restart() + check);
      }
    }
  }

  void OnRepaired() {
    NodeId node{repairs_.top().second};
    repairs_.pop();
    pool_.MarkRepaired(node);
    // Released to service: a repair fixes what made it flaky, and the
    // strikes since its last release no longer count.
    strikes_.Release(node);
    flaky_[node.value] = 0;
    if (phase_ == Phase::kWaitSpare) ProceedWhileDown();
    if (phase_ == Phase::kTraining) MaybeRegrow();
  }

  // How many empty slots the job trains with (elastic: down to min_nodes;
  // the first start waits for every node, as the job machine's does).
  int64_t Shrinkable() const { return c_.min_nodes > 0 && started_ ? c_.nodes - c_.min_nodes : 0; }

  // A shrunk job grows back in process once a node is free for an empty
  // slot (as the job machine's MaybeGrow does at the next step): the ranks
  // keep their state, and the rejoin costs in_process_restart.
  void MaybeRegrow() {
    if (vacant_.empty() || pool_.spares_available() == 0) return;
    SyncProgress();
    FillVacancies();
    ++result_.regrows;
    resume_in_place_ = true;
    Enter(Phase::kRestart, LedgerCategory::kRecovery, c_.in_process_restart);
  }

  // The detector flags every straggler whose window is complete. In node
  // order (the controller's rank order), each flag gets a soft strike and
  // DecideStraggler's move; the first move stops the generation, as in the
  // controller, and the rest are flagged again in the next one.
  void OnStragglerFlags() {
    std::vector<int32_t> due;
    for (const SlowNode& s : slow_) {
      if (!s.flagged && Detectable(s) && WallAt(s.milestone) <= now_) due.push_back(s.node);
    }
    SyncProgress();
    std::sort(due.begin(), due.end(),
              [&](int32_t a, int32_t b) { return node_slot_[a] < node_slot_[b]; });
    for (int32_t n : due) {
      auto it =
          std::find_if(slow_.begin(), slow_.end(), [&](const SlowNode& s) { return s.node == n; });
      it->flagged = true;
      ++result_.stragglers_flagged;
      const NodeId node{n};
      core::StragglerCosts costs;
      costs.slowdown = it->factor;
      costs.step_time = Scaled(c_.step_time);
      costs.remaining = c_.duration - now_;
      costs.restart_cost = c_.restart + (c_.health_check ? c_.health_check_time : Duration(0));
      costs.lost_work = now_ - segment_started_;
      costs.spares = SparesFree();
      costs.replacement_wait =
          costs.spares > 0 ? Duration(0) : (repairs_.empty() ? c_.repair : Top(repairs_) - now_);
      core::StragglerDecision d = core::DecideStraggler(costs);
      char factor[32];
      std::snprintf(factor, sizeof factor, "%.2fx", it->factor);
      Log({now_, Scaled(WindowLength()), node, IncidentKind::kStraggler,
           std::string(kStragglerCause), std::string(core::StragglerMoveName(d.move)),
           "node " + std::to_string(n) + " computed " + factor + " the peers' median in the last " +
               std::to_string(c_.straggler_window) + " steps; " + d.reason,
           costs});
      bool quarantined = StrikeAndJudge(node, kStragglerCause, "a straggler flag");
      if (!quarantined && d.move == core::StragglerMove::kKeep) continue;
      if (!quarantined) {
        ++result_.straggler_moves;
        Evict(node, c_.repair);
      }
      LoseSegment();
      ProceedWhileDown();
      return;
    }
    UpdateSpeed();  // the lost share now goes to other
  }

  void OnSdc() {
    int32_t node = slot_node_[rng_sdc_.Below(c_.nodes)];
    next_sdc_ = NextGap(rng_sdc_, sdc_gap_s_);
    // Corruption needs a replica computing; one corruption at a time (a
    // second before the first is found adds nothing to the model).
    if (node < 0 || phase_ != Phase::kTraining || corruption_.active) return;
    Corrupt(NodeId{node});
  }

  void Corrupt(NodeId node) {
    SyncProgress();
    ++result_.sdc_events;
    corruption_ = {true, node, Progress(), now_, Duration(0)};
    if (c_.sdc_check_every > 0) {
      // The next check step after the corrupted one.
      const Duration every = c_.step_time * c_.sdc_check_every;
      corruption_.found = (Progress() / every + 1) * every;
    } else {
      corruption_.found = Progress() + c_.sdc_undetected_cost;
    }
  }

  void OnCorruptionFound() {
    SyncProgress();
    const Corruption found = corruption_;
    const std::string node_name = "node " + std::to_string(found.node.value);
    if (c_.sdc_check_every > 0) {
      ++result_.sdc_detected;
      // The check's verdict from core::SdcChecker: the corrupted replica
      // against two that stand for the majority of the others.
      const int64_t check = Progress() / c_.step_time;
      const int64_t previous = check - c_.sdc_check_every;
      core::SdcChecker checker;
      checker.OnGenerationStart(3);
      const std::string good = "00000000000000aa", bad = "00000000000000ab";
      if (previous > 0) {
        for (int r = 0; r < 3; ++r)
          checker.OnFingerprint(core::Rank{r}, StepNumber{previous}, good);
      }
      std::optional<core::SdcVerdict> verdict;
      for (int r = 0; r < 3; ++r) {
        verdict = checker.OnFingerprint(core::Rank{r}, StepNumber{check}, r == 0 ? bad : good);
      }
      const int64_t agreed = std::max<int64_t>(0, checker.last_agreed().value);
      const Duration target = (c_.step_time * agreed) / c_.ckpt_interval * c_.ckpt_interval;
      const bool evict = verdict && verdict->decided && !verdict->suspects.empty();
      std::string reason = node_name + "'s replica: " + (verdict ? verdict->reason : "") +
                           "; rolling back to the newest checkpoint at or before step " +
                           std::to_string(agreed) + ", the last check that agreed";
      RollBackTo(target);
      if (evict && InJob(found.node)) {
        reason += "; " + node_name + " struck (sdc, hard) and evicted";
        if (c_.multi_strike) strikes_.Strike(found.node, kSdcCause, now_);
        Evict(found.node, c_.repair);
      }
      Log({now_,
           now_ - found.at_wall,
           found.node,
           IncidentKind::kSdc,
           std::string(kSdcCause),
           evict ? "rollback_and_evict" : "rollback",
           reason,
           {}});
      ProceedWhileDown();
      return;
    }
    // No check: a loss spike shows the damage long after; nobody knows the
    // node, so it stays, and the job rolls back to before the corruption.
    ++result_.sdc_undetected;
    const Duration target = found.at / c_.ckpt_interval * c_.ckpt_interval;
    Log({now_,
         now_ - found.at_wall,
         found.node,
         IncidentKind::kSdc,
         std::string(kSdcCause),
         "rollback",
         "undetected silent data corruption (on " + node_name + ") shown by a loss spike after " +
             FormatDuration(Progress() - found.at) +
             " of training; rolling back to the newest checkpoint before it",
         {}});
    RollBackTo(target);
    Enter(Phase::kDetect, LedgerCategory::kDetection, c_.detect);
  }

  void Stop(const std::string& reason) {
    result_.gave_up = true;
    result_.stop_reason = reason;
    Enter(Phase::kStopped, LedgerCategory::kOther, kNever);
  }

  void Log(Incident incident) {
    if (static_cast<int>(result_.incidents.size()) >= max_incidents_) return;
    result_.incidents.push_back(std::move(incident));
  }

  const SimConfig& c_;
  Rng rng_;        // failures
  Rng rng_nodes_;  // stragglers among joining nodes
  Rng rng_sdc_;
  Rng rng_flaky_;
  Rng rng_check_;  // the health check's recall
  core::RecoveryPolicy policy_;
  core::SparePool pool_;
  core::EttrLedger ledger_;
  StrikeRecord strikes_;
  const int max_incidents_;
  RunResult result_;

  std::vector<double> cumulative_weight_;
  std::vector<int> flaky_causes_;
  std::vector<double> flaky_cumulative_;
  double mean_gap_s_ = 0;
  double sdc_gap_s_ = 0;
  double flaky_gap_s_ = 0;

  Duration now_{0};
  Phase phase_ = Phase::kStartup;
  Duration phase_end_ = kNever;
  Duration next_failure_ = kNever;
  Duration next_sdc_ = kNever;
  Duration next_flaky_ = kNever;
  size_t script_next_ = 0;
  bool started_ = false;
  bool joined_since_restart_ = false;
  // A failure hit while training: its segment is lost unless the restart
  // is in process (Decide), which then resumes it (StartTraining).
  bool segment_at_stake_ = false;
  bool resume_in_place_ = false;

  // Training progress: committed by checkpoints, and within the segment.
  Duration committed_{0};
  Duration segment_done_{0};
  Duration train_since_{0};
  Duration segment_started_{0};  // wall time the segment began: the work a restart loses
  double speed_ = 1.0;           // wall time per unit of training time
  LedgerCategory lost_to_ = LedgerCategory::kOther;
  Duration voided_{0};  // committed work a corruption made worthless

  // Slot i of the job holds node slot_node_[i] (or -1 while empty).
  std::vector<int32_t> slot_node_;
  std::vector<int32_t> node_slot_;
  std::vector<uint8_t> flaky_;       // by node
  std::vector<int32_t> flaky_list_;  // nodes flaky at the start
  std::vector<SlowNode> slow_;       // slow nodes in the job
  std::vector<int32_t> vacant_;
  Corruption corruption_;

  std::vector<PendingFailure> pending_;
  Duration backoff_until_{0};
  Duration repair_wait_until_{0};
  TimedNodeQueue repairs_;
};

}  // namespace

std::string_view IncidentKindName(IncidentKind kind) {
  switch (kind) {
    case IncidentKind::kFailure:
      return "failure";
    case IncidentKind::kStraggler:
      return "straggler";
    case IncidentKind::kSdc:
      return "sdc";
    case IncidentKind::kQuarantine:
      return "quarantine";
    case IncidentKind::kHealthCheck:
      return "health_check";
  }
  return "?";
}

double RunResult::ettr() const {
  if (wall <= Duration(0)) return 0;
  return Seconds(category(core::LedgerCategory::kProductive)) / Seconds(wall);
}

uint64_t RunSeed(uint64_t seed, int64_t index) {
  uint64_t state = seed ^ (0x5851f42d4c957f2dULL * static_cast<uint64_t>(index + 1));
  return SplitMix64(state);
}

RunResult SimulateRun(const SimConfig& config, uint64_t seed, int max_incidents) {
  return Run(config, seed, max_incidents).Execute();
}

}  // namespace endure::sim
