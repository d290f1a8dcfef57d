// The ETTR ledger: puts every nanosecond of a job's wall time into exactly one
// category of DESIGN.md (productive, checkpoint_stall, detection, recovery,
// recompute, startup, other), so that ETTR = productive / wall is measured.
// Sans-I/O: time arrives as an argument. Not thread-safe; one owner drives it.
//
// Productive time is first held as uncommitted: it survives only when a
// checkpoint copy of the job's state is taken after it (CopyTaken: a copy in
// node memory is enough, since a restart restores the newest copy from any
// tier; a durable step committed is the checkpoint book's other event, and
// changes nothing here). A rollback (RollBack) moves it to recompute,
// because that much work has to be run again; the re-run is then productive
// time in its own right, so productive counts each surviving step once.
#pragma once

#include <array>
#include <deque>
#include <optional>
#include <string_view>
#include <utility>

#include "common/duration.h"
#include "core/ids.h"

namespace endure::core {

enum class LedgerCategory {
  kProductive,
  kCheckpointStall,
  kDetection,
  kRecovery,
  kRecompute,
  kStartup,
  kOther,
};
inline constexpr int kNumLedgerCategories = 7;

// "productive", "checkpoint_stall", "detection", "recovery", "recompute", "startup", "other".
std::string_view LedgerCategoryName(LedgerCategory category);

class EttrLedger {
 public:
  // The ledger starts at `start` in kStartup.
  explicit EttrLedger(TimePoint start);

  // Charges the time since the previous call to the current category, then
  // makes `category` current. `now` must not go backwards (CHECKed).
  void Enter(LedgerCategory category, TimePoint now);

  // Charges time up to `now` without changing category.
  void Advance(TimePoint now);

  // While the current category is kProductive, the job runs `factor` (>= 1)
  // times slower than normal (a straggler holds every rank back): only
  // 1/factor of the elapsed time counts as productive, the rest goes to
  // `lost_to`. Factor 1 restores full speed. Charges up to `now` first.
  void SetSlowdown(double factor, LedgerCategory lost_to, TimePoint now);

  // A checkpoint copy of step `step` was taken, as heard at `now`: the
  // productive time up to the step survives (as long as a restart restores
  // this copy or a newer one: see RestoredTo). `productive_at_step`: the
  // productive total when the job reached the step (the first report of it
  // from any rank), where the report of the copy came later (a slow or
  // partitioned link): the time since then stays uncommitted. nullopt: now.
  void CopyTaken(StepNumber step, TimePoint now,
                 std::optional<Duration> productive_at_step = std::nullopt);

  // The job rolled back to its last checkpoint at `now`: uncommitted
  // productive time is lost and charged to kRecompute.
  void RollBack(TimePoint now);

  // A generation starts from step `step` (what its workers restored): the
  // copies taken after it did not survive (their node was lost, a shard of
  // them failed to verify, a rollback abandoned them), so the productive
  // time between the newest copy at or before `step` and the newest copy
  // is charged to kRecompute too. Nothing when `step` is at or after the
  // newest copy (the usual restart, or an in-process one).
  void RestoredTo(StepNumber step, TimePoint now);

  // The last `amount` of productive time, not yet committed, was not
  // productive after all (a fault hit that long before it was detected, or a
  // step was blocked saving a checkpoint): charges it to `to` instead.
  // Charges up to `now` first; clamped to the uncommitted time.
  void Reclassify(Duration amount, LedgerCategory to, TimePoint now);

  // Time charged to `category` so far; kProductive includes uncommitted time.
  Duration total(LedgerCategory category) const { return totals_[static_cast<int>(category)]; }
  Duration uncommitted() const { return uncommitted_; }
  LedgerCategory current() const { return current_; }
  // Sum of all categories, which always equals the time since start.
  Duration wall() const { return last_ - start_; }
  // productive / wall; 0 before any time has passed.
  double Ettr() const;

  // Its state, for a snapshot of the job (core/job_snapshot.h).
  template <class Archive>
  void serialize(Archive& ar) {
    ar(start_, last_, current_, slowdown_, slowdown_lost_to_, uncommitted_, totals_, copies_);
  }

 private:
  TimePoint start_;
  TimePoint last_;
  LedgerCategory current_ = LedgerCategory::kStartup;
  double slowdown_ = 1.0;
  LedgerCategory slowdown_lost_to_ = LedgerCategory::kOther;
  Duration uncommitted_{0};
  std::array<Duration, kNumLedgerCategories> totals_{};
  // The copies of the current timeline, oldest first, each with the
  // productive total when it was taken (the first entry: where the
  // timeline began). At most kMaxCopies: older ones are forgotten.
  std::deque<std::pair<StepNumber, Duration>> copies_;
  static constexpr size_t kMaxCopies = 1024;
};

}  // namespace endure::core
