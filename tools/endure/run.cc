// `endure run JOB.toml`, or `endure run --nproc-per-node N script.py ARGS`
// as torchrun (launch.h): the embedded single-machine mode. Starts the
// controller and one agent per node as child processes on 127.0.0.1, brings
// up a replacement node when one dies (after the spec's repair_delay,
// standing in for a spare machine), shows a live status line, prints the
// report, and exits with the job's code: 0 completed, 3 gave up, 2 bad spec.
// SIGTERM or SIGINT (Ctrl-C, Slurm, Kubernetes) stops everything it started,
// within the grace period and a margin, and exits with 128 + the signal.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "common/env.h"
#include "common/secret.h"
#include "common/shipped_files.h"
#include "common/subprocess.h"
#include "common/tls.h"
#include "controller/etcd_client.h"
#include "controller/job_spec.h"
#include "controller/report.h"
#include "tools/endure/launch.h"
#include "tools/endure/verbs.h"

namespace endure::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }

// After a stop signal, what the controller and agents may take beyond the
// grace period (the agents' last persist, the controller's commit, report
// and goodbyes) before what is left is killed.
constexpr auto kStopMargin = std::chrono::seconds(6);
// A controller that dies is started again this many times at most in one run.
constexpr int kMaxControllerRestarts = 3;

std::string SelfExe() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  return n > 0 ? std::string(exe, static_cast<size_t>(n)) : "endure";
}

// The live status line, from the controller's STATE_DIR/status.json.
std::string StatusLine(const std::string& state_dir) {
  Result<std::string> text = Env::Default()->ReadFile(JoinPath(state_dir, "status.json"));
  if (!text.ok()) return "";
  nlohmann::json s = nlohmann::json::parse(*text, nullptr, false);
  if (!s.is_object()) return "";
  char line[480];
  std::string loss = s["loss"].is_number() ? "" : "nan";
  if (loss.empty()) {
    char b[32];
    std::snprintf(b, sizeof b, "%.4f", s["loss"].get<double>());
    loss = b;
  }
  std::snprintf(line, sizeof line,
                "[%7.1fs] gen %d | %-9s | step %6lld | loss %s | %6.0f tok/s | ETTR %.3f | "
                "incidents %d%s",
                s.value("elapsed_s", 0.0), s.value("generation", 0),
                s.value("phase", std::string("?")).c_str(),
                static_cast<long long>(s.value("step", int64_t{0})), loss.c_str(),
                s.value("tokens_per_s", 0.0), s.value("ettr", 0.0), s.value("incidents", 0),
                s.contains("last_incident")
                    ? (" (last: " + s["last_incident"].get<std::string>() +
                       (s.contains("last_route") ? ", route " + s["last_route"].get<std::string>()
                                                 : std::string()) +
                       ")")
                          .c_str()
                    : "");
  return line;
}

// Waits for `p` to end until `deadline`, then kills its process group; reaps it.
void ReapBy(Subprocess& p, Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (!p.WaitFor(std::max(left, std::chrono::milliseconds(0)))) {
    p.SignalGroup(SIGKILL);
    p.Signal(SIGKILL);
    p.Wait();
  }
}

class EmbeddedRun {
 public:
  EmbeddedRun(controller::JobSpec spec, bool quiet) : spec_(std::move(spec)), quiet_(quiet) {}
  int Run();

 private:
  // Starts `endure controller` listening on `listen` and waits for its
  // address.
  // `new_run`: the job starts afresh (its agents are new); otherwise the
  // controller carries on the run a dead one left (ControllerShell::CarryOn).
  Status StartController(const std::string& listen, bool new_run);
  Status StartAgent();
  // [control_plane] standby: a local etcd (its store under STATE_DIR/etcd,
  // made afresh), and a standby controller on standby_address_ that does
  // not listen until it holds the leadership lease. Not waited for.
  Status StartEtcd();
  Status StartStandby();
  void StopEtcd();
  // `--etcd ... --lease ...` for a controller, with a standby.
  void AddStandbyFlags(std::vector<std::string>& argv) const;
  void StopAll();
  // Stops everything after signal `sig` (see kStopMargin).
  void StopOnSignal(int sig);

  controller::JobSpec spec_;
  bool quiet_;
  std::string exe_ = SelfExe();
  std::string token_file_, address_, rules_;
  std::string tls_dir_;  // with [job] tls: STATE_DIR/tls, else empty
  std::optional<Subprocess> controller_;
  // With a standby: the other controller, which takes over when
  // controller_ dies (the two then swap places and a new standby starts
  // on the dead one's address), and the etcd they elect a leader through.
  std::optional<Subprocess> standby_;
  std::string standby_address_;
  std::optional<Subprocess> etcd_;
  std::string etcd_endpoint_;
  std::map<pid_t, std::pair<std::string, Subprocess>> agents_;  // pid -> (node, process)
  int next_node_ = 0;
};

// Whether the controller's end was no decision of its own: a signal it did
// not handle (SIGKILL, a crash) or an internal error. Its own ends are
// 0 (completed), 2 (configuration), 3 (gave up) and 128+N (stopped by N).
bool ControllerDied(const ExitStatus& e) { return !e.exited || e.code == kExitInternal; }

Status EmbeddedRun::StartController(const std::string& listen, bool new_run) {
  const std::string address_file = JoinPath(spec_.state_dir, "controller.addr");
  // A stale address would send the agents to a controller that is gone.
  ENDURE_RETURN_IF_ERROR(Env::Default()->RemoveFile(address_file));
  ProcessSpec ps;
  ps.argv = {exe_,           "controller",    "--spec",         spec_.path,
             "--state-dir",  spec_.state_dir, "--listen",       listen,
             "--token-file", token_file_,     "--address-file", address_file};
  if (!tls_dir_.empty()) ps.argv.insert(ps.argv.end(), {"--tls-dir", tls_dir_});
  if (new_run) ps.argv.push_back("--new-run");
  AddStandbyFlags(ps.argv);
  ps.output_path = JoinPath(spec_.state_dir, "controller.log");
  ps.new_process_group = true;
  ps.die_with_parent = true;
  ENDURE_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(ps));
  controller_.emplace(std::move(p));
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    Result<std::string> addr = Env::Default()->ReadFile(address_file);
    if (addr.ok() && !addr->empty()) {
      address_ = *addr;
      return Status::Ok();
    }
    if (std::optional<ExitStatus> e = controller_->WaitFor(std::chrono::milliseconds(20))) {
      controller_.reset();
      return Internal("the controller exited at start (" + e->ToString() + "); see " +
                      ps.output_path);
    }
  }
  return Internal("the controller did not start listening within 30s; see " + ps.output_path);
}

void EmbeddedRun::AddStandbyFlags(std::vector<std::string>& argv) const {
  if (etcd_endpoint_.empty()) return;
  const auto lease = std::chrono::duration_cast<std::chrono::seconds>(spec_.control_plane.lease);
  argv.insert(argv.end(),
              {"--etcd", etcd_endpoint_, "--lease", std::to_string(lease.count()) + "s"});
}

Status EmbeddedRun::StartEtcd() {
  const std::string data = JoinPath(spec_.state_dir, "etcd");
  // Leases outlive an etcd restart: a dead run's leader key would hold
  // this run's controllers off for its TTL.
  std::error_code ec;
  std::filesystem::remove_all(data, ec);
  if (ec) return IOError("cannot remove " + data + ": " + ec.message());
  ENDURE_ASSIGN_OR_RETURN(const int client_port, PickFreePort());
  ENDURE_ASSIGN_OR_RETURN(const int peer_port, PickFreePort());
  const std::string endpoint = "127.0.0.1:" + std::to_string(client_port);
  const std::string client_url = "http://" + endpoint;
  const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_port);
  ProcessSpec ps;
  ps.argv = {controller::kEtcdBinary,
             "--name",
             "endure",
             "--data-dir",
             data,
             "--listen-client-urls",
             client_url,
             "--advertise-client-urls",
             client_url,
             "--listen-peer-urls",
             peer_url,
             "--initial-advertise-peer-urls",
             peer_url,
             "--initial-cluster",
             "endure=" + peer_url,
             "--logger",
             "zap",
             "--log-level",
             "warn"};
  ps.output_path = JoinPath(spec_.state_dir, "etcd.log");
  ps.new_process_group = true;
  ps.die_with_parent = true;
  ENDURE_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(ps));
  etcd_.emplace(std::move(p));
  ENDURE_ASSIGN_OR_RETURN(std::unique_ptr<controller::EtcdClient> client,
                          controller::EtcdClient::Make({.endpoints = {endpoint}}));
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  Status answer = Unavailable("not asked");
  while (Clock::now() < deadline) {
    if (std::optional<ExitStatus> e = etcd_->WaitFor(std::chrono::milliseconds(50))) {
      etcd_.reset();
      return Internal("etcd exited at start (" + e->ToString() + "); see " + ps.output_path);
    }
    answer = client->Ping("/endure/" + spec_.name + "/leader",
                          Clock::now() + std::chrono::milliseconds(500));
    if (answer.ok()) {
      etcd_endpoint_ = endpoint;
      return Status::Ok();
    }
  }
  return Internal("etcd did not answer within 30s (" + answer.message() + "); see " +
                  ps.output_path);
}

Status EmbeddedRun::StartStandby() {
  // No address file: it listens only once it leads, and then on its own
  // address, which the agents have.
  ProcessSpec ps;
  ps.argv = {exe_,           "controller",    "--spec",   spec_.path,
             "--state-dir",  spec_.state_dir, "--listen", standby_address_,
             "--token-file", token_file_};
  if (!tls_dir_.empty()) ps.argv.insert(ps.argv.end(), {"--tls-dir", tls_dir_});
  AddStandbyFlags(ps.argv);
  ps.output_path = JoinPath(spec_.state_dir, "controller.log");
  ps.new_process_group = true;
  ps.die_with_parent = true;
  ENDURE_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(ps));
  standby_.emplace(std::move(p));
  return Status::Ok();
}

void EmbeddedRun::StopEtcd() {
  // After the controllers: a leader resigns through it on its way out.
  if (!etcd_) return;
  etcd_->SignalGroup(SIGTERM);
  ReapBy(*etcd_, Clock::now() + std::chrono::seconds(3));
  etcd_.reset();
}

Status EmbeddedRun::StartAgent() {
  const std::string node = "node" + std::to_string(next_node_++);
  const std::string work = JoinPath(JoinPath(spec_.state_dir, "nodes"), node);
  ENDURE_RETURN_IF_ERROR(Env::Default()->CreateDirs(work));
  if (!tls_dir_.empty()) {
    // Each node, replacements included, gets its own certificate of the
    // job's CA (made at start, reused across runs).
    ENDURE_RETURN_IF_ERROR(tls::MakeCertificates({.dir = tls_dir_, .nodes = {node}}));
  }
  ProcessSpec ps;
  // With a standby, both controllers: the agent attaches to whichever leads.
  const std::string controllers =
      standby_address_.empty() ? address_ : address_ + "," + standby_address_;
  ps.argv = {exe_,           "agent",     "--controller", controllers,
             "--node-id",    node,        "--ranks",      std::to_string(spec_.ranks_per_node),
             "--token-file", token_file_, "--work-dir",   work,
             "--log-rules",  rules_};
  if (spec_.recovery.warm_standby) ps.argv.push_back("--standby");
  if (!spec_.isolation.health_check) ps.argv.push_back("--no-health-check");
  // In milliseconds: exact, where FormatDuration rounds.
  const auto grace_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(spec_.control_plane.controller_grace);
  ps.argv.insert(ps.argv.end(), {"--controller-grace", std::to_string(grace_ms.count()) + "ms"});
  if (!tls_dir_.empty()) ps.argv.insert(ps.argv.end(), {"--tls-dir", tls_dir_});
  ps.output_path = JoinPath(work, "agent.log");
  // Every "node" shares this machine: one BLAS/OpenMP thread pool per core,
  // not per node, or the ranks fight over the cores (3x slower on 2 cores).
  if (std::getenv("OMP_NUM_THREADS") == nullptr && !spec_.env.count("OMP_NUM_THREADS")) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    ps.env.emplace_back("OMP_NUM_THREADS", std::to_string(std::max(1, cores / spec_.world_size())));
  }
  ps.new_process_group = true;
  ps.die_with_parent = true;
  ENDURE_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(ps));
  const pid_t pid = p.pid();
  agents_.emplace(pid, std::make_pair(node, std::move(p)));
  return Status::Ok();
}

void EmbeddedRun::StopAll() {
  if (controller_) controller_->SignalGroup(SIGTERM);
  if (standby_) standby_->SignalGroup(SIGTERM);
  for (auto& [pid, agent] : agents_) agent.second.SignalGroup(SIGTERM);
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  for (auto& [pid, agent] : agents_) ReapBy(agent.second, deadline);
  agents_.clear();
  if (controller_) ReapBy(*controller_, deadline);
  controller_.reset();
  if (standby_) ReapBy(*standby_, deadline);
  standby_.reset();
  StopEtcd();
}

void EmbeddedRun::StopOnSignal(int sig) {
  const auto start = Clock::now();
  g_signal = 0;  // a second signal skips to SIGKILL
  // Forwarded to every process at once, as a terminal or Slurm would: the
  // agents stop their workers within the grace period and persist the
  // newest step if time allows; the controller tells them to stop as well,
  // commits what they persisted and writes the report (stopped by `sig`).
  if (controller_) controller_->Signal(sig);
  if (standby_) standby_->Signal(sig);
  for (auto& [pid, agent] : agents_) agent.second.Signal(sig);
  const auto deadline = start + spec_.recovery.grace_period + kStopMargin;
  while ((controller_ || standby_ || !agents_.empty()) && g_signal == 0 &&
         Clock::now() < deadline) {
    if (controller_ && controller_->WaitFor(std::chrono::milliseconds(0))) controller_.reset();
    if (standby_ && standby_->WaitFor(std::chrono::milliseconds(0))) standby_.reset();
    for (auto it = agents_.begin(); it != agents_.end();) {
      if (it->second.second.WaitFor(std::chrono::milliseconds(0))) {
        it = agents_.erase(it);
      } else {
        ++it;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Whatever is left is killed with its process group; its workers die with
  // their agent (PR_SET_PDEATHSIG).
  for (auto& [pid, agent] : agents_) ReapBy(agent.second, Clock::now());
  agents_.clear();
  if (controller_) ReapBy(*controller_, Clock::now());
  controller_.reset();
  if (standby_) ReapBy(*standby_, Clock::now());
  standby_.reset();
  StopEtcd();
}

int EmbeddedRun::Run() {
  Env* env = Env::Default();
  if (Status st = env->CreateDirs(spec_.state_dir); !st.ok()) {
    std::fprintf(stderr, "endure run: %s\n", st.message().c_str());
    return kExitUsage;
  }
  Result<std::string> rules = spec_.detection.log_rules.empty()
                                  ? FindShippedConfig("log_rules", "[detection] log_rules")
                                  : Result<std::string>(spec_.detection.log_rules);
  if (!rules.ok()) {
    std::fprintf(stderr, "endure run: %s\n", rules.status().message().c_str());
    return kExitUsage;
  }
  rules_ = *rules;
  Result<std::string> token =
      spec_.token.empty() ? RandomHex(16) : Result<std::string>(spec_.token);
  if (!token.ok()) {
    std::fprintf(stderr, "endure run: %s\n", token.status().message().c_str());
    return kExitInternal;
  }
  token_file_ = JoinPath(spec_.state_dir, "token");
  if (Status st = env->RemoveFile(token_file_); !st.ok()) {
    std::fprintf(stderr, "endure run: %s\n", st.message().c_str());
    return kExitInternal;
  }
  int fd = ::open(token_file_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, token->data(), token->size()) < 0) {
    std::fprintf(stderr, "endure run: cannot write %s\n", token_file_.c_str());
    return kExitInternal;
  }
  ::close(fd);
  if (spec_.tls) {
    tls_dir_ = JoinPath(spec_.state_dir, "tls");
    // The controller's certificate now; each node's as its agent starts.
    if (Status st = tls::MakeCertificates({.dir = tls_dir_}); !st.ok()) {
      std::fprintf(stderr, "endure run: [job] tls: %s\n", st.message().c_str());
      return st.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitInternal;
    }
  }
  // A previous run's report must not pass for this one's. controller.db
  // stays: the controller begins a new run in it, after the earlier ones.
  for (const char* f : {"report.json", "status.json"}) {
    if (Status st = env->RemoveFile(JoinPath(spec_.state_dir, f)); !st.ok()) {
      std::fprintf(stderr, "endure run: %s\n", st.message().c_str());
      return kExitInternal;
    }
  }

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  std::printf("endure run: job '%s', %d node(s) x %d rank(s)%s, state in %s\n", spec_.name.c_str(),
              spec_.nodes, spec_.ranks_per_node,
              spec_.spares > 0 ? (" + " + std::to_string(spec_.spares) + " spare(s)").c_str() : "",
              spec_.state_dir.c_str());
  std::string listen = spec_.listen;
  if (spec_.control_plane.standby) {
    // Both controllers on fixed addresses: the agents list them before the
    // standby listens. The first leads (etcd is new), the second stands by.
    const std::string host = listen.substr(0, listen.rfind(':'));
    Result<int> first = PickFreePort();
    Result<int> second = PickFreePort();
    Status st =
        first.ok() && second.ok() ? StartEtcd() : (first.ok() ? second.status() : first.status());
    if (st.ok()) {
      if (listen.ends_with(":0")) listen = host + ":" + std::to_string(*first);
      standby_address_ = host + ":" + std::to_string(*second);
    }
    if (!st.ok()) {
      std::fprintf(stderr, "endure run: [control_plane] standby: %s\n", st.message().c_str());
      StopAll();
      return kExitInternal;
    }
  }
  if (Status st = StartController(listen, /*new_run=*/true); !st.ok()) {
    std::fprintf(stderr, "endure run: %s\n", st.message().c_str());
    StopAll();
    return kExitInternal;
  }
  if (spec_.control_plane.standby) {
    if (Status st = StartStandby(); !st.ok()) {
      std::fprintf(stderr, "endure run: %s\n", st.message().c_str());
      StopAll();
      return kExitInternal;
    }
    std::printf("endure run: controller %s leads, %s stands by (etcd %s, lease %s)\n",
                address_.c_str(), standby_address_.c_str(), etcd_endpoint_.c_str(),
                FormatDuration(spec_.control_plane.lease).c_str());
  }
  // The job's nodes, then its spares: the first to register run the job.
  for (int i = 0; i < spec_.nodes + spec_.spares; ++i) {
    if (Status st = StartAgent(); !st.ok()) {
      std::fprintf(stderr, "endure run: %s\n", st.message().c_str());
      StopAll();
      return kExitInternal;
    }
  }

  const bool tty = isatty(STDOUT_FILENO) == 1;
  int controller_restarts = 0;
  std::vector<Clock::time_point> replacements;
  auto last_line = Clock::now() - std::chrono::hours(1);
  std::optional<ExitStatus> controller_exit;
  while (!controller_exit) {
    if (const int sig = g_signal; sig != 0) {
      std::printf("\nendure run: interrupted by %s; stopping the controller, agents and workers\n",
                  sig == SIGINT    ? "SIGINT"
                  : sig == SIGTERM ? "SIGTERM"
                                   : strsignal(sig));
      std::fflush(stdout);
      StopOnSignal(sig);
      Result<std::string> report = env->ReadFile(JoinPath(spec_.state_dir, "report.json"));
      nlohmann::json j =
          report.ok() ? nlohmann::json::parse(*report, nullptr, false) : nlohmann::json();
      if (j.is_object()) std::printf("%s", controller::RenderReport(j).c_str());
      std::printf("endure run: stopped by signal %d; report: %s\n", sig,
                  j.is_object() ? JoinPath(spec_.state_dir, "report.json").c_str() : "none");
      return 128 + sig;
    }
    controller_exit = controller_->WaitFor(std::chrono::milliseconds(100));
    if (standby_) {
      if (std::optional<ExitStatus> e = standby_->WaitFor(std::chrono::milliseconds(0))) {
        // An end of its own means the job ended (the leader ends too); a
        // standby that died is started again.
        standby_.reset();
        if (ControllerDied(*e) && controller_restarts < kMaxControllerRestarts) {
          ++controller_restarts;
          std::printf(
              "%sendure run: the standby controller died (%s); restarting it on %s (%d of "
              "%d)\n",
              tty ? "\n" : "", e->ToString().c_str(), standby_address_.c_str(), controller_restarts,
              kMaxControllerRestarts);
          std::fflush(stdout);
          if (Status st = StartStandby(); !st.ok()) {
            std::fprintf(stderr, "endure run: %s\n", st.message().c_str());
          }
        }
      }
    }
    if (controller_exit && ControllerDied(*controller_exit) && standby_ &&
        controller_restarts < kMaxControllerRestarts) {
      // The standby takes over once the dead leader's lease lapses; the
      // agents, which list both, move to it. A new standby comes up on the
      // dead one's address.
      ++controller_restarts;
      std::printf(
          "%sendure run: the controller on %s died (%s); the standby on %s takes over "
          "within the lease (%s); a new standby starts on %s (%d of %d)\n",
          tty ? "\n" : "", address_.c_str(), controller_exit->ToString().c_str(),
          standby_address_.c_str(), FormatDuration(spec_.control_plane.lease).c_str(),
          address_.c_str(), controller_restarts, kMaxControllerRestarts);
      std::fflush(stdout);
      controller_ = std::move(standby_);
      standby_.reset();
      controller_exit.reset();
      std::swap(address_, standby_address_);
      if (Status st = StartStandby(); !st.ok()) {
        std::fprintf(stderr, "endure run: %s\n", st.message().c_str());
      }
      continue;
    }
    if (controller_exit && ControllerDied(*controller_exit) &&
        controller_restarts < kMaxControllerRestarts) {
      // Killed (kill -9, the OOM killer) or failed: its agents ride out the
      // gap with their workers ([control_plane] controller_grace), so a new
      // controller on the same address carries the job on.
      ++controller_restarts;
      std::printf("%sendure run: the controller died (%s); restarting it on %s (%d of %d)\n",
                  tty ? "\n" : "", controller_exit->ToString().c_str(), address_.c_str(),
                  controller_restarts, kMaxControllerRestarts);
      std::fflush(stdout);
      controller_.reset();
      controller_exit.reset();
      if (Status st = StartController(address_, /*new_run=*/false); !st.ok()) {
        std::fprintf(stderr, "endure run: %s\n", st.message().c_str());
        StopAll();
        return kExitInternal;
      }
      continue;
    }
    if (controller_exit) break;
    for (auto it = agents_.begin(); it != agents_.end();) {
      if (std::optional<ExitStatus> e = it->second.second.WaitFor(std::chrono::milliseconds(0))) {
        std::printf("%sendure run: %s's agent ended (%s); a replacement node comes up in %s\n",
                    tty ? "\n" : "", it->second.first.c_str(), e->ToString().c_str(),
                    FormatDuration(spec_.recovery.repair_delay).c_str());
        replacements.push_back(Clock::now() + spec_.recovery.repair_delay);
        it = agents_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = replacements.begin(); it != replacements.end();) {
      if (Clock::now() >= *it) {
        if (Status st = StartAgent(); !st.ok()) {
          std::fprintf(stderr, "endure run: %s\n", st.message().c_str());
        }
        it = replacements.erase(it);
      } else {
        ++it;
      }
    }
    if (!quiet_ && (tty || Clock::now() - last_line > std::chrono::seconds(5))) {
      std::string line = StatusLine(spec_.state_dir);
      if (!line.empty()) {
        std::printf(tty ? "\r\033[K%s" : "%s\n", line.c_str());
        std::fflush(stdout);
        last_line = Clock::now();
      }
    }
  }
  if (tty) std::printf("\n");
  // The controller told the agents to shut down; give them a moment.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  for (auto& [pid, agent] : agents_) ReapBy(agent.second, deadline);
  agents_.clear();
  controller_.reset();
  // The standby saw the job's end in etcd and exits with its code.
  if (standby_) ReapBy(*standby_, deadline);
  standby_.reset();
  StopEtcd();

  Result<std::string> report = env->ReadFile(JoinPath(spec_.state_dir, "report.json"));
  nlohmann::json j =
      report.ok() ? nlohmann::json::parse(*report, nullptr, false) : nlohmann::json();
  if (!j.is_object()) {
    std::fprintf(stderr, "endure run: the controller ended (%s) without a report; see %s\n",
                 controller_exit->ToString().c_str(),
                 JoinPath(spec_.state_dir, "controller.log").c_str());
    return kExitInternal;
  }
  std::printf("%s", controller::RenderReport(j).c_str());
  std::printf("report: %s (endure report %s)\n", JoinPath(spec_.state_dir, "report.json").c_str(),
              spec_.state_dir.c_str());
  if (controller_exit->exited && controller_exit->code == kExitGaveUp) {
    std::printf("endure run: the job gave up: %s\n", j.value("verdict", std::string()).c_str());
  }
  return controller_exit->exited ? controller_exit->code : kExitInternal;
}

// The job spec a torchrun-style command line stands for (launch.h), written
// to STATE_DIR/job.toml (what to copy and edit to say more) once it is
// valid, and read back from there as the controller reads it.
Result<controller::JobSpec> LaunchedSpec(const LaunchFlags& flags) {
  ENDURE_ASSIGN_OR_RETURN(const std::string text, LaunchSpec(flags, ThisHost()));
  ENDURE_ASSIGN_OR_RETURN(const controller::JobSpec spec,
                          controller::ParseJobSpec(text, "endure run (its command line)"));
  ENDURE_RETURN_IF_ERROR(controller::ValidateForEmbeddedRun(spec));
  Env* env = Env::Default();
  const std::string path = JoinPath(spec.state_dir, "job.toml");
  if (Status st = env->CreateDirs(spec.state_dir); !st.ok()) {
    return InvalidArgument("cannot make the state directory " + spec.state_dir + ": " +
                           st.message() + " (--state-dir)");
  }
  if (Status st = WriteFileAtomically(env, path, text); !st.ok()) {
    return InvalidArgument("cannot write " + path + ": " + st.message() + " (--state-dir)");
  }
  return controller::LoadJobSpec(path);
}

}  // namespace

Verb AddRunVerb(CLI::App& root) {
  auto args = std::make_shared<std::vector<std::string>>();
  auto launch = std::make_shared<LaunchFlags>();
  auto quiet = std::make_shared<bool>(false);
  CLI::App* cmd = root.add_subcommand(
      "run",
      "Run a job on this machine: controller, one agent per node, the report at the end.\n"
      "  endure run JOB.toml\n"
      "  endure run --nproc-per-node N [--nnodes M] script.py [ARGS...]   (as torchrun)");
  // What follows the spec or the script is the script's own: not parsed here.
  cmd->prefix_command();
  // The launcher's flags: any of them (or a .py) says a script follows.
  auto flags = std::make_shared<std::vector<CLI::Option*>>();
  flags->push_back(
      cmd->add_option("--nproc-per-node,--nproc_per_node", launch->nproc_per_node,
                      "Workers per node: a number, or cpu, gpu, auto (torchrun's; default 1)"));
  flags->push_back(cmd->add_option(
      "--nnodes", launch->nnodes,
      "Nodes, each a process on this machine: M, or MIN:MAX to go on with as few as MIN when "
      "nodes are lost (default 1)"));
  flags->push_back(cmd->add_option(
      "--max-restarts,--max_restarts", launch->max_restarts,
      "Restarts within [recovery] restart_window before the job gives up (1 or more)"));
  flags->push_back(cmd->add_option("--run-id,--run_id,--rdzv-id,--rdzv_id", launch->run_id,
                                   "The job's name (default: the script's)"));
  flags->push_back(
      cmd->add_option("--state-dir", launch->state_dir,
                      "Where the job's state, logs and report go (default: endure-NAME here)"));
  flags->push_back(
      cmd->add_flag("-m,--module", launch->module, "The script is a Python module (python -m)"));
  flags->push_back(cmd->add_flag("--no-python,--no_python", launch->no_python,
                                 "The script is a program, run as it is"));
  flags->push_back(cmd->add_flag("--standalone")
                       ->description("Accepted for torchrun's command lines: a run is standalone"));
  auto ignored = std::make_shared<std::array<std::string, 2>>();
  flags->push_back(cmd->add_option("--rdzv-backend,--rdzv_backend", (*ignored)[0],
                                   "Accepted for torchrun's command lines (ignored)"));
  flags->push_back(cmd->add_option(
      "--rdzv-endpoint,--rdzv_endpoint", (*ignored)[1],
      "Accepted for torchrun's command lines: a run on this machine makes its own rendezvous"));
  cmd->add_flag("--quiet", *quiet, "No live status line");
  return {cmd, [cmd, args, launch, quiet, flags, ignored] {
            *args = cmd->remaining();
            // A script: any of the launcher's flags, or a .py. Else a spec,
            // with --quiet before or after it.
            const bool script = std::any_of(flags->begin(), flags->end(),
                                            [](const CLI::Option* o) { return o->count() > 0; }) ||
                                (!args->empty() && args->front().ends_with(".py"));
            Result<controller::JobSpec> spec = InvalidArgument("no job spec");
            if (script) {
              launch->command = *args;
              spec = LaunchedSpec(*launch);
            } else if (!args->empty() && args->front().starts_with("-")) {
              spec = InvalidArgument("unknown flag " + args->front() + " (endure run --help)");
            } else if (args->empty()) {
              spec = InvalidArgument(
                  "a job spec or a script: endure run JOB.toml, or endure run --nproc-per-node N "
                  "script.py [ARGS...]");
            } else {
              const auto extra = std::find_if(args->begin() + 1, args->end(),
                                              [](const std::string& a) { return a != "--quiet"; });
              if (extra != args->end()) {
                spec = InvalidArgument("unexpected '" + *extra + "' after the job spec " +
                                       args->front() + " (endure run --help)");
              } else {
                *quiet = *quiet || args->size() > 1;
                spec = controller::LoadJobSpec(args->front());
              }
            }
            if (!spec.ok()) {
              std::fprintf(stderr, "endure run: %s\n", spec.status().message().c_str());
              return kExitUsage;
            }
            if (Status st = controller::ValidateForEmbeddedRun(*spec); !st.ok()) {
              std::fprintf(stderr, "endure run: %s\n", st.message().c_str());
              return kExitUsage;
            }
            EmbeddedRun run(std::move(spec).value(), *quiet);
            return run.Run();
          }};
}

}  // namespace endure::cli
