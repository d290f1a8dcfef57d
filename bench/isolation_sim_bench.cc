// What the mechanisms of issue 12 are worth at 12,500 nodes x 8 GPUs: the
// simulator's ETTR with and without straggler mitigation, the SDC check,
// multi-strike quarantine and the health check, each switched off alone
// (the others on), over the same seeds, with a 95% CI on the paired
// difference. The scenario: the Llama 3 cause mix at its 3.79 failures per
// 1000 node-days, 0.5% of joining nodes straggling at 1.1-1.5x (MegaScale
// saw about 0.5%), 0.05 SDCs per 1000 node-days, 0.2% flaky nodes, 64 warm
// spares, 5-minute checkpoints and 2-minute restarts, 30 days, 10 runs.
//
//   build-sim/bin/isolation_sim_bench [runs]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "sim/experiment.h"
#include "sim/scenario.h"

int main(int argc, char** argv) {
  using endure::sim::SimConfig;
  SimConfig c;
  const char* knobs[][2] = {
      {"nodes", "12500"},
      {"gpus-per-node", "8"},
      {"duration", "30d"},
      {"cause-mix", "llama3"},
      {"ckpt-interval", "5m"},
      {"ckpt-write", "5s"},
      {"restart", "2m"},
      {"detect", "30s"},
      {"repair", "12h"},
      {"spares", "64"},
      {"stragglers", "0.005"},
      {"straggler-factor", "1.1"},
      {"straggler-factor-max", "1.5"},
      {"sdc-rate", "0.05"},
      {"sdc-check-every", "100"},
      {"flaky-share", "0.002"},
      {"runs", argc > 1 ? argv[1] : "10"},
      {"seed", "1"},
  };
  std::string flags;
  for (const auto& [name, value] : knobs) {
    endure::Status s = endure::sim::SetKnob(c, name, value, std::string("--") + name);
    if (s.ok()) continue;
    std::fprintf(stderr, "isolation_sim_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  for (const auto& [name, value] : knobs) flags += std::string(" --") + name + " " + value;
  endure::Status s = endure::sim::Finalize(c);
  if (!s.ok()) {
    std::fprintf(stderr, "isolation_sim_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  auto start = std::chrono::steady_clock::now();
  endure::sim::Summary all = endure::sim::RunExperiment(c);
  std::printf("isolation_sim_bench: endure sim%s\n", flags.c_str());
  std::printf(
      "  all mechanisms on: ETTR %.4f [%.4f, %.4f]; per run: %.1f failures, %.1f "
      "stragglers (%.1f moved), %.1f SDCs (%.1f found by the check), %.1f quarantines, "
      "%.1f health-check refusals\n",
      all.ettr, all.ci95_low, all.ci95_high, all.failures, all.stragglers, all.straggler_moves,
      all.sdc_events, all.sdc_detected, all.quarantines, all.health_check_refusals);
  SimConfig none = c;
  for (endure::sim::Mechanism m : endure::sim::kMechanisms) {
    none = endure::sim::WithMechanism(none, m, false);
  }
  endure::sim::Summary bare = endure::sim::RunExperiment(none);
  std::printf("  all mechanisms off: ETTR %.4f [%.4f, %.4f]\n", bare.ettr, bare.ci95_low,
              bare.ci95_high);
  std::printf("  %-24s %-25s %-25s %s\n", "mechanism", "ETTR on", "ETTR off",
              "difference (paired)");
  for (const endure::sim::MechanismRow& r : endure::sim::CompareMechanisms(c)) {
    std::printf("  %-24s %.4f [%.4f, %.4f]  %.4f [%.4f, %.4f]  %+.4f [%+.4f, %+.4f]\n",
                std::string(endure::sim::MechanismName(r.mechanism)).c_str(), r.on.ettr,
                r.on.ci95_low, r.on.ci95_high, r.off.ettr, r.off.ci95_low, r.off.ci95_high, r.diff,
                r.diff_ci95_low, r.diff_ci95_high);
  }
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("  %.2f s for 10 experiments of %lld runs\n", elapsed,
              static_cast<long long>(c.runs));
  return 0;
}
