// The gRPC transport: Controller.Attach, a channel and a call per stream.
#include "agent/grpc_transport.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/mutex.h"
#include "proto/endure.grpc.pb.h"

namespace endure::agent {
namespace {

// How long Attach() tries to reach the controller.
constexpr auto kConnectFor = std::chrono::seconds(15);
// How often it asks whether to give up meanwhile, and the pause after a
// round of addresses that none answered.
constexpr auto kConnectPoll = std::chrono::milliseconds(250);
// With several addresses, how long one that neither answers nor refuses
// (a host that is down) holds up the others.
constexpr auto kTryEachFor = std::chrono::seconds(2);

// The one place the channel to the controller, and its credentials, are made.
std::shared_ptr<grpc::Channel> MakeControllerChannel(const std::string& address,
                                                     const std::optional<tls::Identity>& identity) {
  grpc::ChannelArguments args;
  // A channel of its own per attempt, so that a refused attempt is not
  // answered from a subchannel shared with an earlier one, still in gRPC's
  // reconnection backoff (a second and more).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (!identity) {
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  }
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = identity->ca_pem;
  ssl.pem_private_key = identity->key_pem;
  ssl.pem_cert_chain = identity->cert_pem;
  // The controller is whoever holds the job CA's "controller" certificate,
  // wherever it runs: its name is checked, not the address's.
  args.SetSslTargetNameOverride(tls::kControllerName);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

// Whether `channel` connects by `until`: false as soon as the connection
// is refused (the channel fails transiently), or once `stop` says so.
bool Connects(grpc::Channel& channel, std::chrono::steady_clock::time_point until,
              const std::function<bool()>& stop) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) return false;
    const auto now = std::chrono::steady_clock::now();
    if (stop() || now >= until) return false;
    channel.WaitForStateChange(
        state, std::chrono::system_clock::now() +
                   std::min<std::chrono::steady_clock::duration>(kConnectPoll, until - now));
    state = channel.GetState(/*try_to_connect=*/true);
  }
  return true;
}

class GrpcTransport : public Transport {
 public:
  GrpcTransport(AgentOptions options, std::optional<tls::Identity> identity)
      : o_(std::move(options)),
        identity_(std::move(identity)),
        addresses_(ControllerAddresses(o_.controller)) {}

  Status Attach(const std::function<bool()>& give_up) override {
    if (cancelled_) return Unavailable("cancelled");
    const auto stop = [&] { return give_up() || cancelled_; };
    // A fresh channel and call per stream: a ClientContext serves one call.
    // Each address in turn, from the one that answered last: a standby
    // controller does not listen, so the leader is the one that connects.
    std::shared_ptr<grpc::Channel> channel;
    const auto connect_by = std::chrono::steady_clock::now() + kConnectFor;
    while (!channel && !stop() && std::chrono::steady_clock::now() < connect_by) {
      for (size_t i = 0; i < addresses_.size() && !channel && !stop(); ++i) {
        const size_t at = (current_ + i) % addresses_.size();
        std::shared_ptr<grpc::Channel> candidate = MakeControllerChannel(addresses_[at], identity_);
        const auto until =
            addresses_.size() == 1
                ? connect_by
                : std::min(connect_by, std::chrono::steady_clock::now() + kTryEachFor);
        if (Connects(*candidate, until, stop)) {
          channel = std::move(candidate);
          current_ = at;
        }
      }
      if (!channel) {
        const auto pause = std::chrono::steady_clock::now() + kConnectPoll;
        while (!stop() && std::chrono::steady_clock::now() < pause) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
    }
    if (!channel) return Unavailable("cannot reach the controller at " + o_.controller);
    MutexLock lock(&mu_);
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
    MutexLock lock(&mu_);
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
  const std::vector<std::string> addresses_;
  size_t current_ = 0;  // the address tried first: the one that answered last
  std::atomic<bool> cancelled_{false};
  // Replaced by Attach (under mu_, so that Cancel() finds the current call);
  // Send, Read, CloseWrites and Finish use them between two Attach calls.
  Mutex mu_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Controller::Stub> stub_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<proto::AgentEvent, proto::AgentCommand>> stream_;
};

}  // namespace

std::vector<std::string> ControllerAddresses(const std::string& controller) {
  std::vector<std::string> addresses;
  size_t start = 0;
  while (start <= controller.size()) {
    const size_t comma = std::min(controller.find(',', start), controller.size());
    if (comma > start) addresses.push_back(controller.substr(start, comma - start));
    start = comma + 1;
  }
  return addresses;
}

std::unique_ptr<Transport> NewGrpcTransport(const AgentOptions& options,
                                            std::optional<tls::Identity> identity) {
  return std::make_unique<GrpcTransport>(options, std::move(identity));
}

}  // namespace endure::agent
