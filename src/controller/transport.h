// Transport: the agents' connections as the controller's event loop sees
// them, so that its logic can be tested without sockets. An agent opens a
// stream, says hello (its Register), sends AgentEvents up and receives
// AgentCommands down until one side ends the stream. GrpcTransport
// (grpc_transport.h) is the real one, FakeTransport (fake_transport.h) the
// one tests drive by hand.
//
// The transport only carries messages: the controller (a TransportSink)
// decides whether to take a stream, checks the token and the registration,
// and says when a stream must end.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>

#include "common/duration.h"
#include "common/status.h"
#include "proto/endure.pb.h"

namespace endure::controller {

// One agent's stream, from its opening to its end. Ids are never reused
// within a transport.
struct ConnectionId {
  int64_t value = -1;

  friend auto operator<=>(ConnectionId, ConnectionId) = default;
};

// What the transport knows of who opened a stream.
struct PeerInfo {
  std::string address;  // gRPC's peer string, e.g. "ipv4:10.0.0.7:51234" (for messages)
  // The CN of the certificate the peer presented, verified against the job's
  // CA; nullopt on a transport without TLS.
  std::optional<std::string> certificate_name;
};

// The reason a stream ends when its agent hung up, or when the transport
// cut it (TransportSink::OnClose).
inline constexpr char kStreamClosed[] = "the agent's stream closed";

// The controller's answer to an opening stream or a message on it. A
// refusal ends the stream; the agent sees the code and the message (gRPC: as
// the call's status).
struct StreamVerdict {
  enum class Code {
    kAccept,
    kUnauthenticated,
    kPermissionDenied,
    kInvalidArgument,
    kResourceExhausted
  };
  Code code = Code::kAccept;
  std::string message;  // for the agent's operator; empty when accepted

  bool accepted() const { return code == Code::kAccept; }
  static StreamVerdict Accept() { return {}; }
  static StreamVerdict Refuse(Code code, std::string message) { return {code, std::move(message)}; }
};

// What a transport tells the controller. Calls for different streams may
// come concurrently, from the transport's threads; calls for one stream come
// in order: OnOpen; if accepted, OnHello with its first message (if one
// came), OnEvent for each later one while they are accepted, and then
// OnClose exactly once, whatever ended the stream (a refused hello or event
// included). A transport never holds a lock of its own while it calls in,
// so an implementation may call the transport's Send and Close from them.
class TransportSink {
 public:
  virtual ~TransportSink() = default;

  // A stream opened. A refusal ends it at once (no OnClose follows).
  virtual StreamVerdict OnOpen(ConnectionId id, const PeerInfo& peer) = 0;
  // The stream's first message, which must register the agent.
  virtual StreamVerdict OnHello(ConnectionId id, const proto::AgentEvent& first) = 0;
  // A message after the hello.
  virtual StreamVerdict OnEvent(ConnectionId id, const proto::AgentEvent& event) = 0;
  // The stream ended: kStreamClosed when the agent hung up or Close cut it,
  // "no hello" when it ended before its first message, or the message of
  // the refusal that ended it.
  virtual void OnClose(ConnectionId id, const std::string& reason) = 0;
};

// The controller's side of the agents' streams. Thread-safe.
class Transport {
 public:
  virtual ~Transport() = default;

  // Starts taking streams, delivering them to `sink`, which must outlive
  // Shutdown. Returns the address agents connect to (host:port); an error
  // when the transport cannot listen.
  [[nodiscard]] virtual Result<std::string> Start(TransportSink* sink) = 0;
  // Sends `command` down stream `id`. Returns false, sending nothing, when
  // the stream has ended (or is ending). May block while the stream's
  // agent is slow to read.
  virtual bool Send(ConnectionId id, const proto::AgentCommand& command) = 0;
  // Cuts stream `id` (the agent sees it cancelled); its OnClose follows,
  // possibly from within this call. A no-op for a stream that has ended.
  virtual void Close(ConnectionId id) = 0;
  // Stops taking streams and ends those still open after `grace`. Returns
  // once every OnClose has been delivered: no call into the sink follows.
  virtual void Shutdown(Duration grace) = 0;
};

}  // namespace endure::controller
