// The agent's side of the worker datagrams (contract/worker_contract.h:
// the messages, ParseDatagram and the bounds, shared with the client
// library that writes them). The gate: only the current generation's
// credential, from a rank this node runs in it. Pure pieces, no I/O:
//
//   DatagramGate      which parsed datagrams the agent accepts now
//   LogRateLimiter    which refusals are worth a line in the agent's log
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "contract/worker_contract.h"

namespace endure::core {

using contract::Datagram;
using contract::DatagramContext;
using contract::DatagramMessage;
using contract::DatagramType;
using contract::FaultMessage;
using contract::FingerprintMessage;
using contract::HeartbeatMessage;
using contract::kMaxDatagramBytes;
using contract::ParseDatagram;
using contract::PhaseMessage;
using contract::ReadyMessage;
using contract::SnapshotMessage;
using contract::StacksMessage;
using contract::StepMessage;

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

}  // namespace endure::core
