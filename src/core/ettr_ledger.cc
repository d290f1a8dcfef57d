// ETTR ledger; see ettr_ledger.h.
#include "core/ettr_ledger.h"

#include <algorithm>
#include <cmath>

#include "common/status.h"

namespace endure::core {

std::string_view LedgerCategoryName(LedgerCategory category) {
  switch (category) {
    case LedgerCategory::kProductive:
      return "productive";
    case LedgerCategory::kCheckpointStall:
      return "checkpoint_stall";
    case LedgerCategory::kDetection:
      return "detection";
    case LedgerCategory::kRecovery:
      return "recovery";
    case LedgerCategory::kRecompute:
      return "recompute";
    case LedgerCategory::kStartup:
      return "startup";
    case LedgerCategory::kOther:
      return "other";
  }
  return "?";
}

EttrLedger::EttrLedger(TimePoint start) : start_(start), last_(start) {}

void EttrLedger::Advance(TimePoint now) {
  ENDURE_CHECK(now >= last_);
  Duration elapsed = now - last_;
  last_ = now;
  if (current_ != LedgerCategory::kProductive) {
    totals_[static_cast<int>(current_)] += elapsed;
    return;
  }
  Duration useful = elapsed;
  if (slowdown_ != 1.0) {
    // Split so that the two parts add up to exactly `elapsed`.
    useful = Duration(static_cast<int64_t>(std::llround(elapsed.count() / slowdown_)));
    totals_[static_cast<int>(slowdown_lost_to_)] += elapsed - useful;
  }
  totals_[static_cast<int>(LedgerCategory::kProductive)] += useful;
  uncommitted_ += useful;
}

void EttrLedger::Enter(LedgerCategory category, TimePoint now) {
  Advance(now);
  current_ = category;
}

void EttrLedger::SetSlowdown(double factor, LedgerCategory lost_to, TimePoint now) {
  ENDURE_CHECK(factor >= 1.0);
  ENDURE_CHECK(lost_to != LedgerCategory::kProductive);
  Advance(now);
  slowdown_ = factor;
  slowdown_lost_to_ = lost_to;
}

void EttrLedger::CopyTaken(TimePoint now) {
  Advance(now);
  uncommitted_ = Duration(0);
}

void EttrLedger::RollBack(TimePoint now) {
  Advance(now);
  totals_[static_cast<int>(LedgerCategory::kProductive)] -= uncommitted_;
  totals_[static_cast<int>(LedgerCategory::kRecompute)] += uncommitted_;
  uncommitted_ = Duration(0);
}

void EttrLedger::Reclassify(Duration amount, LedgerCategory to, TimePoint now) {
  ENDURE_CHECK(to != LedgerCategory::kProductive);
  Advance(now);
  amount = std::clamp(amount, Duration(0), uncommitted_);
  uncommitted_ -= amount;
  totals_[static_cast<int>(LedgerCategory::kProductive)] -= amount;
  totals_[static_cast<int>(to)] += amount;
}

double EttrLedger::Ettr() const {
  if (wall() <= Duration(0)) return 0;
  return Seconds(total(LedgerCategory::kProductive)) / Seconds(wall());
}

}  // namespace endure::core
