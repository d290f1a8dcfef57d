// The per-node agent: its commands, the worker datagram socket, the
// shutdown on a signal (the Agent of agent/agent_shell.h), and RunAgent,
// which runs one on the real clock, the gRPC transport and real processes.
#include "agent/agent.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include "agent/agent_shell.h"
#include "agent/grpc_transport.h"
#include "agent/process_launcher.h"
#include "checkpoint/restore_plan.h"
#include "common/config_files.h"
#include "common/hash.h"
#include "common/mutex.h"
#include "common/names.h"
#include "common/net.h"
#include "common/secret.h"
#include "common/shipped_files.h"
#include "common/tls.h"
#include "contract/worker_contract.h"
#include "faults/fault.h"
#include "proto/wire_enums.h"

namespace endure::agent {
namespace {

// SIGTERM and SIGINT: the handler records the signal and wakes the
// shutdown thread through an eventfd (both async-signal-safe).
std::atomic<int> g_signal{0};
int g_signal_fd = -1;

void OnTerminationSignal(int sig) {
  g_signal = sig;
  const uint64_t one = 1;
  if (g_signal_fd >= 0) {
    const ssize_t ignored = ::write(g_signal_fd, &one, sizeof one);
    (void)ignored;
  }
}

// The grace a stop gives workers before SIGKILL when the controller has not
// said (its [recovery] grace_period defaults to the same).
constexpr double kDefaultGraceS = 2.0;
// On SIGTERM, how long after the workers are gone a shard of the node's
// newest complete step may still start being persisted.
constexpr auto kShutdownPersistFor = std::chrono::seconds(1);
// How often a wait between reconnection attempts looks at the clock.
constexpr auto kOutagePoll = std::chrono::milliseconds(10);
// How long a stop may wait on the controller's stream beyond its own work.
constexpr auto kStreamMargin = std::chrono::seconds(5);
// Refused datagrams: at most this many log lines at once, then one a second.
constexpr int kRefusalLogBurst = 20;

// Runs `fire` once if `deadline` passes before it is destroyed: a stop
// waits on the controller's stream (a Send, Finish), and a controller that
// stopped reading must not hold it for ever.
class Watchdog {
 public:
  Watchdog(std::chrono::steady_clock::time_point deadline, std::function<void()> fire)
      : thread_([this, deadline, fire = std::move(fire)] {
          MutexLock lock(&mu_);
          if (!cv_.WaitUntil(lock, deadline, [&]() REQUIRES(mu_) { return disarmed_; })) fire();
        }) {}
  ~Watchdog() {
    {
      MutexLock lock(&mu_);
      disarmed_ = true;
    }
    cv_.NotifyAll();
    thread_.join();
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool disarmed_ GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: it uses the members above
};

// Bounds on what the controller asks for (seconds).
double ClampSeconds(double s, double max) {
  return std::isfinite(s) ? std::clamp(s, 0.0, max) : 0.0;
}

// The names of the agent's environment variables whose value holds
// `secret`: none of them may reach a worker.
std::vector<std::string> VariablesHolding(const std::string& secret) {
  std::vector<std::string> names = {worker_env::kToken};
  if (secret.empty()) return names;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry = *e;
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    if (entry.substr(eq + 1).find(secret) != std::string_view::npos) {
      names.emplace_back(entry.substr(0, eq));
    }
  }
  return names;
}

// A TCP port free on every address of this host a moment ago (bound to port
// 0 and released): c10d's store listens on all of them.
Result<int> PickPortOnThisHost() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IOError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return IOError(std::string("bind 0.0.0.0:0: ") + std::strerror(err));
  }
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

// The restore plan with its T2 sources, which the controller names relative
// to the durable directory, under `t2_dir` (this host's). Unchanged when
// there is none, or when it does not parse (the workers then say why).
std::string ResolveDurableSources(const std::string& plan_json, const std::string& t2_dir) {
  Result<checkpoint::RestorePlan> plan = checkpoint::RestorePlanFromJson(plan_json);
  if (!plan.ok()) return plan_json;
  bool changed = false;
  for (checkpoint::RestoreSource& s : plan->sources) {
    if (s.copy.tier != checkpoint::Tier::kT2 || s.copy.path.empty() || s.copy.path[0] == '/') {
      continue;
    }
    s.copy.path = JoinPath(t2_dir, s.copy.path);
    changed = true;
  }
  return changed ? checkpoint::RestorePlanToJson(*plan).dump() : plan_json;
}

}  // namespace

Agent::Agent(AgentOptions options, core::LogClassifier classifier, AgentSeams seams)
    : o_(std::move(options)),
      classifier_(std::move(classifier)),
      seams_(std::move(seams)),
      clock_(seams_.clock),
      transport_(seams_.transport),
      launcher_(seams_.launcher),
      grace_s_(kDefaultGraceS) {
  ENDURE_CHECK(clock_ != nullptr && transport_ != nullptr && launcher_ != nullptr &&
               seams_.env != nullptr);
}

core::NodeTime Agent::Now() const { return {clock_->Now(), clock_->WallSeconds()}; }

void Agent::Post(core::NodeInput input) {
  loop_.Post([this, input = std::move(input)] {
    loop_.AssertOnLoop();
    if (machine_) CarryOut(machine_->Step(input, Now()));
  });
}

bool Agent::Decide(const core::NodeInput& input) {
  return loop_.Call([&] {
    loop_.AssertOnLoop();
    return machine_ && CarryOut(machine_->Step(input, Now()));
  });
}

void Agent::SetWorkers(std::unique_ptr<WorkerGroup> group) {
  loop_.Call([&] {
    loop_.AssertOnLoop();
    loop_workers_ = nullptr;
  });
  workers_ = std::move(group);
  WorkerGroup* const now = workers_.get();
  loop_.Call([&] {
    loop_.AssertOnLoop();
    loop_workers_ = now;
  });
}

bool Agent::CarryOut(std::vector<core::NodeAction> actions) {
  bool carry_out = false;
  // Writes after one that failed are not tried: they go back to the core,
  // in order, for the next stream.
  std::vector<proto::AgentEvent> unsent;
  for (core::NodeAction& action : actions) {
    if (auto* t = std::get_if<core::Transmit>(&action)) {
      if (!unsent.empty() || !transport_->Send(t->event)) unsent.push_back(std::move(t->event));
    } else if (const auto* line = std::get_if<core::LogLine>(&action)) {
      std::fprintf(stderr, "endure agent %s: %s\n", o_.node_id.c_str(), line->text.c_str());
    } else if (std::holds_alternative<core::CarryOut>(action)) {
      carry_out = true;
    } else if (const auto* refill = std::get_if<core::RefillStandbys>(&action)) {
      while (static_cast<int>(standbys_.size()) < refill->count) {
        Result<Standby> standby =
            launcher_->StartStandby(refill->program.argv, refill->program.env, secret_variables_);
        if (!standby.ok()) break;  // cold starts still work
        standbys_.push_back(std::move(standby).value());
      }
    } else if (const auto* keep = std::get_if<core::DiscardOtherStandbys>(&action)) {
      std::erase_if(standbys_, [&](Standby& standby) {
        if (standby.argv == keep->program.argv && standby.env == keep->program.env) return false;
        launcher_->DiscardStandby(standby);
        return true;
      });
    } else if (const auto* n = std::get_if<core::NotifySnapshot>(&action)) {
      tiers_->Notify({n->rank, n->step, n->shards, n->path, n->durable});
    } else if (const auto* f = std::get_if<core::ForgetLastWords>(&action)) {
      if (loop_workers_ != nullptr) loop_workers_->ForgetLastWords(f->rank);
    } else if (const auto* b = std::get_if<core::BreakPairTests>(&action)) {
      pair_fault_ = b->fail ? PairFault::Fail() : PairFault::Slow(b->slow_factor);
      if (pair_server_) {
        if (Status st = pair_server_->set_fault(pair_fault_); !st.ok()) {
          std::fprintf(stderr, "endure agent %s: %s\n", o_.node_id.c_str(), st.message().c_str());
        }
      }
    }
  }
  if (!unsent.empty()) {
    std::vector<core::NodeAction> none =
        machine_->Step(core::TransmitFailed{std::move(unsent)}, Now());
    ENDURE_CHECK(none.empty());
  }
  return carry_out;
}

void Agent::Send(proto::AgentEvent event, int64_t generation) {
  Post(core::Report{std::move(event), generation});
}

Status Agent::OpenSocket() {
  socket_path_ = JoinPath(o_.work_dir, o_.node_id + ".sock");
  if (socket_path_.size() >= sizeof(sockaddr_un::sun_path)) {
    socket_path_ = "/tmp/endure-" + std::to_string(::getpid()) + "-" + o_.node_id + ".sock";
  }
  ::unlink(socket_path_.c_str());
  socket_fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path_.c_str());
  if (socket_fd_ < 0 || ::bind(socket_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return IOError("cannot bind the worker socket " + socket_path_);
  }
  ::chmod(socket_path_.c_str(), 0600);
  timeval tv{0, 200 * 1000};  // wake up to notice shutdown
  ::setsockopt(socket_fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  int size = 4 << 20;
  ::setsockopt(socket_fd_, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  return Status::Ok();
}

void Agent::ReceiveDatagrams() {
  Clock::TimePoint next_beat = clock_->Now();
  while (!done_) {
    // The controller hears from the agent every second, whatever the
    // workers do; silence means a frozen or cut-off node.
    if (clock_->Now() >= next_beat) {
      proto::AgentEvent beat;
      beat.mutable_heartbeat();
      Send(std::move(beat));
      next_beat += std::chrono::seconds(1);
    }
    // Up to 200 ms for a datagram (then a heartbeat may be due, or done_).
    pollfd ready{socket_fd_, POLLIN, 0};
    if (::poll(&ready, 1, 200) <= 0) continue;
    MutexLock lock(&receive_mu_);
    PostWaitingDatagrams();
  }
}

void Agent::PostWaitingDatagrams() {
  // One byte more than the largest datagram accepted; MSG_TRUNC makes recv
  // return the real size of a larger one, which the core refuses.
  datagram_.resize(contract::kMaxDatagramBytes + 1);
  for (;;) {
    const ssize_t n =
        ::recv(socket_fd_, datagram_.data(), datagram_.size(), MSG_TRUNC | MSG_DONTWAIT);
    if (n < 0) return;  // none waiting (or the socket is gone)
    const size_t size = static_cast<size_t>(n);
    if (size == 0) continue;  // WakeReceiver's
    Post(core::DatagramArrived{std::string(datagram_.data(), std::min(size, datagram_.size())),
                               size});
  }
}

void Agent::WakeReceiver() {
  // An empty datagram: its recv returns at once, where the receive timeout
  // would take up to 200 ms.
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path_.c_str());
  (void)::sendto(fd, "", 0, MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::close(fd);
}

void Agent::OnWorkerLine(int64_t generation, int rank, std::string_view line) {
  Post(core::OutputLine{generation, rank, std::string(line)});
}

void Agent::OnWorkerExit(int64_t generation, const WorkerEnd& end) {
  // A worker that finished leaves its final state durable before the
  // controller hears that it finished.
  if (end.status.Success()) tiers_->PersistNewest(end.rank);
  // What it sent before it died is in the socket's buffer by now: it goes
  // to the loop first (a kill it reported firing must not fire again in
  // the next generation because its report came after the exit).
  MutexLock lock(&receive_mu_);
  PostWaitingDatagrams();
  core::WorkerExited exited;
  exited.generation = generation;
  exited.rank = end.rank;
  exited.exited = end.status.exited;
  exited.exit_code = end.status.code;
  exited.signal = end.status.signal;
  exited.stopped = end.stopped;
  exited.tail = end.tail;
  // The node's kernel records of this generation (an Xid the worker only saw
  // as a CUDA error) are evidence too.
  if (!end.status.Success() && seams_.kernel_log != nullptr) {
    exited.kernel_records = seams_.kernel_log->After(kernel_mark_);
  }
  Post(std::move(exited));
}

core::StandbyProgram Agent::ProgramOf(
    const google::protobuf::RepeatedPtrField<std::string>& command,
    const google::protobuf::Map<std::string, std::string>& env) const {
  core::StandbyProgram program;
  program.argv.assign(command.begin(), command.end());
  if (!program.argv.empty()) program.argv[0] = ResolveProgram(program.argv[0]);
  for (const auto& [k, v] : env) {
    program.env.emplace_back(k, k == worker_env::kCkptDir ? ResolveCheckpointDir(v) : v);
  }
  std::sort(program.env.begin(), program.env.end());  // a protobuf map has no order
  return program;
}

std::optional<Standby> Agent::TakeStandby(const core::StandbyProgram& program) {
  return loop_.Call([&]() -> std::optional<Standby> {
    loop_.AssertOnLoop();
    for (auto it = standbys_.begin(); it != standbys_.end(); ++it) {
      if (it->argv == program.argv && it->env == program.env) {
        Standby s = std::move(*it);
        standbys_.erase(it);
        return s;
      }
    }
    return std::nullopt;
  });
}

void Agent::Prepare(const proto::Prepare& prepare) {
  if (prepare.command().empty()) return;
  Post(core::StandbysWanted{ProgramOf(prepare.command(), prepare.env()), prepare.standbys()});
}

void Agent::Start(int64_t generation, const proto::StartGeneration& start) {
  // An in-process restart keeps the live workers of the ranks this node
  // still runs: they are offered the new generation, the others start.
  // (A spare node taking a lost node's ranks has no workers yet: all of
  // its ranks start, and take the state from the ranks elsewhere.)
  const bool rejoin = start.rejoin() && workers_ != nullptr;
  std::map<int, pid_t> alive;   // by the rank each serves in the new generation
  std::map<int, int> rank_was;  // new rank -> the rank it served before
  if (rejoin) {
    // A live worker keeps its place on the node (its local rank); its rank
    // changes when the generation has fewer or more nodes before this one
    // (an elastic shrink or regrow). Its earlier output is forgotten.
    const std::vector<int> before = LocalRanks();
    std::map<int, int> rank_of_local;
    for (const proto::RankAssignment& r : start.ranks()) rank_of_local[r.local_rank()] = r.rank();
    for (const auto& [rank, pid] : workers_->Pids()) {
      const auto local = std::find(before.begin(), before.end(), rank) - before.begin();
      auto next = rank_of_local.find(static_cast<int>(local));
      if (next == rank_of_local.end()) {
        workers_->Signal(rank, SIGKILL);  // no longer this node's
      } else if (workers_->Rejoin(rank, next->second)) {
        alive[next->second] = pid;
        rank_was[next->second] = rank;
      }
    }
  } else if (workers_) {
    workers_->StopAll(std::chrono::milliseconds(0));
  }
  if (seams_.kernel_log != nullptr) kernel_mark_ = seams_.kernel_log->Mark();
  // This generation's credential: its workers' ENDURE_TOKEN, and the only
  // one their datagrams are taken with. A failure to make one fails the
  // start of every rank (reported as exits, like a program that will not run).
  Result<std::string> credential = RandomHex(16);
  const core::StandbyProgram program = ProgramOf(start.command(), start.env());
  const std::vector<std::string>& argv = program.argv;
  // The new generation's gate and a clean slate of reports, at once, before
  // any of its workers runs: a datagram the new gate admits is never
  // cleared after it.
  core::GenerationStarted started;
  started.generation = generation;
  started.credential = credential.ok() ? *credential : "";
  for (const proto::RankAssignment& r : start.ranks()) {
    started.ranks.insert(r.rank());
    // The factor of each comm-slow fault of a local rank: the node's
    // pairwise tests crawl by it once it fires.
    Result<std::vector<faults::Fault>> faults = faults::DecodeFaults(r.faults_json());
    if (!faults.ok()) continue;
    for (const faults::Fault& f : *faults) {
      if (f.kind == faults::FaultKind::kCommSlow) started.comm_slow_factors[f.id] = f.factor;
    }
  }
  started.rejoin = rejoin;
  started.progress_pattern = start.progress_pattern();
  started.world_size = start.world_size();
  started.standby = program;
  started.persist_every_steps = start.checkpoint().persist_every_steps();
  generation_ = generation;
  Post(std::move(started));
  WorkerSet::LineObserver on_line;
  if (!start.progress_pattern().empty()) {
    on_line = [this](int rank, std::string_view line) { OnWorkerLine(generation_, rank, line); };
  }
  // A worker reports its exit in the generation it serves when it exits:
  // one that rejoined serves the newest.
  if (!rejoin) {
    SetWorkers(launcher_->NewGroup([this](const WorkerEnd& end) { OnWorkerExit(generation_, end); },
                                   std::move(on_line)));
  }
  if (argv.empty()) return;
  const proto::CheckpointConfig& ckpt = start.checkpoint();
  // T2 as this host sees it: the controller sends the spec's directory.
  const std::string durable_dir = ResolveCheckpointDir(ckpt.dir());
  TierConfig tiers;
  tiers.durable_dir = durable_dir;
  tiers.replica_peer = ckpt.replica_peer();
  tiers.memory_budget = ckpt.memory_budget();
  // An in-process restart keeps what the tiers do unless the replica peer
  // moved (a spare took a node's place): Configure first drains the copies
  // in flight, which the ranks that kept their state need not wait for.
  if (!start.rejoin() || tiers_->config() != tiers) tiers_->Configure(tiers, ckpt.discard_after());
  std::string skip;
  for (int64_t s : start.skip_steps()) skip += (skip.empty() ? "" : ",") + std::to_string(s);
  std::error_code ec;
  // Absolute: workers may change their directory before they write there.
  const std::string logs = std::filesystem::absolute(JoinPath(o_.work_dir, "logs"), ec).string();
  if (Status st = seams_.env->CreateDirs(logs); !st.ok()) {
    std::fprintf(stderr, "endure agent %s: %s\n", o_.node_id.c_str(), st.message().c_str());
  }
  // The restore plan goes to the workers as a file: a plan of many shards
  // does not fit an environment variable (E2BIG, ~128 KiB per string).
  std::string plan_path;
  if (!ckpt.restore_plan_json().empty()) {
    plan_path = JoinPath(logs, "gen" + std::to_string(generation) + ".restore-plan.json");
    const std::string plan = ResolveDurableSources(ckpt.restore_plan_json(), durable_dir);
    if (Status st = WriteFileAtomically(seams_.env, plan_path, plan); !st.ok()) {
      std::fprintf(stderr, "endure agent %s: cannot write the restore plan: %s\n",
                   o_.node_id.c_str(), st.message().c_str());
      plan_path.clear();  // the workers then fail their restore, and say why
    }
  }
  const std::string host_interface = IsLoopbackHost(o_.host) ? "" : InterfaceWithAddress(o_.host);
  // A job that reads no progress from its workers' output, and does not
  // turn it off ([job] env ENDURE_AUTOSTEP = "0"), gets step progress from a
  // PyTorch program's optimizer (docs/progress_pattern.md).
  const std::optional<std::string> python_dir = ShippedPythonDir();
  const bool autostep = start.progress_pattern().empty() && python_dir.has_value() &&
                        start.env().count(worker_env::kAutostep) == 0;
  for (const proto::RankAssignment& r : start.ranks()) {
    WorkerSpec spec;
    spec.rank = r.rank();
    spec.argv = argv;
    const std::string name =
        "gen" + std::to_string(generation) + "-rank" + std::to_string(r.rank());
    spec.log_path = JoinPath(logs, name + ".log");
    spec.stacks_path = JoinPath(logs, name + ".stacks");
    spec.env = {
        {"RANK", std::to_string(r.rank())},
        {"LOCAL_RANK", std::to_string(r.local_rank())},
        {"WORLD_SIZE", std::to_string(start.world_size())},
        {"LOCAL_WORLD_SIZE", std::to_string(start.ranks_size())},
        {"GROUP_RANK", std::to_string(r.rank() / std::max(1, start.ranks_size()))},
        // The rest of what torchrun gives a worker: one role, and a
        // restart count (each generation is one).
        {"GROUP_WORLD_SIZE", std::to_string(start.world_size() / std::max(1, start.ranks_size()))},
        {"ROLE_NAME", "default"},
        {"ROLE_RANK", std::to_string(r.rank())},
        {"ROLE_WORLD_SIZE", std::to_string(start.world_size())},
        {"TORCHELASTIC_RESTART_COUNT", std::to_string(generation)},
        // No agent store: rank 0 serves the rendezvous (env://).
        {"TORCHELASTIC_USE_AGENT_STORE", "False"},
        {"MASTER_ADDR", start.master_addr()},
        {"MASTER_PORT", std::to_string(start.master_port())},
        {worker_env::kAgentSocket, socket_path_},
        {worker_env::kToken, credential.ok() ? *credential : ""},
        {worker_env::kGeneration, std::to_string(generation)},
        {worker_env::kNodeId, o_.node_id},
        {worker_env::kRestoreStep, std::to_string(start.restore_step())},
        {worker_env::kSkipSteps, skip},
        {worker_env::kFaults, r.faults_json()},
        {worker_env::kStacksFile, spec.stacks_path}};
    for (const auto& [k, v] : start.env()) {
      if (autostep && k == "PYTHONPATH") continue;  // merged below
      spec.env.emplace_back(k, k == worker_env::kCkptDir ? ResolveCheckpointDir(v) : v);
    }
    if (autostep) {
      // Step progress of an unmodified PyTorch program, from its optimizer
      // (python/endure/autostep.py): the package's sitecustomize in front
      // of the path the job or this agent gives.
      std::string path = JoinPath(*python_dir, "autostep") + ":" + *python_dir;
      if (auto it = start.env().find("PYTHONPATH"); it != start.env().end()) {
        if (!it->second.empty()) path += ":" + it->second;
      } else if (const char* mine = std::getenv("PYTHONPATH"); mine != nullptr && *mine != 0) {
        path += ":" + std::string(mine);
      }
      spec.env.emplace_back("PYTHONPATH", path);
      spec.env.emplace_back(worker_env::kAutostep, "1");
    }
    // Gloo and NCCL's bootstrap bind to the address the host's name resolves
    // to, which on a multi-homed host or in a network namespace is not where
    // the node is reached (its --host): name them its interface, unless the
    // job or the agent's environment names one.
    for (const char* variable : {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}) {
      if (!host_interface.empty() && start.env().count(variable) == 0 &&
          std::getenv(variable) == nullptr) {
        spec.env.emplace_back(variable, host_interface);
      }
    }
    spec.unset_env = secret_variables_;
    if (ckpt.enabled()) {
      spec.env.emplace_back(worker_env::kT0Dir, tiers_->t0_dir());
      spec.env.emplace_back(worker_env::kT0SlotBytes, std::to_string(ckpt.slot_bytes()));
    }
    const auto rejoin_path = [&](int rank) {
      return JoinPath(logs, "rank" + std::to_string(rank) + ".rejoin");
    };
    if (start.in_process()) spec.env.emplace_back(worker_env::kRejoinFile, rejoin_path(r.rank()));
    const bool keep = alive.count(r.rank()) > 0;
    if (!keep) {
      // A fresh worker; a stale offer of an earlier generation must not
      // outlive the process it was meant for.
      std::error_code ignored;
      std::filesystem::remove(rejoin_path(r.rank()), ignored);
    }
    switch (core::RestoreRouteOf(start.rejoin(), keep, !plan_path.empty())) {
      case core::RestoreRoute::kFromPeers:
        spec.env.emplace_back(worker_env::kPeerRestore, "1");
        break;
      case core::RestoreRoute::kFromPlan:
        spec.env.emplace_back(worker_env::kRestorePlanFile, plan_path);
        break;
      case core::RestoreRoute::kKeepsItsState:
      case core::RestoreRoute::kFromScratch:
        break;
    }
    if (start.rejoin() && !plan_path.empty()) {
      // A program whose ranks each hold only a shard of the state (FSDP)
      // cannot take a dead rank's part from a peer: it reads the plan's
      // step from the tiers instead, in its kept process.
      spec.env.emplace_back(worker_env::kRestorePlanFile, plan_path);
    }
    Status st = Unavailable("no standby");
    if (!credential.ok()) {
      st = credential.status().WithContext("cannot make this generation's worker credential");
    } else if (keep) {
      // The live worker is offered this generation (client.h Rejoin) where
      // it looks: the file of the rank it served; the offer names the file
      // of its new rank for the next one.
      st = PublishFile(seams_.env, rejoin_path(rank_was[r.rank()]), AssignmentText(spec.env));
    } else {
      if (std::optional<Standby> standby = TakeStandby(program)) {
        const pid_t pid = standby->process ? standby->process->pid() : 0;
        st = workers_->Adopt(std::move(*standby), spec);
        if (st.ok()) {
          std::fprintf(stderr, "endure agent %s: rank %d starts in a warm standby (pid %d)\n",
                       o_.node_id.c_str(), r.rank(), static_cast<int>(pid));
        }
      }
      if (!st.ok()) st = workers_->Start(spec);
    }
    proto::AgentEvent e;
    if (!st.ok()) {
      // Reported as an exit, so the controller's policy handles it like one.
      auto* x = e.mutable_worker_exited();
      x->set_rank(r.rank());
      x->set_exited(true);
      x->set_exit_code(127);
      std::fprintf(stderr, "endure agent %s: %s\n", o_.node_id.c_str(), st.message().c_str());
    } else {
      e.mutable_worker_started()->set_rank(r.rank());
      e.mutable_worker_started()->set_pid(workers_->Pids()[r.rank()]);
      if (start.in_process() && &r == &start.ranks(0)) {
        e.mutable_worker_started()->set_free_port(FreePort());
      }
    }
    Send(std::move(e), generation);
  }
}

void Agent::Stop(int64_t generation, double grace_s) {
  grace_s = ClampSeconds(grace_s, 3600);
  grace_s_ = grace_s;
  const Clock::TimePoint start = clock_->Now();
  int count = 0;
  if (workers_) {
    count = static_cast<int>(workers_->Pids().size());
    workers_->StopAll(std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000)));
  }
  const double teardown_s = Seconds(clock_->Now() - start);
  // With the workers gone the memory tiers hold still: report them, verified,
  // once every snapshot the loop took in has gone to the tier store.
  loop_.Flush();
  tiers_->Drain();
  for (const auto& [tier, shard] : pending_corruption_) tiers_->Corrupt(tier, shard);
  pending_corruption_.clear();
  proto::AgentEvent e;
  auto* stopped = e.mutable_stopped();
  stopped->set_workers(count);
  stopped->set_teardown_s(teardown_s);
  for (const checkpoint::ShardCopy& c : tiers_->Inventory()) {
    proto::ShardCopy* p = stopped->add_inventory();
    p->set_step(c.step);
    p->set_shard(c.shard);
    p->set_shards(c.shards);
    p->set_tier(wire::ToWire(c.tier));
    p->set_path(c.path);
    p->set_bytes(c.bytes);
    p->set_xxh3(HexU64(c.xxh3));
    p->set_refused(c.refused);
  }
  const MemoryUsage used = tiers_->Usage();
  stopped->set_t0_bytes(used.t0_bytes);
  stopped->set_t1_bytes(used.t1_bytes);
  // With the workers gone their rendezvous port is taken (TIME_WAIT): a
  // fresh one for the next generation.
  stopped->set_free_port(FreePort());
  Send(std::move(e), generation);
}

void Agent::DumpStacks(int64_t generation, double timeout_s) {
  if (!workers_) return;
  const Clock::TimePoint start = clock_->Now();
  std::map<int, int> signals;  // ranks that dump their own stacks
  signals = loop_.Call([&] {
    loop_.AssertOnLoop();
    return machine_->stack_signals(generation);
  });
  std::map<int, std::string> stacks = workers_->CaptureStacks(
      std::chrono::milliseconds(static_cast<int64_t>(ClampSeconds(timeout_s, 600) * 1000)),
      signals);
  const double took = Seconds(clock_->Now() - start);
  for (const auto& [rank, text] : stacks) {
    proto::AgentEvent e;
    auto* d = e.mutable_stack_dump();
    d->set_rank(rank);
    d->set_text(text);
    d->set_capture_s(took);
    Send(std::move(e), generation);
  }
}

void Agent::Inject(const proto::InjectFault& inject) {
  const std::optional<faults::FaultKind> kind = wire::FromWire(inject.kind());
  if (!kind) return;  // none this agent knows (a newer controller's)
  switch (*kind) {
    case faults::FaultKind::kKillAgent:
      // The node dies at once: no goodbye to the controller, workers with it.
      std::fprintf(stderr, "endure agent %s: injected fault %s: the node dies now\n",
                   o_.node_id.c_str(), inject.fault_id().c_str());
      if (workers_) workers_->KillAll();
      // Its memory goes with it.
      if (Status st = seams_.env->RemoveAll(tiers_->shm_dir()); !st.ok()) {
        std::fprintf(stderr, "endure agent %s: %s\n", o_.node_id.c_str(), st.message().c_str());
      }
      launcher_->KillAgent();
      return;  // only where the launcher is a test's
    case faults::FaultKind::kDiskFull:
    case faults::FaultKind::kDiskError: {
      const bool full = *kind == faults::FaultKind::kDiskFull;
      std::fprintf(stderr,
                   "endure agent %s: injected fault %s: persisting fails with %s from now on\n",
                   o_.node_id.c_str(), inject.fault_id().c_str(), full ? "ENOSPC" : "EIO");
      tiers_->FailPersistence(full ? InjectedError::kNoSpace : InjectedError::kIO);
      return;
    }
    case faults::FaultKind::kCorruptT0:
    case faults::FaultKind::kCorruptT1:
      pending_corruption_.emplace_back(
          *kind == faults::FaultKind::kCorruptT0 ? checkpoint::Tier::kT0 : checkpoint::Tier::kT1,
          inject.rank());
      return;
    case faults::FaultKind::kHang:
      if (workers_) workers_->Signal(inject.rank(), SIGSTOP);
      return;
    default:  // a kill, and a fault of any other kind keyed to a time
      if (workers_) workers_->Signal(inject.rank(), SIGKILL);
      return;
  }
}

void Agent::CheckHealth() {
  HealthCheckOptions options;
  options.disk_dir = o_.work_dir;
  options.fail = o_.health_faults;
  health_ = RunHealthCheck(options);
  health_checked_ = true;
  std::fprintf(stderr, "endure agent %s: health check %s: %s\n", o_.node_id.c_str(),
               health_.ok ? "passed" : "FAILED", health_.summary.c_str());
}

void Agent::RunPairTest(int64_t generation, const proto::PairTest& test) {
  PairTestTarget target;
  target.host = test.peer_host();
  target.port = test.peer_port();
  target.token = o_.token;
  target.node = o_.node_id;
  // Bounded whatever the command says: a pair test is a short one.
  target.bytes = std::clamp<uint64_t>(test.bytes() / 4 * 4, 4, 64ull << 20);
  target.timeout = FromSeconds(std::clamp(test.timeout_s(), 0.1, 60.0));
  target.tls = seams_.tls;
  const PairFault fault = loop_.Call([&] {
    loop_.AssertOnLoop();
    return pair_fault_;
  });
  Result<PairOutcome> outcome = agent::RunPairTest(target, fault);
  proto::AgentEvent e;
  auto* done = e.mutable_pair_test();
  done->set_test(test.test());
  done->set_round(test.round());
  done->set_peer_node(test.peer_node());
  if (outcome.ok()) {
    done->set_ok(outcome->ok);
    done->set_seconds(outcome->seconds);
    done->set_error(outcome->error);
  } else {
    done->set_ok(false);
    done->set_error(outcome.status().message());
  }
  std::fprintf(stderr, "endure agent %s: pairwise test %d round %d with %s: %s (%.3fs)%s%s\n",
               o_.node_id.c_str(), test.test(), test.round(), test.peer_node().c_str(),
               done->ok() ? "ok" : "FAILED", done->seconds(), done->error().empty() ? "" : ": ",
               done->error().c_str());
  Send(std::move(e), generation);
}

int Agent::FreePort() {
  Result<int> port = seams_.pick_port ? seams_.pick_port() : PickPortOnThisHost();
  if (!port.ok() || *port < 1 || *port > 65535) {
    std::fprintf(stderr, "endure agent %s: no free port to report for a rendezvous here: %s\n",
                 o_.node_id.c_str(), port.ok() ? "out of range" : port.status().message().c_str());
    return 0;
  }
  return *port;
}

std::string Agent::ResolveCheckpointDir(const std::string& dir) const {
  if (dir.empty() || dir[0] == '/') return dir;
  std::error_code ec;
  const std::string root = o_.checkpoint_root.empty() ? "." : o_.checkpoint_root;
  return std::filesystem::absolute(JoinPath(root, dir), ec).lexically_normal().string();
}

void Agent::OnPersisted(const PersistReport& report) {
  proto::AgentEvent e;
  auto* p = e.mutable_persisted();
  p->set_step(report.step);
  p->set_shard(report.shard);
  p->set_shards(report.shards);
  p->set_bytes(report.entry.bytes);
  p->set_xxh3(HexU64(report.entry.xxh3));
  p->set_error(report.error);
  const MemoryUsage used = tiers_->Usage();
  p->set_t0_bytes(used.t0_bytes);
  p->set_t1_bytes(used.t1_bytes);
  Send(std::move(e));
}

void Agent::AwaitSignal() {
  pollfd fds[2] = {{seams_.signal_fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  while (true) {
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;  // Run() is ending
    if (fds[0].revents != 0 && seams_.signal != nullptr && *seams_.signal != 0) {
      ShutDownOnSignal(*seams_.signal);
      return;
    }
  }
}

void Agent::DiscardStandbys() {
  loop_.Call([&] {
    loop_.AssertOnLoop();
    for (Standby& s : standbys_) launcher_->DiscardStandby(s);
    standbys_.clear();
    CarryOut(machine_->Step(core::StandbysDiscarded{}, Now()));
  });
}

std::vector<int> Agent::LocalRanks() {
  return loop_.Call([&] {
    loop_.AssertOnLoop();
    return std::vector<int>(machine_->local_ranks().begin(), machine_->local_ranks().end());
  });
}

int64_t Agent::StopWorkersAndPersist() {
  // Nothing waits on a peer from now on (a replica in flight ends at once).
  tiers_->CancelReplication();
  std::set<int> ranks;
  if (workers_) {
    for (const auto& [rank, pid] : workers_->Pids()) ranks.insert(rank);
    workers_->StopAll(std::chrono::milliseconds(static_cast<int64_t>(grace_s_ * 1000)));
  }
  DiscardStandbys();
  for (int rank : LocalRanks()) ranks.insert(rank);
  // The node's newest complete step goes to the durable directory if there
  // is time; the reports go up while the stream lasts, for the controller
  // to commit the step if it still runs. (The deadline is TierStore's, on
  // real time.)
  const int64_t step =
      tiers_->PersistNewestComplete(ranks, std::chrono::steady_clock::now() + kShutdownPersistFor);
  if (step >= 0) {
    std::fprintf(stderr, "endure agent %s: persisted step %lld of this node's ranks\n",
                 o_.node_id.c_str(), static_cast<long long>(step));
  }
  loop_.Flush();  // the exits and the persisted shards are written before this returns
  return step;
}

void Agent::ShutDownOnSignal(int sig) {
  // Not in the middle of a command: a start finishes launching, a stop
  // finishes stopping, before the node shuts down.
  MutexLock command(&command_mu_);
  signalled_ = true;
  // The whole shutdown is bounded: the grace, the persist, and a margin for
  // the reports; past that the stream is cut, and with it any blocked Send.
  // Real time, as every bound on waits for threads, processes and sockets.
  const Watchdog bound(std::chrono::steady_clock::now() +
                           std::chrono::milliseconds(static_cast<int64_t>(grace_s_ * 1000)) +
                           kShutdownPersistFor + kStreamMargin,
                       [this] { transport_->Cancel(); });
  std::fprintf(stderr,
               "endure agent %s: %s: stopping the workers (grace %.1fs), then shutting down\n",
               o_.node_id.c_str(), strsignal(sig), grace_s_);
  StopWorkersAndPersist();
  transport_->Cancel();  // Run()'s Read returns
}

bool Agent::Signalled() {
  MutexLock lock(&command_mu_);
  return signalled_;
}

bool Agent::CarryOutCommands() {
  proto::AgentCommand cmd;
  while (transport_->Read(&cmd)) {
    MutexLock lock(&command_mu_);
    if (signalled_) return false;
    // Only the job's, and none that crossed a newer start on the wire.
    if (!Decide(core::CommandArrived{&cmd})) continue;
    switch (cmd.command_case()) {
      case proto::AgentCommand::kStart:
        Start(cmd.generation(), cmd.start());
        break;
      case proto::AgentCommand::kStop:
        Stop(cmd.generation(), cmd.stop().grace_s());
        break;
      case proto::AgentCommand::kDumpStacks:
        DumpStacks(cmd.generation(), cmd.dump_stacks().timeout_s());
        break;
      case proto::AgentCommand::kInject:
        Inject(cmd.inject());
        break;
      case proto::AgentCommand::kPairTest:
        RunPairTest(cmd.generation(), cmd.pair_test());
        break;
      case proto::AgentCommand::kPrepare:
        Prepare(cmd.prepare());
        break;
      case proto::AgentCommand::kShutdown:
        return true;
      default:
        break;
    }
    // What the command made (its reports, the exits it caused) has gone to
    // the loop: the next command is read once it is written.
    loop_.Flush();
  }
  return false;
}

proto::AgentEvent Agent::Hello(bool resuming) {
  proto::AgentEvent hello;
  proto::Register* reg = hello.mutable_register_();
  reg->set_node_id(o_.node_id);
  reg->set_slots(o_.slots);
  reg->set_host(o_.host);
  reg->set_pid(::getpid());
  reg->set_replica_address(o_.host + ":" + std::to_string(tiers_->replica_port()));
  reg->set_free_port(FreePort());
  if (pair_server_) reg->set_pair_test_port(pair_server_->port());
  if (!resuming && o_.health_check) {
    CheckHealth();
    reg->set_health_ok(health_.ok);
    reg->set_health_summary(health_.summary);
  }
  int64_t generation = -1;
  if (resuming) {
    std::map<int, pid_t> alive;
    {
      MutexLock lock(&command_mu_);
      if (workers_) alive = workers_->Pids();
    }
    // The generation and each local rank's last step, as the core knows them.
    std::vector<std::pair<int, int64_t>> last_steps;
    generation = loop_.Call([&] {
      loop_.AssertOnLoop();
      for (int rank : machine_->local_ranks()) {
        last_steps.emplace_back(rank, machine_->last_step(rank));
      }
      return machine_->generation();
    });
    bool all_alive = !last_steps.empty();
    for (const auto& [rank, last_step] : last_steps) {
      proto::RankResume* r = reg->add_ranks();
      r->set_rank(rank);
      r->set_last_step(last_step);
      r->set_alive(alive.count(rank) > 0);
      all_alive = all_alive && r->alive();
    }
    reg->set_resuming(true);
    reg->set_generation(generation);
    reg->set_workers_alive(all_alive);
  }
  hello.set_token(o_.token);
  hello.set_generation(generation);
  hello.set_time_s(clock_->WallSeconds());
  return hello;
}

bool Agent::WaitUntil(Clock::TimePoint at) {
  // Polls the agent's clock (a test's FakeClock moves by itself); a signal
  // ends the wait within a poll.
  while (clock_->Now() < at) {
    if (Signalled()) return false;
    std::this_thread::sleep_for(kOutagePoll);
  }
  return !Signalled();
}

std::optional<Status> Agent::RideOutOutage(const std::string& why) {
  const Clock::TimePoint since = clock_->Now();
  const Clock::TimePoint give_up_at =
      since + std::chrono::duration_cast<Clock::TimePoint::duration>(o_.controller_grace);
  std::fprintf(stderr,
               "endure agent %s: lost the controller at %s (%s): the workers keep running; "
               "reconnecting for up to %s (--controller-grace)\n",
               o_.node_id.c_str(), o_.controller.c_str(), why.c_str(),
               FormatDuration(o_.controller_grace).c_str());
  ReconnectBackoff backoff(ReconnectBackoffOptions{}, std::hash<std::string>{}(o_.node_id) ^
                                                          static_cast<uint64_t>(::getpid()));
  const auto give_up = [&] { return Signalled() || clock_->Now() >= give_up_at; };
  int attempts = 0;
  Status last = Unavailable(why);
  while (true) {
    if (!WaitUntil(std::min(
            clock_->Now() + std::chrono::duration_cast<Clock::TimePoint::duration>(backoff.Next()),
            give_up_at))) {
      return Status::Ok();  // a signal stopped the node meanwhile
    }
    if (clock_->Now() >= give_up_at) break;
    ++attempts;
    last = transport_->Attach(give_up);
    if (last.ok()) break;
    if (Signalled()) return Status::Ok();
  }
  if (last.ok()) {
    // The resuming hello first, then what happened meanwhile, in order,
    // then the ranks' last words of this generation again (the core's
    // link). A stream that broke again ends the next Read: a new outage.
    proto::AgentEvent hello = Hello(/*resuming=*/true);
    const int64_t generation = hello.register_().generation();
    size_t kept = 0;
    int64_t dropped = 0;
    loop_.Call([&] {
      loop_.AssertOnLoop();
      kept = machine_->outage_size();
      dropped = machine_->outage_dropped();
      CarryOut(machine_->Step(core::StreamOpened{std::move(hello), true}, Now()));
    });
    std::fprintf(stderr,
                 "endure agent %s: reconnected to the controller after %s (%d attempt(s)); "
                 "resumed generation %lld, %zu event(s) sent from the outage (%lld dropped in "
                 "all)\n",
                 o_.node_id.c_str(), FormatDuration(clock_->Now() - since).c_str(), attempts,
                 static_cast<long long>(generation), kept, static_cast<long long>(dropped));
    return std::nullopt;
  }
  // The controller stayed away past the grace: stop as on SIGTERM.
  MutexLock command(&command_mu_);
  if (signalled_) return Status::Ok();
  outlived_grace_ = true;
  std::fprintf(stderr,
               "endure agent %s: no controller at %s for %s (--controller-grace): stopping the "
               "workers (grace %.1fs) and exiting\n",
               o_.node_id.c_str(), o_.controller.c_str(),
               FormatDuration(o_.controller_grace).c_str(), grace_s_);
  const int64_t step = StopWorkersAndPersist();
  return Unavailable("no controller at " + o_.controller + " for " +
                     FormatDuration(o_.controller_grace) +
                     " (--controller-grace) since the stream ended (" + why +
                     "; last attempt: " + last.message() + "): stopped the workers" +
                     (step >= 0 ? " and persisted step " + std::to_string(step) : std::string()) +
                     "; restart the agent once the controller is back");
}

Status Agent::Run() {
  Env* const env = seams_.env;
  ENDURE_RETURN_IF_ERROR(env->CreateDirs(o_.work_dir));
  secret_variables_ = VariablesHolding(o_.token);
  // Checkpoint memory lives in shared memory, which outlives a crashed worker.
  std::string shm = seams_.shm_parent;
  if (shm.empty()) shm = env->Exists("/dev/shm") ? "/dev/shm" : o_.work_dir;
  // What agents killed before they could clean up left behind.
  for (const std::string& path : SweepStaleShm(shm, IsLiveEndureAgent)) {
    std::fprintf(stderr, "endure agent %s: removed %s, left by an agent that is gone\n",
                 o_.node_id.c_str(), path.c_str());
  }
  ENDURE_RETURN_IF_ERROR(OpenSocket());
  TierStoreOptions tier_options;
  tier_options.node = o_.node_id;
  tier_options.shm_dir = JoinPath(shm, "endure-" + std::to_string(::getpid()) + "-" + o_.node_id);
  tier_options.token = o_.token;
  tier_options.host = o_.host;
  tier_options.tls = seams_.tls;
  ENDURE_ASSIGN_OR_RETURN(
      tiers_, TierStore::Start(tier_options, [this](const PersistReport& r) { OnPersisted(r); }));
  {
    core::NodeMachineOptions node;
    node.token = o_.token;
    node.standby = o_.standby;
    node.slots = o_.slots;
    node.refusal_log_burst = kRefusalLogBurst;
    loop_.Call([&] {
      loop_.AssertOnLoop();
      machine_.emplace(std::move(node), std::move(classifier_),
                       contract::DatagramContext{tiers_->t0_dir()});
    });
  }
  {
    PairTestServerOptions pair;
    pair.host = o_.host;
    pair.token = o_.token;
    pair.node = o_.node_id;
    pair.tls = seams_.tls;
    ENDURE_ASSIGN_OR_RETURN(pair_server_, PairTestServer::Start(pair));
  }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0) return IOError(std::string("eventfd: ") + std::strerror(errno));
  std::thread signals(&Agent::AwaitSignal, this);
  // Ends the shutdown thread (unless it is the one shutting down) and frees
  // what Run() holds, on every way out.
  const auto finish = [&] {
    const uint64_t one = 1;
    const ssize_t ignored = ::write(wake_fd_, &one, sizeof one);
    (void)ignored;
    signals.join();
    ::close(wake_fd_);
    ::close(socket_fd_);
    ::unlink(socket_path_.c_str());
    // The core's loop ends after every thread that hands it work but the
    // tier store's (whose reports it drops from now on).
    loop_.Call([&] {
      loop_.AssertOnLoop();
      if (machine_->refused() > 0) {
        std::fprintf(stderr, "endure agent %s: refused %lld datagram(s) in all (%lld not shown)\n",
                     o_.node_id.c_str(), static_cast<long long>(machine_->refused()),
                     static_cast<long long>(machine_->refusals_not_logged()));
      }
    });
    loop_.Stop();
    tiers_.reset();  // removes the node's shared memory
  };

  const auto signalled = [this] { return Signalled(); };
  if (Status attached = transport_->Attach(signalled); !attached.ok()) {
    finish();
    if (signalled()) return Status::Ok();
    return attached;
  }
  // Registration is the first word the controller hears.
  Decide(core::StreamOpened{Hello(/*resuming=*/false), false});
  if (signalled()) transport_->Cancel();  // a signal came while attaching
  std::thread receiver(&Agent::ReceiveDatagrams, this);

  // Commands until a shutdown, a signal, a refusal, or an outage past the
  // grace; an outage within it is ridden out and the commands go on.
  Status result = Status::Ok();
  bool shutdown = false;
  bool stream_open = true;  // attached, not yet finished
  while (true) {
    shutdown = CarryOutCommands();
    if (shutdown || signalled()) break;
    // Nothing is written to this stream from now on (the core's link),
    // before it is finished.
    Decide(core::StreamLost{});
    const Status end = transport_->Finish();
    stream_open = false;
    if (end.code() == StatusCode::kInvalidArgument) {
      result = InvalidArgument("the controller refused this agent: " + end.message());
      break;
    }
    std::optional<Status> outage = RideOutOutage(end.ok() ? "stream closed" : end.message());
    if (outage) {
      result = *outage;
      break;
    }
    stream_open = true;
  }
  // Stopping the workers (their exits go up the stream) and closing the
  // stream wait on the controller: bounded, as every wait in the stop path.
  const Watchdog bound(std::chrono::steady_clock::now() + std::chrono::seconds(2) + kStreamMargin,
                       [this] { transport_->Cancel(); });
  {
    MutexLock lock(&command_mu_);
    // After a signal, or an outage past the grace, the workers are stopped
    // already; a refused agent's go at once.
    if (workers_ && !signalled_ && !outlived_grace_) {
      workers_->StopAll(std::chrono::milliseconds(shutdown ? 2000 : 0));
    }
    SetWorkers(nullptr);
  }
  DiscardStandbys();
  loop_.Call([&] {
    loop_.AssertOnLoop();
    if (stream_open) transport_->CloseWrites();
    CarryOut(machine_->Step(core::StreamClosed{}, Now()));
  });
  if (stream_open) {
    // A signal cancelled the stream (its end says so); after a shutdown it
    // should end cleanly.
    const Status end = transport_->Finish();
    if (shutdown && !end.ok()) {
      std::fprintf(stderr, "endure agent %s: the stream ended after the shutdown: %s\n",
                   o_.node_id.c_str(), end.message().c_str());
    }
  }
  done_ = true;
  WakeReceiver();
  receiver.join();
  finish();
  return result;
}

Status AgentOptions::Validate() const {
  if (controller.empty()) return InvalidArgument("--controller: required (host:port)");
  if (node_id.empty()) return InvalidArgument("--node-id: required");
  // It names files (shared memory, replicas on peers) and travels in frames.
  ENDURE_RETURN_IF_ERROR(CheckNodeName(node_id, "--node-id"));
  if (slots < 1) return InvalidArgument("--ranks: must be at least 1");
  if (token.empty()) {
    return InvalidArgument("no job token: set ENDURE_TOKEN or pass --token-file");
  }
  if (work_dir.empty()) return InvalidArgument("--work-dir: required");
  if (controller_grace < Duration::zero()) {
    return InvalidArgument("--controller-grace: must not be negative, got " +
                           FormatDuration(controller_grace));
  }
  const std::vector<std::string> controllers = ControllerAddresses(controller);
  if (controllers.empty()) return InvalidArgument("--controller: required (host:port[,host:port])");
  if (tls_dir.empty()) {
    std::vector<std::pair<const char*, std::string>> hosts;
    for (const std::string& address : controllers) {
      hosts.emplace_back("--controller", HostOfAddress(address));
    }
    hosts.emplace_back("--host", host);
    for (const auto& [flag, host] : hosts) {
      if (!IsLoopbackHost(host)) {
        return InvalidArgument(std::string(flag) + " " + host +
                               " is beyond loopback: the agent's connections there need mutual "
                               "TLS; pass --tls-dir DIR with certificates from `endure certs "
                               "--dir DIR --nodes ...` (docs/security.md)");
      }
    }
  }
  return Status::Ok();
}

Status RunAgent(const AgentOptions& options) {
  ENDURE_RETURN_IF_ERROR(options.Validate());
  // A worker that dies while we write to it must not take the agent along.
  ::signal(SIGPIPE, SIG_IGN);
  // SIGTERM (Slurm, Kubernetes, `endure run`) and SIGINT stop the workers
  // with their grace period and clean up, instead of killing the agent.
  if (g_signal_fd < 0) g_signal_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (g_signal_fd < 0) return IOError(std::string("eventfd: ") + std::strerror(errno));
  struct sigaction sa {};
  sa.sa_handler = OnTerminationSignal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  // Checkpoint replicas arrive every step: keep freed buffers in the heap
  // rather than handing them back to the kernel and faulting fresh pages in
  // for the next one (about 3 ms per MB on a VM).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  Result<std::vector<TextFile>> rules_files = ReadConfigFiles(options.log_rules, ".toml");
  if (!rules_files.ok()) return InvalidArgument("--log-rules: " + rules_files.status().message());
  ENDURE_ASSIGN_OR_RETURN(core::LogClassifier classifier,
                          core::LogClassifier::FromTomlFiles(*rules_files, options.log_rules));
  for (const std::string& m : core::UncataloguedCauses(classifier)) {
    std::fprintf(stderr, "endure agent %s: warning: %s\n", options.node_id.c_str(), m.c_str());
  }
  std::optional<tls::Identity> identity;
  std::shared_ptr<const tls::Context> tls;
  if (!options.tls_dir.empty()) {
    Result<tls::Identity> loaded = tls::LoadIdentity(options.tls_dir, options.node_id);
    if (!loaded.ok()) return InvalidArgument("--tls-dir: " + loaded.status().message());
    identity = std::move(loaded).value();
    Result<std::shared_ptr<const tls::Context>> context = tls::Context::Make(*identity);
    if (!context.ok()) return InvalidArgument("--tls-dir: " + context.status().message());
    tls = std::move(context).value();
  }
  const std::unique_ptr<Transport> transport = NewGrpcTransport(options, identity);
  const std::unique_ptr<ProcessLauncher> launcher = NewRealProcessLauncher();
  std::unique_ptr<KernelLog> kernel_log;
  if (!options.kernel_log.empty() && options.kernel_log != "none") {
    Result<std::unique_ptr<KernelLog>> opened = KernelLog::Open(options.kernel_log);
    if (opened.ok()) {
      kernel_log = std::move(opened).value();
    } else {
      std::fprintf(stderr, "endure agent %s: %s; classifying the workers' output only\n",
                   options.node_id.c_str(), opened.status().message().c_str());
    }
  }
  AgentSeams seams;
  seams.kernel_log = kernel_log.get();
  seams.tls = tls;
  seams.transport = transport.get();
  seams.launcher = launcher.get();
  seams.signal_fd = g_signal_fd;
  seams.signal = &g_signal;
  Agent agent(options, std::move(classifier), std::move(seams));
  return agent.Run();
}

}  // namespace endure::agent
