// GrpcTransport: the agents' streams over gRPC, the controller's real
// Transport. Each agent holds one bidirectional Attach call
// (proto/endure.proto), served by gRPC's callback API: no thread per
// stream (a few of gRPC's own serve them all), reads handed to the sink as
// they arrive, writes queued per stream and never waited for.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/mutex.h"
#include "common/tls.h"
#include "controller/transport.h"
#include "proto/endure.grpc.pb.h"

namespace endure::controller {

struct GrpcTransportOptions {
  std::string listen = "127.0.0.1:0";  // HOST:PORT; port 0 picks a free one
  int max_message_bytes = 4 << 20;     // one AgentEvent
  // Commands waiting to be written to one stream: an agent that reads none
  // of this many is cut (its node judged by the heartbeat rules), and the
  // controller never waits on it.
  int max_queued_commands = 1'000;
  // Mutual TLS with this identity (the controller's); nullopt: plain TCP.
  std::optional<tls::Identity> tls;
};

// Thread-safe. Start at most once; Shutdown (or the destructor) before the
// sink goes away.
class GrpcTransport final : public Transport, private proto::Controller::CallbackService {
 public:
  explicit GrpcTransport(GrpcTransportOptions options);
  ~GrpcTransport() override;
  GrpcTransport(const GrpcTransport&) = delete;
  GrpcTransport& operator=(const GrpcTransport&) = delete;

  Result<std::string> Start(TransportSink* sink) override;
  // Queues `command` on the stream; false when it has ended or its queue is
  // full (the stream is then cut).
  bool Send(ConnectionId id, const proto::AgentCommand& command) override;
  void Close(ConnectionId id) override;
  void Shutdown(Duration grace) override;

 private:
  class Call;  // one Attach: its reads, its queue of writes, its end

  grpc::ServerBidiReactor<proto::AgentEvent, proto::AgentCommand>* Attach(
      grpc::CallbackServerContext* context) override;
  // The one place the gRPC server is built: its address, credentials and
  // bounds. Returns the server and the port it bound (0: none).
  std::unique_ptr<grpc::Server> StartGrpcServer(int* port);
  // A call ends: no Send or Close reaches it from now on.
  void Forget(ConnectionId id);

  const GrpcTransportOptions o_;
  TransportSink* sink_ = nullptr;  // set by Start, before any call arrives
  std::unique_ptr<grpc::Server> server_;
  Mutex mu_;
  // Calls in progress. A call is erased (under mu_) before it finishes, and
  // Send and Close use it only under mu_: one found here is alive.
  std::map<ConnectionId, Call*> calls_ GUARDED_BY(mu_);
  int64_t next_id_ GUARDED_BY(mu_) = 0;
  bool shut_down_ GUARDED_BY(mu_) = false;
};

}  // namespace endure::controller
