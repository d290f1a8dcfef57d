// Straggler detection and the keep-or-move decision; see straggler.h.
#include "core/straggler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace endure::core {
namespace {

double MedianOfSorted(const std::vector<double>& sorted) {
  ENDURE_CHECK(!sorted.empty());
  const size_t n = sorted.size();
  return n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
}

double MedianOf(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return MedianOfSorted(values);
}

// The median of `sorted` without its element at `skip`: the median of one
// rank's peers, in O(1) once the step's times are sorted. Which of several
// equal values is skipped does not change the result.
double MedianWithout(const std::vector<double>& sorted, size_t skip) {
  const size_t m = sorted.size() - 1;
  auto at = [&](size_t j) { return sorted[j < skip ? j : j + 1]; };
  return m % 2 == 1 ? at(m / 2) : (at(m / 2 - 1) + at(m / 2)) / 2;
}

std::string Ratio(double r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2fx", r);
  return buf;
}

// "0.1", "0", "nan": options as the user wrote them.
std::string Number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

std::string Secs(double s) { return FormatDuration(FromSeconds(s)); }

}  // namespace

Status StragglerOptions::Validate() const {
  if (!(theta > 0 && theta <= 10)) {
    return InvalidArgument("straggler detector: theta must be in (0, 10], got " + Number(theta));
  }
  if (window < 1 || window > 10000) {
    return InvalidArgument("straggler detector: window must be in [1, 10000] steps, got " +
                           std::to_string(window));
  }
  if (min_slow < 1 || min_slow > window) {
    return InvalidArgument("straggler detector: min_slow must be in [1, window=" +
                           std::to_string(window) + "], got " + std::to_string(min_slow));
  }
  if (!(min_compute_s >= 0) || !std::isfinite(min_compute_s)) {
    return InvalidArgument("straggler detector: min_compute_s must be a number >= 0, got " +
                           Number(min_compute_s));
  }
  if (!(min_excess_s >= 0) || !std::isfinite(min_excess_s)) {
    return InvalidArgument("straggler detector: min_excess_s must be a number >= 0, got " +
                           Number(min_excess_s));
  }
  return Status::Ok();
}

StragglerDetector::StragglerDetector(StragglerOptions options) : options_(options) {
  ENDURE_CHECK(options_.Validate().ok());
}

void StragglerDetector::OnGenerationStart(int world_size) {
  ENDURE_CHECK(world_size >= 1);
  ranks_.assign(world_size, RankState{});
  pending_.clear();
  newest_reported_.reset();
}

std::vector<double> StragglerDetector::RecentComputeByRank() const {
  std::vector<double> out(ranks_.size(), std::numeric_limits<double>::quiet_NaN());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const std::deque<Judged>& window = ranks_[r].window;
    if (window.empty()) continue;
    double sum = 0;
    for (const Judged& j : window) sum += j.rank_s;
    out[r] = sum / double(window.size());
  }
  return out;
}

std::vector<StragglerFlag> StragglerDetector::OnStepCompute(Rank rank, StepNumber step,
                                                            double compute_s) {
  if (!options_.enabled) return {};
  if (rank.value < 0 || rank.value >= static_cast<int>(ranks_.size())) return {};
  if (!(compute_s >= 0) || !std::isfinite(compute_s)) return {};
  RankState& state = ranks_[rank.value];
  if (state.last_reported.has_value() && step <= *state.last_reported) return {};
  state.last_reported = step;

  if (!newest_reported_.has_value() || step > *newest_reported_) {
    newest_reported_ = step;
    // Steps this far behind will not be completed by a live rank of a
    // synchronous job: some report was lost. Dropping them bounds memory.
    const StepNumber oldest_kept{newest_reported_->value - PendingBound()};
    pending_.erase(pending_.begin(), pending_.lower_bound(oldest_kept));
  }
  if (step.value < newest_reported_->value - PendingBound()) return {};

  auto [it, inserted] = pending_.try_emplace(step);
  PendingStep& p = it->second;
  if (inserted) p.compute_s.assign(ranks_.size(), 0.0);
  p.compute_s[rank.value] = compute_s;
  if (++p.reported < static_cast<int>(ranks_.size())) return {};

  std::vector<double> times = std::move(p.compute_s);
  pending_.erase(it);
  return Judge(step, times);
}

std::vector<StragglerFlag> StragglerDetector::Judge(StepNumber step,
                                                    const std::vector<double>& compute_s) {
  // With one rank there are no peers to compare with.
  if (compute_s.size() < 2) return {};
  std::vector<double> sorted = compute_s;
  std::sort(sorted.begin(), sorted.end());
  const double median = MedianOfSorted(sorted);
  if (median < options_.min_compute_s || median <= 0) return {};

  // What the peers do at their worst one step in ten, from the steps before
  // this one.
  const std::vector<double> noise = PeerNoise();
  std::vector<StragglerFlag> flags;
  for (size_t r = 0; r < compute_s.size(); ++r) {
    const size_t pos =
        std::lower_bound(sorted.begin(), sorted.end(), compute_s[r]) - sorted.begin();
    const double peers = MedianWithout(sorted, pos);
    // Only possible with two ranks, one of which reported zero: no reference.
    if (peers <= 0) continue;

    RankState& state = ranks_[r];
    const double threshold = std::max(1 + options_.theta, noise[r]);
    const bool slow =
        compute_s[r] > threshold * peers && compute_s[r] - peers > options_.min_excess_s;
    const Judged judged{slow, compute_s[r], peers, threshold};
    state.window.push_back(judged);
    state.slow_in_window += judged.slow;
    if (static_cast<int>(state.window.size()) > options_.window) {
      state.slow_in_window -= state.window.front().slow;
      state.window.pop_front();
    }
    if (!state.flagged && state.slow_in_window >= options_.min_slow) {
      state.flagged = true;
      flags.push_back(MakeFlag(Rank{static_cast<int32_t>(r)}, step, state));
    }
  }
  return flags;
}

std::vector<double> StragglerDetector::PeerNoise() const {
  const size_t world = ranks_.size();
  auto p90 = [](std::vector<double>& v) {
    if (v.empty()) return 0.0;
    const size_t k = static_cast<size_t>(0.9 * static_cast<double>(v.size() - 1) + 0.5);
    std::nth_element(v.begin(), v.begin() + k, v.end());
    return v[k];
  };
  auto ratios_of = [&](size_t r, std::vector<double>& out) {
    for (const Judged& j : ranks_[r].window) out.push_back(j.rank_s / j.peers_s);
  };
  // Leave-one-out in small worlds, where a straggler is a large share of
  // the pool (with two ranks, all of the other's ratios are the inverse of
  // its own); in large ones its share is too small to move the percentile,
  // and one pooled figure serves every rank.
  constexpr size_t kLeaveOneOutUpTo = 16;
  if (world > kLeaveOneOutUpTo) {
    std::vector<double> pool;
    for (size_t r = 0; r < world; ++r) ratios_of(r, pool);
    return std::vector<double>(world, p90(pool));
  }
  std::vector<double> out(world, 0.0);
  for (size_t r = 0; r < world; ++r) {
    std::vector<double> pool;
    for (size_t q = 0; q < world; ++q) {
      if (q != r) ratios_of(q, pool);
    }
    out[r] = p90(pool);
  }
  return out;
}

StragglerFlag StragglerDetector::MakeFlag(Rank rank, StepNumber step,
                                          const RankState& state) const {
  std::vector<double> ratios, rank_s, peers_s, thresholds;
  for (const Judged& j : state.window) {
    thresholds.push_back(j.threshold);
    ratios.push_back(j.rank_s / j.peers_s);
    rank_s.push_back(j.rank_s);
    peers_s.push_back(j.peers_s);
  }
  StragglerFlag flag;
  flag.rank = rank;
  flag.step = step;
  flag.slow_steps = state.slow_in_window;
  flag.window = static_cast<int>(state.window.size());
  flag.slowdown = MedianOf(std::move(ratios));
  flag.rank_compute_s = MedianOf(std::move(rank_s));
  flag.peers_compute_s = MedianOf(std::move(peers_s));
  flag.reason = "rank " + std::to_string(rank.value) + " computed " + Ratio(flag.slowdown) +
                " the peers' median (" + Secs(flag.rank_compute_s) + " vs " +
                Secs(flag.peers_compute_s) + "); slower than " + Ratio(1 + options_.theta) +
                " of it in " + std::to_string(flag.slow_steps) + " of the last " +
                std::to_string(flag.window) + " steps";
  // Where the peers' own jitter set the bar higher than theta, say so.
  const double bar = MedianOf(std::move(thresholds));
  if (bar > 1 + options_.theta + 1e-9) {
    flag.reason += " (and than " + Ratio(bar) + ", what the peers reach one step in ten)";
  }
  return flag;
}

std::string_view StragglerMoveName(StragglerMove move) {
  switch (move) {
    case StragglerMove::kKeep:
      return "keep";
    case StragglerMove::kSwapSpare:
      return "swap_spare";
    case StragglerMove::kEvictAndWait:
      return "evict_and_wait";
  }
  return "keep";
}

StragglerDecision DecideStraggler(const StragglerCosts& costs) {
  auto nonneg = [](Duration d) { return std::max(d, Duration::zero()); };
  // NaN fails the comparison too. An infinite slowdown (a rank that no
  // longer finishes its steps) makes all of the remaining time the cost.
  const double slowdown = costs.slowdown > 1 ? costs.slowdown : 1.0;
  const Duration remaining = nonneg(costs.remaining);
  const Duration restart = nonneg(costs.restart_cost);
  const Duration lost = nonneg(costs.lost_work);
  const Duration wait = nonneg(costs.replacement_wait);
  const bool spare = costs.spares > 0;

  StragglerDecision d;
  // At `slowdown`, the remaining time is that many times what it would be
  // without the straggler: removing it saves the difference.
  d.keep_cost = std::chrono::duration_cast<Duration>(remaining * (1 - 1 / slowdown));
  d.move_cost = restart + lost + (spare ? Duration::zero() : wait);
  if (d.keep_cost > d.move_cost) {
    d.move = spare ? StragglerMove::kSwapSpare : StragglerMove::kEvictAndWait;
  }

  std::string reason = "keeping it costs " + FormatDuration(d.keep_cost) + " of the remaining " +
                       FormatDuration(remaining) + " (" + Ratio(slowdown) + "); ";
  reason += spare ? "a swap costs " : "with no spare, evicting it costs ";
  reason += FormatDuration(d.move_cost) + " (restart " + FormatDuration(restart) + " + lost work " +
            FormatDuration(lost);
  if (!spare) reason += " + waiting " + FormatDuration(wait) + " for a replacement";
  reason += "): ";
  switch (d.move) {
    case StragglerMove::kSwapSpare:
      reason += "swap in a spare";
      break;
    case StragglerMove::kEvictAndWait:
      reason += "evict it and wait for a replacement";
      break;
    case StragglerMove::kKeep:
      reason += "keep it running and report it";
      break;
  }
  d.reason = std::move(reason);
  return d;
}

}  // namespace endure::core
