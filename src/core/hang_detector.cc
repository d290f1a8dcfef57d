// Hang detection over per-rank step progress; see hang_detector.h.
#include "core/hang_detector.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace endure::core {
namespace {

// "rank 3", "ranks 0-3, 7".
std::string FormatRankList(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out << ", ";
    out << ranks[i];
    if (j > i) out << "-" << ranks[j];
    i = j + 1;
  }
  return out.str();
}

}  // namespace

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
  return Status::Ok();
}

HangDetector::HangDetector(HangDetectorOptions options) : options_(options) {
  ENDURE_CHECK(options_.Validate().ok());
  samples_.reserve(options_.window);
}

void HangDetector::OnGenerationStart(int generation, int world_size, TimePoint now) {
  ENDURE_CHECK(world_size >= 1);
  active_ = true;
  generation_ = generation;
  generation_start_ = now;
  ranks_.assign(world_size, RankProgress{});
  ranks_done_startup_ = 0;
  reported_ = false;
  frontier_step_ = StepNumber{0};
  frontier_time_ = now;
}

Status HangDetector::OnStepEnd(int rank, StepNumber step, TimePoint now) {
  if (!active_) return InvalidArgument("hang detector: step report before any generation started");
  if (rank < 0 || rank >= static_cast<int>(ranks_.size())) {
    return InvalidArgument("hang detector: rank " + std::to_string(rank) +
                           " is outside generation " + std::to_string(generation_) +
                           " of world size " + std::to_string(ranks_.size()));
  }
  RankProgress& p = ranks_[rank];
  if (p.last_step.has_value() && step <= *p.last_step) return Status::Ok();

  if (p.last_step.has_value()) {
    // The first step of a generation includes start-up, so it is no sample.
    p.last_duration = (now - p.last_progress) / (step.value - p.last_step->value);
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
  p.last_progress = now;
  reported_ = false;

  if (!InStartup() && step > frontier_step_) {
    RecordStepDuration((now - frontier_time_) / (step.value - frontier_step_.value));
    frontier_step_ = step;
    frontier_time_ = now;
  }
  return Status::Ok();
}

void HangDetector::Resume(TimePoint now) {
  if (!active_) return;
  if (InStartup()) generation_start_ = std::max(generation_start_, now);
  for (RankProgress& p : ranks_) p.last_progress = std::max(p.last_progress, now);
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
}

std::optional<Duration> HangDetector::P99StepDuration() const {
  if (samples_.empty()) return std::nullopt;
  return cached_p99_;
}

Duration HangDetector::StepTimeout() const {
  if (total_samples_ < options_.min_samples) return options_.startup_timeout;
  return std::max(options_.floor, std::chrono::duration_cast<Duration>(cached_p99_ * options_.k));
}

TimePoint HangDetector::DeadlineOf(const RankProgress& p) const {
  if (InStartup()) return generation_start_ + options_.startup_timeout;
  Duration timeout = StepTimeout();
  if (p.last_duration.has_value()) {
    timeout =
        std::max(timeout, std::chrono::duration_cast<Duration>(*p.last_duration * options_.k));
  }
  return p.last_progress + timeout;
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
  if (!active_ || reported_) return std::nullopt;

  HangVerdict v;
  v.generation = generation_;
  v.during_startup = InStartup();
  bool first = true;
  for (int r = 0; r < static_cast<int>(ranks_.size()); ++r) {
    const RankProgress& p = ranks_[r];
    const TimePoint deadline = DeadlineOf(p);
    if (deadline > now) continue;
    v.stalled_ranks.push_back(r);
    const TimePoint since = p.last_step.has_value() ? p.last_progress : generation_start_;
    if (first || since < v.stalled_since) {
      v.stalled_since = since;
      v.timeout = deadline - since;
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
  if (!never_stepped.empty()) {
    v.lowest_step.reset();
    v.behind_ranks = never_stepped;
    reason << "no first step from " << FormatRankList(never_stepped) << " within "
           << DescribeTimeout() << " of generation " << generation_ << " (started "
           << FormatDuration(now - generation_start_) << " ago)";
    if (highest.has_value()) reason << "; other ranks reached step " << highest->value;
  } else {
    reason << "no step progress from " << FormatRankList(v.stalled_ranks) << " for "
           << FormatDuration(now - v.stalled_since) << " (timeout ";
    if (v.timeout == StepTimeout()) {
      reason << DescribeTimeout();
    } else {
      reason << FormatDuration(v.timeout) << " = " << options_.k << " x the rank's own last step";
    }
    reason << "); behind: " << FormatRankList(v.behind_ranks) << " at step "
           << v.lowest_step->value;
    if (*highest != *v.lowest_step) reason << " (highest step " << highest->value << ")";
  }
  v.reason = reason.str();
  return v;
}

std::optional<TimePoint> HangDetector::NextDeadline() const {
  if (!active_ || reported_) return std::nullopt;
  std::optional<TimePoint> earliest;
  for (const RankProgress& p : ranks_) {
    const TimePoint d = DeadlineOf(p);
    if (!earliest.has_value() || d < *earliest) earliest = d;
  }
  return earliest;
}

}  // namespace endure::core
