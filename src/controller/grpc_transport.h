// GrpcTransport: the agents' streams over gRPC, the controller's real
// Transport. Each agent holds one bidirectional Attach call
// (proto/endure.proto); each call holds a thread of gRPC's synchronous
// server, which reads the agent's messages and hands them to the sink.
#pragma once

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
  // Threads of the synchronous server: one per open stream, plus pollers.
  // Streams beyond it wait for a thread; the sink bounds them first.
  int max_threads = 128;
  // Mutual TLS with this identity (the controller's); nullopt: plain TCP.
  std::optional<tls::Identity> tls;
};

// Thread-safe. Start at most once; Shutdown (or the destructor) before the
// sink goes away.
class GrpcTransport final : public Transport, private proto::Controller::Service {
 public:
  explicit GrpcTransport(GrpcTransportOptions options);
  ~GrpcTransport() override;
  GrpcTransport(const GrpcTransport&) = delete;
  GrpcTransport& operator=(const GrpcTransport&) = delete;

  Result<std::string> Start(TransportSink* sink) override;
  bool Send(ConnectionId id, const proto::AgentCommand& command) override;
  void Close(ConnectionId id) override;
  void Shutdown(Duration grace) override;

 private:
  using Stream = grpc::ServerReaderWriter<proto::AgentCommand, proto::AgentEvent>;
  // One open Attach call. `stream` and `context` belong to it; `open` turns
  // false (under `mu`) before the call returns, after which nobody writes.
  struct Call {
    Call(Stream* s, grpc::ServerContext* c) : stream(s), context(c) {}
    Mutex mu;
    Stream* stream GUARDED_BY(mu);  // valid while open
    bool open GUARDED_BY(mu) = true;
    grpc::ServerContext* const context;
  };

  grpc::Status Attach(grpc::ServerContext* context, Stream* stream) override;
  // The one place the gRPC server is built: its address, credentials and
  // bounds. Returns the server and the port it bound (0: none).
  std::unique_ptr<grpc::Server> StartGrpcServer(int* port);
  std::shared_ptr<Call> Find(ConnectionId id);

  const GrpcTransportOptions o_;
  TransportSink* sink_ = nullptr;  // set by Start, before any call arrives
  std::unique_ptr<grpc::Server> server_;
  Mutex mu_;
  // Calls in progress: an Attach erases its own before it returns, so a
  // context found here is alive.
  std::map<ConnectionId, std::shared_ptr<Call>> calls_ GUARDED_BY(mu_);
  int64_t next_id_ GUARDED_BY(mu_) = 0;
  bool shut_down_ GUARDED_BY(mu_) = false;
};

}  // namespace endure::controller
