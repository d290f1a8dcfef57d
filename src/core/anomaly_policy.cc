// Rollback / skip / stop decisions for loss anomalies; see anomaly_policy.h.
#include "core/anomaly_policy.h"

#include <algorithm>

namespace endure::core {
namespace {

std::string JoinSteps(const std::vector<StepNumber>& steps) {
  std::string out;
  for (const StepNumber& s : steps) {
    if (!out.empty()) out += ", ";
    out += std::to_string(s.value);
  }
  return out;
}

}  // namespace

std::string_view AnomalyRecurrenceName(AnomalyRecurrence r) {
  return r == AnomalyRecurrence::kSkipStep ? "skip" : "stop";
}

Result<AnomalyRecurrence> ParseAnomalyRecurrence(std::string_view name) {
  if (name == "skip") return AnomalyRecurrence::kSkipStep;
  if (name == "stop") return AnomalyRecurrence::kStop;
  return InvalidArgument("unknown action on a recurring loss anomaly '" + std::string(name) +
                         "': expected \"skip\" or \"stop\"");
}

std::string_view AnomalyActionName(AnomalyAction action) {
  switch (action) {
    case AnomalyAction::kRollBack:
      return "roll_back";
    case AnomalyAction::kRollBackAndSkip:
      return "roll_back_and_skip";
    case AnomalyAction::kStop:
      return "stop";
  }
  return "unknown";
}

Status AnomalyPolicyOptions::Validate() const {
  if (max_skipped_steps < 0) {
    return InvalidArgument("anomaly policy: max_skipped_steps must be >= 0, got " +
                           std::to_string(max_skipped_steps));
  }
  return Status::Ok();
}

AnomalyPolicy::AnomalyPolicy(AnomalyPolicyOptions options) : options_(options) {
  ENDURE_CHECK(options_.Validate().ok());
}

AnomalyDecision AnomalyPolicy::Decide(const LossAnomaly& anomaly,
                                      std::span<const StepNumber> checkpoints) {
  const StepNumber step = anomaly.step;
  AnomalyDecision d;
  for (const StepNumber& c : checkpoints) {
    if (c < step && (!d.restore_step.has_value() || c > *d.restore_step)) d.restore_step = c;
  }
  const std::string restore = d.restore_step.has_value()
                                  ? "the checkpoint of step " +
                                        std::to_string(d.restore_step->value) +
                                        ", the newest before step " + std::to_string(step.value)
                                  : "the initial parameters (no checkpoint precedes step " +
                                        std::to_string(step.value) + ")";

  auto stop = [&](const std::string& why) {
    d.action = AnomalyAction::kStop;
    d.restore_step.reset();
    d.skip_steps = skipped_;
    d.reason = anomaly.reason + ": " + why;
    return d;
  };

  if (std::binary_search(skipped_.begin(), skipped_.end(), step)) {
    return stop("step " + std::to_string(step.value) +
                " is anomalous although its data is skipped; the cause is not the data, stopping");
  }

  auto first = rolled_back_.find(step.value);
  if (first == rolled_back_.end()) {
    rolled_back_.emplace(step.value, anomaly.kind);
    d.action = AnomalyAction::kRollBack;
    d.skip_steps = skipped_;
    d.reason = anomaly.reason + ": rolling back to " + restore;
    return d;
  }

  const std::string again =
      "again after a rollback (first time: " + std::string(LossAnomalyCause(first->second)) + ")";
  if (options_.on_recurrence == AnomalyRecurrence::kStop) {
    return stop(again + "; the job is configured to stop rather than skip data, stopping so that " +
                "the data of step " + std::to_string(step.value) + " can be inspected");
  }
  if (static_cast<int>(skipped_.size()) >= options_.max_skipped_steps) {
    return stop(again + "; " + std::to_string(skipped_.size()) + " steps were skipped already (" +
                JoinSteps(skipped_) + "; at most " + std::to_string(options_.max_skipped_steps) +
                "), so the anomalies are not about single batches, stopping");
  }
  skipped_.insert(std::upper_bound(skipped_.begin(), skipped_.end(), step), step);
  d.action = AnomalyAction::kRollBackAndSkip;
  d.skip_steps = skipped_;
  d.reason = anomaly.reason + " " + again + ": skipping the data of step " +
             std::to_string(step.value) + " and rolling back to " + restore +
             " (steps skipped so far: " + JoinSteps(skipped_) + ")";
  return d;
}

}  // namespace endure::core
