// The agent's logic on its seams: a FakeClock, a FakeTransport standing for
// the controller and a FakeProcessLauncher standing for the workers. No
// worker process runs; the agent's own socket, tier store (in a scratch
// directory) and threads are real. Each test drives it with commands and
// checks what it asked of the launcher and what it sent up.
#include "agent/agent_shell.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "agent/fake_process_launcher.h"
#include "agent/fake_transport.h"
#include "checkpoint/restore_plan.h"
#include "checkpoint/snapshot_file.h"
#include "common/config_files.h"
#include "common/hash.h"
#include "contract/worker_contract.h"
#include "proto/wire_enums.h"

namespace endure::agent {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using Case = proto::AgentEvent::EventCase;

constexpr char kToken[] = "job-token-5f2c9d";
constexpr int64_t kNoDiscard = -1;

FakeTransport::EventMatch Is(Case c) {
  return [c](const proto::AgentEvent& e) { return e.event_case() == c; };
}
// Each rank's step the node reported, in order: the entries of its reports
// (NodeSteps), each an event of its own with its report's generation.
std::vector<proto::AgentEvent> RankSteps(const std::vector<proto::AgentEvent>& events) {
  std::vector<proto::AgentEvent> out;
  for (const proto::AgentEvent& e : events) {
    for (const proto::StepProgress& s : e.node_steps().ranks()) {
      proto::AgentEvent one;
      one.set_generation(e.generation());
      one.set_time_s(e.time_s());
      *one.mutable_step() = s;
      out.push_back(std::move(one));
    }
  }
  return out;
}
// Everything but heartbeats, which go up on their own schedule.
bool NotHeartbeat(const proto::AgentEvent& e) { return e.event_case() != Case::kHeartbeat; }

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::map<std::string, std::string> EnvOf(const WorkerSpec& spec) {
  std::map<std::string, std::string> env;
  for (const auto& [k, v] : spec.env) env[k] = v;
  return env;
}

proto::AgentCommand Command(int64_t generation) {
  proto::AgentCommand cmd;
  cmd.set_token(kToken);
  cmd.set_generation(generation);
  return cmd;
}

// A generation of `ranks` on this node (local ranks 0, 1, ...).
proto::AgentCommand StartCommand(int64_t generation, const std::vector<int>& ranks,
                                 int world_size) {
  proto::AgentCommand cmd = Command(generation);
  proto::StartGeneration* s = cmd.mutable_start();
  s->set_world_size(world_size);
  s->set_master_addr("10.0.0.1");
  s->set_master_port(29500);
  for (size_t i = 0; i < ranks.size(); ++i) {
    proto::RankAssignment* r = s->add_ranks();
    r->set_rank(ranks[i]);
    r->set_local_rank(static_cast<int>(i));
  }
  s->add_command("/opt/endure/train");
  s->add_command("--lr=0.1");
  s->mutable_checkpoint()->set_discard_after(kNoDiscard);
  return cmd;
}

proto::AgentCommand StopCommand(int64_t generation, double grace_s) {
  proto::AgentCommand cmd = Command(generation);
  cmd.mutable_stop()->set_grace_s(grace_s);
  return cmd;
}

proto::AgentCommand InjectCommand(int64_t generation, const std::string& kind, int rank) {
  proto::AgentCommand cmd = Command(generation);
  cmd.mutable_inject()->set_kind(wire::ToWire(faults::ParseFaultKind(kind).value()));
  cmd.mutable_inject()->set_rank(rank);
  cmd.mutable_inject()->set_fault_id("f1");
  return cmd;
}

proto::AgentCommand ShutdownCommand() {
  proto::AgentCommand cmd = Command(0);
  cmd.mutable_shutdown()->set_reason("the job finished");
  return cmd;
}

// A ready snapshot of `rank`'s shard in its T0 slot, as a worker leaves it.
void WriteSnapshot(const std::string& t0_dir, int rank, int slot, int64_t step, int shards,
                   const std::string& payload) {
  checkpoint::SnapshotInfo info;
  info.step = step;
  info.shard = rank;
  info.shards = shards;
  info.xxh3 = Xxh3(payload);
  ASSERT_TRUE(
      checkpoint::WriteSnapshotFile(checkpoint::SlotPath(t0_dir, rank, slot), info, payload).ok());
}

class AgentShellTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure_agent_shell_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    fs::create_directories(root_ / "shm");
    options_.controller = "controller.test:7000";
    options_.node_id = "node0";
    options_.slots = 2;
    options_.token = kToken;
    options_.work_dir = (root_ / "work").string();
  }

  // config/log_rules/, as RunAgent loads it.
  static core::LogClassifier Rules() {
    Result<std::vector<TextFile>> files = ReadConfigFiles(ENDURE_LOG_RULES_PATH, ".toml");
    EXPECT_TRUE(files.ok()) << files.status().ToString();
    Result<core::LogClassifier> rules = core::LogClassifier::FromTomlFiles(
        files.ok() ? *files : std::vector<TextFile>{}, ENDURE_LOG_RULES_PATH);
    EXPECT_TRUE(rules.ok()) << rules.status().ToString();
    if (!rules.ok()) return std::move(core::LogClassifier::Create({})).value();
    return std::move(rules).value();
  }

  void TearDown() override {
    if (run_.joinable()) {
      // A broken stream no longer ends Run (the agent reconnects): a signal does.
      if (result_.wait_for(0s) != std::future_status::ready) agent_->ShutDownOnSignal(SIGTERM);
      run_.join();
    }
    agent_.reset();
    fs::remove_all(root_);
  }

  // Builds the agent on the fakes and runs it on a thread of its own.
  void StartAgent() {
    AgentSeams seams;
    seams.clock = &clock_;
    seams.transport = &transport_;
    seams.launcher = &launcher_;
    seams.shm_parent = (root_ / "shm").string();
    seams.pick_port = pick_port_;
    seams.kernel_log = kernel_log_.get();
    agent_ = std::make_unique<Agent>(options_, Rules(), std::move(seams));
    std::promise<Status> done;
    result_ = done.get_future();
    run_ = std::thread([this, done = std::move(done)]() mutable { done.set_value(agent_->Run()); });
  }

  // Run()'s result, waiting at most 10 s for it.
  Status AwaitRun() {
    if (result_.wait_for(10s) != std::future_status::ready) {
      ADD_FAILURE() << "Run() did not return";
      agent_->ShutDownOnSignal(SIGTERM);
    }
    run_.join();
    return result_.get();
  }

  // Hands the agent `cmd` and waits until it has carried it out.
  void Do(proto::AgentCommand cmd) {
    transport_.Push(std::move(cmd));
    ASSERT_TRUE(transport_.WaitUntilIdle()) << "the agent did not take the command";
  }

  // Advances the agent's clock by `step` at a time until `done` (the agent
  // polls its clock while it waits between reconnection attempts); false
  // when it is not done after `max_steps`.
  bool AdvanceUntil(const std::function<bool()>& done, Duration step, int max_steps = 1000) {
    for (int i = 0; i < max_steps; ++i) {
      if (done()) return true;
      clock_.Advance(step);
      std::this_thread::sleep_for(2ms);
    }
    return done();
  }

  // Waits in real time until `done` (what the agent's loop carries out
  // after the call that caused it); false after 10 s.
  static bool WaitFor(const std::function<bool()>& done) {
    for (int i = 0; i < 10000 && !done(); ++i) std::this_thread::sleep_for(1ms);
    return done();
  }

  // The events since the agent started, heartbeats left out.
  std::vector<proto::AgentEvent> Events() const { return transport_.EventsWhere(NotHeartbeat); }
  // Waits until the node reported `count` ranks' steps; returns them all.
  std::vector<proto::AgentEvent> WaitForSteps(size_t count) const {
    return RankSteps(transport_.WaitUntil([count](const std::vector<proto::AgentEvent>& events) {
      return RankSteps(events).size() >= count;
    }));
  }

  // The T0 directory the workers of the last launch were given.
  std::string T0Dir() const {
    const std::vector<FakeProcessLauncher::Launch> launches = launcher_.launches();
    if (launches.empty()) return "";
    return EnvOf(launches.back().spec)["ENDURE_T0_DIR"];
  }

  fs::path root_;
  AgentOptions options_;
  FakeClock clock_;
  FakeTransport transport_;
  FakeProcessLauncher launcher_{&clock_};
  std::function<Result<int>()> pick_port_;  // null: the agent's own picker
  // The node's kernel log; none by default. Outlives the agent (TearDown).
  std::unique_ptr<KernelLog> kernel_log_;
  // After the fakes: the agent goes first.
  std::unique_ptr<Agent> agent_;
  std::thread run_;
  std::future<Status> result_;
};

TEST_F(AgentShellTest, RegistersWithItsNodeSlotsAndReplicaAddress) {
  StartAgent();
  std::optional<proto::AgentEvent> hello = transport_.WaitForEvent(Is(Case::kRegister));
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(hello->token(), kToken);
  EXPECT_EQ(hello->generation(), -1);
  EXPECT_DOUBLE_EQ(hello->time_s(), clock_.WallSeconds());
  const proto::Register& reg = hello->register_();
  EXPECT_EQ(reg.node_id(), "node0");
  EXPECT_EQ(reg.slots(), 2);
  EXPECT_EQ(reg.host(), "127.0.0.1");
  EXPECT_EQ(reg.pid(), ::getpid());
  EXPECT_TRUE(std::regex_match(reg.replica_address(), std::regex(R"(127\.0\.0\.1:[1-9][0-9]*)")))
      << reg.replica_address();
  EXPECT_FALSE(reg.resuming());
  // Registration is the first word the controller hears.
  EXPECT_EQ(Events().front().event_case(), Case::kRegister);
  transport_.Push(ShutdownCommand());
  EXPECT_TRUE(AwaitRun().ok());
}

TEST_F(AgentShellTest, StartGivesEachLocalRankItsEnvironmentAndAFreshCredential) {
  // An agent variable that holds the job token must not reach a worker.
  ASSERT_EQ(::setenv("ENDURE_SHELL_TEST_SECRET", (std::string("x") + kToken + "y").c_str(), 1), 0);
  StartAgent();
  proto::AgentCommand start = StartCommand(3, {2, 3}, 4);
  proto::StartGeneration* s = start.mutable_start();
  s->set_restore_step(12);
  s->add_skip_steps(5);
  s->add_skip_steps(7);
  s->mutable_ranks(0)->set_faults_json(R"([{"id":"f1","kind":"kill","rank":2,"step":9}])");
  (*s->mutable_env())["EXTRA"] = "x";
  s->mutable_checkpoint()->set_enabled(true);
  s->mutable_checkpoint()->set_slot_bytes(4096);
  s->mutable_checkpoint()->set_restore_plan_json(R"({"step":12,"shards":[]})");
  Do(start);
  ::unsetenv("ENDURE_SHELL_TEST_SECRET");

  const std::vector<FakeProcessLauncher::Launch> launches = launcher_.launches();
  ASSERT_EQ(launches.size(), 2u);
  const std::string logs = (root_ / "work" / "logs").string();
  std::string credential;
  for (size_t i = 0; i < launches.size(); ++i) {
    const WorkerSpec& spec = launches[i].spec;
    const int rank = static_cast<int>(i) + 2;
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(spec.rank, rank);
    EXPECT_EQ(spec.argv, (std::vector<std::string>{"/opt/endure/train", "--lr=0.1"}));
    EXPECT_EQ(spec.log_path, logs + "/gen3-rank" + std::to_string(rank) + ".log");
    EXPECT_EQ(spec.stacks_path, logs + "/gen3-rank" + std::to_string(rank) + ".stacks");
    EXPECT_TRUE(launches[i].standby_tag.empty());
    std::map<std::string, std::string> env = EnvOf(spec);
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(i));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "2");
    EXPECT_EQ(env["GROUP_RANK"], "1");
    // The rest of torchrun's: what a script run under it may read.
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(env["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(env["ROLE_WORLD_SIZE"], "4");
    EXPECT_EQ(env["ROLE_NAME"], "default");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "3");
    EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "False");
    EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], "29500");
    EXPECT_EQ(env["ENDURE_GENERATION"], "3");
    EXPECT_EQ(env["ENDURE_NODE_ID"], "node0");
    EXPECT_EQ(env["ENDURE_RESTORE_STEP"], "12");
    EXPECT_EQ(env["ENDURE_SKIP_STEPS"], "5,7");
    EXPECT_EQ(env["ENDURE_FAULTS"], s->ranks(static_cast<int>(i)).faults_json());
    EXPECT_EQ(env["ENDURE_STACKS_FILE"], spec.stacks_path);
    EXPECT_EQ(env["EXTRA"], "x");
    EXPECT_EQ(env["ENDURE_T0_SLOT_BYTES"], "4096");
    struct stat st {};
    EXPECT_EQ(::stat(env["ENDURE_AGENT_SOCKET"].c_str(), &st), 0);
    EXPECT_TRUE(S_ISSOCK(st.st_mode)) << env["ENDURE_AGENT_SOCKET"];
    EXPECT_TRUE(fs::is_directory(env["ENDURE_T0_DIR"])) << env["ENDURE_T0_DIR"];
    EXPECT_EQ(env["ENDURE_T0_DIR"].rfind((root_ / "shm").string(), 0), 0u);
    // The restore plan travels as a file.
    Result<std::string> plan = Env::Default()->ReadFile(env["ENDURE_RESTORE_PLAN_FILE"]);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(*plan, s->checkpoint().restore_plan_json());
    // The worker's credential is this generation's, never the job token.
    EXPECT_TRUE(std::regex_match(env["ENDURE_TOKEN"], std::regex("[0-9a-f]{32}")));
    if (i == 0) credential = env["ENDURE_TOKEN"];
    EXPECT_EQ(env["ENDURE_TOKEN"], credential);
    for (const auto& [k, v] : spec.env) {
      EXPECT_EQ(v.find(kToken), std::string::npos) << k << " holds the job token";
    }
    EXPECT_NE(std::find(spec.unset_env.begin(), spec.unset_env.end(), "ENDURE_TOKEN"),
              spec.unset_env.end());
    EXPECT_NE(std::find(spec.unset_env.begin(), spec.unset_env.end(), "ENDURE_SHELL_TEST_SECRET"),
              spec.unset_env.end());
  }
  const std::vector<proto::AgentEvent> started = transport_.EventsWhere(Is(Case::kWorkerStarted));
  ASSERT_EQ(started.size(), 2u);
  EXPECT_EQ(started[0].worker_started().rank(), 2);
  EXPECT_EQ(started[1].worker_started().rank(), 3);
  EXPECT_NE(started[0].worker_started().pid(), started[1].worker_started().pid());
  EXPECT_EQ(started[0].generation(), 3);

  // The next generation gets a credential of its own, and no plan file
  // when it has no plan.
  Do(StartCommand(4, {2, 3}, 4));
  const std::vector<FakeProcessLauncher::Launch> next = launcher_.launches();
  ASSERT_EQ(next.size(), 4u);
  std::map<std::string, std::string> env = EnvOf(next[2].spec);
  EXPECT_EQ(env["ENDURE_GENERATION"], "4");
  EXPECT_TRUE(std::regex_match(env["ENDURE_TOKEN"], std::regex("[0-9a-f]{32}")));
  EXPECT_NE(env["ENDURE_TOKEN"], credential);
  EXPECT_EQ(env.count("ENDURE_RESTORE_PLAN_FILE"), 0u);
  EXPECT_EQ(env.count("ENDURE_T0_DIR"), 0u);  // checkpoints off
}

TEST_F(AgentShellTest, AWorkerThatCannotStartIsReportedAsAnExitWithCode127) {
  launcher_.FailStarts(IOError("cannot exec /opt/endure/train: no such file"));
  StartAgent();
  Do(StartCommand(1, {0}, 1));
  std::optional<proto::AgentEvent> exit = transport_.WaitForEvent(Is(Case::kWorkerExited));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->generation(), 1);
  EXPECT_EQ(exit->worker_exited().rank(), 0);
  EXPECT_TRUE(exit->worker_exited().exited());
  EXPECT_EQ(exit->worker_exited().exit_code(), 127);
  EXPECT_TRUE(transport_.EventsWhere(Is(Case::kWorkerStarted)).empty());
}

// The worker saw a CUDA error; the kernel log of its generation says why: the
// Xid behind the cascade decides, and the excerpt holds both.
TEST_F(AgentShellTest, TheKernelLogsHardwareRecordsOfTheGenerationJoinTheLastWords) {
  const std::string kmsg = (root_ / "kmsg").string();
  auto append = [&](const std::string& line) { std::ofstream(kmsg, std::ios::app) << line; };
  append("3,7,100,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=5, Graphics Exception: old news\n");
  Result<std::unique_ptr<KernelLog>> log = KernelLog::Open(kmsg);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  kernel_log_ = std::move(log).value();
  StartAgent();
  append("3,8,200,-;NVRM: Xid (PCI:0000:3b:00): 63, pid=5, before this generation\n");
  Do(StartCommand(1, {0}, 1));
  append(
      "6,9,300,-;enb2: port 3 entered forwarding state\n"
      "3,10,400,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.\n");
  ASSERT_TRUE(launcher_.Exit(0, ExitStatus{false, 0, SIGABRT},
                             "step 12\nRuntimeError: CUDA error: unspecified launch failure\n"));
  std::vector<proto::AgentEvent> words = transport_.WaitForEvents(Is(Case::kLogMatch), 1);
  ASSERT_EQ(words.size(), 1u);
  const proto::LogMatch& m = words[0].log_match();
  EXPECT_EQ(m.cause(), "xid_79");
  EXPECT_EQ(m.action(), proto::LOG_ACTION_EVICT_NODE);
  EXPECT_NE(m.excerpt().find("RuntimeError: CUDA error: unspecified launch failure\n"
                             "kernel: NVRM: Xid (PCI:0000:3b:00): 79"),
            std::string::npos)
      << m.excerpt();
  EXPECT_EQ(m.excerpt().find("old news"), std::string::npos) << m.excerpt();
  EXPECT_EQ(m.excerpt().find("before this generation"), std::string::npos) << m.excerpt();
  EXPECT_EQ(m.excerpt().find("forwarding state"), std::string::npos) << m.excerpt();
}

TEST_F(AgentShellTest, AFailedWorkersLastWordsAreClassified) {
  StartAgent();
  Do(StartCommand(1, {0, 1}, 2));
  ASSERT_TRUE(launcher_.Exit(1, ExitStatus{true, 1, 0},
                             "saving step 40\nOSError: [Errno 28] No space left on device\n"
                             "param_fingerprint=0123456789abcdef\n"));
  ASSERT_TRUE(launcher_.Exit(
      0, ExitStatus{false, 0, SIGABRT},
      "step 41\nRuntimeError: CUDA error: an illegal memory access was encountered\n"));

  ASSERT_EQ(transport_.WaitForEvents(Is(Case::kWorkerExited), 2).size(), 2u);
  const std::vector<proto::AgentEvent> events = Events();
  std::vector<proto::AgentEvent> after_start;
  for (const proto::AgentEvent& e : events) {
    if (e.has_log_match() || e.has_worker_exited()) after_start.push_back(e);
  }
  ASSERT_EQ(after_start.size(), 4u);
  // The cause goes up before the exit it explains.
  const proto::LogMatch& disk = after_start[0].log_match();
  EXPECT_EQ(after_start[0].generation(), 1);
  EXPECT_EQ(disk.rank(), 1);
  EXPECT_EQ(disk.cause(), "disk_full");
  EXPECT_EQ(disk.rule(), "disk_full");
  EXPECT_EQ(disk.action(), proto::LOG_ACTION_STOP_IF_REPEATED);
  EXPECT_EQ(disk.line(), "OSError: [Errno 28] No space left on device");
  const proto::WorkerExited& x1 = after_start[1].worker_exited();
  EXPECT_EQ(x1.rank(), 1);
  EXPECT_TRUE(x1.exited());
  EXPECT_EQ(x1.exit_code(), 1);
  EXPECT_EQ(x1.param_fingerprint(), "0123456789abcdef");

  const proto::LogMatch& cuda = after_start[2].log_match();
  EXPECT_EQ(cuda.rank(), 0);
  EXPECT_EQ(cuda.cause(), "cuda_error");
  EXPECT_EQ(cuda.rule(), "cuda_illegal_memory_access");
  const proto::WorkerExited& x0 = after_start[3].worker_exited();
  EXPECT_EQ(x0.rank(), 0);
  EXPECT_FALSE(x0.exited());
  EXPECT_EQ(x0.signal(), SIGABRT);
  EXPECT_EQ(x0.param_fingerprint(), "");
  EXPECT_EQ(after_start[3].generation(), 1);
}

TEST_F(AgentShellTest, ACleanExitIsASuccessMadeDurableBeforeItIsReported) {
  StartAgent();
  proto::AgentCommand start = StartCommand(1, {0}, 1);
  start.mutable_start()->mutable_checkpoint()->set_enabled(true);
  start.mutable_start()->mutable_checkpoint()->set_dir((root_ / "durable").string());
  Do(start);
  const std::string payload = "final parameters";
  WriteSnapshot(T0Dir(), 0, 1, 9, 1, payload);
  // Its last words would match a rule, but a success is not classified.
  ASSERT_TRUE(launcher_.Exit(0, ExitStatus{true, 0, 0}, "retrying: No space left on device\ndone"));

  ASSERT_TRUE(transport_.WaitForEvent(Is(Case::kWorkerExited)));
  std::vector<proto::AgentEvent> events;
  for (const proto::AgentEvent& e : Events()) {
    if (e.has_persisted() || e.has_worker_exited() || e.has_log_match()) events.push_back(e);
  }
  ASSERT_EQ(events.size(), 2u);
  ASSERT_TRUE(events[0].has_persisted());
  EXPECT_EQ(events[0].persisted().step(), 9);
  EXPECT_EQ(events[0].persisted().shard(), 0);
  EXPECT_EQ(events[0].persisted().error(), "");
  EXPECT_EQ(events[0].persisted().xxh3(), HexU64(Xxh3(payload)));
  ASSERT_TRUE(events[1].has_worker_exited());
  EXPECT_TRUE(events[1].worker_exited().exited());
  EXPECT_EQ(events[1].worker_exited().exit_code(), 0);
}

TEST_F(AgentShellTest, StopUsesTheControllersGraceAndReportsStopped) {
  StartAgent();
  Do(StartCommand(2, {0, 1}, 2));
  Do(StopCommand(2, 3.5));
  EXPECT_EQ(launcher_.stops(), (std::vector<std::chrono::milliseconds>{3500ms}));

  const std::vector<proto::AgentEvent> events = Events();
  ASSERT_GE(events.size(), 3u);
  // The workers' exits, then the stop that caused them.
  const proto::AgentEvent& stopped = events.back();
  ASSERT_TRUE(stopped.has_stopped());
  EXPECT_EQ(stopped.generation(), 2);
  EXPECT_EQ(stopped.stopped().workers(), 2);
  EXPECT_DOUBLE_EQ(stopped.stopped().teardown_s(), 3.5);  // the fake stop took its grace
  EXPECT_EQ(stopped.stopped().inventory_size(), 0);
  // Each exit comes after its last words (the output's tail, for the
  // incident knowledge base).
  int exits = 0;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    if (!events[i].has_worker_exited()) continue;
    ++exits;
    EXPECT_EQ(events[i].generation(), 2);
    EXPECT_EQ(events[i].worker_exited().signal(), SIGTERM);
    ASSERT_GE(i, 1u);
    EXPECT_TRUE(events[i - 1].has_log_match());
    EXPECT_EQ(events[i - 1].log_match().rank(), events[i].worker_exited().rank());
  }
  EXPECT_EQ(exits, 2);
}

TEST_F(AgentShellTest, StopBoundsTheGrace) {
  StartAgent();
  Do(StopCommand(1, 1e9));
  Do(StopCommand(1, -5));
  Do(StopCommand(1, std::nan("")));
  // No workers yet: nothing to stop, and each stop is still reported.
  EXPECT_TRUE(launcher_.stops().empty());
  EXPECT_EQ(transport_.EventsWhere(Is(Case::kStopped)).size(), 3u);
  Do(StartCommand(1, {0}, 1));
  Do(StopCommand(1, 1e9));
  Do(StopCommand(1, std::nan("")));
  Do(StopCommand(1, -5));
  EXPECT_EQ(launcher_.stops(), (std::vector<std::chrono::milliseconds>{3600s, 0ms, 0ms}));
}

TEST_F(AgentShellTest, ANewGenerationEndsTheOldWorkersAtOnceUnderTheirOwnGeneration) {
  StartAgent();
  Do(StartCommand(1, {0, 1}, 2));
  Do(StartCommand(2, {0, 1}, 2));
  EXPECT_EQ(launcher_.stops(), (std::vector<std::chrono::milliseconds>{0ms}));
  EXPECT_EQ(launcher_.groups(), 2);

  const std::vector<proto::AgentEvent> events = Events();
  std::vector<proto::AgentEvent> exits = transport_.EventsWhere(Is(Case::kWorkerExited));
  ASSERT_EQ(exits.size(), 2u);
  for (const proto::AgentEvent& e : exits) {
    EXPECT_EQ(e.generation(), 1);  // never reported as the new generation's
    EXPECT_EQ(e.worker_exited().signal(), SIGKILL);
  }
  std::vector<proto::AgentEvent> started = transport_.EventsWhere(Is(Case::kWorkerStarted));
  ASSERT_EQ(started.size(), 4u);
  EXPECT_EQ(started[2].generation(), 2);
  EXPECT_EQ(started[3].generation(), 2);
  // The old generation's exits come before the new one starts.
  size_t last_exit = 0, first_gen2_start = events.size();
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].has_worker_exited()) last_exit = i;
    if (events[i].has_worker_started() && events[i].generation() == 2) {
      first_gen2_start = std::min(first_gen2_start, i);
    }
  }
  EXPECT_LT(last_exit, first_gen2_start);

  ASSERT_TRUE(launcher_.Exit(1, ExitStatus{true, 3, 0}));
  std::optional<proto::AgentEvent> exit = transport_.WaitForEvent(
      [](const auto& e) { return e.has_worker_exited() && e.worker_exited().exit_code() == 3; });
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->generation(), 2);
}

// An in-process restart (StartGeneration.rejoin): the live worker of rank 0
// is kept and offered generation 2 in its rejoin file; dead rank 1 starts
// anew with ENDURE_PEER_RESTORE=1; nothing is stopped, and the kept
// worker's exit from then on is generation 2's.
TEST_F(AgentShellTest, AnInProcessRestartKeepsTheLiveWorkerAndStartsOnlyTheDeadOne) {
  StartAgent();
  proto::AgentCommand first = StartCommand(1, {0, 1}, 2);
  first.mutable_start()->set_in_process(true);
  Do(first);
  ASSERT_TRUE(launcher_.Exit(1, ExitStatus{false, 0, SIGKILL}));
  ASSERT_TRUE(transport_.WaitForEvent([](const auto& e) { return e.has_worker_exited(); }));
  proto::AgentCommand second = StartCommand(2, {0, 1}, 2);
  second.mutable_start()->set_in_process(true);
  second.mutable_start()->set_rejoin(true);
  second.mutable_start()->set_master_port(29501);
  Do(second);

  EXPECT_TRUE(launcher_.stops().empty());
  EXPECT_EQ(launcher_.groups(), 1);
  const std::vector<FakeProcessLauncher::Launch> launches = launcher_.launches();
  ASSERT_EQ(launches.size(), 3u);
  std::map<std::string, std::string> fresh = EnvOf(launches[2].spec);
  EXPECT_EQ(launches[2].spec.rank, 1);
  EXPECT_EQ(fresh["ENDURE_PEER_RESTORE"], "1");
  EXPECT_EQ(fresh["ENDURE_GENERATION"], "2");
  EXPECT_EQ(fresh.count("ENDURE_RESTORE_PLAN_FILE"), 0u);
  // Rank 0's offer: its environment for generation 2, with the new port and
  // credential, and no peer restore (it holds the state).
  std::map<std::string, std::string> first_env = EnvOf(launches[0].spec);
  ASSERT_EQ(first_env.count("ENDURE_REJOIN_FILE"), 1u);
  const std::string offer = ReadAll(first_env["ENDURE_REJOIN_FILE"]);
  EXPECT_NE(offer.find("ENDURE_GENERATION=2\n"), std::string::npos) << offer;
  EXPECT_NE(offer.find("MASTER_PORT=29501\n"), std::string::npos) << offer;
  EXPECT_NE(offer.find("ENDURE_TOKEN=" + fresh["ENDURE_TOKEN"] + "\n"), std::string::npos);
  EXPECT_EQ(offer.find("ENDURE_PEER_RESTORE"), std::string::npos) << offer;
  // Both ranks are reported started in generation 2 (rank 0 with its pid).
  std::vector<proto::AgentEvent> started = transport_.EventsWhere(Is(Case::kWorkerStarted));
  ASSERT_EQ(started.size(), 4u);
  EXPECT_EQ(started[2].generation(), 2);
  EXPECT_EQ(started[2].worker_started().pid(), started[0].worker_started().pid());

  ASSERT_TRUE(launcher_.Exit(0, ExitStatus{true, 3, 0}));
  std::optional<proto::AgentEvent> exit = transport_.WaitForEvent(
      [](const auto& e) { return e.has_worker_exited() && e.worker_exited().exit_code() == 3; });
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->generation(), 2);
}

// A rejoin with a restore plan: the kept worker's offer and the fresh
// worker's environment both name it (a sharded program's ranks each restore
// their part from the tiers), and the fresh one still may take the state
// from a peer.
TEST_F(AgentShellTest, ARejoinsPlanGoesToTheKeptAndTheFreshWorkers) {
  StartAgent();
  proto::AgentCommand first = StartCommand(1, {0, 1}, 2);
  first.mutable_start()->set_in_process(true);
  Do(first);
  ASSERT_TRUE(launcher_.Exit(1, ExitStatus{false, 0, SIGKILL}));
  ASSERT_TRUE(transport_.WaitForEvent([](const auto& e) { return e.has_worker_exited(); }));
  proto::AgentCommand second = StartCommand(2, {0, 1}, 2);
  second.mutable_start()->set_in_process(true);
  second.mutable_start()->set_rejoin(true);
  second.mutable_start()->mutable_checkpoint()->set_restore_plan_json(R"({"step":7,"sources":[]})");
  Do(second);

  const std::vector<FakeProcessLauncher::Launch> launches = launcher_.launches();
  ASSERT_EQ(launches.size(), 3u);
  std::map<std::string, std::string> fresh = EnvOf(launches[2].spec);
  EXPECT_EQ(fresh["ENDURE_PEER_RESTORE"], "1");
  ASSERT_EQ(fresh.count("ENDURE_RESTORE_PLAN_FILE"), 1u);
  Result<std::string> plan = Env::Default()->ReadFile(fresh["ENDURE_RESTORE_PLAN_FILE"]);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_NE(plan->find("\"step\":7"), std::string::npos) << *plan;
  const std::string offer = ReadAll(EnvOf(launches[0].spec)["ENDURE_REJOIN_FILE"]);
  EXPECT_NE(offer.find("ENDURE_RESTORE_PLAN_FILE=" + fresh["ENDURE_RESTORE_PLAN_FILE"] + "\n"),
            std::string::npos)
      << offer;
  EXPECT_EQ(offer.find("ENDURE_PEER_RESTORE"), std::string::npos) << offer;
}

// An elastic shrink: the node ran rank 1 of 2; the other node is lost and
// the job goes on with this node alone, where the live worker is rank 0 of
// 1. It keeps its process (nothing starts), is offered its new rank and
// world where it looks for offers (its old rank's file), and its exit is
// reported under its new rank, with none of its earlier generation's words.
TEST_F(AgentShellTest, ARejoinThatMovesTheNodesRanksKeepsTheLiveWorkerUnderItsNewRank) {
  StartAgent();
  proto::AgentCommand first = StartCommand(1, {1}, 2);
  first.mutable_start()->set_in_process(true);
  Do(first);
  proto::AgentCommand second = StartCommand(2, {0}, 1);
  second.mutable_start()->set_in_process(true);
  second.mutable_start()->set_rejoin(true);
  Do(second);

  const std::vector<FakeProcessLauncher::Launch> launches = launcher_.launches();
  ASSERT_EQ(launches.size(), 1u);  // nothing started
  std::map<std::string, std::string> env = EnvOf(launches[0].spec);
  const std::string offer = ReadAll(env["ENDURE_REJOIN_FILE"]);
  EXPECT_NE(offer.find("ENDURE_GENERATION=2\n"), std::string::npos) << offer;
  EXPECT_NE(offer.find("RANK=0\n"), std::string::npos) << offer;
  EXPECT_NE(offer.find("WORLD_SIZE=1\n"), std::string::npos) << offer;
  const std::string next_file =
      env["ENDURE_REJOIN_FILE"].substr(0, env["ENDURE_REJOIN_FILE"].rfind("rank1.rejoin")) +
      "rank0.rejoin";
  EXPECT_NE(offer.find("ENDURE_REJOIN_FILE=" + next_file + "\n"), std::string::npos) << offer;
  EXPECT_EQ(offer.find("ENDURE_PEER_RESTORE"), std::string::npos) << offer;

  ASSERT_TRUE(launcher_.Exit(0, ExitStatus{true, 3, 0}));
  std::optional<proto::AgentEvent> exit = transport_.WaitForEvent(
      [](const auto& e) { return e.has_worker_exited() && e.worker_exited().exit_code() == 3; });
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->generation(), 2);
  EXPECT_EQ(exit->worker_exited().rank(), 0);
}

// A stop (or start) naming an older generation than the node runs is stale:
// it used to stop the current workers while its "stopped" event carried the
// older number, which the controller drops, so generation 2 died unheard of.
TEST_F(AgentShellTest, CommandsNamingAnOlderGenerationAreDropped) {
  StartAgent();
  Do(StartCommand(1, {0}, 1));
  Do(StartCommand(2, {0}, 1));
  Do(StopCommand(1, 1.0));
  Do(StartCommand(1, {0}, 1));
  Do(StartCommand(2, {0}, 1));
  // Only generation 2's start stopped generation 1's workers.
  EXPECT_EQ(launcher_.stops(), (std::vector<std::chrono::milliseconds>{0ms}));
  EXPECT_EQ(launcher_.launches().size(), 2u);
  EXPECT_TRUE(transport_.EventsWhere(Is(Case::kStopped)).empty());
  // The current generation's stop is carried out and answered.
  Do(StopCommand(2, 1.0));
  EXPECT_EQ(launcher_.stops(), (std::vector<std::chrono::milliseconds>{0ms, 1000ms}));
  const std::vector<proto::AgentEvent> stopped = transport_.EventsWhere(Is(Case::kStopped));
  ASSERT_EQ(stopped.size(), 1u);
  EXPECT_EQ(stopped[0].generation(), 2);
  EXPECT_EQ(stopped[0].stopped().workers(), 1);
}

TEST_F(AgentShellTest, ACommandWithoutTheJobTokenIsIgnored) {
  StartAgent();
  proto::AgentCommand forged = StartCommand(1, {0}, 1);
  forged.set_token("not-the-job-token");
  Do(forged);
  proto::AgentCommand forged_shutdown = ShutdownCommand();
  forged_shutdown.set_token("");
  Do(forged_shutdown);
  EXPECT_TRUE(launcher_.launches().empty());
  EXPECT_EQ(launcher_.groups(), 0);
  Do(StartCommand(1, {0}, 1));
  EXPECT_EQ(launcher_.launches().size(), 1u);
  transport_.Push(ShutdownCommand());
  EXPECT_TRUE(AwaitRun().ok());
}

TEST_F(AgentShellTest, AShutdownEndsRunWithOkAndStopsTheWorkersWithAGrace) {
  StartAgent();
  Do(StartCommand(1, {0, 1}, 2));
  transport_.Push(ShutdownCommand());
  const Status st = AwaitRun();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(launcher_.stops(), (std::vector<std::chrono::milliseconds>{2000ms}));
  EXPECT_EQ(transport_.EventsWhere(Is(Case::kWorkerExited)).size(), 2u);
  EXPECT_TRUE(transport_.writes_closed());
  EXPECT_TRUE(transport_.finished());
  // The node's shared memory went with it.
  EXPECT_TRUE(fs::is_empty(root_ / "shm"));
}

// The controller went away (killed, restarted, a network cut): the workers
// train on while the agent reconnects, and the controller hears, in order,
// what it missed.
// Staleness is judged per stream: a controller that came back without its
// state numbers generations from 0 again, and its Start must be carried out
// (dropping it as older than generation 3 left the node idle for good).
TEST_F(AgentShellTest, OnANewStreamAStartOfAnyGenerationIsCarriedOut) {
  StartAgent();
  Do(StartCommand(3, {0}, 1));
  transport_.Break();
  ASSERT_TRUE(AdvanceUntil([&] { return transport_.attaches() >= 2; }, 500ms));
  ASSERT_EQ(transport_.WaitForEvents(Is(Case::kRegister), 2).size(), 2u);
  Do(StopCommand(0, 1.0));
  Do(StartCommand(0, {0}, 1));
  ASSERT_EQ(launcher_.launches().size(), 2u);
  EXPECT_EQ(EnvOf(launcher_.launches().back().spec)["ENDURE_GENERATION"], "0");
  // Within the new stream the rule holds again.
  Do(StopCommand(-1, 1.0));
  EXPECT_TRUE(transport_
                  .EventsWhere([](const proto::AgentEvent& e) {
                    return e.has_stopped() && e.generation() == -1;
                  })
                  .empty());
}

TEST_F(AgentShellTest, ABreakWithinTheGraceKeepsTheWorkersAndResumesWithWhatHappenedMeanwhile) {
  StartAgent();
  proto::AgentCommand start = StartCommand(3, {0, 1}, 2);
  start.mutable_start()->set_progress_pattern(R"(step (?P<step>\d+))");
  Do(start);
  // Rank 0's output stands for both ranks (core/progress_pattern.h).
  ASSERT_TRUE(launcher_.Print(0, "step 4"));
  ASSERT_EQ(WaitForSteps(2).size(), 2u);  // before the break
  transport_.FailAttach(Unavailable("connection refused"));
  transport_.Break();
  // Meanwhile: the ranks step on, and rank 1's worker fails.
  ASSERT_TRUE(launcher_.Print(0, "step 5"));
  ASSERT_TRUE(launcher_.Exit(1, ExitStatus{true, 1, 0}));
  ASSERT_TRUE(launcher_.Print(0, "step 6"));
  transport_.FailAttach(Status::Ok());  // the controller is back
  ASSERT_TRUE(AdvanceUntil([&] { return transport_.attaches() >= 2; }, 500ms));

  std::vector<proto::AgentEvent> hellos = transport_.WaitForEvents(Is(Case::kRegister), 2);
  ASSERT_EQ(hellos.size(), 2u);
  const proto::Register& resume = hellos[1].register_();
  EXPECT_TRUE(resume.resuming());
  EXPECT_EQ(resume.node_id(), "node0");
  EXPECT_EQ(resume.generation(), 3);
  EXPECT_EQ(hellos[1].generation(), 3);
  EXPECT_FALSE(resume.workers_alive());
  ASSERT_EQ(resume.ranks_size(), 2);
  EXPECT_EQ(resume.ranks(0).rank(), 0);
  EXPECT_EQ(resume.ranks(0).last_step(), 6);
  EXPECT_TRUE(resume.ranks(0).alive());
  EXPECT_EQ(resume.ranks(1).rank(), 1);
  EXPECT_EQ(resume.ranks(1).last_step(), 6);
  EXPECT_FALSE(resume.ranks(1).alive());
  EXPECT_EQ(resume.events_dropped(), 0);

  // After the hello, the outage's events in the order they happened.
  ASSERT_EQ(WaitForSteps(6).size(), 6u);
  const std::vector<proto::AgentEvent> events = Events();
  size_t at = 0;
  int registers = 0;
  for (; at < events.size(); ++at) {
    if (events[at].has_register_() && ++registers == 2) break;
  }
  ASSERT_LT(at, events.size());
  std::vector<std::string> after;
  for (size_t i = at + 1; i < events.size(); ++i) {
    const proto::AgentEvent& e = events[i];
    EXPECT_EQ(e.generation(), 3);
    if (e.has_node_steps()) {
      for (const proto::StepProgress& s : e.node_steps().ranks()) {
        after.push_back("step " + std::to_string(s.rank()) + ":" + std::to_string(s.step()));
      }
    } else if (e.has_worker_exited()) {
      after.push_back("exit " + std::to_string(e.worker_exited().rank()));
    } else if (e.has_log_match()) {
      after.push_back("words " + std::to_string(e.log_match().rank()));
    } else {
      after.push_back("other");
    }
  }
  // Then rank 1's last words once more: the controller may be a new one
  // that never heard them (the first copy may have died in flight).
  EXPECT_EQ(after, (std::vector<std::string>{"step 0:5", "step 1:5", "words 1", "exit 1",
                                             "step 0:6", "step 1:6", "words 1", "exit 1"}));
  // The workers never stopped, and the node goes on with the controller.
  EXPECT_TRUE(launcher_.stops().empty());
  EXPECT_EQ(launcher_.kill_alls(), 0);
  ASSERT_TRUE(launcher_.Print(0, "step 7"));
  ASSERT_EQ(WaitForSteps(8).size(), 8u);
  EXPECT_EQ(RankSteps(transport_.events()).back().step().step(), 7);
  Do(StopCommand(3, 1.5));
  EXPECT_EQ(launcher_.stops(), (std::vector<std::chrono::milliseconds>{1500ms}));
  transport_.Push(ShutdownCommand());
  EXPECT_TRUE(AwaitRun().ok());
}

TEST_F(AgentShellTest, NoControllerWithinTheGraceStopsTheWorkersWithTheGraceAndEndsRun) {
  options_.controller_grace = 30s;
  StartAgent();
  proto::AgentCommand start = StartCommand(1, {0, 1}, 2);
  start.mutable_start()->mutable_checkpoint()->set_enabled(true);
  start.mutable_start()->mutable_checkpoint()->set_dir((root_ / "durable").string());
  Do(start);
  Do(StopCommand(1, 4.0));  // the grace from now on
  start.set_generation(2);
  Do(start);
  WriteSnapshot(T0Dir(), 0, 0, 5, 2, "rank 0 step 5");
  WriteSnapshot(T0Dir(), 1, 0, 5, 2, "rank 1 step 5");
  const size_t stops_before = launcher_.stops().size();
  transport_.FailAttach(Unavailable("connection refused"));
  transport_.Break();
  // Short of the grace, the workers run on.
  ASSERT_TRUE(AdvanceUntil([&] { return transport_.attach_attempts() >= 3; }, 500ms, 40));
  EXPECT_EQ(launcher_.stops().size(), stops_before);
  ASSERT_TRUE(AdvanceUntil([&] { return result_.wait_for(0s) == std::future_status::ready; }, 1s));
  const Status st = AwaitRun();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("no controller at controller.test:7000 for 30.0s"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("connection reset by peer"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("persisted step 5"), std::string::npos) << st.message();
  // Stopped once, with the controller's last grace, as on SIGTERM.
  ASSERT_EQ(launcher_.stops().size(), stops_before + 1);
  EXPECT_EQ(launcher_.stops().back(), 4000ms);
  EXPECT_TRUE(fs::exists(root_ / "durable"));
  EXPECT_TRUE(fs::is_empty(root_ / "shm"));
  EXPECT_EQ(transport_.attaches(), 1);
}

TEST_F(AgentShellTest, ASignalDuringAnOutageStopsTheWorkersAndEndsRunOk) {
  StartAgent();
  Do(StartCommand(1, {0}, 1));
  transport_.FailAttach(Unavailable("connection refused"));
  transport_.Break();
  ASSERT_TRUE(AdvanceUntil([&] { return transport_.attach_attempts() >= 2; }, 500ms, 40));
  agent_->ShutDownOnSignal(SIGTERM);
  const Status st = AwaitRun();
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(launcher_.stops(), (std::vector<std::chrono::milliseconds>{2000ms}));
}

TEST_F(AgentShellTest, AStreamTheControllerClosesIsRiddenOutToo) {
  StartAgent();
  ASSERT_TRUE(transport_.WaitForEvent(Is(Case::kRegister)).has_value());
  transport_.Close();
  // The first attempt goes at once.
  ASSERT_TRUE(transport_.WaitForAttaches(2));
  std::vector<proto::AgentEvent> hellos = transport_.WaitForEvents(Is(Case::kRegister), 2);
  ASSERT_EQ(hellos.size(), 2u);
  EXPECT_TRUE(hellos[1].register_().resuming());
  EXPECT_EQ(hellos[1].register_().generation(), -1);  // it ran none
  EXPECT_EQ(hellos[1].register_().ranks_size(), 0);
  transport_.Push(ShutdownCommand());
  EXPECT_TRUE(AwaitRun().ok());
}

TEST(ReconnectBackoff, StartsAtOnceThenDoublesJitteredUpToItsBound) {
  ReconnectBackoffOptions o;
  o.initial = 500ms;
  o.max = 10s;
  o.jitter = 0.25;
  ASSERT_TRUE(o.Validate().ok());
  ReconnectBackoff backoff(o, 42);
  ReconnectBackoff same(o, 42);
  EXPECT_EQ(backoff.Next(), Duration::zero());
  EXPECT_EQ(same.Next(), Duration::zero());
  Duration nominal = 500ms;
  Duration previous_nominal{0};
  for (int i = 0; i < 12; ++i) {
    const Duration d = backoff.Next();
    SCOPED_TRACE("delay " + std::to_string(i + 1) + ": " + FormatDuration(d));
    EXPECT_EQ(d, same.Next()) << "the same seed, the same delays";
    EXPECT_LE(d, nominal);
    EXPECT_GE(d, std::chrono::duration_cast<Duration>(nominal * 0.75));
    EXPECT_LE(d, o.max);
    EXPECT_GE(nominal, previous_nominal);
    previous_nominal = nominal;
    nominal = std::min<Duration>(o.max, nominal * 2);
  }
  EXPECT_EQ(previous_nominal, o.max) << "bounded after enough attempts";
  o.max = 100ms;
  EXPECT_FALSE(o.Validate().ok());
}

TEST_F(AgentShellTest, AStreamTheControllerClosesWithARefusalIsNotRiddenOut) {
  StartAgent();
  Do(StartCommand(1, {0}, 1));
  transport_.Close(InvalidArgument("wrong job token"));
  EXPECT_EQ(AwaitRun().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(transport_.attaches(), 1);
  EXPECT_EQ(launcher_.stops(), (std::vector<std::chrono::milliseconds>{0ms}));
}

TEST_F(AgentShellTest, ARefusedTokenEndsRunWithInvalidArgument) {
  StartAgent();
  transport_.Close(InvalidArgument("wrong job token"));
  const Status st = AwaitRun();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("the controller refused this agent: wrong job token"),
            std::string::npos)
      << st.message();
}

TEST_F(AgentShellTest, AnUnreachableControllerEndsRunUnavailableAndCleansUp) {
  transport_.FailAttach(Unavailable("cannot reach the controller at controller.test:7000"));
  StartAgent();
  const Status st = AwaitRun();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_EQ(st.message(), "cannot reach the controller at controller.test:7000");
  EXPECT_TRUE(transport_.events().empty());
  EXPECT_TRUE(fs::is_empty(root_ / "shm"));
  EXPECT_FALSE(fs::exists(root_ / "work" / "node0.sock"));
}

TEST_F(AgentShellTest, ASignalStopsTheWorkersWithTheLastGraceAndPersistsTheNewestCompleteStep) {
  StartAgent();
  proto::AgentCommand start = StartCommand(1, {0, 1}, 2);
  start.mutable_start()->mutable_checkpoint()->set_enabled(true);
  start.mutable_start()->mutable_checkpoint()->set_dir((root_ / "durable").string());
  Do(start);
  Do(StopCommand(1, 4.0));  // the grace from now on
  start.set_generation(2);
  Do(start);
  // Step 6 is on rank 0 only: step 5 is the newest the whole node holds.
  WriteSnapshot(T0Dir(), 0, 0, 5, 2, "rank 0 step 5");
  WriteSnapshot(T0Dir(), 0, 1, 6, 2, "rank 0 step 6");
  WriteSnapshot(T0Dir(), 1, 0, 5, 2, "rank 1 step 5");

  agent_->ShutDownOnSignal(SIGTERM);
  const Status st = AwaitRun();
  EXPECT_TRUE(st.ok()) << st.ToString();
  ASSERT_FALSE(launcher_.stops().empty());
  EXPECT_EQ(launcher_.stops().back(), 4000ms);
  EXPECT_TRUE(transport_.cancelled());
  std::vector<proto::AgentEvent> persisted = transport_.EventsWhere(Is(Case::kPersisted));
  ASSERT_EQ(persisted.size(), 2u);
  std::set<int> shards;
  for (const proto::AgentEvent& e : persisted) {
    EXPECT_EQ(e.persisted().step(), 5);
    EXPECT_EQ(e.persisted().error(), "");
    shards.insert(e.persisted().shard());
  }
  EXPECT_EQ(shards, (std::set<int>{0, 1}));
  // The workers' exits went up before the stream was cut.
  EXPECT_EQ(
      transport_
          .EventsWhere([](const auto& e) { return e.has_worker_exited() && e.generation() == 2; })
          .size(),
      2u);
}

TEST_F(AgentShellTest, ASignalBeforeAnyStopUsesTheDefaultGrace) {
  StartAgent();
  Do(StartCommand(1, {0}, 1));
  agent_->ShutDownOnSignal(SIGINT);
  EXPECT_TRUE(AwaitRun().ok());
  EXPECT_EQ(launcher_.stops(), (std::vector<std::chrono::milliseconds>{2000ms}));
  EXPECT_TRUE(transport_.EventsWhere(Is(Case::kPersisted)).empty());  // no durable directory
}

TEST_F(AgentShellTest, InjectedDiskFaultsFailPersisting) {
  for (const auto& [kind, error] : std::vector<std::pair<std::string, std::string>>{
           {"disk-full", "No space left on device"}, {"disk-error", "Input/output error"}}) {
    SCOPED_TRACE(kind);
    FakeTransport transport;
    FakeProcessLauncher launcher(&clock_);
    AgentSeams seams;
    seams.clock = &clock_;
    seams.transport = &transport;
    seams.launcher = &launcher;
    seams.shm_parent = (root_ / "shm").string();
    Agent agent(options_, Rules(), std::move(seams));
    std::future<Status> result = std::async(std::launch::async, [&] { return agent.Run(); });
    proto::AgentCommand start = StartCommand(1, {0}, 1);
    start.mutable_start()->mutable_checkpoint()->set_enabled(true);
    start.mutable_start()->mutable_checkpoint()->set_dir((root_ / ("durable-" + kind)).string());
    transport.Push(start);
    transport.Push(InjectCommand(1, kind, 0));
    ASSERT_TRUE(transport.WaitUntilIdle());
    const std::string t0 = EnvOf(launcher.launches().at(0).spec)["ENDURE_T0_DIR"];
    WriteSnapshot(t0, 0, 0, 3, 1, "the final state");
    ASSERT_TRUE(launcher.Exit(0, ExitStatus{true, 0, 0}));
    std::optional<proto::AgentEvent> p = transport.WaitForEvent(Is(Case::kPersisted));
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->persisted().step(), 3);
    EXPECT_NE(p->persisted().error().find(error), std::string::npos) << p->persisted().error();
    transport.Push(ShutdownCommand());
    ASSERT_EQ(result.wait_for(10s), std::future_status::ready);
    EXPECT_TRUE(result.get().ok());
  }
}

// A worker that reports a fault firing and dies of it at once: its report
// is in the agent's socket before its exit is seen, and goes up before the
// exit. (When it came after, the controller planned the next generation
// without knowing that the fault had fired and gave it again: the
// replacement was killed too.) Sixteen workers, each racing its exit.
TEST_F(AgentShellTest, WhatAWorkerSentBeforeItDiedGoesUpBeforeItsExit) {
  StartAgent();
  constexpr int kWorkers = 16;
  std::vector<int> ranks(kWorkers);
  for (int r = 0; r < kWorkers; ++r) ranks[r] = r;
  Do(StartCommand(1, ranks, kWorkers));
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  for (int r = 0; r < kWorkers; ++r) {
    std::map<std::string, std::string> env = EnvOf(launcher_.launches().at(r).spec);
    contract::Datagram d;
    d.token = env[worker_env::kToken];
    d.generation = 1;
    d.rank = r;
    d.message = contract::FaultMessage{"kill-" + std::to_string(r), faults::FaultKind::kKill, 5};
    const std::string bytes = contract::EncodeDatagram(d);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", env[worker_env::kAgentSocket].c_str());
    ASSERT_EQ(::sendto(fd, bytes.data(), bytes.size(), 0, reinterpret_cast<sockaddr*>(&addr),
                       sizeof addr),
              static_cast<ssize_t>(bytes.size()));
    ASSERT_TRUE(launcher_.Exit(r, ExitStatus{false, 0, SIGKILL}));
  }
  ::close(fd);
  ASSERT_EQ(transport_.WaitForEvents([](const auto& e) { return e.has_worker_exited(); }, kWorkers)
                .size(),
            static_cast<size_t>(kWorkers));
  const std::vector<proto::AgentEvent> events = transport_.EventsWhere(
      [](const auto& e) { return e.has_fault_fired() || e.has_worker_exited(); });
  std::set<int> fired;
  for (const proto::AgentEvent& e : events) {
    if (e.has_fault_fired()) fired.insert(e.fault_fired().rank());
    if (e.has_worker_exited()) {
      EXPECT_TRUE(fired.count(e.worker_exited().rank()))
          << "rank " << e.worker_exited().rank() << "'s exit went up before its fault";
    }
  }
  EXPECT_EQ(fired.size(), static_cast<size_t>(kWorkers));
}

TEST_F(AgentShellTest, InjectedHangStopsTheWorkerAndOtherWorkerFaultsKillIt) {
  StartAgent();
  Do(StartCommand(1, {0, 1}, 2));
  Do(InjectCommand(1, "hang", 1));
  Do(InjectCommand(1, "kill", 0));
  EXPECT_EQ(launcher_.signals(), (std::vector<std::pair<int, int>>{{1, SIGSTOP}, {0, SIGKILL}}));
  // The injection itself sends nothing up.
  EXPECT_TRUE(transport_.EventsWhere(Is(Case::kFaultFired)).empty());
}

TEST_F(AgentShellTest, InjectedKillAgentKillsTheWorkersAndTheNodesMemoryAtOnce) {
  StartAgent();
  proto::AgentCommand start = StartCommand(1, {0, 1}, 2);
  start.mutable_start()->mutable_checkpoint()->set_enabled(true);
  Do(start);
  const fs::path shm = fs::path(T0Dir()).parent_path();
  ASSERT_TRUE(fs::is_directory(shm));
  const size_t before = Events().size();
  Do(InjectCommand(1, "kill-agent", 0));
  EXPECT_TRUE(launcher_.agent_killed());
  EXPECT_EQ(launcher_.kill_alls(), 1);
  EXPECT_TRUE(launcher_.stops().empty());  // no grace: the node dies
  EXPECT_FALSE(fs::exists(shm));
  EXPECT_EQ(Events().size(), before);  // and says nothing
}

TEST_F(AgentShellTest, InjectedCorruptionShowsInTheNextStopsInventory) {
  StartAgent();
  proto::AgentCommand start = StartCommand(1, {0}, 1);
  start.mutable_start()->mutable_checkpoint()->set_enabled(true);
  Do(start);
  WriteSnapshot(T0Dir(), 0, 0, 4, 1, "rank 0 at step 4");
  Do(StopCommand(1, 0));
  Do(InjectCommand(1, "corrupt-t0", 0));
  Do(StopCommand(1, 0));
  const std::vector<proto::AgentEvent> stopped = transport_.EventsWhere(Is(Case::kStopped));
  ASSERT_EQ(stopped.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(stopped[i].stopped().inventory_size(), 1);
    const proto::ShardCopy& copy = stopped[i].stopped().inventory(0);
    EXPECT_EQ(copy.step(), 4);
    EXPECT_EQ(copy.shard(), 0);
    EXPECT_EQ(copy.tier(), proto::TIER_T0);
    EXPECT_GT(stopped[i].stopped().t0_bytes(), 0u);
    if (i == 0) {
      EXPECT_EQ(copy.refused(), "");
    } else {
      EXPECT_NE(copy.refused(), "");  // applied at the stop after the injection
    }
  }
}

TEST_F(AgentShellTest, StacksGoUpPerRankWithTheTimeTheCaptureTook) {
  StartAgent();
  Do(Command(1));  // no command at all: ignored
  proto::AgentCommand dump = Command(1);
  dump.mutable_dump_stacks()->set_timeout_s(5);
  Do(dump);  // no workers: nothing to capture
  EXPECT_TRUE(launcher_.stack_requests().empty());
  Do(StartCommand(1, {0, 1}, 2));
  launcher_.SetStacks({{0, "Thread 1 (main):\n#0 nccl_wait"}}, 250ms);
  Do(dump);
  const std::vector<proto::AgentEvent> dumps = transport_.EventsWhere(Is(Case::kStackDump));
  ASSERT_EQ(dumps.size(), 2u);
  EXPECT_EQ(dumps[0].stack_dump().rank(), 0);
  EXPECT_EQ(dumps[0].stack_dump().text(), "Thread 1 (main):\n#0 nccl_wait");
  EXPECT_EQ(dumps[1].stack_dump().rank(), 1);
  EXPECT_EQ(dumps[1].stack_dump().text(), "stacks of rank 1");
  for (const proto::AgentEvent& d : dumps) {
    EXPECT_EQ(d.generation(), 1);
    EXPECT_DOUBLE_EQ(d.stack_dump().capture_s(), 0.25);
  }
  // No rank announced a stack signal: gdb for every one.
  ASSERT_EQ(launcher_.stack_requests().size(), 1u);
  EXPECT_TRUE(launcher_.stack_requests()[0].empty());
}

TEST_F(AgentShellTest, OutputLinesBecomeProgressWithAProgressPattern) {
  StartAgent();
  Do(StartCommand(1, {0}, 1));
  EXPECT_FALSE(launcher_.Print(0, "step 1 loss 2.5"));  // no pattern: the output is not read
  proto::AgentCommand start = StartCommand(2, {0}, 1);
  start.mutable_start()->set_progress_pattern(R"(step (?P<step>\d+) loss (?P<loss>[0-9.]+))");
  Do(start);
  clock_.Advance(3s);
  ASSERT_TRUE(launcher_.Print(0, "step 1 loss 2.5"));
  ASSERT_TRUE(launcher_.Print(0, "loading data"));
  ASSERT_TRUE(launcher_.Print(0, "step 2 loss 2.25"));
  ASSERT_EQ(WaitForSteps(2).size(), 2u);
  const std::vector<proto::AgentEvent> ready = transport_.EventsWhere(Is(Case::kWorkerReady));
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].generation(), 2);
  EXPECT_EQ(ready[0].worker_ready().rank(), 0);
  EXPECT_DOUBLE_EQ(ready[0].worker_ready().init_s(), 3.0);  // since the start, on the agent's clock
  const std::vector<proto::AgentEvent> steps = RankSteps(transport_.events());
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].step().step(), 1);
  EXPECT_DOUBLE_EQ(steps[0].step().loss(), 2.5);
  EXPECT_FALSE(steps[0].step().skipped());
  EXPECT_EQ(steps[1].step().step(), 2);
  EXPECT_DOUBLE_EQ(steps[1].step().loss(), 2.25);
  EXPECT_EQ(steps[1].generation(), 2);
}

TEST_F(AgentShellTest, StandbysStartAfterTheFirstStepAndServeTheNextGeneration) {
  options_.standby = true;
  StartAgent();
  proto::AgentCommand start = StartCommand(1, {0, 1}, 2);
  start.mutable_start()->set_progress_pattern(R"(step (?P<step>\d+))");
  (*start.mutable_start()->mutable_env())["PYTHONPATH"] = "/opt/py";
  Do(start);
  EXPECT_TRUE(launcher_.standbys_started().empty());  // not while the generation starts
  ASSERT_TRUE(launcher_.Print(0, "step 1"));
  ASSERT_TRUE(WaitFor([&] { return launcher_.standbys_started().size() == 2; }));
  std::vector<FakeProcessLauncher::StandbyStart> standbys = launcher_.standbys_started();
  ASSERT_EQ(standbys.size(), 2u);
  for (const auto& s : standbys) {
    EXPECT_EQ(s.argv, (std::vector<std::string>{"/opt/endure/train", "--lr=0.1"}));
    EXPECT_NE(std::find(s.unset_env.begin(), s.unset_env.end(), "ENDURE_TOKEN"), s.unset_env.end());
    // The job's environment, which an interpreter reads as it starts; no rank's own.
    const std::pair<std::string, std::string> path{"PYTHONPATH", "/opt/py"};
    EXPECT_NE(std::find(s.env.begin(), s.env.end(), path), s.env.end());
    for (const auto& [k, v] : s.env) EXPECT_NE(k, "RANK");
  }
  ASSERT_TRUE(launcher_.Print(0, "step 2"));
  ASSERT_EQ(WaitForSteps(4).size(), 4u);
  EXPECT_EQ(launcher_.standbys_started().size(), 2u);  // once per generation

  start.set_generation(2);
  Do(start);
  std::vector<FakeProcessLauncher::Launch> launches = launcher_.launches();
  ASSERT_EQ(launches.size(), 4u);
  std::set<std::string> adopted = {launches[2].standby_tag, launches[3].standby_tag};
  EXPECT_EQ(adopted, (std::set<std::string>{"standby-0", "standby-1"}));

  // A changed program: the standbys of the old one are discarded.
  ASSERT_TRUE(launcher_.Print(0, "step 1"));
  ASSERT_TRUE(WaitFor([&] { return launcher_.standbys_started().size() == 4; }));
  start.set_generation(3);
  start.mutable_start()->set_command(0, "/opt/endure/train-v2");
  Do(start);
  const std::vector<std::string> discarded = launcher_.standbys_discarded();
  EXPECT_EQ(std::set<std::string>(discarded.begin(), discarded.end()),
            (std::set<std::string>{"standby-2", "standby-3"}));
  launches = launcher_.launches();
  ASSERT_EQ(launches.size(), 6u);
  EXPECT_EQ(launches[4].standby_tag, "");
  EXPECT_EQ(launches[5].standby_tag, "");

  // A changed environment is another program too.
  ASSERT_TRUE(launcher_.Print(0, "step 1"));
  ASSERT_TRUE(WaitFor([&] { return launcher_.standbys_started().size() == 6; }));
  start.set_generation(4);
  (*start.mutable_start()->mutable_env())["PYTHONPATH"] = "/opt/py2";
  Do(start);
  const std::vector<std::string> gone = launcher_.standbys_discarded();
  EXPECT_EQ(std::set<std::string>(gone.begin(), gone.end()),
            (std::set<std::string>{"standby-2", "standby-3", "standby-4", "standby-5"}));
  launches = launcher_.launches();
  ASSERT_EQ(launches.size(), 8u);
  EXPECT_EQ(launches[6].standby_tag, "");
}

TEST_F(AgentShellTest, AHeartbeatGoesUpEverySecondOfTheAgentsClock) {
  StartAgent();
  ASSERT_EQ(transport_.WaitForEvents(Is(Case::kHeartbeat), 1).size(), 1u);
  Do(StartCommand(7, {0}, 1));
  EXPECT_EQ(transport_.EventsWhere(Is(Case::kHeartbeat)).size(), 1u);  // the clock stood still
  clock_.Advance(1s);
  const std::vector<proto::AgentEvent> beats = transport_.WaitForEvents(Is(Case::kHeartbeat), 2);
  ASSERT_EQ(beats.size(), 2u);
  EXPECT_EQ(beats[0].generation(), -1);
  EXPECT_EQ(beats[1].generation(), 7);
  EXPECT_DOUBLE_EQ(beats[1].time_s(), clock_.WallSeconds());
}

// Multi-host: the rendezvous of a generation whose rank 0 runs here needs a
// port free on this host, which only the agent can find.
TEST_F(AgentShellTest, TheRegistrationReportsAPortFreeOnThisHost) {
  StartAgent();
  std::optional<proto::AgentEvent> hello = transport_.WaitForEvent(Is(Case::kRegister));
  ASSERT_TRUE(hello.has_value());
  const int port = hello->register_().free_port();
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
  transport_.Push(ShutdownCommand());
  EXPECT_TRUE(AwaitRun().ok());
}

TEST_F(AgentShellTest, EachStopReportsAFreshPortAndAFailedPickReportsNone) {
  int next = 45000;
  pick_port_ = [&next]() -> Result<int> {
    if (next == 45002) return IOError("no ports left");
    return next++;
  };
  StartAgent();
  std::optional<proto::AgentEvent> hello = transport_.WaitForEvent(Is(Case::kRegister));
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(hello->register_().free_port(), 45000);
  Do(StartCommand(1, {0}, 1));
  Do(StopCommand(1, 0));
  Do(StartCommand(2, {0}, 1));
  Do(StopCommand(2, 0));
  const std::vector<proto::AgentEvent> stopped = transport_.EventsWhere(Is(Case::kStopped));
  ASSERT_EQ(stopped.size(), 2u);
  EXPECT_EQ(stopped[0].stopped().free_port(), 45001);
  EXPECT_EQ(stopped[1].stopped().free_port(), 0) << "none to report";
}

// T2 under a directory the agent names: the controller sends the spec's
// [checkpoint] dir as written and durable restore sources relative to it;
// the agent resolves both on its own host, under --checkpoint-root.
TEST_F(AgentShellTest, ARelativeCheckpointDirAndDurableSourcesResolveUnderTheCheckpointRoot) {
  options_.checkpoint_root = (root_ / "host1").string();
  StartAgent();
  checkpoint::RestorePlan plan;
  plan.step = 2;
  for (int shard = 0; shard < 2; ++shard) {
    checkpoint::RestoreSource src;
    src.copy.step = 2;
    src.copy.shard = shard;
    src.copy.shards = 2;
    src.copy.tier = shard == 0 ? checkpoint::Tier::kT0 : checkpoint::Tier::kT2;
    src.copy.node = shard == 0 ? "node0" : "";
    src.copy.path =
        shard == 0 ? "/dev/shm/endure-1-node0/t0/rank-0.slot0" : "step-00000002/shard-00001.bin";
    src.loader_rank = shard;
    plan.sources.push_back(src);
  }
  proto::AgentCommand start = StartCommand(1, {0, 1}, 2);
  proto::CheckpointConfig* c = start.mutable_start()->mutable_checkpoint();
  c->set_enabled(true);
  c->set_dir("shared/t2");
  c->set_restore_plan_json(checkpoint::RestorePlanToJson(plan).dump());
  (*start.mutable_start()->mutable_env())["ENDURE_CKPT_DIR"] = "shared/t2";
  Do(start);
  const std::string t2 = (root_ / "host1" / "shared" / "t2").string();
  const std::vector<FakeProcessLauncher::Launch> launches = launcher_.launches();
  ASSERT_EQ(launches.size(), 2u);
  std::map<std::string, std::string> env = EnvOf(launches[0].spec);
  EXPECT_EQ(env["ENDURE_CKPT_DIR"], t2);
  Result<std::string> text = Env::Default()->ReadFile(env["ENDURE_RESTORE_PLAN_FILE"]);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  Result<checkpoint::RestorePlan> got = checkpoint::RestorePlanFromJson(*text);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->sources.size(), 2u);
  EXPECT_EQ(got->sources[0].copy.path, plan.sources[0].copy.path) << "memory copies as they are";
  EXPECT_EQ(got->sources[1].copy.path, t2 + "/step-00000002/shard-00001.bin");

  // An absolute directory is the same on every host.
  proto::AgentCommand next = StartCommand(2, {0, 1}, 2);
  next.mutable_start()->mutable_checkpoint()->set_dir("/mnt/shared/t2");
  (*next.mutable_start()->mutable_env())["ENDURE_CKPT_DIR"] = "/mnt/shared/t2";
  Do(next);
  EXPECT_EQ(EnvOf(launcher_.launches().back().spec)["ENDURE_CKPT_DIR"], "/mnt/shared/t2");
}

TEST_F(AgentShellTest, WithoutACheckpointRootARelativeDirIsUnderTheWorkingDirectory) {
  StartAgent();
  proto::AgentCommand start = StartCommand(1, {0}, 1);
  (*start.mutable_start()->mutable_env())["ENDURE_CKPT_DIR"] = "ckpt";
  Do(start);
  EXPECT_EQ(EnvOf(launcher_.launches().back().spec)["ENDURE_CKPT_DIR"],
            (fs::current_path() / "ckpt").string());
}

}  // namespace
}  // namespace endure::agent
