// The agents' streams over gRPC: one Attach call per agent, read on its own
// server thread.
#include "controller/grpc_transport.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

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
  // Each stream holds a thread of the synchronous server: bounded with the
  // connections (the sink refuses beyond them), plus the server's own pollers.
  grpc::ResourceQuota quota("endure-controller");
  quota.SetMaxThreads(o_.max_threads);
  builder.SetResourceQuota(quota);
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

std::shared_ptr<GrpcTransport::Call> GrpcTransport::Find(ConnectionId id) {
  MutexLock lock(&mu_);
  auto it = calls_.find(id);
  return it == calls_.end() ? nullptr : it->second;
}

bool GrpcTransport::Send(ConnectionId id, const proto::AgentCommand& command) {
  std::shared_ptr<Call> call = Find(id);
  if (!call) return false;
  MutexLock lock(&call->mu);
  return call->open && call->stream->Write(command);
}

void GrpcTransport::Close(ConnectionId id) {
  MutexLock lock(&mu_);
  auto it = calls_.find(id);
  // Under mu_: the call's Attach erases it, under mu_, before it returns and
  // its context goes away. The stream's Read then fails and OnClose follows.
  if (it != calls_.end()) it->second->context->TryCancel();
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

grpc::Status GrpcTransport::Attach(grpc::ServerContext* context, Stream* stream) {
  auto call = std::make_shared<Call>(stream, context);
  ConnectionId id;
  {
    MutexLock lock(&mu_);
    id = ConnectionId{next_id_++};
    calls_[id] = call;
  }
  auto forget = [&] {
    {
      MutexLock lock(&call->mu);
      call->open = false;
    }
    MutexLock lock(&mu_);
    calls_.erase(id);
  };
  PeerInfo peer{.address = context->peer()};
  if (o_.tls) {
    // Set only for a certificate gRPC verified against the CA.
    const std::vector<grpc::string_ref> names =
        context->auth_context()->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
    peer.certificate_name = names.size() == 1 ? std::string(names[0].data(), names[0].size()) : "";
  }
  const StreamVerdict opened = sink_->OnOpen(id, peer);
  if (!opened.accepted()) {
    forget();
    return ToGrpc(opened);
  }
  grpc::Status status = grpc::Status::OK;
  std::string reason = kStreamClosed;
  proto::AgentEvent e;
  if (!stream->Read(&e)) {
    reason = "no hello";
    status = grpc::Status(grpc::StatusCode::CANCELLED, reason);
  } else {
    StreamVerdict v = sink_->OnHello(id, e);
    while (v.accepted() && stream->Read(&e)) v = sink_->OnEvent(id, e);
    if (!v.accepted()) {
      reason = v.message;
      status = ToGrpc(v);
    }
  }
  forget();
  sink_->OnClose(id, reason);
  return status;
}

}  // namespace endure::controller
