// Experiments, analytic summaries and sweeps; see experiment.h.
#include "sim/experiment.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/analytic.h"

namespace endure::sim {
namespace {

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// About five round tick values covering [lo, hi].
std::vector<double> Ticks(double lo, double hi) {
  double span = hi - lo;
  if (span <= 0) return {lo};
  double raw = span / 5;
  double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push_back(t);
  return ticks;
}

enum class SweepKind { kDuration, kDouble, kInt };

struct Sweepable {
  const char* name;
  SweepKind kind;
  const char* label;
};
constexpr Sweepable kSweepables[] = {
    {"ckpt-interval", SweepKind::kDuration, "checkpoint interval (min)"},
    {"ckpt-write", SweepKind::kDuration, "checkpoint write cost (min)"},
    {"restart", SweepKind::kDuration, "restart overhead (min)"},
    {"detect", SweepKind::kDuration, "detection latency (min)"},
    {"failure-rate", SweepKind::kDouble, "failures per 1000 node-days"},
    {"nodes", SweepKind::kInt, "nodes"},
    {"spares", SweepKind::kInt, "warm spares"},
};

Status BadSweep(const std::string& why) {
  return InvalidArgument("--sweep: " + why + " (write e.g. ckpt-interval=1m:120m:30)");
}

}  // namespace

double StudentT95(int64_t dof) {
  static constexpr double kTable[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306,
                                      2.262,  2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120,
                                      2.110,  2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
                                      2.060,  2.056, 2.052, 2.048, 2.045, 2.042};
  if (dof < 1) return 0;
  if (dof <= 30) return kTable[dof - 1];
  // Cornish-Fisher expansion around the normal quantile.
  const double z = 1.959964;
  double v = static_cast<double>(dof);
  return z + (z * z * z + z) / (4 * v) +
         (5 * std::pow(z, 5) + 16 * z * z * z + 3 * z) / (96 * v * v);
}

Summary RunExperiment(const SimConfig& config, int max_incidents) {
  Summary s;
  s.runs = config.runs;
  s.seed = config.seed;
  s.failures_by_cause.assign(config.causes.size(), 0);
  std::vector<double> ettrs;
  ettrs.reserve(config.runs);
  for (int64_t i = 0; i < config.runs; ++i) {
    RunResult r = SimulateRun(config, RunSeed(config.seed, i), i == 0 ? max_incidents : 0);
    ettrs.push_back(r.ettr());
    s.failures += r.failures;
    s.restarts += r.restarts;
    s.in_process_restarts += r.in_process_restarts;
    s.shrinks += r.shrinks;
    s.regrows += r.regrows;
    s.replacements += r.replacements;
    s.stragglers += r.stragglers;
    s.stragglers_flagged += r.stragglers_flagged;
    s.straggler_moves += r.straggler_moves;
    s.sdc_events += r.sdc_events;
    s.sdc_detected += r.sdc_detected;
    s.sdc_undetected += r.sdc_undetected;
    s.quarantines += r.quarantines;
    s.health_check_refusals += r.health_check_refusals;
    s.wall_s += Seconds(r.wall);
    for (int c = 0; c < core::kNumLedgerCategories; ++c) s.ledger_s[c] += Seconds(r.ledger[c]);
    for (size_t c = 0; c < r.failures_by_cause.size(); ++c) {
      s.failures_by_cause[c] += r.failures_by_cause[c];
    }
    s.events += r.events;
    if (r.gave_up && s.gave_up++ == 0) s.first_stop_reason = r.stop_reason;
    if (i == 0) s.incidents = std::move(r.incidents);
  }
  double n = static_cast<double>(config.runs);
  s.failures /= n;
  s.restarts /= n;
  s.in_process_restarts /= n;
  s.shrinks /= n;
  s.regrows /= n;
  s.replacements /= n;
  s.stragglers /= n;
  for (double* v : {&s.stragglers_flagged, &s.straggler_moves, &s.sdc_events, &s.sdc_detected,
                    &s.sdc_undetected, &s.quarantines, &s.health_check_refusals}) {
    *v /= n;
  }
  s.wall_s /= n;
  for (double& v : s.ledger_s) v /= n;
  for (double& v : s.failures_by_cause) v /= n;
  s.productive_s = s.ledger_s[static_cast<int>(core::LedgerCategory::kProductive)];
  for (double e : ettrs) s.ettr += e;
  s.ettr /= n;
  if (config.runs > 1) {
    double ss = 0;
    for (double e : ettrs) ss += (e - s.ettr) * (e - s.ettr);
    s.ettr_stddev = std::sqrt(ss / (n - 1));
    s.ettr_stderr = s.ettr_stddev / std::sqrt(n);
  }
  double half = StudentT95(config.runs - 1) * s.ettr_stderr;
  s.ci95_low = s.ettr - half;
  s.ci95_high = s.ettr + half;
  s.run_ettrs = std::move(ettrs);
  return s;
}

std::string_view MechanismName(Mechanism m) {
  switch (m) {
    case Mechanism::kStragglerMitigation:
      return "straggler mitigation";
    case Mechanism::kSdcCheck:
      return "SDC check";
    case Mechanism::kMultiStrike:
      return "multi-strike quarantine";
    case Mechanism::kHealthCheck:
      return "health check";
  }
  return "?";
}

std::string_view MechanismKnob(Mechanism m) {
  switch (m) {
    case Mechanism::kStragglerMitigation:
      return "straggler-mitigation";
    case Mechanism::kSdcCheck:
      return "sdc-check-every";
    case Mechanism::kMultiStrike:
      return "multi-strike";
    case Mechanism::kHealthCheck:
      return "health-check";
  }
  return "?";
}

SimConfig WithMechanism(SimConfig c, Mechanism m, bool on) {
  switch (m) {
    case Mechanism::kStragglerMitigation:
      c.straggler_mitigation = on;
      break;
    case Mechanism::kSdcCheck:
      c.sdc_check_every =
          on ? (c.sdc_check_every > 0 ? c.sdc_check_every : kDefaultSdcCheckEvery) : 0;
      break;
    case Mechanism::kMultiStrike:
      c.multi_strike = on;
      break;
    case Mechanism::kHealthCheck:
      c.health_check = on;
      break;
  }
  return c;
}

std::vector<MechanismRow> CompareMechanisms(const SimConfig& config) {
  std::vector<MechanismRow> rows;
  for (Mechanism m : kMechanisms) {
    MechanismRow row;
    row.mechanism = m;
    row.on = RunExperiment(WithMechanism(config, m, true));
    row.off = RunExperiment(WithMechanism(config, m, false));
    const double n = static_cast<double>(config.runs);
    std::vector<double> d;
    for (int64_t i = 0; i < config.runs; ++i)
      d.push_back(row.on.run_ettrs[i] - row.off.run_ettrs[i]);
    for (double x : d) row.diff += x;
    row.diff /= n;
    double half = 0;
    if (config.runs > 1) {
      double ss = 0;
      for (double x : d) ss += (x - row.diff) * (x - row.diff);
      half = StudentT95(config.runs - 1) * std::sqrt(ss / (n - 1)) / std::sqrt(n);
    }
    row.diff_ci95_low = row.diff - half;
    row.diff_ci95_high = row.diff + half;
    rows.push_back(std::move(row));
  }
  return rows;
}

AnalyticSummary Analyze(const SimConfig& c) {
  AnalyticSummary a;
  a.mttf = core::Mttf(c.nodes, c.FailureRate());
  double total_weight = 0;
  double recovery_s = 0;
  for (const CauseSpec& cause : c.causes) {
    double r = Seconds(c.DetectFor(cause) + c.restart);
    bool waits = cause.path == core::RecoveryPath::kWaitForRepair ||
                 (cause.path == core::RecoveryPath::kEvictAndReplace && c.spares == 0);
    if (waits) r += Seconds(c.RepairFor(cause));
    recovery_s += cause.weight * r;
    total_weight += cause.weight;
  }
  a.recovery = FromSeconds(total_weight > 0 ? recovery_s / total_weight : Seconds(c.restart));
  a.young = core::YoungInterval(c.ckpt_write, a.mttf);
  a.daly = core::DalyInterval(c.ckpt_write, a.mttf);
  a.exact_optimum = core::ExactOptimalInterval(c.ckpt_write, a.recovery, a.mttf);
  a.exact_ettr = core::ExactEttr(c.ckpt_interval, c.ckpt_write, a.recovery, a.mttf);
  a.exact_ettr_at_optimum =
      a.exact_optimum == core::kNeverFails
          ? 1.0
          : core::ExactEttr(a.exact_optimum, c.ckpt_write, a.recovery, a.mttf);
  a.first_order_ettr = core::FirstOrderEttr(c.ckpt_interval, c.ckpt_write, a.recovery, a.mttf);
  return a;
}

Result<SweepSpec> ParseSweep(std::string_view text) {
  size_t eq = text.find('=');
  if (eq == std::string_view::npos) return BadSweep("expected PARAM=FROM:TO:POINTS");
  std::string param(text.substr(0, eq));
  const Sweepable* sw = nullptr;
  for (const Sweepable& s : kSweepables) {
    if (param == s.name) sw = &s;
  }
  if (sw == nullptr) {
    std::string names;
    for (const Sweepable& s : kSweepables)
      names += (names.empty() ? "" : ", ") + std::string(s.name);
    return BadSweep("cannot sweep '" + param + "' (sweepable: " + names + ")");
  }
  std::string rest(text.substr(eq + 1));
  size_t c1 = rest.find(':');
  size_t c2 = c1 == std::string::npos ? c1 : rest.find(':', c1 + 1);
  if (c2 == std::string::npos) return BadSweep("expected FROM:TO:POINTS after '='");
  std::string from_text = rest.substr(0, c1);
  std::string to_text = rest.substr(c1 + 1, c2 - c1 - 1);
  std::string points_text = rest.substr(c2 + 1);
  char* end = nullptr;
  long points = std::strtol(points_text.c_str(), &end, 10);
  if (points_text.empty() || *end != '\0' || points < 1 || points > 10000) {
    return BadSweep("POINTS must be an integer from 1 to 10000, got '" + points_text + "'");
  }
  double from = 0, to = 0;
  if (sw->kind == SweepKind::kDuration) {
    Result<Duration> f = ParseDuration(from_text);
    if (!f.ok()) return BadSweep(f.status().message());
    Result<Duration> t = ParseDuration(to_text);
    if (!t.ok()) return BadSweep(t.status().message());
    from = static_cast<double>(f->count());
    to = static_cast<double>(t->count());
  } else {
    char* e1 = nullptr;
    char* e2 = nullptr;
    from = std::strtod(from_text.c_str(), &e1);
    to = std::strtod(to_text.c_str(), &e2);
    if (from_text.empty() || to_text.empty() || *e1 != '\0' || *e2 != '\0') {
      return BadSweep("FROM and TO must be numbers for " + param);
    }
  }
  SweepSpec spec;
  spec.param = param;
  spec.x_label = sw->label;
  spec.column = param;
  std::replace(spec.column.begin(), spec.column.end(), '-', '_');
  if (sw->kind == SweepKind::kDuration) spec.column += "_min";
  for (long i = 0; i < points; ++i) {
    double v = points == 1 ? from : from + (to - from) * static_cast<double>(i) / (points - 1);
    switch (sw->kind) {
      case SweepKind::kDuration: {
        auto ns = static_cast<int64_t>(std::llround(v));
        spec.values.push_back(std::to_string(ns) + "ns");
        spec.x.push_back(static_cast<double>(ns) / 60e9);
        break;
      }
      case SweepKind::kDouble: {
        std::ostringstream out;
        out.precision(12);
        out << v;
        spec.values.push_back(out.str());
        spec.x.push_back(v);
        break;
      }
      case SweepKind::kInt: {
        auto n = static_cast<int64_t>(std::llround(v));
        spec.values.push_back(std::to_string(n));
        spec.x.push_back(static_cast<double>(n));
        break;
      }
    }
  }
  return spec;
}

Result<std::vector<SweepRow>> RunSweep(const SimConfig& base, const SweepSpec& spec) {
  std::vector<SweepRow> rows;
  for (size_t i = 0; i < spec.values.size(); ++i) {
    SimConfig c = base;
    ENDURE_RETURN_IF_ERROR(SetKnob(c, spec.param, spec.values[i], "--sweep"));
    ENDURE_RETURN_IF_ERROR(Finalize(c));
    SweepRow row;
    row.x = spec.x[i];
    row.value = spec.values[i];
    row.sim = RunExperiment(c);
    row.analytic = Analyze(c);
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string SweepCsv(const SweepSpec& spec, const std::vector<SweepRow>& rows) {
  std::string out = spec.column +
                    ",ettr_sim,ettr_ci95_low,ettr_ci95_high,ettr_stderr,ettr_exact,"
                    "ettr_first_order,failures,runs\n";
  for (const SweepRow& r : rows) {
    out += Fixed(r.x, 6) + "," + Fixed(r.sim.ettr, 6) + "," + Fixed(r.sim.ci95_low, 6) + "," +
           Fixed(r.sim.ci95_high, 6) + "," + Fixed(r.sim.ettr_stderr, 6) + "," +
           Fixed(r.analytic.exact_ettr, 6) + "," + Fixed(r.analytic.first_order_ettr, 6) + "," +
           Fixed(r.sim.failures, 2) + "," + std::to_string(r.sim.runs) + "\n";
  }
  return out;
}

}  // namespace endure::sim
