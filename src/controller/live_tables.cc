// The live view of a job; see live_tables.h.
#include "controller/live_tables.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>

namespace endure::controller {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

nlohmann::json OrNull(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

double Median(std::vector<double> values) {
  if (values.empty()) return kNaN;
  const auto mid = values.begin() + values.size() / 2;
  std::nth_element(values.begin(), mid, values.end());
  return *mid;
}

}  // namespace

std::string_view NodeStateName(NodeState state) {
  switch (state) {
    case NodeState::kMember:
      return "member";
    case NodeState::kSpare:
      return "spare";
    case NodeState::kDown:
      return "down";
    case NodeState::kRefused:
      return "refused";
  }
  return "down";
}

LiveTables BuildLiveTables(const core::JobMachine& machine, core::TimePoint start,
                           const LiveInputs& inputs) {
  LiveTables t;
  const core::StragglerDetector& detector = machine.straggler_detector();
  const std::vector<double> by_rank = detector.RecentComputeByRank();
  const int per_node = machine.ranks_per_node();
  std::vector<double> reported;  // every rank's that has one, for the median
  reported.reserve(by_rank.size());
  for (double v : by_rank) {
    if (std::isfinite(v)) reported.push_back(v);
  }
  t.median_step_s = Median(reported);

  for (const core::JobMachine::NodeView& v : machine.NodeViews()) {
    NodeRow row;
    row.node = v.node;
    row.name = v.name;
    row.state = !v.refused.empty() ? NodeState::kRefused
                : !v.up            ? NodeState::kDown
                : v.first          ? NodeState::kMember
                                   : NodeState::kSpare;
    row.why = v.refused;
    if (auto it = inputs.strikes.find(v.name); it != inputs.strikes.end()) row.strikes = it->second;
    if (auto it = inputs.tiers.find(v.name); it != inputs.tiers.end()) row.tiers = it->second;
    row.step_s = row.slowest_s = kNaN;
    if (row.state == NodeState::kMember) {
      row.first_rank = v.first->value;
      double sum = 0;
      int n = 0;
      for (int r = row.first_rank; r < row.first_rank + per_node && r < int(by_rank.size()); ++r) {
        if (!std::isfinite(by_rank[r])) continue;
        sum += by_rank[r];
        ++n;
        if (!(by_rank[r] <= row.slowest_s)) {
          row.slowest_s = by_rank[r];
          row.slowest_rank = r;
        }
      }
      if (n > 0) row.step_s = sum / n;
    }
    ++t.nodes_by_state[static_cast<int>(row.state)];

    nlohmann::json j = {{"node", row.node.value},
                        {"name", row.name},
                        {"state", std::string(NodeStateName(row.state))},
                        {"strikes", row.strikes},
                        {"t0_bytes", row.tiers.t0_bytes},
                        {"t1_bytes", row.tiers.t1_bytes},
                        {"t0_step", row.tiers.t0_step},
                        {"t1_step", row.tiers.t1_step},
                        {"persisted_step", row.tiers.persisted_step}};
    if (row.state == NodeState::kMember) {
      j["first_rank"] = row.first_rank;
      j["step_s"] = OrNull(row.step_s);
      j["slowest_rank"] = row.slowest_rank;
      j["slowest_s"] = OrNull(row.slowest_s);
    }
    if (row.state == NodeState::kRefused) j["why"] = row.why;
    t.nodes.push_back(std::move(j));
    t.node_rows.push_back(std::move(row));
  }

  // The slowest ranks now, slowest first.
  std::vector<int> ranks;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    if (std::isfinite(by_rank[r])) ranks.push_back(static_cast<int>(r));
  }
  const size_t shown = std::min(kOutliers, ranks.size());
  std::partial_sort(ranks.begin(), ranks.begin() + shown, ranks.end(),
                    [&](int a, int b) { return by_rank[a] > by_rank[b]; });
  for (size_t i = 0; i < shown; ++i) {
    const core::Rank rank{ranks[i]};
    t.outliers.push_back(
        {{"rank", rank.value},
         {"node", machine.NodeName(machine.NodeOfRank(rank))},
         {"step_s", by_rank[rank.value]},
         {"vs_median", OrNull(t.median_step_s > 0 ? by_rank[rank.value] / t.median_step_s : kNaN)},
         {"flagged", detector.flagged(rank)}});
  }

  const std::vector<core::Incident>& incidents = machine.incidents();
  for (auto it = incidents.rbegin(); it != incidents.rend(); ++it) {
    nlohmann::json j = IncidentJson(*it, start);
    if (auto kb = inputs.recurrences.find(it->id); kb != inputs.recurrences.end()) {
      j["recurrence"] = kb->second;
    }
    t.incidents.push_back(std::move(j));
  }
  return t;
}

void StepHeat::Add(double t_s, const LiveTables& tables) {
  std::vector<const NodeRow*> members;
  for (const NodeRow& row : tables.node_rows) {
    if (row.state == NodeState::kMember) members.push_back(&row);
  }
  std::sort(members.begin(), members.end(),
            [](const NodeRow* a, const NodeRow* b) { return a->first_rank < b->first_rank; });
  const size_t bands = std::min(kMaxBands, members.size());
  Sample sample{t_s, std::vector<double>(bands, kNaN), tables.median_step_s};
  bands_ = nlohmann::json::array();
  for (size_t b = 0; b < bands; ++b) {
    // Band b holds members [b * n / bands, (b + 1) * n / bands): sizes differ by one at most.
    const size_t from = b * members.size() / bands, to = (b + 1) * members.size() / bands;
    for (size_t i = from; i < to; ++i) {
      const double v = members[i]->step_s;
      if (std::isfinite(v) && !(v <= sample.band_max_s[b])) sample.band_max_s[b] = v;
    }
    bands_.push_back({{"from", members[from]->name},
                      {"to", members[to - 1]->name},
                      {"nodes", to - from},
                      {"first_rank", members[from]->first_rank}});
  }
  samples_.push_back(std::move(sample));
  while (samples_.size() > kMaxSamples) samples_.pop_front();
}

nlohmann::json StepHeat::ToJson() const {
  nlohmann::json t = nlohmann::json::array(), rows = nlohmann::json::array(),
                 median = nlohmann::json::array();
  for (const Sample& s : samples_) {
    t.push_back(s.t_s);
    nlohmann::json row = nlohmann::json::array();
    for (double v : s.band_max_s) row.push_back(OrNull(v));
    rows.push_back(std::move(row));
    median.push_back(OrNull(s.median_s));
  }
  return {{"t_s", t}, {"bands", bands_}, {"band_max_s", rows}, {"median_s", median}};
}

Result<nlohmann::json> PageOf(const std::vector<nlohmann::json>& rows, std::string_view page,
                              size_t page_rows) {
  int64_t asked = 0;
  if (!page.empty()) {
    const auto [end, ec] = std::from_chars(page.data(), page.data() + page.size(), asked);
    if (ec != std::errc() || end != page.data() + page.size() || asked < 0 ||
        asked > 1'000'000'000) {
      return InvalidArgument("page '" + std::string(page) +
                             "' is not a page number: send ?page=N, N from 0");
    }
  }
  const size_t pages = (rows.size() + page_rows - 1) / page_rows;
  nlohmann::json out = {{"total", rows.size()},
                        {"page", asked},
                        {"pages", pages},
                        {"page_rows", page_rows},
                        {"rows", nlohmann::json::array()}};
  const size_t first = static_cast<size_t>(asked) * page_rows;
  for (size_t i = first; i < rows.size() && i < first + page_rows; ++i) {
    out["rows"].push_back(rows[i]);
  }
  return out;
}

}  // namespace endure::controller
