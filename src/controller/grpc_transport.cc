// The agents' streams over gRPC: one Attach call per agent, served by gRPC's
// callback API.
#include "controller/grpc_transport.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <optional>

namespace endure::controller {
namespace {

grpc::Status ToGrpc(const StreamVerdict& v) {
  switch (v.code) {
    case StreamVerdict::Code::kAccept:
      return grpc::Status::OK;
    case StreamVerdict::Code::kUnauthenticated:
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, v.message);
    case StreamVerdict::Code::kPermissionDenied:
      return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, v.message);
    case StreamVerdict::Code::kInvalidArgument:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, v.message);
    case StreamVerdict::Code::kResourceExhausted:
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, v.message);
  }
  return grpc::Status(grpc::StatusCode::INTERNAL, v.message);
}

}  // namespace

// One Attach call: it reads the agent's messages into the sink one after
// another, writes the commands queued for it one at a time, and finishes
// once its reads end (the agent hung up, Close cut it, the sink refused a
// message) and no write is in flight. gRPC deletes it (OnDone).
class GrpcTransport::Call final
    : public grpc::ServerBidiReactor<proto::AgentEvent, proto::AgentCommand> {
 public:
  Call(GrpcTransport* transport, grpc::CallbackServerContext* context, ConnectionId id)
      : transport_(transport), context_(context), id_(id) {}

  // The stream opened: the sink takes it (reads begin) or refuses it (it
  // finishes at once, and no OnClose follows).
  void Begin(const PeerInfo& peer) {
    const StreamVerdict opened = transport_->sink_->OnOpen(id_, peer);
    if (!opened.accepted()) {
      transport_->Forget(id_);
      Finish(ToGrpc(opened));
      return;
    }
    StartRead(&in_);
  }

  // Queues `command` (the transport holds its mutex: the call is alive).
  bool Queue(const proto::AgentCommand& command, int max_queued) {
    MutexLock lock(&mu_);
    if (ended_) return false;
    if (static_cast<int>(writes_.size()) >= max_queued) {
      // An agent that reads nothing: cut, never waited for.
      context_->TryCancel();
      return false;
    }
    writes_.push_back(command);
    if (!writing_) {
      writing_ = true;
      StartWrite(&writes_.front());
    }
    return true;
  }

  void Cancel() { context_->TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      if (hello_) {
        End(kStreamClosed, grpc::Status::OK);
      } else {
        End("no hello", grpc::Status(grpc::StatusCode::CANCELLED, "no hello"));
      }
      return;
    }
    const StreamVerdict v =
        hello_ ? transport_->sink_->OnEvent(id_, in_) : transport_->sink_->OnHello(id_, in_);
    hello_ = true;
    if (!v.accepted()) {
      End(v.message, ToGrpc(v));
      return;
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      MutexLock lock(&mu_);
      writes_.pop_front();
      if (!ok) writes_.clear();  // the stream broke: its reads end too
      if (!ended_ && !writes_.empty()) {
        StartWrite(&writes_.front());
        return;
      }
      writing_ = false;
      if (ended_) finish = status_;
    }
    if (finish) Finish(*finish);  // nothing touches the call after this
  }

  void OnDone() override { delete this; }

 private:
  // The reads ended: the sink hears of it, and the call finishes once no
  // write is in flight.
  void End(const std::string& reason, grpc::Status status) {
    transport_->Forget(id_);
    transport_->sink_->OnClose(id_, reason);
    {
      MutexLock lock(&mu_);
      ended_ = true;
      status_ = status;
      if (writing_) return;  // OnWriteDone finishes it
    }
    Finish(status);
  }

  GrpcTransport* const transport_;
  grpc::CallbackServerContext* const context_;
  const ConnectionId id_;
  proto::AgentEvent in_;  // the read in flight (one at a time)
  bool hello_ = false;    // the first message was read (touched by reads only)
  Mutex mu_;
  std::deque<proto::AgentCommand> writes_ GUARDED_BY(mu_);  // front: being written
  bool writing_ GUARDED_BY(mu_) = false;
  bool ended_ GUARDED_BY(mu_) = false;
  grpc::Status status_ GUARDED_BY(mu_);
};

GrpcTransport::GrpcTransport(GrpcTransportOptions options) : o_(std::move(options)) {}

GrpcTransport::~GrpcTransport() { Shutdown(Duration(0)); }

std::unique_ptr<grpc::Server> GrpcTransport::StartGrpcServer(int* port) {
  grpc::ServerBuilder builder;
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (o_.tls) {
    // Mutual TLS: the agent's certificate must chain to the job's CA (gRPC
    // verifies it in the handshake); the shell then checks its name.
    grpc::SslServerCredentialsOptions ssl(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = o_.tls->ca_pem;
    ssl.pem_key_cert_pairs.push_back({o_.tls->key_pem, o_.tls->cert_pem});
    credentials = grpc::SslServerCredentials(ssl);
  }
  builder.AddListeningPort(o_.listen, credentials, port);
  builder.SetMaxReceiveMessageSize(o_.max_message_bytes);
  builder.RegisterService(this);
  return builder.BuildAndStart();
}

Result<std::string> GrpcTransport::Start(TransportSink* sink) {
  sink_ = sink;
  int port = 0;
  server_ = StartGrpcServer(&port);
  if (!server_ || port == 0) {
    server_.reset();
    return InvalidArgument("--listen: cannot listen on '" + o_.listen + "'");
  }
  return o_.listen.substr(0, o_.listen.rfind(':')) + ":" + std::to_string(port);
}

void GrpcTransport::Forget(ConnectionId id) {
  MutexLock lock(&mu_);
  calls_.erase(id);
}

bool GrpcTransport::Send(ConnectionId id, const proto::AgentCommand& command) {
  MutexLock lock(&mu_);
  auto it = calls_.find(id);
  return it != calls_.end() && it->second->Queue(command, o_.max_queued_commands);
}

void GrpcTransport::Close(ConnectionId id) {
  MutexLock lock(&mu_);
  auto it = calls_.find(id);
  // The call's read then fails, and its OnClose follows.
  if (it != calls_.end()) it->second->Cancel();
}

void GrpcTransport::Shutdown(Duration grace) {
  {
    MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  if (!server_) return;
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(grace));
  server_->Wait();
}

grpc::ServerBidiReactor<proto::AgentEvent, proto::AgentCommand>* GrpcTransport::Attach(
    grpc::CallbackServerContext* context) {
  Call* call;
  {
    MutexLock lock(&mu_);
    const ConnectionId id{next_id_++};
    call = new Call(this, context, id);
    calls_[id] = call;
  }
  PeerInfo peer{.address = context->peer()};
  if (o_.tls) {
    // Set only for a certificate gRPC verified against the CA.
    const std::vector<grpc::string_ref> names =
        context->auth_context()->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
    peer.certificate_name = names.size() == 1 ? std::string(names[0].data(), names[0].size()) : "";
  }
  call->Begin(peer);
  return call;
}

}  // namespace endure::controller
