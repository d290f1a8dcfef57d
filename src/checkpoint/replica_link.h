// Replica link: pushes a checkpoint shard snapshot (bytes in memory, up to
// about 1 GB) over TCP to a peer node's agent, which keeps it in memory (tier
// T1, "peer memory"), so that a node lost with its disk can be restored from
// a neighbour.
//
// Protocol, one replica per connection:
//   sender   -> "ENDREPL1", u32 big-endian length, JSON header (token and the
//               ReplicaHeader fields; at most 64 KiB)
//   receiver -> "GO\n" when it will take the payload, else "ERR CODE reason\n"
//   sender   -> `bytes` payload bytes
//   receiver -> "OK\n" once the payload is kept, else "ERR CODE reason\n"
// CODE is a StatusCodeName ("DATA_LOSS", "INVALID_ARGUMENT"). The receiver
// answers before the payload is sent so that a refused replica (wrong token,
// too large) costs no transfer and its reason always reaches the sender.
//
// With a tls::Context (common/tls.h) on both sides, the connection starts
// with a mutual TLS 1.3 handshake and all of the above travels inside it:
// the receiver requires a client certificate from the job CA, the sender
// verifies the receiver's chain against the same CA, and the receiver takes
// a frame only from the node its certificate names (header.node == the
// certificate's CN). The job token is checked as well.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "common/duration.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/tls.h"

namespace endure::checkpoint {

// What a replica frame says about its payload.
struct ReplicaHeader {
  std::string node;    // the sending node's name, e.g. "node0"
  int shard = 0;       // the shard (= the rank that saved it)
  int shards = 1;      // how many shards the step has (world size)
  int64_t step = 0;    // training steps completed when saved
  uint64_t bytes = 0;  // payload size
  uint64_t xxh3 = 0;   // XXH3-64 of the payload
};

// A frame's header as it travels: the job token and what it says about the
// payload.
struct ReplicaFrame {
  std::string token;
  ReplicaHeader header;
};

// The bytes a sender writes before the payload: the magic, the u32
// big-endian length and the JSON header. kInvalidArgument when the header
// exceeds 64 KiB (a node name that long).
Result<std::string> EncodeReplicaFrame(const std::string& token, const ReplicaHeader& header);

// Parses exactly what EncodeReplicaFrame writes, as the receiver does before
// it asks for the payload: the magic, a length of at most 64 KiB that equals
// what follows, and a JSON header with every field present, of its type and
// in range (0 <= shard < shards, step >= 0, xxh3 16 hex digits, a node name
// that IsValidNodeName accepts: the receiver names files after it). Pure; the
// error (kInvalidArgument) says what is wrong. The token is not checked
// here, nor the size against a limit.
Result<ReplicaFrame> DecodeReplicaFrame(std::string_view bytes);

// Where the receiver puts one replica's payload, as it arrives: Write gets
// the payload's bytes in order, in chunks, and Commit follows once all of
// them have come and match the frame's checksum. A target destroyed without
// Commit (the sender broke off, the checksum did not match) drops what it
// was given. Each call returns an error to refuse the replica.
class ReplicaTarget {
 public:
  virtual ~ReplicaTarget() = default;
  virtual Status Write(std::string_view chunk) = 0;
  virtual Status Commit() = 0;
};

// Receives replicas on a background thread it owns. For each frame whose
// token and size (<= max_bytes) are right, asks `sink` for a target before
// it asks for the payload (the sink may refuse: its error goes back to the
// sender), streams the payload into the target while it hashes it (one pass:
// no copy of the whole payload is made here), and commits it when the
// checksum matches; anything else (wrong token, bad magic, malformed header,
// oversize, truncated, checksum mismatch) is refused: an error reply, the
// connection closed, errors() incremented and last_error() set. A target is
// never committed with bad data.
//
// With TLS, a sender that does not complete the handshake (no certificate,
// one from another CA, no TLS at all) is refused the same way, and so is a
// frame whose header.node is not the node its certificate names; a sender
// that speaks the protocol without TLS reads an "ERR INVALID_ARGUMENT" reply
// saying that TLS is required.
//
// Connections are served one at a time; a sender that makes no progress for
// 10 s (handshake included) is cut off, so a stalled peer delays others at
// most that long. The accessors are thread-safe. The sink and its targets
// must not throw and must not destroy the server; while a replica is being
// received, no other is.
class ReplicaServer {
 public:
  using Sink = std::function<Result<std::unique_ptr<ReplicaTarget>>(const ReplicaHeader&)>;
  // A sink that hands each verified payload, whole, to `keep` (tests, tools).
  static Sink WholePayloads(std::function<void(const ReplicaHeader&, std::string payload)> keep);

  // Listens on host:port (port 0: any free port; host "" or "0.0.0.0": all
  // interfaces). `max_bytes` bounds the payload: a frame that claims more is
  // refused before its payload is asked for. The server itself holds one
  // chunk of a payload at a time (WholePayloads' targets grow as the bytes
  // arrive, never zero-filled up front for the size the frame claims).
  // `tls`: mutual TLS with this identity on every connection; nullptr for
  // plain TCP. kIOError when the address cannot be resolved or bound,
  // kInvalidArgument when max_bytes is 0 or `sink` is empty.
  static Result<std::unique_ptr<ReplicaServer>> Start(
      const std::string& host, int port, std::string token, uint64_t max_bytes, Sink sink,
      std::shared_ptr<const tls::Context> tls = nullptr);

  // Stops accepting, cuts the connection being served (its sender sees
  // kUnavailable) and joins the thread. Returns promptly, unless the sink or
  // a target is running, which it waits for.
  ~ReplicaServer();

  ReplicaServer(const ReplicaServer&) = delete;
  ReplicaServer& operator=(const ReplicaServer&) = delete;

  // The port it listens on (the one picked when Start was given 0).
  int port() const { return port_; }
  // Replicas committed to their targets.
  int64_t received() const { return received_.load(); }
  // Connections refused or broken off, and failed accepts.
  int64_t errors() const { return errors_.load(); }
  // Why the last refused connection was refused; empty when none was.
  std::string last_error() const;
  // A new bound on the payload (> 0) for the frames that arrive from now on
  // (a generation's memory budget).
  void set_max_bytes(uint64_t max_bytes);
  uint64_t max_bytes() const { return max_bytes_.load(); }
  // Whether connections must use mutual TLS.
  bool uses_tls() const { return tls_ != nullptr; }

 private:
  ReplicaServer(int listen_fd, int stop_fd, int port, std::string token, uint64_t max_bytes,
                Sink sink, std::shared_ptr<const tls::Context> tls);

  void Serve();
  // Serves one connection, takes ownership of `fd` and closes it.
  void HandleConnection(int fd, const std::string& peer);
  void RecordError(const std::string& message);

  const int listen_fd_;
  const int stop_fd_;  // an eventfd the destructor makes readable, to stop every wait in Serve()
  const int port_;
  const std::string token_;
  std::atomic<uint64_t> max_bytes_;
  const Sink sink_;
  const std::shared_ptr<const tls::Context> tls_;  // null: plain TCP
  std::unique_ptr<char[]> chunk_;  // the payload passes through it, a chunk at a time
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> received_{0};
  std::atomic<int64_t> errors_{0};
  mutable Mutex mu_;
  std::string last_error_ GUARDED_BY(mu_);
  std::thread thread_;  // runs Serve(); started last, joined by the destructor
};

// Sends one replica to "host:port" ("[v6addr]:port" also works) and waits for
// the acknowledgement, at most `timeout` in all. `header.bytes` must equal
// payload.size() (kInvalidArgument otherwise); `header.xxh3` is sent as given,
// so the receiver checks the payload against the checksum taken when the
// snapshot was made. Returns kUnavailable when the peer cannot be reached, the
// connection breaks or `timeout` passes (the message says which), and the
// peer's code (kDataLoss, kInvalidArgument) and reason when it refuses the
// replica. `cancel_fd` (optional, e.g. an eventfd): once it is readable,
// every wait ends at once with kUnavailable (the sender shuts down).
// `tls`: mutual TLS with this identity (its name should be header.node, which
// the receiver checks); the handshake counts against `timeout`, and a
// handshake that fails (the receiver's certificate is not from the job CA,
// the receiver refused ours, the receiver does not use TLS) is kUnavailable
// with the reason. nullptr for plain TCP.
Status SendReplica(const std::string& address, const std::string& token,
                   const ReplicaHeader& header, std::string_view payload, Duration timeout,
                   int cancel_fd = -1, std::shared_ptr<const tls::Context> tls = nullptr);

}  // namespace endure::checkpoint
