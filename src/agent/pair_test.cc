// Pair test over TCP (optionally inside mutual TLS) on
// common/deadline_socket.h, as the replica link: the client's deadline, the
// server's idle limit and the server's shutdown bound each wait.
#include "agent/pair_test.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <new>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>
#include <vector>

#include "common/deadline_socket.h"
#include "common/hash.h"
#include "common/names.h"
#include "common/secret.h"

namespace endure::agent {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kMagic = "ENDPAIR1";
constexpr size_t kPrefixBytes = kMagic.size() + 4;  // the magic and the header length
constexpr uint32_t kMaxHeaderBytes = 4096;
constexpr double kMaxSlowFactor = 100;
// A slow side waits at least this much per unit of (factor - 1): on a fast
// link the measured transfer time alone would be too short to tell apart.
constexpr Duration kMinSlowDelay = std::chrono::milliseconds(50);
// A TLS connection opens with a handshake record (content type 22).
constexpr unsigned char kTlsHandshakeRecord = 0x16;
// How ParseReply names the server.
constexpr ReplyPeer kServer = {"the peer", "a pair test server"};

struct PairFrame {
  std::string token;
  std::string node;
  uint64_t bytes = 0;
};

Result<std::string> EncodeFrame(const PairFrame& f) {
  const nlohmann::json j = {{"token", f.token}, {"node", f.node}, {"bytes", f.bytes}};
  // `replace`: dump() would throw on a string that is not UTF-8.
  const std::string json = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (json.size() > kMaxHeaderBytes) {
    return InvalidArgument("pair test header of " + std::to_string(json.size()) +
                           " bytes; the limit is " + std::to_string(kMaxHeaderBytes));
  }
  const uint32_t len = static_cast<uint32_t>(json.size());
  std::string frame(kMagic);
  for (int shift : {24, 16, 8, 0}) frame.push_back(static_cast<char>((len >> shift) & 0xff));
  return frame + json;
}

// The checks every buffer size passes, on both sides.
Status CheckBytes(uint64_t bytes, uint64_t max_bytes) {
  if (bytes == 0 || bytes % sizeof(float) != 0) {
    return InvalidArgument("a pair test buffer of " + std::to_string(bytes) +
                           " bytes: it must be a positive multiple of 4 (floats)");
  }
  if (bytes > max_bytes) {
    return InvalidArgument("a pair test buffer of " + std::to_string(bytes) +
                           " bytes exceeds the limit of " + std::to_string(max_bytes));
  }
  return Status::Ok();
}

// Reads and checks the client's frame: everything but the buffers.
// `sender`: the node the client's certificate names (empty without TLS).
// `claimed`: the node the frame names, quoted, once the header parsed (for
// the server's error messages; unverified until the checks pass).
Result<PairFrame> ReadFrame(DeadlineSocket& s, const PairTestServerOptions& options,
                            const std::string& sender, std::string& claimed) {
  // The magic is checked before the length is read, so that a peer that
  // speaks another protocol is refused for what it is.
  char prefix[kPrefixBytes];
  ENDURE_RETURN_IF_ERROR(s.ReadFull(prefix, kMagic.size(), "the magic"));
  if (std::string_view(prefix, kMagic.size()) != kMagic) {
    if (static_cast<unsigned char>(prefix[0]) == kTlsHandshakeRecord) {
      return InvalidArgument(
          "bad magic: the client opened a TLS handshake, and this pair test server runs without "
          "TLS (give both sides the job's certificates)");
    }
    return InvalidArgument("bad magic '" + QuoteForLog(std::string_view(prefix, kMagic.size())) +
                           "': not a pair test frame (expected " + std::string(kMagic) + ")");
  }
  ENDURE_RETURN_IF_ERROR(s.ReadFull(prefix + kMagic.size(), 4, "the header length"));
  const auto byte = [&](size_t i) { return uint32_t{static_cast<unsigned char>(prefix[i])}; };
  const size_t at = kMagic.size();
  const uint32_t len = (byte(at) << 24) | (byte(at + 1) << 16) | (byte(at + 2) << 8) | byte(at + 3);
  if (len > kMaxHeaderBytes) {
    return InvalidArgument("pair test header of " + std::to_string(len) + " bytes; the limit is " +
                           std::to_string(kMaxHeaderBytes));
  }
  std::string text(len, '\0');
  ENDURE_RETURN_IF_ERROR(s.ReadFull(text.data(), len, "the header"));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return InvalidArgument("the pair test header is not a JSON object");
  // Checked before any get<>(), which would throw on a missing or mistyped field.
  const std::pair<const char*, bool> fields[] = {
      {"token", j.contains("token") && j["token"].is_string()},
      {"node", j.contains("node") && j["node"].is_string()},
      {"bytes", j.contains("bytes") && j["bytes"].is_number_unsigned()},
  };
  for (const auto& [name, ok] : fields) {
    if (!ok)
      return InvalidArgument(std::string("the pair test header lacks a valid '") + name + "'");
  }
  PairFrame f;
  f.token = j["token"].get<std::string>();
  f.node = j["node"].get<std::string>();
  f.bytes = j["bytes"].get<uint64_t>();
  claimed = QuoteForLog(f.node);
  if (!ConstantTimeEquals(f.token, options.token)) {
    return InvalidArgument("wrong token: the client's job token is not this agent's");
  }
  ENDURE_RETURN_IF_ERROR(CheckNodeName(f.node, "the pair test header's 'node'"));
  if (!sender.empty() && f.node != sender) {
    return InvalidArgument("the header names node '" + f.node +
                           "', but the client's certificate is for node '" + QuoteForLog(sender) +
                           "'");
  }
  ENDURE_RETURN_IF_ERROR(CheckBytes(f.bytes, options.max_bytes));
  return f;
}

// This side's buffer: small integers (0..1023), so that every sum is exact
// and the same on both sides whichever adds first; seeded by the node name
// so that the two buffers differ.
Result<std::vector<float>> OwnBuffer(const std::string& node, uint64_t bytes) {
  std::vector<float> v;
  try {
    v.resize(bytes / sizeof(float));
  } catch (const std::bad_alloc&) {
    return Unavailable("cannot allocate " + std::to_string(bytes) + " bytes for the buffer");
  }
  const uint32_t seed = static_cast<uint32_t>(Xxh3(node));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(((static_cast<uint32_t>(i) * 2654435761u + seed) >> 22) & 1023u);
  }
  return v;
}

Result<std::vector<float>> PeerBuffer(uint64_t bytes) {
  std::vector<float> v;
  try {
    v.resize(bytes / sizeof(float));
  } catch (const std::bad_alloc&) {
    return Unavailable("cannot allocate " + std::to_string(bytes) + " bytes for the buffer");
  }
  return v;
}

std::string_view Bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)};
}

// Adds `mine` into `peer` and returns the checksum of the sum.
uint64_t SumInto(const std::vector<float>& mine, std::vector<float>& peer) {
  for (size_t i = 0; i < peer.size(); ++i) peer[i] += mine[i];
  return Xxh3(Bytes(peer));
}

Duration SlowDelay(const PairFault& fault, Duration measured) {
  const double extra = fault.factor - 1;
  return std::max(FromSeconds(extra * Seconds(measured)),
                  FromSeconds(extra * Seconds(kMinSlowDelay)));
}

// The client's side of the protocol after the connection (and handshake).
Status ClientExchange(DeadlineSocket& s, const PairTestTarget& target, const PairFault& fault) {
  ENDURE_ASSIGN_OR_RETURN(const std::string frame,
                          EncodeFrame({target.token, target.node, target.bytes}));
  ENDURE_RETURN_IF_ERROR(s.WriteAll(frame, "the header"));
  ENDURE_ASSIGN_OR_RETURN(const std::string go, s.ReadLine("the go-ahead"));
  ENDURE_RETURN_IF_ERROR(ParseReply(go, "GO", kServer));
  if (fault.kind == PairFault::Kind::kFail) {
    // The connection closes (DeadlineSocket's destructor) with the peer waiting for
    // our buffer, as a link that fails mid-collective would leave it.
    return Unavailable("injected comm-fail: node " + target.node +
                       "'s collectives fail (the connection was closed before its buffer)");
  }
  ENDURE_ASSIGN_OR_RETURN(const std::vector<float> mine, OwnBuffer(target.node, target.bytes));
  ENDURE_ASSIGN_OR_RETURN(std::vector<float> peer, PeerBuffer(target.bytes));
  const Clock::time_point start = Clock::now();
  ENDURE_RETURN_IF_ERROR(s.WriteAll(Bytes(mine), "this node's buffer"));
  ENDURE_RETURN_IF_ERROR(
      s.ReadFull(reinterpret_cast<char*>(peer.data()), target.bytes, "the peer's buffer"));
  const Duration exchange = Clock::now() - start;
  const uint64_t sum = SumInto(mine, peer);
  if (fault.kind == PairFault::Kind::kSlow) {
    ENDURE_RETURN_IF_ERROR(s.Pause(SlowDelay(fault, exchange), "the injected comm-slow delay"));
  }
  ENDURE_RETURN_IF_ERROR(s.WriteAll("SUM " + HexU64(sum) + "\n", "the checksum"));
  ENDURE_ASSIGN_OR_RETURN(const std::string ok, s.ReadLine("the peer's verdict"));
  return ParseReply(ok, "OK", kServer);
}

}  // namespace

Status PairFault::Validate() const {
  if (kind == Kind::kSlow && !(factor > 1 && factor <= kMaxSlowFactor)) {
    return InvalidArgument("comm-slow factor must be in (1, 100], got " + std::to_string(factor));
  }
  return Status::Ok();
}

std::string PairFault::ToString() const {
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kFail:
      return "fail";
    case Kind::kSlow:
      break;
  }
  std::string f = std::to_string(factor);
  f.erase(f.find_last_not_of('0') + 1);
  if (!f.empty() && f.back() == '.') f.pop_back();
  return "slow x" + f;
}

Status PairTestServerOptions::Validate() const {
  if (token.empty()) return InvalidArgument("pair test server: the token must not be empty");
  ENDURE_RETURN_IF_ERROR(CheckNodeName(node, "pair test server's node"));
  if (port < 0 || port > 65535) {
    return InvalidArgument("pair test server: port must be in [0, 65535], got " +
                           std::to_string(port));
  }
  if (max_bytes == 0 || max_bytes > kMaxPairTestBytes) {
    return InvalidArgument("pair test server: max_bytes must be in (0, " +
                           std::to_string(kMaxPairTestBytes) + "], got " +
                           std::to_string(max_bytes));
  }
  if (idle_limit <= Duration::zero()) {
    return InvalidArgument("pair test server: idle_limit must be positive");
  }
  return Status::Ok();
}

Result<std::unique_ptr<PairTestServer>> PairTestServer::Start(PairTestServerOptions options) {
  ENDURE_RETURN_IF_ERROR(options.Validate());
  const std::string where =
      (options.host.empty() ? "*" : options.host) + ":" + std::to_string(options.port);
  Result<TcpListener> listener = ListenTcp(options.host, options.port);
  if (!listener.ok()) {
    return IOError("cannot listen for pair tests on " + where + ": " + listener.status().message());
  }
  FdCloser fd(listener->fd);
  FdCloser stop(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (stop.get() < 0) return IOError(ErrnoText("eventfd"));
  return std::unique_ptr<PairTestServer>(
      new PairTestServer(fd.release(), stop.release(), listener->port, std::move(options)));
}

PairTestServer::PairTestServer(int listen_fd, int stop_fd, int port, PairTestServerOptions options)
    : listen_fd_(listen_fd),
      stop_fd_(stop_fd),
      port_(port),
      options_(std::move(options)),
      thread_([this] { Serve(); }) {}

PairTestServer::~PairTestServer() {
  stopping_ = true;
  // The eventfd stays readable from now on, so every poll in Serve() returns.
  SignalEventFd(stop_fd_);
  thread_.join();
  ::close(listen_fd_);
  ::close(stop_fd_);
}

Status PairTestServer::set_fault(PairFault fault) {
  ENDURE_RETURN_IF_ERROR(fault.Validate());
  MutexLock lock(&mu_);
  fault_ = fault;
  return Status::Ok();
}

PairFault PairTestServer::fault() const {
  MutexLock lock(&mu_);
  return fault_;
}

std::string PairTestServer::last_error() const {
  MutexLock lock(&mu_);
  return last_error_;
}

void PairTestServer::RecordError(const std::string& message) {
  ++errors_;
  MutexLock lock(&mu_);
  last_error_ = message;
}

void PairTestServer::Serve() {
  ServeConnections(
      listen_fd_, stop_fd_, stopping_,
      [this](int fd, const std::string& peer) { HandleConnection(fd, peer); },
      [this](const std::string& error) { RecordError(error); });
}

void PairTestServer::HandleConnection(int fd, const std::string& peer) {
  SetNoDelay(fd);
  DeadlineSocket s(fd, {.idle = options_.idle_limit,
                        .stop_fd = stop_fd_,
                        .stop_reason = "the pair test server is shutting down",
                        .protocol = "pair test"});
  // Whether a refusal can reach the client: not after a failed handshake
  // (OpenSSL has sent its alert).
  bool can_reply = true;
  std::string client_node;  // as the frame names it, once it parsed
  Status st = [&]() -> Status {
    std::string sender;
    if (options_.tls != nullptr) {
      // Told apart before the handshake, so that a client that speaks the
      // protocol without TLS can read why it is refused.
      ENDURE_ASSIGN_OR_RETURN(const unsigned char first, s.PeekByte("the TLS handshake"));
      if (first != kTlsHandshakeRecord) {
        return InvalidArgument(
            "this pair test server requires TLS: give the client the job's certificates");
      }
      can_reply = false;
      ENDURE_RETURN_IF_ERROR(s.StartTls(*options_.tls, tls::Session::Role::kServer));
      can_reply = true;
      sender = s.peer_name();
    }
    ENDURE_ASSIGN_OR_RETURN(const PairFrame f, ReadFrame(s, options_, sender, client_node));
    const PairFault fault = this->fault();
    if (fault.kind == PairFault::Kind::kFail) {
      return Unavailable("injected comm-fail: node " + options_.node + "'s collectives fail");
    }
    ENDURE_ASSIGN_OR_RETURN(const std::vector<float> mine, OwnBuffer(options_.node, f.bytes));
    ENDURE_ASSIGN_OR_RETURN(std::vector<float> theirs, PeerBuffer(f.bytes));
    ENDURE_RETURN_IF_ERROR(s.WriteAll("GO\n", "the go-ahead"));
    const Clock::time_point start = Clock::now();
    ENDURE_RETURN_IF_ERROR(
        s.ReadFull(reinterpret_cast<char*>(theirs.data()), f.bytes, "the client's buffer"));
    const Duration transfer = Clock::now() - start;
    if (fault.kind == PairFault::Kind::kSlow) {
      ENDURE_RETURN_IF_ERROR(s.Pause(SlowDelay(fault, transfer), "the injected comm-slow delay"));
    }
    ENDURE_RETURN_IF_ERROR(s.WriteAll(Bytes(mine), "this node's buffer"));
    const uint64_t sum = SumInto(mine, theirs);
    ENDURE_ASSIGN_OR_RETURN(const std::string line, s.ReadLine("the client's checksum"));
    if (line.rfind("SUM ", 0) != 0) {
      return InvalidArgument("expected 'SUM <16 hex digits>', got '" + QuoteForLog(line, 80) + "'");
    }
    if (line.substr(4) != HexU64(sum)) {
      return DataLoss("checksum mismatch: node " + f.node + "'s sum is " +
                      QuoteForLog(line.substr(4), 20) + ", node " + options_.node + "'s is " +
                      HexU64(sum) + ": a buffer was corrupted on the way");
    }
    ++served_;
    return s.WriteAll("OK\n", "the verdict");
  }();
  if (st.ok()) return;
  // Recorded before the reply, so that a client that has read the refusal
  // also finds it counted.
  if (!stopping_) {
    RecordError("pair test from " + (client_node.empty() ? peer : client_node + " at " + peer) +
                ": " + st.message());
  }
  if (!can_reply || stopping_) return;
  // Best effort: a client that broke the connection will not read it.
  if (!s.WriteAll(ErrLine(st), "the refusal").ok()) return;
  s.Linger();
}

Result<PairOutcome> RunPairTest(const PairTestTarget& target, PairFault local_fault) {
  ENDURE_RETURN_IF_ERROR(local_fault.Validate());
  ENDURE_RETURN_IF_ERROR(CheckNodeName(target.node, "the pair test's node"));
  ENDURE_RETURN_IF_ERROR(CheckBytes(target.bytes, kMaxPairTestBytes));
  if (target.host.empty()) return InvalidArgument("pair test: no peer host given");
  if (target.port <= 0 || target.port > 65535) {
    return InvalidArgument("pair test: port must be in [1, 65535], got " +
                           std::to_string(target.port));
  }
  if (target.timeout <= Duration::zero()) {
    return InvalidArgument("pair test: the timeout must be positive");
  }
  const bool v6 = target.host.find(':') != std::string::npos;
  const std::string what = "pair test with " + (v6 ? "[" + target.host + "]" : target.host) + ":" +
                           std::to_string(target.port);
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + target.timeout;
  const auto outcome = [&](const Status& st) -> Result<PairOutcome> {
    PairOutcome o;
    o.seconds = Seconds(Clock::now() - start);
    if (st.ok()) {
      o.ok = true;
      return o;
    }
    // The only kInvalidArgument past the checks above is the peer's refusal
    // of the request: a misconfiguration, not a finding about the link.
    if (st.code() == StatusCode::kInvalidArgument) return st.WithContext(what);
    if (st.code() == StatusCode::kUnavailable && Clock::now() >= deadline) {
      o.error =
          what + ": timed out after " + FormatDuration(target.timeout) + " (" + st.message() + ")";
    } else {
      o.error = what + ": " + st.message();
    }
    return o;
  };
  Result<int> fd = ConnectWithDeadline(target.host, target.port, deadline, target.cancel_fd,
                                       "the pair test was cancelled");
  if (!fd.ok()) return outcome(fd.status());
  DeadlineSocket s(*fd, {.deadline = deadline,
                         .stop_fd = target.cancel_fd,
                         .stop_reason = "the pair test was cancelled",
                         .protocol = "pair test"});
  if (target.tls != nullptr) {
    const Status handshake = s.StartTls(*target.tls, tls::Session::Role::kClient);
    if (!handshake.ok()) return outcome(handshake);
  }
  return outcome(ClientExchange(s, target, local_fault));
}

}  // namespace endure::agent
