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
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>

#include "common/clock.h"
#include "common/env.h"
#include "common/names.h"
#include "common/secret.h"
#include "common/subprocess.h"
#include "common/tls.h"
#include "controller/controller_shell.h"
#include "controller/dashboard_html.h"  // kDashboardHtml: dashboard.html, embedded
#include "controller/grpc_transport.h"
#include "controller/leader_election.h"

namespace endure::controller {
namespace {

constexpr int kMaxMessageBytes = 4 << 20;  // one AgentEvent (gRPC's receive limit)
constexpr char kChartJsPath[] = "/usr/share/javascript/chart.js/chart.min.js";

// /metrics (Prometheus), /api/status (JSON), /api/nodes and /api/incidents
// (a page of each table: ?page=N) and / (the dashboard), served from what
// the shell last published. Stop (or the destructor) before the shell
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
  std::string chart_js_;  // empty: not installed
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
  if (Result<std::string> js = Env::Default()->ReadFile(kChartJsPath); js.ok()) chart_js_ = *js;
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
  auto table = [this](ControllerShell::LiveTable which) {
    return [this, which](const httplib::Request& req, httplib::Response& res) {
      Result<nlohmann::json> page = shell_.TablePage(which, req.get_param_value("page"));
      if (!page.ok()) {
        res.status = 400;
        res.set_content(page.status().message() + "\n", "text/plain");
        return;
      }
      res.set_content(page->dump(), "application/json");
    };
  };
  http_.Get("/api/nodes", table(ControllerShell::LiveTable::kNodes));
  http_.Get("/api/incidents", table(ControllerShell::LiveTable::kIncidents));
  http_.Get("/api/history", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(shell_.HistoryJson(), "application/json");
  });
  http_.Get("/api/steptimes", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(shell_.StepTimesJson(), "application/json");
  });
  http_.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(kDashboardHtml, "text/html; charset=utf-8");
  });
  // The dashboard's charting library, from Debian's libjs-chart.js (no CDN:
  // the page works offline). Read once; without it the page shows its
  // figures and tables and says the charts need the package.
  http_.Get("/static/chart.js", [this](const httplib::Request&, httplib::Response& res) {
    if (chart_js_.empty()) {
      res.status = 404;
      res.set_content(std::string("Chart.js is not installed on the controller's host: install "
                                  "Debian's libjs-chart.js (") +
                          kChartJsPath + ")\n",
                      "text/plain");
      return;
    }
    res.set_header("Cache-Control", "max-age=86400");
    res.set_content(chart_js_, "text/javascript");
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

// With --etcd: stands by until this controller leads, or the job ends
// without it. Returns nothing once it leads (`candidate` then keeps the
// lease alive, and ends the process should it lapse), else the exit code:
// the job's under another leader, or 128 + N after stop signal N (taken
// from `stop_signals`, which are blocked).
Result<std::optional<int>> StandBy(const ControllerOptions& o, sigset_t stop_signals,
                                   std::unique_ptr<Candidate>* candidate) {
  ENDURE_ASSIGN_OR_RETURN(*candidate, Candidate::Make({.etcd = {.endpoints = o.etcd},
                                                       .job = o.spec.name,
                                                       .address = o.listen,
                                                       .election = {.lease_ttl = o.lease}}));
  int signal = 0;
  const auto stop = [&] {
    const timespec now{0, 0};
    const int sig = sigtimedwait(&stop_signals, nullptr, &now);
    if (sig > 0) signal = sig;
    return signal != 0;
  };
  const auto since = std::chrono::steady_clock::now();
  Result<Candidate::Outcome> outcome = (*candidate)->Campaign(stop);
  if (signal != 0) {
    std::fprintf(stderr, "endure controller: stopped by signal %d while standing by\n", signal);
    return std::optional<int>(128 + signal);
  }
  if (!outcome.ok()) return outcome.status();
  if (!outcome->leads) {
    std::fprintf(stderr, "endure controller: %s; exiting with it\n", outcome->reason.c_str());
    return std::optional<int>(outcome->exit_code);
  }
  std::fprintf(stderr, "endure controller: leading job '%s' on %s after %.1fs: %s\n",
               o.spec.name.c_str(), o.listen.c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count(),
               outcome->reason.c_str());
  (*candidate)->KeepLeading([](const std::string& why) {
    // Fencing: whatever this controller was doing, a standby may lead from
    // now on. Its state is in SQLite, journaled before each action, as for
    // a kill -9; the agents keep their workers and move to the new leader.
    std::fprintf(stderr, "endure controller: %s; exiting at once (fencing)\n", why.c_str());
    std::fflush(stderr);
    std::_Exit(1);
  });
  return std::optional<int>();
}

}  // namespace

Result<int> RunController(const ControllerOptions& options) {
  if (options.token.empty()) {
    return InvalidArgument("no job token: set ENDURE_TOKEN or --token-file");
  }
  if (!options.etcd.empty() && options.listen.ends_with(":0")) {
    return InvalidArgument("--etcd: --listen must name a port, got " + options.listen +
                           " (the agents list the address of every controller of the job)");
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
  std::unique_ptr<Candidate> candidate;
  if (!options.etcd.empty()) {
    Result<std::optional<int>> stood = StandBy(options, stop_signals, &candidate);
    if (!stood.ok() || stood->has_value()) {
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);
      if (!stood.ok()) return stood.status();
      return **stood;
    }
  }
  Result<int> code = Internal("the controller did not run");
  {
    GrpcTransport transport(
        {.listen = options.listen, .max_message_bytes = kMaxMessageBytes, .tls = identity});
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
  if (candidate) {
    // The job's end, for the standbys to exit with; after a failure only the
    // lease goes, so that a standby takes over at once.
    Status resigned = candidate->Resign(code.ok() ? std::optional<int>(*code) : std::nullopt);
    if (!resigned.ok()) {
      std::fprintf(stderr, "endure controller: resigning the leadership: %s\n",
                   resigned.message().c_str());
    }
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return code;
}

}  // namespace endure::controller
