#include "core/job_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "common/hash.h"

namespace endure::core {
namespace {

using namespace std::chrono_literals;
using faults::FaultKind;

// Every kind of event reads back as it was written, field for field (the
// journal replays what it wrote).
TEST(JobCodec, EveryEventKindRoundTrips) {
  const std::vector<JobEvent> events = {
      NodeUp{NodeId{3}, "host-a", 8},
      NodeDown{NodeId{1}, "stream dropped: \"reset\"\nby peer\t\x01"},
      NodeHeartbeat{NodeId{0}},
      WorkerReady{2, 7, 40, 0.1 + 0.2},
      StepEnd{1, 0, 12, 2.4810000000000001, 0.003, 10, true},
      StepEnd{1, 1, 13, std::numeric_limits<double>::quiet_NaN(), 0, -1, false},
      StepEnd{1, 1, 14, -std::numeric_limits<double>::infinity(), 0, -1, false},
      WorkerExitEvent{0, 1, NodeId{1}, std::nullopt, 9, "cuda", LogAction::kRestart, "xid",
                      "Xid 79 \xc3\xa9"},
      WorkerExitEvent{0, 1, NodeId{1}, 3, std::nullopt, "", std::nullopt, "", ""},
      FaultFiredEvent{0, 1, "f1", FaultKind::kKill, 12, At(1234567890ns)},
      GenerationStoppedEvent{4, NodeId{2}},
      StackDumpEvent{1, 0, "#0 0x1 in main ()\n#1 ..."},
      PersistFailedEvent{0, 1, 5, NodeId{1}, "No space left on device"},
      DurableListed{{{StepNumber{10}, 2}, {StepNumber{20}, 4}}, {StepNumber{30}}},
      DurableListed{{}, {}},
      RestoreChosen{1, "step 10 from T0 x2"},
      RestoreChosen{1, "step 10 from T0 x1, T2 x1", StepNumber{10}, 1, 0, 1},
      ShardPersisted{Generation{2}, NodeId{1}, StepNumber{40}, 1, 2, 1 << 20, 0xfedcba9876543210u,
                     3u << 30, 1u << 30},
      ManifestWritten{StepNumber{40}, ""},
      ManifestWritten{StepNumber{40}, "No space left on device"},
      StepRemoved{StepNumber{30}, "Permission \"denied\""},
      InventoryReported{NodeId{1},
                        {checkpoint::ShardCopy{12, 0, 2, checkpoint::Tier::kT0, "node1",
                                               "/dev/shm/a b,\"c\"", 1024, 0xabcdefu, ""},
                         checkpoint::ShardCopy{12, 1, 2, checkpoint::Tier::kT1, "node1", "/x", 1024,
                                               0, "checksum mismatch"}},
                        4096,
                        2048},
      InventoryReported{NodeId{0}, {}, 0, 0},
      ShardRefused{StepNumber{20}, 1, "checksum mismatch"},
      ControllerResumed{},
      Tick{},
      NodeStepsEnd{NodeId{1},
                   Generation{3},
                   {StepEnd{3, 8, 12, 2.4810000000000001, 0.003, 10, false, 0.9, 100},
                    StepEnd{3, 9, 12, std::numeric_limits<double>::quiet_NaN(), 0, -1, true}}},
      NodeStepsEnd{NodeId{0}, Generation{0}, {}},
  };
  for (const JobEvent& e : events) {
    const std::string line = EncodeEvent(e);
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
    Result<JobEvent> back = DecodeEvent(line);
    ASSERT_TRUE(back.ok()) << line << ": " << back.status().message();
    EXPECT_EQ(back->index(), e.index()) << line;
    EXPECT_EQ(EncodeEvent(*back), line);
  }
}

TEST(JobCodec, DoublesReadBackBitForBit) {
  for (double loss : {2.4810000000000001, 1.0 / 3.0, 5e-324, 1.7976931348623157e308, -0.0}) {
    Result<JobEvent> back = DecodeEvent(EncodeEvent(StepEnd{0, 0, 1, loss, 0, -1, false}));
    ASSERT_TRUE(back.ok());
    const double got = std::get<StepEnd>(*back).loss;
    EXPECT_EQ(std::signbit(got), std::signbit(loss));
    EXPECT_EQ(got, loss);
  }
  Result<JobEvent> nan = DecodeEvent(
      EncodeEvent(StepEnd{0, 0, 1, std::numeric_limits<double>::quiet_NaN(), 0, -1, false}));
  ASSERT_TRUE(nan.ok());
  EXPECT_TRUE(std::isnan(std::get<StepEnd>(*nan).loss));
}

TEST(JobCodec, ALineReadsAsWritten) {
  EXPECT_EQ(
      EncodeEvent(WorkerExitEvent{0, 1, NodeId{1}, std::nullopt, 9, "", std::nullopt, "", ""}),
      "worker_exit generation=0 rank=1 node=1 exit_code=- signal=9 log_cause=\"\" "
      "log_action=\"\" log_rule=\"\" log_line=\"\" stopped=false");
  Result<JobEvent> e = DecodeEvent(
      "step_end  rank=1 generation=2 step=5 loss=2.5 ckpt_stall_s=0 "
      "checkpoint_step=-1 skipped=false");
  ASSERT_TRUE(e.ok()) << e.status().message();
  const StepEnd& s = std::get<StepEnd>(*e);
  EXPECT_EQ(s.generation.value, 2);
  EXPECT_EQ(s.rank.value, 1);
  EXPECT_EQ(s.step.value, 5);
  EXPECT_EQ(s.loss, 2.5);
}

// A damaged line is refused with what is wrong, never half-read.
TEST(JobCodec, MalformedLinesSayWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "unknown event kind ''"},
      {"reboot node=1", "unknown event kind 'reboot'"},
      {"heartbeat", "heartbeat: missing field node"},
      {"heartbeat node=x", "heartbeat: node: expected an integer, got 'x'"},
      {"heartbeat node=1 node=2", "heartbeat: field node appears twice"},
      {"heartbeat node=1 colour=2", "heartbeat: unknown field colour"},
      {"heartbeat node=99999999999", "expected an integer"},
      {"heartbeat node", "heartbeat: expected key=value at 'node'"},
      {"node_down node=1 reason=unquoted", "node_down: reason: expected a quoted string"},
      {"node_down node=1 reason=\"open", "reason: a quoted string is not closed"},
      {"node_down node=1 reason=\"\\q\"", "unknown escape \\q"},
      {"node_down node=1 reason=\"\\x4\"", "two hex digits"},
      {"node_up node=\"1\" name=\"a\" slots=1", "node: expected a number or word"},
      {"step_end generation=0 rank=0 step=1 loss=fast ckpt_stall_s=0 checkpoint_step=-1 "
       "skipped=false",
       "loss: expected a number, got 'fast'"},
      {"step_end generation=0 rank=0 step=1 loss=1 ckpt_stall_s=0 checkpoint_step=-1 "
       "skipped=yes",
       "skipped: expected true or false, got 'yes'"},
      {"durable_listed committed=1:2,,2:2 leftovers=-", "committed: expected step:shards, got ''"},
      {"durable_listed committed=1:0 leftovers=-", "a committed step has at least one shard"},
      {"inventory node=1 copies=\"1\",\"0\" t0_bytes=0 t1_bytes=0",
       "copies: expected quoted strings in groups of 9"},
      {"inventory node=1 copies=\"1\",\"2\",\"2\",\"T0\",\"n\",\"/p\",\"1\",\"ff\",\"\" "
       "t0_bytes=0 t1_bytes=0",
       "shard 2 of 2 is out of range"},
      {"shard_persisted generation=0 node=0 step=5 shard=0 shards=1 bytes=-1 xxh3=0 t0_bytes=0 "
       "t1_bytes=0",
       "bytes: expected an integer, got '-1'"},
      {"fault_fired generation=0 rank=1 id=\"f1\" kind=\"kil\" step=3 at=0",
       "fault_fired: kind: unknown fault kind 'kil'"},
      {"fault_fired generation=0 rank=1 id=\"f1\" kind=kill step=3 at=0",
       "kind: expected a quoted fault kind"},
      {"node_steps node=1 generation=0 ranks=0:5:2.5:0:-1:0:0.9",
       "ranks: expected rank:step:loss:ckpt_stall_s:checkpoint_step:skipped:compute_s:"
       "total_steps, got '0:5:2.5:0:-1:0:0.9'"},
      {"node_steps node=1 generation=0 ranks=0:5:2.5:0:-1:2:0.9:0", "skipped is 0 or 1"},
      {"node_steps node=1 generation=0 ranks=0:5:x:0:-1:0:0.9:0", "expected a number, got 'x'"},
      {"node_steps node=1 generation=0 ranks=0:5:2.5:0:-1:0:0.9:0:7", "expected rank:step"},
      {"node_steps node=1 generation=0 ranks=\"0:5\"", "expected a number or word"},
  };
  for (const auto& [line, want] : cases) {
    Result<JobEvent> e = DecodeEvent(line);
    ASSERT_FALSE(e.ok()) << line;
    EXPECT_NE(e.status().message().find(want), std::string::npos)
        << line << " -> " << e.status().message();
  }
}

TEST(JobCodec, ActionsAndIncidentsAreOneLineEach) {
  ExternalFault fault{"f2", FaultKind::kKillAgent, 1, -1, 5s};
  EXPECT_EQ(EncodeAction(InjectFaultAction{fault, NodeId{1}, 0}),
            "inject_fault fault=\"f2\" kind=\"kill-agent\" rank=1 step=-1 at=5000000000 node=1 "
            "generation=0");
  EXPECT_EQ(
      EncodeAction(StartGenerationAction{1, {NodeId{0}, NodeId{2}}, -1, -1, {}, {"a", "b"}, true}),
      "start_generation generation=1 nodes=0,2 restore_step=-1 abandoned_from=-1 "
      "skip_steps=- fired_faults=\"a\",\"b\" rejoin=true rejoin_from_tiers=false");
  Incident inc;
  inc.id = 1;
  inc.cause = ParseIncidentCause("worker_crash");
  inc.fault_at = At(1500ms);
  inc.detected_at = At(1600ms);
  inc.reason = "a\nb";
  inc.route = RecoveryRoute::kInProcess;
  const std::string line = EncodeIncident(inc, At(0s));
  EXPECT_NE(line.find("route=\"in_process\""), std::string::npos) << line;
  EXPECT_NE(line.find("fault_s=1.5 detected_s=1.6 stopped_s=-"), std::string::npos) << line;
  EXPECT_NE(line.find("reason=\"a\\nb\""), std::string::npos) << line;
}

// An incident's cause read back by its name (from the state directory) is
// the cause it was: the kind and the very same name.
TEST(IncidentCause, ANameReadsBackAsItsKind) {
  const std::vector<std::pair<std::string, Cause>> cases = {
      {"hang", Cause::kHang},
      {"node_lost", Cause::kNodeLost},
      {"loss_nan", Cause::kLossNan},
      {"loss_inf", Cause::kLossInf},
      {"loss_spike", Cause::kLossSpike},
      {"checkpoint persistence failing", Cause::kPersistenceFailing},
      {"worker_exit code 2", Cause::kWorkerExit},
      {"signal 9 SIGKILL", Cause::kSignal},
      {"xid_79", Cause::kLogRule},
      {"user_exception", Cause::kLogRule},
  };
  for (const auto& [name, kind] : cases) {
    const IncidentCause cause = ParseIncidentCause(name);
    EXPECT_EQ(cause.kind, kind) << name;
    EXPECT_EQ(cause.name, name);
  }
  EXPECT_EQ(FixedCause(Cause::kHang), ParseIncidentCause("hang"));
  EXPECT_EQ(LossAnomalyCauseOf(LossAnomalyKind::kSpike).name, "loss_spike");
}

// ---- Replay: a journal rebuilds the machine exactly ----

// Random, valid-ish inputs for a job of 2 nodes x 2 ranks on up to 5 nodes:
// registrations, heartbeats, losses, readiness, steps with random losses
// (NaN, inf and spikes included), exits, stops of the current and of stale
// generations, injected faults, persistence failures, restore notes,
// controller outages and ticks, with time advancing irregularly.
class RandomJob {
 public:
  explicit RandomJob(uint64_t seed) : rng_(seed) {}

  // Rank `r`'s next step report (now and then an older step, a NaN, an
  // infinity or a spike, a skipped step, a checkpoint every 10th).
  StepEnd RankStep(Generation gen, int r) {
    int64_t& step = steps_[r];
    step = Pick(15) == 0 ? Range(0, step) : step + 1;
    double loss = 2.0 + Range(-100, 100) / 1000.0;
    switch (Pick(40)) {
      case 0:
        loss = std::numeric_limits<double>::quiet_NaN();
        break;
      case 1:
        loss = std::numeric_limits<double>::infinity();
        break;
      case 2:
        loss = 50;
        break;
    }
    return StepEnd{gen,          r, step, loss, Pick(5) == 0 ? 0.01 : 0, step % 10 == 0 ? step : -1,
                   Pick(30) == 0};
  }

  // The next input for a machine that is now in `m`'s state, and its time.
  std::pair<JobEvent, TimePoint> Next(const JobMachine& m) {
    now_ += Duration(Pick(25) == 0 ? Range(0, 15'000) * 1'000'000 : Range(0, 400) * 1'000'000);
    const Generation gen{m.generation().value - (Pick(10) == 0 ? 1 : 0)};
    const int rank = static_cast<int>(Range(-1, 4));  // -1 and 4 are out of range
    const NodeId node{static_cast<int32_t>(Range(0, 4))};
    const TimePoint at = At(now_);
    switch (Pick(20)) {
      case 0:
        return {NodeUp{node, "node" + std::to_string(node.value), static_cast<int>(Range(1, 3))},
                at};
      case 1:
        if (Pick(3) == 0) return {NodeDown{node, "stream dropped"}, at};
        return {NodeHeartbeat{node}, at};
      case 2:
      case 3:
        return {NodeHeartbeat{node}, at};
      case 4:
        return {WorkerReady{gen, rank, Range(0, 30), Range(0, 100) / 100.0}, at};
      case 5:
      case 6:
      case 7:
      case 8:
      case 9: {
        const int r = static_cast<int>(Range(0, 3));
        if (Pick(4) == 0) {
          // The node's two ranks together, as an agent reports them.
          const int first = r / 2 * 2;
          return {NodeStepsEnd{
                      NodeId{first / 2}, gen, {RankStep(gen, first), RankStep(gen, first + 1)}},
                  at};
        }
        return {RankStep(gen, r), at};
      }
      case 10: {
        WorkerExitEvent e{gen, rank, node, std::nullopt, std::nullopt};
        switch (Pick(4)) {
          case 0:
            e.exit_code = 0;
            break;
          case 1:
            e.exit_code = 1;
            e.log_cause = Pick(2) ? "user_exception" : "xid_79";
            e.log_action = Pick(12) == 0 ? LogAction::kStop
                                         : (Pick(2) ? LogAction::kRestart : LogAction::kEvictNode);
            e.log_rule = e.log_cause;
            e.log_line = "Traceback ...";
            break;
          default:
            e.signal = Pick(2) ? 9 : 11;
        }
        return {e, at};
      }
      case 11: {
        static const FaultKind kKinds[] = {FaultKind::kKill,     FaultKind::kExit, FaultKind::kHang,
                                           FaultKind::kNan,      FaultKind::kSlow, FaultKind::kLog,
                                           FaultKind::kKillAgent};
        return {FaultFiredEvent{gen, rank, "f" + std::to_string(Pick(5)), kKinds[Pick(7)],
                                Range(0, 40), At(now_ - Duration(Range(0, 100'000'000)))},
                at};
      }
      case 12:
      case 13:
        return {GenerationStoppedEvent{gen, node}, at};
      case 14:
        return {StackDumpEvent{gen, rank, "#0 nanosleep"}, at};
      case 15:
        return {PersistFailedEvent{gen, static_cast<int>(Range(0, 3)), Range(0, 40), node, "EIO"},
                at};
      case 16: {
        const StepNumber ckpt{Range(1, 8) * 5};
        switch (Pick(7)) {
          case 0:
            return {DurableListed{{{StepNumber{Range(0, 4) * 5}, 2}, {ckpt, 4}}, {StepNumber{3}}},
                    at};
          case 1:
            return {ShardPersisted{gen, node, ckpt, static_cast<int>(Range(0, 3)), 4, 10, 7, 0, 0},
                    at};
          case 2:
            return {ManifestWritten{ckpt, Pick(3) == 0 ? "EIO" : ""}, at};
          case 3:
            return {StepRemoved{ckpt, Pick(3) == 0 ? "EACCES" : ""}, at};
          case 4:
            return {
                InventoryReported{node,
                                  {checkpoint::ShardCopy{ckpt.value, 0, 1, checkpoint::Tier::kT0,
                                                         "node0", "/dev/shm/x", 10, 7, ""}},
                                  10,
                                  0},
                at};
          case 5:
            return {ShardRefused{ckpt, 0, "checksum mismatch"}, at};
          default:
            return {RestoreChosen{m.generation(), "step 10 from T0", ckpt, 1, 0, 0}, at};
        }
      }
      case 17:
        if (Pick(4) == 0) {
          now_ += std::chrono::seconds(Range(0, 200));
          return {ControllerResumed{}, At(now_)};
        }
        return {Tick{}, at};
      default:
        return {Tick{}, at};
    }
  }

 private:
  int Pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }
  int64_t Range(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }

  std::mt19937_64 rng_;
  Duration now_{0};
  int64_t steps_[4] = {0, 0, 0, 0};
};

JobMachineOptions ReplayOptions() {
  JobMachineOptions o;
  o.nodes = 2;
  o.ranks_per_node = 2;
  o.recovery.backoff_initial = std::chrono::seconds(1);
  o.recovery.paths["node_lost"] = RecoveryPath::kEvictAndReplace;
  o.replacement_timeout = std::chrono::seconds(120);
  o.recovery.max_restarts_in_window = 10;
  o.recovery.structural_repeats = 5;
  return o;
}

std::vector<ExternalFault> ReplayFaults() {
  return {{"x1", FaultKind::kKill, 1, 12, std::nullopt},
          {"x2", FaultKind::kKillAgent, 2, 30, std::nullopt},
          {"x3", FaultKind::kHang, 0, -1, std::chrono::seconds(40)}};
}

std::string Actions(const std::vector<JobAction>& actions) {
  std::string out;
  for (const JobAction& a : actions) out += EncodeAction(a) + "\n";
  return out;
}

// What a machine is, as far as anyone outside can tell (its times as seen
// from a job that started at `start`).
std::string Fingerprint(const JobMachine& m, TimePoint start = At(Duration(0))) {
  std::string out =
      std::string(JobPhaseName(m.phase())) + " generation=" + std::to_string(m.generation().value) +
      " step=" + std::to_string(m.step().value) + " loss=" + std::to_string(m.last_loss()) + "\n";
  for (const Incident& inc : m.incidents()) {
    out += EncodeIncident(inc, start) + "\n";
    for (const std::string& s : inc.stacks) out += "  stack " + s + "\n";
  }
  for (int i = 0; i < kNumLedgerCategories; ++i) {
    out += std::to_string(m.ledger().total(static_cast<LedgerCategory>(i)).count()) + " ";
  }
  out += std::to_string(m.ledger().wall().count()) + "\ncheckpoints";
  for (StepNumber s : m.checkpoints().Restorable()) out += " " + std::to_string(s.value);
  const CheckpointTotals t = m.checkpoints().totals();
  out += " taken=" + std::to_string(t.copies_taken) +
         " commits=" + std::to_string(t.durable_commits) +
         " durable=" + std::to_string(t.newest_durable.value) +
         " failures=" + std::to_string(t.persist_failures);
  out += "\nfired";
  for (const std::string& f : m.fired_faults()) out += " " + f;
  const std::optional<TimePoint> next = m.NextDeadline();
  out += "\nnext " + (next ? std::to_string((*next - start).count()) : "-") + "\n";
  return out;
}

// The controller journals each input as EncodeEvent writes it and, after a
// restart, replays the journal into a fresh machine: the replay must take
// every decision the original took, and end in the same state.
// The configuration reads back whole: every option and fault, and a
// damaged or invalid one is refused (a journal may be damaged).
TEST(JobCodec, AConfigurationRoundTripsAndAnInvalidOneIsRefused) {
  Configure c{ReplayOptions(), ReplayFaults()};
  c.options.hang.floor = std::chrono::milliseconds(2500);
  c.options.hang.k = 2.5;
  c.options.loss.z_threshold = 7.25;
  c.options.anomaly.on_recurrence = AnomalyRecurrence::kStop;
  c.options.recovery.paths["xid \"79\", a \\ cause"] = RecoveryPath::kWaitForRepair;
  c.options.detect_loss_anomalies = false;
  c.options.first_generation = Generation{4};
  const std::string line = EncodeEvent(c);
  Result<JobEvent> back = DecodeEvent(line);
  ASSERT_TRUE(back.ok()) << line << ": " << back.status().message();
  EXPECT_EQ(EncodeEvent(*back), line);
  const Configure& d = std::get<Configure>(*back);
  EXPECT_EQ(d.options.hang.floor, std::chrono::milliseconds(2500));
  EXPECT_EQ(d.options.recovery.paths.at("xid \"79\", a \\ cause"), RecoveryPath::kWaitForRepair);
  EXPECT_EQ(d.options.recovery.paths.at("node_lost"), RecoveryPath::kEvictAndReplace);
  EXPECT_EQ(d.options.first_generation.value, 4);
  ASSERT_EQ(d.faults.size(), 3u);
  EXPECT_EQ(d.faults[2].at, std::optional<Duration>(std::chrono::seconds(40)));
  EXPECT_EQ(d.faults[1].kind, FaultKind::kKillAgent);

  std::string invalid = line;
  invalid.replace(invalid.find("nodes=2"), 7, "nodes=0");
  Result<JobEvent> refused = DecodeEvent(invalid);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("nodes must be at least 1"), std::string::npos)
      << refused.status().message();
  std::string odd = line;
  odd.replace(odd.find("recovery.paths=\""), 16, "recovery.paths=\"lonely\",\"");
  EXPECT_FALSE(DecodeEvent(odd).ok());
}

// An unconfigured machine takes nothing but its configuration; a second one
// changes nothing.
TEST(JobCodec, AMachineActsOnlyOnceConfiguredAndKeepsItsFirstConfiguration) {
  JobMachine m(At(Duration(0)));
  EXPECT_TRUE(m.Step(NodeUp{NodeId{0}, "node0", 2}, At(Duration(0))).empty());
  EXPECT_TRUE(m.Step(Configure{ReplayOptions(), {}}, At(Duration(0))).empty());
  JobMachineOptions other = ReplayOptions();
  other.nodes = 1;
  EXPECT_TRUE(m.Step(Configure{other, {}}, At(Duration(0))).empty());
  EXPECT_TRUE(m.Step(NodeUp{NodeId{0}, "node0", 2}, At(Duration(0))).empty()) << "2 nodes needed";
  EXPECT_EQ(m.Step(NodeUp{NodeId{1}, "node1", 2}, At(Duration(0))).size(), 1u);
}

// A node's ranks' steps in one input act as the node's heartbeat and its
// ranks' StepEnds one after another: the same decisions, the same state.
TEST(JobCodec, ANodeReportActsAsItsRanksStepsOneAfterAnother) {
  const Configure configure{ReplayOptions(), {}};
  JobMachine apart(At(Duration(0))), together(At(Duration(0)));
  for (JobMachine* m : {&apart, &together}) {
    m->Step(configure, At(Duration(0)));
    for (int n = 0; n < 2; ++n) m->Step(NodeUp{NodeId{n}, "node" + std::to_string(n), 2}, At(1s));
    for (int r = 0; r < 4; ++r) m->Step(WorkerReady{m->generation(), r, 0, 0.1}, At(2s));
  }
  ASSERT_EQ(apart.phase(), JobPhase::kRunning);
  for (int64_t step = 1; step <= 40; ++step) {
    const TimePoint at = At(2s + step * 1s);
    // A loss spike at step 30 on node 1's first rank: the generation stops
    // in the middle of the node's report.
    const double loss = step == 30 ? std::numeric_limits<double>::quiet_NaN() : 2.0;
    for (int n = 0; n < 2; ++n) {
      NodeStepsEnd report{NodeId{n}, apart.generation(), {}};
      std::string decided = Actions(apart.Step(NodeHeartbeat{NodeId{n}}, at));
      for (int r = 2 * n; r < 2 * n + 2; ++r) {
        StepEnd e{apart.generation(), r, step, r == 2 ? loss : 2.0, 0, -1, false, 0.5};
        decided += Actions(apart.Step(e, at));
        report.steps.push_back(e);
      }
      ASSERT_EQ(Actions(together.Step(report, at)), decided) << "step " << step;
      Result<JobEvent> back = DecodeEvent(EncodeEvent(report));
      ASSERT_TRUE(back.ok()) << back.status().message();
      EXPECT_EQ(EncodeEvent(*back), EncodeEvent(report));
    }
    ASSERT_EQ(Fingerprint(together), Fingerprint(apart)) << "step " << step;
  }
  EXPECT_EQ(apart.incidents().size(), 1u) << "the NaN";
  EXPECT_TRUE(together.Snapshot() == apart.Snapshot());
}

TEST(JobCodec, AJournalReplayedIntoAFreshMachineActsIdentically) {
  int failures = 0, incidents = 0, generations = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    // The journal begins with the configuration, as the controller's does.
    JobMachine a(At(Duration(0)));
    RandomJob job(seed);
    std::vector<std::pair<TimePoint, std::string>> journal;
    std::vector<std::string> outputs;
    const Configure configure{ReplayOptions(), ReplayFaults()};
    journal.push_back({At(Duration(0)), EncodeEvent(configure)});
    outputs.push_back(Actions(a.Step(configure, At(Duration(0)))));
    for (int i = 0; i < 400 && a.phase() != JobPhase::kDone; ++i) {
      auto [event, at] = job.Next(a);
      journal.push_back({at, EncodeEvent(event)});
      outputs.push_back(Actions(a.Step(event, at)));
    }
    JobMachine b(At(Duration(0)));  // all it knows comes from the journal
    for (size_t i = 0; i < journal.size(); ++i) {
      Result<JobEvent> event = DecodeEvent(journal[i].second);
      ASSERT_TRUE(event.ok()) << journal[i].second << ": " << event.status().message();
      ASSERT_EQ(Actions(b.Step(*event, journal[i].first)), outputs[i])
          << "input " << i << ": " << journal[i].second;
    }
    ASSERT_EQ(Fingerprint(b), Fingerprint(a));
    failures += a.phase() == JobPhase::kDone;
    incidents += static_cast<int>(a.incidents().size());
    generations += a.generations_started();
  }
  // The inputs reach the interesting paths, not only the waiting room.
  EXPECT_GT(incidents, 300);
  EXPECT_GT(generations, 600);
  EXPECT_GT(failures, 10);
  std::cout << "replayed 300 journals: " << generations << " generations, " << incidents
            << " incidents, " << failures << " jobs finished\n";
}

// `event` as a job that started `by` later sees it: the times it carries
// move with the job's.
JobEvent Shifted(JobEvent event, Duration by) {
  if (auto* down = std::get_if<NodeDown>(&event); down && down->since) *down->since += by;
  if (auto* fired = std::get_if<FaultFiredEvent>(&event)) fired->at += by;
  return event;
}

// The controller snapshots its machine and cuts the journal behind it; a
// restart restores the snapshot — in a process whose clock began elsewhere —
// and replays what follows. Killed at any input, it must take every
// decision the machine that never stopped takes, and end in its state.
TEST(JobSnapshot, AMachineRestoredFromASnapshotAtAnyInputActsAsTheOneThatNeverStopped) {
  const Duration moved = 1000h + 7ns;  // the restarted process's clock began elsewhere
  int restored = 0, incidents_after = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    JobMachine a(At(Duration(0)));
    RandomJob job(seed);
    std::mt19937_64 pick(seed * 7919);
    const Configure configure{ReplayOptions(), ReplayFaults()};
    a.Step(configure, At(Duration(0)));
    std::vector<std::pair<JobEvent, TimePoint>> inputs;
    for (int i = 0; i < 400 && a.phase() != JobPhase::kDone; ++i) inputs.push_back(job.Next(a));
    // The same inputs again, restored from a snapshot at every 50th input
    // and at a random one: in a process whose clock began elsewhere, the
    // same decisions; on the same clock, the same state to the bit.
    std::vector<size_t> cuts = {std::uniform_int_distribution<size_t>(0, inputs.size())(pick)};
    for (size_t cut = 0; cut < inputs.size(); cut += 50) cuts.push_back(cut);
    for (const size_t cut : cuts) {
      const TimePoint start = At(Duration(0));
      JobMachine live(start);
      live.Step(configure, start);
      for (size_t i = 0; i < cut; ++i) live.Step(inputs[i].first, inputs[i].second);
      const std::string snapshot = live.Snapshot();
      Result<JobMachine> moved_one = JobMachine::FromSnapshot(snapshot, start + moved);
      Result<JobMachine> same_clock = JobMachine::FromSnapshot(snapshot, start);
      ASSERT_TRUE(moved_one.ok()) << moved_one.status().message();
      ASSERT_TRUE(same_clock.ok()) << same_clock.status().message();
      ASSERT_TRUE(moved_one->Snapshot() == snapshot) << "it snapshots as its original";
      ASSERT_EQ(Fingerprint(*moved_one, start + moved), Fingerprint(live)) << "restored at " << cut;
      const size_t incidents_at_cut = live.incidents().size();
      for (size_t i = cut; i < inputs.size(); ++i) {
        const auto& [event, at] = inputs[i];
        const std::string decided = Actions(live.Step(event, at));
        ASSERT_EQ(Actions(moved_one->Step(Shifted(event, moved), at + moved)), decided)
            << "input " << i << " after a snapshot at " << cut << ": " << EncodeEvent(event);
        ASSERT_EQ(Actions(same_clock->Step(event, at)), decided);
      }
      ASSERT_EQ(Fingerprint(*moved_one, start + moved), Fingerprint(live)) << "restored at " << cut;
      ASSERT_TRUE(same_clock->Snapshot() == live.Snapshot()) << "their states differ";
      incidents_after += static_cast<int>(live.incidents().size() - incidents_at_cut);
      ++restored;
    }
  }
  // The tails decide things, not only wait.
  EXPECT_GT(incidents_after, 500);
  std::cout << "restored " << restored << " snapshots; " << incidents_after
            << " incidents after them\n";
}

// A snapshot restores in time proportional to its size, so that a restart
// after a day costs what one after minutes does: a steady job's state stops
// growing (every window and history the machine keeps is bounded), without
// checkpoints (what is kept per step until a copy is the largest) and with.
TEST(JobSnapshot, ASteadyJobsSnapshotStopsGrowing) {
  for (const int every : {0, 5}) {
    SCOPED_TRACE("a checkpoint every " + std::to_string(every) + " steps (0: none)");
    JobMachineOptions o;
    o.nodes = 2;
    o.ranks_per_node = 2;
    JobMachine m(o, {}, At(Duration(0)));
    m.Step(NodeUp{NodeId{0}, "node0", 2}, At(Duration(0)));
    m.Step(NodeUp{NodeId{1}, "node1", 2}, At(Duration(0)));
    for (int r = 0; r < 4; ++r) m.Step(WorkerReady{m.generation(), r, 0, 0.1}, At(1s));
    std::mt19937_64 noise(11);
    std::map<int64_t, size_t> size_at;
    for (int64_t step = 1; step <= 12'000; ++step) {
      const TimePoint now = At(1s + step * 100ms);
      if (step % 10 == 0) {
        for (int n = 0; n < 2; ++n) m.Step(NodeHeartbeat{NodeId{n}}, now);
      }
      for (int r = 0; r < 4; ++r) {
        const double loss = 2.0 + 0.01 * static_cast<double>(noise() % 100) / 100.0;
        const int64_t copy = every > 0 && r == 0 && step % every == 0 ? step : -1;
        m.Step(StepEnd{m.generation(), r, step, loss, 0, copy}, now + Duration(r));
      }
      if (step == 6'000 || step == 12'000) size_at[step] = m.Snapshot().size();
    }
    ASSERT_TRUE(m.incidents().empty()) << m.incidents()[0].reason;
    EXPECT_EQ(size_at[12'000], size_at[6'000]) << "it grew between steps 6,000 and 12,000";
  }
}

// A snapshot is read from disk: one that is cut short, altered, of another
// kind or whose state does not read back is an error that says so.
TEST(JobSnapshot, ADamagedSnapshotIsAnErrorThatSaysWhatIsWrong) {
  JobMachine m(ReplayOptions(), ReplayFaults(), At(Duration(0)));
  m.Step(NodeUp{NodeId{0}, "node0", 2}, At(1s));
  const std::string good = m.Snapshot();
  ASSERT_TRUE(JobMachine::FromSnapshot(good, At(Duration(0))).ok());
  auto error = [](std::string_view s) {
    Result<JobMachine> r = JobMachine::FromSnapshot(s, At(Duration(0)));
    return r.ok() ? std::string("restored") : r.status().message();
  };
  EXPECT_NE(error(good.substr(0, good.size() - 3)).find("cut short"), std::string::npos);
  std::string flipped = good;
  flipped[flipped.size() - 5] ^= 0x10;
  EXPECT_NE(error(flipped).find("checksum does not match"), std::string::npos);
  EXPECT_NE(error("a journal line\n").find("does not begin with"), std::string::npos);
  // Of a build whose archive is laid out otherwise (an older version).
  std::string older = good;
  older.replace(0, std::string("endure-job-snapshot 3").size(), "endure-job-snapshot 1");
  EXPECT_NE(error(older).find("does not begin with \"endure-job-snapshot 3\""), std::string::npos)
      << error(older);
  EXPECT_NE(error("").find("does not begin with"), std::string::npos);
  // A state that does not read back, behind a checksum that matches it.
  const size_t body_at = good.find('\n') + 1;
  const std::string body = good.substr(body_at, good.find('\n', body_at) - body_at + 1) + "\x01";
  const std::string forged = "endure-job-snapshot 3 bytes=" + std::to_string(body.size()) +
                             " xxh3=" + HexU64(Xxh3(body)) + "\n" + body;
  EXPECT_NE(error(forged).find("does not read back"), std::string::npos) << error(forged);
  const std::string not_config = "tick\n";
  const std::string other = "endure-job-snapshot 3 bytes=" + std::to_string(not_config.size()) +
                            " xxh3=" + HexU64(Xxh3(not_config)) + "\n" + not_config;
  EXPECT_NE(error(other).find("not the job's configuration"), std::string::npos) << error(other);
}

}  // namespace
}  // namespace endure::core
