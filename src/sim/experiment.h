// Many independent runs of one scenario and what they add up to: mean ETTR
// with a 95% confidence interval, mean failures and ledger, and the analytic
// models for the same parameters. Also the parameter sweep behind
// `endure sim --sweep` and its CSV and SVG renderings.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/duration.h"
#include "core/ettr_ledger.h"
#include "sim/scenario.h"
#include "sim/simulator.h"

namespace endure::sim {

struct Summary {
  int64_t runs = 0;
  uint64_t seed = 0;
  double ettr = 0;         // mean over runs
  double ettr_stddev = 0;  // sample standard deviation over runs
  double ettr_stderr = 0;  // ettr_stddev / sqrt(runs)
  double ci95_low = 0;     // Student-t 95% interval; equal to ettr for one run
  double ci95_high = 0;
  double failures = 0;  // mean per run
  double restarts = 0;
  double in_process_restarts = 0;  // of them, in process
  double shrinks = 0;              // recoveries that went on with fewer nodes
  double regrows = 0;              // growths back, in process
  double replacements = 0;         // nodes swapped into the job
  double stragglers = 0;
  double stragglers_flagged = 0;
  double straggler_moves = 0;
  double sdc_events = 0;
  double sdc_detected = 0;
  double sdc_undetected = 0;
  double quarantines = 0;
  double health_check_refusals = 0;
  double wall_s = 0;  // mean per run
  double productive_s = 0;
  std::array<double, core::kNumLedgerCategories> ledger_s{};  // mean seconds per category
  std::vector<double> failures_by_cause;  // mean per run, like SimConfig::causes
  int64_t gave_up = 0;                    // runs the policy stopped
  std::string first_stop_reason;
  int64_t events = 0;               // over all runs
  std::vector<Incident> incidents;  // of the first run
  std::vector<double> run_ettrs;    // by run index
};

// Runs config.runs simulations seeded RunSeed(config.seed, i). `config` must
// have passed Finalize().
Summary RunExperiment(const SimConfig& config, int max_incidents = 0);

// The mechanisms of issue 12 that `endure sim --compare-mechanisms` weighs.
enum class Mechanism { kStragglerMitigation, kSdcCheck, kMultiStrike, kHealthCheck };
inline constexpr Mechanism kMechanisms[] = {Mechanism::kStragglerMitigation, Mechanism::kSdcCheck,
                                            Mechanism::kMultiStrike, Mechanism::kHealthCheck};
// "straggler mitigation", "SDC check", "multi-strike quarantine", "health check".
std::string_view MechanismName(Mechanism m);
// The knob that switches it ("straggler-mitigation", "sdc-check-every", ...).
std::string_view MechanismKnob(Mechanism m);
// `config` with the mechanism on or off. The SDC check on is
// config.sdc_check_every, or kDefaultSdcCheckEvery steps where that is 0.
inline constexpr int64_t kDefaultSdcCheckEvery = 100;
SimConfig WithMechanism(SimConfig config, Mechanism m, bool on);

struct MechanismRow {
  Mechanism mechanism;
  Summary on, off;
  // Paired over the same seeds: mean of (on - off) per run, its 95% CI.
  double diff = 0, diff_ci95_low = 0, diff_ci95_high = 0;
};
// Runs the experiment with each mechanism on and off, the others as
// configured, over the same seeds. `config` must have passed Finalize().
std::vector<MechanismRow> CompareMechanisms(const SimConfig& config);

// Two-sided 95% quantile of Student's t with `dof` degrees of freedom.
double StudentT95(int64_t dof);

struct AnalyticSummary {
  Duration mttf{0};      // 1 / (nodes * rate); kNeverFails for rate 0
  Duration recovery{0};  // R: mean over causes of detection + waits + restart
  Duration young{0};
  Duration daly{0};
  Duration exact_optimum{0};
  double exact_ettr = 0;  // at config.ckpt_interval
  double exact_ettr_at_optimum = 0;
  double first_order_ettr = 0;  // at config.ckpt_interval
};

// The analytic models for `config` (Finalize()d). R is the weight-averaged
// recovery time of the causes: their detection latency, plus the repair time
// for causes that wait for one (evictions too when there are no spares), plus
// the restart. Exact for a single cause; stragglers and backoff are ignored.
AnalyticSummary Analyze(const SimConfig& config);

// --sweep PARAM=FROM:TO:POINTS, e.g. "ckpt-interval=1m:120m:30".
struct SweepSpec {
  std::string param;
  std::vector<std::string> values;  // as a flag would carry them
  std::vector<double> x;            // the same values, in minutes for durations
  std::string column;               // CSV and table column of x: "ckpt_interval_min"
  std::string x_label;              // plot axis: "checkpoint interval (min)"
};
// Errors name --sweep. Sweepable: ckpt-interval, ckpt-write, restart, detect,
// failure-rate, nodes, spares.
Result<SweepSpec> ParseSweep(std::string_view text);

struct SweepRow {
  double x = 0;
  std::string value;
  Summary sim;
  AnalyticSummary analytic;
};
// Runs the experiment at every point (same seeds at each point, so that the
// curve is smooth). Fails with an error naming --sweep when a point is invalid.
Result<std::vector<SweepRow>> RunSweep(const SimConfig& base, const SweepSpec& spec);

std::string SweepCsv(const SweepSpec& spec, const std::vector<SweepRow>& rows);

}  // namespace endure::sim
