// Strike classes and the multi-strike quarantine rule; see node_health.h.
#include "core/node_health.h"

#include <algorithm>
#include <map>
#include <utility>

namespace endure::core {
namespace {

// A compact window: "24h", "7d", "30m", "90s".
std::string FormatWindow(Duration d) {
  using std::chrono::hours;
  using std::chrono::minutes;
  using std::chrono::seconds;
  if (d % hours(24) == Duration::zero() && d > hours(48)) {
    return std::to_string(d / hours(24)) + "d";
  }
  if (d % hours(1) == Duration::zero()) return std::to_string(d / hours(1)) + "h";
  if (d % minutes(1) == Duration::zero()) return std::to_string(d / minutes(1)) + "m";
  if (d % seconds(1) == Duration::zero()) return std::to_string(d / seconds(1)) + "s";
  return FormatDuration(d);
}

// "straggler x2, hang_suspect": most frequent first, then by name.
std::string SummarizeCauses(const std::vector<const Strike*>& strikes) {
  std::map<std::string, int> counts;
  for (const Strike* s : strikes) ++counts[s->cause];
  std::vector<std::pair<std::string, int>> sorted(counts.begin(), counts.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out;
  for (const auto& [cause, n] : sorted) {
    out += (out.empty() ? "" : ", ") + cause + (n > 1 ? " x" + std::to_string(n) : "");
  }
  return out;
}

std::string Plural(size_t n, const std::string& what) {
  return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
}

}  // namespace

std::string_view StrikeClassName(StrikeClass cls) {
  switch (cls) {
    case StrikeClass::kHard:
      return "hard";
    case StrikeClass::kSoft:
      return "soft";
  }
  return "?";
}

Result<StrikeClass> ParseStrikeClass(std::string_view name) {
  for (StrikeClass c : {StrikeClass::kHard, StrikeClass::kSoft}) {
    if (name == StrikeClassName(c)) return c;
  }
  return InvalidArgument("unknown strike class '" + std::string(name) +
                         "' (expected hard or soft)");
}

Strike StrikeFor(std::string cause, int64_t unix_ms, std::string detail) {
  const StrikeClass cls = StrikeClassOf(cause);
  return Strike{std::move(cause), unix_ms, cls, std::move(detail)};
}

Status NodeHealthOptions::Validate() const {
  if (soft_strikes < 1 || soft_strikes > 1000) {
    return InvalidArgument("soft_strikes must be in [1, 1000], got " +
                           std::to_string(soft_strikes));
  }
  if (soft_window <= Duration::zero()) {
    return InvalidArgument("soft_window must be positive, got " + FormatDuration(soft_window));
  }
  return Status::Ok();
}

std::string_view HealthStateName(HealthState state) {
  switch (state) {
    case HealthState::kHealthy:
      return "healthy";
    case HealthState::kSuspect:
      return "suspect";
    case HealthState::kQuarantined:
      return "quarantined";
  }
  return "?";
}

Result<HealthState> ParseHealthState(std::string_view name) {
  for (HealthState s : {HealthState::kHealthy, HealthState::kSuspect, HealthState::kQuarantined}) {
    if (name == HealthStateName(s)) return s;
  }
  return InvalidArgument("unknown node state '" + std::string(name) +
                         "' (expected healthy, suspect or quarantined)");
}

NodeVerdict JudgeNode(const std::vector<Strike>& strikes, int64_t now_unix_ms,
                      const NodeHealthOptions& options) {
  ENDURE_CHECK(options.Validate().ok());
  std::vector<const Strike*> sorted;
  for (const Strike& s : strikes) sorted.push_back(&s);
  // Oldest first: the reason lists hard strikes in the order they happened.
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const Strike* a, const Strike* b) { return a->unix_ms < b->unix_ms; });

  std::vector<const Strike*> hard, recent_soft;
  size_t old_soft = 0;
  const int64_t window_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(options.soft_window).count();
  for (const Strike* s : sorted) {
    if (s->cls == StrikeClass::kHard) {
      hard.push_back(s);
    } else if (now_unix_ms - s->unix_ms <= window_ms) {
      recent_soft.push_back(s);
    } else {
      ++old_soft;
    }
  }

  NodeVerdict v;
  const std::string window = FormatWindow(options.soft_window);
  if (!hard.empty()) {
    v.state = HealthState::kQuarantined;
    v.reason = hard.size() == 1 ? "hard strike: " : Plural(hard.size(), "hard strike") + ": ";
    for (size_t i = 0; i < hard.size(); ++i) {
      v.reason += (i > 0 ? ", " : "") + hard[i]->cause +
                  (hard[i]->detail.empty() ? "" : " (" + hard[i]->detail + ")");
    }
    return v;
  }
  if (!recent_soft.empty()) {
    const bool enough = static_cast<int>(recent_soft.size()) >= options.soft_strikes;
    v.state = enough ? HealthState::kQuarantined : HealthState::kSuspect;
    v.reason = Plural(recent_soft.size(), "soft strike") + " within " + window +
               (enough ? "" : " (quarantined at " + std::to_string(options.soft_strikes) + ")") +
               ": " + SummarizeCauses(recent_soft);
    return v;
  }
  v.state = HealthState::kHealthy;
  v.reason =
      old_soft == 0 ? "no strikes" : Plural(old_soft, "soft strike") + ", none within " + window;
  return v;
}

}  // namespace endure::core
