// Closed-form reliability models for a job that checkpoints periodically and
// loses the work since its last checkpoint on every failure: MTTF, Young's and
// Daly's optimal checkpoint intervals, the exact expected ETTR under Poisson
// failures and the first-order ETTR approximation. The simulator is validated
// against them and `endure sim --analytic` prints them. Pure functions.
//
// Symbols (papers.md section 11): M = mean time between failures of the whole
// job, tau = compute time between checkpoints, delta = blocking checkpoint
// write cost, R = time from a failure until training runs again (detection +
// restart; a failure during R starts R over).
#pragma once

#include <cstdint>

#include "common/duration.h"

namespace endure::core {

// Returned by Mttf for a zero failure rate.
inline constexpr Duration kNeverFails = Duration::max();

// MTTF of a job on `nodes` nodes that each fail as a Poisson process at
// `failures_per_1000_node_days`: 1 / (nodes * rate). kNeverFails for rate 0.
Duration Mttf(int64_t nodes, double failures_per_1000_node_days);

// Young (1974): tau = sqrt(2 * delta * M).
Duration YoungInterval(Duration ckpt_cost, Duration mtbf);

// Daly (2006), eq. 37: for delta < 2M,
// tau = sqrt(2 delta M) * (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9) - delta; else tau = M.
Duration DalyInterval(Duration ckpt_cost, Duration mtbf);

// Exact long-run ETTR for Poisson failures (renewal argument, the restart can
// itself fail): tau / (M * e^{R/M} * (e^{(tau+delta)/M} - 1)). With no
// failures it is tau / (tau + delta). Computed in log space so that it
// underflows to 0 instead of overflowing.
double ExactEttr(Duration interval, Duration ckpt_cost, Duration recovery, Duration mtbf);

// The interval that maximizes ExactEttr, found numerically (golden-section
// search on log tau; relative precision about 1e-9).
Duration ExactOptimalInterval(Duration ckpt_cost, Duration recovery, Duration mtbf);

// First-order ETTR (Kokolis et al. 2025):
// (1 - (R + tau/2) / M) / (1 + delta / tau), clamped to [0, 1].
double FirstOrderEttr(Duration interval, Duration ckpt_cost, Duration recovery, Duration mtbf);

}  // namespace endure::core
