// Discrete-event simulation of one run; see simulator.h for the model.
#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <utility>

#include "core/spare_pool.h"

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

enum class Slowness : uint8_t { kNormal, kUndetected, kKnown };

struct PendingFailure {
  NodeId node;
  int cause;
  StepNumber step;
  bool during_recovery;
};

using TimedNode = std::pair<Duration, int32_t>;
using TimedNodeQueue = std::priority_queue<TimedNode, std::vector<TimedNode>, std::greater<>>;

class Run {
 public:
  Run(const SimConfig& config, uint64_t seed, int max_incidents)
      : c_(config),
        rng_(seed),
        policy_(config.policy),
        pool_(static_cast<int32_t>(config.nodes), static_cast<int32_t>(config.spares)),
        ledger_(At(Duration(0))),
        max_incidents_(max_incidents) {
    result_.seed = seed;
    result_.failures_by_cause.assign(c_.causes.size(), 0);
    double total_weight = 0;
    for (const CauseSpec& s : c_.causes) {
      total_weight += s.weight;
      cumulative_weight_.push_back(total_weight);
    }
    // The job fails at nodes * rate; a failure picks a slot uniformly and is
    // dropped when the slot is empty (thinning), which keeps the rate per
    // present node exact.
    double per_second = static_cast<double>(c_.nodes) * c_.FailureRate() / 1000.0 / 86400.0;
    mean_gap_s_ = per_second > 0 ? 1.0 / per_second : 0;
    slot_node_.assign(c_.nodes, -1);
    node_slot_.assign(pool_.size(), -1);
    slowness_.assign(pool_.size(), Slowness::kNormal);
  }

  RunResult Execute() {
    const Duration horizon = c_.duration;
    for (int32_t i = 0; i < c_.nodes; ++i) Join(NodeId{i}, i);
    Enter(Phase::kStartup, LedgerCategory::kStartup, c_.startup_or_restart());
    DrawNextFailure();
    while (phase_ != Phase::kStopped) {
      Duration t = std::min({next_failure_, phase_end_, Top(repairs_), Top(straggler_checks_)});
      if (t >= horizon) break;
      now_ = t;
      ++result_.events;
      if (t == phase_end_) {
        OnPhaseEnd();
      } else if (t == next_failure_) {
        OnFailure();
      } else if (t == Top(repairs_)) {
        OnRepaired();
      } else {
        OnStragglerCheck();
      }
    }
    now_ = std::max(now_, horizon);
    if (phase_ == Phase::kTraining || phase_ == Phase::kCheckpoint) {
      ledger_.Commit(At(horizon));  // the final checkpoint at the end of the run
    } else {
      ledger_.Advance(At(horizon));
    }
    for (int i = 0; i < core::kNumLedgerCategories; ++i) {
      result_.ledger[i] = ledger_.total(static_cast<LedgerCategory>(i));
    }
    result_.wall = ledger_.wall();
    return std::move(result_);
  }

 private:
  static Duration Top(const TimedNodeQueue& q) { return q.empty() ? kNever : q.top().first; }

  void Enter(Phase phase, LedgerCategory category, Duration length) {
    phase_ = phase;
    ledger_.Enter(category, At(now_));
    phase_end_ = length == kNever ? kNever : now_ + length;
  }

  void DrawNextFailure() {
    next_failure_ = mean_gap_s_ > 0 ? now_ + FromSeconds(rng_.Exponential() * mean_gap_s_) : kNever;
  }

  int SampleCause() {
    double u = rng_.Uniform() * cumulative_weight_.back();
    auto it = std::upper_bound(cumulative_weight_.begin(), cumulative_weight_.end(), u);
    return static_cast<int>(
        std::min<ptrdiff_t>(it - cumulative_weight_.begin(), cumulative_weight_.size() - 1));
  }

  StepNumber CurrentStep() const { return StepNumber{(committed_ + segment_done_) / c_.step_time}; }

  // --- Nodes, slots and stragglers ---------------------------------------

  void Join(NodeId node, int32_t slot) {
    slot_node_[slot] = node.value;
    node_slot_[node.value] = slot;
    if (c_.straggler_share > 0 && rng_.Uniform() < c_.straggler_share) {
      slowness_[node.value] = Slowness::kUndetected;
      ++slow_active_;
      ++undetected_slow_;
      ++result_.stragglers;
      straggler_checks_.push({now_ + c_.straggler_detect, node.value});
      UpdateSpeed();
    }
  }

  void ClearSlowness(NodeId node) {
    Slowness& s = slowness_[node.value];
    if (s == Slowness::kNormal) return;
    --slow_active_;
    if (s == Slowness::kUndetected) --undetected_slow_;
    s = Slowness::kNormal;
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
      ++result_.replacements;
      int32_t slot = vacant_.back();
      vacant_.pop_back();
      Join(*spare, slot);
    }
  }

  // Training speed follows the slowest node; while a straggler is still
  // undetected the lost share is detection time, afterwards other.
  void UpdateSpeed() {
    double factor = slow_active_ > 0 ? c_.straggler_factor : 1.0;
    LedgerCategory lost_to =
        undetected_slow_ > 0 ? LedgerCategory::kDetection : LedgerCategory::kOther;
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

  // --- Events --------------------------------------------------------------

  void OnPhaseEnd() {
    switch (phase_) {
      case Phase::kStartup:
      case Phase::kRestart:
        StartTraining();
        break;
      case Phase::kTraining:
        segment_done_ = c_.ckpt_interval;
        Enter(Phase::kCheckpoint, LedgerCategory::kCheckpointStall, c_.ckpt_write);
        break;
      case Phase::kCheckpoint:
        ledger_.Commit(At(now_));
        committed_ += c_.ckpt_interval;
        segment_done_ = Duration(0);
        ++result_.checkpoints;
        if (!planned_evictions_.empty() || !planned_restarts_.empty()) {
          ProceedWhileDown();  // a planned restart after a durable checkpoint
        } else {
          StartTraining();
        }
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

  void StartTraining() {
    segment_done_ = Duration(0);
    train_since_ = now_;
    Enter(Phase::kTraining, LedgerCategory::kProductive, Scaled(c_.ckpt_interval));
  }

  void OnFailure() {
    int32_t node = slot_node_[rng_.Below(c_.nodes)];
    DrawNextFailure();
    if (node < 0) return;  // an empty slot: nothing there to fail
    int cause = SampleCause();
    ++result_.failures;
    ++result_.failures_by_cause[cause];

    PendingFailure f{NodeId{node}, cause, StepNumber{committed_ / c_.step_time}, true};
    if (phase_ == Phase::kTraining || phase_ == Phase::kCheckpoint) {
      SyncProgress();
      f.step = CurrentStep();
      f.during_recovery = false;
      ledger_.RollBack(At(now_));
      segment_done_ = Duration(0);
    }
    pending_.push_back(f);
    // The job is down from now on. Any recovery under way starts over once
    // this failure is detected; decisions already taken (evictions, waits,
    // backoff) stand.
    Duration detected = now_ + c_.DetectFor(c_.causes[cause]);
    if (phase_ == Phase::kDetect) detected = std::max(detected, phase_end_);
    Enter(Phase::kDetect, LedgerCategory::kDetection, detected - now_);
  }

  void Decide() {
    std::vector<PendingFailure> pending;
    pending.swap(pending_);
    for (const PendingFailure& f : pending) {
      const CauseSpec& cause = c_.causes[f.cause];
      core::FailureEvent event;
      event.node = f.node;
      event.cause = cause.name;
      event.step = f.step;
      event.during_recovery = f.during_recovery;
      event.spares_available = SparesFree();
      core::RecoveryDecision d = policy_.Step(event, At(now_));
      Log(d, cause.name, c_.DetectFor(cause));
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
    }
    ProceedWhileDown();
  }

  // The next stage of a recovery: backoff, then refill empty slots (waiting
  // for repaired nodes if no spare is left), then wait for component repairs,
  // then restart.
  void ProceedWhileDown() {
    for (NodeId node : planned_evictions_) {
      if (InJob(node)) Evict(node, c_.repair);
    }
    planned_evictions_.clear();
    for (NodeId node : planned_restarts_) {
      if (InJob(node)) ClearSlowness(node);  // a restart cured it
    }
    planned_restarts_.clear();
    FillVacancies();
    if (now_ < backoff_until_) {
      Enter(Phase::kBackoff, LedgerCategory::kOther, backoff_until_ - now_);
    } else if (!vacant_.empty()) {
      Enter(Phase::kWaitSpare, LedgerCategory::kOther, kNever);
    } else if (now_ < repair_wait_until_) {
      Enter(Phase::kWaitRepair, LedgerCategory::kOther, repair_wait_until_ - now_);
    } else {
      ++result_.restarts;
      Enter(Phase::kRestart, LedgerCategory::kRecovery, c_.restart);
    }
  }

  void OnRepaired() {
    NodeId node{repairs_.top().second};
    repairs_.pop();
    pool_.MarkRepaired(node);
    if (phase_ == Phase::kWaitSpare) ProceedWhileDown();
  }

  void OnStragglerCheck() {
    NodeId node{straggler_checks_.top().second};
    straggler_checks_.pop();
    if (!InJob(node) || slowness_[node.value] != Slowness::kUndetected) return;
    slowness_[node.value] = Slowness::kKnown;
    --undetected_slow_;
    UpdateSpeed();

    core::FailureEvent event;
    event.node = node;
    event.cause = kStragglerCause;
    event.step = CurrentStep();
    event.degraded = true;
    event.spares_available = SparesFree();
    core::RecoveryDecision d = policy_.Step(event, At(now_));
    Log(d, std::string(kStragglerCause), c_.straggler_detect);
    // Act at the next durable checkpoint, or when the job next restarts
    // anyway, whichever comes first: replacing it now would lose the segment.
    switch (d.action) {
      case RecoveryAction::kReplaceWithSpare:
      case RecoveryAction::kEvictAndWaitForRepair:
        planned_evictions_.push_back(node);
        break;
      case RecoveryAction::kRestartInPlace:
        planned_restarts_.push_back(node);
        break;
      case RecoveryAction::kStop:
        Stop(d.reason);
        break;
      case RecoveryAction::kWaitForRepair:
      case RecoveryAction::kTolerate:
        break;
    }
  }

  void Stop(const std::string& reason) {
    result_.gave_up = true;
    result_.stop_reason = reason;
    Enter(Phase::kStopped, LedgerCategory::kOther, kNever);
  }

  void Log(const core::RecoveryDecision& d, const std::string& cause, Duration detection) {
    if (static_cast<int>(result_.incidents.size()) >= max_incidents_) return;
    result_.incidents.push_back({now_, detection, d.node, cause, d.action, d.reason});
  }

  const SimConfig& c_;
  Rng rng_;
  core::RecoveryPolicy policy_;
  core::SparePool pool_;
  core::EttrLedger ledger_;
  const int max_incidents_;
  RunResult result_;

  std::vector<double> cumulative_weight_;
  double mean_gap_s_ = 0;

  Duration now_{0};
  Phase phase_ = Phase::kStartup;
  Duration phase_end_ = kNever;
  Duration next_failure_ = kNever;

  // Training progress: committed by checkpoints, and within the segment.
  Duration committed_{0};
  Duration segment_done_{0};
  Duration train_since_{0};
  double speed_ = 1.0;  // wall time per unit of training time
  LedgerCategory lost_to_ = LedgerCategory::kOther;

  // Slot i of the job holds node slot_node_[i] (or -1 while empty).
  std::vector<int32_t> slot_node_;
  std::vector<int32_t> node_slot_;
  std::vector<Slowness> slowness_;
  std::vector<int32_t> vacant_;
  int32_t slow_active_ = 0;
  int32_t undetected_slow_ = 0;

  std::vector<PendingFailure> pending_;
  Duration backoff_until_{0};
  Duration repair_wait_until_{0};
  std::vector<NodeId> planned_evictions_;
  std::vector<NodeId> planned_restarts_;
  TimedNodeQueue repairs_;
  TimedNodeQueue straggler_checks_;
};

}  // namespace

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
