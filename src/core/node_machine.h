// NodeMachine: the agent's decision core for one node, as JobMachine is the
// controller's. Sans-I/O: Step(input, now) -> actions. The agent's shell
// (agent/agent_shell.h) feeds it what its threads see (worker datagrams,
// output lines and exits, commands, the stream opening and breaking) and
// carries out the actions (writes to the stream, log lines, standby
// processes, the tier store, the pairwise test's fault); scenario files under
// tests/testdata/node_machine/ feed it scripted inputs. Deterministic and not
// thread-safe: the shell steps it under one mutex.
//
// What it decides:
//   - the datagram gate: which worker datagrams the node takes (the current
//     generation's credential, from a rank it runs), what each becomes for
//     the controller, and which refusals are worth a log line;
//   - the link: events go up while a stream is open, into the outage buffer
//     while the agent reconnects (a failed write starts an outage), nowhere
//     before the first stream and after the last; on a resume the buffer
//     goes first, then each rank's last words again;
//   - the last words: each local rank's log match and exit in this
//     generation, kept to be said again after a resume (the controller that
//     hears them may be a new one);
//   - the standby rule: standbys of the job's program are refilled once a
//     generation made its first step, never during the restart itself;
//   - stale commands: one of a generation older than the newest started on
//     this stream crossed a newer start on the wire and is dropped;
//   - the durable cadence: which snapshots are due in T2 (DurableStepDue;
//     core/snapshot_queue.h keeps the tier store from skipping one);
//   - the restore route of each rank a generation starts (RestoreRouteOf).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/clock.h"
#include "contract/worker_contract.h"
#include "core/checkpoint_book.h"
#include "core/datagram_gate.h"
#include "core/log_classifier.h"
#include "core/outage_buffer.h"
#include "core/progress_pattern.h"
#include "proto/endure.pb.h"

namespace endure::core {

// ---- Inputs ----

// A time on both clocks: the agent's (durations, rate limits) and the wall's
// (the time stamp of what goes to the controller).
struct NodeTime {
  Clock::TimePoint now;
  double wall_s = 0;
};

// A new stream is open (the first, or again after an outage): `hello` is the
// registration the shell built for it, which goes first. On a resume the
// machine says how many events the outage dropped in it, and the outage
// buffer follows in order, then the ranks' last words again.
struct StreamOpened {
  proto::AgentEvent hello;
  bool resuming = false;
};
// The stream ended (or broke under a write): events wait in the outage buffer.
struct StreamLost {};
// The last stream closed for good: events are dropped from now on.
struct StreamClosed {};
// Writes that failed, in order: the stream broke under them (an outage
// starts, and they are the first the next stream carries; a registration
// is its own stream's only and is not kept).
struct TransmitFailed {
  std::vector<proto::AgentEvent> unsent;
};
// A command the controller sent, before the shell carries it out.
struct CommandArrived {
  const proto::AgentCommand* command = nullptr;
};
// The program a node's standby workers run: its argv (argv[0] resolved) and
// the job's environment (`[job] env`: what every rank of every generation
// gets, such as PYTHONPATH, which an interpreter reads as it starts). A
// standby's rank and generation come later, in its assignment.
struct StandbyProgram {
  std::vector<std::string> argv;
  std::vector<std::pair<std::string, std::string>> env;
  friend bool operator==(const StandbyProgram&, const StandbyProgram&) = default;
};

// A generation starts on this node (the shell carried out the start's first
// half: the credential, the workers it keeps).
struct GenerationStarted {
  int64_t generation = 0;
  std::string credential;        // its workers' ENDURE_TOKEN ("" when none could be made)
  std::set<int> ranks;           // its ranks on this node
  bool rejoin = false;           // live workers were kept (an in-process restart)
  std::string progress_pattern;  // "" when the job reports by datagram only
  int world_size = 0;
  // The factor of each comm-slow fault of a local rank (fault id -> factor).
  std::map<std::string, double> comm_slow_factors;
  // The program its standbys run; an empty argv: none.
  StandbyProgram standby;
  // The durable cadence: every this many steps a snapshot is due in T2 (0:
  // every snapshot).
  int64_t persist_every_steps = 0;
};
// A spare node is asked to keep standbys of the job's program (only an
// agent with --standby that runs no generation does; it fills them at once).
struct StandbysWanted {
  StandbyProgram program;
  int count = 0;
};
// The shell discarded every standby (the node is shutting down): none is
// started again.
struct StandbysDiscarded {};
// Bytes from the worker socket, parsed and checked here.
struct DatagramArrived {
  std::string bytes;
  size_t size = 0;  // its real size where the socket cut it short (MSG_TRUNC); else 0
};
// A line of a worker's output (only read with a progress pattern).
struct OutputLine {
  int64_t generation = 0;
  int rank = 0;
  std::string line;
};
// A worker's process ended. The shell persists the newest snapshot of one
// that finished cleanly before it steps this: its final state is durable
// before the controller hears that it finished.
struct WorkerExited {
  int64_t generation = 0;
  int rank = 0;
  bool exited = false;  // by exit(); else by a signal
  int exit_code = 0;
  int signal = 0;
  bool stopped = false;        // the agent stopped it (no failure of its own)
  std::string tail;            // the last lines of its output
  std::string kernel_records;  // the node's kernel log since the generation started
};
// Something the shell itself reports (a start, a stop, stack dumps, a
// persisted shard, a heartbeat, a pair test): stamped and routed like the
// rest. `generation` < 0: the node's current generation.
struct Report {
  proto::AgentEvent event;
  int64_t generation = -1;
};

using NodeInput = std::variant<StreamOpened, StreamLost, StreamClosed, TransmitFailed,
                               CommandArrived, GenerationStarted, StandbysWanted, StandbysDiscarded,
                               DatagramArrived, OutputLine, WorkerExited, Report>;

// ---- Actions, carried out in order ----

// Write to the controller's stream; on failure step TransmitFailed with it
// and every Transmit after it in the same batch.
struct Transmit {
  proto::AgentEvent event;
};
// A line for the agent's log (stderr), without the "endure agent NODE: ".
struct LogLine {
  std::string text;
};
// Carry out the command that arrived (it is for this stream's generation).
struct CarryOut {};
// Start standbys of `argv` until `count` are kept.
struct RefillStandbys {
  StandbyProgram program;
  int count = 0;
};
// Discard the standbys of any other program than `argv`.
struct DiscardOtherStandbys {
  StandbyProgram program;
};
// Queue a worker's snapshot for replication and, when `durable` (its step is
// due in T2 by the durable cadence), persistence.
struct NotifySnapshot {
  int rank = 0;
  int64_t step = 0;
  int shards = 1;
  std::string path;
  bool durable = false;
};
// The node's network is broken by a fault: pairwise tests fail, or crawl by
// `slow_factor`.
struct BreakPairTests {
  bool fail = false;
  double slow_factor = 1;
};
// A worker that rejoined in place reported ready in its new generation:
// what it said before (a collective that failed as its peer died, "...;
// rejoining") is dropped from the last words its exit will report, so that
// it never explains how the worker ends in this generation.
struct ForgetLastWords {
  int rank = 0;
};
using NodeAction = std::variant<Transmit, LogLine, CarryOut, RefillStandbys, DiscardOtherStandbys,
                                NotifySnapshot, BreakPairTests, ForgetLastWords>;

// ---- Pure rules the shell applies beside the machine ----

// How a rank of a starting generation gets its state.
enum class RestoreRoute {
  kKeepsItsState,  // a live worker kept through an in-process restart: offered the generation
  kFromPeers,      // a fresh worker joining an in-process restart: a healthy replica's state
  kFromPlan,       // a fresh worker of a full restart with a restore plan: the plan's sources
  kFromScratch,    // neither: whatever the program does on its own (its restore step)
};
RestoreRoute RestoreRouteOf(bool rejoin, bool kept_alive, bool has_plan);
std::string_view RestoreRouteName(RestoreRoute route);

// The durable cadence (DurableStepDue) is the checkpoint book's.

// ---- The machine ----

// A node's report of its ranks' steps (proto NodeSteps) is its heartbeat
// too, for the controller as for the agent: the agent's heartbeat (every
// second) is not sent within this long of one that went down the stream.
inline constexpr Clock::TimePoint::duration kReportIsHeartbeat = std::chrono::seconds(1);
// A progress pattern that has matched none of this many lines, printed over
// at least this long, is reported as matching nothing (ProgressUnmatched):
// a program's banner and start-up logs are a few dozen lines, a progress bar
// drawn with the wrong pattern hundreds within seconds.
inline constexpr int64_t kUnmatchedLinesToWarn = 100;
inline constexpr Clock::TimePoint::duration kUnmatchedForToWarn = std::chrono::seconds(20);

struct NodeMachineOptions {
  std::string token;     // the job token: stamped on every event, required on commands
  bool standby = false;  // this agent keeps warm standbys (--standby)
  int slots = 1;         // the most standbys a spare keeps
  // The outage buffer's bound (OutageBuffer::kDefaultCapacity by default).
  size_t outage_capacity = OutageBuffer::kDefaultCapacity;
  // Refused datagrams: at most this many log lines at once, then one per interval.
  int refusal_log_burst = 10;
  Clock::TimePoint::duration refusal_log_interval = std::chrono::seconds(1);
};

class NodeMachine {
 public:
  NodeMachine(NodeMachineOptions options, LogClassifier classifier,
              contract::DatagramContext datagram_context);

  std::vector<NodeAction> Step(const NodeInput& input, NodeTime time);

  // What a resuming registration says and the shell's commands need.
  int64_t generation() const { return gate_.generation; }
  const std::set<int>& local_ranks() const { return gate_.local_ranks; }
  // The last step `rank` reported in this generation (0: none).
  int64_t last_step(int rank) const;
  // The ranks of `generation` that dump their own stacks, and with which signal.
  std::map<int, int> stack_signals(int64_t generation) const;
  // The slow-down of the comm-slow fault `fault_id` (3 when none was named).
  double comm_slow_factor(const std::string& fault_id) const;
  bool member() const { return member_; }
  bool reads_output() const { return output_.has_value(); }
  int64_t refused() const { return refused_; }
  int64_t refusals_not_logged() const { return refusal_log_.held_back(); }
  size_t outage_size() const { return outage_.size(); }
  int64_t outage_dropped() const { return outage_.dropped(); }

 private:
  enum class Link { kNone, kOpen, kOutage };

  // Every event for the controller goes through here. A rank's step is
  // held for the node's report (HoldStep); anything else sends the held
  // report first, then itself (Send: down the stream, into the outage
  // buffer, or nowhere).
  void Route(proto::AgentEvent event, std::vector<NodeAction>* out);
  // Adds a rank's step to the node's report (proto NodeSteps), sent once
  // every rank of the generation here has reported, or before a second
  // step of one of them or a step of another generation.
  void HoldStep(proto::AgentEvent event, std::vector<NodeAction>* out);
  void FlushSteps(std::vector<NodeAction>* out);
  void Send(proto::AgentEvent event, std::vector<NodeAction>* out);
  void Stamp(proto::AgentEvent* event, int64_t generation, double wall_s) const;
  // Once a generation, when the progress pattern has matched none of
  // kUnmatchedLinesToWarn lines printed over kUnmatchedForToWarn: a log line
  // and a ProgressUnmatched for the controller (its status and report warn).
  void WarnIfUnmatched(int64_t generation, NodeTime time, std::vector<NodeAction>* out);
  void Refuse(const std::string& why, NodeTime time, std::vector<NodeAction>* out);
  void OnStreamOpened(const StreamOpened& in, NodeTime time, std::vector<NodeAction>* out);
  void OnCommand(const proto::AgentCommand& cmd, std::vector<NodeAction>* out);
  void OnGenerationStarted(const GenerationStarted& in, NodeTime time,
                           std::vector<NodeAction>* out);
  // Keeps `count` standbys of `argv` from now on, filled at once or on the
  // next step.
  void KeepStandbys(const StandbyProgram& program, int count, bool fill_now,
                    std::vector<NodeAction>* out);
  void OnDatagram(std::string_view bytes, size_t size, NodeTime time, std::vector<NodeAction>* out);
  void OnOutputLine(const OutputLine& in, NodeTime time, std::vector<NodeAction>* out);
  void OnWorkerExited(const WorkerExited& in, NodeTime time, std::vector<NodeAction>* out);
  void Stepped(std::vector<NodeAction>* out);  // a step was made: the standby rule

  NodeMachineOptions o_;
  LogClassifier classifier_;
  contract::DatagramContext datagram_context_;

  Link link_ = Link::kNone;
  OutageBuffer outage_;
  int64_t started_on_stream_ = -1;  // the newest generation started on this stream

  DatagramGate gate_;  // this generation, its credential and its ranks here
  std::optional<proto::AgentEvent> held_steps_;  // the node's report being filled (HoldStep)
  Clock::TimePoint now_{};                       // of the input being stepped
  // When the last report of the ranks' steps went down the stream: it is the
  // node's heartbeat too (kReportIsHeartbeat).
  std::optional<Clock::TimePoint> last_report_at_;
  bool member_ = false;  // a generation ran here (a spare keeps standbys only before)
  Clock::TimePoint started_{};
  std::optional<OutputReports> output_;  // with a progress pattern
  // When this generation's workers first printed, and whether the pattern's
  // silence was reported (WarnIfUnmatched).
  std::optional<Clock::TimePoint> first_output_at_;
  bool unmatched_warned_ = false;
  std::map<int, int> stack_signals_;                          // rank -> signal
  std::map<int, int64_t> last_steps_;                         // rank -> last step reported
  std::map<int, std::vector<proto::AgentEvent>> last_words_;  // rank -> log match, exit
  std::map<std::string, double> comm_slow_factors_;
  int64_t persist_every_steps_ = 0;

  StandbyProgram standby_;
  int standby_count_ = 0;
  bool refill_pending_ = false;

  int64_t refused_ = 0;
  LogRateLimiter refusal_log_;
};

}  // namespace endure::core
