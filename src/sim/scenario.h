// What `endure sim` simulates: the job (nodes, duration), its failures (a
// Poisson rate per node and a table of causes, each with a detection latency,
// a recovery path and a repair time), checkpointing, restart costs, warm
// spares, the implicit failures of issue 12 (stragglers, silent data
// corruption, intermittently bad nodes) with the mechanisms against them
// (straggler mitigation, the SDC check, multi-strike quarantine, the health
// check) and the recovery policy's knobs. A SimConfig is built
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
#include "core/ids.h"
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

// The cause names stragglers, detected silent data corruption and refused
// health checks are reported under (core/node_health.h classes them).
inline constexpr std::string_view kStragglerCause = "straggler";
inline constexpr std::string_view kSdcCause = "sdc";
inline constexpr std::string_view kHealthCheckCause = "health_check_failed";

// One event of a scripted failure sequence, at a fixed time of the run (for
// tests that compare the simulator's decisions with the core's). Scripted
// events come on top of the random ones (set the rates to 0 for a pure
// script); an event on a node that is not in the job then is dropped.
struct ScriptedEvent {
  enum class Kind {
    kFailure,    // `node` fails with `cause` (a cause of the mix)
    kStraggler,  // `node` turns `factor` times slower
    kSdc,        // `node` corrupts its replica's parameters
  };
  Kind kind = Kind::kFailure;
  Duration at{0};
  core::NodeId node;
  std::string cause;
  double factor = 1;
};

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
  // In-process restart (core::ChooseRoute, as the controller decides): when
  // a failure leaves the other ranks running, they keep their state and only
  // the failed node's ranks restart (on a spare when the node is evicted),
  // taking the state from a peer: no work since the checkpoint is lost, and
  // the recovery costs `in_process_restart` instead of `restart`. Off: every
  // failure restarts from the newest checkpoint.
  bool in_process = false;
  Duration in_process_restart = std::chrono::seconds(30);
  // Elastic shrink and regrow (`[job] min_nodes`; needs in_process): a job
  // that loses nodes with no spare for them goes on with the nodes it has,
  // down to `min_nodes`, at the same global batch, so each step takes
  // nodes / (nodes in the job) as long (the lost share booked as other);
  // when a repaired node or a spare becomes free it grows back in process
  // (costing in_process_restart, nothing lost). 0: never shrinks (the job
  // waits for a spare or a repair).
  int64_t min_nodes = 0;

  // Stragglers: each node that joins the job is slow with probability
  // `straggler_share`, by a factor drawn uniformly from [straggler_factor,
  // straggler_factor_max]; the job runs at the slowest node's pace. One
  // slower than (1 + straggler_theta) is flagged `straggler_window` steps
  // (at the slowed step time) into each generation it is in; one below it
  // never is. core::DecideStraggler then keeps it, swaps in a spare or
  // evicts it and waits. Mitigation off: never flagged, it stays until it
  // fails for another reason.
  double straggler_share = 0;
  double straggler_factor = 1.5;
  std::optional<double> straggler_factor_max;  // unset: straggler_factor
  int64_t straggler_window = 20;
  double straggler_theta = 0.10;
  bool straggler_mitigation = true;

  // Silent data corruption: per-node events per 1000 node-days while the job
  // trains. With `sdc_check_every` > 0 steps the next check finds it, the
  // job rolls back to the newest checkpoint at or before the last agreed
  // check and the node is struck hard (quarantined). With 0 it stays
  // undetected until a loss spike shows it `sdc_undetected_cost` of training
  // later; then the job rolls back to before it and the node stays.
  double sdc_rate = 0;
  int64_t sdc_check_every = 0;
  Duration sdc_undetected_cost = std::chrono::hours(6);

  // Strikes and quarantine (core::JudgeNode): a failure strikes its node
  // as core::DecideFailure says (a hardware cause, of the class
  // core::StrikeClassOf; a hard one takes the node out at once); a node
  // quarantined by soft strikes leaves the job like an evicted one and comes
  // back repaired (strikes cleared) after `repair`. Off: no strikes are kept.
  bool multi_strike = true;
  int64_t soft_strikes = 3;
  Duration soft_window = std::chrono::hours(24);
  // Intermittently bad nodes: this share of the nodes fails with the soft,
  // non-software causes `flaky_factor` times as often; a repair cures it.
  double flaky_share = 0;
  double flaky_factor = 20;

  // The health check before a node joins or rejoins: `health_check_time`
  // is added to the start-up and to every restart that admits a new node; a
  // flaky node fails it with probability `health_check_recall` and goes to
  // repair instead (struck hard: health_check_failed).
  bool health_check = true;
  Duration health_check_time = std::chrono::seconds(60);
  double health_check_recall = 0.7;

  // A scripted failure sequence (tests), ordered by time by Finalize().
  std::vector<ScriptedEvent> script;

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
  double StragglerFactorMax() const { return straggler_factor_max.value_or(straggler_factor); }
  // "--name", or the file, line and key that set it.
  std::string Where(std::string_view knob) const;
};

// The names of all knobs, in the order --help lists them, with a help line.
struct KnobInfo {
  const char* name;
  const char* help;
  const char* value_name;  // for --help: N, X, DURATION, NAME, BOOL
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
