// DeadlineSocket and its helpers: every wait is a poll() on the socket and
// the stop fd, with a timeout that the deadline and the idle limit set.
#include "common/deadline_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>

#include "common/names.h"

namespace endure {
namespace {

using Clock = std::chrono::steady_clock;

// Linger's bounds.
constexpr Duration kLingerLimit = std::chrono::seconds(1);
constexpr size_t kMaxLingerBytes = 1 << 20;
constexpr size_t kMaxReasonBytes = 1024;

// The poll() timeout for the time left until `until`, in [0, INT_MAX] ms,
// rounded up so that a wait does not end just before its bound.
int PollMillis(Clock::time_point until) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT_MAX));
}

}  // namespace

std::string ErrnoText(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

DeadlineSocket::DeadlineSocket(int fd, DeadlineSocketOptions options)
    : fd_(fd), options_(std::move(options)) {}

DeadlineSocket::~DeadlineSocket() {
  if (tls_ != nullptr) tls_->Close();
  tls_.reset();
  ::close(fd_);
}

Status DeadlineSocket::StartTls(const tls::Context& context, tls::Session::Role role) {
  ENDURE_ASSIGN_OR_RETURN(tls_, tls::Session::New(context, fd_, role));
  while (true) {
    ENDURE_ASSIGN_OR_RETURN(const tls::Session::Io io, tls_->Handshake());
    if (io.state == tls::Session::State::kDone) return Status::Ok();
    ENDURE_RETURN_IF_ERROR(
        Wait(io.state == tls::Session::State::kWantWrite ? POLLOUT : POLLIN, "the TLS handshake"));
  }
}

std::string DeadlineSocket::peer_name() const { return tls_ != nullptr ? tls_->peer_name() : ""; }

Result<unsigned char> DeadlineSocket::PeekByte(const char* what) {
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

Status DeadlineSocket::ReadFull(char* buf, size_t n, const char* what) {
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

Status DeadlineSocket::WriteAll(std::string_view data, const char* what) {
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

Result<std::string> DeadlineSocket::ReadLine(const char* what) {
  std::string line;
  char c = 0;
  while (line.size() < options_.max_line_bytes) {
    ENDURE_RETURN_IF_ERROR(ReadFull(&c, 1, what));
    if (c == '\n') return line;
    line.push_back(c);
  }
  return Unavailable(std::string(what) + " is longer than " +
                     std::to_string(options_.max_line_bytes) +
                     " bytes: the peer does not speak the " + options_.protocol + " protocol");
}

Status DeadlineSocket::Pause(Duration d, const char* what) {
  const Clock::time_point wanted = Clock::now() + d;
  const Clock::time_point until = std::min(wanted, options_.deadline);
  while (true) {
    const int left = PollMillis(until);
    if (left == 0) break;
    pollfd stop = {options_.stop_fd, POLLIN, 0};  // poll skips a negative fd: a plain sleep
    if (::poll(&stop, 1, left) > 0) return Unavailable(options_.stop_reason);
  }
  if (until < wanted) return Unavailable(std::string("deadline passed during ") + what);
  return Status::Ok();
}

void DeadlineSocket::Linger() {
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
    const int left = PollMillis(until);
    if (left == 0) return;
    pollfd fds[2] = {{fd_, POLLIN, 0}, {options_.stop_fd, POLLIN, 0}};
    const int n = ::poll(fds, 2, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || fds[1].revents != 0) return;
  }
}

Result<DeadlineSocket::Io> DeadlineSocket::FromTls(const Result<tls::Session::Io>& r) {
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

Result<DeadlineSocket::Io> DeadlineSocket::Recv(char* buf, size_t n, const char* what) {
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

Result<DeadlineSocket::Io> DeadlineSocket::Send(std::string_view data, const char* what) {
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

Status DeadlineSocket::Wait(short events, const char* what) {
  const Duration idle = options_.idle;
  Clock::time_point until = options_.deadline;
  if (idle > Duration::zero()) until = std::min(until, Clock::now() + idle);
  while (true) {
    const int left = PollMillis(until);
    if (left == 0) {
      return Unavailable(idle > Duration::zero()
                             ? "no progress for " + FormatDuration(idle) + " on " + what
                             : std::string("deadline passed while waiting on ") + what);
    }
    pollfd fds[2] = {{fd_, events, 0}, {options_.stop_fd, POLLIN, 0}};  // poll skips a negative fd
    const int n = ::poll(fds, 2, left);
    if (n < 0 && errno != EINTR) return Unavailable(ErrnoText("poll"));
    if (n <= 0) continue;
    if (fds[1].revents != 0) return Unavailable(options_.stop_reason);
    // Readiness, or an error/hangup that the next recv or send reports.
    return Status::Ok();
  }
}

FdCloser::~FdCloser() {
  if (fd_ >= 0) ::close(fd_);
}

void AddrInfoDeleter::operator()(addrinfo* ai) const { ::freeaddrinfo(ai); }

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
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Result<TcpListener> ListenTcp(const std::string& host, int port) {
  Result<AddrInfoList> list = Resolve(host, port, /*passive=*/true);
  if (!list.ok()) return IOError(list.status().message());
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
    return TcpListener{fd.release(), bound};
  }
  return IOError(last);
}

void ServeConnections(int listen_fd, int stop_fd, const std::atomic<bool>& stopping,
                      const std::function<void(int fd, const std::string& peer)>& handle,
                      const std::function<void(const std::string& error)>& on_error) {
  while (!stopping) {
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      ENDURE_CHECK(errno == EINTR);  // other poll errors are bad arguments
      continue;
    }
    if (fds[1].revents != 0) return;
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      handle(fd, PeerName(addr, len));
    } else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
      // The pending connection stays queued and poll() would report it again
      // at once: back off instead of spinning.
      on_error(ErrnoText("accept"));
      pollfd stop = {stop_fd, POLLIN, 0};
      ::poll(&stop, 1, 100);
    }
    // Anything else (EAGAIN, ECONNABORTED, EINTR, ...) concerns one
    // connection that is gone already.
  }
}

void SignalEventFd(int fd) {
  const uint64_t one = 1;
  while (::write(fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

Result<int> ConnectWithDeadline(const std::string& host, int port, Clock::time_point deadline,
                                int cancel_fd, const std::string& cancel_reason) {
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
        const int left = PollMillis(deadline);
        if (left == 0) break;
        n = ::poll(p, 2, left);
        if (n >= 0 || errno != EINTR) break;
      }
      if (n > 0 && p[1].revents != 0) return Unavailable(cancel_reason);
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

std::string ErrLine(const Status& st) {
  std::string reason = st.message().substr(0, kMaxReasonBytes);
  std::replace(reason.begin(), reason.end(), '\n', ' ');
  return "ERR " + std::string(StatusCodeName(st.code())) + " " + reason + "\n";
}

Status ParseReply(const std::string& line, std::string_view expected, const ReplyPeer& peer) {
  if (line == expected) return Status::Ok();
  const std::string refused = "refused by " + std::string(peer.name) + ": ";
  if (line.rfind("ERR ", 0) == 0) {
    const std::string rest = line.substr(4);
    const size_t space = rest.find(' ');
    const std::string name = rest.substr(0, space);
    const std::string reason = space == std::string::npos ? "" : rest.substr(space + 1);
    for (StatusCode code :
         {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kDataLoss,
          StatusCode::kIOError, StatusCode::kUnavailable, StatusCode::kInternal}) {
      if (name == StatusCodeName(code)) {
        return Status(code, refused + QuoteForLog(reason, kMaxReasonBytes));
      }
    }
    return Unavailable(refused + QuoteForLog(rest, kMaxReasonBytes));
  }
  return Unavailable("unexpected reply '" + QuoteForLog(line, 80) + "': is " +
                     std::string(peer.listener) + " listening on that port?");
}

}  // namespace endure
