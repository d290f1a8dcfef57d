// EtcdClient over gRPC: a channel per endpoint, one stub call per request.
#include "controller/etcd_client.h"

#include <grpcpp/grpcpp.h>

#include <charconv>

#include "proto/etcd.grpc.pb.h"

namespace endure::controller {
namespace {

namespace pb = etcdserverpb;

// An unreachable endpoint is tried again after this long at most: etcd
// restarting must not leave the client in gRPC's minutes-long backoff.
// (GRPC_ARG_MIN_RECONNECT_BACKOFF_MS stays as it is: it is the connect
// timeout too, and at 100 ms no connection to etcd completed here.)
constexpr int kMaxReconnectBackoffMs = 1000;

Status FromGrpc(const grpc::Status& st, const std::string& what, const std::string& endpoint) {
  return Unavailable("etcd at " + endpoint + ": " + what + ": " + st.error_message() + " (" +
                     std::to_string(static_cast<int>(st.error_code())) + ")");
}

// Whether a call's failure says the endpoint is out of reach (another may
// answer), rather than that etcd refused the request.
bool Unreachable(const grpc::Status& st) {
  return st.error_code() == grpc::StatusCode::UNAVAILABLE ||
         st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

std::chrono::system_clock::time_point WallDeadline(Clock::TimePoint deadline) {
  return std::chrono::system_clock::now() + (deadline - Clock::Real()->Now());
}

class GrpcEtcdClient : public EtcdClient {
 public:
  explicit GrpcEtcdClient(EtcdClientOptions options) : o_(std::move(options)) {
    for (const std::string& endpoint : o_.endpoints) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      std::shared_ptr<grpc::Channel> channel =
          grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args);
      kv_.push_back(pb::KV::NewStub(channel));
      lease_.push_back(pb::Lease::NewStub(channel));
    }
  }

  Status Ping(const std::string& key, Clock::TimePoint deadline) override {
    pb::RangeRequest request;
    request.set_key(key);
    pb::RangeResponse response;
    return Call("read", deadline, [&](grpc::ClientContext* c, size_t i) {
      return kv_[i]->Range(c, request, &response);
    });
  }

  Result<EtcdLease> GrantLease(Duration ttl, Clock::TimePoint deadline) override {
    pb::LeaseGrantRequest request;
    request.set_ttl(std::chrono::duration_cast<std::chrono::seconds>(ttl).count());
    pb::LeaseGrantResponse response;
    ENDURE_RETURN_IF_ERROR(Call("lease grant", deadline, [&](grpc::ClientContext* c, size_t i) {
      return lease_[i]->LeaseGrant(c, request, &response);
    }));
    if (!response.error().empty()) return Unavailable("etcd lease grant: " + response.error());
    return EtcdLease{.id = response.id(),
                     .ttl = std::chrono::seconds(response.ttl()),
                     .revision = response.header().revision()};
  }

  Result<EtcdLease> KeepAlive(int64_t id, Clock::TimePoint deadline) override {
    // A stream of one renewal: written, answered, closed, all within the
    // deadline, so that a stalled etcd cannot hold the leader past it.
    pb::LeaseKeepAliveRequest request;
    request.set_id(id);
    pb::LeaseKeepAliveResponse response;
    bool answered = false;
    ENDURE_RETURN_IF_ERROR(Call("lease keepalive", deadline, [&](grpc::ClientContext* c, size_t i) {
      auto stream = lease_[i]->LeaseKeepAlive(c);
      if (stream->Write(request)) answered = stream->Read(&response);
      stream->WritesDone();
      grpc::Status st = stream->Finish();
      if (answered) return grpc::Status::OK;
      return st.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "no answer") : st;
    }));
    return EtcdLease{.id = id,
                     .ttl = std::chrono::seconds(response.ttl()),
                     .revision = response.header().revision()};
  }

  Status RevokeLease(int64_t id, Clock::TimePoint deadline) override {
    pb::LeaseRevokeRequest request;
    request.set_id(id);
    pb::LeaseRevokeResponse response;
    return Call("lease revoke", deadline, [&](grpc::ClientContext* c, size_t i) {
      return lease_[i]->LeaseRevoke(c, request, &response);
    });
  }

  Result<EtcdCampaign> Campaign(const std::string& leader_key, const std::string& value,
                                int64_t lease, const std::string& finished_key, int64_t since,
                                Clock::TimePoint deadline) override {
    pb::TxnRequest request;
    // Nobody leads: the key does not exist (a missing key compares as
    // revision 0) ...
    pb::Compare* free = request.add_compare();
    free->set_key(leader_key);
    free->set_target(pb::Compare::CREATE);
    free->set_result(pb::Compare::EQUAL);
    free->set_create_revision(0);
    // ... and the job did not end after this candidate joined.
    pb::Compare* open = request.add_compare();
    open->set_key(finished_key);
    open->set_target(pb::Compare::MOD);
    open->set_result(pb::Compare::LESS);
    open->set_mod_revision(since + 1);
    pb::PutRequest* put = request.add_success()->mutable_request_put();
    put->set_key(leader_key);
    put->set_value(value);
    put->set_lease(lease);
    request.add_failure()->mutable_request_range()->set_key(leader_key);
    request.add_failure()->mutable_request_range()->set_key(finished_key);
    pb::TxnResponse response;
    ENDURE_RETURN_IF_ERROR(Call("campaign", deadline, [&](grpc::ClientContext* c, size_t i) {
      return kv_[i]->Txn(c, request, &response);
    }));
    EtcdCampaign out;
    out.won = response.succeeded();
    out.revision = response.header().revision();
    if (!out.won && response.responses_size() == 2) {
      for (const pb::KeyValue& kv : response.responses(0).response_range().kvs()) {
        out.leader = kv.value();
        out.leader_lease = kv.lease();
      }
      for (const pb::KeyValue& kv : response.responses(1).response_range().kvs()) {
        out.finished = kv.value();
        out.finished_revision = kv.mod_revision();
      }
    }
    return out;
  }

  Result<bool> Resign(const std::string& leader_key, int64_t lease, const std::string& finished_key,
                      const std::string& finished, Clock::TimePoint deadline) override {
    pb::TxnRequest request;
    pb::Compare* held = request.add_compare();
    held->set_key(leader_key);
    held->set_target(pb::Compare::LEASE);
    held->set_result(pb::Compare::EQUAL);
    held->set_lease(lease);
    pb::PutRequest* put = request.add_success()->mutable_request_put();
    put->set_key(finished_key);
    put->set_value(finished);
    request.add_success()->mutable_request_delete_range()->set_key(leader_key);
    pb::TxnResponse response;
    ENDURE_RETURN_IF_ERROR(Call("resign", deadline, [&](grpc::ClientContext* c, size_t i) {
      return kv_[i]->Txn(c, request, &response);
    }));
    return response.succeeded();
  }

 private:
  // Runs `call` against the current endpoint with `deadline`; one that is
  // out of reach sends the next call to the next endpoint.
  template <typename F>
  Status Call(const std::string& what, Clock::TimePoint deadline, F&& call) {
    const size_t i = current_;
    grpc::ClientContext context;
    context.set_deadline(WallDeadline(deadline));
    const grpc::Status st = call(&context, i);
    if (st.ok()) return Status::Ok();
    if (Unreachable(st)) current_ = (current_ + 1) % o_.endpoints.size();
    return FromGrpc(st, what, o_.endpoints[i]);
  }

  const EtcdClientOptions o_;
  std::vector<std::unique_ptr<pb::KV::Stub>> kv_;
  std::vector<std::unique_ptr<pb::Lease::Stub>> lease_;
  size_t current_ = 0;
};

}  // namespace

Status EtcdClientOptions::Validate() const {
  if (endpoints.empty()) return InvalidArgument("--etcd: no endpoint (host:port[,host:port])");
  if (timeout <= Duration::zero()) {
    return InvalidArgument("etcd: timeout must be positive, got " + FormatDuration(timeout));
  }
  return Status::Ok();
}

Result<std::vector<std::string>> ParseEtcdEndpoints(const std::string& text,
                                                    const std::string& flag) {
  std::vector<std::string> endpoints;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string endpoint = text.substr(start, comma - start);
    start = comma + 1;
    if (endpoint.rfind("http://", 0) == 0) endpoint = endpoint.substr(7);
    if (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    const size_t colon = endpoint.rfind(':');
    int port = 0;
    const char* digits = endpoint.data() + (colon == std::string::npos ? 0 : colon + 1);
    const char* end = endpoint.data() + endpoint.size();
    const auto [parsed, ec] = std::from_chars(digits, end, port);
    if (colon == std::string::npos || colon == 0 || ec != std::errc() || parsed != end ||
        port < 1 || port > 65535) {
      return InvalidArgument(flag + ": '" + endpoint +
                             "' is not HOST:PORT (etcd's client address, e.g. 127.0.0.1:2379; "
                             "several separated by commas)");
    }
    endpoints.push_back(std::move(endpoint));
  }
  return endpoints;
}

Result<std::unique_ptr<EtcdClient>> EtcdClient::Make(EtcdClientOptions options) {
  ENDURE_RETURN_IF_ERROR(options.Validate());
  return std::unique_ptr<EtcdClient>(new GrpcEtcdClient(std::move(options)));
}

}  // namespace endure::controller
