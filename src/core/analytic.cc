// Reliability formulas; see analytic.h for the models and their sources.
#include "core/analytic.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace endure::core {
namespace {

constexpr double kSecondsPerDay = 86400.0;

bool Infinite(Duration mtbf) { return mtbf == kNeverFails; }

Duration ToDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds >= 9.2e9) return kNeverFails;
  return FromSeconds(std::max(0.0, seconds));
}

double LogExactEttr(double tau, double delta, double r, double m) {
  // log(tau) - [log M + R/M + log(expm1((tau + delta) / M))]
  return std::log(tau) - (std::log(m) + r / m + std::log(std::expm1((tau + delta) / m)));
}

}  // namespace

Duration Mttf(int64_t nodes, double failures_per_1000_node_days) {
  double per_day = static_cast<double>(nodes) * failures_per_1000_node_days / 1000.0;
  if (per_day <= 0) return kNeverFails;
  return ToDuration(kSecondsPerDay / per_day);
}

Duration YoungInterval(Duration ckpt_cost, Duration mtbf) {
  if (Infinite(mtbf)) return kNeverFails;
  return ToDuration(std::sqrt(2.0 * Seconds(ckpt_cost) * Seconds(mtbf)));
}

Duration DalyInterval(Duration ckpt_cost, Duration mtbf) {
  if (Infinite(mtbf)) return kNeverFails;
  double delta = Seconds(ckpt_cost);
  double m = Seconds(mtbf);
  if (delta >= 2 * m) return mtbf;
  double x = delta / (2 * m);
  return ToDuration(std::sqrt(2 * delta * m) * (1 + std::sqrt(x) / 3 + x / 9) - delta);
}

double ExactEttr(Duration interval, Duration ckpt_cost, Duration recovery, Duration mtbf) {
  double tau = Seconds(interval);
  double delta = Seconds(ckpt_cost);
  if (tau <= 0) return 0;
  if (Infinite(mtbf)) return tau / (tau + delta);
  return std::exp(LogExactEttr(tau, delta, Seconds(recovery), Seconds(mtbf)));
}

Duration ExactOptimalInterval(Duration ckpt_cost, Duration recovery, Duration mtbf) {
  if (Infinite(mtbf)) return kNeverFails;
  double delta = Seconds(ckpt_cost);
  double r = Seconds(recovery);
  double m = Seconds(mtbf);
  // ETTR(tau) rises like tau for small tau and decays exponentially beyond M,
  // so the optimum lies well inside [M * 1e-9, 50 M]; it is unimodal there.
  double lo = std::log(m * 1e-9);
  double hi = std::log(m * 50);
  const double kInvPhi = (std::sqrt(5.0) - 1) / 2;
  auto f = [&](double log_tau) { return LogExactEttr(std::exp(log_tau), delta, r, m); };
  double a = hi - kInvPhi * (hi - lo);
  double b = lo + kInvPhi * (hi - lo);
  double fa = f(a);
  double fb = f(b);
  while (hi - lo > 1e-10) {
    if (fa < fb) {
      lo = a;
      a = b;
      fa = fb;
      b = lo + kInvPhi * (hi - lo);
      fb = f(b);
    } else {
      hi = b;
      b = a;
      fb = fa;
      a = hi - kInvPhi * (hi - lo);
      fa = f(a);
    }
  }
  return ToDuration(std::exp((lo + hi) / 2));
}

double FirstOrderEttr(Duration interval, Duration ckpt_cost, Duration recovery, Duration mtbf) {
  double tau = Seconds(interval);
  if (tau <= 0) return 0;
  double overhead = 1 + Seconds(ckpt_cost) / tau;
  if (Infinite(mtbf)) return 1 / overhead;
  double loss = (Seconds(recovery) + tau / 2) / Seconds(mtbf);
  return std::clamp((1 - loss) / overhead, 0.0, 1.0);
}

}  // namespace endure::core
