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

void EttrLedger::CopyTaken(StepNumber step, TimePoint now,
                           std::optional<Duration> productive_at_step) {
  Advance(now);
  const Duration total = totals_[static_cast<int>(LedgerCategory::kProductive)];
  // Never before an earlier copy, never after now.
  Duration at = std::min(productive_at_step.value_or(total), total);
  if (!copies_.empty()) at = std::max(at, copies_.back().second);
  uncommitted_ = std::min(uncommitted_, total - at);
  copies_.emplace_back(step, at);
  if (copies_.size() > kMaxCopies) copies_.pop_front();
}

void EttrLedger::RestoredTo(StepNumber step, TimePoint now) {
  Advance(now);
  Duration& productive = totals_[static_cast<int>(LedgerCategory::kProductive)];
  if (!copies_.empty() && copies_.back().first > step) {
    // The newest copy at or before `step` (none: the timeline's start, or
    // the oldest remembered).
    auto kept = copies_.end();
    for (auto it = copies_.begin(); it != copies_.end() && it->first <= step; ++it) kept = it;
    const Duration base = kept == copies_.end() ? Duration(0) : kept->second;
    const Duration lost = std::clamp(copies_.back().second - base, Duration(0), productive);
    productive -= lost;
    totals_[static_cast<int>(LedgerCategory::kRecompute)] += lost;
    copies_.erase(kept == copies_.end() ? copies_.begin() : std::next(kept), copies_.end());
  }
  // The new timeline begins here, with what is productive now.
  copies_.emplace_back(step, productive);
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
