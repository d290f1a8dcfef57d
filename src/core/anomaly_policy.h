// AnomalyPolicy: what to do about a loss anomaly (NaN, Inf, spike).
//
// On an anomaly at step s, the job rolls back to the newest checkpoint taken
// before s and replays it. What happens next depends on the program:
//
// A deterministic program (endure-train; a client that says so, see
// Session::DeclareDeterministic) computes the same loss bit for bit when it
// replays a step from the same state and data. So the replay is the verdict:
//   - every rank's loss of step s comes back bit for bit: the anomaly is the
//     data's. It is recorded and training goes on through it (on_data_spike
//     "continue", the default), or the data of s is skipped ("skip", rolling
//     back once more), or the job stops ("stop"). A reproducible NaN or Inf
//     always stops the job with a verdict naming the step: training cannot
//     go on through it.
//   - a rank's loss differs: the first one was a fault (a flipped bit, a
//     transient hardware error). The ranks whose loss changed are named, and
//     the caller strikes their nodes as SDC suspects; training goes on from
//     the replay, which did not see the fault.
//
// A program that is not deterministic keeps the older rule: if the same step
// turns anomalous again after the rollback, its data is the likely culprit,
// and the policy rolls back once more skipping that step's data, or stops
// the job, as configured (on_recurrence). A step that is still anomalous
// after being skipped, or more skipped steps than allowed, stop the job:
// the anomalies are then not about individual batches. Every decision
// carries its reason.
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

// What a deterministic job does with a spike whose replay reproduced it.
enum class DataSpikeAction {
  kContinue,  // record it and train on through it (nothing is skipped)
  kSkip,      // roll back again and skip the data of the step
  kStop,      // stop the job (exit 3) and let a person look at the data
};

// "continue", "skip", "stop"; Parse accepts the same names and lists them on error.
std::string_view DataSpikeActionName(DataSpikeAction a);
Result<DataSpikeAction> ParseDataSpikeAction(std::string_view name);

struct AnomalyPolicyOptions {
  // Programs that are not deterministic: a step anomalous again after the rollback.
  AnomalyRecurrence on_recurrence = AnomalyRecurrence::kSkipStep;
  // Deterministic programs: a spike the replay reproduced bit for bit.
  DataSpikeAction on_data_spike = DataSpikeAction::kContinue;
  // More skipped steps than this over the whole run stop the job.
  int max_skipped_steps = 10;

  Status Validate() const;
};

enum class AnomalyAction {
  kRollBack,         // restore `restore_step` and run on
  kRollBackAndSkip,  // restore `restore_step`, and skip the data of `skip_steps`
  kStop,             // give up; the job ends with exit code 3
  kContinue,         // a replay verdict: train on from where the replay is
};

// "roll_back", "roll_back_and_skip", "stop", "continue".
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

// A rank's loss at a step, as the rank reported it.
struct RankLoss {
  Rank rank;
  double loss = 0;
};

// What the replay of an anomalous step said.
struct ReplayVerdict {
  StepNumber step;
  LossAnomalyKind kind = LossAnomalyKind::kSpike;
  // True: every rank's loss came back bit for bit (the data's); false: a fault.
  bool reproduced = false;
  // The ranks whose loss changed (a fault), ascending.
  std::vector<Rank> changed;
  // kContinue, or for a reproduced anomaly kRollBackAndSkip or kStop.
  AnomalyDecision decision;
  // The anomaly as first seen, for a decision that stops or skips.
  LossAnomaly anomaly;
};

// A data anomaly the job trained through (a verdict of kContinue that
// reproduced), for the report.
struct DataAnomaly {
  StepNumber step;
  LossAnomalyKind kind = LossAnomalyKind::kSpike;
  double loss = 0;
  std::string reason;
};

class AnomalyPolicy {
 public:
  // `options` must be valid (ENDURE_CHECK).
  explicit AnomalyPolicy(AnomalyPolicyOptions options);

  // Decides what to do about `anomaly`, given the steps of the checkpoints
  // that can be restored (verified, any order). The caller then restores the
  // checkpoint and rewinds the LossAnomalyDetector to it (RollBackTo).
  // `replay`: the program is deterministic, so the first anomaly at a step is
  // replayed for a verdict (ReplayedLoss); `losses` are the ranks' losses of
  // the anomalous step known now (at least the anomalous rank's), which the
  // replay is compared with; `generation` is the one that saw them.
  AnomalyDecision Decide(const LossAnomaly& anomaly, std::span<const StepNumber> checkpoints,
                         bool replay = false, std::span<const RankLoss> losses = {},
                         Generation generation = Generation{0});

  // A step whose replay is awaited, if any.
  std::optional<StepNumber> replaying() const;

  // A rank's loss of `step` in `generation`. Once every rank whose loss was
  // recorded at the anomaly has reported the awaited step again in a later
  // generation, returns the verdict (and awaits nothing more). Reports of
  // other steps, of the generation that saw the anomaly, or of ranks not
  // recorded return nothing.
  std::optional<ReplayVerdict> ReplayedLoss(Generation generation, Rank rank, StepNumber step,
                                            double loss);

  // The job's world changed size before the replay (a shrink): the ranks'
  // losses are not comparable any more; the awaited replay is dropped, and a
  // recurrence at its step is then judged as for a program that is not
  // deterministic.
  void ForgetReplay();

  // Anomalies the job trained through, oldest first.
  const std::vector<DataAnomaly>& data_anomalies() const { return data_anomalies_; }

  // Steps skipped so far, ascending.
  const std::vector<StepNumber>& skipped_steps() const { return skipped_; }

  const AnomalyPolicyOptions& options() const { return options_; }

  // Its state, for a snapshot of the job (core/job_snapshot.h); the options
  // come from the job's configuration.
  template <class Archive>
  void serialize(Archive& ar) {
    ar(rolled_back_, skipped_, replay_, data_anomalies_);
  }

 private:
  AnomalyPolicyOptions options_;
  // Steps that already caused a rollback, with the kind seen first.
  std::map<int64_t, LossAnomalyKind> rolled_back_;
  std::vector<StepNumber> skipped_;
  struct Replay {
    LossAnomaly anomaly;
    Generation generation;                // the one that saw the anomaly
    std::vector<StepNumber> checkpoints;  // as at the anomaly, for a skip
    std::map<int32_t, double> first;      // rank -> loss at the anomaly
    std::map<int32_t, double> again;      // rank -> loss in the replay

    template <class Archive>
    void serialize(Archive& ar) {
      ar(anomaly, generation, checkpoints, first, again);
    }
  };
  std::optional<Replay> replay_;
  std::vector<DataAnomaly> data_anomalies_;
};

}  // namespace endure::core
