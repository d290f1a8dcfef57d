// Fault injection: the faults Endure can inject into a training job, their
// JSON encoding (the ENDURE_FAULTS format the agent hands to each worker),
// validation, and a seeded Poisson schedule of faults for reliability runs.
//
// A fault fires once, either at a (rank, step) or at a time `at` after the
// job started. Step-keyed worker faults (kill, exit, hang, nan, slow, log,
// bitflip, comm-fail, comm-slow) are fired by the client library inside the
// worker; kill-agent and every `at`-scheduled fault are fired from outside
// the worker by the controller and agents. bitflip, comm-fail and comm-slow
// act inside the training step, so they are step-keyed only. Steps are 1-based step numbers: a
// fault at step s fires while the s-th step runs, the one whose "step" report says s (step index
// s-1).
//
// Everything here is a pure function; safe to call from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/duration.h"
#include "common/status.h"

namespace endure::faults {

enum class FaultKind {
  kKill,       // SIGKILL the rank at the start of its step
  kExit,       // the rank exits with `exit_code`
  kHang,       // the rank stops progressing inside the step (sleeps forever)
  kNan,        // the rank reports a NaN loss for the step
  kSlow,       // the rank runs `factor` times slower from the step on
  kLog,        // the rank prints `line` on stderr, then exits with 1
  kKillAgent,  // a whole node dies: its agent, its workers, its memory
  kDiskFull,   // the rank's node cannot persist checkpoints any more: ENOSPC
  kDiskError,  // the same with EIO
  kCorruptT0,  // a flipped byte in the rank's shard in its node's memory (T0), seen at the next
               // stop
  kCorruptT1,  // the same in the peer's replica of it (T1)
  kBitflip,    // silent data corruption: after the optimizer step, one bit of one parameter
               // element flips on the rank (`tensor`, `element`, `bit`)
  kCommFail,   // the rank's collectives fail from the step on: it exits with 1 before its
               // gradient allreduce, as after "Connection reset by peer"
  kCommSlow,   // the rank's collectives run `factor` times slower from the step on
  kSpike,      // the rank reports its loss times `factor` for the step: a one-off corruption of the
               // loss (the model is untouched), as a transient fault would make it
};

// "kill", "exit", "hang", "nan", "slow", "log", "kill-agent", "disk-full",
// "disk-error", "corrupt-t0", "corrupt-t1", "bitflip", "comm-fail", "comm-slow", "spike".
std::string_view FaultKindName(FaultKind kind);

// Whether the controller (through an agent) fires faults of `kind`, rather
// than the worker itself: kill-agent and the storage and memory faults.
bool FiredByController(FaultKind kind);
// The inverse of FaultKindName; the error lists the valid names.
Result<FaultKind> ParseFaultKind(std::string_view name);

struct Fault {
  std::string id;  // unique within a job; how a fired fault is remembered
  FaultKind kind = FaultKind::kKill;
  int rank = -1;               // the rank (worker faults), or a rank of the node (kill-agent)
  std::string node;            // kill-agent: the node id, e.g. "node1"
  int64_t step = -1;           // 1-based step number; -1: not step-keyed
  std::optional<Duration> at;  // time since the job started; nullopt: not time-keyed
  int exit_code = 1;           // kExit
  double factor = 2.0;         // kSlow, kCommSlow, kSpike
  std::string line;            // kLog
  // kBitflip: which bit of which parameter. `tensor` indexes the trainer's
  // parameters in their named order (taken modulo their count); `element`
  // is taken modulo the tensor's number of elements and `bit` modulo its
  // dtype's width in bits (0: the lowest bit of the element's bytes in host
  // order). The default, bit 30 of element 0 of the first tensor, is the
  // second-highest exponent bit of a float32: the value changes by a large
  // factor, so the corruption is not lost in rounding.
  int tensor = 0;
  int64_t element = 0;
  int bit = 30;

  bool operator==(const Fault&) const = default;
};

// Checks one fault. The message starts with "fault 'ID' (KIND): ".
// kill/exit/hang/nan/slow/log/bitflip/comm-fail/comm-slow need rank >= 0;
// kill-agent needs a node or a rank; each needs exactly one of step >= 1 and
// at >= 0 (bitflip, comm-fail and comm-slow: a step); exit needs exit_code
// in 1..255, slow and comm-slow a finite factor > 1, log a non-empty line,
// bitflip tensor >= 0, element >= 0 and bit in 0..63.
Status Validate(const Fault& fault);

// Validates every fault and checks that ids are non-empty and unique.
Status ValidateFaults(const std::vector<Fault>& faults);

// The ENDURE_FAULTS format: a JSON array of objects
//   {"id":"f1","kind":"kill","rank":1,"step":40}
//   {"id":"f2","kind":"exit","rank":0,"step":7,"exit_code":3}
//   {"id":"f3","kind":"slow","rank":1,"step":5,"factor":3.0}
//   {"id":"f4","kind":"log","rank":0,"step":9,"line":"NVRM: Xid (PCI:0000:3b:00): 79, ..."}
//   {"id":"f5","kind":"kill-agent","node":"node1","at":"90s"}
//   {"id":"f6","kind":"bitflip","rank":3,"step":40,"tensor":2,"element":17,"bit":62}
//   {"id":"f7","kind":"comm-slow","rank":2,"step":10,"factor":4.0}
// Keys that are not set (rank -1, step -1, no at, no node/line, default
// exit_code, factor, tensor, element and bit) are left out. "at" is a duration string such as
// "90s" or "1500ms" (exact to the nanosecond); a number is read as seconds.
std::string EncodeFaults(const std::vector<Fault>& faults);

// Parses the format above. An empty string or "[]" is no faults. Errors
// name the element and key, e.g. "faults[2].kind: unknown fault kind 'kil'
// (one of kill, exit, ...)"; unknown keys are refused the same way. Decoding
// does not Validate().
Result<std::vector<Fault>> DecodeFaults(std::string_view json);

// The most faults a seeded schedule may hold: each fault costs memory in the
// controller and is handed to the workers, so a schedule of millions (an
// mtbf of microseconds) is a mistake, refused with a message, not expanded.
inline constexpr int64_t kMaxScheduledFaults = 100'000;

// How many faults a schedule over `horizon` with mean time between faults
// `mtbf` holds on average: horizon / mtbf (+inf for mtbf <= 0).
double ExpectedFaultCount(Duration mtbf, Duration horizon);

// A seeded Poisson process of faults of `kind` over [0, horizon): inter-
// arrival times are exponential with mean `mtbf`, each fault has `at` set and
// a rank drawn uniformly from [0, world_size); ids are "sched-1", "sched-2",
// ... in time order. The same (mtbf, seed, horizon, world_size, kind) gives
// the same schedule on every platform: the draws are made from the raw bits
// of a std::mt19937_64 seeded with `seed`, not through <random>'s
// distributions. kExit faults get exit code 1, kSlow factor 2, kLog a line
// naming the fault. Requires mtbf > 0 and world_size >= 1 (ENDURE_CHECK).
//
// At most `max_faults`: kInvalidArgument, before anything is drawn, when
// the expected count (ExpectedFaultCount) exceeds it, and when the draw
// itself comes out larger (deterministic for a seed). The message says to
// raise the mtbf or shorten the horizon.
//
// `node_loss_share` (0..1): each fault is a kill-agent (its rank's node is
// lost) with this probability instead, drawn after its rank; 0 draws
// nothing more, so schedules without node losses stay as they were.
Result<std::vector<Fault>> PoissonSchedule(Duration mtbf, uint64_t seed, Duration horizon,
                                           int world_size, FaultKind kind = FaultKind::kKill,
                                           int64_t max_faults = kMaxScheduledFaults,
                                           double node_loss_share = 0);

// The faults the worker of `rank` fires itself: step-keyed (step >= 1, no
// `at`) worker faults of that rank whose id is not in `fired`, in input
// order. kill-agent and `at`-scheduled faults are left to the controller and
// agents.
std::vector<Fault> FaultsForRank(const std::vector<Fault>& faults, int rank,
                                 const std::set<std::string>& fired);

}  // namespace endure::faults
