// Replica link over blocking-style TCP, optionally inside mutual TLS, on
// common/deadline_socket.h: the sender's deadline, the receiver's idle limit
// and the receiver's shutdown bound each wait, the TLS handshake's included.
#include "checkpoint/replica_link.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <climits>
#include <new>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/deadline_socket.h"
#include "common/hash.h"
#include "common/names.h"
#include "common/secret.h"

namespace endure::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kMagic = "ENDREPL1";
constexpr uint32_t kMaxHeaderBytes = 64 << 10;
// The payload is received, hashed and handed on in chunks of this size: small
// enough to stay in a core's cache between the three.
constexpr uint64_t kPayloadChunk = 1 << 20;
// How long the receiver waits for a sender to make progress before cutting it
// off; it serves one connection at a time, so this bounds what a stalled
// sender costs the others.
constexpr Duration kReceiverIdleLimit = std::chrono::seconds(10);
// A TLS connection opens with a handshake record (content type 22); a frame
// opens with kMagic.
constexpr unsigned char kTlsHandshakeRecord = 0x16;
// How ParseReply names the receiver.
constexpr ReplyPeer kReceiver = {"the receiver", "a replica receiver"};

constexpr size_t kPrefixBytes = kMagic.size() + 4;  // the magic and the header length

std::string EncodeHeader(const std::string& token, const ReplicaHeader& h) {
  const nlohmann::json j = {{"token", token},        {"node", h.node}, {"shard", h.shard},
                            {"shards", h.shards},    {"step", h.step}, {"bytes", h.bytes},
                            {"xxh3", HexU64(h.xxh3)}};
  // `replace`: dump() would throw on a name that is not UTF-8.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The header length that the magic and length `prefix` (kPrefixBytes) announce.
Result<uint32_t> DecodePrefix(std::string_view prefix) {
  if (prefix.substr(0, kMagic.size()) != kMagic) {
    return InvalidArgument("bad magic: not a replica frame (expected " + std::string(kMagic) + ")");
  }
  if (prefix.size() < kPrefixBytes) return InvalidArgument("truncated frame: no header length");
  const auto byte = [&](size_t i) { return uint32_t{static_cast<unsigned char>(prefix[i])}; };
  const size_t at = kMagic.size();
  const uint32_t len = (byte(at) << 24) | (byte(at + 1) << 16) | (byte(at + 2) << 8) | byte(at + 3);
  if (len > kMaxHeaderBytes) {
    return InvalidArgument("frame header of " + std::to_string(len) + " bytes; the limit is " +
                           std::to_string(kMaxHeaderBytes));
  }
  return len;
}

Result<ReplicaFrame> DecodeHeader(std::string_view text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgument("the frame header is not a JSON object");
  // Checked before any get<>(), which would throw on a missing or mistyped field.
  const std::pair<const char*, bool> fields[] = {
      {"token", j.contains("token") && j["token"].is_string()},
      {"node", j.contains("node") && j["node"].is_string()},
      {"shard", j.contains("shard") && j["shard"].is_number_integer()},
      {"shards", j.contains("shards") && j["shards"].is_number_integer()},
      {"step", j.contains("step") && j["step"].is_number_integer()},
      {"bytes", j.contains("bytes") && j["bytes"].is_number_unsigned()},
      {"xxh3", j.contains("xxh3") && j["xxh3"].is_string()},
  };
  for (const auto& [name, ok] : fields) {
    if (!ok) return InvalidArgument(std::string("the frame header lacks a valid '") + name + "'");
  }
  ReplicaFrame f;
  f.token = j["token"].get<std::string>();
  f.header.node = j["node"].get<std::string>();
  const int64_t shard = j["shard"].get<int64_t>();
  const int64_t shards = j["shards"].get<int64_t>();
  f.header.step = j["step"].get<int64_t>();
  f.header.bytes = j["bytes"].get<uint64_t>();
  const std::string xxh3 = j["xxh3"].get<std::string>();
  if (shards < 1 || shards > INT_MAX || shard < 0 || shard >= shards) {
    return InvalidArgument("shard " + std::to_string(shard) + " of " + std::to_string(shards) +
                           " is not a valid shard");
  }
  f.header.shard = static_cast<int>(shard);
  f.header.shards = static_cast<int>(shards);
  if (f.header.step < 0) return InvalidArgument("negative step " + std::to_string(f.header.step));
  // The receiver names its T1 files after the sender's node.
  ENDURE_RETURN_IF_ERROR(CheckNodeName(f.header.node, "the frame header's 'node'"));
  const auto [end, ec] = std::from_chars(xxh3.data(), xxh3.data() + xxh3.size(), f.header.xxh3, 16);
  if (xxh3.size() != 16 || ec != std::errc() || end != xxh3.data() + xxh3.size()) {
    return InvalidArgument("xxh3 '" + xxh3.substr(0, 40) + "' is not 16 hex digits");
  }
  return f;
}

// Reads one frame's header, refusing what `token`, `max_bytes` and `sender`
// do not allow. `sender`: the node the peer's TLS certificate names, which
// the frame must name too; empty without TLS.
Result<ReplicaHeader> ReadHeader(DeadlineSocket& s, const std::string& token, uint64_t max_bytes,
                                 const std::string& sender) {
  // The magic is checked before the length is read, so that a peer that
  // speaks another protocol is refused for what it is.
  char prefix[kPrefixBytes];
  ENDURE_RETURN_IF_ERROR(s.ReadFull(prefix, kMagic.size(), "the magic"));
  if (std::string_view(prefix, kMagic.size()) != kMagic) {
    if (static_cast<unsigned char>(prefix[0]) == kTlsHandshakeRecord) {
      return InvalidArgument(
          "bad magic: the sender opened a TLS handshake, and this receiver runs without TLS "
          "(give both sides the job's certificates with --tls-dir)");
    }
    return InvalidArgument("bad magic: not a replica frame (expected " + std::string(kMagic) + ")");
  }
  ENDURE_RETURN_IF_ERROR(s.ReadFull(prefix + kMagic.size(), 4, "the header length"));
  ENDURE_ASSIGN_OR_RETURN(const uint32_t len,
                          DecodePrefix(std::string_view(prefix, sizeof prefix)));
  std::string json(len, '\0');
  ENDURE_RETURN_IF_ERROR(s.ReadFull(json.data(), len, "the header"));
  ENDURE_ASSIGN_OR_RETURN(ReplicaFrame f, DecodeHeader(json));
  if (!ConstantTimeEquals(f.token, token)) {
    return InvalidArgument("wrong token: the sender's job token is not this agent's");
  }
  // A node's certificate vouches for that node only: it must not be able to
  // plant replicas under another node's name.
  if (!sender.empty() && f.header.node != sender) {
    return InvalidArgument("the frame names node '" + f.header.node +
                           "', but the sender's certificate is for node '" + QuoteForLog(sender) +
                           "': a node may send only its own replicas");
  }
  if (f.header.bytes > max_bytes) {
    return InvalidArgument("payload of " + std::to_string(f.header.bytes) +
                           " bytes exceeds this agent's limit of " + std::to_string(max_bytes));
  }
  return std::move(f.header);
}

// Asks for the payload of `h` and streams it into `target` through `chunk`
// (kPayloadChunk bytes), hashing it on the way; commits it when the
// checksum matches.
Status ReadPayload(DeadlineSocket& s, const ReplicaHeader& h, ReplicaTarget& target, char* chunk) {
  ENDURE_RETURN_IF_ERROR(s.WriteAll("GO\n", "the go-ahead"));
  Xxh3Hasher hasher;
  for (uint64_t at = 0; at < h.bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(h.bytes - at, kPayloadChunk));
    ENDURE_RETURN_IF_ERROR(s.ReadFull(chunk, n, "the payload"));
    hasher.Update(chunk, n);
    ENDURE_RETURN_IF_ERROR(target.Write(std::string_view(chunk, n)));
    at += n;
  }
  const uint64_t actual = hasher.Digest();
  if (actual != h.xxh3) {
    return DataLoss("checksum mismatch: the payload's xxh3 is " + HexU64(actual) +
                    ", the header says " + HexU64(h.xxh3));
  }
  return target.Commit();
}

// WholePayloads' target: the payload in a string, grown as it arrives.
class StringTarget : public ReplicaTarget {
 public:
  StringTarget(ReplicaHeader header,
               std::shared_ptr<std::function<void(const ReplicaHeader&, std::string)>> keep)
      : header_(std::move(header)), keep_(std::move(keep)) {}
  Status Write(std::string_view chunk) override {
    try {
      payload_.append(chunk);
    } catch (const std::bad_alloc&) {
      return Unavailable("cannot allocate " + std::to_string(header_.bytes) +
                         " bytes for the payload");
    }
    return Status::Ok();
  }
  Status Commit() override {
    (*keep_)(header_, std::move(payload_));
    return Status::Ok();
  }

 private:
  ReplicaHeader header_;
  std::shared_ptr<std::function<void(const ReplicaHeader&, std::string)>> keep_;
  std::string payload_;
};

Status Exchange(DeadlineSocket& s, const std::string& token, const ReplicaHeader& header,
                std::string_view payload) {
  ENDURE_ASSIGN_OR_RETURN(const std::string frame, EncodeReplicaFrame(token, header));
  ENDURE_RETURN_IF_ERROR(s.WriteAll(frame, "the header"));
  ENDURE_ASSIGN_OR_RETURN(std::string go, s.ReadLine("the go-ahead"));
  ENDURE_RETURN_IF_ERROR(ParseReply(go, "GO", kReceiver));
  ENDURE_RETURN_IF_ERROR(s.WriteAll(payload, "the payload"));
  ENDURE_ASSIGN_OR_RETURN(std::string ack, s.ReadLine("the acknowledgement"));
  return ParseReply(ack, "OK", kReceiver);
}

}  // namespace

Result<std::string> EncodeReplicaFrame(const std::string& token, const ReplicaHeader& header) {
  const std::string json = EncodeHeader(token, header);
  if (json.size() > kMaxHeaderBytes) {
    return InvalidArgument("frame header of " + std::to_string(json.size()) +
                           " bytes; the limit is " + std::to_string(kMaxHeaderBytes));
  }
  const uint32_t len = static_cast<uint32_t>(json.size());
  std::string frame(kMagic);
  for (int shift : {24, 16, 8, 0}) frame.push_back(static_cast<char>((len >> shift) & 0xff));
  frame += json;
  return frame;
}

Result<ReplicaFrame> DecodeReplicaFrame(std::string_view bytes) {
  ENDURE_ASSIGN_OR_RETURN(const uint32_t len, DecodePrefix(bytes));
  const std::string_view json = bytes.substr(std::min(bytes.size(), kPrefixBytes));
  if (json.size() != len) {
    return InvalidArgument("the frame announces a header of " + std::to_string(len) +
                           " bytes and holds " + std::to_string(json.size()));
  }
  return DecodeHeader(json);
}

Result<std::unique_ptr<ReplicaServer>> ReplicaServer::Start(
    const std::string& host, int port, std::string token, uint64_t max_bytes, Sink sink,
    std::shared_ptr<const tls::Context> tls) {
  if (!sink) return InvalidArgument("ReplicaServer needs a sink");
  if (max_bytes == 0) return InvalidArgument("ReplicaServer: max_bytes must be positive");
  const std::string where = (host.empty() ? "*" : host) + ":" + std::to_string(port);
  Result<TcpListener> listener = ListenTcp(host, port);
  if (!listener.ok()) {
    return IOError("cannot listen for replicas on " + where + ": " + listener.status().message());
  }
  FdCloser fd(listener->fd);
  FdCloser stop(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (stop.get() < 0) return IOError(ErrnoText("eventfd"));
  return std::unique_ptr<ReplicaServer>(
      new ReplicaServer(fd.release(), stop.release(), listener->port, std::move(token), max_bytes,
                        std::move(sink), std::move(tls)));
}

ReplicaServer::ReplicaServer(int listen_fd, int stop_fd, int port, std::string token,
                             uint64_t max_bytes, Sink sink, std::shared_ptr<const tls::Context> tls)
    : listen_fd_(listen_fd),
      stop_fd_(stop_fd),
      port_(port),
      token_(std::move(token)),
      max_bytes_(max_bytes),
      sink_(std::move(sink)),
      tls_(std::move(tls)),
      chunk_(new char[kPayloadChunk]),
      thread_([this] { Serve(); }) {}

ReplicaServer::Sink ReplicaServer::WholePayloads(
    std::function<void(const ReplicaHeader&, std::string payload)> keep) {
  auto shared =
      std::make_shared<std::function<void(const ReplicaHeader&, std::string)>>(std::move(keep));
  return [shared](const ReplicaHeader& h) -> Result<std::unique_ptr<ReplicaTarget>> {
    return std::unique_ptr<ReplicaTarget>(new StringTarget(h, shared));
  };
}

ReplicaServer::~ReplicaServer() {
  stopping_ = true;
  // The eventfd stays readable from now on, so every poll in Serve() returns.
  SignalEventFd(stop_fd_);
  thread_.join();
  ::close(listen_fd_);
  ::close(stop_fd_);
}

void ReplicaServer::set_max_bytes(uint64_t max_bytes) {
  if (max_bytes > 0) max_bytes_ = max_bytes;
}

std::string ReplicaServer::last_error() const {
  MutexLock lock(&mu_);
  return last_error_;
}

void ReplicaServer::RecordError(const std::string& message) {
  ++errors_;
  MutexLock lock(&mu_);
  last_error_ = message;
}

void ReplicaServer::Serve() {
  ServeConnections(
      listen_fd_, stop_fd_, stopping_,
      [this](int fd, const std::string& peer) { HandleConnection(fd, peer); },
      [this](const std::string& error) { RecordError(error); });
}

void ReplicaServer::HandleConnection(int fd, const std::string& peer) {
  SetNoDelay(fd);
  DeadlineSocket s(fd, {.idle = kReceiverIdleLimit,
                        .stop_fd = stop_fd_,
                        .stop_reason = "the receiver is shutting down",
                        .protocol = "replica"});
  // How a refusal reaches the sender: on the stream (in TLS once the
  // handshake is done), in plain text to a sender without TLS, or not at all
  // after a failed handshake (OpenSSL has sent its alert).
  enum class Refusal { kReply, kPlainReply, kNone } refusal = Refusal::kReply;
  Status st = [&]() -> Status {
    std::string sender;
    if (tls_ != nullptr) {
      // Told apart before the handshake, so that a sender that speaks the
      // protocol without TLS can read why it is refused.
      ENDURE_ASSIGN_OR_RETURN(const unsigned char first, s.PeekByte("the TLS handshake"));
      if (first != kTlsHandshakeRecord) {
        refusal = Refusal::kPlainReply;
        return InvalidArgument(
            "this replica receiver requires TLS: give the sender the job's certificates "
            "(--tls-dir)");
      }
      refusal = Refusal::kNone;
      ENDURE_RETURN_IF_ERROR(s.StartTls(*tls_, tls::Session::Role::kServer));
      refusal = Refusal::kReply;
      sender = s.peer_name();
    }
    ENDURE_ASSIGN_OR_RETURN(const ReplicaHeader h,
                            ReadHeader(s, token_, max_bytes_.load(), sender));
    ENDURE_ASSIGN_OR_RETURN(std::unique_ptr<ReplicaTarget> target, sink_(h));
    ENDURE_RETURN_IF_ERROR(ReadPayload(s, h, *target, chunk_.get()));
    ++received_;
    return s.WriteAll("OK\n", "the acknowledgement");
  }();
  if (st.ok()) return;
  // Recorded before the reply, so that a sender that has read the refusal
  // also finds it counted.
  if (!stopping_) RecordError("replica from " + peer + ": " + st.message());
  // Best effort: a sender that broke the connection will not read it.
  // (The refusal is recorded above, so its own failure adds nothing.)
  if (refusal != Refusal::kNone && !s.WriteAll(ErrLine(st), "the refusal").ok()) return;
  // These senders have bytes in flight that were never read: the header
  // without TLS, the client's last handshake flight and maybe its header.
  if (refusal != Refusal::kReply && !stopping_) s.Linger();
}

Status SendReplica(const std::string& address, const std::string& token,
                   const ReplicaHeader& header, std::string_view payload, Duration timeout,
                   int cancel_fd, std::shared_ptr<const tls::Context> tls) {
  const std::string what = "replica of " + header.node + " shard " + std::to_string(header.shard) +
                           "/" + std::to_string(header.shards) + " step " +
                           std::to_string(header.step) + " to " + address;
  if (header.bytes != payload.size()) {
    return InvalidArgument(what + ": the header says " + std::to_string(header.bytes) +
                           " bytes, the payload has " + std::to_string(payload.size()));
  }
  // "host:port" or "[v6addr]:port".
  const size_t colon = address.rfind(':');
  int port = 0;
  const char* port_end = address.data() + address.size();
  if (colon == std::string::npos ||
      std::from_chars(address.data() + colon + 1, port_end, port).ptr != port_end || port <= 0 ||
      port > 65535) {
    return InvalidArgument(what + ": expected host:port, got '" + address + "'");
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const Clock::time_point deadline = Clock::now() + timeout;
  const auto annotate = [&](const Status& st) {
    if (st.code() == StatusCode::kUnavailable && Clock::now() >= deadline) {
      return Unavailable(what + ": timed out after " + FormatDuration(timeout) + " (" +
                         st.message() + ")");
    }
    return st.WithContext(what);
  };
  Result<int> fd =
      ConnectWithDeadline(host, port, deadline, cancel_fd, "the sender is shutting down");
  if (!fd.ok()) return annotate(fd.status());
  DeadlineSocket s(*fd, {.deadline = deadline,
                         .stop_fd = cancel_fd,
                         .stop_reason = "the sender is shutting down",
                         .protocol = "replica"});
  if (tls != nullptr) {
    const Status handshake = s.StartTls(*tls, tls::Session::Role::kClient);
    if (!handshake.ok()) return annotate(handshake);
  }
  const Status st = Exchange(s, token, header, payload);
  return st.ok() ? st : annotate(st);
}

}  // namespace endure::checkpoint
