// Worker datagrams: what a worker sends to its agent's Unix socket (the
// client library, include/endure/client.h, or a program that writes the same
// JSON) parsed into typed messages. Every field is checked for type, range
// and size before the agent uses it; anything else is refused with a reason,
// never thrown. Then the gate: only the current generation's credential, from
// a rank this node runs in it. Pure pieces, no I/O:
//
//   ParseDatagram     bytes -> Datagram (an envelope and one typed message)
//   DatagramGate      which parsed datagrams the agent accepts now
//   LogRateLimiter    which refusals are worth a line in the agent's log
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <variant>

#include "common/status.h"
#include "faults/fault.h"

namespace endure::agent {

// The largest datagram accepted; larger ones are refused (the receiver
// detects truncation).
inline constexpr size_t kMaxDatagramBytes = 64 * 1024;
// The most ranks a job has (bounds rank and shard numbers).
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;
// The largest step, token count or generation: what a double holds exactly.
inline constexpr int64_t kMaxCount = int64_t{1} << 53;
// The longest duration a step or start-up may report (seconds).
inline constexpr double kMaxSeconds = 1e7;

// "ready": the worker finished start-up (and its restore).
struct ReadyMessage {
  int64_t start_step = 0;  // the step it restored (0: fresh)
  double restore_s = 0;
  double init_s = 0;
  bool rejoin = false;         // it rejoins later generations in place (client.h Rejoin)
  bool deterministic = false;  // it replays a step bit for bit (client.h DeclareDeterministic)
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
struct SnapshotMessage {
  int64_t step = 0;
  int shards = 1;
  std::string path;  // one of the sender's two slots in this node's T0 directory
};

// "fault": an injected fault is about to fire.
struct FaultMessage {
  std::string id;                                     // ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$
  faults::FaultKind kind = faults::FaultKind::kKill;  // one of faults::ParseFaultKind's names
  int64_t step = 0;
};

// "stacks": the signal on which the worker dumps its own stacks. Whether
// that signal is acceptable is the agent's decision, not the parser's.
struct StacksMessage {
  int signal = 0;
};

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
// path must name one of the sender's two slots in `context.t0_dir`
// (checkpoint::SlotPath) after lexical normalisation. kInvalidArgument with
// the reason otherwise. Pure; never throws.
Result<Datagram> ParseDatagram(std::string_view bytes, const DatagramContext& context);

// What the agent accepts in the current generation: datagrams that carry
// `generation`, its credential, and a rank of `local_ranks`. Not
// thread-safe (a value the agent guards).
struct DatagramGate {
  enum class Verdict {
    kAccept,
    kStale,          // another generation's (late, or from a straggler): dropped quietly
    kBadCredential,  // not this generation's credential (the job token included)
    kForeignRank,    // a rank this node does not run in this generation
  };

  int64_t generation = -1;
  std::string credential;  // this generation's, handed to its workers as ENDURE_TOKEN
  std::set<int> local_ranks;

  // The credential is compared in constant time.
  Verdict Admit(const Datagram& d) const;
};

std::string_view VerdictName(DatagramGate::Verdict v);

// Lets through at most `burst` events at once and then one per `interval`
// (a token bucket), so that a flood of bad datagrams cannot flood the log;
// counts what it held back. Not thread-safe; time is passed in.
class LogRateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  LogRateLimiter(int burst, Clock::duration interval);

  // Whether an event at `now` is to be logged. When it is, `*suppressed`
  // (if given) is set to how many were held back since the last one logged.
  bool Allow(Clock::time_point now, int64_t* suppressed = nullptr);
  // How many were held back since the last one logged.
  int64_t held_back() const { return held_back_; }

 private:
  const int burst_;
  const Clock::duration interval_;
  Clock::duration credit_;
  std::optional<Clock::time_point> last_;
  int64_t held_back_ = 0;
};

}  // namespace endure::agent
