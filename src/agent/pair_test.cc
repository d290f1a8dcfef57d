// Pair test over non-blocking TCP (optionally inside mutual TLS) whose every
// wait goes through poll(), so that the client's deadline, the server's idle
// limit and the server's shutdown bound each of them. The socket handling
// follows checkpoint/replica_link.cc, whose helpers are private to it.
#include "agent/pair_test.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>
#include <vector>

#include "common/hash.h"
#include "common/names.h"
#include "common/secret.h"

namespace endure::agent {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kMagic = "ENDPAIR1";
constexpr size_t kPrefixBytes = kMagic.size() + 4;  // the magic and the header length
constexpr uint32_t kMaxHeaderBytes = 4096;
constexpr size_t kMaxLineBytes = 4096;
constexpr size_t kMaxReasonBytes = 1024;
constexpr double kMaxSlowFactor = 100;
// A slow side waits at least this much per unit of (factor - 1): on a fast
// link the measured transfer time alone would be too short to tell apart.
constexpr Duration kMinSlowDelay = std::chrono::milliseconds(50);
// A TLS connection opens with a handshake record (content type 22).
constexpr unsigned char kTlsHandshakeRecord = 0x16;
// How long, and for how many bytes, the server waits for a refused client to
// close first (Stream::Linger).
constexpr Duration kLingerLimit = std::chrono::seconds(1);
constexpr size_t kMaxLingerBytes = 1 << 20;

std::string ErrnoText(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

// A connected non-blocking socket, owned: reads and writes that wait (poll)
// until `deadline`, at most `idle` without progress when `idle` is positive,
// and not at all once `stop_fd` is readable. After StartTls, they go through
// the TLS session.
class Stream {
 public:
  Stream(int fd, Clock::time_point deadline, Duration idle, int stop_fd, std::string stop_reason)
      : fd_(fd),
        deadline_(deadline),
        idle_(idle),
        stop_fd_(stop_fd),
        stop_reason_(std::move(stop_reason)) {}
  ~Stream() {
    if (tls_ != nullptr) tls_->Close();
    tls_.reset();
    ::close(fd_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Status StartTls(const tls::Context& context, tls::Session::Role role) {
    ENDURE_ASSIGN_OR_RETURN(tls_, tls::Session::New(context, fd_, role));
    while (true) {
      ENDURE_ASSIGN_OR_RETURN(const tls::Session::Io io, tls_->Handshake());
      if (io.state == tls::Session::State::kDone) return Status::Ok();
      ENDURE_RETURN_IF_ERROR(Wait(io.state == tls::Session::State::kWantWrite ? POLLOUT : POLLIN,
                                  "the TLS handshake"));
    }
  }

  std::string peer_name() const { return tls_ != nullptr ? tls_->peer_name() : ""; }

  // The first byte the peer sent, left unread.
  Result<unsigned char> PeekByte(const char* what) {
    while (true) {
      unsigned char c = 0;
      const ssize_t r = ::recv(fd_, &c, 1, MSG_PEEK);
      if (r == 1) return c;
      if (r == 0) return Unavailable(std::string("connection closed before ") + what);
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        ENDURE_RETURN_IF_ERROR(Wait(POLLIN, what));
      } else if (errno != EINTR) {
        return Unavailable(ErrnoText("recv") + " while waiting for " + what);
      }
    }
  }

  Status ReadFull(char* buf, size_t n, const char* what) {
    size_t got = 0;
    while (got < n) {
      ENDURE_ASSIGN_OR_RETURN(const Io io, Recv(buf + got, n - got, what));
      if (io.wait != 0) {
        ENDURE_RETURN_IF_ERROR(Wait(io.wait, what));
      } else if (io.bytes == 0) {
        return Unavailable("connection closed after " + std::to_string(got) + " of " +
                           std::to_string(n) + " bytes of " + what);
      } else {
        got += io.bytes;
      }
    }
    return Status::Ok();
  }

  Status WriteAll(std::string_view data, const char* what) {
    while (!data.empty()) {
      ENDURE_ASSIGN_OR_RETURN(const Io io, Send(data, what));
      if (io.wait != 0) {
        ENDURE_RETURN_IF_ERROR(Wait(io.wait, what));
      } else {
        data.remove_prefix(io.bytes);
      }
    }
    return Status::Ok();
  }

  // One '\n'-terminated line, without the '\n', read a byte at a time so
  // that nothing after it is consumed; lines are a few bytes.
  Result<std::string> ReadLine(const char* what) {
    std::string line;
    char c = 0;
    while (line.size() < kMaxLineBytes) {
      ENDURE_RETURN_IF_ERROR(ReadFull(&c, 1, what));
      if (c == '\n') return line;
      line.push_back(c);
    }
    return Unavailable(std::string(what) + " is longer than " + std::to_string(kMaxLineBytes) +
                       " bytes: the peer does not speak the pair test protocol");
  }

  // Waits `d` (a slow fault's delay), cut short by the stop fd and by the
  // deadline, which then fails it as any other wait would.
  Status Pause(Duration d, const char* what) {
    const Clock::time_point wanted = Clock::now() + d;
    const Clock::time_point until = std::min(wanted, deadline_);
    while (true) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) break;
      pollfd stop = {stop_fd_, POLLIN, 0};  // poll skips a negative fd: a plain sleep
      const int n = ::poll(&stop, 1, static_cast<int>(std::min<int64_t>(left.count(), INT_MAX)));
      if (n > 0) return Unavailable(stop_reason_);
    }
    if (until < wanted) return Unavailable(std::string("deadline passed during ") + what);
    return Status::Ok();
  }

  // Ends a connection whose peer may still be sending (it was refused before
  // all it sent was read): half-closes, then discards what arrives until the
  // peer closes, for at most kLingerLimit. Closing with unread bytes would
  // reset the connection, and the reset can destroy the refusal before the
  // peer has read it.
  void Linger() {
    ::shutdown(fd_, SHUT_WR);
    const Clock::time_point until = Clock::now() + kLingerLimit;
    char buf[4096];
    size_t drained = 0;
    while (drained < kMaxLingerBytes) {
      const ssize_t r = ::recv(fd_, buf, sizeof buf, 0);
      if (r == 0) return;
      if (r > 0) {
        drained += static_cast<size_t>(r);
        continue;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) return;
      pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      const int n = ::poll(fds, 2, static_cast<int>(left.count()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || fds[1].revents != 0) return;
    }
  }

 private:
  // One attempt at a read or a write: `bytes` moved, or the events to wait
  // for before trying again (`wait` != 0). A read of 0 bytes that need not
  // wait is the end of the stream.
  struct Io {
    size_t bytes = 0;
    short wait = 0;
  };

  static Result<Io> FromTls(const Result<tls::Session::Io>& r) {
    if (!r.ok()) return r.status();
    switch (r->state) {
      case tls::Session::State::kWantRead:
        return Io{0, POLLIN};
      case tls::Session::State::kWantWrite:
        return Io{0, POLLOUT};
      case tls::Session::State::kClosed:
        return Io{0, 0};
      case tls::Session::State::kDone:
        break;
    }
    return Io{r->bytes, 0};
  }

  Result<Io> Recv(char* buf, size_t n, const char* what) {
    if (tls_ != nullptr) {
      Result<Io> io = FromTls(tls_->Read(buf, n));
      if (!io.ok()) return io.status().WithContext(std::string("reading ") + what);
      return io;
    }
    while (true) {
      const ssize_t r = ::recv(fd_, buf, n, 0);
      if (r >= 0) return Io{static_cast<size_t>(r), 0};
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Io{0, POLLIN};
      if (errno != EINTR) return Unavailable(ErrnoText("recv") + " while reading " + what);
    }
  }

  Result<Io> Send(std::string_view data, const char* what) {
    if (tls_ != nullptr) {
      Result<Io> io = FromTls(tls_->Write(data.data(), data.size()));
      if (!io.ok()) return io.status().WithContext(std::string("sending ") + what);
      if (io->bytes == 0 && io->wait == 0) {
        return Unavailable(std::string("the peer closed the connection while sending ") + what);
      }
      return io;
    }
    while (true) {
      // MSG_NOSIGNAL: a peer that went away is an EPIPE here, not a SIGPIPE.
      const ssize_t r = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (r >= 0) return Io{static_cast<size_t>(r), 0};
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Io{0, POLLOUT};
      if (errno != EINTR) return Unavailable(ErrnoText("send") + " while sending " + what);
    }
  }

  Status Wait(short events, const char* what) {
    Clock::time_point until = deadline_;
    if (idle_ > Duration::zero()) until = std::min(until, Clock::now() + idle_);
    while (true) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
      if (left.count() <= 0) {
        return Unavailable(idle_ > Duration::zero()
                               ? "no progress for " + FormatDuration(idle_) + " on " + what
                               : std::string("deadline passed while waiting on ") + what);
      }
      pollfd fds[2] = {{fd_, events, 0}, {stop_fd_, POLLIN, 0}};  // poll skips a negative fd
      const int n = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), INT_MAX)));
      if (n < 0 && errno != EINTR) return Unavailable(ErrnoText("poll"));
      if (n <= 0) continue;
      if (fds[1].revents != 0) return Unavailable(stop_reason_);
      // Readiness, or an error/hangup that the next recv or send reports.
      return Status::Ok();
    }
  }

  const int fd_;
  const Clock::time_point deadline_;
  const Duration idle_;
  const int stop_fd_;
  const std::string stop_reason_;
  std::unique_ptr<tls::Session> tls_;  // set by StartTls; uses fd_
};

// Closes a descriptor on the error paths of Start and Connect.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { ::freeaddrinfo(ai); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

Result<AddrInfoList> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* list = nullptr;
  const char* node = host.empty() ? nullptr : host.c_str();
  const int rc = ::getaddrinfo(node, std::to_string(port).c_str(), &hints, &list);
  if (rc != 0) return Unavailable("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  return AddrInfoList(list);
}

std::string PeerName(const sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof host, serv,
                    sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown peer";
  }
  return std::string(host) + ":" + serv;
}

void SetNoDelay(int fd) {
  // Each side writes a whole message and then waits for the other; Nagle
  // would only hold back the last segment of each.
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string ErrLine(const Status& st) {
  std::string reason = st.message().substr(0, kMaxReasonBytes);
  std::replace(reason.begin(), reason.end(), '\n', ' ');
  return "ERR " + std::string(StatusCodeName(st.code())) + " " + reason + "\n";
}

// The server's answer `line` as a Status: OK when it is `expected`, else the
// code and reason of its "ERR" line.
Status ParseReply(const std::string& line, std::string_view expected) {
  if (line == expected) return Status::Ok();
  if (line.rfind("ERR ", 0) == 0) {
    const std::string rest = line.substr(4);
    const size_t space = rest.find(' ');
    const std::string name = rest.substr(0, space);
    const std::string reason = space == std::string::npos ? "" : rest.substr(space + 1);
    for (StatusCode code :
         {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kDataLoss,
          StatusCode::kIOError, StatusCode::kUnavailable, StatusCode::kInternal}) {
      if (name == StatusCodeName(code)) {
        return Status(code, "refused by the peer: " + QuoteForLog(reason, kMaxReasonBytes));
      }
    }
    return Unavailable("refused by the peer: " + QuoteForLog(rest, kMaxReasonBytes));
  }
  return Unavailable("unexpected reply '" + QuoteForLog(line, 80) +
                     "': is a pair test server listening on that port?");
}

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
Result<PairFrame> ReadFrame(Stream& s, const PairTestServerOptions& options,
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

Result<int> Connect(const std::string& host, int port, Clock::time_point deadline, int cancel_fd) {
  ENDURE_ASSIGN_OR_RETURN(AddrInfoList list, Resolve(host, port, /*passive=*/false));
  std::string last = "no address";
  for (const addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
    FdCloser fd(::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) {
      last = ErrnoText("socket");
      continue;
    }
    // A non-blocking connect finishes when the socket turns writable;
    // SO_ERROR then says how.
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS && errno != EINTR) {
        last = ErrnoText("connect");
        continue;
      }
      pollfd p[2] = {{fd.get(), POLLOUT, 0}, {cancel_fd, POLLIN, 0}};  // poll skips a negative fd
      int n = 0;
      while (true) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
        if (left.count() <= 0) break;
        n = ::poll(p, 2, static_cast<int>(std::min<int64_t>(left.count(), INT_MAX)));
        if (n >= 0 || errno != EINTR) break;
      }
      if (n > 0 && p[1].revents != 0) return Unavailable("the pair test was cancelled");
      if (n <= 0) return Unavailable("deadline passed while connecting");
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = std::string("connect: ") + std::strerror(err);
        continue;
      }
    }
    SetNoDelay(fd.get());
    return fd.release();
  }
  return Unavailable(last + " (is the peer's agent running?)");
}

// The client's side of the protocol after the connection (and handshake).
Status ClientExchange(Stream& s, const PairTestTarget& target, const PairFault& fault) {
  ENDURE_ASSIGN_OR_RETURN(const std::string frame,
                          EncodeFrame({target.token, target.node, target.bytes}));
  ENDURE_RETURN_IF_ERROR(s.WriteAll(frame, "the header"));
  ENDURE_ASSIGN_OR_RETURN(const std::string go, s.ReadLine("the go-ahead"));
  ENDURE_RETURN_IF_ERROR(ParseReply(go, "GO"));
  if (fault.kind == PairFault::Kind::kFail) {
    // The connection closes (Stream's destructor) with the peer waiting for
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
  return ParseReply(ok, "OK");
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
  Result<AddrInfoList> list = Resolve(options.host, options.port, /*passive=*/true);
  if (!list.ok()) {
    return IOError("cannot listen for pair tests on " + where + ": " + list.status().message());
  }
  std::string last = "no address";
  for (const addrinfo* ai = list->get(); ai != nullptr; ai = ai->ai_next) {
    // Non-blocking, so that a connection that vanishes between poll() and
    // accept() cannot block the accept loop.
    FdCloser fd(::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) {
      last = ErrnoText("socket");
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = ErrnoText("bind");
      continue;
    }
    if (::listen(fd.get(), 16) != 0) {
      last = ErrnoText("listen");
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      last = ErrnoText("getsockname");
      continue;
    }
    const int bound = addr.ss_family == AF_INET6
                          ? ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port)
                          : ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
    FdCloser stop(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (stop.get() < 0) return IOError(ErrnoText("eventfd"));
    return std::unique_ptr<PairTestServer>(
        new PairTestServer(fd.release(), stop.release(), bound, std::move(options)));
  }
  return IOError("cannot listen for pair tests on " + where + ": " + last);
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
  const uint64_t one = 1;
  while (::write(stop_fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
  thread_.join();
  ::close(listen_fd_);
  ::close(stop_fd_);
}

Status PairTestServer::set_fault(PairFault fault) {
  ENDURE_RETURN_IF_ERROR(fault.Validate());
  std::lock_guard<std::mutex> lock(mu_);
  fault_ = fault;
  return Status::Ok();
}

PairFault PairTestServer::fault() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fault_;
}

std::string PairTestServer::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void PairTestServer::RecordError(const std::string& message) {
  ++errors_;
  std::lock_guard<std::mutex> lock(mu_);
  last_error_ = message;
}

void PairTestServer::Serve() {
  while (!stopping_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      ENDURE_CHECK(errno == EINTR);  // other poll errors are bad arguments
      continue;
    }
    if (fds[1].revents != 0) return;
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      HandleConnection(fd, PeerName(addr, len));
    } else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      // The pending connection stays queued and poll() would report it again
      // at once: back off instead of spinning.
      RecordError(ErrnoText("accept"));
      pollfd stop = {stop_fd_, POLLIN, 0};
      ::poll(&stop, 1, 100);
    }
  }
}

void PairTestServer::HandleConnection(int fd, const std::string& peer) {
  SetNoDelay(fd);
  Stream s(fd, Clock::time_point::max(), options_.idle_limit, stop_fd_,
           "the pair test server is shutting down");
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
  Result<int> fd = Connect(target.host, target.port, deadline, target.cancel_fd);
  if (!fd.ok()) return outcome(fd.status());
  Stream s(*fd, deadline, Duration::zero(), target.cancel_fd, "the pair test was cancelled");
  if (target.tls != nullptr) {
    const Status handshake = s.StartTls(*target.tls, tls::Session::Role::kClient);
    if (!handshake.ok()) return outcome(handshake);
  }
  return outcome(ClientExchange(s, target, local_fault));
}

}  // namespace endure::agent
