// The job's history for the dashboard and the HTML report (issue 29): ETTR,
// the ledger by category, step, loss and tokens/s over the whole run, in at
// most kMaxPoints samples. When full, every second sample is dropped and the
// spacing between samples doubles, so a month-long run keeps its shape in a
// bounded size. Pure: the shell adds a sample when Due says so, and saves
// the JSON in the state store beside the ledger.
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/status.h"
#include "core/ettr_ledger.h"

namespace endure::controller {

struct HistorySample {
  double t_s = 0;  // seconds since the run started
  double ettr = 0;
  int64_t step = 0;
  double loss = 0;  // NaN: none yet
  double tokens_per_s = 0;
  std::array<double, core::kNumLedgerCategories> ledger_s{};  // cumulative, by category
};

class LiveHistory {
 public:
  static constexpr size_t kMaxPoints = 600;

  // Whether a sample taken at `t_s` belongs in the history: the first, and
  // then one per spacing (1 s, doubled at every thinning).
  bool Due(double t_s) const;
  // Appends `sample` (times must not go back: an earlier one is dropped),
  // thinning first when full.
  void Add(const HistorySample& sample);

  size_t size() const { return samples_.size(); }
  double spacing_s() const { return spacing_s_; }
  const std::vector<HistorySample>& samples() const { return samples_; }

  // The columns of docs/monitoring.md ("History"); loss NaN is null.
  nlohmann::json ToJson() const;
  // Back from ToJson (a controller that carries a run on): an
  // InvalidArgument saying what is wrong with a damaged one.
  static Result<LiveHistory> FromJson(const nlohmann::json& j);

 private:
  std::vector<HistorySample> samples_;
  double spacing_s_ = 1;
};

}  // namespace endure::controller
