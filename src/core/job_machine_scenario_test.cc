// Scenario tests of the JobMachine, in the style of etcd-io/raft's
// datadriven tests: each file under tests/testdata/job_machine/ holds a job's
// configuration, the inputs the machine receives (events in job_codec's line
// form, with their times) and, after each input, the output it produced (its
// actions, and the incident lines the input created or changed). The test
// replays every file into a fresh machine and compares the whole text.
//
// After a deliberate change of behaviour, regenerate the expected output with
//
//   ENDURE_REWRITE_TESTDATA=1 build/bin/job_machine_scenario_test
//
// and review the diff: it is the change of behaviour.
//
// File format:
//
//   # comments and blank lines are kept as they are
//   nodes = 2                      options, `key = value` (see ApplyOption)
//   fault = f1 kill rank=1 step=8  an external fault (step= or at=DURATION)
//   ---                            end of the options
//   at 0 node_up node=0 name="node0" slots=1     an event at 0 s
//   at +0.5 heartbeat node=0                     half a second later
//   > start_generation ...         output (recomputed: never edit by hand)
//
// Besides event lines, these helpers expand into the events a healthy
// cluster sends, for the current generation (the outputs of steps and ticks
// are prefixed by the time of the event that produced them):
//
//   at T ready START_STEP [restore_s=X] [rejoin=true|false] [deterministic=true|false]
//                                        every rank: worker_ready
//   at T stopped [NODES]                 every member node (or NODES, e.g.
//                                        0,2): generation_stopped
//   steps A..B every DT [loss=X] [checkpoint_every=N]
//       for each step s: time advances by DT, every member node beats,
//       every rank reports step_end s (rank 0 reports a checkpoint of s when
//       N divides s; default 10, 0: never), then a tick. Stops early when the
//       generation stops running.
//   ticks until T every DT [beats=NODES|-]
//       time advances by DT up to T; each time the nodes beat (default: the
//       generation's members; -: none) and a tick follows.
//   state                                the machine's phase, generation,
//                                        step, checkpoints and ETTR ledger
#include <gtest/gtest.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/job_codec.h"
#include "core/job_machine.h"
#include "tests/support/scenario_files.h"

namespace endure::core {
namespace {

using testing_support::FormatSecondsNs;
using testing_support::KeyValues;
using testing_support::Num;
using testing_support::ParseBool;
using testing_support::ParseDouble;
using testing_support::ParseInt;
using testing_support::ParseSecondsNs;
using testing_support::Trim;
using testing_support::Words;

// ---- Small parsers ----

Result<std::vector<NodeId>> ParseNodes(std::string_view s) {
  std::vector<NodeId> out;
  if (s == "-") return out;
  Result<std::vector<int64_t>> ints = testing_support::ParseInts(s);
  if (!ints.ok()) return ints.status();
  for (int64_t n : *ints) out.push_back(NodeId{static_cast<int32_t>(n)});
  return out;
}

// ---- Options ----

Status SetDuration(Duration& d, std::string_view v) {
  if (v == "0") {
    d = Duration(0);
    return Status::Ok();
  }
  Result<Duration> r = ParseDuration(v);
  if (!r.ok()) return r.status();
  d = *r;
  return Status::Ok();
}
template <typename T>
Status SetInt(T& x, std::string_view v) {
  Result<int64_t> r = ParseInt(v);
  if (!r.ok()) return r.status();
  x = static_cast<T>(*r);
  return Status::Ok();
}
Status SetDouble(double& x, std::string_view v) {
  Result<double> r = ParseDouble(v);
  if (!r.ok()) return r.status();
  x = *r;
  return Status::Ok();
}
Status SetBool(bool& x, std::string_view v) {
  Result<bool> r = ParseBool(v);
  if (!r.ok()) return r.status();
  x = *r;
  return Status::Ok();
}
Status SetPath(RecoveryPath& p, std::string_view v) {
  Result<RecoveryPath> r = ParseRecoveryPath(v);
  if (!r.ok()) return r.status();
  p = *r;
  return Status::Ok();
}

// `fault = ID KIND rank=R step=S` or `... at=DURATION`.
Result<ExternalFault> ParseFault(std::string_view v) {
  const std::vector<std::string> w = Words(v);
  if (w.size() < 2) return InvalidArgument("a fault is: ID KIND rank=R (step=S | at=DURATION)");
  ExternalFault f;
  f.id = w[0];
  Result<faults::FaultKind> kind = faults::ParseFaultKind(w[1]);
  if (!kind.ok()) return kind.status();
  f.kind = *kind;
  Result<std::map<std::string, std::string>> kv = KeyValues(w, 2);
  if (!kv.ok()) return kv.status();
  for (const auto& [key, value] : *kv) {
    Status st = Status::Ok();
    if (key == "rank") {
      st = SetInt(f.rank.value, value);
    } else if (key == "step") {
      st = SetInt(f.step.value, value);
    } else if (key == "at") {
      Duration at{0};
      st = SetDuration(at, value);
      f.at = at;
    } else {
      st = InvalidArgument("unknown fault field " + key);
    }
    if (!st.ok()) return st;
  }
  return f;
}

// A scenario's defaults: two nodes of one rank, no backoff (restarts are
// immediate, which keeps the files short); everything else is the machine's
// own default.
JobMachineOptions DefaultOptions() {
  JobMachineOptions o;
  o.nodes = 2;
  o.ranks_per_node = 1;
  o.recovery.backoff_initial = Duration(0);
  return o;
}

Status ApplyOption(const std::string& key, const std::string& v, JobMachineOptions& o,
                   std::vector<ExternalFault>& faults) {
  using Setter = std::function<Status(std::string_view)>;
  const std::map<std::string, Setter> setters = {
      {"nodes", [&](auto s) { return SetInt(o.nodes, s); }},
      {"ranks_per_node", [&](auto s) { return SetInt(o.ranks_per_node, s); }},
      {"min_nodes", [&](auto s) { return SetInt(o.min_nodes, s); }},
      {"first_generation", [&](auto s) { return SetInt(o.first_generation.value, s); }},
      {"replacement_timeout", [&](auto s) { return SetDuration(o.replacement_timeout, s); }},
      {"detect_loss_anomalies", [&](auto s) { return SetBool(o.detect_loss_anomalies, s); }},
      {"in_process", [&](auto s) { return SetBool(o.in_process, s); }},
      {"hang.floor", [&](auto s) { return SetDuration(o.hang.floor, s); }},
      {"hang.k", [&](auto s) { return SetDouble(o.hang.k, s); }},
      {"hang.min_samples", [&](auto s) { return SetInt(o.hang.min_samples, s); }},
      {"hang.startup_timeout", [&](auto s) { return SetDuration(o.hang.startup_timeout, s); }},
      {"heartbeat.timeout", [&](auto s) { return SetDuration(o.heartbeat.timeout, s); }},
      {"heartbeat.drop_grace", [&](auto s) { return SetDuration(o.heartbeat.drop_grace, s); }},
      {"loss.window", [&](auto s) { return SetInt(o.loss.window, s); }},
      {"loss.min_count", [&](auto s) { return SetInt(o.loss.min_count, s); }},
      {"loss.z_threshold", [&](auto s) { return SetDouble(o.loss.z_threshold, s); }},
      {"anomaly.max_skipped_steps", [&](auto s) { return SetInt(o.anomaly.max_skipped_steps, s); }},
      {"anomaly.on_data_spike",
       [&](auto s) -> Status {
         ENDURE_ASSIGN_OR_RETURN(o.anomaly.on_data_spike, ParseDataSpikeAction(s));
         return Status::Ok();
       }},
      {"recovery.default_path", [&](auto s) { return SetPath(o.recovery.default_path, s); }},
      {"recovery.max_restarts_in_window",
       [&](auto s) { return SetInt(o.recovery.max_restarts_in_window, s); }},
      {"recovery.restart_window",
       [&](auto s) { return SetDuration(o.recovery.restart_window, s); }},
      {"recovery.backoff_initial",
       [&](auto s) { return SetDuration(o.recovery.backoff_initial, s); }},
      {"recovery.backoff_max", [&](auto s) { return SetDuration(o.recovery.backoff_max, s); }},
      {"recovery.structural_repeats",
       [&](auto s) { return SetInt(o.recovery.structural_repeats, s); }},
      {"recovery.startup_repeats", [&](auto s) { return SetInt(o.recovery.startup_repeats, s); }},
      {"recovery.evict_node_after", [&](auto s) { return SetInt(o.recovery.evict_node_after, s); }},
  };
  if (key.starts_with("recovery.path.")) {
    RecoveryPath p{};
    ENDURE_RETURN_IF_ERROR(SetPath(p, v));
    o.recovery.paths[key.substr(std::string("recovery.path.").size())] = p;
    return Status::Ok();
  }
  if (key == "fault") {
    Result<ExternalFault> f = ParseFault(v);
    if (!f.ok()) return f.status();
    faults.push_back(*f);
    return Status::Ok();
  }
  auto it = setters.find(key);
  if (it == setters.end()) return InvalidArgument("unknown option " + key);
  return it->second(v);
}

// ---- Running a scenario ----

class Scenario {
 public:
  // Replays `text` and returns it with every output recomputed.
  static Result<std::string> Run(const std::string& text) {
    Scenario s;
    return s.Replay(text);
  }
  // The same, with the machine restored from a snapshot of itself before
  // every input (a controller that restarted from its snapshot each time).
  static Result<std::string> RunRestoringEachInput(const std::string& text) {
    Scenario s;
    s.restore_each_input_ = true;
    return s.Replay(text);
  }

 private:
  Result<std::string> Replay(const std::string& text) {
    std::istringstream in(text);
    std::string line;
    int number = 0;
    bool header = true;
    JobMachineOptions options = DefaultOptions();
    std::vector<ExternalFault> faults;
    while (std::getline(in, line)) {
      ++number;
      auto fail = [&](const Status& st) {
        return InvalidArgument("line " + std::to_string(number) + ": " + st.message());
      };
      const std::string t = Trim(line);
      if (t.starts_with(">")) continue;  // an old output: recomputed below
      out_ += line + "\n";
      if (t.empty() || t.starts_with("#")) continue;
      if (header) {
        if (t == "---") {
          if (Status st = options.Validate(); !st.ok()) return fail(st);
          machine_.emplace(options, faults, At(Duration(0)));
          ranks_per_node_ = options.ranks_per_node;
          header = false;
          continue;
        }
        const size_t eq = t.find('=');
        if (eq == std::string::npos) return fail(InvalidArgument("expected key = value or ---"));
        if (Status st = ApplyOption(Trim(t.substr(0, eq)), Trim(t.substr(eq + 1)), options, faults);
            !st.ok()) {
          return fail(st);
        }
        continue;
      }
      if (Status st = Input(t); !st.ok()) return fail(st);
    }
    if (header) return InvalidArgument("no --- line ends the options");
    return out_;
  }

  JobMachine& m() { return *machine_; }

  Status Input(const std::string& line) {
    const std::vector<std::string> w = Words(line);
    if (w[0] == "at") {
      if (w.size() < 3) return InvalidArgument("expected at TIME EVENT");
      const bool relative = w[1].starts_with("+");
      Result<int64_t> ns = ParseSecondsNs(relative ? w[1].substr(1) : w[1]);
      if (!ns.ok()) return ns.status();
      const int64_t at = relative ? now_ns_ + *ns : *ns;
      if (at < now_ns_) return InvalidArgument("time goes back to " + FormatSecondsNs(at));
      now_ns_ = at;
      // What follows the time (the line starts with "at", then the time).
      const std::string rest = Trim(line.substr(line.find(w[1], 2) + w[1].size()));
      const std::vector<std::string> rw = Words(rest);
      if (rw[0] == "ready") return Ready(rw);
      if (rw[0] == "stopped") return Stopped(rw);
      Result<JobEvent> e = DecodeEvent(rest);
      if (!e.ok()) return e.status();
      Feed(*e, /*with_time=*/false);
      return Status::Ok();
    }
    if (w[0] == "steps") return Steps(w);
    if (w[0] == "ticks") return Ticks(w);
    if (w[0] == "state") return State();
    return InvalidArgument("expected at, steps, ticks or state, got '" + w[0] + "'");
  }

  // The nodes of the current generation, in rank order.
  std::vector<NodeId> Members() { return m().members(); }
  // Its ranks: fewer than the job's after a shrink.
  int World() { return static_cast<int>(m().members().size()) * ranks_per_node_; }

  Status Ready(const std::vector<std::string>& w) {
    if (w.size() < 2) {
      return InvalidArgument(
          "expected ready START_STEP [restore_s=X] [rejoin=true|false] "
          "[deterministic=true|false]");
    }
    Result<int64_t> start = ParseInt(w[1]);
    if (!start.ok()) return start.status();
    Result<std::map<std::string, std::string>> kv = KeyValues(w, 2);
    if (!kv.ok()) return kv.status();
    double restore_s = 0;
    if (kv->count("restore_s")) ENDURE_RETURN_IF_ERROR(SetDouble(restore_s, kv->at("restore_s")));
    bool flags[2] = {false, false};
    const char* names[2] = {"rejoin", "deterministic"};
    for (int i = 0; i < 2; ++i) {
      if (!kv->count(names[i])) continue;
      const std::string& v = kv->at(names[i]);
      if (v != "true" && v != "false") {
        return InvalidArgument(std::string(names[i]) + "=" + v + ": true or false");
      }
      flags[i] = v == "true";
    }
    const Generation gen = m().generation();
    for (int r = 0; r < World(); ++r)
      Feed(WorkerReady{gen, Rank{r}, StepNumber{*start}, restore_s, flags[0], flags[1]}, false);
    return Status::Ok();
  }

  Status Stopped(const std::vector<std::string>& w) {
    std::vector<NodeId> nodes = Members();
    if (w.size() > 1) {
      Result<std::vector<NodeId>> n = ParseNodes(w[1]);
      if (!n.ok()) return n.status();
      nodes = *n;
    }
    const Generation gen = m().generation();
    for (NodeId n : nodes) Feed(GenerationStoppedEvent{gen, n}, false);
    return Status::Ok();
  }

  Status Steps(const std::vector<std::string>& w) {
    // steps A..B every DT [loss=X] [checkpoint_every=N]
    const size_t dots = w.size() > 1 ? w[1].find("..") : std::string::npos;
    if (w.size() < 4 || dots == std::string::npos || w[2] != "every" || !w[3].ends_with("s")) {
      return InvalidArgument("expected steps A..B every DTs [loss=X] [checkpoint_every=N]");
    }
    Result<int64_t> from = ParseInt(w[1].substr(0, dots));
    Result<int64_t> to = ParseInt(w[1].substr(dots + 2));
    Result<int64_t> dt = ParseSecondsNs(w[3].substr(0, w[3].size() - 1));
    if (!from.ok()) return from.status();
    if (!to.ok()) return to.status();
    if (!dt.ok()) return dt.status();
    Result<std::map<std::string, std::string>> kv = KeyValues(w, 4);
    if (!kv.ok()) return kv.status();
    double loss = 2.0;
    int64_t every = 10;
    for (const auto& [key, value] : *kv) {
      if (key == "loss") {
        ENDURE_RETURN_IF_ERROR(SetDouble(loss, value));
      } else if (key == "checkpoint_every") {
        ENDURE_RETURN_IF_ERROR(SetInt(every, value));
      } else {
        return InvalidArgument("unknown steps option " + key);
      }
    }
    const Generation gen = m().generation();
    for (int64_t s = *from; s <= *to; ++s) {
      if (m().phase() != JobPhase::kRunning || m().generation() != gen) break;
      now_ns_ += *dt;
      for (NodeId n : Members()) Feed(NodeHeartbeat{n}, true);
      for (int r = 0; r < World(); ++r) {
        const bool ckpt = r == 0 && every > 0 && s % every == 0;
        Feed(StepEnd{gen, Rank{r}, StepNumber{s}, loss, 0, StepNumber{ckpt ? s : -1}, false}, true);
      }
      Feed(Tick{}, true);
    }
    return Status::Ok();
  }

  Status Ticks(const std::vector<std::string>& w) {
    // ticks until T every DT [beats=NODES|-]
    if (w.size() < 5 || w[1] != "until" || w[3] != "every" || !w[4].ends_with("s")) {
      return InvalidArgument("expected ticks until T every DTs [beats=NODES|-]");
    }
    Result<int64_t> until = ParseSecondsNs(w[2]);
    Result<int64_t> dt = ParseSecondsNs(w[4].substr(0, w[4].size() - 1));
    if (!until.ok()) return until.status();
    if (!dt.ok()) return dt.status();
    if (*dt <= 0) return InvalidArgument("ticks need a positive interval");
    Result<std::map<std::string, std::string>> kv = KeyValues(w, 5);
    if (!kv.ok()) return kv.status();
    std::optional<std::vector<NodeId>> beats;
    for (const auto& [key, value] : *kv) {
      if (key != "beats") return InvalidArgument("unknown ticks option " + key);
      Result<std::vector<NodeId>> n = ParseNodes(value);
      if (!n.ok()) return n.status();
      beats = *n;
    }
    while (now_ns_ + *dt <= *until) {
      now_ns_ += *dt;
      for (NodeId n : beats ? *beats : Members()) Feed(NodeHeartbeat{n}, true);
      Feed(Tick{}, true);
    }
    return Status::Ok();
  }

  Status State() {
    const EttrLedger& l = m().ledger();
    std::string ckpts;
    for (StepNumber s : m().checkpoints().Restorable()) {
      ckpts += (ckpts.empty() ? "" : ",") + std::to_string(s.value);
    }
    out_ += "> state phase=" + std::string(JobPhaseName(m().phase())) +
            " generation=" + std::to_string(m().generation().value) +
            " step=" + std::to_string(m().step().value) +
            " checkpoints=" + (ckpts.empty() ? "-" : ckpts) +
            " incidents=" + std::to_string(m().incidents().size()) + "\n";
    out_ += "> ledger wall=" + Num(Seconds(l.wall()));
    for (int i = 0; i < kNumLedgerCategories; ++i) {
      const auto c = static_cast<LedgerCategory>(i);
      out_ += " " + std::string(LedgerCategoryName(c)) + "=" + Num(Seconds(l.total(c)));
    }
    out_ += "\n";
    return Status::Ok();
  }

  // Steps the machine at the current time and writes what came out: the
  // actions, then every incident the input created or changed. Outputs of a
  // helper's events carry their time.
  void Feed(const JobEvent& e, bool with_time) {
    if (restore_each_input_) {
      Result<JobMachine> restored = JobMachine::FromSnapshot(m().Snapshot(), At(Duration(0)));
      ENDURE_CHECK(restored.ok());
      machine_ = std::move(*restored);
    }
    const std::vector<JobAction> actions = m().Step(e, At(Duration(now_ns_)));
    const std::string prefix = with_time ? "> at " + FormatSecondsNs(now_ns_) + " " : "> ";
    for (const JobAction& a : actions) out_ += prefix + EncodeAction(a) + "\n";
    const std::vector<Incident>& incidents = m().incidents();
    incident_lines_.resize(incidents.size());
    for (size_t i = 0; i < incidents.size(); ++i) {
      std::string line = EncodeIncident(incidents[i], At(Duration(0)));
      if (line != incident_lines_[i]) {
        out_ += prefix + line + "\n";
        incident_lines_[i] = std::move(line);
      }
    }
  }

  std::optional<JobMachine> machine_;
  int64_t now_ns_ = 0;
  int ranks_per_node_ = 1;
  std::string out_;
  std::vector<std::string> incident_lines_;
  bool restore_each_input_ = false;
};

// ---- The test: one per file ----

class JobMachineScenario : public testing::TestWithParam<std::string> {};

TEST_P(JobMachineScenario, OutputMatchesTheFile) {
  const std::string failure = testing_support::CheckScenarioFile(
      ENDURE_SCENARIO_DIR, GetParam(), Scenario::Run, "job_machine_scenario_test");
  EXPECT_TRUE(failure.empty()) << failure;
}

// A snapshot holds all the machine acts on: restored from one before every
// input, it writes the file's output unchanged.
TEST_P(JobMachineScenario, OutputIsTheSameWhenRestoredFromASnapshotBeforeEveryInput) {
  std::ifstream in(std::filesystem::path(ENDURE_SCENARIO_DIR) / GetParam());
  std::stringstream text;
  text << in.rdbuf();
  Result<std::string> out = Scenario::RunRestoringEachInput(text.str());
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, text.str());
}

INSTANTIATE_TEST_SUITE_P(Files, JobMachineScenario,
                         testing::ValuesIn(testing_support::ScenarioFiles(ENDURE_SCENARIO_DIR)),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return testing_support::ScenarioTestName(info.param);
                         });

}  // namespace
}  // namespace endure::core
