// Hang detection over per-rank step progress; see hang_detector.h.
#include "core/hang_detector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace endure::core {

Status HangDetectorOptions::Validate() const {
  if (floor <= Duration::zero()) {
    return InvalidArgument("hang detector: floor must be positive, got " + FormatDuration(floor));
  }
  if (!(k >= 1.0) || !std::isfinite(k)) {
    return InvalidArgument("hang detector: k must be a finite number >= 1, got " +
                           std::to_string(k));
  }
  if (window < 1) {
    return InvalidArgument("hang detector: window must be at least 1 step, got " +
                           std::to_string(window));
  }
  if (min_samples < 1 || min_samples > window) {
    return InvalidArgument("hang detector: min_samples must be in [1, window=" +
                           std::to_string(window) + "], got " + std::to_string(min_samples));
  }
  if (startup_timeout <= Duration::zero()) {
    return InvalidArgument("hang detector: startup_timeout must be positive, got " +
                           FormatDuration(startup_timeout));
  }
  if (phase_first_timeout <= Duration::zero()) {
    return InvalidArgument("hang detector: phase_first_timeout must be positive, got " +
                           FormatDuration(phase_first_timeout));
  }
  return Status::Ok();
}

HangDetector::HangDetector(HangDetectorOptions options) : options_(options) {
  ENDURE_CHECK(options_.Validate().ok());
  samples_.reserve(options_.window);
  grouped_at_ = StepTimeout();
}

void HangDetector::OnGenerationStart(int generation, int world_size, TimePoint now) {
  ENDURE_CHECK(world_size >= 1);
  active_ = true;
  generation_ = generation;
  generation_start_ = now;
  ranks_.assign(world_size, RankProgress{});
  in_phase_.clear();
  shift_ = Duration(0);
  RebuildProgressIndex();
  ranks_done_startup_ = 0;
  reported_ = false;
  frontier_step_ = StepNumber{0};
  frontier_time_ = now;
  phases_taken_out_until_ = now;
}

Status HangDetector::CheckRank(int rank, std::string_view what) const {
  if (!active_) {
    return InvalidArgument("hang detector: " + std::string(what) +
                           " before any generation started");
  }
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) {
    return InvalidArgument("hang detector: rank " + std::to_string(rank) +
                           " is outside generation " + std::to_string(generation_) +
                           " of world size " + std::to_string(ranks_.size()));
  }
  return Status::Ok();
}

Status HangDetector::OnPhase(int rank, std::string_view phase, TimePoint now) {
  ENDURE_RETURN_IF_ERROR(CheckRank(rank, "phase report"));
  RankProgress& p = ranks_[rank];
  // What a rank does after its last step (a final evaluation under the name
  // of its periodic one, a sample, a save) is its finish, whatever it calls
  // it: no learned timeout of a repeated phase fits it.
  if (p.phase == phase || p.phase == kFinishPhase) return Status::Ok();
  EndPhase(rank, now);
  p.phase = std::string(phase);
  p.phase_since = now;
  FileInPhase(p);
  Refile(rank);
  reported_ = false;
  return Status::Ok();
}

void HangDetector::Unfile(int r) {
  RankProgress& p = ranks_[r];
  if (p.filed == RankProgress::Filed::kTrain) {
    train_by_base_.erase({p.base, r});
    train_by_timeout_.erase({p.own_timeout, r});
    Ungroup(r);
  }
  if (p.filed == RankProgress::Filed::kPhased) phased_by_base_.erase({p.base, r});
  p.filed = RankProgress::Filed::kNone;
}

void HangDetector::Refile(int r) {
  Unfile(r);
  RankProgress& p = ranks_[r];
  if (p.finished) return;
  if (InOtherPhase(p)) {
    p.filed = RankProgress::Filed::kPhased;
    phased_by_base_.insert({p.base, r});
  } else {
    p.filed = RankProgress::Filed::kTrain;
    p.own_timeout = p.last_duration
                        ? std::chrono::duration_cast<Duration>(*p.last_duration * options_.k)
                        : Duration(0);
    train_by_base_.insert({p.base, r});
    train_by_timeout_.insert({p.own_timeout, r});
    Group(r);
  }
}

void HangDetector::Group(int r) {
  RankProgress& p = ranks_[r];
  p.beyond = p.own_timeout > grouped_at_;
  if (p.beyond) {
    beyond_by_own_.insert({p.base + p.own_timeout, r});
  } else {
    within_by_base_.insert({p.base, r});
  }
}

void HangDetector::Ungroup(int r) {
  const RankProgress& p = ranks_[r];
  if (p.beyond) {
    beyond_by_own_.erase({p.base + p.own_timeout, r});
  } else {
    within_by_base_.erase({p.base, r});
  }
}

void HangDetector::SetProgress(int r, TimePoint progress) {
  Unfile(r);
  ranks_[r].base = progress - shift_;
  Refile(r);
}

void HangDetector::RebuildProgressIndex() {
  train_by_base_.clear();
  train_by_timeout_.clear();
  within_by_base_.clear();
  beyond_by_own_.clear();
  phased_by_base_.clear();
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    ranks_[r].filed = RankProgress::Filed::kNone;
    Refile(r);
  }
}

void HangDetector::CapProgress(TimePoint cap) {
  const TimePoint base_cap = cap - shift_;
  std::vector<int> capped;
  for (auto* index : {&train_by_base_, &phased_by_base_}) {
    while (!index->empty() && std::prev(index->end())->first > base_cap) {
      capped.push_back(std::prev(index->end())->second);
      Unfile(capped.back());
    }
  }
  for (int r : capped) {
    ranks_[r].base = base_cap;
    Refile(r);
  }
}

void HangDetector::FloorProgress(TimePoint floor) {
  const TimePoint base_floor = floor - shift_;
  std::vector<int> raised;
  for (auto* index : {&train_by_base_, &phased_by_base_}) {
    while (!index->empty() && index->begin()->first < base_floor) {
      raised.push_back(index->begin()->second);
      Unfile(raised.back());
    }
  }
  for (int r : raised) {
    ranks_[r].base = base_floor;
    Refile(r);
  }
}

void HangDetector::FileInPhase(const RankProgress& p) {
  if (InOtherPhase(p) && !p.finished) in_phase_[p.phase].insert(p.phase_since);
}

void HangDetector::UnfileInPhase(const RankProgress& p) {
  if (!InOtherPhase(p) || p.finished) return;
  auto it = in_phase_.find(p.phase);
  if (it == in_phase_.end()) return;
  auto at = it->second.find(p.phase_since);
  if (at != it->second.end()) it->second.erase(at);
  if (it->second.empty()) in_phase_.erase(it);
}

void HangDetector::EndPhase(int rank, TimePoint now) {
  RankProgress& p = ranks_[rank];
  if (!InOtherPhase(p)) return;
  UnfileInPhase(p);
  // The end of a run is no repeated phase to learn a timeout from: a rank
  // that goes on from it into its final evaluation leaves it at once, and
  // that would make another rank's teardown a hang after the floor.
  if (p.phase != kFinishPhase) {
    PhaseStats& stats = phases_[p.phase];
    const Duration d = now - p.phase_since;
    if (static_cast<int>(stats.samples.size()) < options_.window) {
      stats.samples.push_back(d);
    } else {
      stats.samples[stats.next] = d;
    }
    stats.next = (stats.next + 1) % options_.window;
  }
  p.phase = std::string(kTrainPhase);
  // The time spent in phases is no step time: every rank's step clock (the
  // others waited for this one at their next collective) and the step-time
  // frontier move forward by it. Only by the part not already taken out
  // for another rank's phase at the same time (all ranks checkpoint
  // together), and never past now. A phase inside every step (a checkpoint
  // copy) then shortens the step samples by its length, no more.
  const TimePoint from = std::max(p.phase_since, phases_taken_out_until_);
  const Duration uncovered = now > from ? now - from : Duration::zero();
  phases_taken_out_until_ = std::max(phases_taken_out_until_, now);
  if (uncovered > Duration::zero()) {
    // Every rank's clock: r.progress = min(now, r.progress + uncovered).
    shift_ += uncovered;
    CapProgress(now);
  }
  frontier_time_ = std::min(now, frontier_time_ + uncovered);
}

Status HangDetector::OnRankFinished(int rank) {
  ENDURE_RETURN_IF_ERROR(CheckRank(rank, "a rank's end"));
  UnfileInPhase(ranks_[rank]);
  ranks_[rank].finished = true;
  Refile(rank);
  return Status::Ok();
}

Duration HangDetector::PhaseTimeout(std::string_view phase) const {
  auto it = phases_.find(phase);
  if (it == phases_.end() || it->second.samples.empty()) return options_.phase_first_timeout;
  std::vector<Duration> sorted = it->second.samples;
  const size_t index = static_cast<size_t>(std::ceil(0.99 * sorted.size())) - 1;
  std::nth_element(sorted.begin(), sorted.begin() + index, sorted.end());
  return std::max(options_.floor, std::chrono::duration_cast<Duration>(sorted[index] * options_.k));
}

TimePoint HangDetector::PhaseDeadlineOf(const RankProgress& p) const {
  return p.phase_since + PhaseTimeout(p.phase);
}

std::optional<TimePoint> HangDetector::LatestPhaseDeadline() const {
  std::optional<TimePoint> latest;
  for (const auto& [phase, since] : in_phase_) {
    const TimePoint d = *since.rbegin() + PhaseTimeout(phase);
    if (!latest || d > *latest) latest = d;
  }
  return latest;
}

Status HangDetector::OnStepEnd(int rank, StepNumber step, TimePoint now) {
  ENDURE_RETURN_IF_ERROR(CheckRank(rank, "step report"));
  RankProgress& p = ranks_[rank];
  if (p.last_step.has_value() && step <= *p.last_step) return Status::Ok();
  // A step ends whatever phase the rank was in: it is back to training.
  EndPhase(rank, now);

  if (p.last_step.has_value()) {
    // The first step of a generation includes start-up, so it is no sample.
    p.last_duration = (now - Progress(p)) / (step.value - p.last_step->value);
  } else {
    ++ranks_done_startup_;
    if (!InStartup()) {
      // The last rank just got through start-up: from here on, frontier
      // advances measure steps and nothing else.
      frontier_time_ = now;
      frontier_step_ = step;
      // `p` itself has no step yet: it is the one being recorded.
      for (const RankProgress& r : ranks_) {
        if (r.last_step) frontier_step_ = std::max(frontier_step_, *r.last_step);
      }
    }
  }
  p.last_step = step;
  SetProgress(rank, now);
  reported_ = false;

  if (!InStartup() && step > frontier_step_) {
    RecordStepDuration((now - frontier_time_) / (step.value - frontier_step_.value));
    frontier_step_ = step;
    frontier_time_ = now;
  }
  return Status::Ok();
}

bool HangDetector::AnyRankInOtherPhase() const { return !in_phase_.empty(); }

void HangDetector::Resume(TimePoint now) {
  if (!active_) return;
  if (InStartup()) generation_start_ = std::max(generation_start_, now);
  FloorProgress(now);
  frontier_time_ = std::max(frontier_time_, now);
}

void HangDetector::RecordStepDuration(Duration d) {
  if (static_cast<int>(samples_.size()) < options_.window) {
    samples_.push_back(d);
  } else {
    samples_[next_sample_] = d;
  }
  next_sample_ = (next_sample_ + 1) % options_.window;
  ++total_samples_;

  // Nearest-rank p99. Recomputed per sample: the window is small, and Check
  // and NextDeadline then stay O(world size).
  std::vector<Duration> sorted = samples_;
  const size_t index = static_cast<size_t>(std::ceil(0.99 * sorted.size())) - 1;
  std::nth_element(sorted.begin(), sorted.begin() + index, sorted.end());
  cached_p99_ = sorted[index];
  Regroup();
}

void HangDetector::Regroup() {
  const Duration timeout = StepTimeout();
  if (timeout == grouped_at_) return;
  // The ranks whose own timeout lies in (lower, upper] change sides.
  const Duration lower = std::min(timeout, grouped_at_), upper = std::max(timeout, grouped_at_);
  grouped_at_ = timeout;
  for (auto it = train_by_timeout_.upper_bound({lower, std::numeric_limits<int>::max()});
       it != train_by_timeout_.end() && it->first <= upper; ++it) {
    Ungroup(it->second);
    Group(it->second);
  }
}

std::optional<Duration> HangDetector::P99StepDuration() const {
  if (samples_.empty()) return std::nullopt;
  return cached_p99_;
}

Duration HangDetector::StepTimeout() const {
  if (total_samples_ < options_.min_samples) return options_.startup_timeout;
  return std::max(options_.floor, std::chrono::duration_cast<Duration>(cached_p99_ * options_.k));
}

TimePoint HangDetector::DeadlineOf(const RankProgress& p, std::optional<TimePoint> waiting) const {
  TimePoint deadline;
  if (InStartup()) {
    deadline = generation_start_ + options_.startup_timeout;
  } else {
    Duration timeout = StepTimeout();
    if (p.last_duration.has_value()) {
      timeout =
          std::max(timeout, std::chrono::duration_cast<Duration>(*p.last_duration * options_.k));
    }
    deadline = Progress(p) + timeout;
  }
  // In a phase of its own, the rank is judged by that phase's timeout (and
  // by start-up's when that is later); the others wait for the latest one.
  if (InOtherPhase(p)) {
    const TimePoint phase = PhaseDeadlineOf(p);
    return InStartup() ? std::max(deadline, phase) : phase;
  }
  if (waiting) deadline = std::max(deadline, *waiting);
  return deadline;
}

std::string HangDetector::DescribeTimeout() const {
  if (InStartup()) return "start-up timeout " + FormatDuration(options_.startup_timeout);
  if (total_samples_ < options_.min_samples) {
    return "start-up timeout " + FormatDuration(options_.startup_timeout) + " while warming up (" +
           std::to_string(total_samples_) + " of " + std::to_string(options_.min_samples) +
           " step times seen)";
  }
  std::ostringstream out;
  out << FormatDuration(StepTimeout()) << " = max(floor " << FormatDuration(options_.floor) << ", "
      << options_.k << " x p99 " << FormatDuration(cached_p99_) << ")";
  return out.str();
}

std::optional<HangVerdict> HangDetector::Check(TimePoint now) {
  // No rank is past its deadline before the earliest one: a tick costs no
  // walk over every rank until one is (NextDeadline is exactly that time).
  const std::optional<TimePoint> next = NextDeadline();
  if (!next || *next > now) return std::nullopt;

  HangVerdict v;
  v.generation = generation_;
  v.during_startup = InStartup();
  // A rank stalled inside a phase of its own is the verdict's subject: the
  // ranks in "train" that stall with it are waiting for it.
  const std::optional<TimePoint> waiting = LatestPhaseDeadline();
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    if (ranks_[r].finished || DeadlineOf(ranks_[r], waiting) > now) continue;
    v.stalled_ranks.push_back(r);
    if (InOtherPhase(ranks_[r]) && v.phase == kTrainPhase) v.phase = ranks_[r].phase;
  }
  bool first = true;
  for (int r : v.stalled_ranks) {
    const RankProgress& p = ranks_[r];
    if (p.phase != v.phase) continue;
    const TimePoint since = InOtherPhase(p)           ? p.phase_since
                            : p.last_step.has_value() ? Progress(p)
                                                      : generation_start_;
    if (first || since < v.stalled_since) {
      v.stalled_since = since;
      v.timeout = DeadlineOf(p, waiting) - since;
    }
    first = false;
  }
  if (v.stalled_ranks.empty()) return std::nullopt;
  reported_ = true;

  std::optional<StepNumber> highest;
  std::vector<int> never_stepped;
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    const RankProgress& p = ranks_[r];
    if (!p.last_step.has_value()) {
      never_stepped.push_back(r);
      continue;
    }
    if (!highest.has_value() || *p.last_step > *highest) highest = p.last_step;
    if (!v.lowest_step.has_value() || *p.last_step < *v.lowest_step) {
      v.lowest_step = p.last_step;
      v.behind_ranks.clear();
    }
    if (*p.last_step == *v.lowest_step) v.behind_ranks.push_back(r);
  }

  std::ostringstream reason;
  if (v.phase != kTrainPhase) {
    // Stalled inside a phase of its own (an evaluation, a checkpoint).
    std::vector<int> in_phase;
    for (int r : v.stalled_ranks) {
      if (ranks_[r].phase == v.phase) in_phase.push_back(r);
    }
    v.behind_ranks = in_phase;
    reason << "no progress from " << FormatRanks(in_phase) << " in phase '" << v.phase << "' for "
           << FormatDuration(now - v.stalled_since) << " (phase timeout "
           << FormatDuration(PhaseTimeout(v.phase));
    auto it = phases_.find(v.phase);
    if (it == phases_.end() || it->second.samples.empty()) {
      reason << ", the first time the phase is seen";
    } else {
      reason << " = max(floor " << FormatDuration(options_.floor) << ", " << options_.k
             << " x p99 of its " << it->second.samples.size() << " earlier duration(s))";
    }
    reason << ")";
    if (v.lowest_step) reason << " at step " << v.lowest_step->value;
  } else if (!never_stepped.empty()) {
    v.lowest_step.reset();
    v.behind_ranks = never_stepped;
    reason << "no first step from " << FormatRanks(never_stepped) << " within " << DescribeTimeout()
           << " of generation " << generation_ << " (started "
           << FormatDuration(now - generation_start_) << " ago)";
    if (highest.has_value()) reason << "; other ranks reached step " << highest->value;
  } else {
    reason << "no step progress from " << FormatRanks(v.stalled_ranks) << " for "
           << FormatDuration(now - v.stalled_since) << " (timeout ";
    if (v.timeout == StepTimeout()) {
      reason << DescribeTimeout();
    } else {
      reason << FormatDuration(v.timeout) << " = " << options_.k << " x the rank's own last step";
    }
    reason << "); behind: " << FormatRanks(v.behind_ranks) << " at step " << v.lowest_step->value;
    if (*highest != *v.lowest_step) reason << " (highest step " << highest->value << ")";
  }
  v.reason = reason.str();
  return v;
}

std::optional<TimePoint> HangDetector::EarliestTrainDeadline() const {
  if (train_by_base_.empty()) return std::nullopt;
  if (InStartup()) return generation_start_ + options_.startup_timeout;
  const Duration timeout = StepTimeout();
  ENDURE_CHECK(timeout == grouped_at_);  // Regroup follows every change of it
  std::optional<TimePoint> best;
  if (!within_by_base_.empty()) best = within_by_base_.begin()->first + timeout;
  if (!beyond_by_own_.empty() && (!best || beyond_by_own_.begin()->first < *best)) {
    best = beyond_by_own_.begin()->first;
  }
  return *best + shift_;
}

// The same as the earliest DeadlineOf over the watched ranks, by parts: the
// ranks in "train" wait for the latest phase deadline; a rank in a phase of
// its own has that phase's (the earliest entry of each phase), and in
// start-up no deadline before start-up's.
std::optional<TimePoint> HangDetector::NextDeadline() const {
  if (!active_ || reported_) return std::nullopt;
  const std::optional<TimePoint> waiting = LatestPhaseDeadline();
  std::optional<TimePoint> earliest = EarliestTrainDeadline();
  if (earliest && waiting) earliest = std::max(*earliest, *waiting);
  for (const auto& [phase, since] : in_phase_) {
    TimePoint d = *since.begin() + PhaseTimeout(phase);
    if (InStartup()) d = std::max(d, generation_start_ + options_.startup_timeout);
    if (!earliest || d < *earliest) earliest = d;
  }
  return earliest;
}

}  // namespace endure::core
