// Scenario tests of the NodeMachine, as for the JobMachine: each file under
// tests/testdata/node_machine/ holds the node's options, the inputs the
// machine receives (with their times) and, after each input, the actions it
// produced. The test replays every file into a fresh machine and compares the
// whole text. After a deliberate change of behaviour:
//
//   ENDURE_REWRITE_TESTDATA=1 build/bin/node_machine_scenario_test
//
// and review the diff.
//
// File format (a value with blanks is quoted: text="a b"):
//
//   token = T            options: token, standby, slots, outage_capacity,
//   ---                  refusal_burst, t0_dir; then the inputs:
//   at T opened                       the first stream is open
//   at T lost | closed                the stream ended | the last one closed
//   at T break                        writes fail from now on (until opened or resumed)
//   at T resumed                      a stream is open again (a resuming hello)
//   at T command KIND gen=G [token=X] a command (start, stop, dump_stacks,
//                                     inject, prepare, pair_test, shutdown)
//   at T started gen=G cred=C ranks=0,1 [rejoin=true] [pattern=RE] [world=N]
//                [argv=a,b] [slow=ID:FACTOR] [persist_every=N]
//   at T standbys argv=a,b count=N    a spare is asked for standbys
//   at T datagram TYPE gen=G cred=C rank=R [step=S] [loss=X|none] [signal=N]
//                                    [rejoin=true] (ready)
//                [name=PHASE] [kind=K id=ID] [path=P shards=N] [t=WALL]
//                                     encoded by the worker contract's encoder
//   at T raw TEXT                     these bytes as a datagram
//   at T oversize N                   a datagram of N bytes, cut short by the socket
//   at T line gen=G rank=R text=LINE  a worker's output line
//   at T exit gen=G rank=R code=N|signal=N [stopped=true] [tail=TEXT] [kernel=TEXT]
//   at T report heartbeat|stopped [gen=G]   the shell's own reports
//   state                             what the machine holds
//   > ...                             output (recomputed: never edit by hand)
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "common/config_files.h"
#include "core/node_machine.h"
#include "faults/fault.h"
#include "tests/support/scenario_files.h"

namespace endure::core {
namespace {

using testing_support::FormatSecondsNs;
using testing_support::KeyValues;
using testing_support::Num;
using testing_support::ParseBool;
using testing_support::ParseDouble;
using testing_support::ParseInt;
using testing_support::ParseInts;
using testing_support::ParseSecondsNs;
using testing_support::QuotedWords;
using testing_support::Trim;

// The wall clock of the scenario's time 0.
constexpr double kWall0 = 1'700'000'000;

std::vector<std::string> SplitCommas(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const size_t comma = std::min(s.find(','), s.size());
    out.emplace_back(s.substr(0, comma));
    s.remove_prefix(std::min(s.size(), comma + 1));
  }
  return out;
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

// The options and the inputs' key=value words, checked: a key nobody reads
// is a typo in the file.
class Args {
 public:
  explicit Args(std::map<std::string, std::string> kv) : kv_(std::move(kv)) {}
  std::optional<std::string> Take(const std::string& key) {
    auto it = kv_.find(key);
    if (it == kv_.end()) return std::nullopt;
    std::string v = it->second;
    kv_.erase(it);
    return v;
  }
  Result<int64_t> Int(const std::string& key, int64_t fallback) {
    std::optional<std::string> v = Take(key);
    return v ? ParseInt(*v) : Result<int64_t>(fallback);
  }
  Status Done() const {
    if (kv_.empty()) return Status::Ok();
    return InvalidArgument("unknown key " + kv_.begin()->first);
  }

 private:
  std::map<std::string, std::string> kv_;
};

class Scenario {
 public:
  static Result<std::string> Run(const std::string& text) {
    Scenario s;
    return s.Replay(text);
  }

 private:
  Result<std::string> Replay(const std::string& text) {
    std::istringstream in(text);
    std::string line;
    int number = 0;
    bool header = true;
    std::map<std::string, std::string> options;
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
          if (Status st = Start(options); !st.ok()) return fail(st);
          header = false;
          continue;
        }
        const size_t eq = t.find('=');
        if (eq == std::string::npos) return fail(InvalidArgument("expected key = value or ---"));
        options[Trim(t.substr(0, eq))] = Trim(t.substr(eq + 1));
        continue;
      }
      if (Status st = Input(t); !st.ok()) return fail(st);
    }
    if (header) return InvalidArgument("no --- line ends the options");
    return out_;
  }

  Status Start(const std::map<std::string, std::string>& kv) {
    Args a(kv);
    NodeMachineOptions o;
    o.token = a.Take("token").value_or("job-token");
    if (std::optional<std::string> v = a.Take("standby")) {
      Result<bool> b = ParseBool(*v);
      if (!b.ok()) return b.status();
      o.standby = *b;
    }
    Result<int64_t> slots = a.Int("slots", 1);
    Result<int64_t> capacity = a.Int("outage_capacity", 100);
    Result<int64_t> burst = a.Int("refusal_burst", 3);
    for (const auto* r : {&slots, &capacity, &burst}) {
      if (!r->ok()) return r->status();
    }
    o.slots = static_cast<int>(*slots);
    o.outage_capacity = static_cast<size_t>(*capacity);
    o.refusal_log_burst = static_cast<int>(*burst);
    contract::DatagramContext context;
    context.t0_dir = a.Take("t0_dir").value_or("/dev/shm/endure-1-node0/t0");
    ENDURE_RETURN_IF_ERROR(a.Done());
    token_ = o.token;
    // The shipped rules: what an exit's last words are classified by.
    Result<std::vector<TextFile>> files = ReadConfigFiles(ENDURE_LOG_RULES_PATH, ".toml");
    if (!files.ok()) return files.status();
    Result<LogClassifier> classifier = LogClassifier::FromTomlFiles(*files, ENDURE_LOG_RULES_PATH);
    if (!classifier.ok()) return classifier.status();
    machine_.emplace(o, std::move(classifier).value(), context);
    return Status::Ok();
  }

  NodeMachine& m() { return *machine_; }

  NodeTime Time() const {
    return {Clock::TimePoint{} + std::chrono::nanoseconds(now_ns_), kWall0 + now_ns_ / 1e9};
  }

  Status Input(const std::string& line) {
    Result<std::vector<std::string>> words = QuotedWords(line);
    if (!words.ok()) return words.status();
    const std::vector<std::string>& w = *words;
    if (w[0] == "state") return State();
    if (w[0] != "at" || w.size() < 3) return InvalidArgument("expected at TIME INPUT or state");
    Result<int64_t> ns = ParseSecondsNs(w[1]);
    if (!ns.ok()) return ns.status();
    if (*ns < now_ns_) return InvalidArgument("time goes back to " + FormatSecondsNs(*ns));
    now_ns_ = *ns;
    const std::string& what = w[2];
    if (what == "raw") {
      const std::string rest = Trim(line.substr(line.find("raw") + 3));
      return Feed(DatagramArrived{rest, 0});
    }
    const bool positional =
        what == "command" || what == "datagram" || what == "report" || what == "oversize";
    if (positional && w.size() < 4) return InvalidArgument(what + ": what kind?");
    Result<std::map<std::string, std::string>> kv = KeyValues(w, positional ? 4 : 3);
    if (!kv.ok()) return kv.status();
    Args a(std::move(kv).value());
    if (what == "opened" || what == "resumed") {
      broken_ = false;
      const bool resuming = what == "resumed";
      proto::AgentEvent hello;
      hello.set_token(token_);
      hello.set_generation(resuming ? m().generation() : -1);
      hello.set_time_s(Time().wall_s);
      hello.mutable_register_()->set_node_id("node0");
      hello.mutable_register_()->set_resuming(resuming);
      if (resuming) hello.mutable_register_()->set_generation(m().generation());
      return Feed(StreamOpened{hello, resuming}, a);
    }
    if (what == "lost") return Feed(StreamLost{}, a);
    if (what == "closed") return Feed(StreamClosed{}, a);
    if (what == "break") {
      broken_ = true;
      return a.Done();
    }
    if (what == "command") return Command(w[3], a);
    if (what == "started") return Started(a);
    if (what == "standbys") {
      StandbysWanted s;
      s.program.argv = SplitCommas(a.Take("argv").value_or(""));
      Result<int64_t> count = a.Int("count", 0);
      if (!count.ok()) return count.status();
      s.count = static_cast<int>(*count);
      return Feed(s, a);
    }
    if (what == "datagram") return Datagram(w[3], a);
    if (what == "oversize") {
      Result<int64_t> n = ParseInt(w[3]);
      if (!n.ok()) return n.status();
      return Feed(DatagramArrived{"{", static_cast<size_t>(*n)}, a);
    }
    if (what == "line") {
      Result<int64_t> gen = a.Int("gen", 0);
      Result<int64_t> rank = a.Int("rank", 0);
      if (!gen.ok()) return gen.status();
      if (!rank.ok()) return rank.status();
      const std::string text = a.Take("text").value_or("");
      return Feed(OutputLine{*gen, static_cast<int>(*rank), text}, a);
    }
    if (what == "exit") return Exit(a);
    if (what == "report") {
      Report r;
      if (w[3] == "heartbeat") {
        r.event.mutable_heartbeat();
      } else if (w[3] == "stopped") {
        r.event.mutable_stopped()->set_workers(static_cast<int>(m().local_ranks().size()));
      } else {
        return InvalidArgument("report heartbeat or stopped, got " + w[3]);
      }
      Result<int64_t> gen = a.Int("gen", -1);
      if (!gen.ok()) return gen.status();
      r.generation = *gen;
      return Feed(r, a);
    }
    return InvalidArgument("unknown input " + what);
  }

  Status Command(const std::string& kind, Args& a) {
    proto::AgentCommand c;
    Result<int64_t> gen = a.Int("gen", 0);
    if (!gen.ok()) return gen.status();
    c.set_generation(*gen);
    c.set_token(a.Take("token").value_or(token_));
    if (kind == "start") {
      c.mutable_start();
    } else if (kind == "stop") {
      c.mutable_stop();
    } else if (kind == "dump_stacks") {
      c.mutable_dump_stacks();
    } else if (kind == "inject") {
      c.mutable_inject();
    } else if (kind == "prepare") {
      c.mutable_prepare();
    } else if (kind == "pair_test") {
      c.mutable_pair_test();
    } else if (kind == "shutdown") {
      c.mutable_shutdown();
    } else {
      return InvalidArgument("unknown command " + kind);
    }
    return Feed(CommandArrived{&c}, a);
  }

  Status Started(Args& a) {
    GenerationStarted s;
    Result<int64_t> gen = a.Int("gen", 0);
    Result<int64_t> world = a.Int("world", 0);
    Result<std::vector<int64_t>> ranks = ParseInts(a.Take("ranks").value_or(""));
    if (!gen.ok()) return gen.status();
    if (!world.ok()) return world.status();
    if (!ranks.ok()) return ranks.status();
    s.generation = *gen;
    s.world_size = static_cast<int>(*world);
    for (int64_t r : *ranks) s.ranks.insert(static_cast<int>(r));
    s.credential = a.Take("cred").value_or("");
    if (std::optional<std::string> v = a.Take("rejoin")) {
      Result<bool> b = ParseBool(*v);
      if (!b.ok()) return b.status();
      s.rejoin = *b;
    }
    s.progress_pattern = a.Take("pattern").value_or("");
    s.standby.argv = SplitCommas(a.Take("argv").value_or(""));
    Result<int64_t> every = a.Int("persist_every", 0);
    if (!every.ok()) return every.status();
    s.persist_every_steps = *every;
    if (std::optional<std::string> v = a.Take("slow")) {
      const size_t colon = v->find(':');
      Result<double> f = ParseDouble(colon == std::string::npos ? "" : v->substr(colon + 1));
      if (!f.ok()) return f.status();
      s.comm_slow_factors[v->substr(0, colon)] = *f;
    }
    return Feed(s, a);
  }

  Status Datagram(const std::string& type, Args& a) {
    contract::Datagram d;
    Result<int64_t> gen = a.Int("gen", 0);
    Result<int64_t> rank = a.Int("rank", 0);
    Result<int64_t> step = a.Int("step", 0);
    if (!gen.ok()) return gen.status();
    if (!rank.ok()) return rank.status();
    if (!step.ok()) return step.status();
    d.generation = *gen;
    d.rank = static_cast<int>(*rank);
    d.token = a.Take("cred").value_or("");
    if (std::optional<std::string> t = a.Take("t")) {
      Result<double> v = ParseDouble(*t);
      if (!v.ok()) return v.status();
      d.time_s = *v;
    }
    if (type == "step" || type == "skip") {
      contract::StepMessage s;
      s.skipped = type == "skip";
      s.step = *step;
      const std::string loss = a.Take("loss").value_or("2.5");
      if (loss != "none") {
        Result<double> v = ParseDouble(loss);
        if (!v.ok()) return v.status();
        s.loss = *v;
      }
      d.message = s;
    } else if (type == "ready") {
      contract::ReadyMessage r;
      r.start_step = *step;
      if (std::optional<std::string> v = a.Take("rejoin")) {
        Result<bool> b = ParseBool(*v);
        if (!b.ok()) return b.status();
        r.rejoin = *b;
      }
      d.message = r;
    } else if (type == "phase") {
      d.message = contract::PhaseMessage{a.Take("name").value_or("train"), *step};
    } else if (type == "stacks") {
      Result<int64_t> sig = a.Int("signal", 10);
      if (!sig.ok()) return sig.status();
      d.message = contract::StacksMessage{static_cast<int>(*sig)};
    } else if (type == "fault") {
      Result<faults::FaultKind> kind = faults::ParseFaultKind(a.Take("kind").value_or("kill"));
      if (!kind.ok()) return kind.status();
      d.message = contract::FaultMessage{a.Take("id").value_or("f1"), *kind, *step};
    } else if (type == "snapshot") {
      contract::SnapshotMessage s;
      s.step = *step;
      Result<int64_t> shards = a.Int("shards", 1);
      if (!shards.ok()) return shards.status();
      s.shards = static_cast<int>(*shards);
      s.path = a.Take("path").value_or("");
      d.message = s;
    } else if (type == "fingerprint") {
      d.message = contract::FingerprintMessage{*step, a.Take("fp").value_or("")};
    } else if (type == "heartbeat") {
      d.message = contract::HeartbeatMessage{*step};
    } else {
      return InvalidArgument("unknown datagram type " + type);
    }
    return Feed(DatagramArrived{contract::EncodeDatagram(d), 0}, a);
  }

  Status Exit(Args& a) {
    WorkerExited x;
    Result<int64_t> gen = a.Int("gen", 0);
    Result<int64_t> rank = a.Int("rank", 0);
    if (!gen.ok()) return gen.status();
    if (!rank.ok()) return rank.status();
    x.generation = *gen;
    x.rank = static_cast<int>(*rank);
    if (std::optional<std::string> sig = a.Take("signal")) {
      Result<int64_t> v = ParseInt(*sig);
      if (!v.ok()) return v.status();
      x.signal = static_cast<int>(*v);
    } else {
      Result<int64_t> code = a.Int("code", 0);
      if (!code.ok()) return code.status();
      x.exited = true;
      x.exit_code = static_cast<int>(*code);
    }
    if (std::optional<std::string> v = a.Take("stopped")) {
      Result<bool> b = ParseBool(*v);
      if (!b.ok()) return b.status();
      x.stopped = *b;
    }
    x.tail = a.Take("tail").value_or("");
    x.kernel_records = a.Take("kernel").value_or("");
    return Feed(x, a);
  }

  Status State() {
    std::string ranks, steps, signals;
    for (int r : m().local_ranks()) {
      ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
      steps += (steps.empty() ? "" : ",") + std::to_string(m().last_step(r));
    }
    for (const auto& [rank, sig] : m().stack_signals(m().generation())) {
      signals += (signals.empty() ? "" : ",") + std::to_string(rank) + ":" + std::to_string(sig);
    }
    out_ += "> state generation=" + std::to_string(m().generation()) +
            " ranks=" + (ranks.empty() ? "-" : ranks) +
            " last_steps=" + (steps.empty() ? "-" : steps) +
            " stack_signals=" + (signals.empty() ? "-" : signals) +
            " member=" + (m().member() ? "true" : "false") +
            " reads_output=" + (m().reads_output() ? "true" : "false") +
            " refused=" + std::to_string(m().refused()) +
            " outage=" + std::to_string(m().outage_size()) + "\n";
    return Status::Ok();
  }

  Status Feed(const NodeInput& input, Args& a) {
    ENDURE_RETURN_IF_ERROR(a.Done());
    return Feed(input);
  }

  // Steps the machine and writes each action; with `break` in force the
  // writes fail, and go back in as TransmitFailed, as the shell does.
  Status Feed(const NodeInput& input) {
    std::vector<NodeAction> actions = m().Step(input, Time());
    std::vector<proto::AgentEvent> unsent;
    for (NodeAction& action : actions) {
      if (auto* t = std::get_if<Transmit>(&action)) {
        out_ += std::string(broken_ || !unsent.empty() ? "> unsent " : "> transmit ") +
                EventText(t->event) + "\n";
        if (broken_ || !unsent.empty()) unsent.push_back(std::move(t->event));
      } else {
        out_ += "> " + ActionText(action) + "\n";
      }
    }
    if (!unsent.empty()) {
      const std::vector<NodeAction> more = m().Step(TransmitFailed{std::move(unsent)}, Time());
      if (!more.empty()) return InvalidArgument("TransmitFailed produced actions");
    }
    return Status::Ok();
  }

  std::string EventText(const proto::AgentEvent& e) const {
    proto::AgentEvent body = e;
    std::string head = "gen=" + std::to_string(e.generation()) +
                       " t=" + Num(std::round((e.time_s() - kWall0) * 1000) / 1000) +
                       (e.token() == token_ ? "" : " token=" + e.token());
    body.clear_token();
    body.clear_generation();
    body.clear_time_s();
    return head + " " + body.ShortDebugString();
  }

  static std::string ActionText(const NodeAction& action) {
    return std::visit(
        [](const auto& a) -> std::string {
          using T = std::decay_t<decltype(a)>;
          if constexpr (std::is_same_v<T, LogLine>) {
            return "log " + a.text;
          } else if constexpr (std::is_same_v<T, CarryOut>) {
            return "carry_out";
          } else if constexpr (std::is_same_v<T, RefillStandbys>) {
            return "refill_standbys argv=" + Join(a.program.argv) +
                   " count=" + std::to_string(a.count);
          } else if constexpr (std::is_same_v<T, DiscardOtherStandbys>) {
            return "discard_other_standbys argv=" + Join(a.program.argv);
          } else if constexpr (std::is_same_v<T, NotifySnapshot>) {
            return "notify_snapshot rank=" + std::to_string(a.rank) +
                   " step=" + std::to_string(a.step) + " shards=" + std::to_string(a.shards) +
                   " path=" + a.path + (a.durable ? " durable" : "");
          } else if constexpr (std::is_same_v<T, BreakPairTests>) {
            return a.fail ? "break_pair_tests fail" : "break_pair_tests slow=" + Num(a.slow_factor);
          } else if constexpr (std::is_same_v<T, ForgetLastWords>) {
            return "forget_last_words rank=" + std::to_string(a.rank);
          } else {
            return "transmit";
          }
        },
        action);
  }

  std::optional<NodeMachine> machine_;
  std::string token_;
  int64_t now_ns_ = 0;
  bool broken_ = false;
  std::string out_;
};

class NodeMachineScenario : public testing::TestWithParam<std::string> {};

TEST_P(NodeMachineScenario, OutputMatchesTheFile) {
  const std::string failure = testing_support::CheckScenarioFile(
      ENDURE_SCENARIO_DIR, GetParam(), Scenario::Run, "node_machine_scenario_test");
  EXPECT_TRUE(failure.empty()) << failure;
}

INSTANTIATE_TEST_SUITE_P(Files, NodeMachineScenario,
                         testing::ValuesIn(testing_support::ScenarioFiles(ENDURE_SCENARIO_DIR)),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return testing_support::ScenarioTestName(info.param);
                         });

}  // namespace
}  // namespace endure::core
