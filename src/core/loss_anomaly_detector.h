// LossAnomalyDetector: flags training steps whose loss is not a finite number
// or jumps far above the recent ones.
//
// The per-step loss of a language model trained on small batches is heavy-
// tailed: a batch of unusual text lands several standard deviations above the
// mean every few thousand steps, and that is the data, not a fault. So a
// spike is judged by robust statistics over a long window of recent losses,
// and must clear two bars at once:
//   - the loss is more than `z_threshold` robust deviations above the median
//     (a deviation is 1.4826 x the median absolute deviation, which equals
//     the standard deviation for normal noise but is not inflated by the tail
//     itself), and
//   - the loss exceeds the median by at least `min_jump` x |median| (with the
//     default 1.0, twice the recent level): a fault that corrupts the loss
//     moves it by a factor, noise by a fraction.
// A spike is judged only once `min_count` losses have been seen, and only
// upwards, so the steep fall of the loss at the start of training never
// counts. NaN and ±Inf are always anomalies. Anomalous losses never enter the
// window, so one spike does not mask the next.
//
// Feed one loss per step (the mean over ranks, or rank 0's; a rank that saw a
// NaN should make the step's loss NaN). Sans-I/O and deterministic; O(window)
// per observed step. Not thread-safe.
#pragma once

#include <deque>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"
#include "core/ids.h"

namespace endure::core {

struct LossAnomalyOptions {
  // Number of most recent normal losses the median and deviation are taken
  // over: long compared with the noise, so that its tail is in the window.
  int window = 200;
  // Losses needed in the window before spikes are judged.
  int min_count = 20;
  // A loss this many robust deviations (1.4826 x MAD) above the median is a
  // spike, if it also clears `min_jump`.
  double z_threshold = 8.0;
  // ... and exceeds the median by at least this fraction of |median|.
  double min_jump = 1.0;
  // Floor of the deviation as a fraction of |median|: on a flat loss curve
  // the deviation shrinks towards zero and ordinary noise would look like a
  // spike.
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
  // window fills): the median, the robust deviation (1.4826 x MAD, floored)
  // and the loss's distance from the median in deviations.
  double median = 0;
  double deviation = 0;
  double z = 0;
  // E.g. "loss 9.81 at step 1200 is 3.97x the median 2.47 of the last 200
  // steps, 41.3 robust deviations (0.178) above it (thresholds: 8 deviations
  // and 2x the median)".
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

  // Its state, for a snapshot of the job (core/job_snapshot.h); the options
  // come from the job's configuration.
  template <class Archive>
  void serialize(Archive& ar) {
    ar(window_);
  }

 private:
  struct Sample {
    StepNumber step;
    double loss;

    template <class Archive>
    void serialize(Archive& ar) {
      ar(step, loss);
    }
  };

  LossAnomalyOptions options_;
  std::deque<Sample> window_;  // ascending steps
};

}  // namespace endure::core
