// Loss anomaly detection; see loss_anomaly_detector.h.
#include "core/loss_anomaly_detector.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace endure::core {

Status LossAnomalyOptions::Validate() const {
  if (window < 2) {
    return InvalidArgument("loss anomaly detector: window must be at least 2 steps, got " +
                           std::to_string(window));
  }
  if (min_count < 2 || min_count > window) {
    return InvalidArgument("loss anomaly detector: min_count must be in [2, window=" +
                           std::to_string(window) + "], got " + std::to_string(min_count));
  }
  if (!(z_threshold > 0) || !std::isfinite(z_threshold)) {
    return InvalidArgument("loss anomaly detector: z_threshold must be a positive number, got " +
                           std::to_string(z_threshold));
  }
  if (!(min_relative_stddev >= 0) || !std::isfinite(min_relative_stddev)) {
    return InvalidArgument(
        "loss anomaly detector: min_relative_stddev must be a number >= 0, got " +
        std::to_string(min_relative_stddev));
  }
  return Status::Ok();
}

std::string_view LossAnomalyCause(LossAnomalyKind kind) {
  switch (kind) {
    case LossAnomalyKind::kNaN:
      return "loss_nan";
    case LossAnomalyKind::kInf:
      return "loss_inf";
    case LossAnomalyKind::kSpike:
      return "loss_spike";
  }
  return "loss_anomaly";
}

LossAnomalyDetector::LossAnomalyDetector(LossAnomalyOptions options) : options_(options) {
  ENDURE_CHECK(options_.Validate().ok());
}

void LossAnomalyDetector::RollBackTo(StepNumber step) {
  while (!window_.empty() && window_.back().step > step) window_.pop_back();
}

std::optional<LossAnomaly> LossAnomalyDetector::Observe(StepNumber step, double loss) {
  RollBackTo(StepNumber{step.value - 1});

  const int n = count();
  double mean = 0;
  double stddev = 0;
  if (n > 0) {
    for (const Sample& s : window_) mean += s.loss;
    mean /= n;
  }
  if (n > 1) {
    double sq = 0;
    for (const Sample& s : window_) sq += (s.loss - mean) * (s.loss - mean);
    stddev = std::sqrt(sq / (n - 1));
  }

  LossAnomaly a;
  a.step = step;
  a.loss = loss;
  a.mean = mean;
  a.stddev = stddev;
  std::ostringstream reason;
  if (std::isnan(loss) || std::isinf(loss)) {
    a.kind = std::isnan(loss) ? LossAnomalyKind::kNaN : LossAnomalyKind::kInf;
    reason << "loss is " << (std::isnan(loss) ? "NaN" : (loss > 0 ? "+Inf" : "-Inf")) << " at step "
           << step.value;
    a.reason = reason.str();
    return a;
  }

  if (n >= options_.min_count) {
    const double floor = options_.min_relative_stddev * std::abs(mean);
    const double scale = std::max({stddev, floor, 1e-12});
    const double z = (loss - mean) / scale;
    if (z > options_.z_threshold) {
      a.kind = LossAnomalyKind::kSpike;
      a.z = z;
      reason.precision(3);
      reason << "loss " << loss << " at step " << step.value << " is " << z
             << " standard deviations above the mean " << mean << " (stddev " << scale;
      if (scale > stddev) reason << ", floored at " << options_.min_relative_stddev << " x |mean|";
      reason << ") of the last " << n << " steps (threshold " << options_.z_threshold << ")";
      a.reason = reason.str();
      return a;
    }
  }

  window_.push_back({step, loss});
  if (count() > options_.window) window_.pop_front();
  return std::nullopt;
}

}  // namespace endure::core
