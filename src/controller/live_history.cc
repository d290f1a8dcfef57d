// The job's history in bounded space; see live_history.h.
#include "controller/live_history.h"

#include <cmath>
#include <limits>
#include <string>

namespace endure::controller {

bool LiveHistory::Due(double t_s) const {
  return samples_.empty() || t_s >= samples_.back().t_s + spacing_s_;
}

void LiveHistory::Add(const HistorySample& sample) {
  if (!samples_.empty() && sample.t_s < samples_.back().t_s) return;
  if (samples_.size() >= kMaxPoints) {
    // Keep the first and every second one after it: the spacing doubles.
    size_t kept = 0;
    for (size_t i = 0; i < samples_.size(); i += 2) samples_[kept++] = samples_[i];
    samples_.resize(kept);
    spacing_s_ *= 2;
  }
  samples_.push_back(sample);
}

nlohmann::json LiveHistory::ToJson() const {
  nlohmann::json t = nlohmann::json::array(), ettr = nlohmann::json::array(),
                 step = nlohmann::json::array(), loss = nlohmann::json::array(),
                 tokens = nlohmann::json::array(), ledger = nlohmann::json::object();
  for (int c = 0; c < core::kNumLedgerCategories; ++c) {
    ledger[std::string(core::LedgerCategoryName(static_cast<core::LedgerCategory>(c)))] =
        nlohmann::json::array();
  }
  for (const HistorySample& s : samples_) {
    t.push_back(s.t_s);
    ettr.push_back(s.ettr);
    step.push_back(s.step);
    loss.push_back(std::isfinite(s.loss) ? nlohmann::json(s.loss) : nlohmann::json());
    tokens.push_back(s.tokens_per_s);
    for (int c = 0; c < core::kNumLedgerCategories; ++c) {
      ledger[std::string(core::LedgerCategoryName(static_cast<core::LedgerCategory>(c)))].push_back(
          s.ledger_s[c]);
    }
  }
  return {{"t_s", t},
          {"ettr", ettr},
          {"step", step},
          {"loss", loss},
          {"tokens_per_s", tokens},
          {"ledger_s", ledger},
          {"spacing_s", spacing_s_}};
}

Result<LiveHistory> LiveHistory::FromJson(const nlohmann::json& j) {
  const auto bad = [](const std::string& what) {
    return InvalidArgument("the saved history is damaged: " + what);
  };
  if (!j.is_object()) return bad("not an object");
  const char* columns[] = {"t_s", "ettr", "step", "loss", "tokens_per_s"};
  for (const char* c : columns) {
    if (!j.contains(c) || !j[c].is_array()) return bad(std::string("no column '") + c + "'");
  }
  const size_t n = j["t_s"].size();
  if (n > kMaxPoints) return bad("more than " + std::to_string(kMaxPoints) + " samples");
  for (const char* c : columns) {
    if (j[c].size() != n) return bad(std::string("column '") + c + "' is not as long as t_s");
  }
  if (!j.contains("ledger_s") || !j["ledger_s"].is_object()) return bad("no ledger_s");
  LiveHistory h;
  if (j.contains("spacing_s")) {
    if (!j["spacing_s"].is_number() || !(j["spacing_s"].get<double>() >= 1) ||
        !std::isfinite(j["spacing_s"].get<double>())) {
      return bad("spacing_s is not a number of seconds >= 1");
    }
    h.spacing_s_ = j["spacing_s"].get<double>();
  }
  const auto number = [](const nlohmann::json& v) {
    return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
  };
  for (size_t i = 0; i < n; ++i) {
    HistorySample s;
    s.t_s = number(j["t_s"][i]);
    if (!std::isfinite(s.t_s) || (i > 0 && s.t_s < h.samples_.back().t_s)) {
      return bad("t_s is not a rising list of seconds");
    }
    s.ettr = number(j["ettr"][i]);
    s.step = j["step"][i].is_number_integer() ? j["step"][i].get<int64_t>() : 0;
    s.loss = number(j["loss"][i]);
    s.tokens_per_s = number(j["tokens_per_s"][i]);
    for (int c = 0; c < core::kNumLedgerCategories; ++c) {
      const std::string name(core::LedgerCategoryName(static_cast<core::LedgerCategory>(c)));
      const nlohmann::json& col = j["ledger_s"].value(name, nlohmann::json::array());
      s.ledger_s[c] = col.is_array() && i < col.size() ? number(col[i]) : 0;
    }
    h.samples_.push_back(s);
  }
  return h;
}

}  // namespace endure::controller
