// The agents' pairwise collective test (Acme, NSDI'24): when a collective
// failure is ambiguous, the controller pairs nodes and each pair's agents
// allreduce (sum) a float buffer over TCP, so that the node whose network
// fails or is slow shows up in the pairs it is part of. The pairing and the
// verdict are src/core/pairwise.h; this is the transfer between two agents.
//
// Protocol, one test per connection (A: the client, RunPairTest; B: the
// server, PairTestServer):
//   A -> B  "ENDPAIR1", u32 big-endian length, JSON {token, node, bytes}
//           (at most 4 KiB; `bytes` is the buffer size in bytes, a positive
//           multiple of 4, at most the server's max_bytes <= 64 MiB)
//   B -> A  "GO\n", or "ERR CODE reason\n" and the connection closed
//   A -> B  A's buffer (`bytes` bytes of floats)
//   B -> A  B's buffer
//           each side now holds the sum A + B (float addition is
//           commutative, so both sums are bitwise equal when the link
//           delivered both buffers intact)
//   A -> B  "SUM <16 hex digits>\n", the XXH3-64 of A's sum
//   B -> A  "OK\n" when it equals B's, else "ERR DATA_LOSS reason\n"
// CODE is a StatusCodeName, as on the replica link. The directions take
// turns rather than overlap: the test is about whether each direction
// delivers, in what time, and taking turns keeps every step a plain
// read-or-write under one deadline, inside TLS too.
//
// With a tls::Context on both sides, the connection starts with a mutual TLS
// 1.3 handshake (the job CA's certificates, as on the replica link) and the
// server takes a test only from the node its client certificate names
// (header.node == CN); the token is checked as well.
//
// Faults (issue 12's comm-fail and comm-slow): a node's agent sets a
// PairFault on its server and passes it to its own RunPairTest calls, so
// that a pair test through a faulty node fails or is slow like its
// collectives would.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "common/duration.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/tls.h"

namespace endure::agent {

// The largest buffer a pair test moves (each way).
inline constexpr uint64_t kMaxPairTestBytes = 64ull << 20;

// How this node's side of a pair test misbehaves.
struct PairFault {
  enum class Kind {
    kNone,
    // The server refuses every test with "ERR UNAVAILABLE injected comm-fail
    // ..."; the client breaks the connection after the go-ahead, before its
    // buffer, and reports "injected comm-fail".
    kFail,
    // This side waits before it sends: the server before its buffer by
    // (factor - 1) x the time A's buffer took to arrive, the client before its
    // checksum by (factor - 1) x the time the two buffers took; at least
    // 50 ms x (factor - 1) either way.
    kSlow,
  };
  Kind kind = Kind::kNone;
  double factor = 1;  // kSlow only: in (1, 100]

  static PairFault None() { return {}; }
  static PairFault Fail() { return {Kind::kFail, 1}; }
  static PairFault Slow(double factor) { return {Kind::kSlow, factor}; }

  // kInvalidArgument for a kSlow factor outside (1, 100] (the message says so).
  Status Validate() const;
  // "none", "fail", "slow x3".
  std::string ToString() const;
};

struct PairTestServerOptions {
  std::string host = "0.0.0.0";  // "0.0.0.0": every IPv4 interface; "": every interface
  int port = 0;                  // 0: any free port, see port()
  std::string token;             // the job token every test must carry (non-empty)
  std::string node;              // this node's name, in replies and errors (IsValidNodeName)
  uint64_t max_bytes = kMaxPairTestBytes;  // in (0, kMaxPairTestBytes]
  // A client that makes no progress for this long is cut off; the server
  // serves one test at a time, so this bounds what a stalled client costs
  // the next one.
  Duration idle_limit = std::chrono::seconds(10);
  // Mutual TLS with this identity on every connection; nullptr: plain TCP
  // (the token still has to match).
  std::shared_ptr<const tls::Context> tls;

  // kInvalidArgument naming the field.
  Status Validate() const;
};

// Answers pair tests on a background thread it owns, one connection at a
// time. A test whose frame is malformed, oversized, carries the wrong token
// or (with TLS) names a node other than its certificate's, is refused with
// "ERR CODE reason\n" before any buffer moves; errors() and last_error() say
// so. Memory: at most two buffers of max_bytes while a test runs, allocated
// only once the frame passed its checks. Thread-safe accessors and setter.
class PairTestServer {
 public:
  // Binds and starts serving. kInvalidArgument for bad options, kIOError
  // when the address cannot be resolved or bound.
  static Result<std::unique_ptr<PairTestServer>> Start(PairTestServerOptions options);

  // Stops accepting, cuts the test in progress (a slow fault's wait too) and
  // joins the thread; returns promptly.
  ~PairTestServer();

  PairTestServer(const PairTestServer&) = delete;
  PairTestServer& operator=(const PairTestServer&) = delete;

  // The port it listens on (the one picked when the options said 0).
  int port() const { return port_; }
  // The fault applied to the tests that start from now on. kInvalidArgument
  // (and the previous fault kept) when it does not Validate.
  [[nodiscard]] Status set_fault(PairFault fault);
  PairFault fault() const;
  // Tests completed with a matching checksum.
  int64_t served() const { return served_.load(); }
  // Tests refused (injected faults included) or broken off, and failed accepts.
  int64_t errors() const { return errors_.load(); }
  // Why the last refused or broken test failed; empty when none did.
  std::string last_error() const;

 private:
  PairTestServer(int listen_fd, int stop_fd, int port, PairTestServerOptions options);

  void Serve();
  // Serves one connection; takes ownership of `fd` and closes it.
  void HandleConnection(int fd, const std::string& peer);
  void RecordError(const std::string& message);

  const int listen_fd_;
  const int stop_fd_;  // an eventfd the destructor makes readable, ending every wait
  const int port_;
  const PairTestServerOptions options_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> served_{0};
  std::atomic<int64_t> errors_{0};
  mutable Mutex mu_;
  PairFault fault_ GUARDED_BY(mu_);
  std::string last_error_ GUARDED_BY(mu_);
  std::thread thread_;  // runs Serve(); started last, joined by the destructor
};

// The peer to test against, and how.
struct PairTestTarget {
  std::string host;  // the peer agent's address (name, IPv4 or IPv6)
  int port = 0;      // its PairTestServer's port
  std::string token;
  std::string node;             // this node's name, sent in the frame (IsValidNodeName)
  uint64_t bytes = 4ull << 20;  // buffer size in bytes: a positive multiple of 4, <= 64 MiB
  Duration timeout = std::chrono::seconds(10);  // the whole test, connect and handshake included
  std::shared_ptr<const tls::Context> tls;      // mutual TLS; nullptr: plain TCP
  int cancel_fd = -1;  // optional: once readable (an eventfd), the test ends at once
};

struct PairOutcome {
  bool ok = false;
  double seconds = 0;  // from connecting to the peer's "OK" (also set when the test failed)
  std::string error;   // why it failed: "timed out after 10s (waiting on the go-ahead)", ...
};

// Runs one pair test as the client, with this node's `local_fault`; blocks
// for at most target.timeout (+ a few ms), never longer.
// A non-OK Status means the test could not be run as asked, which says
// nothing about either node's network: kInvalidArgument for a bad target or
// fault, and the peer's refusal of the request itself (wrong token, a size
// over its limit, a malformed frame: its kInvalidArgument reason). Every
// failure of the link or of a node (cannot connect, broken connection,
// timeout, an injected fault on either side, a checksum mismatch) is an
// outcome with ok = false and the reason.
Result<PairOutcome> RunPairTest(const PairTestTarget& target, PairFault local_fault);

}  // namespace endure::agent
