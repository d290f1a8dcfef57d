// JobCodec; see job_codec.h.
#include "core/job_codec.h"

#include <charconv>
#include <cstdio>
#include <map>
#include <set>
#include <type_traits>

#include "common/quote.h"

namespace endure::core {
namespace {

// ---- Each struct's fields, in order, for both directions ----
//
// `f(key, field)` is called for every field; the writer reads the field, the
// reader assigns it.

template <typename F>
void Fields(NodeUp& e, F& f) {
  f("node", e.node), f("name", e.name), f("slots", e.slots), f("refused", e.refused);
}
template <typename F>
void Fields(NodeQuarantined& e, F& f) {
  f("node", e.node), f("reason", e.reason);
}
template <typename F>
void Fields(PhaseChanged& e, F& f) {
  f("generation", e.generation), f("rank", e.rank), f("phase", e.phase);
}
template <typename F>
void Fields(FingerprintReported& e, F& f) {
  f("generation", e.generation), f("rank", e.rank), f("step", e.step),
      f("fingerprint", e.fingerprint);
}
template <typename F>
void Fields(PairTestResult& e, F& f) {
  f("test", e.test), f("round", e.round), f("a", e.a), f("b", e.b), f("ok", e.ok),
      f("seconds", e.seconds), f("error", e.error);
}
template <typename F>
void Fields(NodeDown& e, F& f) {
  f("node", e.node), f("reason", e.reason), f("since", e.since);
}
template <typename F>
void Fields(NodeHeartbeat& e, F& f) {
  f("node", e.node);
}
template <typename F>
void Fields(WorkerReady& e, F& f) {
  f("generation", e.generation), f("rank", e.rank), f("start_step", e.start_step),
      f("restore_s", e.restore_s), f("rejoin", e.rejoin), f("deterministic", e.deterministic),
      f("start_step_unknown", e.start_step_unknown), f("rejoin_from_tiers", e.rejoin_from_tiers);
}
template <typename F>
void Fields(StepEnd& e, F& f) {
  f("generation", e.generation), f("rank", e.rank), f("step", e.step), f("loss", e.loss),
      f("ckpt_stall_s", e.ckpt_stall_s), f("checkpoint_step", e.checkpoint_step),
      f("skipped", e.skipped), f("compute_s", e.compute_s), f("total_steps", e.total_steps);
}
template <typename F>
void Fields(NodeStepsEnd& e, F& f) {
  f("node", e.node), f("generation", e.generation), f("ranks", e.steps);
}
template <typename F>
void Fields(WorkerExitEvent& e, F& f) {
  f("generation", e.generation), f("rank", e.rank), f("node", e.node), f("exit_code", e.exit_code),
      f("signal", e.signal), f("log_cause", e.log_cause), f("log_action", e.log_action),
      f("log_rule", e.log_rule), f("log_line", e.log_line), f("stopped", e.stopped);
}
template <typename F>
void Fields(FaultFiredEvent& e, F& f) {
  f("generation", e.generation), f("rank", e.rank), f("id", e.id), f("kind", e.kind),
      f("step", e.step), f("at", e.at);
}
template <typename F>
void Fields(GenerationStoppedEvent& e, F& f) {
  f("generation", e.generation), f("node", e.node);
}
template <typename F>
void Fields(StackDumpEvent& e, F& f) {
  f("generation", e.generation), f("rank", e.rank), f("text", e.text);
}
template <typename F>
void Fields(PersistFailedEvent& e, F& f) {
  f("generation", e.generation), f("shard", e.shard), f("step", e.step), f("node", e.node),
      f("error", e.error);
}
template <typename F>
void Fields(DurableListed& e, F& f) {
  f("committed", e.committed), f("leftovers", e.leftovers);
}
template <typename F>
void Fields(ShardPersisted& e, F& f) {
  f("generation", e.generation), f("node", e.node), f("step", e.step), f("shard", e.shard),
      f("shards", e.shards), f("bytes", e.bytes), f("xxh3", e.xxh3), f("t0_bytes", e.t0_bytes),
      f("t1_bytes", e.t1_bytes);
}
template <typename F>
void Fields(ManifestWritten& e, F& f) {
  f("step", e.step), f("error", e.error);
}
template <typename F>
void Fields(StepRemoved& e, F& f) {
  f("step", e.step), f("error", e.error);
}
template <typename F>
void Fields(InventoryReported& e, F& f) {
  f("node", e.node), f("copies", e.copies), f("t0_bytes", e.t0_bytes), f("t1_bytes", e.t1_bytes);
}
template <typename F>
void Fields(ShardRefused& e, F& f) {
  f("step", e.step), f("shard", e.shard), f("why", e.why);
}
template <typename F>
void Fields(RestoreChosen& e, F& f) {
  f("generation", e.generation), f("text", e.text), f("restored_step", e.restored_step),
      f("from_t0", e.from_t0), f("from_t1", e.from_t1), f("from_t2", e.from_t2);
}
template <typename F>
void Fields(ControllerResumed&, F&) {}
template <typename F>
void Fields(Tick&, F&) {}

template <typename F>
void Fields(Configure& c, F& f) {
  JobMachineOptions& o = c.options;
  f("nodes", o.nodes), f("ranks_per_node", o.ranks_per_node), f("min_nodes", o.min_nodes),
      f("hang.floor", o.hang.floor), f("hang.k", o.hang.k), f("hang.window", o.hang.window),
      f("hang.min_samples", o.hang.min_samples), f("hang.startup_timeout", o.hang.startup_timeout),
      f("hang.phase_first_timeout", o.hang.phase_first_timeout),
      f("heartbeat.timeout", o.heartbeat.timeout),
      f("heartbeat.drop_grace", o.heartbeat.drop_grace), f("loss.window", o.loss.window),
      f("loss.min_count", o.loss.min_count), f("loss.z_threshold", o.loss.z_threshold),
      f("loss.min_relative_stddev", o.loss.min_relative_stddev),
      f("loss.min_jump", o.loss.min_jump), f("anomaly.on_recurrence", o.anomaly.on_recurrence),
      f("anomaly.on_data_spike", o.anomaly.on_data_spike),
      f("anomaly.max_skipped_steps", o.anomaly.max_skipped_steps),
      f("recovery.paths", o.recovery.paths), f("recovery.default_path", o.recovery.default_path),
      f("recovery.max_restarts_in_window", o.recovery.max_restarts_in_window),
      f("recovery.restart_window", o.recovery.restart_window),
      f("recovery.backoff_initial", o.recovery.backoff_initial),
      f("recovery.backoff_max", o.recovery.backoff_max),
      f("recovery.structural_repeats", o.recovery.structural_repeats),
      f("recovery.startup_repeats", o.recovery.startup_repeats),
      f("recovery.evict_node_after", o.recovery.evict_node_after),
      f("detect_loss_anomalies", o.detect_loss_anomalies), f("in_process", o.in_process),
      f("replacement_timeout", o.replacement_timeout), f("first_generation", o.first_generation),
      f("isolation.straggler.enabled", o.isolation.straggler.enabled),
      f("isolation.straggler.theta", o.isolation.straggler.theta),
      f("isolation.straggler.window", o.isolation.straggler.window),
      f("isolation.straggler.min_slow", o.isolation.straggler.min_slow),
      f("isolation.straggler.min_compute_s", o.isolation.straggler.min_compute_s),
      f("isolation.straggler.min_excess_s", o.isolation.straggler.min_excess_s),
      f("isolation.sdc_check_every", o.isolation.sdc_check_every),
      f("isolation.over_evict", o.isolation.over_evict),
      f("isolation.pairwise_test", o.isolation.pairwise_test),
      f("isolation.pairwise.slow_factor", o.isolation.pairwise.slow_factor),
      f("isolation.pairwise.min_slow_s", o.isolation.pairwise.min_slow_s),
      f("isolation.pairwise_timeout", o.isolation.pairwise_timeout),
      f("isolation.health.soft_strikes", o.isolation.health.soft_strikes),
      f("isolation.health.soft_window", o.isolation.health.soft_window),
      f("isolation.straggler_horizon", o.isolation.straggler_horizon),
      f("isolation.restart_cost", o.isolation.restart_cost),
      f("isolation.replacement_wait", o.isolation.replacement_wait),
      f("checkpoint.keep", o.checkpoint.keep), f("checkpoint.replicas", o.checkpoint.replicas),
      f("checkpoint.persist_every_steps", o.checkpoint.persist_every_steps),
      f("checkpoint.memory_budget", o.checkpoint.memory_budget), f("faults", c.faults);
}

template <typename F>
void Fields(StartGenerationAction& a, F& f) {
  f("generation", a.generation), f("nodes", a.nodes), f("restore_step", a.restore_step),
      f("abandoned_from", a.abandoned_from), f("skip_steps", a.skip_steps),
      f("fired_faults", a.fired_faults), f("rejoin", a.rejoin),
      f("rejoin_from_tiers", a.rejoin_from_tiers);
}
template <typename F>
void Fields(StopGenerationAction& a, F& f) {
  f("generation", a.generation), f("dump_stacks", a.dump_stacks);
}
template <typename F>
void Fields(EvictNodeAction& a, F& f) {
  f("node", a.node), f("reason", a.reason);
}
template <typename F>
void Fields(InjectFaultAction& a, F& f) {
  f("fault", a.fault.id), f("kind", a.fault.kind), f("rank", a.fault.rank), f("step", a.fault.step),
      f("at", a.fault.at), f("node", a.node), f("generation", a.generation);
}
template <typename F>
void Fields(FinishAction& a, F& f) {
  f("exit_code", a.exit_code), f("reason", a.reason);
}
template <typename F>
void Fields(StrikeNodeAction& a, F& f) {
  f("node", a.node), f("node_name", a.node_name), f("cause", a.cause), f("hard", a.hard),
      f("detail", a.detail);
}
template <typename F>
void Fields(RunPairTestAction& a, F& f) {
  f("test", a.test), f("round", a.round), f("pairs", a.pairs);
}
template <typename F>
void Fields(ListDurableAction&, F&) {}
template <typename F>
void Fields(WriteManifestAction& a, F& f) {
  f("step", a.step), f("shards", a.shards);
}
template <typename F>
void Fields(RemoveStepAction& a, F& f) {
  f("step", a.step), f("reason", a.reason);
}

// The kinds' names, in the variants' order.
constexpr std::string_view kEventKinds[] = {"node_up",
                                            "node_down",
                                            "heartbeat",
                                            "worker_ready",
                                            "step_end",
                                            "worker_exit",
                                            "fault_fired",
                                            "generation_stopped",
                                            "stack_dump",
                                            "persist_failed",
                                            "durable_listed",
                                            "restore_chosen",
                                            "controller_resumed",
                                            "configure",
                                            "tick",
                                            "phase",
                                            "fingerprint",
                                            "pair_test_result",
                                            "node_quarantined",
                                            "shard_persisted",
                                            "manifest_written",
                                            "step_removed",
                                            "inventory",
                                            "shard_refused",
                                            "node_steps"};
static_assert(std::size(kEventKinds) == std::variant_size_v<JobEvent>);
constexpr std::string_view kActionKinds[] = {
    "start_generation", "stop_generation", "evict_node",   "inject_fault",   "finish",
    "strike_node",      "run_pair_test",   "list_durable", "write_manifest", "remove_step"};
static_assert(std::size(kActionKinds) == std::variant_size_v<JobAction>);

// ---- Writing ----

void Quote(std::string_view s, std::string& out) { AppendQuoted(s, ControlEscape::kHexByte, out); }

template <typename T>
void Number(T v, std::string& out) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, end);
}

struct Writer {
  std::string out;

  void Key(const char* key) {
    out += ' ';
    out += key;
    out += '=';
  }
  void Value(int v) { Number(v, out); }
  void Value(int64_t v) { Number(v, out); }
  void Value(uint64_t v) { Number(v, out); }
  void Value(double v) { Number(v, out); }  // shortest form that reads back exactly
  void Value(bool v) { out += v ? "true" : "false"; }
  void Value(const std::string& v) { Quote(v, out); }
  void Value(NodeId v) { Number(v.value, out); }
  void Value(Rank v) { Number(v.value, out); }
  void Value(StepNumber v) { Number(v.value, out); }
  void Value(Generation v) { Number(v.value, out); }
  void Value(faults::FaultKind v) { Quote(faults::FaultKindName(v), out); }
  // "" for none, as when it was a plain string.
  void Value(const std::optional<LogAction>& v) { Quote(v ? LogActionName(*v) : "", out); }
  void Value(TimePoint v) { Number(static_cast<int64_t>(v.time_since_epoch().count()), out); }
  void Value(Duration v) { Number(static_cast<int64_t>(v.count()), out); }
  template <typename T>
  void Value(const std::optional<T>& v) {
    if (v) {
      Value(*v);
    } else {
      out += '-';
    }
  }
  template <typename C>
  void List(const C& items) {
    bool first = true;
    for (const auto& item : items) {
      if (!first) out += ',';
      first = false;
      Value(item);
    }
    if (first) out += '-';  // empty
  }
  void Value(const std::vector<StepNumber>& v) { List(v); }
  void Value(const std::vector<NodeId>& v) { List(v); }
  void Value(const std::set<std::string>& v) { List(v); }
  void Value(RecoveryPath v) { out += RecoveryPathName(v); }
  void Value(AnomalyRecurrence v) { out += AnomalyRecurrenceName(v); }
  void Value(DataSpikeAction v) { out += DataSpikeActionName(v); }
  // Cause, path, cause, path, ... in the causes' order (the map has none).
  void Value(const std::unordered_map<std::string, RecoveryPath>& paths) {
    std::map<std::string, RecoveryPath> sorted(paths.begin(), paths.end());
    std::vector<std::string> items;
    for (const auto& [cause, path] : sorted) {
      items.push_back(cause);
      items.emplace_back(RecoveryPathName(path));
    }
    List(items);
  }
  // Id, kind, rank, step, at (ns, or "-"), for each fault.
  void Value(const std::vector<ExternalFault>& faults) {
    std::vector<std::string> items;
    for (const ExternalFault& f : faults) {
      items.push_back(f.id);
      items.emplace_back(faults::FaultKindName(f.kind));
      items.push_back(std::to_string(f.rank.value));
      items.push_back(std::to_string(f.step.value));
      items.push_back(f.at ? std::to_string(f.at->count()) : "-");
    }
    List(items);
  }
  void Value(const std::vector<std::string>& v) { List(v); }
  // "step:shards,...".
  void Value(const std::vector<ListedStep>& steps) {
    std::vector<std::string> items;
    for (const ListedStep& s : steps) {
      items.push_back(std::to_string(s.step.value) + ":" + std::to_string(s.shards));
    }
    bool first = true;
    for (const std::string& item : items) {
      if (!first) out += ',';
      first = false;
      out += item;
    }
    if (first) out += '-';
  }
  // Step, shard, shards, tier, node, path, bytes, xxh3 (hex), refused, for
  // each copy.
  void Value(const std::vector<checkpoint::ShardCopy>& copies) {
    std::vector<std::string> items;
    for (const checkpoint::ShardCopy& c : copies) {
      char xxh3[17];
      std::snprintf(xxh3, sizeof xxh3, "%016llx", static_cast<unsigned long long>(c.xxh3));
      items.push_back(std::to_string(c.step));
      items.push_back(std::to_string(c.shard));
      items.push_back(std::to_string(c.shards));
      items.emplace_back(checkpoint::TierName(c.tier));
      items.push_back(c.node);
      items.push_back(c.path);
      items.push_back(std::to_string(c.bytes));
      items.push_back(xxh3);
      items.push_back(c.refused);
    }
    List(items);
  }
  // "bytes:xxh3,...": actions only.
  void Value(const std::vector<std::pair<uint64_t, uint64_t>>& shards) {
    bool first = true;
    for (const auto& [bytes, xxh3] : shards) {
      if (!first) out += ',';
      first = false;
      char buf[48];
      std::snprintf(buf, sizeof buf, "%llu:%016llx", static_cast<unsigned long long>(bytes),
                    static_cast<unsigned long long>(xxh3));
      out += buf;
    }
    if (first) out += '-';
  }
  void Value(RemoveReason v) { out += RemoveReasonName(v); }
  // A node's ranks' steps: "rank:step:loss:ckpt_stall_s:checkpoint_step:
  // skipped:compute_s:total_steps,..." (skipped 0 or 1), their generation
  // the event's.
  void Value(const std::vector<StepEnd>& steps) {
    bool first = true;
    for (const StepEnd& e : steps) {
      if (!first) out += ',';
      first = false;
      Number(e.rank.value, out);
      out += ':';
      Number(e.step.value, out);
      out += ':';
      Number(e.loss, out);
      out += ':';
      Number(e.ckpt_stall_s, out);
      out += ':';
      Number(e.checkpoint_step.value, out);
      out += e.skipped ? ":1:" : ":0:";
      Number(e.compute_s, out);
      out += ':';
      Number(e.total_steps, out);
    }
    if (first) out += '-';
  }
  // "0-1,2-3": actions only (they are written, never read).
  void Value(const std::vector<std::pair<NodeId, NodeId>>& pairs) {
    std::vector<std::string> items;
    for (auto [a, b] : pairs)
      items.push_back(std::to_string(a.value) + "-" + std::to_string(b.value));
    bool first = true;
    for (const std::string& item : items) {
      if (!first) out += ',';
      first = false;
      out += item;
    }
    if (first) out += '-';
  }

  template <typename T>
  void operator()(const char* key, const T& field) {
    Key(key);
    Value(field);
  }
};

template <typename Variant>
std::string Encode(const Variant& v, const std::string_view* kinds) {
  Writer w;
  w.out = std::string(kinds[v.index()]);
  std::visit(
      [&](const auto& alt) {
        auto copy = alt;  // Fields takes a mutable reference for the reader's sake
        Fields(copy, w);
      },
      v);
  return std::move(w.out);
}

// ---- Reading ----

struct Token {
  std::string key;
  std::string value;
  bool quoted = false;
  // A quoted value, or a list of them ("a","b"): each, unescaped.
  std::vector<std::string> items;
};

Result<std::string> Unquote(std::string_view s, size_t& i) {
  std::string out;
  ++i;  // the opening quote
  while (i < s.size()) {
    const char c = s[i++];
    if (c == '"') return out;
    if (c != '\\') {
      out += c;
      continue;
    }
    if (i >= s.size()) break;
    const char e = s[i++];
    switch (e) {
      case '"':
      case '\\':
        out += e;
        break;
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'x': {
        unsigned value = 0;
        auto [end, ec] =
            std::from_chars(s.data() + i, s.data() + std::min(s.size(), i + 2), value, 16);
        if (ec != std::errc() || end != s.data() + i + 2) {
          return InvalidArgument("a \\x escape needs two hex digits");
        }
        out += static_cast<char>(value);
        i += 2;
        break;
      }
      default:
        return InvalidArgument(std::string("unknown escape \\") + e);
    }
  }
  return InvalidArgument("a quoted string is not closed");
}

Result<std::vector<Token>> Tokenize(std::string_view s, size_t i) {
  std::vector<Token> tokens;
  while (i < s.size()) {
    if (s[i] == ' ') {
      ++i;
      continue;
    }
    const size_t eq = s.find('=', i);
    const size_t space = s.find(' ', i);
    if (eq == std::string_view::npos || (space != std::string_view::npos && space < eq)) {
      return InvalidArgument("expected key=value at '" +
                             std::string(s.substr(i, std::min<size_t>(20, s.size() - i))) + "'");
    }
    Token t;
    t.key = std::string(s.substr(i, eq - i));
    i = eq + 1;
    if (i < s.size() && s[i] == '"') {
      while (true) {
        Result<std::string> v = Unquote(s, i);
        if (!v.ok()) return InvalidArgument(t.key + ": " + v.status().message());
        t.items.push_back(std::move(v).value());
        if (i + 1 < s.size() && s[i] == ',' && s[i + 1] == '"') {
          ++i;
          continue;
        }
        break;
      }
      if (i < s.size() && s[i] != ' ') {
        return InvalidArgument(t.key + ": unexpected '" + std::string(1, s[i]) +
                               "' after a quoted string");
      }
      t.value = t.items.front();
      t.quoted = true;
    } else {
      const size_t end = std::min(s.find(' ', i), s.size());
      t.value = std::string(s.substr(i, end - i));
      i = end;
    }
    tokens.push_back(std::move(t));
  }
  return tokens;
}

// Fields that lines written before them lack (schema 4, issue 12).
const std::set<std::string_view> kAddedFields = {"rejoin_from_tiers",                 // issue 25
                                                 "start_step_unknown",                // issue 26
                                                 "restored_step",                     // issue 28
                                                 "from_t0",                           // issue 28
                                                 "from_t1",                           // issue 28
                                                 "from_t2",                           // issue 28
                                                 "checkpoint.keep",                   // issue 28
                                                 "checkpoint.replicas",               // issue 28
                                                 "checkpoint.persist_every_steps",    // issue 28
                                                 "checkpoint.memory_budget",          // issue 28
                                                 "since",                             // issue 28
                                                 "stopped",                           // issue 28
                                                 "deterministic",                     // issue 27
                                                 "loss.min_jump",                     // issue 27
                                                 "anomaly.on_data_spike",             // issue 27
                                                 "isolation.straggler.min_excess_s",  // issue 27
                                                 "rejoin",                            // issue 14
                                                 "min_nodes",                         // issue 14
                                                 "in_process",                        // issue 14
                                                 "refused",
                                                 "compute_s",
                                                 "total_steps",
                                                 "hang.phase_first_timeout",
                                                 "isolation.straggler.enabled",
                                                 "isolation.straggler.theta",
                                                 "isolation.straggler.window",
                                                 "isolation.straggler.min_slow",
                                                 "isolation.straggler.min_compute_s",
                                                 "isolation.sdc_check_every",
                                                 "isolation.over_evict",
                                                 "isolation.pairwise_test",
                                                 "isolation.pairwise.slow_factor",
                                                 "isolation.pairwise.min_slow_s",
                                                 "isolation.pairwise_timeout",
                                                 "isolation.health.soft_strikes",
                                                 "isolation.health.soft_window",
                                                 "isolation.straggler_horizon",
                                                 "isolation.restart_cost",
                                                 "isolation.replacement_wait"};

class Reader {
 public:
  explicit Reader(std::map<std::string, Token> tokens) : tokens_(std::move(tokens)) {}

  template <typename T>
  void operator()(const char* key, T& field) {
    if (!status_.ok()) return;
    auto it = tokens_.find(key);
    if (it == tokens_.end()) {
      // A field added after journals were first written: an older line
      // without it keeps the default (which is what it meant).
      if (kAddedFields.count(key) == 0) {
        status_ = InvalidArgument(std::string("missing field ") + key);
      }
      return;
    }
    Status st = Parse(it->second, field);
    if (!st.ok()) status_ = InvalidArgument(std::string(key) + ": " + st.message());
    tokens_.erase(it);
  }

  // Every field read, nothing left over.
  Status Finish() const {
    if (!status_.ok()) return status_;
    if (!tokens_.empty()) return InvalidArgument("unknown field " + tokens_.begin()->first);
    return Status::Ok();
  }

 private:
  template <typename T>
  static Status Integer(std::string_view s, T& v) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
      return InvalidArgument("expected an integer, got '" + std::string(s) + "'");
    }
    return Status::Ok();
  }
  static Status Bare(const Token& t) {
    if (t.quoted) return InvalidArgument("expected a number or word, got a quoted string");
    return Status::Ok();
  }
  static Status Parse(const Token& t, int& v) {
    ENDURE_RETURN_IF_ERROR(Bare(t));
    return Integer(t.value, v);
  }
  static Status Parse(const Token& t, int64_t& v) {
    ENDURE_RETURN_IF_ERROR(Bare(t));
    return Integer(t.value, v);
  }
  static Status Real(std::string_view s, double& v) {
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || s.empty()) {
      return InvalidArgument("expected a number, got '" + std::string(s) + "'");
    }
    return Status::Ok();
  }
  static Status Parse(const Token& t, double& v) {
    ENDURE_RETURN_IF_ERROR(Bare(t));
    return Real(t.value, v);
  }
  static Status Parse(const Token& t, bool& v) {
    ENDURE_RETURN_IF_ERROR(Bare(t));
    if (t.value != "true" && t.value != "false") {
      return InvalidArgument("expected true or false, got '" + t.value + "'");
    }
    v = t.value == "true";
    return Status::Ok();
  }
  static Status Parse(const Token& t, std::string& v) {
    if (!t.quoted || t.items.size() != 1) return InvalidArgument("expected a quoted string");
    v = t.value;
    return Status::Ok();
  }
  static Status Parse(const Token& t, Duration& v) {
    int64_t ns = 0;
    ENDURE_RETURN_IF_ERROR(Parse(t, ns));
    v = Duration{ns};
    return Status::Ok();
  }
  static Status Parse(const Token& t, RecoveryPath& v) {
    ENDURE_RETURN_IF_ERROR(Bare(t));
    ENDURE_ASSIGN_OR_RETURN(v, ParseRecoveryPath(t.value));
    return Status::Ok();
  }
  static Status Parse(const Token& t, AnomalyRecurrence& v) {
    ENDURE_RETURN_IF_ERROR(Bare(t));
    ENDURE_ASSIGN_OR_RETURN(v, ParseAnomalyRecurrence(t.value));
    return Status::Ok();
  }
  static Status Parse(const Token& t, DataSpikeAction& v) {
    ENDURE_RETURN_IF_ERROR(Bare(t));
    ENDURE_ASSIGN_OR_RETURN(v, ParseDataSpikeAction(t.value));
    return Status::Ok();
  }
  // A list of quoted strings in groups of `group`; "-" for none.
  static Result<std::vector<std::string>> Items(const Token& t, size_t group) {
    if (!t.quoted && t.value == "-") return std::vector<std::string>{};
    if (!t.quoted || t.items.size() % group != 0) {
      return InvalidArgument("expected quoted strings in groups of " + std::to_string(group));
    }
    return t.items;
  }
  static Status Parse(const Token& t, std::unordered_map<std::string, RecoveryPath>& v) {
    ENDURE_ASSIGN_OR_RETURN(const std::vector<std::string> items, Items(t, 2));
    v.clear();
    for (size_t i = 0; i < items.size(); i += 2) {
      ENDURE_ASSIGN_OR_RETURN(const RecoveryPath path, ParseRecoveryPath(items[i + 1]));
      if (!v.emplace(items[i], path).second) {
        return InvalidArgument("cause \"" + items[i] + "\" appears twice");
      }
    }
    return Status::Ok();
  }
  static Status Parse(const Token& t, std::vector<ExternalFault>& v) {
    ENDURE_ASSIGN_OR_RETURN(const std::vector<std::string> items, Items(t, 5));
    v.clear();
    for (size_t i = 0; i < items.size(); i += 5) {
      ExternalFault f;
      f.id = items[i];
      ENDURE_ASSIGN_OR_RETURN(f.kind, faults::ParseFaultKind(items[i + 1]));
      ENDURE_RETURN_IF_ERROR(Integer(items[i + 2], f.rank.value));
      ENDURE_RETURN_IF_ERROR(Integer(items[i + 3], f.step.value));
      if (items[i + 4] != "-") {
        int64_t ns = 0;
        ENDURE_RETURN_IF_ERROR(Integer(items[i + 4], ns));
        f.at = Duration{ns};
      }
      v.push_back(std::move(f));
    }
    return Status::Ok();
  }
  static Status Parse(const Token& t, uint64_t& v) {
    ENDURE_RETURN_IF_ERROR(Bare(t));
    return Integer(t.value, v);
  }
  static Status Parse(const Token& t, std::vector<ListedStep>& v) {
    ENDURE_RETURN_IF_ERROR(Bare(t));
    v.clear();
    if (t.value == "-") return Status::Ok();
    std::string_view rest = t.value;
    while (true) {
      const size_t comma = rest.find(',');
      const std::string_view item = rest.substr(0, comma);
      const size_t colon = item.find(':');
      if (colon == std::string_view::npos) {
        return InvalidArgument("expected step:shards, got '" + std::string(item) + "'");
      }
      ListedStep s;
      ENDURE_RETURN_IF_ERROR(Integer(item.substr(0, colon), s.step.value));
      ENDURE_RETURN_IF_ERROR(Integer(item.substr(colon + 1), s.shards));
      if (s.shards < 1) return InvalidArgument("a committed step has at least one shard");
      v.push_back(s);
      if (comma == std::string_view::npos) return Status::Ok();
      rest.remove_prefix(comma + 1);
    }
  }
  static Status Parse(const Token& t, std::vector<StepEnd>& v) {
    ENDURE_RETURN_IF_ERROR(Bare(t));
    v.clear();
    if (t.value == "-") return Status::Ok();
    std::string_view rest = t.value;
    while (true) {
      if (v.size() >= kMaxNodeStepsRanks) {
        return InvalidArgument("more than " + std::to_string(kMaxNodeStepsRanks) + " ranks");
      }
      const size_t comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      std::string_view parts[8];
      for (size_t i = 0; i < 8; ++i) {
        const size_t colon = item.find(':');
        if ((colon == std::string_view::npos) != (i == 7)) {
          return InvalidArgument(
              "expected rank:step:loss:ckpt_stall_s:checkpoint_step:skipped:compute_s:"
              "total_steps, got '" +
              std::string(rest.substr(0, comma)) + "'");
        }
        parts[i] = item.substr(0, colon);
        if (colon != std::string_view::npos) item.remove_prefix(colon + 1);
      }
      StepEnd e;
      ENDURE_RETURN_IF_ERROR(Integer(parts[0], e.rank.value));
      ENDURE_RETURN_IF_ERROR(Integer(parts[1], e.step.value));
      ENDURE_RETURN_IF_ERROR(Real(parts[2], e.loss));
      ENDURE_RETURN_IF_ERROR(Real(parts[3], e.ckpt_stall_s));
      ENDURE_RETURN_IF_ERROR(Integer(parts[4], e.checkpoint_step.value));
      if (parts[5] != "0" && parts[5] != "1") {
        return InvalidArgument("skipped is 0 or 1, got '" + std::string(parts[5]) + "'");
      }
      e.skipped = parts[5] == "1";
      ENDURE_RETURN_IF_ERROR(Real(parts[6], e.compute_s));
      ENDURE_RETURN_IF_ERROR(Integer(parts[7], e.total_steps));
      v.push_back(e);
      if (comma == std::string_view::npos) return Status::Ok();
      rest.remove_prefix(comma + 1);
    }
  }
  static Status Parse(const Token& t, std::vector<checkpoint::ShardCopy>& v) {
    ENDURE_ASSIGN_OR_RETURN(const std::vector<std::string> items, Items(t, 9));
    v.clear();
    for (size_t i = 0; i < items.size(); i += 9) {
      checkpoint::ShardCopy c;
      ENDURE_RETURN_IF_ERROR(Integer(items[i], c.step));
      ENDURE_RETURN_IF_ERROR(Integer(items[i + 1], c.shard));
      ENDURE_RETURN_IF_ERROR(Integer(items[i + 2], c.shards));
      ENDURE_ASSIGN_OR_RETURN(c.tier, checkpoint::TierFromName(items[i + 3]));
      c.node = items[i + 4];
      c.path = items[i + 5];
      ENDURE_RETURN_IF_ERROR(Integer(items[i + 6], c.bytes));
      auto [end, ec] = std::from_chars(items[i + 7].data(),
                                       items[i + 7].data() + items[i + 7].size(), c.xxh3, 16);
      if (ec != std::errc() || end != items[i + 7].data() + items[i + 7].size()) {
        return InvalidArgument("expected a hex checksum, got '" + items[i + 7] + "'");
      }
      c.refused = items[i + 8];
      if (c.shards < 1 || c.shard < 0 || c.shard >= c.shards) {
        return InvalidArgument("shard " + items[i + 1] + " of " + items[i + 2] +
                               " is out of range");
      }
      v.push_back(std::move(c));
    }
    return Status::Ok();
  }
  static Status Parse(const Token& t, NodeId& v) { return Parse(t, v.value); }
  static Status Parse(const Token& t, Rank& v) { return Parse(t, v.value); }
  static Status Parse(const Token& t, StepNumber& v) { return Parse(t, v.value); }
  static Status Parse(const Token& t, Generation& v) { return Parse(t, v.value); }
  static Status Parse(const Token& t, std::optional<LogAction>& v) {
    if (!t.quoted) return InvalidArgument("expected a quoted log action (\"\" for none)");
    v.reset();
    if (t.value.empty()) return Status::Ok();
    Result<LogAction> action = ParseLogAction(t.value);
    if (!action.ok()) return action.status();
    v = *action;
    return Status::Ok();
  }
  static Status Parse(const Token& t, faults::FaultKind& v) {
    if (!t.quoted) return InvalidArgument("expected a quoted fault kind");
    Result<faults::FaultKind> kind = faults::ParseFaultKind(t.value);
    if (!kind.ok()) return kind.status();
    v = *kind;
    return Status::Ok();
  }
  static Status Parse(const Token& t, TimePoint& v) {
    int64_t ns = 0;
    ENDURE_RETURN_IF_ERROR(Parse(t, ns));
    v = TimePoint{Duration{ns}};
    return Status::Ok();
  }
  template <typename T>
  static Status Parse(const Token& t, std::optional<T>& v) {
    if (!t.quoted && t.value == "-") {
      v.reset();
      return Status::Ok();
    }
    T x{};
    ENDURE_RETURN_IF_ERROR(Parse(t, x));
    v = x;
    return Status::Ok();
  }
  static Status Parse(const Token& t, std::vector<StepNumber>& v) {
    ENDURE_RETURN_IF_ERROR(Bare(t));
    v.clear();
    if (t.value == "-") return Status::Ok();
    std::string_view rest = t.value;
    while (true) {
      const size_t comma = rest.find(',');
      StepNumber x;
      ENDURE_RETURN_IF_ERROR(Integer(rest.substr(0, comma), x.value));
      v.push_back(x);
      if (comma == std::string_view::npos) return Status::Ok();
      rest.remove_prefix(comma + 1);
    }
  }

  std::map<std::string, Token> tokens_;
  Status status_ = Status::Ok();
};

// The variant alternative at `index`, default-made.
template <typename Variant, size_t... I>
Variant MakeAlternative(size_t index, std::index_sequence<I...>) {
  Variant v;
  ((index == I ? (v = std::variant_alternative_t<I, Variant>{}, 0) : 0), ...);
  return v;
}

}  // namespace

std::string EncodeEvent(const JobEvent& event) { return Encode(event, kEventKinds); }

std::string EncodeAction(const JobAction& action) { return Encode(action, kActionKinds); }

Result<JobEvent> DecodeEvent(std::string_view line) {
  const size_t space = std::min(line.find(' '), line.size());
  const std::string_view kind = line.substr(0, space);
  size_t index = std::size(kEventKinds);
  for (size_t i = 0; i < std::size(kEventKinds); ++i) {
    if (kEventKinds[i] == kind) index = i;
  }
  if (index == std::size(kEventKinds)) {
    return InvalidArgument("unknown event kind '" + std::string(kind) + "'");
  }
  Result<std::vector<Token>> tokens = Tokenize(line, space);
  if (!tokens.ok()) return InvalidArgument(std::string(kind) + ": " + tokens.status().message());
  std::map<std::string, Token> by_key;
  for (Token& t : *tokens) {
    const std::string key = t.key;
    if (!by_key.emplace(key, std::move(t)).second) {
      return InvalidArgument(std::string(kind) + ": field " + key + " appears twice");
    }
  }
  JobEvent event =
      MakeAlternative<JobEvent>(index, std::make_index_sequence<std::variant_size_v<JobEvent>>{});
  Reader reader(std::move(by_key));
  std::visit([&](auto& alt) { Fields(alt, reader); }, event);
  if (Status st = reader.Finish(); !st.ok()) {
    return InvalidArgument(std::string(kind) + ": " + st.message());
  }
  if (const auto* c = std::get_if<Configure>(&event)) {
    // The machine CHECKs its options: a damaged journal must not reach it.
    if (Status st = c->options.Validate(); !st.ok()) {
      return InvalidArgument("configure: " + st.message());
    }
  }
  return event;
}

std::string EncodeIncident(const Incident& inc, TimePoint start) {
  Writer w;
  w.out = "incident";
  auto since = [&](std::optional<TimePoint> t) -> std::optional<double> {
    if (!t) return std::nullopt;
    return Seconds(*t - start);
  };
  w("id", inc.id), w("generation", inc.generation), w("cause", inc.cause.name), w("rank", inc.rank),
      w("node", inc.node), w("action", inc.action),
      w("route", inc.route ? std::string(RecoveryRouteName(*inc.route)) : std::string()),
      w("route_reason", inc.route_reason), w("failed_at_step", inc.failed_at_step),
      w("restored_step", inc.restored_step), w("injected_s", since(inc.injected_at)),
      w("fault_s", since(inc.fault_at)), w("detected_s", since(inc.detected_at)),
      w("stopped_s", since(inc.stopped_at)), w("relaunched_s", since(inc.relaunched_at)),
      w("ready_s", since(inc.ready_at)), w("recovered_s", since(inc.recovered_at)),
      w("restore", inc.restore), w("suspects", inc.suspects), w("reason", inc.reason);
  return std::move(w.out);
}

}  // namespace endure::core
