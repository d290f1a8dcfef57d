// Blocking-style TCP over non-blocking sockets, optionally inside mutual TLS
// (common/tls.h), for the small request/reply links between agents (the
// replica link, the pair test): every wait goes through poll(), so that a
// deadline, an idle limit and a stop fd (an eventfd made readable on shutdown
// or cancellation) bound each of them, the TLS handshake's included. Around
// it: resolving, listening, accepting and connecting with the same bounds,
// and the "ERR CODE reason\n" refusal lines both links speak.
//
// Errors are Status values, kUnavailable for everything the network or the
// peer did (the message names what was being read or written), never
// exceptions. Thread safety: one DeadlineSocket is used by one thread at a
// time; its stop fd may be made readable from any thread. The free functions
// are thread-safe.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/duration.h"
#include "common/status.h"
#include "common/tls.h"

struct addrinfo;

namespace endure {

// "CALL: strerror(errno)", for the errno a failed system call `call` left.
std::string ErrnoText(const char* call);

// How a DeadlineSocket bounds its waits and words its errors.
struct DeadlineSocketOptions {
  // Every wait fails with "deadline passed while waiting on WHAT" from then on.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  // Positive: each wait fails after this long without progress, with "no
  // progress for IDLE on WHAT".
  Duration idle = Duration::zero();
  // Optional (-1: none): once readable, every wait fails at once with
  // `stop_reason` ("the receiver is shutting down").
  int stop_fd = -1;
  std::string stop_reason = "the connection was stopped";
  // ReadLine's limit, and the protocol its error says the peer does not
  // speak ("replica": "the peer does not speak the replica protocol").
  size_t max_line_bytes = 4096;
  std::string protocol;
};

// A connected non-blocking socket, owned (closed by the destructor, after the
// TLS session's close_notify): reads and writes that wait, within the bounds
// of its options, until they are done. After StartTls they go through the TLS
// session. `what` names the bytes in errors ("the payload"). Not thread-safe.
class DeadlineSocket {
 public:
  DeadlineSocket(int fd, DeadlineSocketOptions options);
  ~DeadlineSocket();
  DeadlineSocket(const DeadlineSocket&) = delete;
  DeadlineSocket& operator=(const DeadlineSocket&) = delete;

  // The TLS handshake in `role`, within the same bounds as every other wait.
  // tls::Session's errors for a failed handshake (OpenSSL has sent its alert).
  Status StartTls(const tls::Context& context, tls::Session::Role role);

  // The CN of the peer's verified certificate; empty without TLS.
  std::string peer_name() const;

  // The first byte the peer sent, left unread (below TLS); waits for it.
  Result<unsigned char> PeekByte(const char* what);

  // Reads exactly n bytes; kUnavailable, saying how many came, when the peer
  // closes first.
  Status ReadFull(char* buf, size_t n, const char* what);

  Status WriteAll(std::string_view data, const char* what);

  // One '\n'-terminated line, without the '\n'. Reads a byte at a time so
  // that nothing after the line is consumed; lines are a few bytes.
  // kUnavailable when it is longer than options.max_line_bytes.
  Result<std::string> ReadLine(const char* what);

  // Waits `d` (an injected delay, say), cut short by the stop fd and by the
  // deadline, which then fail it as any other wait would ("deadline passed
  // during WHAT"). Does not touch the socket; the idle limit does not apply.
  Status Pause(Duration d, const char* what);

  // Ends a connection whose peer may still be sending (it was refused before
  // all it sent was read): half-closes, then discards what arrives until the
  // peer closes, for at most a second (or 1 MiB, or until the stop fd turns
  // readable). Closing with unread bytes would reset the connection, and the
  // reset can destroy a refusal (or a TLS alert) the peer has not read yet.
  void Linger();

 private:
  // One attempt at a read or a write: `bytes` moved, or the poll events to
  // wait for before trying again (`wait` != 0). A read of 0 bytes that need
  // not wait is the end of the stream.
  struct Io {
    size_t bytes = 0;
    short wait = 0;
  };

  static Result<Io> FromTls(const Result<tls::Session::Io>& r);
  Result<Io> Recv(char* buf, size_t n, const char* what);
  Result<Io> Send(std::string_view data, const char* what);
  Status Wait(short events, const char* what);

  const int fd_;
  const DeadlineSocketOptions options_;
  std::unique_ptr<tls::Session> tls_;  // set by StartTls; uses fd_, so it goes first
};

// Closes a descriptor unless it was released: for error paths.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser();
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const;
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// getaddrinfo for a TCP `host` ("" with `passive`: every interface) and
// numeric `port`. kUnavailable "cannot resolve 'HOST': ..." on failure.
Result<AddrInfoList> Resolve(const std::string& host, int port, bool passive);

// "host:port" of a peer address, numeric; "an unknown peer" when it cannot
// be written.
std::string PeerName(const sockaddr_storage& addr, socklen_t len);

// TCP_NODELAY: each side of these links writes a whole message and then
// waits for the other, so Nagle would only hold back each message's tail.
void SetNoDelay(int fd);

// A non-blocking listening socket (SO_REUSEADDR, backlog 16), owned by the
// caller, and the port it is bound to (the one picked when asked for 0).
struct TcpListener {
  int fd = -1;
  int port = 0;
};

// Listens on the first address of `host`:`port` that binds. kIOError with
// the resolver's message, or the last failed call's ("bind: Address already
// in use"), for the caller to prefix with what it listens for.
Result<TcpListener> ListenTcp(const std::string& host, int port);

// Accepts connections on `listen_fd` (non-blocking) one at a time, passing
// each (a non-blocking fd, which `handle` owns) and its PeerName to `handle`
// on this thread, until `stopping` is set or `stop_fd` turns readable. A
// failed accept for want of descriptors or memory goes to `on_error` and is
// retried after 100 ms.
void ServeConnections(int listen_fd, int stop_fd, const std::atomic<bool>& stopping,
                      const std::function<void(int fd, const std::string& peer)>& handle,
                      const std::function<void(const std::string& error)>& on_error);

// Makes the eventfd `fd` readable for good, so that every poll on it returns.
void SignalEventFd(int fd);

// A connected, non-blocking TCP socket to `host`:`port` with TCP_NODELAY,
// owned by the caller: the first address that accepts before `deadline`.
// kUnavailable "deadline passed while connecting", `cancel_reason` once
// `cancel_fd` (-1: none) turns readable, or the last address's error with a
// hint that the peer's agent may not be running.
Result<int> ConnectWithDeadline(const std::string& host, int port,
                                std::chrono::steady_clock::time_point deadline, int cancel_fd,
                                const std::string& cancel_reason);

// The refusal line for `st`: "ERR CODE reason\n", CODE its StatusCodeName,
// the reason cut to 1 KiB and kept on one line.
std::string ErrLine(const Status& st);

// How ParseReply names the side that answers.
struct ReplyPeer {
  std::string_view name;      // "the receiver": "refused by the receiver: REASON"
  std::string_view listener;  // "a replica receiver": "is a replica receiver listening ...?"
};

// The peer's answer `line` as a Status: OK when it is `expected`, the code
// and reason of an ErrLine (kUnavailable for an unknown code), kUnavailable
// for anything else. The peer's text is quoted with QuoteForLog.
Status ParseReply(const std::string& line, std::string_view expected, const ReplyPeer& peer);

}  // namespace endure
