// LossAnomalyDetector: flags training steps whose loss is not a finite number
// or jumps far above the recent ones.
//
// A spike is a loss more than `z_threshold` standard deviations above the mean
// of the last `window` normal losses. It is judged only once `min_count` losses
// have been seen, and only upwards, so the steep fall of the loss at the start
// of training (warm-up) never counts as an anomaly; the noisy early window also
// has a large deviation, which makes the test lenient exactly when it should
// be. NaN and ±Inf are always anomalies. Anomalous losses never enter the
// window, so one spike does not mask the next.
//
// Feed one loss per step (the mean over ranks, or rank 0's; a rank that saw a
// NaN should make the step's loss NaN). Sans-I/O and deterministic. Not
// thread-safe.
#pragma once

#include <deque>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "core/ids.h"

namespace endure::core {

struct LossAnomalyOptions {
  // Number of most recent normal losses the mean and deviation are taken over.
  int window = 50;
  // Losses needed in the window before spikes are judged.
  int min_count = 20;
  // A loss this many standard deviations above the window mean is a spike.
  double z_threshold = 6.0;
  // Floor of the standard deviation as a fraction of |mean|: on a flat loss
  // curve the deviation shrinks towards zero and ordinary noise would look
  // like a spike.
  double min_relative_stddev = 0.01;

  // Names the first invalid field and its accepted range.
  Status Validate() const;
};

enum class LossAnomalyKind { kNaN, kInf, kSpike };

// The cause names used in incidents: "loss_nan", "loss_inf", "loss_spike".
std::string_view LossAnomalyCause(LossAnomalyKind kind);

struct LossAnomaly {
  StepNumber step;
  LossAnomalyKind kind = LossAnomalyKind::kNaN;
  double loss = 0;
  // Window statistics the loss was judged against (zero for NaN/Inf before the
  // window fills).
  double mean = 0;
  double stddev = 0;
  double z = 0;
  // E.g. "loss 9.81 at step 1200 is 41.3 standard deviations above the mean
  // 2.47 (stddev 0.178) of the last 50 steps (threshold 6)".
  std::string reason;
};

class LossAnomalyDetector {
 public:
  // `options` must be valid (ENDURE_CHECK).
  explicit LossAnomalyDetector(LossAnomalyOptions options);

  // Judges the loss of `step`. A step at or below one already in the window
  // means the job rolled back: the losses of that step and later ones are
  // forgotten first (as RollBackTo(step - 1) would), since they will be
  // recomputed.
  std::optional<LossAnomaly> Observe(StepNumber step, double loss);

  // The job restored the state after `step`: forgets the losses of later steps.
  void RollBackTo(StepNumber step);

  // Number of losses currently in the window.
  int count() const { return static_cast<int>(window_.size()); }

  const LossAnomalyOptions& options() const { return options_; }

 private:
  struct Sample {
    StepNumber step;
    double loss;
  };

  LossAnomalyOptions options_;
  std::deque<Sample> window_;  // ascending steps
};

}  // namespace endure::core
