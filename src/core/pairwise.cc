// The two-round pairwise test; see pairwise.h.
#include "core/pairwise.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

namespace endure::core {
namespace {

std::string Number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// "node0" where the caller named it, else "node 2".
std::string NodeName(NodeId node, const std::map<NodeId, std::string>& names) {
  auto it = names.find(node);
  return it != names.end() ? it->second : "node " + std::to_string(node.value);
}

std::string Secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3fs", s);
  return buf;
}

std::string Nodes(const std::vector<NodeId>& nodes, const std::map<NodeId, std::string>& names) {
  std::string out;
  for (NodeId n : nodes) out += (out.empty() ? "" : ", ") + NodeName(n, names);
  return out;
}

// The median of `times`, the lower middle one of an even count: with two
// pairs, the faster is the reference the slower is measured against.
double LowerMedian(std::vector<double> times) {
  if (times.empty()) return 0;
  const size_t mid = (times.size() - 1) / 2;
  std::nth_element(times.begin(), times.begin() + mid, times.end());
  return times[mid];
}

// "node 2 + node 3 failed after 0.012s (Connection reset by peer)", "... slow:
// 0.900s (9.0x 0.100s)", "... passed in 0.101s".
std::string Describe(NodeId a, NodeId b, bool ok, bool slow, double seconds,
                     const std::string& error, double reference,
                     const std::map<NodeId, std::string>& names) {
  std::string s = NodeName(a, names) + " + " + NodeName(b, names);
  if (!ok) {
    s += " failed";
    if (seconds > 0) s += " after " + Secs(seconds);
    if (!error.empty()) s += " (" + error + ")";
  } else if (slow) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1fx", seconds / reference);
    s += " slow: " + Secs(seconds) + " (" + buf + " " + Secs(reference) + ")";
  } else {
    s += " passed in " + Secs(seconds);
  }
  return s;
}

}  // namespace

Status PairwiseOptions::Validate() const {
  if (!std::isfinite(slow_factor) || !(slow_factor > 1.0) || slow_factor > 1000.0) {
    return InvalidArgument("slow_factor must be in (1, 1000], got " + Number(slow_factor));
  }
  if (!std::isfinite(min_slow_s) || !(min_slow_s >= 0.0)) {
    return InvalidArgument("min_slow_s must be >= 0, got " + Number(min_slow_s));
  }
  return Status::Ok();
}

PairwiseTest::PairwiseTest(std::vector<NodeId> nodes, PairwiseOptions options,
                           std::map<NodeId, std::string> names)
    : nodes_(std::move(nodes)), options_(options), names_(std::move(names)) {
  ENDURE_CHECK(nodes_.size() >= 2);
  ENDURE_CHECK(options_.Validate().ok());
  ENDURE_CHECK(std::set<NodeId>(nodes_.begin(), nodes_.end()).size() == nodes_.size());
  pairs_ = FirstRound();
}

PairwiseTest::Pairs PairwiseTest::FirstRound() const {
  Pairs pairs;
  for (size_t i = 0; i + 1 < nodes_.size(); i += 2) pairs.emplace_back(nodes_[i], nodes_[i + 1]);
  if (nodes_.size() % 2 == 1) pairs.emplace_back(nodes_.back(), nodes_.front());
  return pairs;
}

int PairwiseTest::IndexOf(NodeId node) const {
  return static_cast<int>(std::find(nodes_.begin(), nodes_.end(), node) - nodes_.begin());
}

std::vector<PairwiseTest::Outcome> PairwiseTest::Collect(
    const std::vector<PairResult>& results) const {
  std::vector<Outcome> out;
  for (const auto& [a, b] : pairs_) {
    Outcome o{a, b, false, false, 0, "no result"};
    for (const PairResult& r : results) {
      if ((r.a == a && r.b == b) || (r.a == b && r.b == a)) {
        o.ok = r.ok;
        o.seconds = r.seconds;
        o.error = r.ok ? "" : r.error;
        break;
      }
    }
    out.push_back(std::move(o));
  }
  return out;
}

std::variant<PairwiseTest::Pairs, PairwiseVerdict> PairwiseTest::OnResults(
    const std::vector<PairResult>& results) {
  if (done_) return verdict_;
  std::vector<Outcome> outcomes = Collect(results);
  if (round_ == 1) return FinishRound1(std::move(outcomes));
  return FinishRound2(std::move(outcomes));
}

PairwiseVerdict PairwiseTest::Done(PairwiseVerdict verdict) {
  done_ = true;
  verdict.suspects = suspects_;
  verdict_ = std::move(verdict);
  return verdict_;
}

std::variant<PairwiseTest::Pairs, PairwiseVerdict> PairwiseTest::FinishRound1(
    std::vector<Outcome> outcomes) {
  std::vector<double> passed;
  for (const Outcome& o : outcomes) {
    if (o.ok) passed.push_back(o.seconds);
  }
  const double median = LowerMedian(passed);
  std::vector<bool> suspect(nodes_.size(), false), healthy(nodes_.size(), false);
  std::vector<double> healthy_times;
  std::string findings;
  double slowest = 0;
  for (Outcome& o : outcomes) {
    o.slow = o.ok && o.seconds > options_.slow_factor * median && o.seconds > options_.min_slow_s;
    if (o.ok && !o.slow) {
      healthy[IndexOf(o.a)] = healthy[IndexOf(o.b)] = true;
      healthy_times.push_back(o.seconds);
      slowest = std::max(slowest, o.seconds);
      continue;
    }
    suspect[IndexOf(o.a)] = suspect[IndexOf(o.b)] = true;
    findings += (findings.empty() ? "" : "; ") +
                Describe(o.a, o.b, o.ok, o.slow, o.seconds, o.error, median, names_);
  }
  std::vector<NodeId> partners;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (suspect[i]) suspects_.push_back(nodes_[i]);
    // A node that passed with one partner and failed with another (the
    // first node of an odd count) is re-tested, not a partner.
    if (healthy[i] && !suspect[i]) partners.push_back(nodes_[i]);
  }
  round1_reason_ = passed.empty() ? "round 1: " : "round 1 (median " + Secs(median) + "): ";
  if (suspects_.empty()) {
    PairwiseVerdict v;
    v.resolved = true;
    v.reason = round1_reason_ + "all " + std::to_string(outcomes.size()) +
               (outcomes.size() == 1 ? " pair" : " pairs") + " passed (slowest " + Secs(slowest) +
               "): no node is faulty";
    return Done(std::move(v));
  }
  round1_reason_ += findings;
  if (partners.empty()) {
    PairwiseVerdict v;
    v.reason = round1_reason_ + "; no pair passed, so there is no healthy node to re-pair " +
               Nodes(suspects_, names_) + " with: unresolved";
    return Done(std::move(v));
  }
  reference_s_ = LowerMedian(healthy_times);
  pairs_.clear();
  for (size_t i = 0; i < suspects_.size(); ++i) {
    pairs_.emplace_back(suspects_[i], partners[i % partners.size()]);
  }
  round_ = 2;
  return pairs_;
}

PairwiseVerdict PairwiseTest::FinishRound2(std::vector<Outcome> outcomes) {
  PairwiseVerdict v;
  std::string findings;
  for (Outcome& o : outcomes) {
    // The suspect is the pair's first node (see FinishRound1).
    o.slow =
        o.ok && o.seconds > options_.slow_factor * reference_s_ && o.seconds > options_.min_slow_s;
    if (!o.ok) v.faulty.push_back(o.a);
    if (o.slow) v.slow.push_back(o.a);
    findings += (findings.empty() ? "" : "; ") +
                Describe(o.a, o.b, o.ok, o.slow, o.seconds, o.error, reference_s_, names_);
  }
  v.reason = round1_reason_ + "; round 2 (reference " + Secs(reference_s_) + "): " + findings;
  v.resolved = !v.faulty.empty() || !v.slow.empty();
  if (!v.resolved) {
    v.reason +=
        ": round 1's failures did not recur with healthy partners (a transient, or the "
        "link between the pair): unresolved among " +
        Nodes(suspects_, names_);
  } else {
    if (!v.faulty.empty()) {
      v.reason +=
          ": " + Nodes(v.faulty, names_) + (v.faulty.size() == 1 ? " is" : " are") + " faulty";
    }
    if (!v.slow.empty()) {
      v.reason += (v.faulty.empty() ? ": " : ", ") + Nodes(v.slow, names_) +
                  (v.slow.size() == 1 ? " is" : " are") + " slow";
    }
  }
  return Done(std::move(v));
}

}  // namespace endure::core
