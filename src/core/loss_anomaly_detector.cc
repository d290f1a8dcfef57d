// Loss anomaly detection; see loss_anomaly_detector.h.
#include "core/loss_anomaly_detector.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <vector>

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
  if (!(min_jump >= 0) || !std::isfinite(min_jump)) {
    return InvalidArgument("loss anomaly detector: min_jump must be a number >= 0, got " +
                           std::to_string(min_jump));
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

namespace {

// The median of `v` (not empty); reorders it.
double MedianOf(std::vector<double>& v) {
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  return (*std::max_element(v.begin(), v.begin() + mid) + upper) / 2;
}

}  // namespace

std::optional<LossAnomaly> LossAnomalyDetector::Observe(StepNumber step, double loss) {
  RollBackTo(StepNumber{step.value - 1});

  LossAnomaly a;
  a.step = step;
  a.loss = loss;
  std::ostringstream reason;
  if (std::isnan(loss) || std::isinf(loss)) {
    a.kind = std::isnan(loss) ? LossAnomalyKind::kNaN : LossAnomalyKind::kInf;
    reason << "loss is " << (std::isnan(loss) ? "NaN" : (loss > 0 ? "+Inf" : "-Inf")) << " at step "
           << step.value;
    a.reason = reason.str();
    return a;
  }

  const int n = count();
  if (n >= options_.min_count) {
    std::vector<double> values;
    values.reserve(window_.size());
    for (const Sample& s : window_) values.push_back(s.loss);
    const double median = MedianOf(values);
    for (double& v : values) v = std::abs(v - median);
    const double mad_deviation = 1.4826 * MedianOf(values);
    const double floor = options_.min_relative_stddev * std::abs(median);
    const double deviation = std::max({mad_deviation, floor, 1e-12});
    const double excess = loss - median;
    const double z = excess / deviation;
    if (z > options_.z_threshold && excess >= options_.min_jump * std::abs(median)) {
      a.kind = LossAnomalyKind::kSpike;
      a.median = median;
      a.deviation = deviation;
      a.z = z;
      reason.precision(3);
      reason << "loss " << loss << " at step " << step.value << " is ";
      if (median > 0) reason << loss / median << "x ";
      reason << (median > 0 ? "the median " : "above the median ") << median << " of the last " << n
             << " steps, " << z << " robust deviations (" << deviation;
      if (deviation > mad_deviation) {
        reason << ", floored at " << options_.min_relative_stddev << " x |median|";
      }
      reason << ") above it (thresholds: " << options_.z_threshold << " deviations and "
             << 1 + options_.min_jump << "x the median)";
      a.reason = reason.str();
      return a;
    }
  }

  window_.push_back({step, loss});
  if (count() > options_.window) window_.pop_front();
  return std::nullopt;
}

}  // namespace endure::core
