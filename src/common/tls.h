// Mutual TLS for the links between Endure's processes (the replica link
// between agents; gRPC between agents and the controller): a job's private
// CA and per-process certificates that `endure certs` writes, their loading
// and checking, and an OpenSSL context plus a non-blocking session wrapper
// that callers drive with their own poll() loop. OpenSSL 3 does the
// cryptography; its types stay out of this header (ssl_ctx_st is OpenSSL's
// SSL_CTX, for callers that need the native handle).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/duration.h"
#include "common/status.h"

struct ssl_ctx_st;
struct ssl_st;

namespace endure::tls {

// The name in the controller's certificate (CN and DNS SAN); agents check it.
inline constexpr char kControllerName[] = "controller";

// A process's TLS identity, loaded from a directory `endure certs` wrote:
// DIR/ca.pem (the job's CA certificate), DIR/NAME.pem, DIR/NAME.key.
struct Identity {
  std::string name;      // the certificate's CN, e.g. "node0" or "controller"
  std::string ca_pem;    // PEM of the CA certificate
  std::string cert_pem;  // PEM of this process's certificate
  std::string key_pem;   // PEM of its private key
};

// Loads and checks it: files exist and parse, the certificate is signed by
// the CA, is within its validity period, its CN equals `name`, it allows
// both TLS server and client use, the key matches the certificate, and the
// key file is not readable by group or others (a key others can read is
// refused, the message says `chmod 600 FILE`). `name` must be
// kControllerName or a valid node name (common/names.h). kInvalidArgument
// naming the file and what to fix. Thread-safe.
Result<Identity> LoadIdentity(const std::string& dir, const std::string& name);

struct CertRequest {
  std::string dir;                 // created if missing (0700)
  std::vector<std::string> nodes;  // node names (IsValidNodeName; "controller" refused)
  std::vector<std::string> hosts;  // extra DNS names / IP addresses put in every leaf's SAN
  Duration validity = std::chrono::hours(24 * 365);
};

// OK when `host` can go into a certificate's subjectAltName: an IPv4 or IPv6
// address, or a DNS name (labels of A-Z a-z 0-9 and '-', at most 253 bytes;
// a leading "*." wildcard is allowed). kInvalidArgument naming `what`
// ("--host") otherwise.
Status CheckSanHost(std::string_view host, std::string_view what);

// Writes DIR/ca.pem + ca.key and, for "controller" and each node, NAME.pem +
// NAME.key (keys 0600, certificates 0644, each written atomically: temp
// file, fsync, rename, fsync of DIR). An existing CA in DIR is reused (so
// nodes can be added later): ca.pem and ca.key must both be there, load,
// match and the key must not be readable by others; existing node files are
// overwritten only for the names requested. ECDSA P-256 keys, SHA-256
// signatures, X.509 v3 with basicConstraints, keyUsage, extendedKeyUsage
// (serverAuth+clientAuth for all leaf certificates), SAN DNS:NAME (+ hosts),
// random 128-bit serials. Certificates are valid from an hour ago (clock
// skew between hosts) for `validity` (at most 100 years), never past the
// CA's own end. kInvalidArgument for bad input (a node name, a host, the
// validity, a CA in DIR that does not load or match), kIOError when DIR or a
// file in it cannot be written, kInternal when OpenSSL fails; the message
// names the file. Not safe to run concurrently on the same DIR.
Status MakeCertificates(const CertRequest& request);

// An OpenSSL SSL_CTX built from an Identity for mutual TLS: TLS 1.3 minimum,
// this identity's certificate and key, the job CA as the only trust anchor,
// and SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, so that both sides
// of a connection must present a certificate signed by the job CA. No
// session resumption (every connection does a full handshake). Immutable
// after Make and shareable across threads.
class Context {
 public:
  // kInvalidArgument when the identity's PEMs do not parse or the key does
  // not match the certificate.
  static Result<std::shared_ptr<const Context>> Make(const Identity& id);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // The identity's name (its certificate's CN).
  const std::string& name() const { return name_; }
  // The SSL_CTX, owned by this Context; valid while it lives.
  ssl_ctx_st* native_handle() const { return ctx_; }

 private:
  Context(ssl_ctx_st* ctx, std::string name) : ctx_(ctx), name_(std::move(name)) {}

  ssl_ctx_st* const ctx_;
  const std::string name_;
};

// LoadIdentity(dir, name) and then Context::Make.
Result<std::shared_ptr<const Context>> LoadContext(const std::string& dir, const std::string& name);

// One TLS session over a connected non-blocking socket, which the caller
// owns and keeps open while this lives. Every call makes one attempt and
// never blocks: it says what it did or which readiness (POLLIN or POLLOUT)
// to wait for before calling again with the same arguments. Socket writes
// use MSG_NOSIGNAL (a closed peer is an error, not a SIGPIPE). Not
// thread-safe; the Context may be shared.
class Session {
 public:
  enum class Role { kClient, kServer };
  enum class State {
    kDone,       // the handshake finished, or `bytes` were read or written
    kWantRead,   // wait for the socket to be readable, then call again
    kWantWrite,  // wait for it to be writable, then call again
    kClosed,     // the peer ended the connection (close_notify or EOF)
  };
  struct Io {
    State state = State::kDone;
    size_t bytes = 0;
  };

  // kInternal when OpenSSL cannot make the session.
  static Result<std::unique_ptr<Session>> New(const Context& ctx, int fd, Role role);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The handshake, certificate checks included. kUnavailable with the
  // reason (the peer's certificate failed verification and why, the peer
  // sent an alert, the peer does not speak TLS) when it fails.
  Result<Io> Handshake();
  // At most n bytes (n > 0). kUnavailable when the session fails.
  Result<Io> Read(char* buf, size_t n);
  // At most n bytes (n > 0). kUnavailable when the session fails.
  Result<Io> Write(const char* buf, size_t n);
  // Sends close_notify once when the session is healthy; never waits.
  void Close();

  // The CN of the peer's verified certificate; empty before the handshake
  // finished.
  const std::string& peer_name() const { return peer_name_; }

 private:
  Session(ssl_st* ssl, Role role) : ssl_(ssl), role_(role) {}
  // Maps the result `rc` of an SSL call named `call` onto an Io or an error.
  Result<Io> Outcome(int rc, size_t bytes, const char* call);

  ssl_st* const ssl_;
  const Role role_;
  bool failed_ = false;  // after a fatal error OpenSSL must not send close_notify
  std::string peer_name_;
};

}  // namespace endure::tls
