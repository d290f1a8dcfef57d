// Replica link over blocking-style TCP, optionally inside mutual TLS:
// non-blocking sockets whose every wait goes through poll(), so that the
// sender's deadline, the receiver's idle limit and the receiver's shutdown
// all bound each wait, the TLS handshake's included.
#include "checkpoint/replica_link.h"

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
#include <chrono>
#include <climits>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/hash.h"
#include "common/names.h"
#include "common/secret.h"

namespace endure::checkpoint {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kMagic = "ENDREPL1";
constexpr uint32_t kMaxHeaderBytes = 64 << 10;
constexpr size_t kMaxReplyBytes = 4096;
constexpr size_t kMaxReasonBytes = 1024;
// The payload is received in chunks of this size, each committed as it comes.
constexpr uint64_t kPayloadChunk = 4 << 20;
// How long the receiver waits for a sender to make progress before cutting it
// off; it serves one connection at a time, so this bounds what a stalled
// sender costs the others.
constexpr Duration kReceiverIdleLimit = std::chrono::seconds(10);
// A TLS connection opens with a handshake record (content type 22); a frame
// opens with kMagic.
constexpr unsigned char kTlsHandshakeRecord = 0x16;
// How long, and for how many bytes, a receiver that refused a sender before
// reading all it sent waits for the sender to close first (Stream::Linger).
constexpr Duration kLingerLimit = std::chrono::seconds(1);
constexpr size_t kMaxLingerBytes = 1 << 20;

std::string ErrnoText(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

// A connected non-blocking socket, owned: reads and writes that wait (poll)
// until `deadline`, at most `idle` without progress when `idle` is positive,
// and not at all once `stop_fd` is readable. After StartTls, they go through
// the TLS session.
class Stream {
 public:
  Stream(int fd, Clock::time_point deadline, Duration idle, int stop_fd)
      : fd_(fd), deadline_(deadline), idle_(idle), stop_fd_(stop_fd) {}
  ~Stream() {
    if (tls_ != nullptr) tls_->Close();
    tls_.reset();
    ::close(fd_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // The TLS handshake in `role`, within the same bounds as every other wait.
  Status StartTls(const tls::Context& context, tls::Session::Role role) {
    ENDURE_ASSIGN_OR_RETURN(tls_, tls::Session::New(context, fd_, role));
    while (true) {
      ENDURE_ASSIGN_OR_RETURN(const tls::Session::Io io, tls_->Handshake());
      if (io.state == tls::Session::State::kDone) return Status::Ok();
      ENDURE_RETURN_IF_ERROR(Wait(io.state == tls::Session::State::kWantWrite ? POLLOUT : POLLIN,
                                  "the TLS handshake"));
    }
  }

  // The CN of the peer's verified certificate; empty without TLS.
  std::string peer_name() const { return tls_ != nullptr ? tls_->peer_name() : ""; }

  // The first byte the peer sent, left unread; waits for it.
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

  // Reads exactly n bytes; `what` names them in the error ("the payload").
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

  // One '\n'-terminated line, without the '\n'. Reads a byte at a time so
  // that nothing after the line is consumed; replies are a few bytes.
  Result<std::string> ReadLine(const char* what) {
    std::string line;
    char c = 0;
    while (line.size() < kMaxReplyBytes) {
      ENDURE_RETURN_IF_ERROR(ReadFull(&c, 1, what));
      if (c == '\n') return line;
      line.push_back(c);
    }
    return Unavailable(std::string(what) + " is longer than " + std::to_string(kMaxReplyBytes) +
                       " bytes: the peer does not speak the replica protocol");
  }

  // Ends a connection whose peer may still be sending (it was refused before
  // all it sent was read): half-closes, then discards what arrives until the
  // peer closes, for at most kLingerLimit. Closing with unread bytes would
  // reset the connection, and the reset can destroy a refusal (or a TLS
  // alert) that the peer has not read yet.
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
      if (fds[1].revents != 0) return Unavailable("the receiver is shutting down");
      // Readiness, or an error/hangup that the next recv or send reports.
      return Status::Ok();
    }
  }

  const int fd_;
  const Clock::time_point deadline_;
  const Duration idle_;
  const int stop_fd_;
  std::unique_ptr<tls::Session> tls_;  // set by StartTls; uses fd_, so it goes first
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
  if (rc != 0) {
    return Unavailable("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  }
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

// The receiver's answer `line` as a Status: OK when it is `expected`.
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
      if (name == StatusCodeName(code)) return Status(code, "refused by the receiver: " + reason);
    }
    return Unavailable("refused by the receiver: " + rest);
  }
  return Unavailable("unexpected reply '" + line.substr(0, 80) +
                     "': is a replica receiver listening on that port?");
}

constexpr size_t kPrefixBytes = kMagic.size() + 4;  // the magic and the header length

struct Replica {
  ReplicaHeader header;
  std::string payload;
};

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

// Reads one frame up to and including its payload, refusing what `token`,
// `max_bytes` and `sender` do not allow before the payload is asked for.
// `sender`: the node the peer's TLS certificate names, which the frame must
// name too; empty without TLS.
Result<Replica> ReadFrame(Stream& s, const std::string& token, uint64_t max_bytes,
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
  // Address space is reserved only now that the size has been checked
  // against max_bytes, and before the go-ahead, so that a receiver short of
  // it refuses the replica instead of dying. Memory is committed as the
  // bytes arrive: each chunk is zeroed just before it is read into, so a
  // sender that claims much and sends little costs little.
  Replica r;
  try {
    r.payload.reserve(f.header.bytes);
  } catch (const std::bad_alloc&) {
    return Unavailable("cannot allocate " + std::to_string(f.header.bytes) +
                       " bytes for the payload");
  } catch (const std::length_error&) {
    return Unavailable("cannot allocate " + std::to_string(f.header.bytes) +
                       " bytes for the payload");
  }
  ENDURE_RETURN_IF_ERROR(s.WriteAll("GO\n", "the go-ahead"));
  while (r.payload.size() < f.header.bytes) {
    const size_t at = r.payload.size();
    const size_t chunk =
        static_cast<size_t>(std::min<uint64_t>(f.header.bytes - at, kPayloadChunk));
    r.payload.resize(at + chunk);  // within the reserved capacity: no reallocation
    ENDURE_RETURN_IF_ERROR(s.ReadFull(r.payload.data() + at, chunk, "the payload"));
  }
  const uint64_t actual = Xxh3(r.payload);
  if (actual != f.header.xxh3) {
    return DataLoss("checksum mismatch: the payload's xxh3 is " + HexU64(actual) +
                    ", the header says " + HexU64(f.header.xxh3));
  }
  r.header = std::move(f.header);
  return r;
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
    // A non-blocking connect (EINTR also leaves it in progress) finishes when
    // the socket turns writable; SO_ERROR then says how.
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
      if (n > 0 && p[1].revents != 0) return Unavailable("the sender is shutting down");
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

Status Exchange(Stream& s, const std::string& token, const ReplicaHeader& header,
                std::string_view payload) {
  ENDURE_ASSIGN_OR_RETURN(const std::string frame, EncodeReplicaFrame(token, header));
  ENDURE_RETURN_IF_ERROR(s.WriteAll(frame, "the header"));
  ENDURE_ASSIGN_OR_RETURN(std::string go, s.ReadLine("the go-ahead"));
  ENDURE_RETURN_IF_ERROR(ParseReply(go, "GO"));
  ENDURE_RETURN_IF_ERROR(s.WriteAll(payload, "the payload"));
  ENDURE_ASSIGN_OR_RETURN(std::string ack, s.ReadLine("the acknowledgement"));
  return ParseReply(ack, "OK");
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
  Result<AddrInfoList> list = Resolve(host, port, /*passive=*/true);
  if (!list.ok())
    return IOError("cannot listen for replicas on " + where + ": " + list.status().message());
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
    return std::unique_ptr<ReplicaServer>(new ReplicaServer(fd.release(), stop.release(), bound,
                                                            std::move(token), max_bytes,
                                                            std::move(sink), std::move(tls)));
  }
  return IOError("cannot listen for replicas on " + where + ": " + last);
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
      thread_([this] { Serve(); }) {}

ReplicaServer::~ReplicaServer() {
  stopping_ = true;
  // The eventfd stays readable from now on, so every poll in Serve() returns.
  const uint64_t one = 1;
  while (::write(stop_fd_, &one, sizeof one) < 0 && errno == EINTR) {
  }
  thread_.join();
  ::close(listen_fd_);
  ::close(stop_fd_);
}

void ReplicaServer::set_max_bytes(uint64_t max_bytes) {
  if (max_bytes > 0) max_bytes_ = max_bytes;
}

std::string ReplicaServer::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

void ReplicaServer::RecordError(const std::string& message) {
  ++errors_;
  std::lock_guard<std::mutex> lock(mu_);
  last_error_ = message;
}

void ReplicaServer::Serve() {
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
    // Anything else (EAGAIN, ECONNABORTED, EINTR, ...) concerns one
    // connection that is gone already.
  }
}

void ReplicaServer::HandleConnection(int fd, const std::string& peer) {
  SetNoDelay(fd);
  Stream s(fd, Clock::time_point::max(), kReceiverIdleLimit, stop_fd_);
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
    ENDURE_ASSIGN_OR_RETURN(Replica r, ReadFrame(s, token_, max_bytes_.load(), sender));
    sink_(r.header, std::move(r.payload));
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
  Result<int> fd = Connect(host, port, deadline, cancel_fd);
  if (!fd.ok()) return annotate(fd.status());
  Stream s(*fd, deadline, Duration::zero(), cancel_fd);
  if (tls != nullptr) {
    const Status handshake = s.StartTls(*tls, tls::Session::Role::kClient);
    if (!handshake.ok()) return annotate(handshake);
  }
  const Status st = Exchange(s, token, header, payload);
  return st.ok() ? st : annotate(st);
}

}  // namespace endure::checkpoint
