// Endure's client library: the part of Endure that lives inside a training
// process. A Session reports the trainer's progress to the node's agent
// (ready, per-step timings and loss, heartbeats), hands the trainer the
// agent's instructions for this generation (checkpoint directory and
// interval, restore point, steps to skip), says which phase the rank is in
// (training, evaluation, checkpoint, ...), reports parameter fingerprints for
// the silent-data-corruption check, and fires the faults injected into this
// rank.
//
// Transport: one JSON object per Unix datagram (SOCK_DGRAM), sent with
// MSG_DONTWAIT to the socket named by ENDURE_AGENT_SOCKET. A training step is
// never blocked on the agent: a datagram that cannot be queued right now (the
// agent is gone, or its receive queue is full) is dropped and counted. Only
// a "fault" datagram, sent right before the process dies on purpose, retries
// for up to 100 ms, so that the agent learns which fault fired; so do the
// rare ones whose loss would mislead the agent ("stacks", "phase").
//
// Without ENDURE_AGENT_SOCKET the session is inactive: no socket, no thread,
// nothing reported, so the same trainer runs bare or under torchrun. The
// other ENDURE_* variables are honoured whether or not an agent listens, so
// that faults can also be injected into a run under torchrun.
//
// Environment (set by the agent):
//   ENDURE_AGENT_SOCKET        path of the agent's datagram socket; unset: inactive
//   ENDURE_TOKEN               this generation's worker credential (not the job token),
//                              sent in every datagram; required with a socket
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
//   ENDURE_RESTORE_PLAN_FILE   a file holding that plan instead (for plans of many shards)
//   ENDURE_RESTORE_PLAN        JSON restore plan (src/checkpoint/restore_plan.h): which
//                              step to restore and, per shard, which rank reads which copy
//   ENDURE_SKIP_STEPS          comma-separated step numbers (1-based, as in the "step"
//                              datagram: step index + 1) whose data and update are
//                              skipped; may be empty
//   ENDURE_HEARTBEAT_INTERVAL  duration such as "500ms" (default 500ms)
//   ENDURE_FAULTS              JSON array of faults (format in src/faults/fault.h);
//                              only step-keyed faults of this RANK are fired here
//   ENDURE_SDC_CHECK_EVERY     integer >= 0 (default 0: off): every this many steps
//                              the trainer fingerprints its parameters after the
//                              optimizer step (FingerprintDue, ReportFingerprint)
//   ENDURE_STACKS_FILE         where a worker that dumps its own stacks on a signal
//                              (the Python client, through faulthandler) writes them
//   ENDURE_REJOIN_FILE         where the agent offers this live process a later
//                              generation (in-process restart; see Rejoin below)
//   ENDURE_PEER_RESTORE        "1": this rank was started fresh into a generation
//                              whose other ranks kept their state in memory: it
//                              takes the state from them, not from the tiers
// A malformed value is a configuration error: FromEnvironment returns
// kInvalidArgument naming the variable and the value.
//
// Datagrams: JSON objects; every one has "type", "token", "generation",
// "rank" and "t" (wall-clock seconds since the epoch, a double).
//   {"type":"ready","start_step":N,"restore_s":x,"init_s":y[,"rejoin":true]
//    [,"deterministic":true]}
//       "rejoin": the process can join a later generation in place (it
//       calls Rejoin when a collective fails), so that the controller may
//       replace only a failed peer instead of restarting every rank.
//   {"type":"heartbeat","step":N}   N: steps completed (-1 before Ready)
//   {"type":"step","step":N,"loss":x|null,"compute_s":a,"comm_s":b,"ckpt_stall_s":c,
//    "checkpoint_step":k[,"tokens":T][,"total_steps":S]}
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
//   {"type":"stacks","signal":S}
//       this process writes its own stacks (every thread) to ENDURE_STACKS_FILE
//       when it receives signal S (SIGUSR1, SIGUSR2 or a real-time signal); the
//       agent then uses them instead of attaching gdb.
//   {"type":"fault","id":"f1","kind":"kill","step":N}
//       sent right before an injected fault takes effect; N is the fault's
//       1-based step number (= the step index + 1) — for comm-slow, the
//       step it first took effect.
//   {"type":"phase","phase":NAME,"step":N}
//       the rank enters phase NAME (^[a-z][a-z0-9_]{0,31}$) having completed N
//       steps (-1 before Ready). "train" is the phase a rank starts in; others
//       are "eval", "checkpoint", "data" or any name the program chooses. The
//       agent times each phase on its own, so a long evaluation is not a hang.
//   {"type":"fingerprint","step":N,"fingerprint":"0123456789abcdef"}
//       XXH3-64 of the parameters (Fingerprint) after the optimizer step of
//       step N (1-based, as in "step"): data-parallel replicas must agree.
//
// This header and include/endure/status.h are the whole C++ interface: they
// include no header of Endure's source tree, and the session's socket,
// threads and buffers live behind a pointer (Session::Impl). The C API over
// it is include/endure/endure.h; the Python package `endure` binds it.
//
// Thread safety: Ready, BeginStep, EndStep, EndSkippedStep, Phase,
// ReportFingerprint, BitflipDue and BeforeCollective are called from the
// training thread only. The heartbeat thread is internal and is
// stopped (and joined) by the destructor. Accessors and dropped() may be
// called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "endure/status.h"

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

// ---- Checkpoint state as tensors ----
//
// A checkpoint shard is JSON metadata (which must hold "step") plus named
// tensors: raw bytes, row-major and contiguous, in host byte order, with a
// dtype name: "float32", "float64", "float16", "bfloat16", "int64", "int32",
// "int16", "int8", "uint8" or "bool".

// A tensor to be saved, seen in place: saving copies straight from `data`.
struct TensorRef {
  std::string name;  // unique within the state, e.g. "model/blocks.0.attn.weight"
  std::string dtype;
  std::vector<int64_t> shape;  // empty for a scalar
  const void* data = nullptr;  // `bytes` bytes; must stay valid during the call
  size_t bytes = 0;
};

// A tensor read back from a checkpoint.
struct StoredTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string data;
};

// One shard of a checkpoint, read back.
struct StoredShard {
  std::string meta_json;  // the metadata as saved
  std::vector<StoredTensor> tensors;
};

// Bytes per element of a dtype named above; 0 for an unknown name.
size_t DTypeBytes(std::string_view dtype);

// Parses a shard's bytes (as ReadRestoreShard returns them); kDataLoss
// naming `source` when they are not a shard.
Result<StoredShard> DecodeShard(std::string_view bytes, const std::string& source);

// Splits tensors of the given sizes among `shards` savers: each tensor, in
// order, goes to the shard with the fewest bytes so far (ties: the lowest).
// Every rank computes the same assignment from the same list.
std::vector<int> PartitionBySize(const std::vector<uint64_t>& bytes, int shards);

// XXH3-64 over each tensor's name and bytes, in order, as 16 hex digits: the
// `param_fingerprint` that endure-train prints for its parameters.
std::string Fingerprint(const std::vector<TensorRef>& tensors);

// ---- Injected silent data corruption ----

// Which bit of which parameter an injected `bitflip` fault flips. `tensor`
// indexes the trainer's parameters in their named order (model
// .named_parameters()), taken modulo their count; `element` is taken modulo
// the tensor's number of elements and `bit` modulo its dtype's width in bits.
// Bit b is the element's bit of value 2^b read as an unsigned integer of its
// width in host byte order: for a float32, bit 30 is the top exponent bit
// but one, 31 the sign.
struct BitFlip {
  int tensor = 0;
  int64_t element = 0;
  int bit = 30;
};

// Flips `flip`'s bit (its element and bit, not its tensor: the caller chose
// that) in the `numel` elements of `element_bytes` bytes each at `data`.
// Returns false, and touches nothing, for an empty tensor or an element size
// that is not 1, 2, 4 or 8.
bool FlipBit(const BitFlip& flip, void* data, int64_t numel, size_t element_bytes);

// ---- Durable checkpoints in a directory (the format endure-train writes) ----
//
// DIR/step-00000042/{shard-00000.bin, MANIFEST.json}: each file written
// tmp -> fsync -> rename -> fsync(dir), the manifest with every shard's size
// and XXH3 last, so that a crash leaves either the whole step or none of it.

// Commits `tensors` and `meta_json` (a JSON object; "step" is set to `step`)
// as step `step` in `dir` (created when missing), then keeps the newest
// `keep` committed steps (0: all). On failure nothing is committed and no
// older step is touched. kInvalidArgument for a meta_json that is not an
// object or a tensor whose bytes do not match its dtype and shape.
Status CommitCheckpoint(const std::string& dir, int64_t step, const std::string& meta_json,
                        const std::vector<TensorRef>& tensors, int keep);

struct LoadedCheckpoint {
  int64_t step = 0;
  StoredShard state;  // every shard of the step, merged
};
// Loads the newest step at or before `limit` in `dir` that verifies;
// nullopt when none does. Each refused step (a bad checksum, a truncated file,
// a missing manifest) is described in `refused` (if non-null), newest first.
Result<std::optional<LoadedCheckpoint>> LoadNewestCheckpoint(const std::string& dir, int64_t limit,
                                                             std::vector<std::string>* refused);
// Deletes the steps after `step` in `dir` (a rollback abandons them) and
// returns them.
Result<std::vector<int64_t>> RemoveCheckpointsAfter(const std::string& dir, int64_t step);

// ---- The restore point the agent chose ----

struct RestoreSource {
  int shard = 0;
  std::string tier;         // "T0", "T1" or "T2"
  std::string node;         // the node holding it (T0, T1); empty for T2
  int loader_rank = -1;     // the rank that reads it and broadcasts it to the others
  std::string description;  // "step 42 shard 1 in T0 on node1"
};

struct RestorePlan {
  int64_t step = 0;                    // 0: no complete step; start fresh
  std::vector<RestoreSource> sources;  // index = shard; empty for a fresh start
  std::vector<std::string> notes;      // refused copies and skipped steps, newest first
  std::string summary;                 // "step 42 from T0 x2, T1 x1" or "fresh start"
};

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
  bool active() const;
  int rank() const;
  int64_t generation() const;
  // Empty: not set (keep the trainer's own flag).
  const std::string& checkpoint_dir() const;
  // nullopt: not set (keep the trainer's own flag).
  std::optional<int64_t> checkpoint_every() const;
  // nullopt: not set; otherwise -1, 0 or N > 0 as documented above.
  std::optional<int64_t> restore_step() const;
  // The agent's restore plan, when it gave one (ENDURE_RESTORE_PLAN).
  const std::optional<RestorePlan>& restore_plan() const;
  // Reads source `index` of the restore plan from its tier and checks its
  // size and checksum. Only the source's loader_rank needs to call it.
  // kDataLoss naming the copy when it does not verify; kInvalidArgument
  // without a plan or for an index out of range.
  Result<std::string> ReadRestoreShard(size_t index) const;
  // The steps of this rank's snapshots in its node's memory (T0) that were
  // saved by as many ranks as `shards`, newest first: the restore point of
  // a rejoin whose ranks each hold a different part of the state (FSDP),
  // when every rank finds the step on its own node (a killed rank's
  // replacement starts where it ran). Empty without node memory.
  std::vector<int64_t> LocalSnapshotSteps(int shards) const;
  // This rank's T0 snapshot of `step`, checked against its checksum (bytes
  // as ReadRestoreShard returns them). kNotFound when no slot holds it,
  // kDataLoss when it does not verify.
  Result<std::string> ReadLocalSnapshot(int64_t step) const;
  // Whether the agent keeps this rank's checkpoints in node memory
  // (ENDURE_T0_DIR): the trainer then saves through SaveSnapshot.
  bool memory_checkpoints() const;
  // ENDURE_STACKS_FILE; empty when not set.
  const std::string& stacks_file() const;

  // ---- In-process restart ----
  //
  // When a peer fails, the agent may offer this process (still alive, its
  // state in memory) the next generation instead of stopping it: it writes
  // the KEY=VALUE lines of the process's environment for that generation
  // (as a standby's assignment: RANK, WORLD_SIZE, MASTER_PORT, ENDURE_TOKEN,
  // ENDURE_GENERATION, ...) to ENDURE_REJOIN_FILE, atomically. The trainer
  // abandons its broken process group, calls Rejoin, joins the new
  // generation's group and hands its state to the ranks that start fresh
  // (peer_restore()).

  // Whether the agent offers rejoins (ENDURE_REJOIN_FILE is set). Call
  // DeclareRejoin before Ready when the program acts on them.
  bool rejoin_offered_here() const;
  // Where a rank that rejoins takes the state it lacks from.
  enum class RejoinRestore {
    kFromPeers,  // data parallel: the ranks that kept the state hand it to the fresh ones
    kFromTiers,  // each rank holds its own part (sharded, FSDP): every rank of the new
                 // generation restores from the tiers (the generation carries a plan)
  };
  // This process rejoins generations: its "ready" datagrams say so (and
  // where its state comes from), and a thread of the session's reads the
  // agent's offer file every 10 ms from then on (RejoinPending).
  void DeclareRejoin(RejoinRestore restore = RejoinRestore::kFromPeers);
  // This program computes the same loss bit for bit when it replays a step
  // from the same state and data (fixed seeds, deterministic kernels, an
  // exact or fixed-order reduction). Call before Ready. A loss anomaly is
  // then judged by replaying its step: a loss that comes back bit for bit is
  // the data's and training goes on through it; one that changes was a fault
  // and its rank's node is struck. Without it, an anomaly rolls back and a
  // recurrence skips the step's data ([anomaly] in docs/job_spec.md).
  void DeclareDeterministic();
  // Whether the agent has offered a generation later than this session's.
  // After DeclareRejoin, an atomic load of what the session's offer watch
  // read (at most 10 ms old): cheap enough for every layer or gradient of a
  // step, from any thread but while Rejoin runs. Before it, a read of the
  // offer file.
  bool RejoinPending() const;
  // Waits up to `timeout` for an offer of a later generation, then takes it:
  // sets its variables in this process's environment and re-reads them, so
  // that generation(), rank(), the token, the faults and the checkpoint
  // settings are the new generation's; the heartbeat thread restarts.
  // kUnavailable when no offer came in time; kInvalidArgument for a
  // malformed offer, with nothing changed.
  Status Rejoin(std::chrono::milliseconds timeout);
  // ENDURE_PEER_RESTORE=1: this rank must take its state from its peers.
  bool peer_restore() const;

  // Saves this rank's shard (`tensors`, with `meta_json`, a JSON object;
  // "step", "shard" and "shards" are set here) of step `step` of a
  // `shards`-way state into node memory and tells the agent; the agent
  // replicates and persists it behind training. Blocks only for the copy.
  // When the agent still reads the slot this save needs (it is more than a
  // step behind), waits for it: every rank must hold every step, or no step
  // is complete for a restore. Returns false when it waited 30 s in vain
  // and skipped the save. kInvalidArgument when the shard exceeds the memory
  // budget's share (the message says to raise checkpoint.memory_budget), for
  // a malformed meta_json or a tensor whose size does not match its dtype
  // and shape; kIOError when shared memory cannot be written.
  Result<bool> SaveSnapshot(int64_t step, int shards, const std::string& meta_json,
                            const std::vector<TensorRef>& tensors);

  // Ascending 1-based step numbers (ENDURE_SKIP_STEPS).
  const std::vector<int64_t>& skip_steps() const;
  // Whether step index `step_index` (0-based, as passed to BeginStep), i.e.
  // step number step_index + 1, is to be skipped.
  bool ShouldSkip(int64_t step_index) const;

  // Tokens the whole job processes per step, sent as "tokens" in each
  // "step" datagram from now on (0: not sent).
  void SetTokensPerStep(int64_t tokens);

  // The steps this run will train in all, sent as "total_steps" in each
  // "step" datagram from now on (0: not sent): the controller weighs what a
  // straggler costs over the remaining ones.
  void SetTotalSteps(int64_t steps);

  // Datagrams dropped so far because the agent could not take them.
  int64_t dropped() const;

  // ---- Phases ----

  // The rank enters phase `name` ("eval", "checkpoint", "data", "train" to go
  // back to training, or a name of the program's own): sends the "phase"
  // datagram with the steps completed so far. Call it on every rank that
  // enters the phase. kInvalidArgument, whether or not the session is
  // active, for a name that does not match ^[a-z][a-z0-9_]{0,31}$; the phase
  // is then unchanged. Inactive: only remembers the phase.
  Status Phase(std::string_view name);
  // The phase the rank is in: "train" until Phase says otherwise.
  const std::string& current_phase() const;

  // ---- Silent data corruption check ----

  // ENDURE_SDC_CHECK_EVERY: steps between parameter fingerprints (0: off).
  int64_t sdc_check_every() const;
  // Whether the parameters after the optimizer step of step index
  // `step_index` are to be fingerprinted: (step_index + 1) is a positive
  // multiple of sdc_check_every().
  bool FingerprintDue(int64_t step_index) const;
  // Reports `fingerprint` (Fingerprint over the parameters, in their named
  // order, after the optimizer step of step index `step_index`): the
  // "fingerprint" datagram with step step_index + 1. kInvalidArgument for a
  // fingerprint that is not 16 lowercase hex digits or a negative index,
  // whether or not the session is active.
  Status ReportFingerprint(int64_t step_index, std::string_view fingerprint);

  // ---- Faults fired inside the step ----

  // Call after the optimizer step of step index `step_index`, before any
  // fingerprint of it. When a `bitflip` fault of this rank is due at this
  // step, sends its "fault" datagram, prints a line on stderr and returns
  // the bit to flip (once: the next call returns nullopt); the trainer flips
  // it in its parameters (FlipBit), so that this replica silently differs.
  std::optional<BitFlip> BitflipDue(int64_t step_index);

  // Call right before each collective of step index `step_index` (the
  // gradient allreduce), inside the time reported as comm_s. From a
  // `comm-fail` fault's step on: sends its "fault" datagram, prints
  // "endure fault: collective failed: Connection reset by peer (comm-fail)"
  // on stderr and _exit(1)s, as a process whose NCCL/Gloo connection broke.
  // From a `comm-slow` fault's step on: sleeps (factor - 1) x the rank's
  // last comm_s (as given to EndStep, less what was slept here), at least
  // (factor - 1) x 50 ms, per call; its "fault" datagram is sent once.
  void BeforeCollective(int64_t step_index);

  // Tells the agent that this process writes its own stacks to
  // stacks_file() on `signal` (the "stacks" datagram). The caller installs
  // the handler first. kInvalidArgument for a signal other than SIGUSR1,
  // SIGUSR2 or a real-time signal.
  Status AnnounceStackSignal(int signal);

  // For a native program: on `signal`, the stack of the thread that called
  // this (call it from the training loop's thread) is appended to
  // stacks_file() as glibc's backtrace_symbols lines, and the signal is
  // announced (AnnounceStackSignal). Delivered to another thread, the signal
  // is passed on to that one. Function names of the program itself appear
  // only when it is linked with -rdynamic (CMake: ENABLE_EXPORTS). Ok and
  // nothing installed outside an agent (no stacks file); kInvalidArgument as
  // AnnounceStackSignal; kUnavailable when the file cannot be opened or the
  // handler installed. One handler per process: a later call moves it.
  Status DumpStacksOnSignal(int signal);

  // After the restore, before the first step: training starts at step index
  // `start_step`; `restore_s` was spent restoring, `init_s` since the
  // process started (see SecondsSinceProcessStart).
  void Ready(int64_t start_step, double restore_s, double init_s);
  // Ready, for a program that does not know which step it restored (it
  // resumed from a checkpoint of its own that Endure never saw): the first
  // step it reports tells the controller, which takes the step before it as
  // the restore point (docs/progress_pattern.md, "Restore points").
  void ReadyAtUnknownStep(double restore_s, double init_s);

  // Step index `step_index` (0-based) is about to run. Fires the faults due
  // at this step that end or stop the process: kill (SIGKILL), exit (flush
  // stdio, _exit(exit_code)), hang (sleeps forever; heartbeats go on), log
  // (the line on stderr, then _exit(1)). Each sends its "fault" datagram first.
  void BeginStep(int64_t step_index);
  // Whether BeginStep(step_index) will fire such a fault. A trainer that
  // copies its checkpoint on another thread while the next step computes
  // lets that copy finish first, so that the fault strikes where it would
  // with a copy made inside the step.
  bool StopsAt(int64_t step_index) const;

  // Step index `step_index` finished. Applies a due `slow` fault (sleeps
  // (factor - 1) x compute_s from the fault's step on, reported as
  // compute time), sends the "step" datagram and returns the loss to log:
  // NaN when a `nan` fault is due at this step, `loss` otherwise. Without a
  // loss (nullopt: the program does not know it) the step counts as
  // progress and the datagram's "loss" is null: nothing to judge.
  // `checkpoint_step` is the step committed during this step, or -1.
  std::optional<double> EndStep(int64_t step_index, std::optional<double> loss, double compute_s,
                                double comm_s, double ckpt_stall_s, int64_t checkpoint_step);

  // Step index `step_index` was skipped (ShouldSkip): sends its "skip"
  // datagram; heartbeats count it as completed.
  void EndSkippedStep(int64_t step_index, double ckpt_stall_s, int64_t checkpoint_step);

 private:
  struct Impl;
  explicit Session(std::unique_ptr<Impl> impl);
  void SendReady(int64_t start_step, bool unknown, double restore_s, double init_s);
  std::unique_ptr<Impl> impl_;
};

}  // namespace endure
