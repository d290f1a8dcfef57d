// AnomalyPolicy: what to do about a loss anomaly (NaN, Inf, spike).
//
// On an anomaly at step s, the job rolls back to the newest checkpoint taken
// before s: a transient cause (a flipped bit, a bad node since replaced) does
// not come back. If the same step turns anomalous again after that rollback,
// its data is the likely culprit (a corrupt or pathological batch), and the
// policy either rolls back once more while skipping that step's data, or
// stops the job, as configured. A step that is still anomalous after being
// skipped, or more skipped steps than allowed, stop the job: the anomalies are
// then not about individual batches. Every decision carries its reason.
//
// Sans-I/O and deterministic. Not thread-safe.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "core/ids.h"
#include "core/loss_anomaly_detector.h"

namespace endure::core {

enum class AnomalyRecurrence {
  kSkipStep,  // roll back again and skip the data of the anomalous step
  kStop,      // stop the job (exit 3) and let a person look at the data
};

// "skip", "stop"; Parse accepts the same names and lists them on error.
std::string_view AnomalyRecurrenceName(AnomalyRecurrence r);
Result<AnomalyRecurrence> ParseAnomalyRecurrence(std::string_view name);

struct AnomalyPolicyOptions {
  AnomalyRecurrence on_recurrence = AnomalyRecurrence::kSkipStep;
  // More skipped steps than this over the whole run stop the job.
  int max_skipped_steps = 10;

  Status Validate() const;
};

enum class AnomalyAction {
  kRollBack,         // restore `restore_step` and run on
  kRollBackAndSkip,  // restore `restore_step`, and skip the data of `skip_steps`
  kStop,             // give up; the job ends with exit code 3
};

// "roll_back", "roll_back_and_skip", "stop".
std::string_view AnomalyActionName(AnomalyAction action);

struct AnomalyDecision {
  AnomalyAction action = AnomalyAction::kRollBack;
  // The checkpoint to restore; nullopt: no checkpoint precedes the anomaly,
  // start again from the initial parameters.
  std::optional<StepNumber> restore_step;
  // Every step whose data the trainer must skip from now on, ascending
  // (cumulative over the run, so a restart can be told the whole list).
  std::vector<StepNumber> skip_steps;
  std::string reason;
};

class AnomalyPolicy {
 public:
  // `options` must be valid (ENDURE_CHECK).
  explicit AnomalyPolicy(AnomalyPolicyOptions options);

  // Decides what to do about `anomaly`, given the steps of the checkpoints
  // that can be restored (verified, any order). The caller then restores the
  // checkpoint and rewinds the LossAnomalyDetector to it (RollBackTo).
  AnomalyDecision Decide(const LossAnomaly& anomaly, std::span<const StepNumber> checkpoints);

  // Steps skipped so far, ascending.
  const std::vector<StepNumber>& skipped_steps() const { return skipped_; }

  const AnomalyPolicyOptions& options() const { return options_; }

 private:
  AnomalyPolicyOptions options_;
  // Steps that already caused a rollback, with the kind seen first.
  std::map<int64_t, LossAnomalyKind> rolled_back_;
  std::vector<StepNumber> skipped_;
};

}  // namespace endure::core
