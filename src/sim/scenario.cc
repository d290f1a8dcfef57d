// Scenario knobs, TOML loading, cause mixes and validation; see scenario.h.
#include "sim/scenario.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>

namespace endure::sim {
namespace {

using core::RecoveryPath;
using std::chrono::hours;
using std::chrono::minutes;

Status Bad(std::string_view where, const std::string& what) {
  return InvalidArgument(std::string(where) + ": " + what);
}

Result<int64_t> ParseInt(std::string_view text, std::string_view where) {
  std::string s(text);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || end != s.c_str() + s.size() || errno != 0) {
    return Bad(where, "expected an integer, got '" + s + "'");
  }
  return static_cast<int64_t>(v);
}

Result<double> ParseDouble(std::string_view text, std::string_view where) {
  std::string s(text);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) {
    return Bad(where, "expected a number, got '" + s + "'");
  }
  return v;
}

Result<Duration> ParseDurationAt(std::string_view text, std::string_view where) {
  Result<Duration> d = ParseDuration(text);
  if (!d.ok()) return Bad(where, d.status().message());
  return d;
}

Result<bool> ParseBool(std::string_view text, std::string_view where) {
  if (text == "true") return true;
  if (text == "false") return false;
  return Bad(where, "expected true or false, got '" + std::string(text) + "'");
}

enum class Kind { kInt, kDouble, kDuration, kString, kBool };

struct Knob {
  KnobInfo info;
  Kind kind;
  std::function<void(SimConfig&, int64_t, double, Duration, const std::string&)> set;
};

#define KNOB_INT(NAME, HELP, EXPR)                                                  \
  {                                                                                 \
    {NAME, HELP, "N"}, Kind::kInt,                                                  \
        [](SimConfig& c, int64_t v, double, Duration, const std::string&) { EXPR; } \
  }
#define KNOB_DOUBLE(NAME, HELP, EXPR)                                               \
  {                                                                                 \
    {NAME, HELP, "X"}, Kind::kDouble,                                               \
        [](SimConfig& c, int64_t, double v, Duration, const std::string&) { EXPR; } \
  }
#define KNOB_DURATION(NAME, HELP, EXPR)                                             \
  {                                                                                 \
    {NAME, HELP, "DURATION"}, Kind::kDuration,                                      \
        [](SimConfig& c, int64_t, double, Duration v, const std::string&) { EXPR; } \
  }

// Booleans travel in the int: 1 true, 0 false.
#define KNOB_BOOL(NAME, HELP, EXPR)                                                 \
  {                                                                                 \
    {NAME, HELP, "BOOL"}, Kind::kBool,                                              \
        [](SimConfig& c, int64_t v, double, Duration, const std::string&) { EXPR; } \
  }

const std::vector<Knob>& KnobTable() {
  static const std::vector<Knob> table = {
      KNOB_INT("nodes", "nodes in the job (default 1024)", c.nodes = v),
      KNOB_INT("gpus-per-node", "GPUs per node, for reporting (default 8)", c.gpus_per_node = v),
      KNOB_DURATION("duration", "wall-clock time simulated per run (default 30d)", c.duration = v),
      KNOB_DOUBLE("failure-rate",
                  "failures per 1000 node-days (default 6.5; 3.79 with --cause-mix llama3)",
                  c.failure_rate = v),
      {{"cause-mix", "failure causes: none (one generic cause) or llama3 (default none)", "NAME"},
       Kind::kString,
       [](SimConfig& c, int64_t, double, Duration, const std::string& v) { c.cause_mix = v; }},
      KNOB_DURATION("ckpt-interval", "training time between checkpoints (default 30m)",
                    c.ckpt_interval = v),
      KNOB_DURATION("ckpt-write", "time a checkpoint blocks training (default 10s)",
                    c.ckpt_write = v),
      KNOB_DURATION("restart", "restart overhead: teardown, relaunch, restore (default 5m)",
                    c.restart = v),
      KNOB_DURATION("detect", "detection latency of causes without their own (default 30s)",
                    c.detect = v),
      KNOB_DURATION("startup", "first launch until the first step (default: --restart)",
                    c.startup = v),
      KNOB_DURATION("repair", "time to repair an evicted node or a failed component (default 4h)",
                    c.repair = v),
      KNOB_INT("spares", "warm spare nodes: replace a node without waiting for repair (default 0)",
               c.spares = v),
      KNOB_BOOL("in-process",
                "restart in process where core::ChooseRoute can: the other ranks keep their "
                "state, no work is lost (default false)",
                c.in_process = v != 0),
      KNOB_DURATION("in-process-restart",
                    "recovery time of an in-process restart: rejoin and peer state (default 30s)",
                    c.in_process_restart = v),
      KNOB_INT("min-nodes",
               "elastic: go on with fewer nodes, down to this many, when no spare is left, and "
               "grow back when one is (needs --in-process; default 0: never)",
               c.min_nodes = v),
      KNOB_DOUBLE("stragglers", "share of nodes (0..1) that join slow (default 0)",
                  c.straggler_share = v),
      KNOB_DOUBLE("straggler-factor", "how many times slower a straggler makes the job (1.5)",
                  c.straggler_factor = v),
      KNOB_DOUBLE("straggler-factor-max",
                  "stragglers' factors are uniform in [--straggler-factor, this] (default: equal)",
                  c.straggler_factor_max = v),
      KNOB_INT("straggler-window",
               "steps (at the slowed step time) until a straggler is flagged (default 20)",
               c.straggler_window = v),
      KNOB_DOUBLE("straggler-theta",
                  "a node slower than 1+theta is flagged; below, never (default 0.1)",
                  c.straggler_theta = v),
      KNOB_BOOL("straggler-mitigation",
                "act on flagged stragglers as core::DecideStraggler says (default true)",
                c.straggler_mitigation = v != 0),
      KNOB_DOUBLE("sdc-rate", "silent data corruptions per 1000 node-days (default 0)",
                  c.sdc_rate = v),
      KNOB_INT("sdc-check-every",
               "steps between cross-replica fingerprint checks, 0 = no check (default 0)",
               c.sdc_check_every = v),
      KNOB_DURATION("sdc-undetected-cost",
                    "training wasted by an SDC no check finds, until a loss spike (default 6h)",
                    c.sdc_undetected_cost = v),
      KNOB_BOOL("multi-strike",
                "keep strikes per node and quarantine as core::JudgeNode says (default true)",
                c.multi_strike = v != 0),
      KNOB_INT("soft-strikes", "soft strikes within --soft-window that quarantine (default 3)",
               c.soft_strikes = v),
      KNOB_DURATION("soft-window", "window of the soft strikes (default 24h)", c.soft_window = v),
      KNOB_DOUBLE("flaky-share",
                  "share of nodes (0..1) failing --flaky-factor x as often, softly (default 0)",
                  c.flaky_share = v),
      KNOB_DOUBLE("flaky-factor", "how much more often a flaky node fails softly (default 20)",
                  c.flaky_factor = v),
      KNOB_BOOL("health-check", "check every node before it joins or rejoins (default true)",
                c.health_check = v != 0),
      KNOB_DURATION("health-check-time", "time the health check adds to a join (default 60s)",
                    c.health_check_time = v),
      KNOB_DOUBLE("health-check-recall",
                  "probability (0..1) that the health check refuses a flaky node (default 0.7)",
                  c.health_check_recall = v),
      KNOB_DURATION("step-time", "duration of one training step (default 10s)", c.step_time = v),
      KNOB_INT("max-restarts", "retry budget: restarts per --restart-window, 0 = unlimited (30)",
               c.policy.max_restarts_in_window = static_cast<int>(v)),
      KNOB_DURATION("restart-window", "window of the retry budget and node isolation (1h)",
                    c.policy.restart_window = v),
      KNOB_DURATION("backoff", "first backoff when a node fails again without progress (30s)",
                    c.policy.backoff_initial = v),
      KNOB_DURATION("backoff-max", "longest backoff (30m)", c.policy.backoff_max = v),
      KNOB_INT("runs", "independent runs (seeds) for the confidence interval (default 10)",
               c.runs = v),
      {{"seed", "seed of the first run (default: random, printed)", "N"},
       Kind::kInt,
       [](SimConfig& c, int64_t v, double, Duration, const std::string&) {
         c.seed = static_cast<uint64_t>(v);
         c.seed_set = true;
       }},
  };
  return table;
}

#undef KNOB_BOOL
#undef KNOB_INT
#undef KNOB_DOUBLE
#undef KNOB_DURATION

const Knob* FindKnob(std::string_view name) {
  for (const Knob& k : KnobTable()) {
    if (name == k.info.name) return &k;
  }
  return nullptr;
}

// The Llama 3 405B interruption table (arXiv 2407.21783, Table 5), by count:
// the printed percentages do not add up. Paths and the two detection
// latencies are Endure's assumptions, not the paper's: hardware is evicted,
// software restarts in place, an outside dependency is waited for.
std::vector<CauseSpec> Llama3Mix() {
  const RecoveryPath kEvict = RecoveryPath::kEvictAndReplace;
  const RecoveryPath kRestart = RecoveryPath::kRestartInPlace;
  const RecoveryPath kWait = RecoveryPath::kWaitForRepair;
  return {
      {"faulty_gpu", 148, {}, kEvict, {}},
      {"gpu_hbm3", 72, {}, kEvict, {}},
      {"software_bug", 54, {}, kRestart, {}},
      // The node behind a bad link or leaf switch is drained.
      {"network_switch_cable", 35, {}, kEvict, {}},
      {"host_maintenance", 32, {}, kEvict, {}},
      {"gpu_sram", 19, {}, kEvict, {}},
      {"gpu_system_processor", 17, {}, kEvict, {}},
      {"nic", 7, {}, kEvict, {}},
      // PyTorch's default NCCL collective timeout.
      {"nccl_watchdog_timeout", 7, minutes(10), kRestart, {}},
      // Found only by periodic cross-replica checks.
      {"silent_data_corruption", 6, hours(1), kEvict, {}},
      {"gpu_thermal_interface_sensor", 6, {}, kEvict, {}},
      {"ssd", 3, {}, kEvict, {}},
      {"power_supply", 3, {}, kEvict, {}},
      {"server_chassis", 2, {}, kEvict, {}},
      {"io_expansion_board", 2, {}, kEvict, {}},
      {"dependency", 2, {}, kWait, {}},
      {"cpu", 2, {}, kEvict, {}},
      {"system_memory", 2, {}, kEvict, {}},
  };
}

std::string KnownCauses(const std::vector<CauseSpec>& causes) {
  std::string s;
  for (const CauseSpec& c : causes) s += (s.empty() ? "" : ", ") + c.name;
  return s;
}

std::string TomlWhere(const std::string& file, const toml::source_region& src,
                      std::string_view key) {
  return file + ":" + std::to_string(src.begin.line) + ": " + std::string(key);
}

// TOML scalars as the text a flag would carry.
Result<std::string> ScalarText(const toml::node& node, const std::string& where) {
  if (auto s = node.value<std::string>(); s && node.is_string()) return *s;
  if (node.is_boolean()) return std::string(*node.value<bool>() ? "true" : "false");
  if (node.is_integer()) return std::to_string(*node.value<int64_t>());
  if (node.is_floating_point()) {
    std::ostringstream out;
    out.precision(17);
    out << *node.value<double>();
    return out.str();
  }
  return Bad(where, "expected a string, a number or a boolean");
}

Status LoadCauseTable(const toml::table& causes, const std::string& file, SimConfig& config) {
  for (const auto& [name, node] : causes) {
    std::string cause_where = TomlWhere(file, node.source(), "cause." + std::string(name.str()));
    const toml::table* t = node.as_table();
    if (t == nullptr)
      return Bad(cause_where, "expected a table [cause." + std::string(name.str()) + "]");
    SimConfig::CauseOverride o;
    o.spec.name = std::string(name.str());
    o.where = cause_where;
    for (const auto& [key, value] : *t) {
      std::string where =
          TomlWhere(file, value.source(), "cause." + o.spec.name + "." + std::string(key.str()));
      ENDURE_ASSIGN_OR_RETURN(std::string text, ScalarText(value, where));
      if (key == "weight") {
        ENDURE_ASSIGN_OR_RETURN(o.spec.weight, ParseDouble(text, where));
        if (o.spec.weight <= 0) return Bad(where, "must be positive, got " + text);
        o.has_weight = true;
      } else if (key == "detect") {
        ENDURE_ASSIGN_OR_RETURN(o.spec.detect, ParseDurationAt(text, where));
        o.has_detect = true;
      } else if (key == "repair") {
        ENDURE_ASSIGN_OR_RETURN(o.spec.repair, ParseDurationAt(text, where));
        o.has_repair = true;
      } else if (key == "path") {
        Result<RecoveryPath> p = core::ParseRecoveryPath(text);
        if (!p.ok()) return Bad(where, p.status().message());
        o.spec.path = *p;
        o.has_path = true;
      } else {
        return Bad(where, "unknown key (expected weight, detect, path or repair)");
      }
    }
    config.cause_overrides.push_back(std::move(o));
  }
  return Status::Ok();
}

}  // namespace

std::string SimConfig::Where(std::string_view knob) const {
  auto it = origin.find(knob);
  return it != origin.end() ? it->second : "--" + std::string(knob);
}

const std::vector<KnobInfo>& Knobs() {
  static const std::vector<KnobInfo> infos = [] {
    std::vector<KnobInfo> v;
    for (const Knob& k : KnobTable()) v.push_back(k.info);
    return v;
  }();
  return infos;
}

Status SetKnob(SimConfig& config, std::string_view name, std::string_view text,
               std::string_view where) {
  const Knob* knob = FindKnob(name);
  if (knob == nullptr) return Bad(where, "unknown setting");
  int64_t i = 0;
  double d = 0;
  Duration dur{0};
  switch (knob->kind) {
    case Kind::kInt: {
      ENDURE_ASSIGN_OR_RETURN(i, ParseInt(text, where));
      break;
    }
    case Kind::kDouble: {
      ENDURE_ASSIGN_OR_RETURN(d, ParseDouble(text, where));
      break;
    }
    case Kind::kDuration: {
      ENDURE_ASSIGN_OR_RETURN(dur, ParseDurationAt(text, where));
      break;
    }
    case Kind::kBool: {
      ENDURE_ASSIGN_OR_RETURN(bool b, ParseBool(text, where));
      i = b ? 1 : 0;
      break;
    }
    case Kind::kString:
      break;
  }
  knob->set(config, i, d, dur, std::string(text));
  config.origin[std::string(name)] = std::string(where);
  return Status::Ok();
}

Status LoadScenarioString(std::string_view text, const std::string& name, SimConfig& config) {
  toml::table root;
  try {
    root = toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    return InvalidArgument(name + ":" + std::to_string(e.source().begin.line) + ": " +
                           std::string(e.description()));
  }
  for (const auto& [key, node] : root) {
    std::string where = TomlWhere(name, node.source(), key.str());
    if (key == "cause") {
      const toml::table* causes = node.as_table();
      if (causes == nullptr) return Bad(where, "expected tables [cause.NAME]");
      ENDURE_RETURN_IF_ERROR(LoadCauseTable(*causes, name, config));
      continue;
    }
    if (FindKnob(key.str()) == nullptr) {
      return Bad(where, "unknown key (see `endure sim --help` for the settings)");
    }
    ENDURE_ASSIGN_OR_RETURN(std::string value, ScalarText(node, where));
    ENDURE_RETURN_IF_ERROR(SetKnob(config, key.str(), value, where));
  }
  return Status::Ok();
}

Status LoadScenarioFile(const std::string& path, SimConfig& config) {
  std::ifstream in(path);
  if (!in) return InvalidArgument("--scenario: cannot read '" + path + "'");
  std::stringstream buf;
  buf << in.rdbuf();
  return LoadScenarioString(buf.str(), path, config);
}

Result<std::vector<CauseSpec>> CauseMix(std::string_view name) {
  if (name == "none")
    return std::vector<CauseSpec>{{"node_failure", 1, {}, RecoveryPath::kRestartInPlace, {}}};
  if (name == "llama3") return Llama3Mix();
  return InvalidArgument("unknown cause mix '" + std::string(name) + "' (expected none or llama3)");
}

Status Finalize(SimConfig& c) {
  auto positive = [&](Duration d, std::string_view knob) -> Status {
    if (d <= Duration(0)) return Bad(c.Where(knob), "must be positive, got " + FormatDuration(d));
    return Status::Ok();
  };
  if (c.nodes < 1)
    return Bad(c.Where("nodes"), "must be at least 1, got " + std::to_string(c.nodes));
  if (c.nodes > (int64_t{1} << 30)) return Bad(c.Where("nodes"), "at most 2^30 nodes");
  if (c.gpus_per_node < 1) {
    return Bad(c.Where("gpus-per-node"),
               "must be at least 1, got " + std::to_string(c.gpus_per_node));
  }
  if (c.spares < 0 || c.spares > (int64_t{1} << 30)) {
    return Bad(c.Where("spares"), "must be between 0 and 2^30, got " + std::to_string(c.spares));
  }
  if (c.min_nodes < 0 || c.min_nodes > c.nodes) {
    return Bad(c.Where("min-nodes"), "must be between 0 and the job's " + std::to_string(c.nodes) +
                                         " nodes, got " + std::to_string(c.min_nodes));
  }
  if (c.min_nodes > 0 && !c.in_process) {
    return Bad(c.Where("min-nodes"),
               "a job shrinks and grows in process: set in-process too (or min-nodes 0)");
  }
  if (c.runs < 1 || c.runs > 100000) {
    return Bad(c.Where("runs"), "must be between 1 and 100000, got " + std::to_string(c.runs));
  }
  ENDURE_RETURN_IF_ERROR(positive(c.duration, "duration"));
  ENDURE_RETURN_IF_ERROR(positive(c.ckpt_interval, "ckpt-interval"));
  ENDURE_RETURN_IF_ERROR(positive(c.step_time, "step-time"));
  if (c.ckpt_interval < c.ckpt_write) {
    return Bad(c.Where("ckpt-interval"),
               FormatDuration(c.ckpt_interval) + " is shorter than the checkpoint write cost (" +
                   c.Where("ckpt-write") + " " + FormatDuration(c.ckpt_write) + ")");
  }
  if (c.FailureRate() < 0) return Bad(c.Where("failure-rate"), "must not be negative");
  if (c.straggler_share < 0 || c.straggler_share > 1) {
    return Bad(c.Where("stragglers"), "a share between 0 and 1");
  }
  if (c.straggler_factor < 1) return Bad(c.Where("straggler-factor"), "must be at least 1");
  if (c.StragglerFactorMax() < c.straggler_factor) {
    return Bad(c.Where("straggler-factor-max"), "must be at least " + c.Where("straggler-factor") +
                                                    " (" + std::to_string(c.straggler_factor) +
                                                    ")");
  }
  if (c.straggler_window < 1 || c.straggler_window > 1000000) {
    return Bad(c.Where("straggler-window"),
               "must be between 1 and 1000000 steps, got " + std::to_string(c.straggler_window));
  }
  if (!(c.straggler_theta > 0 && c.straggler_theta <= 10)) {
    return Bad(c.Where("straggler-theta"), "must be in (0, 10]");
  }
  if (c.sdc_rate < 0) return Bad(c.Where("sdc-rate"), "must not be negative");
  if (c.sdc_check_every < 0) {
    return Bad(c.Where("sdc-check-every"),
               "must be >= 0 (0: no check), got " + std::to_string(c.sdc_check_every));
  }
  if (c.soft_strikes < 1 || c.soft_strikes > 1000) {
    return Bad(c.Where("soft-strikes"),
               "must be between 1 and 1000, got " + std::to_string(c.soft_strikes));
  }
  ENDURE_RETURN_IF_ERROR(positive(c.soft_window, "soft-window"));
  if (c.flaky_share < 0 || c.flaky_share > 1) {
    return Bad(c.Where("flaky-share"), "a share between 0 and 1");
  }
  if (c.flaky_factor < 1) return Bad(c.Where("flaky-factor"), "must be at least 1");
  if (c.health_check_recall < 0 || c.health_check_recall > 1) {
    return Bad(c.Where("health-check-recall"), "a probability between 0 and 1");
  }
  if (c.policy.max_restarts_in_window < 0) return Bad(c.Where("max-restarts"), "must be >= 0");
  ENDURE_RETURN_IF_ERROR(positive(c.policy.restart_window, "restart-window"));
  if (c.policy.backoff_max < c.policy.backoff_initial) {
    return Bad(c.Where("backoff-max"), "must be at least " + c.Where("backoff") + " (" +
                                           FormatDuration(c.policy.backoff_initial) + ")");
  }

  // Causes: the mix, then [cause.NAME] overrides, then --path.
  Result<std::vector<CauseSpec>> mix = CauseMix(c.cause_mix);
  if (!mix.ok()) return Bad(c.Where("cause-mix"), mix.status().message());
  c.causes = *std::move(mix);
  for (const SimConfig::CauseOverride& o : c.cause_overrides) {
    auto it = std::find_if(c.causes.begin(), c.causes.end(),
                           [&](const CauseSpec& s) { return s.name == o.spec.name; });
    if (it == c.causes.end()) {
      if (!o.has_weight) {
        return Bad(o.where, "unknown cause '" + o.spec.name + "' in mix '" + c.cause_mix +
                                "' (known: " + KnownCauses(c.causes) +
                                "); give it a weight to add it");
      }
      c.causes.push_back(o.spec);
      continue;
    }
    if (o.has_weight) it->weight = o.spec.weight;
    if (o.has_detect) it->detect = o.spec.detect;
    if (o.has_path) it->path = o.spec.path;
    if (o.has_repair) it->repair = o.spec.repair;
  }
  c.policy.paths.clear();
  for (const CauseSpec& s : c.causes) c.policy.paths[s.name] = s.path;
  c.policy.paths.emplace(std::string(kStragglerCause), RecoveryPath::kEvictAndReplace);
  for (const auto& [cause, path_name] : c.path_overrides) {
    if (!c.policy.paths.contains(cause)) {
      return Bad("--path",
                 "unknown cause '" + cause + "' (known: " + KnownCauses(c.causes) + ", straggler)");
    }
    Result<RecoveryPath> p = core::ParseRecoveryPath(path_name);
    if (!p.ok()) return Bad("--path", cause + ": " + p.status().message());
    c.policy.paths[cause] = *p;
    for (CauseSpec& s : c.causes) {
      if (s.name == cause) s.path = *p;
    }
  }
  for (const ScriptedEvent& e : c.script) {
    if (e.node.value < 0 || e.node.value >= c.nodes + c.spares) {
      return Bad("script", "node " + std::to_string(e.node.value) + " is not in the cluster");
    }
    if (e.kind == ScriptedEvent::Kind::kFailure &&
        std::none_of(c.causes.begin(), c.causes.end(),
                     [&](const CauseSpec& s) { return s.name == e.cause; })) {
      return Bad("script",
                 "unknown cause '" + e.cause + "' (known: " + KnownCauses(c.causes) + ")");
    }
  }
  std::stable_sort(c.script.begin(), c.script.end(),
                   [](const ScriptedEvent& a, const ScriptedEvent& b) { return a.at < b.at; });
  Status policy = c.policy.Validate();
  if (!policy.ok()) return Bad("recovery policy", policy.message());
  return Status::Ok();
}

}  // namespace endure::sim
