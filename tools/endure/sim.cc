// `endure sim`: simulates one large data-parallel training job under
// failures with Endure's own recovery policy and prints ETTR with its
// confidence interval, the ETTR ledger and the analytic models; `--analytic`
// prints only the models, `--sweep` compares simulation and models over a
// range of one parameter and writes CSV and SVG; `--compare-mechanisms`
// prints what each mechanism of issue 12 is worth (ETTR on and off). The work is in src/sim;
// this file parses flags and formats output.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/duration.h"
#include "common/env.h"
#include "common/svg_chart.h"
#include "core/analytic.h"
#include "sim/experiment.h"
#include "sim/scenario.h"
#include "tools/endure/verbs.h"

namespace endure::cli {
namespace {

using core::LedgerCategory;
using sim::SimConfig;
using Json = nlohmann::ordered_json;

struct SimFlags {
  std::vector<std::pair<std::string, std::string>> knobs;  // name, value as given
  std::string scenario;
  std::vector<std::string> paths;
  bool json = false;
  bool analytic = false;
  std::string sweep;
  std::string csv = "sim_sweep.csv";
  std::string svg = "sim_sweep.svg";
  int incidents = 0;
  bool compare = false;
};

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string Dur(Duration d) { return d == core::kNeverFails ? "never" : FormatDuration(d); }

Json DurationSeconds(Duration d) {
  if (d == core::kNeverFails) return nullptr;
  return Seconds(d);
}

Result<SimConfig> BuildConfig(const SimFlags& flags) {
  SimConfig c;
  if (!flags.scenario.empty()) ENDURE_RETURN_IF_ERROR(sim::LoadScenarioFile(flags.scenario, c));
  for (const auto& [name, value] : flags.knobs) {
    ENDURE_RETURN_IF_ERROR(sim::SetKnob(c, name, value, "--" + name));
  }
  for (const std::string& p : flags.paths) {
    size_t eq = p.find('=');
    if (eq == std::string::npos) {
      return InvalidArgument("--path: expected CAUSE=restart|evict|wait, got '" + p + "'");
    }
    c.path_overrides.emplace_back(p.substr(0, eq), p.substr(eq + 1));
  }
  if (!c.seed_set) {
    std::random_device rd;
    c.seed = (static_cast<uint64_t>(rd()) << 32 | rd()) % 1000000000;
  }
  ENDURE_RETURN_IF_ERROR(sim::Finalize(c));
  return c;
}

std::string SeedLine(const SimConfig& c) {
  return "seed " + std::to_string(c.seed) +
         (c.seed_set ? "" : " (random; pass --seed " + std::to_string(c.seed) + " to reproduce)");
}

void PrintHeader(const SimConfig& c) {
  std::printf(
      "endure sim: %lld nodes x %lld GPUs (%lld GPUs), %s wall-clock per run, %lld runs, %s\n",
      static_cast<long long>(c.nodes), static_cast<long long>(c.gpus_per_node),
      static_cast<long long>(c.nodes * c.gpus_per_node), FormatDuration(c.duration).c_str(),
      static_cast<long long>(c.runs), SeedLine(c).c_str());
  std::printf(
      "  failures %.3g per 1000 node-days (cause mix %s: %zu cause%s); checkpoint every %s, write "
      "%s;\n"
      "  restart %s, detect %s, repair %s, spares %lld",
      c.FailureRate(), c.cause_mix.c_str(), c.causes.size(), c.causes.size() == 1 ? "" : "s",
      FormatDuration(c.ckpt_interval).c_str(), FormatDuration(c.ckpt_write).c_str(),
      FormatDuration(c.restart).c_str(), FormatDuration(c.detect).c_str(),
      FormatDuration(c.repair).c_str(), static_cast<long long>(c.spares));
  std::printf("\n");
  if (c.straggler_share > 0) {
    std::printf(
        "  stragglers %.3g%% of joining nodes at %.3g-%.3gx, flagged above %.3gx after %lld "
        "steps, mitigation %s\n",
        100 * c.straggler_share, c.straggler_factor, c.StragglerFactorMax(), 1 + c.straggler_theta,
        static_cast<long long>(c.straggler_window), c.straggler_mitigation ? "on" : "off");
  }
  if (c.sdc_rate > 0) {
    if (c.sdc_check_every > 0) {
      std::printf("  SDC %.3g per 1000 node-days, checked every %lld steps\n", c.sdc_rate,
                  static_cast<long long>(c.sdc_check_every));
    } else {
      std::printf("  SDC %.3g per 1000 node-days, no check (a loss spike shows it after %s)\n",
                  c.sdc_rate, FormatDuration(c.sdc_undetected_cost).c_str());
    }
  }
  std::printf("  multi-strike quarantine %s (%lld soft strikes in %s)",
              c.multi_strike ? "on" : "off", static_cast<long long>(c.soft_strikes),
              FormatDuration(c.soft_window).c_str());
  if (c.flaky_share > 0) {
    std::printf(", flaky nodes %.3g%% (%.3gx soft failures)", 100 * c.flaky_share, c.flaky_factor);
  }
  if (c.health_check) {
    std::printf(", health check %s (recall %.2g)", FormatDuration(c.health_check_time).c_str(),
                c.health_check_recall);
  } else {
    std::printf(", no health check");
  }
  std::printf("\n\n");
}

void PrintAnalytic(const SimConfig& c, const sim::AnalyticSummary& a) {
  std::printf("analytic models (R = %s: detection + restart%s)\n", Dur(a.recovery).c_str(),
              c.causes.size() > 1 ? ", weight-averaged over causes" : "");
  std::printf("  job MTTF = 1/(nodes x rate)    %s\n", Dur(a.mttf).c_str());
  std::printf("  Young interval sqrt(2 d M)     %s\n", Dur(a.young).c_str());
  std::printf("  Daly interval (eq. 37)         %s\n", Dur(a.daly).c_str());
  std::printf("  exact-optimal interval         %s (ETTR %.4f)\n", Dur(a.exact_optimum).c_str(),
              a.exact_ettr_at_optimum);
  std::printf("  exact ETTR at %-16s %.4f\n", FormatDuration(c.ckpt_interval).c_str(),
              a.exact_ettr);
  std::printf("  first-order ETTR at %-10s %.4f\n", FormatDuration(c.ckpt_interval).c_str(),
              a.first_order_ettr);
}

Json AnalyticJson(const sim::AnalyticSummary& a) {
  return Json{{"mttf_s", DurationSeconds(a.mttf)},
              {"recovery_s", DurationSeconds(a.recovery)},
              {"young_interval_s", DurationSeconds(a.young)},
              {"daly_interval_s", DurationSeconds(a.daly)},
              {"exact_optimal_interval_s", DurationSeconds(a.exact_optimum)},
              {"exact_ettr", a.exact_ettr},
              {"exact_ettr_at_optimum", a.exact_ettr_at_optimum},
              {"first_order_ettr", a.first_order_ettr}};
}

Json ConfigJson(const SimConfig& c) {
  return Json{{"nodes", c.nodes},
              {"gpus_per_node", c.gpus_per_node},
              {"duration_s", Seconds(c.duration)},
              {"failure_rate_per_1000_node_days", c.FailureRate()},
              {"cause_mix", c.cause_mix},
              {"ckpt_interval_s", Seconds(c.ckpt_interval)},
              {"ckpt_write_s", Seconds(c.ckpt_write)},
              {"restart_s", Seconds(c.restart)},
              {"detect_s", Seconds(c.detect)},
              {"startup_s", Seconds(c.startup_or_restart())},
              {"repair_s", Seconds(c.repair)},
              {"spares", c.spares},
              {"in_process", c.in_process},
              {"in_process_restart_s", Seconds(c.in_process_restart)},
              {"min_nodes", c.min_nodes},
              {"stragglers", c.straggler_share},
              {"straggler_factor", c.straggler_factor},
              {"straggler_factor_max", c.StragglerFactorMax()},
              {"straggler_window", c.straggler_window},
              {"straggler_theta", c.straggler_theta},
              {"straggler_mitigation", c.straggler_mitigation},
              {"sdc_rate_per_1000_node_days", c.sdc_rate},
              {"sdc_check_every", c.sdc_check_every},
              {"sdc_undetected_cost_s", Seconds(c.sdc_undetected_cost)},
              {"multi_strike", c.multi_strike},
              {"soft_strikes", c.soft_strikes},
              {"soft_window_s", Seconds(c.soft_window)},
              {"flaky_share", c.flaky_share},
              {"flaky_factor", c.flaky_factor},
              {"health_check", c.health_check},
              {"health_check_time_s", Seconds(c.health_check_time)},
              {"health_check_recall", c.health_check_recall},
              {"runs", c.runs},
              {"seed", c.seed}};
}

int RunAnalytic(const SimConfig& c, bool json) {
  sim::AnalyticSummary a = sim::Analyze(c);
  if (json) {
    Json out = AnalyticJson(a);
    out["config"] = ConfigJson(c);
    std::printf("%s\n", out.dump().c_str());
  } else {
    PrintHeader(c);
    PrintAnalytic(c, a);
  }
  return kExitOk;
}

int RunSimulation(const SimConfig& c, const SimFlags& flags) {
  auto start = std::chrono::steady_clock::now();
  sim::Summary s = sim::RunExperiment(c, flags.incidents);
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  sim::AnalyticSummary a = sim::Analyze(c);
  double events_per_s = elapsed > 0 ? static_cast<double>(s.events) / elapsed : 0;

  if (flags.json) {
    Json ledger = Json::object();
    for (int i = 0; i < core::kNumLedgerCategories; ++i) {
      ledger[std::string(core::LedgerCategoryName(static_cast<LedgerCategory>(i)))] = s.ledger_s[i];
    }
    Json causes = Json::object();
    for (size_t i = 0; i < c.causes.size(); ++i) causes[c.causes[i].name] = s.failures_by_cause[i];
    Json out{{"ettr", s.ettr},
             {"ettr_ci95", c.runs > 1 ? Json::array({s.ci95_low, s.ci95_high}) : Json(nullptr)},
             {"ettr_stderr", s.ettr_stderr},
             {"failures", s.failures},
             {"wall_s", s.wall_s},
             {"productive_s", s.productive_s},
             {"mttf_s", DurationSeconds(a.mttf)},
             {"ledger_s", ledger},
             {"failures_by_cause", causes},
             {"restarts", s.restarts},
             {"in_process_restarts", s.in_process_restarts},
             {"shrinks", s.shrinks},
             {"regrows", s.regrows},
             {"replacements", s.replacements},
             {"stragglers", s.stragglers},
             {"stragglers_flagged", s.stragglers_flagged},
             {"straggler_moves", s.straggler_moves},
             {"sdc_events", s.sdc_events},
             {"sdc_detected", s.sdc_detected},
             {"sdc_undetected", s.sdc_undetected},
             {"quarantines", s.quarantines},
             {"health_check_refusals", s.health_check_refusals},
             {"gave_up_runs", s.gave_up},
             {"stop_reason", s.first_stop_reason},
             {"runs", s.runs},
             {"seed", c.seed},
             {"analytic", AnalyticJson(a)},
             {"config", ConfigJson(c)},
             {"events", s.events},
             {"events_per_s", events_per_s},
             {"elapsed_s", elapsed}};
    std::printf("%s\n", out.dump().c_str());
    return kExitOk;
  }

  PrintHeader(c);
  if (c.runs > 1) {
    std::printf("ETTR        %.4f   95%% CI [%.4f, %.4f] over %lld runs (stderr %.4f)\n", s.ettr,
                s.ci95_low, s.ci95_high, static_cast<long long>(s.runs), s.ettr_stderr);
  } else {
    std::printf("ETTR        %.4f   (one run: no confidence interval)\n", s.ettr);
  }
  std::printf("failures    %.1f per run (restarts %.1f, nodes replaced %.1f", s.failures,
              s.restarts, s.replacements);
  if (c.in_process) std::printf(", in process %.1f", s.in_process_restarts);
  if (c.min_nodes > 0) std::printf(", shrunk %.1f, grown back %.1f", s.shrinks, s.regrows);
  std::printf(")\n");
  if (c.straggler_share > 0) {
    std::printf("stragglers  %.1f per run joined, %.1f flags, %.1f swapped or evicted\n",
                s.stragglers, s.stragglers_flagged, s.straggler_moves);
  }
  if (c.sdc_rate > 0) {
    std::printf("SDC         %.1f per run: %.1f found by the check, %.1f by a loss spike\n",
                s.sdc_events, s.sdc_detected, s.sdc_undetected);
  }
  if (s.quarantines > 0 || s.health_check_refusals > 0 || c.flaky_share > 0) {
    std::printf("isolation   %.1f quarantines per run, %.1f nodes refused by the health check\n",
                s.quarantines, s.health_check_refusals);
  }
  std::printf("productive  %s of %s wall per run\n",
              FormatDuration(FromSeconds(s.productive_s)).c_str(),
              FormatDuration(FromSeconds(s.wall_s)).c_str());
  if (s.gave_up > 0) {
    std::printf("GAVE UP in %lld of %lld runs; first: %s\n", static_cast<long long>(s.gave_up),
                static_cast<long long>(s.runs), s.first_stop_reason.c_str());
  }
  std::printf("\nETTR ledger (mean per run)\n");
  for (int i = 0; i < core::kNumLedgerCategories; ++i) {
    std::printf("  %-17s %10s  %6.2f%%\n",
                std::string(core::LedgerCategoryName(static_cast<LedgerCategory>(i))).c_str(),
                FormatDuration(FromSeconds(s.ledger_s[i])).c_str(),
                s.wall_s > 0 ? 100 * s.ledger_s[i] / s.wall_s : 0);
  }
  if (c.causes.size() > 1) {
    std::printf("\nfailures by cause (mean per run)\n");
    for (size_t i = 0; i < c.causes.size(); ++i) {
      std::printf("  %-29s %7.1f  %s\n", c.causes[i].name.c_str(), s.failures_by_cause[i],
                  std::string(core::RecoveryPathName(c.causes[i].path)).c_str());
    }
  }
  if (!s.incidents.empty()) {
    std::printf("\nfirst %zu decisions of run 0\n", s.incidents.size());
    for (const sim::Incident& in : s.incidents) {
      std::printf("  %9s  %s %s: %s\n", FormatDuration(in.time).c_str(),
                  std::string(sim::IncidentKindName(in.kind)).c_str(), in.action.c_str(),
                  in.reason.c_str());
    }
  }
  std::printf("\n");
  PrintAnalytic(c, a);
  std::printf("\nsimulated %lld events in %.3f s (%.3g events/s)\n",
              static_cast<long long>(s.events), elapsed, events_per_s);
  return kExitOk;
}

// The analytic models at one value `x` of the swept parameter (in the
// sweep's unit: minutes for durations); nullopt where the value is not a
// valid setting (an interval shorter than the write cost). `x` is moved to
// the value actually set (an integer knob rounds it).
std::optional<sim::AnalyticSummary> AnalyticAt(const SimConfig& base, const sim::SweepSpec& spec,
                                               double& x) {
  std::vector<std::string> texts;
  std::vector<double> xs;
  if (spec.column.ends_with("_min")) {  // a duration, as ParseSweep writes them
    const auto ns = static_cast<int64_t>(std::llround(x * 60e9));
    texts.push_back(std::to_string(ns) + "ns");
    xs.push_back(static_cast<double>(ns) / 60e9);
  } else {
    texts.push_back(Fmt("%.12g", x));
    xs.push_back(x);
    texts.push_back(std::to_string(std::llround(x)));  // integer knobs
    xs.push_back(static_cast<double>(std::llround(x)));
  }
  for (size_t i = 0; i < texts.size(); ++i) {
    SimConfig c = base;
    if (!sim::SetKnob(c, spec.param, texts[i], "--sweep").ok()) continue;
    if (!sim::Finalize(c).ok()) return std::nullopt;
    x = xs[i];
    return sim::Analyze(c);
  }
  return std::nullopt;
}

// The sweep's plot (--svg): the simulated points with their 95% intervals,
// and the exact and first-order models drawn densely between and around
// them, so that the exact curve shows its own optimum, which is marked (the
// exact-optimal interval for an interval sweep; otherwise the best point
// of the curve when it lies inside the range).
std::string SweepPlot(const SimConfig& base, const sim::SweepSpec& spec,
                      const std::vector<sim::SweepRow>& rows, const std::string& title) {
  constexpr int kCurvePoints = 241;
  double x_lo = INFINITY, x_hi = -INFINITY;
  for (const sim::SweepRow& r : rows) {
    x_lo = std::min(x_lo, r.x);
    x_hi = std::max(x_hi, r.x);
  }
  chart::LineChart plot;
  plot.id = "sweep";
  plot.title = title;
  plot.x_label = spec.x_label;
  plot.y_label = "ETTR";
  plot.width = 860;
  plot.height = 480;
  if (rows.empty()) return chart::RenderLineChart(plot);

  // Where the exact model peaks: for an interval sweep the model knows
  // (its optimum does not depend on the interval).
  std::optional<double> optimum_x;
  const sim::AnalyticSummary& first = rows.front().analytic;
  if (spec.param == "ckpt-interval" && first.exact_optimum != core::kNeverFails) {
    optimum_x = Seconds(first.exact_optimum) / 60;
  }
  std::vector<double> xs;
  for (int i = 0; i < kCurvePoints; ++i) {
    xs.push_back(x_hi > x_lo ? x_lo + (x_hi - x_lo) * i / (kCurvePoints - 1) : x_lo);
  }
  if (optimum_x && *optimum_x > x_lo && *optimum_x < x_hi) xs.push_back(*optimum_x);
  std::sort(xs.begin(), xs.end());
  chart::Series exact{"exact analytic", {}, {}, "#1f77b4"};
  chart::Series first_order{"first-order", {}, {}, "#2ca02c", chart::LineStyle::kDashed};
  for (double x : xs) {
    std::optional<sim::AnalyticSummary> a = AnalyticAt(base, spec, x);
    exact.x.push_back(x);
    first_order.x.push_back(x);
    exact.y.push_back(a ? a->exact_ettr : NAN);
    first_order.y.push_back(a ? a->first_order_ettr : NAN);
  }
  chart::Series simulated{"simulated (95% CI)", {}, {}, "#d62728", chart::LineStyle::kPoints};
  for (const sim::SweepRow& r : rows) {
    simulated.x.push_back(r.x);
    simulated.y.push_back(r.sim.ettr);
    simulated.y_low.push_back(r.sim.ci95_low);
    simulated.y_high.push_back(r.sim.ci95_high);
  }

  // The marker, at the optimum the model names, or at the curve's best
  // sample when that is inside the range (at an end it is no optimum).
  std::optional<chart::Marker> marker;
  if (optimum_x) {
    if (*optimum_x >= x_lo && *optimum_x <= x_hi) {
      marker = chart::Marker{*optimum_x, first.exact_ettr_at_optimum,
                             "exact optimum " + Fmt("%.1f", *optimum_x) + " min, ETTR " +
                                 Fmt("%.4f", first.exact_ettr_at_optimum)};
    } else {
      plot.title += " (exact optimum " + Fmt("%.1f", *optimum_x) + " min: outside the range)";
    }
  } else {
    size_t best = 0;
    for (size_t i = 1; i < exact.y.size(); ++i) {
      if (std::isfinite(exact.y[i]) && !(exact.y[i] <= exact.y[best])) best = i;
    }
    if (best > 0 && best + 1 < exact.y.size() && std::isfinite(exact.y[best])) {
      marker = chart::Marker{exact.x[best], exact.y[best],
                             "analytic optimum " + Fmt("%.4g", exact.x[best]) + ", ETTR " +
                                 Fmt("%.4f", exact.y[best])};
    }
  }
  if (marker) {
    marker->color = "#555";
    plot.markers.push_back(*marker);
  }

  // ETTR axis: the simulated intervals and the exact curve, on round ticks
  // within [0, 1]; the first-order curve is clipped where it falls below.
  double y_lo = 1, y_hi = 0;
  for (const sim::SweepRow& r : rows) {
    y_lo = std::min({y_lo, r.sim.ci95_low, r.sim.ettr});
    y_hi = std::max({y_hi, r.sim.ci95_high, r.sim.ettr});
  }
  for (double y : exact.y) {
    if (!std::isfinite(y)) continue;
    y_lo = std::min(y_lo, y);
    y_hi = std::max(y_hi, y);
  }
  const double pad = std::max(0.01, (y_hi - y_lo) * 0.08);
  y_lo = std::max(0.0, y_lo - pad);
  y_hi = std::min(1.0, y_hi + pad);
  if (y_hi <= y_lo) y_hi = std::min(1.0, y_lo + 0.01);
  const std::vector<double> ticks = chart::NiceTicks(y_lo, y_hi);
  if (ticks.size() >= 2) {
    const double step = ticks[1] - ticks[0];
    y_lo = std::max(0.0, std::floor(y_lo / step) * step);
    y_hi = std::min(1.0, std::ceil(y_hi / step) * step);
  }
  plot.y_min = y_lo;
  plot.y_max = y_hi;
  // A little room either side, so that the points at the ends show whole.
  const double margin = x_hi > x_lo ? (x_hi - x_lo) * 0.02 : 0;
  plot.x_min = x_lo - margin;
  plot.x_max = x_hi + margin;
  plot.series = {std::move(exact), std::move(first_order), std::move(simulated)};
  return chart::RenderLineChart(plot);
}

int RunSweep(const SimConfig& c, const SimFlags& flags) {
  Result<sim::SweepSpec> spec = sim::ParseSweep(flags.sweep);
  if (!spec.ok()) {
    std::fprintf(stderr, "endure sim: %s\n", spec.status().message().c_str());
    return kExitUsage;
  }
  Result<std::vector<sim::SweepRow>> rows = sim::RunSweep(c, *spec);
  if (!rows.ok()) {
    std::fprintf(stderr, "endure sim: %s\n", rows.status().message().c_str());
    return kExitUsage;
  }
  std::string title = "ETTR vs " + spec->param + ": " + std::to_string(c.nodes) + " nodes, " +
                      Fmt("%.3g", c.FailureRate()) + " failures/1000 node-days";
  for (const auto& [path, text] : {std::pair{flags.csv, sim::SweepCsv(*spec, *rows)},
                                   std::pair{flags.svg, SweepPlot(c, *spec, *rows, title)}}) {
    Status st = WriteFileAtomically(Env::Default(), path, text);
    if (!st.ok()) {
      std::fprintf(stderr, "endure sim: writing %s: %s\n", path.c_str(), st.message().c_str());
      return kExitInternal;
    }
  }
  if (flags.json) {
    Json out = Json::array();
    for (const sim::SweepRow& r : *rows) {
      out.push_back(Json{{spec->param, r.x},
                         {"ettr", r.sim.ettr},
                         {"ettr_ci95", Json::array({r.sim.ci95_low, r.sim.ci95_high})},
                         {"ettr_exact", r.analytic.exact_ettr},
                         {"ettr_first_order", r.analytic.first_order_ettr},
                         {"failures", r.sim.failures}});
    }
    std::printf("%s\n",
                Json{{"param", spec->param}, {"seed", c.seed}, {"rows", out}}.dump().c_str());
    return kExitOk;
  }
  PrintHeader(c);
  std::printf("%-18s %8s %19s %8s %8s %9s\n", spec->column.c_str(), "sim ETTR", "95% CI", "exact",
              "1st-ord", "failures");
  for (const sim::SweepRow& r : *rows) {
    std::printf("%-18s %8.4f   [%.4f, %.4f] %8.4f %8.4f %9.1f\n", Fmt("%.4g", r.x).c_str(),
                r.sim.ettr, r.sim.ci95_low, r.sim.ci95_high, r.analytic.exact_ettr,
                r.analytic.first_order_ettr, r.sim.failures);
  }
  sim::AnalyticSummary a = sim::Analyze(c);
  std::printf("\nexact-optimal interval %s (ETTR %.4f), Young %s, Daly %s\n",
              Dur(a.exact_optimum).c_str(), a.exact_ettr_at_optimum, Dur(a.young).c_str(),
              Dur(a.daly).c_str());
  std::printf("wrote %s and %s\n", flags.csv.c_str(), flags.svg.c_str());
  return kExitOk;
}

int RunCompare(const SimConfig& c, const SimFlags& flags) {
  auto start = std::chrono::steady_clock::now();
  std::vector<sim::MechanismRow> rows = sim::CompareMechanisms(c);
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (flags.json) {
    Json out = Json::array();
    for (const sim::MechanismRow& r : rows) {
      out.push_back(Json{{"mechanism", std::string(sim::MechanismName(r.mechanism))},
                         {"knob", std::string(sim::MechanismKnob(r.mechanism))},
                         {"ettr_on", r.on.ettr},
                         {"ettr_on_ci95", Json::array({r.on.ci95_low, r.on.ci95_high})},
                         {"ettr_off", r.off.ettr},
                         {"ettr_off_ci95", Json::array({r.off.ci95_low, r.off.ci95_high})},
                         {"difference", r.diff},
                         {"difference_ci95", Json::array({r.diff_ci95_low, r.diff_ci95_high})},
                         {"gave_up_runs_on", r.on.gave_up},
                         {"gave_up_runs_off", r.off.gave_up}});
    }
    std::printf("%s\n", Json{{"seed", c.seed},
                             {"runs", c.runs},
                             {"config", ConfigJson(c)},
                             {"mechanisms", out},
                             {"elapsed_s", elapsed}}
                            .dump()
                            .c_str());
    return kExitOk;
  }
  PrintHeader(c);
  std::printf(
      "what each mechanism is worth: ETTR with it on and off, the others as set, same %lld "
      "seeds (95%% CI; the difference is paired)\n",
      static_cast<long long>(c.runs));
  std::printf("  %-24s %-25s %-25s %s\n", "mechanism", "ETTR on", "ETTR off", "difference");
  auto cell = [](const sim::Summary& s) {
    return Fmt("%.4f", s.ettr) + " [" + Fmt("%.4f", s.ci95_low) + ", " + Fmt("%.4f", s.ci95_high) +
           "]";
  };
  for (const sim::MechanismRow& r : rows) {
    std::printf("  %-24s %-25s %-25s %+.4f [%+.4f, %+.4f]\n",
                std::string(sim::MechanismName(r.mechanism)).c_str(), cell(r.on).c_str(),
                cell(r.off).c_str(), r.diff, r.diff_ci95_low, r.diff_ci95_high);
  }
  if (c.sdc_check_every == 0) {
    std::printf("  (SDC check on: every %lld steps, as --sdc-check-every is 0)\n",
                static_cast<long long>(sim::kDefaultSdcCheckEvery));
  }
  std::printf("\nsimulated %zu x 2 experiments in %.2f s\n", rows.size(), elapsed);
  return kExitOk;
}

int Run(const SimFlags& flags) {
  Result<SimConfig> config = BuildConfig(flags);
  if (!config.ok()) {
    std::fprintf(stderr, "endure sim: %s\n", config.status().message().c_str());
    return config.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitInternal;
  }
  if (flags.analytic) return RunAnalytic(*config, flags.json);
  if (!flags.sweep.empty()) return RunSweep(*config, flags);
  if (flags.compare) return RunCompare(*config, flags);
  return RunSimulation(*config, flags);
}

}  // namespace

Verb AddSimVerb(CLI::App& root) {
  auto flags = std::make_shared<SimFlags>();
  CLI::App* cmd = root.add_subcommand(
      "sim", "Simulate a large training job under failures: ETTR, ledger, analytic models");
  cmd->footer(
      "Simulates one data-parallel job under failures, driven by Endure's recovery policy, and "
      "prints ETTR (95% CI over --runs seeds), the ETTR ledger and the analytic models. Settings "
      "come from defaults, then --scenario FILE (TOML, keys named like the flags, plus "
      "[cause.NAME] tables), then flags. Durations: 500ms, 30s, 5m, 2h, 90d. See docs/sim.md.");
  // Each knob is kept as text and parsed by src/sim, so that TOML and flags
  // share one parser and one error format.
  auto knob_values = std::make_shared<std::vector<std::string>>(sim::Knobs().size());
  for (size_t i = 0; i < sim::Knobs().size(); ++i) {
    const sim::KnobInfo& k = sim::Knobs()[i];
    cmd->add_option(std::string("--") + k.name, (*knob_values)[i], k.help)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
        ->type_name(k.value_name);
  }
  cmd->add_option("--scenario", flags->scenario, "TOML scenario file (see scenarios/)")
      ->type_name("FILE");
  cmd->add_option("--path", flags->paths,
                  "recovery path of a cause: CAUSE=restart|evict|wait (repeatable)")
      ->type_name("CAUSE=PATH");
  cmd->add_flag("--json", flags->json, "print one JSON object");
  cmd->add_flag("--analytic", flags->analytic, "print only the analytic models");
  cmd->add_option(
      "--sweep", flags->sweep,
      "PARAM=FROM:TO:POINTS, e.g. ckpt-interval=1m:120m:30: simulated vs analytic ETTR");
  cmd->add_option("--csv", flags->csv, "where --sweep writes its CSV (default sim_sweep.csv)")
      ->type_name("FILE");
  cmd->add_option(
         "--svg", flags->svg,
         "where --sweep writes its plot: the simulated points, the analytic curves drawn densely "
         "and the optimum marked (default sim_sweep.svg)")
      ->type_name("FILE");
  cmd->add_option("--incidents", flags->incidents,
                  "print the first N recovery decisions of run 0 with their reasons")
      ->type_name("N");
  cmd->add_flag("--compare-mechanisms", flags->compare,
                "simulate with each mechanism (straggler mitigation, SDC check, multi-strike "
                "quarantine, health check) on and off: ETTR and the difference, 95% CI");
  Verb verb;
  verb.command = cmd;
  verb.run = [cmd, flags, knob_values] {
    for (size_t i = 0; i < sim::Knobs().size(); ++i) {
      std::string name = sim::Knobs()[i].name;
      if (cmd->count("--" + name) > 0) flags->knobs.emplace_back(name, (*knob_values)[i]);
    }
    return Run(*flags);
  };
  return verb;
}

}  // namespace endure::cli
