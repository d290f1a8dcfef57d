// The agent itself, with its seams: RunAgent (agent/agent.h) builds one on
// the real clock, gRPC transport and processes; tests build one on a
// FakeClock, a FakeTransport and a FakeProcessLauncher and drive it through
// the commands it reads.
//
// Controller outages: when the stream ends without a shutdown (it broke, or
// the controller closed it) and the token was not refused, the workers and
// the memory tiers carry on; Run()'s thread reconnects with backoff
// (agent/reconnect.h) and registers again saying that it resumes (its
// generation, its ranks' last steps, whether their workers still run), and
// what happened meanwhile, kept in the core's outage buffer, follows in order. Only
// past AgentOptions::controller_grace without a controller are the workers
// stopped, as on SIGTERM, and Run() returns kUnavailable.
//
// Decisions: the node's core (core/node_machine.h) decides what the agent's
// inputs mean (the datagram gate, the outage buffer, the last words, the
// standby rule, stale commands); the Agent is its shell, which feeds it and
// carries out what it decides, including every write to the stream.
//
// Threads: one loop thread (agent/node_loop.h) owns the core: it steps it
// with each input and carries out the actions, writes to the stream
// included, one input at a time in the order they came. The others hand it
// their inputs: Run()'s thread reads commands (the core says which to carry
// out) and carries them out in order; one thread receives worker datagrams
// (and makes the heartbeat); the workers' threads (WorkerGroup) report exits
// and, with a progress pattern, output lines; the tier store reports
// persisted shards; one thread waits for SIGTERM/SIGINT and shuts the node
// down. command_mu_ serialises carrying out a command with that shutdown.
//
// Workers never see the job token: each generation gets a fresh random
// credential (their ENDURE_TOKEN), and only datagrams that carry it, parsed
// and checked by contract/worker_contract.h, pass the core's gate.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/agent.h"
#include "agent/health_check.h"
#include "agent/kernel_log.h"
#include "agent/node_loop.h"
#include "agent/pair_test.h"
#include "agent/process_launcher.h"
#include "agent/reconnect.h"
#include "agent/tier_store.h"
#include "agent/transport.h"
#include "agent/worker_set.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/mutex.h"
#include "core/log_classifier.h"
#include "core/node_machine.h"
#include "proto/endure.pb.h"

namespace endure::agent {

// What the agent talks to. The pointers are not owned and must outlive the
// Agent.
struct AgentSeams {
  Clock* clock = Clock::Real();  // event times, heartbeats, measured durations
  Env* env = Env::Default();     // the work directory, logs, restore plans
  Transport* transport = nullptr;
  ProcessLauncher* launcher = nullptr;
  // Where the node's checkpoint memory goes (a tmpfs); empty: /dev/shm, or
  // the work directory where there is none. Checkpoint memory that agents
  // killed before they could clean up left here is removed at the start.
  std::string shm_parent;
  // SIGTERM/SIGINT: a descriptor that becomes readable when one arrived, and
  // where its number then is; -1 and null: the agent waits for no signal
  // (ShutDownOnSignal can still be called).
  int signal_fd = -1;
  const std::atomic<int>* signal = nullptr;
  // Mutual TLS on the replica link (this node's identity); null: plain TCP.
  std::shared_ptr<const tls::Context> tls;
  // A TCP port free on this host a moment ago, reported with the
  // registration and each stop for the rendezvous of a generation whose
  // rank 0 runs here; null: one the kernel hands out for port 0 on any
  // address. A failure reports none.
  std::function<Result<int>()> pick_port;
  // The node's kernel log; null: only the workers' output is classified.
  KernelLog* kernel_log = nullptr;
};

// One agent, run once. Thread-safe as described above.
class Agent {
 public:
  // `seams.transport` and `seams.launcher` are required.
  Agent(AgentOptions options, core::LogClassifier classifier, AgentSeams seams);

  // Registers, then carries out the controller's commands until it says shut
  // down (OK), a signal shut the node down (OK), the controller stays out of
  // reach past the controller grace (kUnavailable, saying since when and
  // why), or the controller refuses the token (kInvalidArgument). A
  // controller that cannot be reached at the start is kUnavailable at once.
  // The workers are stopped before it returns.
  Status Run();

  // Stops the workers with the last stop's grace period (the default one
  // before any), persists the node's newest complete step if there is time,
  // and ends the stream so that Run() returns OK; the shared memory goes
  // when Run() ends. Called by the signal thread; callable from any thread
  // while Run() runs, once.
  void ShutDownOnSignal(int sig);

 private:
  // Hands `input` to the core's loop, which steps the core with it after
  // what came before and carries out what it decides.
  void Post(core::NodeInput input);
  // The same, waiting until it is done; true when the core said to carry
  // out the command that arrived.
  bool Decide(const core::NodeInput& input);
  // On the loop: carries out the core's actions in order; true when one
  // said to carry out a command.
  bool CarryOut(std::vector<core::NodeAction> actions) REQUIRES(loop_);
  core::NodeTime Now() const;
  // Reports `event` to the controller as of `generation` (< 0: the current one).
  void Send(proto::AgentEvent event, int64_t generation = -1);
  // The ranks of the current generation on this node, as the core knows them.
  std::vector<int> LocalRanks();
  bool Signalled();
  // Carries out commands until the stream ends; true when it was a shutdown.
  bool CarryOutCommands();
  // This node's registration; resuming: with its generation, its ranks'
  // last steps and whether their workers still run.
  proto::AgentEvent Hello(bool resuming);
  // After the stream ended (`why`): reconnects with backoff until the
  // controller answers (nullopt: a stream is open again, the resuming hello
  // and the kept events sent), a signal arrives (OK), or the controller
  // grace passes (the workers are stopped; kUnavailable, for Run to return).
  std::optional<Status> RideOutOutage(const std::string& why);
  // Waits until `at` on the agent's clock; false when a signal came first.
  bool WaitUntil(Clock::TimePoint at);
  // Stops the workers with the last grace, persists the node's newest
  // complete step if there is time, and returns it (-1: none).
  int64_t StopWorkersAndPersist() REQUIRES(command_mu_);
  Status OpenSocket();
  void ReceiveDatagrams();
  // Hands every datagram waiting on the socket to the loop, in order,
  // without waiting. Under receive_mu_ with the Post of what it read, so
  // that a worker's exit posted after it (OnWorkerExit) comes after
  // everything the worker sent before it died (a fault it reported firing,
  // its last step).
  void PostWaitingDatagrams() REQUIRES(receive_mu_);
  // Ends the receiver's wait for a datagram (once done_ is set).
  void WakeReceiver();
  void OnWorkerExit(int64_t generation, const WorkerEnd& end);
  // A line of a worker's output (a group's thread); only with a progress pattern.
  void OnWorkerLine(int64_t generation, int rank, std::string_view line);
  // Waits for SIGTERM/SIGINT (the shutdown thread) and then shuts down.
  void AwaitSignal();
  // A spare node keeps warm standbys of the job's program (proto Prepare).
  void Prepare(const proto::Prepare& prepare) REQUIRES(command_mu_);
  // The commands, carried out one at a time under command_mu_.
  void Start(int64_t generation, const proto::StartGeneration& start) REQUIRES(command_mu_);
  void Stop(int64_t generation, double grace_s) REQUIRES(command_mu_);
  void DumpStacks(int64_t generation, double timeout_s) REQUIRES(command_mu_);
  void Inject(const proto::InjectFault& inject) REQUIRES(command_mu_);
  // Runs one pair of a pairwise test against a peer's agent and reports it.
  void RunPairTest(int64_t generation, const proto::PairTest& test) REQUIRES(command_mu_);
  // Before a registration that is no resume: the node's health check.
  void CheckHealth();
  void OnPersisted(const PersistReport& report);
  // A port free on this host (AgentSeams::pick_port); 0: none.
  int FreePort();
  // `dir` on this host: an absolute one as it is, a relative one under
  // AgentOptions::checkpoint_root (the working directory by default).
  std::string ResolveCheckpointDir(const std::string& dir) const;

  // Warm standbys: workers started ahead of the next generation so that a
  // restart skips loading the program (when to refill them is the core's
  // standby rule).
  std::optional<Standby> TakeStandby(const core::StandbyProgram& program);
  // The program of a start or a spare's Prepare: argv[0] resolved, the
  // job's environment in order, its checkpoint directory resolved here.
  core::StandbyProgram ProgramOf(const google::protobuf::RepeatedPtrField<std::string>& command,
                                 const google::protobuf::Map<std::string, std::string>& env) const;
  void DiscardStandbys();

  AgentOptions o_;
  core::LogClassifier classifier_;
  AgentSeams seams_;
  Clock* const clock_;
  Transport* const transport_;
  ProcessLauncher* const launcher_;
  // The node's core and what its actions act on, the loop's alone (the
  // loop is declared last: its thread goes first).
  std::optional<core::NodeMachine> machine_ GUARDED_BY(loop_);  // made in Run()
  std::vector<Standby> standbys_ GUARDED_BY(loop_);
  // The generation this node's workers serve (the last started): what their
  // exits and output lines are reported in.
  std::atomic<int64_t> generation_{-1};
  // Where the kernel log stood when the generation started: its later
  // hardware records are this generation's evidence.
  std::atomic<uint64_t> kernel_mark_{0};
  // Held while a command is carried out, and by the shutdown on a signal.
  Mutex command_mu_;
  bool signalled_ GUARDED_BY(command_mu_) = false;       // the shutdown on a signal ran
  bool outlived_grace_ GUARDED_BY(command_mu_) = false;  // stopped for want of a controller
  double grace_s_ GUARDED_BY(command_mu_);               // the last stop's grace
  std::unique_ptr<WorkerGroup> workers_ GUARDED_BY(command_mu_);
  // The same group, for the core's actions (ForgetLastWords) on the loop: set
  // and cleared through loop_.Call around every change of workers_, so that it
  // never outlives the group.
  WorkerGroup* loop_workers_ GUARDED_BY(loop_) = nullptr;
  // Replaces workers_ (null: none) and tells the loop.
  void SetWorkers(std::unique_ptr<WorkerGroup> group) REQUIRES(command_mu_);
  std::unique_ptr<TierStore> tiers_;  // checkpoint memory (T0, T1) and persistence
  // The pairwise test's listener; its fault (and the one this node's own
  // tests apply) follow an injected comm-fail / comm-slow of a local rank.
  std::unique_ptr<PairTestServer> pair_server_;
  PairFault pair_fault_ GUARDED_BY(loop_);
  HealthReport health_;  // the last health check (before each fresh registration)
  bool health_checked_ = false;
  // Injected memory corruption (tier, shard), applied once the workers stop.
  std::vector<std::pair<checkpoint::Tier, int>> pending_corruption_ GUARDED_BY(command_mu_);
  // The agent's variables that hold the job token (ENDURE_TOKEN among them):
  // removed from every worker's environment. Set before the first worker.
  std::vector<std::string> secret_variables_;
  int socket_fd_ = -1;
  std::string socket_path_;
  Mutex receive_mu_;  // reading the socket and posting what was read
  std::vector<char> datagram_ GUARDED_BY(receive_mu_);  // the receive buffer
  std::atomic<bool> done_{false};
  int wake_fd_ = -1;  // an eventfd that ends the shutdown thread's wait at the end of Run()
  NodeLoop loop_;     // last: its thread uses the members above
};

}  // namespace endure::agent
