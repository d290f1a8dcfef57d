// The gRPC transport: Controller.Attach, a channel and a call per stream.
#include "agent/grpc_transport.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <mutex>

#include "proto/endure.grpc.pb.h"

namespace endure::agent {
namespace {

// How long Attach() tries to reach the controller.
constexpr auto kConnectFor = std::chrono::seconds(15);
// How often it asks whether to give up meanwhile.
constexpr auto kConnectPoll = std::chrono::milliseconds(250);

// The one place the channel to the controller, and its credentials, are made.
std::shared_ptr<grpc::Channel> MakeControllerChannel(const AgentOptions& options,
                                                     const std::optional<tls::Identity>& identity) {
  if (!identity) return grpc::CreateChannel(options.controller, grpc::InsecureChannelCredentials());
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = identity->ca_pem;
  ssl.pem_private_key = identity->key_pem;
  ssl.pem_cert_chain = identity->cert_pem;
  grpc::ChannelArguments args;
  // The controller is whoever holds the job CA's "controller" certificate,
  // wherever it runs: its name is checked, not the address's.
  args.SetSslTargetNameOverride(tls::kControllerName);
  return grpc::CreateCustomChannel(options.controller, grpc::SslCredentials(ssl), args);
}

class GrpcTransport : public Transport {
 public:
  GrpcTransport(AgentOptions options, std::optional<tls::Identity> identity)
      : o_(std::move(options)), identity_(std::move(identity)) {}

  Status Attach(const std::function<bool()>& give_up) override {
    if (cancelled_) return Unavailable("cancelled");
    // A fresh channel and call per stream: a ClientContext serves one call.
    std::shared_ptr<grpc::Channel> channel = MakeControllerChannel(o_, identity_);
    const auto connect_by = std::chrono::steady_clock::now() + kConnectFor;
    bool connected = false;
    while (!connected && !give_up() && !cancelled_ &&
           std::chrono::steady_clock::now() < connect_by) {
      connected = channel->WaitForConnected(std::chrono::system_clock::now() + kConnectPoll);
    }
    if (!connected) return Unavailable("cannot reach the controller at " + o_.controller);
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return Unavailable("cancelled");
    // The previous call is finished (the agent's order of calls): its
    // stream goes before the context it runs in.
    stream_.reset();
    channel_ = std::move(channel);
    stub_ = proto::Controller::NewStub(channel_);
    context_ = std::make_unique<grpc::ClientContext>();
    stream_ = stub_->Attach(context_.get());
    return Status::Ok();
  }

  bool Send(const proto::AgentEvent& event) override { return stream_ && stream_->Write(event); }

  bool Read(proto::AgentCommand* command) override { return stream_ && stream_->Read(command); }

  void Cancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (context_) context_->TryCancel();
  }

  void CloseWrites() override {
    if (stream_) stream_->WritesDone();
  }

  Status Finish() override {
    if (!stream_) return Unavailable("no stream");
    const grpc::Status st = stream_->Finish();
    if (st.ok()) return Status::Ok();
    if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      return InvalidArgument(st.error_message());
    }
    return Unavailable(st.error_message());
  }

 private:
  const AgentOptions o_;
  const std::optional<tls::Identity> identity_;
  std::atomic<bool> cancelled_{false};
  // Replaced by Attach (under mu_, so that Cancel() finds the current call);
  // Send, Read, CloseWrites and Finish use them between two Attach calls.
  std::mutex mu_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Controller::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<proto::AgentEvent, proto::AgentCommand>> stream_;
};

}  // namespace

std::unique_ptr<Transport> NewGrpcTransport(const AgentOptions& options,
                                            std::optional<tls::Identity> identity) {
  return std::make_unique<GrpcTransport>(options, std::move(identity));
}

}  // namespace endure::agent
