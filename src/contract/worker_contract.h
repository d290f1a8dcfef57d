// The worker contract: everything a training process and its agent agree
// on, in one place, so that the writer and the reader cannot drift apart.
//
//   the ENDURE_* environment  what the agent sets for each worker it starts
//                             (and the controller passes through the start
//                             command), and the client library reads
//                             (Session::FromEnvironment; the C API and the
//                             Python package read them through it);
//   the datagrams             what a worker sends to its agent's Unix socket:
//                             typed messages, EncodeDatagram (the client
//                             library) and ParseDatagram (the agent), which
//                             checks every field for type, range and size and
//                             refuses anything else with a reason;
//   the bounds and names      what a count, a duration, a phase name or a
//                             fingerprint may be, checked again wherever a
//                             value crosses a process boundary (the
//                             controller reads them from the agent's stream).
//
// docs/python.md and include/endure/client.h say what each means to a
// program. Pure: no I/O, never throws.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "common/status.h"
#include "faults/fault.h"

namespace endure::contract {

// The largest datagram accepted; larger ones are refused (the receiver
// detects truncation).
inline constexpr size_t kMaxDatagramBytes = 64 * 1024;
// The most ranks a job has (bounds rank and shard numbers).
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;
// The largest step, token count or generation: what a double holds exactly.
inline constexpr int64_t kMaxCount = int64_t{1} << 53;
// The longest duration a step or start-up may report (seconds).
inline constexpr double kMaxSeconds = 1e7;
// The longest phase name, and a fingerprint's length.
inline constexpr size_t kMaxPhaseBytes = 32;
inline constexpr size_t kFingerprintChars = 16;

// A duration a worker reports: finite, in [0, kMaxSeconds].
inline bool IsSeconds(double s) { return s >= 0 && s <= kMaxSeconds; }

// ^[a-z][a-z0-9_]{0,31}$: a phase name, safe in logs and as a key.
inline bool IsPhaseName(std::string_view s) {
  if (s.empty() || s.size() > kMaxPhaseBytes || s[0] < 'a' || s[0] > 'z') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

// Exactly 16 lowercase hex digits (XXH3-64), so that equal fingerprints
// compare equal as strings.
inline bool IsFingerprint(std::string_view s) {
  return s.size() == kFingerprintChars && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// "ready": the worker finished start-up (and its restore).
struct ReadyMessage {
  int64_t start_step = 0;  // the step it restored (0: fresh)
  double restore_s = 0;
  double init_s = 0;
  bool rejoin = false;         // it rejoins later generations in place (client.h Rejoin)
  bool deterministic = false;  // it replays a step bit for bit (client.h DeclareDeterministic)
  // It does not know what it restored (start_step is 0): the first step it
  // reports says (client.h ReadyAtUnknownStep).
  bool start_step_unknown = false;
  // It rejoins, and then restores its part of the state from the tiers
  // (client.h RejoinRestore::kFromTiers: a sharded state).
  bool rejoin_from_tiers = false;
};

// "heartbeat": the worker is alive; `step` completed so far (-1: none yet).
struct HeartbeatMessage {
  int64_t step = -1;
};

// "step" or "skip" (a step skipped on purpose: ENDURE_SKIP_STEPS).
struct StepMessage {
  bool skipped = false;
  int64_t step = 0;
  // nullopt: none reported (absent or null). NaN and +-infinity arrive as
  // the strings "nan", "inf" and "-inf" (JSON has no such numbers).
  std::optional<double> loss;
  int64_t tokens = 0;       // 0: unknown
  int64_t total_steps = 0;  // the steps the run trains in all; 0: unknown
  double compute_s = 0;
  double comm_s = 0;
  double ckpt_stall_s = 0;
  int64_t checkpoint_step = -1;  // >= 0: this step committed a checkpoint
};

// "snapshot": the worker saved a shard into one of its T0 slots.
// The sender's shard is its rank (written as "shard" too, for readers that
// build a restore plan from the message).
struct SnapshotMessage {
  int64_t step = 0;
  int shards = 1;
  std::string path;  // one of the sender's T0 slots in this node's T0 directory
  // The payload's size and XXH3-64 (16 lowercase hex digits), as a restore
  // plan names them; 0 and empty when the sender did not say.
  int64_t bytes = 0;
  std::string xxh3;
};

// "fault": an injected fault is about to fire.
struct FaultMessage {
  std::string id;                                     // ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$
  faults::FaultKind kind = faults::FaultKind::kKill;  // one of faults::ParseFaultKind's names
  int64_t step = 0;
};

// "stacks": the signal on which the worker dumps its own stacks. Whether
// that signal is acceptable is the agent's decision (IsStackSignal), not the
// parser's.
struct StacksMessage {
  int signal = 0;
};

// Signals a worker may ask to be sent for a stack dump: SIGUSR1, SIGUSR2 or
// a real-time signal; never one whose default action a program relies on
// (SIGTERM, SIGINT, ...) or that cannot be caught (SIGKILL, SIGSTOP).
bool IsStackSignal(int64_t sig);

// "phase": the worker entered phase `name` having completed `step` steps
// (-1: before its first). "train" is where every worker starts.
struct PhaseMessage {
  std::string name;  // ^[a-z][a-z0-9_]{0,31}$
  int64_t step = -1;
};

// "fingerprint": the worker's parameters after the optimizer step of `step`
// (1-based), for the silent-data-corruption check.
struct FingerprintMessage {
  int64_t step = 0;         // >= 1
  std::string fingerprint;  // 16 lowercase hex digits (XXH3-64)
};

using DatagramMessage = std::variant<ReadyMessage, HeartbeatMessage, StepMessage, SnapshotMessage,
                                     FaultMessage, StacksMessage, PhaseMessage, FingerprintMessage>;

struct Datagram {
  std::string token;             // the sender's credential, at most 256 bytes
  int64_t generation = 0;        // 0 .. 2^31 - 1
  int rank = 0;                  // 0 .. kMaxWorldSize - 1; the gate checks it runs here
  std::optional<double> time_s;  // "t": the worker's wall clock, when it sent one
  DatagramMessage message;
};

// The type name a message travels under ("step", "skip", "ready", ...).
std::string_view DatagramType(const Datagram& d);

// What the parser needs to know about this node.
struct DatagramContext {
  // This node's T0 directory (ENDURE_T0_DIR); empty: checkpoints are off and
  // "snapshot" datagrams are refused.
  std::string t0_dir;
};

// Parses one datagram: a JSON object of at most kMaxDatagramBytes, nested at
// most 4 deep, with a known "type" and, for it, every field present of the
// right type and within range (unknown fields are ignored). A snapshot's
// path must name one of the sender's slots in `context.t0_dir`
// (checkpoint::SlotPath) after lexical normalisation. kInvalidArgument with
// the reason otherwise.
Result<Datagram> ParseDatagram(std::string_view bytes, const DatagramContext& context);

// The JSON the client library sends for `d`: what ParseDatagram reads back
// as `d` when every field is within the bounds above (a NaN or infinite
// loss travels as "nan", "inf" or "-inf"; optional fields at their defaults
// are left out). A value out of bounds is written as it is, and
// ParseDatagram refuses it with the field's name: a program's bad number
// costs its report, never the program.
std::string EncodeDatagram(const Datagram& d);

}  // namespace endure::contract

// The environment of a worker: the ENDURE_* variables by name.
namespace endure::worker_env {

// Always set.
inline constexpr char kAgentSocket[] = "ENDURE_AGENT_SOCKET";  // the agent's datagram socket
inline constexpr char kToken[] = "ENDURE_TOKEN";               // this generation's credential
inline constexpr char kGeneration[] = "ENDURE_GENERATION";
inline constexpr char kNodeId[] = "ENDURE_NODE_ID";
inline constexpr char kRestoreStep[] = "ENDURE_RESTORE_STEP";  // -1: start afresh
inline constexpr char kSkipSteps[] = "ENDURE_SKIP_STEPS";      // steps to skip, "3,17"
inline constexpr char kFaults[] = "ENDURE_FAULTS";             // this rank's injected faults (JSON)
inline constexpr char kStacksFile[] = "ENDURE_STACKS_FILE";    // where to dump its own stacks
// The job's checkpointing (the controller sets them from the spec).
inline constexpr char kCkptDir[] = "ENDURE_CKPT_DIR";
inline constexpr char kCkptEvery[] = "ENDURE_CKPT_EVERY";
inline constexpr char kSdcCheckEvery[] = "ENDURE_SDC_CHECK_EVERY";
inline constexpr char kHeartbeatInterval[] = "ENDURE_HEARTBEAT_INTERVAL";
// The node's memory tier, with checkpoints enabled.
inline constexpr char kT0Dir[] = "ENDURE_T0_DIR";
inline constexpr char kT0SlotBytes[] = "ENDURE_T0_SLOT_BYTES";
// Restores and in-process restarts.
inline constexpr char kRestorePlan[] = "ENDURE_RESTORE_PLAN";           // the plan, inline
inline constexpr char kRestorePlanFile[] = "ENDURE_RESTORE_PLAN_FILE";  // the plan, in a file
inline constexpr char kPeerRestore[] = "ENDURE_PEER_RESTORE";  // "1": take the state from a peer
inline constexpr char kRejoinFile[] = "ENDURE_REJOIN_FILE";    // where a rejoin offer appears
// A warm standby: started ahead of its generation, it waits for its start.
inline constexpr char kStandby[] = "ENDURE_STANDBY";
// Tags a worker and its descendants (the agent finds them by it).
inline constexpr char kWorkerTag[] = "ENDURE_WORKER_TAG";
// "1": a Python worker reports its optimizer's steps (python/endure/autostep.py).
inline constexpr char kAutostep[] = "ENDURE_AUTOSTEP";

}  // namespace endure::worker_env
