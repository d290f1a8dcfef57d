// What `endure sim` simulates: the job (nodes, duration), its failures (a
// Poisson rate per node and a table of causes, each with a detection latency,
// a recovery path and a repair time), checkpointing, restart costs, warm
// spares, stragglers and the recovery policy's knobs. A SimConfig is built
// from defaults, then a TOML scenario file, then command-line flags; every
// knob has one name, used both as the flag (`--ckpt-interval`) and as the
// TOML key (`ckpt-interval = "30m"`). Errors name the flag, or the file, line
// and key that set the bad value.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "core/recovery_policy.h"

namespace endure::sim {

// One failure cause of the mix.
struct CauseSpec {
  std::string name;
  double weight = 1;               // relative frequency (counts, not percentages)
  std::optional<Duration> detect;  // unset: SimConfig::detect
  core::RecoveryPath path = core::RecoveryPath::kRestartInPlace;
  std::optional<Duration> repair;  // unset: SimConfig::repair
};

// The cause name stragglers are reported under.
inline constexpr std::string_view kStragglerCause = "straggler";

struct SimConfig {
  // The job. `duration` is wall-clock (calendar) time: ETTR is the share of it
  // that was productive.
  int64_t nodes = 1024;
  int64_t gpus_per_node = 8;
  Duration duration = std::chrono::hours(24 * 30);

  // Failures per node, per 1000 node-days. Unset: 6.5 (Kokolis et al.,
  // RSC-1), or 3.79 with cause-mix llama3 (Llama 3 405B); see FailureRate().
  std::optional<double> failure_rate;
  std::string cause_mix = "none";  // "none": one generic cause; "llama3"
  // Resolved by Finalize(): the mix plus [cause.NAME] overrides.
  std::vector<CauseSpec> causes;

  // Checkpointing: `ckpt_interval` of training between checkpoints, each
  // blocking training for `ckpt_write`.
  Duration ckpt_interval = std::chrono::minutes(30);
  Duration ckpt_write = std::chrono::seconds(10);

  // Recovery costs. `startup` unset: equal to `restart`.
  Duration restart = std::chrono::minutes(5);
  Duration detect = std::chrono::seconds(30);
  std::optional<Duration> startup;
  Duration repair = std::chrono::hours(4);
  int64_t spares = 0;

  // Stragglers: each node that joins the job is slow with probability
  // `straggler_share`, slowing the whole job by `straggler_factor` until it
  // is detected `straggler_detect` after joining and replaced.
  double straggler_share = 0;
  double straggler_factor = 1.5;
  Duration straggler_detect = std::chrono::minutes(10);

  // Length of one training step, to report step numbers to the policy.
  Duration step_time = std::chrono::seconds(10);

  // Recovery policy (retry budget, backoff, isolation, paths per cause).
  core::RecoveryPolicyOptions policy;

  int64_t runs = 10;
  uint64_t seed = 1;
  bool seed_set = false;

  // Where each knob was last set ("--restart" or "job.toml:7: restart"),
  // so that errors point at it.
  std::map<std::string, std::string, std::less<>> origin;
  // --path CAUSE=PATH overrides, applied by Finalize().
  std::vector<std::pair<std::string, std::string>> path_overrides;
  // [cause.NAME] tables from the scenario, applied by Finalize().
  struct CauseOverride {
    CauseSpec spec;
    bool has_weight = false, has_detect = false, has_path = false, has_repair = false;
    std::string where;
  };
  std::vector<CauseOverride> cause_overrides;

  double FailureRate() const { return failure_rate.value_or(cause_mix == "llama3" ? 3.79 : 6.5); }
  Duration startup_or_restart() const { return startup.value_or(restart); }
  Duration DetectFor(const CauseSpec& c) const { return c.detect.value_or(detect); }
  Duration RepairFor(const CauseSpec& c) const { return c.repair.value_or(repair); }
  // "--name", or the file, line and key that set it.
  std::string Where(std::string_view knob) const;
};

// The names of all knobs, in the order --help lists them, with a help line.
struct KnobInfo {
  const char* name;
  const char* help;
  const char* value_name;  // for --help: N, X, DURATION, NAME
};
const std::vector<KnobInfo>& Knobs();

// Sets knob `name` from `text`; errors start with `where`.
Status SetKnob(SimConfig& config, std::string_view name, std::string_view text,
               std::string_view where);

// Loads a TOML scenario into `config`: top-level knobs and [cause.NAME]
// tables (weight, detect, path, repair). Unknown keys are errors with their line.
Status LoadScenarioFile(const std::string& path, SimConfig& config);
Status LoadScenarioString(std::string_view toml, const std::string& name, SimConfig& config);

// Built-in cause mixes: "none" (one generic cause restarting in place) and
// "llama3" (Llama 3 405B, Table 5, by count).
Result<std::vector<CauseSpec>> CauseMix(std::string_view name);

// Resolves the cause table and the policy's paths, then checks every knob and
// their combinations. Call once after all knobs are set.
Status Finalize(SimConfig& config);

}  // namespace endure::sim
