// Endure's client library: the part of Endure that lives inside a training
// process. A Session reports the trainer's progress to the node's agent
// (ready, per-step timings and loss, heartbeats), hands the trainer the
// agent's instructions for this generation (checkpoint directory and
// interval, restore point, steps to skip), and fires the faults injected
// into this rank.
//
// Transport: one JSON object per Unix datagram (SOCK_DGRAM), sent with
// MSG_DONTWAIT to the socket named by ENDURE_AGENT_SOCKET. A training step is
// never blocked on the agent: a datagram that cannot be queued right now (the
// agent is gone, or its receive queue is full) is dropped and counted. Only
// a "fault" datagram, sent right before the process dies on purpose, retries
// for up to 100 ms, so that the agent learns which fault fired.
//
// Without ENDURE_AGENT_SOCKET the session is inactive: no socket, no thread,
// nothing reported, so the same trainer runs bare or under torchrun. The
// other ENDURE_* variables are honoured whether or not an agent listens, so
// that faults can also be injected into a run under torchrun.
//
// Environment (set by the agent):
//   ENDURE_AGENT_SOCKET        path of the agent's datagram socket; unset: inactive
//   ENDURE_TOKEN               job token, sent in every datagram; required with a socket
//   ENDURE_GENERATION          integer >= 0 (default 0)
//   RANK                       integer >= 0 (default 0)
//   ENDURE_CKPT_DIR            checkpoint directory; overrides --ckpt-dir when set
//   ENDURE_CKPT_EVERY          integer >= 0 steps (0: no periodic checkpoints);
//                              overrides --ckpt-every when set
//   ENDURE_RESTORE_STEP        -1: newest checkpoint that verifies; 0: fresh start;
//                              N > 0: newest verifying checkpoint at or before step N.
//                              Unset: the trainer's own --resume decides.
//   ENDURE_T0_DIR              directory (in shared memory) of this node's T0 snapshot
//                              slots; set: SaveSnapshot saves there (see below)
//   ENDURE_T0_SLOT_BYTES       integer >= 0: the most bytes one slot may hold (0: no limit)
//   ENDURE_RESTORE_PLAN        JSON restore plan (src/checkpoint/restore_plan.h): which
//                              step to restore and, per shard, which rank reads which copy
//   ENDURE_SKIP_STEPS          comma-separated step numbers (1-based, as in the "step"
//                              datagram: step index + 1) whose data and update are
//                              skipped; may be empty
//   ENDURE_HEARTBEAT_INTERVAL  duration such as "500ms" (default 500ms)
//   ENDURE_FAULTS              JSON array of faults (format in src/faults/fault.h);
//                              only step-keyed faults of this RANK are fired here
// A malformed value is a configuration error: FromEnvironment returns
// kInvalidArgument naming the variable and the value.
//
// Datagrams: JSON objects; every one has "type", "token", "generation",
// "rank" and "t" (wall-clock seconds since the epoch, a double).
//   {"type":"ready","start_step":N,"restore_s":x,"init_s":y}
//   {"type":"heartbeat","step":N}   N: steps completed (-1 before Ready)
//   {"type":"step","step":N,"loss":x,"compute_s":a,"comm_s":b,"ckpt_stall_s":c,
//    "checkpoint_step":k[,"tokens":T]}
//       N: steps completed, i.e. step index + 1; k: the step a checkpoint was
//       committed at during this step, or -1. A non-finite loss is sent as
//       the string "nan", "inf" or "-inf" (JSON has no such numbers). T:
//       tokens the whole job processed in the step, once SetTokensPerStep
//       was called.
//   {"type":"skip","step":N,"ckpt_stall_s":c,"checkpoint_step":k}
//       instead of "step" for a step skipped through ENDURE_SKIP_STEPS: it
//       has no loss, and must not count as progress or be judged as one.
//   {"type":"snapshot","step":N,"shard":r,"shards":W,"path":P,"bytes":B,"xxh3":"hex"}
//       a T0 snapshot of this rank's shard of step N is ready in slot file P.
//   {"type":"fault","id":"f1","kind":"kill","step":N}
//       sent right before an injected fault takes effect; N is the fault's
//       1-based step number (= the step index + 1).
//
// Thread safety: Ready, BeginStep, EndStep and EndSkippedStep are called
// from the training thread only. The heartbeat thread is internal and is
// stopped (and joined) by the destructor. Accessors and dropped() may be
// called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/restore_plan.h"
#include "checkpoint/snapshot_file.h"
#include "checkpoint/tensor_blob.h"
#include "common/status.h"

namespace endure {

// Looks up an environment variable: nullptr when unset. std::getenv by default.
using EnvLookup = std::function<const char*(const char*)>;

// Seconds from this process's start (its start time in /proc/self/stat,
// against CLOCK_BOOTTIME) to now: includes exec, dynamic loading and static
// initialisation. Falls back to the time since this library was loaded when
// /proc is unavailable. Resolution: one clock tick (usually 10 ms).
double SecondsSinceProcessStart();

// Warm standby. An agent may start a worker before it is needed, so that a
// restart does not wait for the program to load (libtorch: ~0.7 s). Such a
// worker has ENDURE_STANDBY=1 and its assignment — the KEY=VALUE lines of
// its environment for the generation it will serve (RANK, MASTER_PORT,
// ENDURE_*, ...) — arrives on standard input, closed after the last line.
// Call this first thing in main(), after parsing flags: without
// ENDURE_STANDBY it returns at once; otherwise it blocks until the
// assignment arrives, sets the variables, and returns. When standard input
// closes with no assignment (the standby was discarded), the process exits
// with code 0. From then on SecondsSinceProcessStart counts from the
// assignment, not from the process start.
void AwaitStandbyAssignment();

class Session {
 public:
  // Reads the ENDURE_* variables above through `lookup`. When
  // ENDURE_AGENT_SOCKET is set, opens the socket and starts the heartbeat
  // thread. kInvalidArgument for a malformed variable; kIOError when no
  // datagram socket can be created.
  static Result<std::unique_ptr<Session>> FromEnvironment(const EnvLookup& lookup = std::getenv);

  // A session that reports nothing and injects nothing.
  static std::unique_ptr<Session> Disabled();

  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // True when reporting to an agent.
  bool active() const { return fd_ >= 0; }
  int rank() const { return rank_; }
  int64_t generation() const { return generation_; }
  // Empty: not set (keep the trainer's own flag).
  const std::string& checkpoint_dir() const { return checkpoint_dir_; }
  // nullopt: not set (keep the trainer's own flag).
  std::optional<int64_t> checkpoint_every() const { return checkpoint_every_; }
  // nullopt: not set; otherwise -1, 0 or N > 0 as documented above.
  std::optional<int64_t> restore_step() const { return restore_step_; }
  // The agent's restore plan, when it gave one (ENDURE_RESTORE_PLAN).
  const std::optional<checkpoint::RestorePlan>& restore_plan() const { return restore_plan_; }
  // Whether the agent keeps this rank's checkpoints in node memory
  // (ENDURE_T0_DIR): the trainer then saves through SaveSnapshot.
  bool memory_checkpoints() const { return !t0_dir_.empty(); }

  // Saves this rank's shard (`tensors`, in ShardViews form) of step `step`
  // of a `shards`-way state into node memory and tells the agent; the agent
  // replicates and persists it behind training. Blocks only for the copy.
  // When the agent still reads the slot this save needs (it is more than a
  // step behind), waits for it: every rank must hold every step, or no step
  // is complete for a restore. Returns false when it waited 30 s in vain
  // and skipped the save. kInvalidArgument when the shard exceeds the memory
  // budget's share; kIOError when shared memory cannot be written.
  Result<bool> SaveSnapshot(int64_t step, int shards,
                            const std::vector<checkpoint::TensorView>& tensors);

  // Ascending 1-based step numbers (ENDURE_SKIP_STEPS).
  const std::vector<int64_t>& skip_steps() const { return skip_steps_; }
  // Whether step index `step_index` (0-based, as passed to BeginStep), i.e.
  // step number step_index + 1, is to be skipped.
  bool ShouldSkip(int64_t step_index) const;

  // Tokens the whole job processes per step, sent as "tokens" in each
  // "step" datagram from now on (0: not sent).
  void SetTokensPerStep(int64_t tokens) { tokens_per_step_ = tokens; }

  // Datagrams dropped so far because the agent could not take them.
  int64_t dropped() const { return dropped_.load(); }

  // After the restore, before the first step: training starts at step index
  // `start_step`; `restore_s` was spent restoring, `init_s` since the
  // process started (see SecondsSinceProcessStart).
  void Ready(int64_t start_step, double restore_s, double init_s);

  // Step index `step_index` (0-based) is about to run. Fires the faults due
  // at this step that end or stop the process: kill (SIGKILL), exit (flush
  // stdio, _exit(exit_code)), hang (sleeps forever; heartbeats go on), log
  // (the line on stderr, then _exit(1)). Each sends its "fault" datagram first.
  void BeginStep(int64_t step_index);

  // Step index `step_index` finished. Applies a due `slow` fault (sleeps
  // (factor - 1) x (compute_s + comm_s) from the fault's step on, reported as
  // compute time), sends the "step" datagram and returns the loss to log:
  // NaN when a `nan` fault is due at this step, `loss` otherwise.
  // `checkpoint_step` is the step committed during this step, or -1.
  double EndStep(int64_t step_index, double loss, double compute_s, double comm_s,
                 double ckpt_stall_s, int64_t checkpoint_step);

  // Step index `step_index` was skipped (ShouldSkip): sends its "skip"
  // datagram; heartbeats count it as completed.
  void EndSkippedStep(int64_t step_index, double ckpt_stall_s, int64_t checkpoint_step);

 private:
  struct PendingFault;

  Session();
  // Sends one datagram; `retry` waits up to 100 ms for room in the agent's
  // queue. Returns whether it was queued; counts a drop otherwise.
  bool Send(const std::string& datagram, bool retry);
  void SendFault(const PendingFault& fault, int64_t step);
  void HeartbeatLoop();

  std::string socket_path_;
  std::string token_;
  int64_t generation_ = 0;
  int rank_ = 0;
  std::string checkpoint_dir_;
  std::optional<int64_t> checkpoint_every_;
  std::optional<int64_t> restore_step_;
  std::vector<int64_t> skip_steps_;
  std::optional<checkpoint::RestorePlan> restore_plan_;
  std::string t0_dir_;
  uint64_t t0_slot_bytes_ = 0;
  std::unique_ptr<checkpoint::SnapshotWriter> snapshots_;  // training thread only
  std::chrono::nanoseconds heartbeat_interval_{500'000'000};
  std::vector<PendingFault> faults_;  // only touched by the training thread
  double slow_factor_ = 1.0;          // active slow fault; training thread only
  int64_t tokens_per_step_ = 0;       // training thread only

  int fd_ = -1;
  std::atomic<int64_t> dropped_{0};
  std::atomic<int64_t> steps_done_{-1};  // for heartbeats
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread heartbeat_;
};

}  // namespace endure
