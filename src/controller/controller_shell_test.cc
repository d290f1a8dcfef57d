// ControllerShell on a FakeTransport and a FakeClock: the test plays the
// agents (streams, events, hang-ups) and drives the loop with RunOnce, so
// every deadline — silent hellos, heartbeats, the stop after a signal — is
// reached with FakeClock::Advance, never by sleeping. Outcomes are read where
// an operator reads them: the commands each agent received, status.json,
// report.json and the state store.
#include "controller/controller_shell.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/hash.h"
#include "controller/fake_transport.h"
#include "controller/job_spec.h"
#include "controller/state_store.h"
#include "tests/support/test_support.h"

namespace endure::controller {
namespace {

using namespace std::chrono_literals;
using testing_support::ReadAll;
using testing_support::ScratchDir;
using Code = StreamVerdict::Code;

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";
constexpr int kMasterPort = 29999;

proto::AgentEvent Hello(const std::string& node, const std::string& token = kToken, int slots = 1) {
  proto::AgentEvent e;
  e.set_token(token);
  e.mutable_register_()->set_node_id(node);
  e.mutable_register_()->set_slots(slots);
  e.mutable_register_()->set_host("host-" + node);
  e.mutable_register_()->set_replica_address(node + ":7000");
  return e;
}

// The hello of an agent that lost its stream and kept its workers running:
// it resumes `generation`, whose ranks reported the steps in `last_steps`.
proto::AgentEvent ResumeHello(const std::string& node, int64_t generation,
                              const std::map<int, int64_t>& last_steps) {
  proto::AgentEvent e = Hello(node);
  e.set_generation(generation);
  proto::Register* reg = e.mutable_register_();
  reg->set_resuming(true);
  reg->set_generation(generation);
  reg->set_workers_alive(true);
  for (const auto& [rank, step] : last_steps) {
    proto::RankResume* r = reg->add_ranks();
    r->set_rank(rank);
    r->set_last_step(step);
    r->set_alive(true);
  }
  return e;
}

proto::AgentEvent Event(int generation) {
  proto::AgentEvent e;
  e.set_token(kToken);
  e.set_generation(generation);
  return e;
}

proto::AgentEvent Step(int generation, int rank, int64_t step, double loss = 2.0) {
  proto::AgentEvent e = Event(generation);
  e.mutable_step()->set_rank(rank);
  e.mutable_step()->set_step(step);
  e.mutable_step()->set_loss(loss);
  e.mutable_step()->set_checkpoint_step(-1);
  return e;
}

proto::AgentEvent Exited(int generation, int rank, int code) {
  proto::AgentEvent e = Event(generation);
  e.mutable_worker_exited()->set_rank(rank);
  e.mutable_worker_exited()->set_exited(true);
  e.mutable_worker_exited()->set_exit_code(code);
  return e;
}

proto::AgentEvent Stopped(int generation) {
  proto::AgentEvent e = Event(generation);
  e.mutable_stopped()->set_workers(1);
  return e;
}

proto::AgentEvent Heartbeat() {
  proto::AgentEvent e = Event(0);
  e.mutable_heartbeat();
  return e;
}

nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(ReadAll(path), nullptr, /*allow_exceptions=*/false);
}

// The kinds of `commands`, e.g. {"start", "stop"}.
std::vector<std::string> Kinds(const std::vector<proto::AgentCommand>& commands) {
  std::vector<std::string> kinds;
  for (const proto::AgentCommand& c : commands) {
    switch (c.command_case()) {
      case proto::AgentCommand::kStart:
        kinds.push_back("start");
        break;
      case proto::AgentCommand::kStop:
        kinds.push_back("stop");
        break;
      case proto::AgentCommand::kDumpStacks:
        kinds.push_back("dump_stacks");
        break;
      case proto::AgentCommand::kShutdown:
        kinds.push_back("shutdown");
        break;
      case proto::AgentCommand::kInject:
        kinds.push_back("inject");
        break;
      default:
        kinds.push_back("?");
    }
  }
  return kinds;
}

std::vector<int> Ranks(const proto::AgentCommand& start) {
  std::vector<int> ranks;
  for (const proto::RankAssignment& r : start.start().ranks()) ranks.push_back(r.rank());
  return ranks;
}

class ControllerShellTest : public ::testing::Test {
 protected:
  // A shell for a job of `nodes` nodes of one rank each; `extra` is TOML
  // appended to the spec ([checkpoint], [recovery], ...).
  void Make(int nodes, const std::string& extra = "") {
    const std::string text =
        "[job]\nname = \"shell\"\ncommand = [\"/bin/true\"]\nnodes = " + std::to_string(nodes) +
        "\nstate_dir = \"" + state_dir() + "\"\n[checkpoint]\ndir = \"" + ckpt_dir() + "\"\n" +
        extra;
    Result<JobSpec> spec = ParseJobSpec(text, "shell.toml");
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    options_.spec = *spec;
    options_.state_dir = state_dir();
    options_.token = kToken;
    shell_ = std::make_unique<ControllerShell>(options_, &clock_, &transport_,
                                               [] { return Result<int>(kMasterPort); });
    ASSERT_TRUE(transport_.Start(shell_.get()).ok());
    ASSERT_TRUE(shell_->Start().ok());
  }

  // The controller dies (kill -9: nothing more of it runs, nothing is
  // finished) and a new one starts on the same state directory, reached by
  // the agents over `restarted_`.
  void Restart(bool new_run = false) {
    dead_ = std::move(shell_);
    ControllerOptions o = options_;
    o.new_run = new_run;
    shell_ = std::make_unique<ControllerShell>(o, &clock_, &restarted_,
                                               [] { return Result<int>(kMasterPort); });
    ASSERT_TRUE(restarted_.Start(shell_.get()).ok());
    ASSERT_TRUE(shell_->Start().ok());
  }

  std::string state_dir() const { return dir_.Path("state"); }
  std::string ckpt_dir() const { return dir_.Path("ckpt"); }

  // Every queued event through the loop (no tick when none was queued).
  void Pump() {
    while (shell_->queued() > 0) shell_->RunOnce(/*block=*/false);
  }
  // One turn of the loop with nothing queued: a tick at the clock's time.
  void Tick() {
    Pump();
    shell_->RunOnce(/*block=*/false);
  }

  // An agent opens a stream and registers `node`; fails the test if refused.
  ConnectionId Attach(const std::string& node) {
    const ConnectionId id = transport_.Open();
    EXPECT_TRUE(transport_.Deliver(id, Hello(node))) << transport_.ended_with(id).message;
    return id;
  }

  // Attaches node0..node{n-1} and returns their streams, each past its
  // StartGeneration of generation 0 (checked).
  std::vector<ConnectionId> AttachAndStart(int n) {
    std::vector<ConnectionId> ids;
    for (int i = 0; i < n; ++i) ids.push_back(Attach("node" + std::to_string(i)));
    Pump();
    for (int i = 0; i < n; ++i) {
      const std::vector<proto::AgentCommand> got = transport_.TakeCommands(ids[i]);
      EXPECT_EQ(Kinds(got), std::vector<std::string>{"start"}) << "node" << i;
      if (!got.empty()) EXPECT_EQ(got[0].generation(), 0);
    }
    return ids;
  }

  // Both ranks of a 2-node job report steps first..last, a second apart.
  void Steps(const std::vector<ConnectionId>& ids, int generation, int64_t first, int64_t last) {
    for (int64_t s = first; s <= last; ++s) {
      clock_.Advance(1s);
      for (size_t r = 0; r < ids.size(); ++r) {
        ASSERT_TRUE(transport_.Deliver(ids[r], Step(generation, static_cast<int>(r), s)));
      }
      Pump();
    }
  }

  nlohmann::json Status() const { return nlohmann::json::parse(shell_->StatusJson()); }

  ScratchDir dir_{"endure_controller_shell"};
  FakeClock clock_;
  FakeTransport transport_;
  ControllerOptions options_;
  std::unique_ptr<ControllerShell> shell_;
  FakeTransport restarted_;  // the streams to the controller after Restart
  std::unique_ptr<ControllerShell> dead_;
};

// The ledger in SQLite follows a run that has nothing to act on: it used to
// be saved only with an action or an incident (8 s into training it said 0 s
// productive).
TEST_F(ControllerShellTest, TheDurableLedgerIsAtMostASecondBehind) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 8);
  clock_.Advance(1500ms);
  Tick();
  Result<StateStore> store = StateStore::OpenExisting(StateStore::PathIn(state_dir()));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  Result<std::map<std::string, double>> ledger = store->LoadLedger();
  ASSERT_TRUE(ledger.ok()) << ledger.status().ToString();
  double total = 0;
  for (const auto& [category, seconds] : *ledger) total += seconds;
  // 9.5 s since the start (8 steps a second apart, then 1.5 s): the whole
  // of it is in the ledger, to the second, and productive since step 1.
  EXPECT_GE(total, 9.5 - 1.0) << testing::PrintToString(*ledger);
  EXPECT_LE(total, 9.5 + 1e-6) << testing::PrintToString(*ledger);
  EXPECT_GE((*ledger)["productive"], 7.5 - 1.0) << testing::PrintToString(*ledger);
}

TEST_F(ControllerShellTest, TwoNodesStartStepAndCompleteWithExitZero) {
  Make(2);
  EXPECT_EQ(ReadJson(JoinPath(state_dir(), "status.json"))["phase"], "waiting_for_nodes");
  const ConnectionId a = Attach("node0");
  Pump();
  EXPECT_TRUE(transport_.TakeCommands(a).empty()) << "one node of two: nothing starts";

  const ConnectionId b = Attach("node1");
  Pump();
  const std::vector<proto::AgentCommand> to_a = transport_.TakeCommands(a);
  const std::vector<proto::AgentCommand> to_b = transport_.TakeCommands(b);
  ASSERT_EQ(Kinds(to_a), std::vector<std::string>{"start"});
  ASSERT_EQ(Kinds(to_b), std::vector<std::string>{"start"});
  for (const proto::AgentCommand* c : {&to_a[0], &to_b[0]}) {
    EXPECT_EQ(c->token(), kToken);
    EXPECT_EQ(c->generation(), 0);
    EXPECT_EQ(c->start().world_size(), 2);
    EXPECT_EQ(c->start().restore_step(), -1);
    EXPECT_EQ(c->start().master_addr(), "host-node0");
    EXPECT_EQ(c->start().master_port(), kMasterPort);
    EXPECT_EQ(c->start().command(0), "/bin/true");
  }
  EXPECT_EQ(Ranks(to_a[0]), std::vector<int>{0});
  EXPECT_EQ(Ranks(to_b[0]), std::vector<int>{1});
  // Each node replicates to the next one.
  EXPECT_EQ(to_a[0].start().checkpoint().replica_peer(), "node1:7000");
  EXPECT_EQ(to_b[0].start().checkpoint().replica_peer(), "node0:7000");

  Steps({a, b}, 0, 1, 3);
  clock_.Advance(300ms);  // status.json is rewritten at most four times a second
  Tick();
  nlohmann::json status = ReadJson(JoinPath(state_dir(), "status.json"));
  EXPECT_EQ(status["phase"], "running");
  EXPECT_EQ(status["step"], 3);
  EXPECT_EQ(status["loss"], 2.0);
  EXPECT_EQ(Status()["step"], 3);
  EXPECT_NE(shell_->MetricsText().find("\nendure_step 3\n"), std::string::npos)
      << shell_->MetricsText();

  ASSERT_TRUE(transport_.Deliver(a, Exited(0, 0, 0)));
  Pump();
  EXPECT_FALSE(shell_->done()) << "rank 1 still runs";
  ASSERT_TRUE(transport_.Deliver(b, Exited(0, 1, 0)));
  Pump();
  ASSERT_TRUE(shell_->done());
  for (ConnectionId id : {a, b}) {
    const std::vector<proto::AgentCommand> got = transport_.TakeCommands(id);
    ASSERT_EQ(Kinds(got), std::vector<std::string>{"shutdown"});
    EXPECT_EQ(got[0].shutdown().reason(), "the job ended: training completed");
  }
  Result<int> code = shell_->Finish();
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0);

  const nlohmann::json report = ReadJson(JoinPath(state_dir(), "report.json"));
  EXPECT_EQ(report["completed"], true);
  EXPECT_EQ(report["exit_code"], 0);
  EXPECT_EQ(report["verdict"], "training completed");
  EXPECT_EQ(report["incidents"].size(), 0u);
  EXPECT_EQ(report["nodes"], nlohmann::json({"node0", "node1"}));

  Result<StateStore> store = StateStore::OpenExisting(StateStore::PathIn(state_dir()));
  ASSERT_TRUE(store.ok());
  Result<JobRecord> job = store->LoadJob();
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->exit_code, 0);
  EXPECT_EQ(job->verdict, "training completed");
  Result<std::vector<GenerationRecord>> generations = store->LoadGenerations();
  ASSERT_TRUE(generations.ok());
  ASSERT_EQ(generations->size(), 1u);
  EXPECT_EQ((*generations)[0].nodes, "node0,node1");
  Result<std::map<std::string, double>> ledger = store->LoadLedger();
  ASSERT_TRUE(ledger.ok());
  EXPECT_GT((*ledger)["productive"], 0.0);

  EXPECT_FALSE(shell_->AgentsGone());
  transport_.HangUp(a);
  transport_.HangUp(b);
  EXPECT_TRUE(shell_->AgentsGone());
}

TEST_F(ControllerShellTest, AWrongTokenIsRefusedAndLaterEventsWithOneAreDropped) {
  Make(2);
  const ConnectionId a = Attach("node0");
  const std::string same_length_other = std::string(kToken).replace(31, 1, "0");
  ASSERT_EQ(same_length_other.size(), std::string(kToken).size());
  for (const std::string& token : {same_length_other, std::string(kToken).substr(0, 16),
                                   std::string(kToken) + "x", std::string()}) {
    const ConnectionId bad = transport_.Open();
    EXPECT_FALSE(transport_.Deliver(bad, Hello("node1", token))) << "'" << token << "'";
    EXPECT_EQ(transport_.ended_with(bad).code, Code::kUnauthenticated) << "'" << token << "'";
    EXPECT_NE(transport_.ended_with(bad).message.find("token"), std::string::npos);
  }
  Pump();
  EXPECT_TRUE(transport_.TakeCommands(a).empty()) << "a refused agent is no node of the job";
  EXPECT_EQ(Status()["phase"], "waiting_for_nodes");

  const ConnectionId b = Attach("node1");
  Pump();
  EXPECT_EQ(Kinds(transport_.TakeCommands(a)), std::vector<std::string>{"start"});
  EXPECT_EQ(Kinds(transport_.TakeCommands(b)), std::vector<std::string>{"start"});
  // A crash reported with the wrong token is no crash.
  proto::AgentEvent forged = Exited(0, 1, 1);
  forged.set_token(same_length_other);
  EXPECT_TRUE(transport_.Deliver(b, forged));
  Pump();
  EXPECT_TRUE(transport_.TakeCommands(a).empty());
  EXPECT_EQ(Status()["phase"], "running");
  EXPECT_EQ(Status()["incidents"], 0);
}

TEST_F(ControllerShellTest, AnInvalidRegistrationIsRefused) {
  Make(1);
  for (const char* name : {"../../etc", "", "node/0", ".."}) {
    const ConnectionId id = transport_.Open();
    EXPECT_FALSE(transport_.Deliver(id, Hello(name)));
    EXPECT_EQ(transport_.ended_with(id).code, Code::kInvalidArgument) << name;
    EXPECT_NE(transport_.ended_with(id).message.find("node_id"), std::string::npos);
  }
  {
    const ConnectionId id = transport_.Open();
    EXPECT_FALSE(transport_.Deliver(id, Hello("node0", kToken, /*slots=*/0)));
    EXPECT_EQ(transport_.ended_with(id).code, Code::kInvalidArgument);
    EXPECT_NE(transport_.ended_with(id).message.find("slots"), std::string::npos);
  }
  {
    proto::AgentEvent long_host = Hello("node0");
    long_host.mutable_register_()->set_host(std::string(257, 'h'));
    const ConnectionId id = transport_.Open();
    EXPECT_FALSE(transport_.Deliver(id, long_host));
    EXPECT_EQ(transport_.ended_with(id).code, Code::kInvalidArgument);
  }
  {
    const ConnectionId id = transport_.Open();
    EXPECT_FALSE(transport_.Deliver(id, Heartbeat()));
    EXPECT_EQ(transport_.ended_with(id).code, Code::kInvalidArgument);
    EXPECT_EQ(transport_.ended_with(id).message, "first message must register");
  }
  Pump();
  EXPECT_EQ(Status()["phase"], "waiting_for_nodes");
  const ConnectionId good = Attach("node0");
  Pump();
  EXPECT_EQ(Kinds(transport_.TakeCommands(good)), std::vector<std::string>{"start"});
}

// A second registration under a name that is attached is that node again
// (its agent restarted, or reconnected before the controller saw the old
// stream go): the old stream is closed. It used to be a node of its own, so
// a job of 2 nodes ran on two agents that both called themselves node0.
TEST_F(ControllerShellTest, ASecondRegistrationOfAnAttachedNameSupersedesTheFirst) {
  Make(2);
  const ConnectionId first = Attach("node0");
  const ConnectionId second = Attach("node0");
  Pump();
  EXPECT_FALSE(transport_.open(first));
  EXPECT_TRUE(transport_.cut(first));
  EXPECT_TRUE(transport_.open(second));
  // One node so far: the job waits for the second.
  EXPECT_TRUE(transport_.TakeCommands(first).empty());
  EXPECT_TRUE(transport_.TakeCommands(second).empty());
  const ConnectionId other = Attach("node1");
  Pump();
  const std::vector<proto::AgentCommand> to_second = transport_.TakeCommands(second);
  const std::vector<proto::AgentCommand> to_other = transport_.TakeCommands(other);
  ASSERT_EQ(Kinds(to_second), std::vector<std::string>{"start"});
  ASSERT_EQ(Kinds(to_other), std::vector<std::string>{"start"});
  EXPECT_EQ(Ranks(to_second[0]), std::vector<int>{0});
  EXPECT_EQ(Ranks(to_other[0]), std::vector<int>{1});
  EXPECT_EQ(to_second[0].start().checkpoint().replica_peer(), "node1:7000");
  EXPECT_EQ(Status()["incidents"], 0);
}

// The agent saw its stream break before the controller did: its resuming
// registration takes over the node, ranks and all.
TEST_F(ControllerShellTest, AResumingRegistrationOfAnAttachedNameKeepsTheNodeWithoutAnIncident) {
  Make(2);
  std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 2);
  const ConnectionId again = transport_.Open();
  ASSERT_TRUE(transport_.Deliver(again, ResumeHello("node1", 0, {{1, 2}})));
  Pump();
  EXPECT_TRUE(transport_.cut(ids[1]));
  ids[1] = again;
  Steps(ids, 0, 3, 4);
  clock_.Advance(3s);  // past the stream grace: nothing was dropped
  Tick();
  EXPECT_EQ(Status()["incidents"], 0) << Status();
  EXPECT_EQ(Status()["step"], 4);
  EXPECT_EQ(Status()["generation"], 0);
  for (ConnectionId id : ids) EXPECT_TRUE(transport_.TakeCommands(id).empty());
}

// A stream that drops and an agent that comes back within the stream grace
// resuming the generation the job runs: the same node, no incident, no
// restart; what it kept meanwhile, and its later steps, move the job on.
TEST_F(ControllerShellTest, ANodeThatResumesItsGenerationWithinTheStreamGraceIsTakenBack) {
  Make(2);
  std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 2);
  transport_.HangUp(ids[1]);
  Pump();
  clock_.Advance(1s);
  ASSERT_TRUE(transport_.Deliver(ids[0], Step(0, 0, 3)));
  Tick();
  EXPECT_EQ(Status()["incidents"], 0);
  const ConnectionId again = transport_.Open();
  ASSERT_TRUE(transport_.Deliver(again, ResumeHello("node1", 0, {{1, 2}})));
  // Rank 1's step 3, kept by the agent while it had no stream.
  clock_.Advance(1s);
  ASSERT_TRUE(transport_.Deliver(again, Step(0, 1, 3)));
  Pump();
  EXPECT_EQ(Status()["step"], 3);
  ids[1] = again;
  Steps(ids, 0, 4, 6);
  // Past the grace nothing is lost either: the node came back.
  clock_.Advance(2s);
  Tick();
  EXPECT_EQ(Status()["incidents"], 0) << Status();
  EXPECT_EQ(Status()["step"], 6);
  EXPECT_EQ(Status()["generation"], 0);
  for (ConnectionId id : ids) {
    EXPECT_TRUE(transport_.TakeCommands(id).empty()) << "no stop, no start";
  }
}

// The agent came back too late: the job lost the node, stopped generation 0
// and moved on. Its workers of generation 0 are stopped, and it joins as a
// fresh node, which the job takes for the one it lost.
TEST_F(ControllerShellTest, AResumeOfAGenerationTheJobHasLeftGetsAStopAndJoinsAfresh) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 2);
  transport_.HangUp(ids[1]);
  Pump();
  clock_.Advance(3s);  // past the stream grace (2s)
  Tick();
  EXPECT_EQ(Status()["incidents"], 1);
  EXPECT_EQ(Kinds(transport_.TakeCommands(ids[0])), std::vector<std::string>{"stop"});
  ASSERT_TRUE(transport_.Deliver(ids[0], Stopped(0)));
  Pump();
  const ConnectionId again = transport_.Open();
  ASSERT_TRUE(transport_.Deliver(again, ResumeHello("node1", 0, {{1, 2}})));
  Pump();
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(1s);
    for (ConnectionId id : {ids[0], again}) ASSERT_TRUE(transport_.Deliver(id, Heartbeat()));
    Tick();
  }
  const std::vector<proto::AgentCommand> got = transport_.TakeCommands(again);
  ASSERT_GE(got.size(), 1u);
  EXPECT_EQ(Kinds(got)[0], "stop");
  EXPECT_EQ(got[0].generation(), 0);
  ASSERT_EQ(Kinds(got), (std::vector<std::string>{"stop", "start"}));
  EXPECT_EQ(got[1].generation(), 1);
  EXPECT_EQ(Ranks(got[1]), std::vector<int>{1});
  EXPECT_EQ(Status()["incidents"], 1);
}

// Within the grace, but the job restarted meanwhile (another rank failed):
// the resume names a generation the job has left.
TEST_F(ControllerShellTest, AResumeWithinTheGraceOfAGenerationTheJobLeftIsStoppedToo) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 2);
  transport_.HangUp(ids[1]);
  ASSERT_TRUE(transport_.Deliver(ids[0], Exited(0, 0, 1)));
  Pump();
  EXPECT_EQ(Kinds(transport_.TakeCommands(ids[0])), std::vector<std::string>{"stop"});
  ASSERT_TRUE(transport_.Deliver(ids[0], Stopped(0)));
  Pump();
  const ConnectionId again = transport_.Open();
  ASSERT_TRUE(transport_.Deliver(again, ResumeHello("node1", 0, {{1, 2}})));
  Pump();
  const std::vector<proto::AgentCommand> got = transport_.TakeCommands(again);
  ASSERT_GE(got.size(), 1u);
  EXPECT_EQ(Kinds(got)[0], "stop");
  EXPECT_EQ(got[0].generation(), 0);
}

// An in-process restart starts the next generation at once, while a node's
// stream is down (held for the grace, as after a controller's restart when
// the first agents resume before the others): its start is lost with the
// stream. Found by the cluster simulation: the node resumed generation 0, was
// taken for a lost node and evicted as a hardware fault. It is a member that
// missed its start: its stale workers are stopped and the start sent again,
// and no node is lost.
TEST_F(ControllerShellTest, AMemberThatMissedItsStartWhileItsStreamWasDownIsStartedOnResume) {
  Make(2, "[recovery]\nin_process = true\n");
  std::vector<ConnectionId> ids = AttachAndStart(2);
  for (int r = 0; r < 2; ++r) {
    proto::AgentEvent ready = Event(0);
    ready.mutable_worker_ready()->set_rank(r);
    ready.mutable_worker_ready()->set_rejoin(true);
    ASSERT_TRUE(transport_.Deliver(ids[r], ready));
  }
  Pump();
  Steps(ids, 0, 1, 2);
  transport_.HangUp(ids[1]);
  ASSERT_TRUE(transport_.Deliver(ids[0], Exited(0, 0, 1)));
  Pump();
  const std::vector<proto::AgentCommand> first = transport_.TakeCommands(ids[0]);
  ASSERT_FALSE(first.empty());
  ASSERT_EQ(Kinds(first).back(), "start");
  EXPECT_EQ(first.back().generation(), 1);
  EXPECT_TRUE(first.back().start().rejoin());
  clock_.Advance(1s);  // within the stream grace (2s)
  const ConnectionId again = transport_.Open();
  ASSERT_TRUE(transport_.Deliver(again, ResumeHello("node1", 0, {{1, 2}})));
  Pump();
  const std::vector<proto::AgentCommand> got = transport_.TakeCommands(again);
  ASSERT_EQ(Kinds(got), (std::vector<std::string>{"stop", "start"}));
  EXPECT_EQ(got[0].generation(), 0);
  EXPECT_EQ(got[1].generation(), 1);
  EXPECT_EQ(Ranks(got[1]), std::vector<int>{1});
  clock_.Advance(3s);  // past the grace: the node is back, nothing is lost
  Tick();
  EXPECT_EQ(Status()["incidents"], 1) << Status();  // the crash, no lost node
  EXPECT_EQ(Status()["generation"], 1);
  EXPECT_EQ(Status()["phase"], "running");
}

// Inputs are journaled in groups: the ones the loop takes while more are
// queued share a transaction, committed when the queue drains (or before an
// action of theirs is carried out). Read from another connection, the
// journal shows none of a group until its commit.
TEST_F(ControllerShellTest, InputsAreJournaledInGroupsCommittedWhenTheQueueDrains) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 2);
  // As a reader of the live database sees it (`endure report`, a standby).
  const auto journaled = [&] {
    sqlite3* db = nullptr;
    int64_t rows = -1;
    if (sqlite3_open_v2(StateStore::PathIn(state_dir()).c_str(), &db, SQLITE_OPEN_READONLY,
                        nullptr) == SQLITE_OK) {
      sqlite3_stmt* q = nullptr;
      if (sqlite3_prepare_v2(db, "SELECT COUNT(*) FROM journal", -1, &q, nullptr) == SQLITE_OK &&
          sqlite3_step(q) == SQLITE_ROW) {
        rows = sqlite3_column_int64(q, 0);
      }
      sqlite3_finalize(q);
    }
    sqlite3_close(db);
    return rows;
  };
  const int64_t before = journaled();
  ASSERT_GT(before, 0);
  clock_.Advance(1s);
  for (int s = 3; s <= 12; ++s) {
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(transport_.Deliver(ids[r], Step(0, r, s)));
  }
  for (int i = 0; i < 10; ++i) shell_->RunOnce(/*block=*/false);
  EXPECT_EQ(shell_->queued(), 10u);
  EXPECT_EQ(journaled(), before) << "ten inputs taken, more queued: their group is open";
  Pump();  // its last turn leaves the queue empty: the group commits
  EXPECT_EQ(journaled(), before + 20);
  // The live status skipped the burst (written at most every 250 ms) and
  // catches up a turn after 250 ms, with nothing more arriving.
  EXPECT_EQ(Status()["step"], 2);
  clock_.Advance(250ms);
  shell_->RunOnce(/*block=*/false);
  EXPECT_EQ(Status()["step"], 12);
}

// An agent reports its node's ranks' steps in one message (NodeSteps): one
// input of the loop, one journaled row. A report that names a rank twice is
// damaged, and makes no input.
TEST_F(ControllerShellTest, ANodesReportOfItsRanksStepsIsOneInput) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 2);
  auto report = [](int rank, int64_t step, int times = 1) {
    proto::AgentEvent e = Event(0);
    for (int i = 0; i < times; ++i) {
      proto::StepProgress* s = e.mutable_node_steps()->add_ranks();
      s->set_rank(rank);
      s->set_step(step);
      s->set_loss(2.0);
      s->set_checkpoint_step(-1);
    }
    return e;
  };
  clock_.Advance(1s);
  Tick();
  const int64_t before = Status()["controller"]["inputs"];
  ASSERT_TRUE(transport_.Deliver(ids[0], report(0, 3)));
  ASSERT_TRUE(transport_.Deliver(ids[1], report(1, 3)));
  ASSERT_TRUE(transport_.Deliver(ids[1], report(1, 4, /*times=*/2)));
  Pump();
  clock_.Advance(1s);
  shell_->RunOnce(/*block=*/false);  // a tick: one input more
  const nlohmann::json status = Status();
  EXPECT_EQ(status["step"], 3) << status;
  EXPECT_EQ(status["controller"]["inputs"], before + 3) << "two reports and a tick";
}

// The live rate (steps_per_s, tokens_per_s) follows rank 0's steps also
// when they come in its node's report: it read only single-rank reports and
// said 0 once agents batched their ranks (issue 24's NodeSteps).
TEST_F(ControllerShellTest, TheRateFollowsRankZerosStepsInItsNodesReports) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  for (int64_t step = 1; step <= 5; ++step) {
    clock_.Advance(500ms);
    for (int rank = 0; rank < 2; ++rank) {
      proto::AgentEvent e = Event(0);
      proto::StepProgress* s = e.mutable_node_steps()->add_ranks();
      s->set_rank(rank);
      s->set_step(step);
      s->set_loss(2.0);
      s->set_checkpoint_step(-1);
      s->set_tokens(1000);
      ASSERT_TRUE(transport_.Deliver(ids[rank], e));
    }
    Pump();
  }
  clock_.Advance(300ms);
  Tick();
  const nlohmann::json status = Status();
  EXPECT_EQ(status["step"], 5) << status;
  EXPECT_NEAR(status["steps_per_s"].get<double>(), 2.0, 1e-9) << status;  // a step per 0.5 s
  EXPECT_NEAR(status["tokens_per_s"].get<double>(), 2000.0, 1e-6) << status;
  // This job takes no checkpoints (no every_steps): no durable age to alert on.
  EXPECT_EQ(status["durable"]["step"], -1);
  EXPECT_TRUE(status["durable"]["age_s"].is_null()) << status;
}

// An agent's word that the job's progress_pattern matches nothing its
// workers print (ProgressUnmatched) is a warning in the live status and the
// report, once however often it comes, with the worker's line as text.
TEST_F(ControllerShellTest, APatternThatMatchesNothingIsAWarningInTheStatusAndTheReport) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  for (int i = 0; i < 2; ++i) {
    proto::AgentEvent e = Event(0);
    e.mutable_progress_unmatched()->set_lines(100);
    e.mutable_progress_unmatched()->set_seconds(21.5);
    e.mutable_progress_unmatched()->set_last_line("Epoch 0: 12%|\xff| 12/100");
    ASSERT_TRUE(transport_.Deliver(ids[0], e));
  }
  Pump();
  clock_.Advance(300ms);
  Tick();
  const nlohmann::json status = Status();
  ASSERT_EQ(status["warnings"].size(), 1u) << status;
  const std::string warning = status["warnings"][0];
  EXPECT_NE(warning.find("node0: [detection] progress_pattern matched none of the 100 lines its "
                         "workers printed over 21.5s (the last: 'Epoch 0: 12%|\xEF\xBF\xBD| "
                         "12/100')"),
            std::string::npos)
      << warning;
  Steps(ids, 0, 1, 2);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(transport_.Deliver(ids[r], Exited(0, r, 0)));
  Pump();
  ASSERT_TRUE(shell_->done());
  ASSERT_TRUE(shell_->Finish().ok());
  const nlohmann::json report = ReadJson(JoinPath(state_dir(), "report.json"));
  ASSERT_EQ(report["warnings"], nlohmann::json::array({warning}));
  EXPECT_NE(RenderReport(report).find("  warning: " + warning), std::string::npos);
}

// A loop whose oldest queued input waited longer than kOverloadedAfter says
// so — in its log, its status and its metrics — until it is back within
// kCaughtUpWithin, and counts the time.
TEST_F(ControllerShellTest, AnOverloadedControllerSaysSoUntilItCatchesUp) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 2);
  clock_.Advance(1s);
  Tick();
  EXPECT_EQ(Status()["controller"]["overloaded"], false) << Status();
  for (int s = 3; s <= 12; ++s) {
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(transport_.Deliver(ids[r], Step(0, r, s)));
  }
  clock_.Advance(3s);  // the inputs waited 3 s for the loop
  testing::internal::CaptureStderr();
  shell_->RunOnce(/*block=*/false);
  std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("overloaded: the oldest of 20 queued inputs has waited 3.0s"),
            std::string::npos)
      << said;
  nlohmann::json c = Status()["controller"];
  EXPECT_EQ(c["overloaded"], true) << c;
  EXPECT_EQ(c["queued"], 19) << c;
  EXPECT_DOUBLE_EQ(c["behind_s"].get<double>(), 3.0) << c;
  EXPECT_NE(shell_->MetricsText().find("\nendure_controller_overloaded 1\n"), std::string::npos);
  // The queue drains, the clock moving 0.1 s a turn: overloaded until the
  // oldest input is back within 0.5 s (the queue empty, a turn later).
  testing::internal::CaptureStderr();
  while (shell_->queued() > 0) {
    clock_.Advance(100ms);
    shell_->RunOnce(/*block=*/false);
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("caught up"), std::string::npos);
  testing::internal::CaptureStderr();
  clock_.Advance(250ms);
  shell_->RunOnce(/*block=*/false);
  said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("caught up after 2.1s overloaded"), std::string::npos) << said;
  c = Status()["controller"];
  EXPECT_EQ(c["overloaded"], false) << c;
  EXPECT_NEAR(c["overloaded_s"].get<double>(), 2.15, 1e-9) << c;
  EXPECT_NE(shell_->MetricsText().find("\nendure_controller_overloaded 0\n"), std::string::npos);
}

TEST_F(ControllerShellTest, StreamsBeyondTheBoundAreRefusedAndEndedOnesForgotten) {
  Make(1);  // 2 x 1 + 64 = 66 streams
  std::vector<ConnectionId> ids;
  for (int i = 0; i < MaxConnections(JobSpec{}); ++i) {
    ids.push_back(transport_.Open());
    ASSERT_TRUE(transport_.open(ids.back())) << i;
  }
  const ConnectionId extra = transport_.Open();
  EXPECT_FALSE(transport_.open(extra));
  EXPECT_EQ(transport_.ended_with(extra).code, Code::kResourceExhausted);
  transport_.HangUp(ids[0]);
  const ConnectionId again = transport_.Open();
  EXPECT_TRUE(transport_.open(again)) << "a stream that ended frees its place";
}

TEST_F(ControllerShellTest, AStreamThatNeverSaysHelloIsCutAtItsDeadline) {
  Make(1);
  const ConnectionId silent = transport_.Open();
  const ConnectionId agent = Attach("node0");
  Pump();
  clock_.Advance(kHelloTimeout - 100ms);
  ASSERT_TRUE(transport_.Deliver(agent, Heartbeat()));
  Tick();
  EXPECT_TRUE(transport_.open(silent));
  clock_.Advance(100ms);
  Tick();
  EXPECT_TRUE(transport_.cut(silent));
  EXPECT_FALSE(transport_.open(silent));
  EXPECT_FALSE(transport_.cut(agent)) << "a registered agent has no hello deadline";
  EXPECT_TRUE(transport_.open(agent));
}

TEST_F(ControllerShellTest, AWorkerCrashStopsEveryNodeAndStartsTheNextGeneration) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 2);
  ASSERT_TRUE(transport_.Deliver(ids[1], Exited(0, 1, 1)));
  Pump();
  for (ConnectionId id : ids) {
    const std::vector<proto::AgentCommand> got = transport_.TakeCommands(id);
    ASSERT_EQ(Kinds(got), std::vector<std::string>{"stop"});
    EXPECT_EQ(got[0].generation(), 0);
    EXPECT_EQ(got[0].stop().grace_s(), 2.0);
  }
  EXPECT_EQ(Status()["phase"], "stopping");
  ASSERT_TRUE(transport_.Deliver(ids[0], Stopped(0)));
  Pump();
  EXPECT_TRUE(transport_.TakeCommands(ids[0]).empty()) << "node1 has not stopped yet";
  ASSERT_TRUE(transport_.Deliver(ids[1], Stopped(0)));
  Pump();
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::vector<proto::AgentCommand> got = transport_.TakeCommands(ids[i]);
    ASSERT_EQ(Kinds(got), std::vector<std::string>{"start"});
    EXPECT_EQ(got[0].generation(), 1);
    EXPECT_EQ(got[0].start().restore_step(), -1);
    EXPECT_EQ(Ranks(got[0]), std::vector<int>{static_cast<int>(i)});
  }
  Result<StateStore> store = StateStore::OpenExisting(StateStore::PathIn(state_dir()));
  ASSERT_TRUE(store.ok());
  Result<std::vector<core::Incident>> incidents = store->LoadIncidents(core::TimePoint{});
  ASSERT_TRUE(incidents.ok());
  ASSERT_EQ(incidents->size(), 1u);
  EXPECT_EQ((*incidents)[0].cause.name, "worker_exit code 1");
  EXPECT_EQ((*incidents)[0].rank.value, 1);
  EXPECT_EQ((*incidents)[0].node_name, "node1");
  EXPECT_EQ((*incidents)[0].failed_at_step.value, 2);
  EXPECT_EQ((*incidents)[0].action, "restart_in_place");
}

TEST_F(ControllerShellTest, AnXidInTheLogEvictsTheNodeAndAReplacementTakesItsRanks) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 2);
  proto::AgentEvent xid = Event(0);
  xid.mutable_log_match()->set_rank(1);
  xid.mutable_log_match()->set_cause("xid_79");
  xid.mutable_log_match()->set_action(proto::LOG_ACTION_EVICT_NODE);
  xid.mutable_log_match()->set_rule("xid_hardware");
  xid.mutable_log_match()->set_line("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.");
  ASSERT_TRUE(transport_.Deliver(ids[1], xid));
  ASSERT_TRUE(transport_.Deliver(ids[1], Exited(0, 1, 1)));
  Pump();
  EXPECT_EQ(Kinds(transport_.TakeCommands(ids[0])), std::vector<std::string>{"stop"});
  const std::vector<proto::AgentCommand> to_bad = transport_.TakeCommands(ids[1]);
  ASSERT_EQ(Kinds(to_bad), (std::vector<std::string>{"stop", "shutdown"}));
  EXPECT_EQ(to_bad[1].shutdown().reason().rfind("evicted: ", 0), 0u) << to_bad[1].DebugString();
  ASSERT_TRUE(transport_.Deliver(ids[0], Stopped(0)));
  Pump();
  EXPECT_TRUE(transport_.TakeCommands(ids[0]).empty()) << "one healthy node of two";
  EXPECT_EQ(Status()["last_incident"], "xid_79 (rank 1, evict_and_wait_for_repair)");
  // The live status says which way the job goes back, and why not in process.
  EXPECT_EQ(Status()["last_route"].get<std::string>().rfind(
                "full_restart (full restart from the checkpoint tiers: ", 0),
            0u)
      << Status()["last_route"];

  const ConnectionId spare = Attach("node2");
  Pump();
  const std::vector<proto::AgentCommand> to_a = transport_.TakeCommands(ids[0]);
  const std::vector<proto::AgentCommand> to_spare = transport_.TakeCommands(spare);
  ASSERT_EQ(Kinds(to_a), std::vector<std::string>{"start"});
  ASSERT_EQ(Kinds(to_spare), std::vector<std::string>{"start"});
  EXPECT_EQ(to_a[0].generation(), 1);
  EXPECT_EQ(Ranks(to_a[0]), std::vector<int>{0});
  EXPECT_EQ(Ranks(to_spare[0]), std::vector<int>{1});
  EXPECT_TRUE(transport_.TakeCommands(ids[1]).empty());
}

// A spare keeps standbys of the job's program as the members run it: the
// same command and the same job environment (an interpreter's PYTHONPATH).
TEST_F(ControllerShellTest, ASpareIsPreparedWithTheJobsCommandAndEnvironment) {
  Make(2, "[recovery]\nwarm_standby = true\n");
  std::vector<ConnectionId> ids;
  for (int i = 0; i < 2; ++i) ids.push_back(Attach("node" + std::to_string(i)));
  Pump();
  const std::vector<proto::AgentCommand> started = transport_.TakeCommands(ids[0]);
  ASSERT_FALSE(started.empty());
  ASSERT_TRUE(started[0].has_start());
  Steps(ids, 0, 1, 1);  // running
  const ConnectionId spare = Attach("node2");
  Pump();
  const std::vector<proto::AgentCommand> to_spare = transport_.TakeCommands(spare);
  ASSERT_EQ(to_spare.size(), 1u);
  ASSERT_TRUE(to_spare[0].has_prepare());
  const proto::Prepare& prepare = to_spare[0].prepare();
  EXPECT_EQ(std::vector<std::string>(prepare.command().begin(), prepare.command().end()),
            std::vector<std::string>{"/bin/true"});
  EXPECT_EQ(prepare.standbys(), 1);
  const std::map<std::string, std::string> env(prepare.env().begin(), prepare.env().end());
  const std::map<std::string, std::string> start_env(started[0].start().env().begin(),
                                                     started[0].start().env().end());
  EXPECT_EQ(env, start_env);
  EXPECT_EQ(env.count("TORCHELASTIC_RUN_ID"), 1u);
}

// The dashboard's tables (/api/nodes, /api/incidents): each node's state
// and each incident, a page at a time, at most kTablesEvery behind.
TEST_F(ControllerShellTest, TheLiveTablesShowEachNodesStateAndEachIncidentAPageAtATime) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  const ConnectionId spare = Attach("node2");
  Steps(ids, 0, 1, 2);
  auto rows = [&](ControllerShell::LiveTable table) {
    Result<nlohmann::json> page = shell_->TablePage(table, "");
    EXPECT_TRUE(page.ok()) << page.status().ToString();
    return page.ok() ? (*page)["rows"] : nlohmann::json();
  };
  nlohmann::json nodes = rows(ControllerShell::LiveTable::kNodes);
  ASSERT_EQ(nodes.size(), 3u) << nodes.dump();
  EXPECT_EQ(nodes[0]["state"], "member");
  EXPECT_EQ(nodes[1]["first_rank"], 1);
  EXPECT_EQ(nodes[2]["name"], "node2");
  EXPECT_EQ(nodes[2]["state"], "spare");
  EXPECT_TRUE(rows(ControllerShell::LiveTable::kIncidents).empty());

  ASSERT_TRUE(transport_.Deliver(ids[1], Exited(0, 1, 1)));
  Pump();
  clock_.Advance(kTablesEvery);
  Tick();
  const nlohmann::json incidents = rows(ControllerShell::LiveTable::kIncidents);
  ASSERT_EQ(incidents.size(), 1u);
  EXPECT_EQ(incidents[0]["cause"], "worker_exit code 1");
  EXPECT_EQ(incidents[0]["node"], "node1");
  EXPECT_EQ(incidents[0]["failed_at_step"], 2);

  // The teardown's inventory: each node's tiers, their bytes and newest
  // steps, in its row (a refused copy does not count).
  for (int n = 0; n < 2; ++n) {
    proto::AgentEvent e = Stopped(0);
    e.mutable_stopped()->set_t0_bytes(1000 + n);
    e.mutable_stopped()->set_t1_bytes(2000 + n);
    auto copy = [&](int64_t step, proto::Tier tier, const char* refused) {
      proto::ShardCopy* c = e.mutable_stopped()->add_inventory();
      c->set_step(step);
      c->set_shard(n);
      c->set_shards(2);
      c->set_tier(tier);
      c->set_refused(refused);
    };
    copy(2, proto::TIER_T0, "");
    copy(1, proto::TIER_T1, "");
    copy(3, proto::TIER_T1, "checksum mismatch");
    ASSERT_TRUE(transport_.Deliver(ids[n], e));
  }
  Pump();
  clock_.Advance(kTablesEvery);
  Tick();
  nodes = rows(ControllerShell::LiveTable::kNodes);
  EXPECT_EQ(nodes[1]["t0_bytes"], 1001) << nodes.dump();
  EXPECT_EQ(nodes[1]["t1_bytes"], 2001);
  EXPECT_EQ(nodes[1]["t0_step"], 2);
  EXPECT_EQ(nodes[1]["t1_step"], 1);
  EXPECT_EQ(nodes[2]["t0_step"], -1) << "the spare listed nothing";

  // The spare's stream drops: down once the stream grace (2 s) has passed.
  transport_.HangUp(spare);
  Pump();
  clock_.Advance(3s);
  Tick();
  nodes = rows(ControllerShell::LiveTable::kNodes);
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_EQ(nodes[2]["state"], "down") << nodes.dump();

  Result<nlohmann::json> bad = shell_->TablePage(ControllerShell::LiveTable::kNodes, "two");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("?page=N"), std::string::npos);
}

TEST_F(ControllerShellTest, AStreamThatDropsIsANodeLostIncidentOnceTheStreamGracePasses) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 2);
  transport_.HangUp(ids[1]);
  Pump();
  // Held for the stream grace (2s), in case the agent comes back.
  clock_.Advance(2s - 1ms);
  Tick();
  EXPECT_TRUE(transport_.TakeCommands(ids[0]).empty());
  EXPECT_EQ(Status()["incidents"], 0);
  clock_.Advance(1ms);
  Tick();
  EXPECT_EQ(Kinds(transport_.TakeCommands(ids[0])), std::vector<std::string>{"stop"});
  EXPECT_TRUE(transport_.TakeCommands(ids[1]).empty());
  Result<StateStore> store = StateStore::OpenExisting(StateStore::PathIn(state_dir()));
  ASSERT_TRUE(store.ok());
  Result<std::vector<core::Incident>> incidents = store->LoadIncidents(core::TimePoint{});
  ASSERT_TRUE(incidents.ok());
  ASSERT_EQ(incidents->size(), 1u);
  EXPECT_EQ((*incidents)[0].cause.name, "node_lost");
  EXPECT_EQ((*incidents)[0].node_name, "node1");
  EXPECT_EQ((*incidents)[0].rank.value, 1);
  EXPECT_NE((*incidents)[0].reason.find(kStreamClosed), std::string::npos)
      << (*incidents)[0].reason;
}

TEST_F(ControllerShellTest, AnAgentSilentPastTheHeartbeatTimeoutIsLost) {
  Make(2, "[detection]\nheartbeat_timeout = \"5s\"\n");
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(1s);
    ASSERT_TRUE(transport_.Deliver(ids[0], Heartbeat()));
    Tick();
  }
  EXPECT_EQ(Status()["incidents"], 0);
  for (int i = 0; i < 2; ++i) {
    clock_.Advance(1s);
    ASSERT_TRUE(transport_.Deliver(ids[0], Heartbeat()));
    Tick();
  }
  EXPECT_EQ(Status()["incidents"], 1);
  EXPECT_EQ(Status()["last_incident"].get<std::string>().rfind("node_lost (rank 1", 0), 0u)
      << Status();
  EXPECT_EQ(Kinds(transport_.TakeCommands(ids[0])), std::vector<std::string>{"stop"});
}

// A loop behind its queue still judges liveness: a silent node is lost
// while inputs wait (a tick comes between two of them once its deadline has
// passed), and the node whose heartbeats are the backlog is not (the tick is
// as of the oldest input waiting). It used to wait until the queue drained.
TEST_F(ControllerShellTest, ASilentNodeIsJudgedWhileInputsQueueUpAndNoQueuedOneIs) {
  Make(2, "[detection]\nheartbeat_timeout = \"5s\"\n");
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  // node1 falls silent; node0's heartbeats of 12 seconds wait in the queue.
  for (int i = 0; i < 12; ++i) {
    clock_.Advance(1s);
    ASSERT_TRUE(transport_.Deliver(ids[0], Heartbeat()));
  }
  size_t waiting_at_verdict = 0;
  while (shell_->queued() > 0 && Status()["incidents"] == 0) {
    shell_->RunOnce(/*block=*/false);
    waiting_at_verdict = shell_->queued();
  }
  EXPECT_EQ(Status()["incidents"], 1);
  EXPECT_EQ(Status()["last_incident"].get<std::string>().rfind("node_lost (rank 1", 0), 0u)
      << Status();
  EXPECT_GE(waiting_at_verdict, 5u) << "judged before the queue drained";
  Pump();
  Tick();
  EXPECT_EQ(Status()["incidents"], 1) << "node0, whose heartbeats were queued, is not lost";
}

TEST_F(ControllerShellTest, SigtermStopsTheAgentsWithTheGraceAndExits143OnceTheyStopped) {
  Make(2, "[recovery]\ngrace_period = \"4s\"\n");
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 2);
  // Queued before the signal, taken after it: the job stops first.
  ASSERT_TRUE(transport_.Deliver(ids[1], Exited(0, 1, 1)));
  shell_->OnSignal(SIGTERM);
  shell_->RunOnce(/*block=*/false);
  for (ConnectionId id : ids) {
    const std::vector<proto::AgentCommand> got = transport_.TakeCommands(id);
    ASSERT_EQ(Kinds(got), std::vector<std::string>{"stop"});
    EXPECT_EQ(got[0].stop().grace_s(), 4.0);
    EXPECT_EQ(got[0].token(), kToken);
  }
  Pump();
  EXPECT_FALSE(shell_->done());
  EXPECT_EQ(Status()["incidents"], 0) << "a worker's exit during the stop is the stop's";
  ASSERT_TRUE(transport_.Deliver(ids[0], Stopped(0)));
  Pump();
  EXPECT_FALSE(shell_->done());
  ASSERT_TRUE(transport_.Deliver(ids[1], Stopped(0)));
  Pump();
  ASSERT_TRUE(shell_->done());
  for (ConnectionId id : ids) {
    const std::vector<proto::AgentCommand> got = transport_.TakeCommands(id);
    ASSERT_EQ(Kinds(got), std::vector<std::string>{"shutdown"});
    EXPECT_EQ(got[0].shutdown().reason(), "the controller was stopped by SIGTERM");
  }
  Result<int> code = shell_->Finish();
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 128 + SIGTERM);
  const nlohmann::json report = ReadJson(JoinPath(state_dir(), "report.json"));
  EXPECT_EQ(report["stopped_by"], "SIGTERM");
  EXPECT_EQ(report["completed"], false);
  EXPECT_EQ(report["exit_code"], 143);
}

TEST_F(ControllerShellTest, AfterSigintTheStopEndsAtItsDeadlineWithoutEveryAgent) {
  Make(2, "[recovery]\ngrace_period = \"4s\"\n");
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  shell_->OnSignal(SIGINT);
  Tick();
  ASSERT_TRUE(transport_.Deliver(ids[0], Stopped(0)));
  Pump();
  // The grace period, a second for the last persist, and a margin: 4 + 3 s.
  clock_.Advance(7s - 1ms);
  Tick();
  EXPECT_FALSE(shell_->done());
  clock_.Advance(1ms);
  Tick();
  ASSERT_TRUE(shell_->done());
  Result<int> code = shell_->Finish();
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 128 + SIGINT);
  EXPECT_EQ(ReadJson(JoinPath(state_dir(), "report.json"))["stopped_by"], "SIGINT");
}

TEST_F(ControllerShellTest, ACommittedCheckpointIsTheNextGenerationsRestorePoint) {
  Make(2, "every_steps = 1\n");  // appended to [checkpoint]
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 3);
  // Each rank's agent persists its shard of step 2, as the tiers do.
  checkpoint::CheckpointDir dir(Env::Default(), ckpt_dir());
  for (int rank = 0; rank < 2; ++rank) {
    Result<checkpoint::ShardEntry> entry =
        dir.WriteShard(2, rank, "shard " + std::to_string(rank) + " of step 2");
    ASSERT_TRUE(entry.ok()) << entry.status().ToString();
    proto::AgentEvent persisted = Event(0);
    persisted.mutable_persisted()->set_step(2);
    persisted.mutable_persisted()->set_shard(rank);
    persisted.mutable_persisted()->set_shards(2);
    persisted.mutable_persisted()->set_bytes(entry->bytes);
    persisted.mutable_persisted()->set_xxh3(HexU64(entry->xxh3));
    ASSERT_TRUE(transport_.Deliver(ids[rank], persisted));
    Pump();
    EXPECT_EQ(dir.CommittedShards(2).ok(), rank == 1) << "committed once every shard is durable";
  }
  ASSERT_TRUE(transport_.Deliver(ids[0], Exited(0, 0, 1)));
  Pump();
  for (ConnectionId id : ids) ASSERT_TRUE(transport_.Deliver(id, Stopped(0)));
  Pump();
  for (ConnectionId id : ids) {
    const std::vector<proto::AgentCommand> got = transport_.TakeCommands(id);
    ASSERT_EQ(Kinds(got), (std::vector<std::string>{"stop", "start"}));
    const proto::CheckpointConfig& c = got[1].start().checkpoint();
    EXPECT_TRUE(c.enabled());
    EXPECT_EQ(c.discard_after(), 2);
    const nlohmann::json plan = nlohmann::json::parse(c.restore_plan_json());
    EXPECT_EQ(plan["step"], 2) << plan;
    ASSERT_EQ(plan["sources"].size(), 2u);
    EXPECT_EQ(plan["sources"][0]["tier"], "T2");
  }
  shell_->OnSignal(SIGTERM);
  Tick();
  clock_.Advance(10s);
  Tick();
  ASSERT_TRUE(shell_->done());
  ASSERT_TRUE(shell_->Finish().ok());
  const nlohmann::json report = ReadJson(JoinPath(state_dir(), "report.json"));
  EXPECT_EQ(report["checkpoint"]["durable_commits"], 1);
  EXPECT_EQ(report["checkpoint"]["newest_durable_step"], 2);
  EXPECT_NE(report["verdict"].get<std::string>().find("(durable: step 2)"), std::string::npos)
      << report["verdict"];
  ASSERT_EQ(report["incidents"].size(), 1u);
  EXPECT_EQ(report["incidents"][0]["restore"], "step 2 from T2 x2") << report["incidents"][0];
}

TEST_F(ControllerShellTest, AFloodingAgentIsCutAndItsNodeLost) {
  Make(1);
  const std::vector<ConnectionId> ids = AttachAndStart(1);
  int taken = 0;
  while (transport_.Deliver(ids[0], Heartbeat())) ++taken;
  EXPECT_EQ(taken, kMaxQueuedPerAgent);
  EXPECT_EQ(transport_.ended_with(ids[0]).code, Code::kResourceExhausted);
  Pump();
  EXPECT_EQ(Status()["incidents"], 1);
  Result<StateStore> store = StateStore::OpenExisting(StateStore::PathIn(state_dir()));
  ASSERT_TRUE(store.ok());
  Result<std::vector<core::Incident>> incidents = store->LoadIncidents(core::TimePoint{});
  ASSERT_TRUE(incidents.ok());
  ASSERT_EQ(incidents->size(), 1u);
  EXPECT_EQ((*incidents)[0].cause.name, "node_lost");
  EXPECT_NE((*incidents)[0].reason.find("a flood"), std::string::npos) << (*incidents)[0].reason;
}

// Multi-host: c10d's store runs where rank 0 does, so its port must be free
// on that host, not on the controller's. Each agent reports one with its
// registration and each stop; a report serves one generation, and without
// a fresh one the controller falls back to its own picker.
TEST_F(ControllerShellTest, TheRendezvousPortIsOneRankZerosNodeFoundFreeOnItsOwnHost) {
  Make(2, "[recovery]\nbackoff_initial = \"0s\"\n");
  std::vector<ConnectionId> ids;
  for (int i = 0; i < 2; ++i) {
    proto::AgentEvent hello = Hello("node" + std::to_string(i));
    hello.mutable_register_()->set_free_port(40000 + i);
    ids.push_back(transport_.Open());
    ASSERT_TRUE(transport_.Deliver(ids[i], hello)) << transport_.ended_with(ids[i]).message;
  }
  Pump();
  for (ConnectionId id : ids) {
    const std::vector<proto::AgentCommand> got = transport_.TakeCommands(id);
    ASSERT_EQ(Kinds(got), std::vector<std::string>{"start"});
    EXPECT_EQ(got[0].start().master_addr(), "host-node0");
    EXPECT_EQ(got[0].start().master_port(), 40000) << "node0's port, not node1's nor the picker's";
  }
  // A crash: each node reports a fresh port once its workers are gone.
  const auto crash_and_restart = [&](int generation, int port0, int port1) {
    Steps(ids, generation, 1, 2);
    ASSERT_TRUE(transport_.Deliver(ids[1], Exited(generation, 1, 1)));
    Pump();
    for (int i = 0; i < 2; ++i) {
      EXPECT_EQ(Kinds(transport_.TakeCommands(ids[i])), std::vector<std::string>{"stop"});
      proto::AgentEvent stopped = Stopped(generation);
      stopped.mutable_stopped()->set_free_port(i == 0 ? port0 : port1);
      ASSERT_TRUE(transport_.Deliver(ids[i], stopped));
    }
    Pump();
  };
  crash_and_restart(0, 41000, 41001);
  std::vector<proto::AgentCommand> got = transport_.TakeCommands(ids[0]);
  ASSERT_EQ(Kinds(got), std::vector<std::string>{"start"});
  EXPECT_EQ(got[0].generation(), 1);
  EXPECT_EQ(got[0].start().master_port(), 41000);
  EXPECT_EQ(transport_.TakeCommands(ids[1]).at(0).start().master_port(), 41000);
  // A report out of range is ignored, and node0's last port served
  // generation 1 already: the controller's picker decides.
  crash_and_restart(1, 70000, 41101);
  got = transport_.TakeCommands(ids[0]);
  ASSERT_EQ(Kinds(got), std::vector<std::string>{"start"});
  EXPECT_EQ(got[0].generation(), 2);
  EXPECT_EQ(got[0].start().master_port(), kMasterPort);
}

TEST_F(ControllerShellTest, ARegistrationWithAFreePortOutOfRangeIsRefused) {
  Make(1);
  for (int port : {-1, 65536, 1 << 30}) {
    proto::AgentEvent hello = Hello("node0");
    hello.mutable_register_()->set_free_port(port);
    const ConnectionId id = transport_.Open();
    EXPECT_FALSE(transport_.Deliver(id, hello)) << port;
    EXPECT_EQ(transport_.ended_with(id).code, Code::kInvalidArgument) << port;
    EXPECT_NE(transport_.ended_with(id).message.find("free_port"), std::string::npos)
        << transport_.ended_with(id).message;
  }
  proto::AgentEvent hello = Hello("node0");
  hello.mutable_register_()->set_free_port(65535);
  const ConnectionId id = transport_.Open();
  ASSERT_TRUE(transport_.Deliver(id, hello)) << transport_.ended_with(id).message;
  Pump();
  const std::vector<proto::AgentCommand> got = transport_.TakeCommands(id);
  ASSERT_EQ(Kinds(got), std::vector<std::string>{"start"});
  EXPECT_EQ(got[0].start().master_port(), 65535);
}

// The T2 directory is the spec's, as written: each agent resolves a relative
// one on its own host (under its --checkpoint-root), never under the
// controller's working directory; the controller reads the same shared
// directory where its own host has it, and names durable copies in a
// restore plan relative to it.
TEST_F(ControllerShellTest, TheCheckpointDirGoesDownAsWrittenWithDurableSourcesRelativeToIt) {
  char* cwd = ::getcwd(nullptr, 0);
  ASSERT_NE(cwd, nullptr);
  const std::string previous = cwd;
  std::free(cwd);
  ASSERT_EQ(::chdir(dir_.path().c_str()), 0);
  const std::string text =
      "[job]\nname = \"shell\"\ncommand = [\"/bin/true\"]\nnodes = 2\n"
      "state_dir = \"" +
      state_dir() + "\"\n[checkpoint]\ndir = \"shared/t2\"\nevery_steps = 1\n";
  Result<JobSpec> spec = ParseJobSpec(text, "shell.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  ControllerOptions o;
  o.spec = *spec;
  o.state_dir = state_dir();
  o.token = kToken;
  shell_ = std::make_unique<ControllerShell>(o, &clock_, &transport_,
                                             [] { return Result<int>(kMasterPort); });
  ASSERT_TRUE(transport_.Start(shell_.get()).ok());
  ASSERT_TRUE(shell_->Start().ok());
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  Steps(ids, 0, 1, 3);
  // The controller's view of T2: under its own working directory.
  checkpoint::CheckpointDir dir(Env::Default(), dir_.Path("shared/t2"));
  for (int rank = 0; rank < 2; ++rank) {
    Result<checkpoint::ShardEntry> entry = dir.WriteShard(2, rank, "shard " + std::to_string(rank));
    ASSERT_TRUE(entry.ok()) << entry.status().ToString();
    proto::AgentEvent persisted = Event(0);
    persisted.mutable_persisted()->set_step(2);
    persisted.mutable_persisted()->set_shard(rank);
    persisted.mutable_persisted()->set_shards(2);
    persisted.mutable_persisted()->set_bytes(entry->bytes);
    persisted.mutable_persisted()->set_xxh3(HexU64(entry->xxh3));
    ASSERT_TRUE(transport_.Deliver(ids[rank], persisted));
    Pump();
  }
  EXPECT_TRUE(dir.CommittedShards(2).ok()) << "the controller commits where it reads T2";
  ASSERT_TRUE(transport_.Deliver(ids[0], Exited(0, 0, 1)));
  Pump();
  for (ConnectionId id : ids) ASSERT_TRUE(transport_.Deliver(id, Stopped(0)));
  Pump();
  ASSERT_EQ(::chdir(previous.c_str()), 0);
  for (ConnectionId id : ids) {
    const std::vector<proto::AgentCommand> got = transport_.TakeCommands(id);
    ASSERT_EQ(Kinds(got), (std::vector<std::string>{"stop", "start"}));
    const proto::StartGeneration& start = got[1].start();
    EXPECT_EQ(start.checkpoint().dir(), "shared/t2");
    EXPECT_EQ(start.env().at("ENDURE_CKPT_DIR"), "shared/t2");
    const nlohmann::json plan = nlohmann::json::parse(start.checkpoint().restore_plan_json());
    ASSERT_EQ(plan["sources"].size(), 2u) << plan;
    for (int shard = 0; shard < 2; ++shard) {
      EXPECT_EQ(plan["sources"][shard]["tier"], "T2");
      EXPECT_EQ(plan["sources"][shard]["path"],
                "step-00000002/shard-0000" + std::to_string(shard) + ".bin")
          << plan;
    }
  }
}

// Both ranks report steps first..last on `t`, a second apart, and their
// agents a heartbeat with each.
void StepsOn(FakeTransport& t, ControllerShell& shell, FakeClock& clock,
             const std::vector<ConnectionId>& ids, int generation, int64_t first, int64_t last) {
  for (int64_t s = first; s <= last; ++s) {
    clock.Advance(1s);
    for (size_t r = 0; r < ids.size(); ++r) {
      ASSERT_TRUE(t.Deliver(ids[r], Heartbeat()));
      ASSERT_TRUE(t.Deliver(ids[r], Step(generation, static_cast<int>(r), s)));
    }
    while (shell.queued() > 0) shell.RunOnce(/*block=*/false);
  }
}

// A crash in generation 0 of a 2-node job, recovered in generation 1 up to
// step 6: incident 1 of the run.
std::vector<ConnectionId> CrashAndRecover(FakeTransport& t, ControllerShell& shell,
                                          FakeClock& clock, std::vector<ConnectionId> ids) {
  auto pump = [&] {
    while (shell.queued() > 0) shell.RunOnce(/*block=*/false);
  };
  StepsOn(t, shell, clock, ids, 0, 1, 3);
  EXPECT_TRUE(t.Deliver(ids[1], Exited(0, 1, 1)));
  pump();
  for (ConnectionId id : ids) EXPECT_TRUE(t.Deliver(id, Stopped(0)));
  pump();
  for (ConnectionId id : ids) {
    const std::vector<proto::AgentCommand> got = t.TakeCommands(id);
    EXPECT_EQ(Kinds(got), (std::vector<std::string>{"stop", "start"}));
  }
  StepsOn(t, shell, clock, ids, 1, 4, 6);
  return ids;
}

// The history the dashboard plots (/api/history) is saved with the run and
// carried on by a controller that restarts on its state directory: the plot
// does not begin again at its restart.
TEST_F(ControllerShellTest, ARestartedControllerCarriesTheHistoryOn) {
  Make(2);
  const std::vector<ConnectionId> ids = AttachAndStart(2);
  for (int64_t step = 1; step <= 15; ++step) {  // a step a second, past a save of the history
    clock_.Advance(1s);
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(transport_.Deliver(ids[r], Step(0, r, step)));
      ASSERT_TRUE(transport_.Deliver(ids[r], Heartbeat()));
    }
    Pump();
  }
  const nlohmann::json before = nlohmann::json::parse(shell_->HistoryJson());
  ASSERT_GE(before["t_s"].size(), 10u) << before;
  EXPECT_GE(before["step"].back(), 14) << before;  // sampled as the steps came
  clock_.Advance(3s);
  Restart();
  clock_.Advance(2s);
  Tick();
  const nlohmann::json after = nlohmann::json::parse(shell_->HistoryJson());
  ASSERT_GT(after["t_s"].size(), 10u) << after;
  EXPECT_EQ(after["t_s"][0], before["t_s"][0]);
  EXPECT_GE(after["t_s"].back().get<double>(), 20.0) << "a sample after the restart";
  EXPECT_EQ(after["ettr"].size(), after["t_s"].size());
}

// The controller is killed mid-run and started again on the same state
// directory: it replays its journal, reaches the state it died in (the
// generation, the step, the incident before the crash), takes the agents
// back as they resume that generation — no stop, no start, no incident —
// and the run ends as one run whose report holds the earlier incident.
TEST_F(ControllerShellTest, ARestartedControllerCarriesTheRunOnAndTheAgentsResumeIntoIt) {
  Make(2);
  CrashAndRecover(transport_, *shell_, clock_, AttachAndStart(2));
  ASSERT_EQ(Status()["incidents"], 1);
  const std::string before = shell_->MetricsText();
  ASSERT_NE(before.find("\nendure_incidents_total{cause=\"worker_exit\"} 1\n"), std::string::npos)
      << before;
  clock_.Advance(3s);  // the controller is down
  Restart();
  nlohmann::json status = Status();
  EXPECT_EQ(status["generation"], 1) << status;
  // The job's counters go on from the run's totals: no reset for Prometheus.
  const std::string after = shell_->MetricsText();
  EXPECT_NE(after.find("\nendure_incidents_total{cause=\"worker_exit\"} 1\n"), std::string::npos)
      << after;
  EXPECT_NE(after.find("\nendure_restarts_total{route=\"full_restart\"} 1\n"), std::string::npos)
      << after;
  EXPECT_NE(after.find("\nendure_detection_seconds_count 1\n"), std::string::npos) << after;
  EXPECT_EQ(status["phase"], "running");
  EXPECT_EQ(status["step"], 6);
  EXPECT_EQ(status["incidents"], 1);

  std::vector<ConnectionId> ids;
  for (int n = 0; n < 2; ++n) {
    ids.push_back(restarted_.Open());
    ASSERT_TRUE(
        restarted_.Deliver(ids.back(), ResumeHello("node" + std::to_string(n), 1, {{n, 6}})));
  }
  while (shell_->queued() > 0) shell_->RunOnce(false);
  // Well past the resume grace: nobody is lost.
  StepsOn(restarted_, *shell_, clock_, ids, 1, 7, 30);
  for (ConnectionId id : ids) {
    EXPECT_TRUE(restarted_.TakeCommands(id).empty()) << "no stop, no new generation";
  }
  EXPECT_EQ(Status()["incidents"], 1);
  // Agents repeat their ranks' last words after every resume (the first
  // copy may have died in flight): a repeat changes nothing.
  ASSERT_TRUE(restarted_.Deliver(ids[0], Exited(1, 0, 0)));
  ASSERT_TRUE(restarted_.Deliver(ids[0], Exited(1, 0, 0)));
  while (shell_->queued() > 0) shell_->RunOnce(false);
  EXPECT_FALSE(shell_->done()) << "rank 1 has not finished";
  ASSERT_TRUE(restarted_.Deliver(ids[1], Exited(1, 1, 0)));
  while (shell_->queued() > 0) shell_->RunOnce(false);
  ASSERT_TRUE(shell_->done());
  Result<int> code = shell_->Finish();
  ASSERT_TRUE(code.ok()) << code.status().ToString();
  EXPECT_EQ(*code, 0);
  const nlohmann::json report = ReadJson(JoinPath(state_dir(), "report.json"));
  ASSERT_EQ(report["incidents"].size(), 1u) << report.dump(2);
  EXPECT_EQ(report["incidents"][0]["cause"], "worker_exit code 1");
  EXPECT_EQ(report["run"], 1) << "one run, carried on";

  Result<StateStore> store = StateStore::OpenExisting(StateStore::PathIn(state_dir()));
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(store->run(), 1);
  Result<std::vector<GenerationRecord>> generations = store->LoadGenerations();
  ASSERT_TRUE(generations.ok());
  EXPECT_EQ(generations->size(), 2u) << "no generation started after the restart";
  // The journal replayed into a fresh machine ends where this one did.
  const std::vector<JournalEntry> journal = store->LoadJournal().value();
  ASSERT_FALSE(journal.empty());
  EXPECT_EQ(journal.front().seq, 1);
  EXPECT_EQ(journal.back().seq, static_cast<int64_t>(journal.size())) << "no gap";
}

// With snapshots: the restarted controller restores the newest one, replays
// only the journal after it (the journal before it is cut), and carries the
// run on as it does from the whole journal.
TEST_F(ControllerShellTest, ARestartRestoresTheSnapshotAndReplaysOnlyTheJournalAfterIt) {
  options_.snapshot_after_bytes = 1;  // a snapshot each time the journal is as large as one
  Make(2);
  StepsOn(transport_, *shell_, clock_,
          CrashAndRecover(transport_, *shell_, clock_, AttachAndStart(2)), 1, 7, 30);
  {
    Result<StateStore> store = StateStore::OpenExisting(StateStore::PathIn(state_dir()));
    ASSERT_TRUE(store.ok());
    const std::optional<SnapshotRecord> snapshot = store->LoadSnapshot().value();
    ASSERT_TRUE(snapshot.has_value()) << "the journal outgrew a snapshot: one was taken";
    const std::vector<JournalEntry> journal = store->LoadJournal().value();
    EXPECT_GT(snapshot->seq, 50) << "one taken as the run went on, not only at its start";
    if (!journal.empty()) EXPECT_EQ(journal.front().seq, snapshot->seq + 1) << "cut behind it";
    EXPECT_LT(journal.size(), 40u);
  }
  clock_.Advance(3s);  // the controller is down
  Restart();
  const nlohmann::json status = Status();
  EXPECT_EQ(status["generation"], 1) << status;
  EXPECT_EQ(status["phase"], "running");
  EXPECT_EQ(status["step"], 30);
  EXPECT_EQ(status["incidents"], 1);
  std::vector<ConnectionId> ids;
  for (int n = 0; n < 2; ++n) {
    ids.push_back(restarted_.Open());
    ASSERT_TRUE(
        restarted_.Deliver(ids.back(), ResumeHello("node" + std::to_string(n), 1, {{n, 30}})));
  }
  Pump();
  StepsOn(restarted_, *shell_, clock_, ids, 1, 31, 60);
  for (ConnectionId id : ids) {
    EXPECT_TRUE(restarted_.TakeCommands(id).empty()) << "no stop, no new generation";
  }
  clock_.Advance(1s);
  Tick();
  EXPECT_EQ(Status()["step"], 60);
  EXPECT_EQ(Status()["incidents"], 1);
  // A damaged snapshot is no state to carry on from: a new run begins, and
  // says why.
  clock_.Advance(1s);
  {
    Result<StateStore> store = StateStore::OpenExisting(StateStore::PathIn(state_dir()));
    ASSERT_TRUE(store.ok());
    SnapshotRecord snapshot = store->LoadSnapshot().value().value();
    snapshot.state[snapshot.state.size() / 2] ^= 1;
    ASSERT_TRUE(store->SaveSnapshot(snapshot).ok());
  }
  testing::internal::CaptureStderr();
  Restart();
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("not carrying on run 1: the job snapshot is damaged"), std::string::npos)
      << said;
  EXPECT_EQ(Status()["phase"], "waiting_for_nodes");
  EXPECT_EQ(Status()["incidents"], 0);
}

// An agent that does not come back after the restart is a lost node once
// the resume grace passes (here its heartbeat timeout, judged afresh from
// the restart, comes first): an incident like any other.
TEST_F(ControllerShellTest, ANodeWhoseAgentDoesNotResumeAfterARestartIsLost) {
  Make(2);
  CrashAndRecover(transport_, *shell_, clock_, AttachAndStart(2));
  Restart();
  const ConnectionId a = restarted_.Open();
  ASSERT_TRUE(restarted_.Deliver(a, ResumeHello("node0", 1, {{0, 6}})));
  for (int i = 0; i < 9; ++i) {
    clock_.Advance(1s);
    ASSERT_TRUE(restarted_.Deliver(a, Heartbeat()));
    Tick();
  }
  EXPECT_EQ(Status()["incidents"], 1) << "node1 is silent, but not for long enough yet";
  for (int i = 0; i < 2; ++i) {
    clock_.Advance(1s);
    ASSERT_TRUE(restarted_.Deliver(a, Heartbeat()));
    Tick();
  }
  EXPECT_EQ(Status()["incidents"], 2);
  EXPECT_EQ(Status()["last_incident"].get<std::string>().rfind("node_lost (rank 1", 0), 0u)
      << Status();
  EXPECT_EQ(Kinds(restarted_.TakeCommands(a)), std::vector<std::string>{"stop"});
}

// `--new-run`, a finished run, another spec and a damaged journal each
// begin a new run; the earlier one's history stays.
TEST_F(ControllerShellTest, ARunIsCarriedOnOnlyWhenUnfinishedUnderTheSameSpecAndReplayable) {
  Make(2);
  CrashAndRecover(transport_, *shell_, clock_, AttachAndStart(2));
  Restart(/*new_run=*/true);
  EXPECT_EQ(Status()["phase"], "waiting_for_nodes") << Status();
  EXPECT_EQ(Status()["incidents"], 0);
  {
    Result<StateStore> store = StateStore::OpenExisting(StateStore::PathIn(state_dir()));
    ASSERT_TRUE(store.ok());
    EXPECT_EQ(store->run(), 2);
    EXPECT_EQ(store->LoadIncidents(core::TimePoint{}, 1).value().size(), 1u);
  }
  // Run 2 is unfinished with a journal (its durable listing or nothing):
  // damage the journal of run 1 is beside the point; damage run 2's.
  shell_.reset();
  dead_.reset();
  {
    Result<StateStore> store = StateStore::OpenExisting(StateStore::PathIn(state_dir()));
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(store->AppendJournal({1000, 0s, "step_end generation=x"}).ok());
  }
  FakeTransport third;
  shell_ = std::make_unique<ControllerShell>(options_, &clock_, &third,
                                             [] { return Result<int>(kMasterPort); });
  ASSERT_TRUE(third.Start(shell_.get()).ok());
  ASSERT_TRUE(shell_->Start().ok());
  Result<StateStore> store = StateStore::OpenExisting(StateStore::PathIn(state_dir()));
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(store->run(), 3) << "run 2's journal is damaged: a new run, not a wrong state";
}

}  // namespace
}  // namespace endure::controller
