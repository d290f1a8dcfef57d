// The controller process: ControllerShell wired to gRPC (GrpcTransport),
// the real clock, the stop signals and the HTTP status server.
#include "controller/controller.h"

#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include "common/clock.h"
#include "common/env.h"
#include "common/names.h"
#include "common/secret.h"
#include "common/subprocess.h"
#include "common/tls.h"
#include "controller/controller_shell.h"
#include "controller/grpc_transport.h"

namespace endure::controller {
namespace {

constexpr int kMaxMessageBytes = 4 << 20;  // one AgentEvent (gRPC's receive limit)

// /metrics (Prometheus), /api/status (JSON) and / (a dashboard), served from
// what the shell last published. Stop (or the destructor) before the shell
// goes away.
class StatusHttpServer {
 public:
  explicit StatusHttpServer(const ControllerShell& shell) : shell_(shell) {}
  ~StatusHttpServer() { Stop(); }

  // Listens on `listen` (HOST:PORT, port 0 picks one). Beyond loopback every
  // request must carry `token`. Returns the bound host:port.
  Result<std::string> Start(const std::string& listen, const std::string& token);
  void Stop();

 private:
  const ControllerShell& shell_;
  httplib::Server http_;
  std::thread thread_;
};

Result<std::string> StatusHttpServer::Start(const std::string& listen, const std::string& token) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos) {
    return InvalidArgument("--http: '" + listen + "' is not HOST:PORT");
  }
  const std::string host = listen.substr(0, colon);
  const std::string port_text = listen.substr(colon + 1);
  int wanted = -1;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), wanted);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || wanted < 0 ||
      wanted > 65535) {
    return InvalidArgument("--http: '" + listen + "' is not HOST:PORT (port 0..65535)");
  }
  // Beyond loopback anyone on the network can ask: every request must carry
  // the job token, as "Authorization: Bearer TOKEN" or "?token=TOKEN".
  const bool open = IsLoopbackHost(HostOfAddress(listen));
  http_.set_pre_routing_handler([open, token](const httplib::Request& req, httplib::Response& res) {
    if (open) return httplib::Server::HandlerResponse::Unhandled;
    std::string presented;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0) {
      presented = auth.substr(7);
    } else if (req.has_param("token")) {
      presented = req.get_param_value("token");
    }
    if (!presented.empty() && ConstantTimeEquals(presented, token)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    res.status = 401;
    res.set_header("WWW-Authenticate", "Bearer realm=\"endure\"");
    res.set_content(
        "401 Unauthorized: this controller serves beyond loopback; send the job token as "
        "'Authorization: Bearer TOKEN' or '?token=TOKEN'\n",
        "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
  // GET only: nothing a client sends needs more than a few kilobytes.
  http_.set_payload_max_length(64 * 1024);
  http_.set_read_timeout(5, 0);
  http_.set_write_timeout(5, 0);
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(shell_.MetricsText(), "text/plain; version=0.0.4");
  });
  http_.Get("/api/status", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(shell_.StatusJson(), "application/json");
  });
  http_.Get("/", [](const httplib::Request&, httplib::Response& res) {
    // A minimal dashboard: the live status, refreshed every second.
    res.set_content(
        "<!doctype html><title>Endure</title><h1>Endure job</h1><pre id=s>loading</pre>"
        "<p><a id=m href=/metrics>/metrics</a> <a id=a href=/api/status>/api/status</a></p>"
        "<script>const q=location.search;"  // carries ?token= beyond loopback
        "document.getElementById('m').href+=q;document.getElementById('a').href+=q;"
        "setInterval(()=>fetch('/api/status'+q).then(r=>r.json()).then(j=>"
        "document.getElementById('s').textContent=JSON.stringify(j,null,2)),1000)</script>",
        "text/html");
  });
  const int port = wanted > 0 && http_.bind_to_port(host.c_str(), wanted)
                       ? wanted
                       : (wanted > 0 ? -1 : http_.bind_to_any_port(host.c_str()));
  if (port <= 0) return InvalidArgument("--http: cannot listen on '" + listen + "'");
  thread_ = std::thread([this] { http_.listen_after_bind(); });
  return host + ":" + std::to_string(port);
}

void StatusHttpServer::Stop() {
  if (!thread_.joinable()) return;
  http_.stop();
  thread_.join();
}

// Ends the agents' streams (and so every call into the shell) on the way
// out, whichever way Serve returns.
struct ShutdownOnExit {
  Transport& transport;
  Duration grace;
  ~ShutdownOnExit() { transport.Shutdown(grace); }
};

// Runs the job to its end with `shell` on `transport`: listens, serves the
// status over HTTP, loops until the job ends, writes the report, and lets
// the agents hang up.
Result<int> Serve(const ControllerOptions& o, ControllerShell& shell, Transport& transport) {
  ENDURE_RETURN_IF_ERROR(shell.Start());
  Result<std::string> address = transport.Start(&shell);
  if (!address.ok()) return address.status();
  ShutdownOnExit shutdown{transport, std::chrono::seconds(3)};
  if (!o.address_file.empty()) {
    ENDURE_RETURN_IF_ERROR(WriteFileAtomically(Env::Default(), o.address_file, *address));
  }
  StatusHttpServer http(shell);
  Result<std::string> http_address = http.Start(o.http_listen, o.token);
  if (!http_address.ok()) return http_address.status();
  ENDURE_RETURN_IF_ERROR(
      WriteFileAtomically(Env::Default(), JoinPath(o.state_dir, "http.addr"), *http_address));
  std::fprintf(stderr, "endure controller: job '%s' listening on %s (gRPC), http://%s/ (metrics)\n",
               o.spec.name.c_str(), address->c_str(), http_address->c_str());

  while (!shell.done()) shell.RunOnce(/*block=*/true);
  Result<int> code = shell.Finish();
  if (!code.ok()) return code;
  // The agents were told to shut down: give them their grace period to stop
  // their workers and hang up; ShutdownOnExit ends the streams of any that
  // did not.
  const auto deadline =
      std::chrono::steady_clock::now() + o.spec.recovery.grace_period + std::chrono::seconds(3);
  while (!shell.AgentsGone() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return code;
}

}  // namespace

Result<int> RunController(const ControllerOptions& options) {
  if (options.token.empty()) {
    return InvalidArgument("no job token: set ENDURE_TOKEN or --token-file");
  }
  std::optional<tls::Identity> identity;
  if (!options.tls_dir.empty()) {
    Result<tls::Identity> loaded = tls::LoadIdentity(options.tls_dir, tls::kControllerName);
    if (!loaded.ok()) return InvalidArgument("--tls-dir: " + loaded.status().message());
    identity = std::move(loaded).value();
  } else if (!IsLoopbackHost(HostOfAddress(options.listen))) {
    return InvalidArgument("--listen " + options.listen +
                           " is beyond loopback: agents there need mutual TLS; pass --tls-dir "
                           "DIR with certificates from `endure certs --dir DIR --nodes ...` "
                           "(docs/security.md)");
  }
  // SIGTERM and SIGINT (Slurm, Kubernetes, Ctrl-C) are taken by one thread
  // with sigtimedwait, never by a handler: they are blocked before any other
  // thread exists, so every thread inherits the mask.
  sigset_t stop_signals, previous;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &previous);
  Result<int> code = Internal("the controller did not run");
  {
    GrpcTransport transport({.listen = options.listen,
                             .max_message_bytes = kMaxMessageBytes,
                             // A thread per stream the shell takes, and gRPC's own pollers.
                             .max_threads = 2 * MaxConnections(options.spec) + 32,
                             .tls = identity});
    // Made after the transport, so destroyed before it: Serve shuts the
    // transport down (no more calls into the shell) before it returns.
    ControllerShell shell(options, Clock::Real(), &transport, PickFreePort);
    std::atomic<bool> done{false};
    std::thread signals([&] {
      while (!done) {
        const timespec poll{0, 100 * 1000 * 1000};
        const int sig = sigtimedwait(&stop_signals, nullptr, &poll);
        if (sig > 0) shell.OnSignal(sig);
      }
    });
    code = Serve(options, shell, transport);
    done = true;
    signals.join();
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return code;
}

}  // namespace endure::controller
