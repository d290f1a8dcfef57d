// Rollback / skip / stop decisions for loss anomalies; see anomaly_policy.h.
#include "core/anomaly_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

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

// The checkpoint to restore for an anomaly at `step`, and its description.
std::optional<StepNumber> RestoreFor(StepNumber step, std::span<const StepNumber> checkpoints,
                                     std::string* text) {
  std::optional<StepNumber> restore;
  for (const StepNumber& c : checkpoints) {
    if (c < step && (!restore.has_value() || c > *restore)) restore = c;
  }
  *text = restore.has_value() ? "the checkpoint of step " + std::to_string(restore->value) +
                                    ", the newest before step " + std::to_string(step.value)
                              : "the initial parameters (no checkpoint precedes step " +
                                    std::to_string(step.value) + ")";
  return restore;
}

// Bit for bit, except that any NaN equals any NaN (its payload is not the
// program's).
bool SameLoss(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

std::string Exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

std::string_view DataSpikeActionName(DataSpikeAction a) {
  switch (a) {
    case DataSpikeAction::kContinue:
      return "continue";
    case DataSpikeAction::kSkip:
      return "skip";
    case DataSpikeAction::kStop:
      return "stop";
  }
  return "unknown";
}

Result<DataSpikeAction> ParseDataSpikeAction(std::string_view name) {
  if (name == "continue") return DataSpikeAction::kContinue;
  if (name == "skip") return DataSpikeAction::kSkip;
  if (name == "stop") return DataSpikeAction::kStop;
  return InvalidArgument("unknown action on a reproduced loss spike '" + std::string(name) +
                         "': expected \"continue\", \"skip\" or \"stop\"");
}

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
    case AnomalyAction::kContinue:
      return "continue";
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
                                      std::span<const StepNumber> checkpoints, bool replay,
                                      std::span<const RankLoss> losses, Generation generation) {
  const StepNumber step = anomaly.step;
  AnomalyDecision d;
  std::string restore;
  d.restore_step = RestoreFor(step, checkpoints, &restore);

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
    if (replay && !losses.empty()) {
      Replay r{anomaly, generation, {checkpoints.begin(), checkpoints.end()}, {}, {}};
      for (const RankLoss& l : losses) r.first[l.rank.value] = l.loss;
      replay_ = std::move(r);
      d.reason +=
          ", and replaying the step: the program is deterministic, so a loss that comes "
          "back bit for bit is the data's, and one that does not was a fault";
    }
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

std::optional<StepNumber> AnomalyPolicy::replaying() const {
  if (!replay_) return std::nullopt;
  return replay_->anomaly.step;
}

void AnomalyPolicy::ForgetReplay() { replay_.reset(); }

std::optional<ReplayVerdict> AnomalyPolicy::ReplayedLoss(Generation generation, Rank rank,
                                                         StepNumber step, double loss) {
  if (!replay_ || step != replay_->anomaly.step || generation <= replay_->generation ||
      replay_->first.count(rank.value) == 0) {
    return std::nullopt;
  }
  replay_->again[rank.value] = loss;
  if (replay_->again.size() < replay_->first.size()) return std::nullopt;

  Replay r = std::move(*replay_);
  replay_.reset();
  ReplayVerdict v;
  v.step = step;
  v.kind = r.anomaly.kind;
  v.anomaly = r.anomaly;
  std::string changes;
  for (const auto& [k, first] : r.first) {
    const double again = r.again.at(k);
    if (SameLoss(first, again)) continue;
    v.changed.push_back(Rank{k});
    changes += std::string(changes.empty() ? "" : ", ") + "rank " + std::to_string(k) + " " +
               Exact(first) + " then " + Exact(again);
  }
  v.reproduced = v.changed.empty();
  const std::string s = std::to_string(step.value);
  const std::string what = std::string(LossAnomalyCause(v.kind));
  AnomalyDecision& d = v.decision;
  d.skip_steps = skipped_;
  if (!v.reproduced) {
    d.action = AnomalyAction::kContinue;
    d.reason = "replay of step " + s + ": the loss changed (" + changes + "): the " + what +
               " was a fault, not the data; training goes on from the replay";
    return v;
  }
  std::string same;
  for (const auto& [k, first] : r.first) {
    same +=
        std::string(same.empty() ? "" : ", ") + "rank " + std::to_string(k) + " " + Exact(first);
  }
  const std::string reproduced = "replay of step " + s + ": every rank's loss came back bit for " +
                                 "bit (" + same + "): the " + what + " is the data's";
  if (v.kind != LossAnomalyKind::kSpike) {
    d.action = AnomalyAction::kStop;
    d.reason = "replay of step " + s + ": every rank's loss came back bit for bit (" + same +
               "): the " + what + " is deterministic (the data or the program), not a fault; " +
               "training cannot go on through a " +
               (v.kind == LossAnomalyKind::kNaN ? "NaN" : "infinite") + " loss at step " + s +
               ": inspect the data and the program at that step, stopping";
    return v;
  }
  switch (options_.on_data_spike) {
    case DataSpikeAction::kContinue:
      d.action = AnomalyAction::kContinue;
      d.reason = reproduced +
                 "; training goes on through it, nothing skipped (on_data_spike = "
                 "\"continue\")";
      data_anomalies_.push_back(DataAnomaly{step, v.kind, r.anomaly.loss, d.reason});
      return v;
    case DataSpikeAction::kStop:
      d.action = AnomalyAction::kStop;
      d.reason = reproduced +
                 "; the job is configured to stop on a data spike (on_data_spike = "
                 "\"stop\"), so that the data of step " +
                 s + " can be inspected";
      return v;
    case DataSpikeAction::kSkip:
      break;
  }
  if (static_cast<int>(skipped_.size()) >= options_.max_skipped_steps) {
    d.action = AnomalyAction::kStop;
    d.reason = reproduced + "; " + std::to_string(skipped_.size()) +
               " steps were skipped already (" + JoinSteps(skipped_) + "; at most " +
               std::to_string(options_.max_skipped_steps) + "), stopping";
    return v;
  }
  std::string restore;
  d.restore_step = RestoreFor(step, r.checkpoints, &restore);
  skipped_.insert(std::upper_bound(skipped_.begin(), skipped_.end(), step), step);
  d.action = AnomalyAction::kRollBackAndSkip;
  d.skip_steps = skipped_;
  d.reason = reproduced + "; skipping the data of step " + s + " (on_data_spike = \"skip\") and " +
             "rolling back to " + restore + " (steps skipped so far: " + JoinSteps(skipped_) + ")";
  return v;
}

}  // namespace endure::core
