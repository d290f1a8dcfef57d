// Agent: the gRPC stream to the controller, the worker datagram socket, and
// the commands. Threads: the main thread reads commands and carries them
// out in order; one thread receives worker datagrams; WorkerSet's watcher
// threads report exits and, with a progress pattern, turn output lines into
// progress. Writes to the stream are serialised by write_mu_; what the
// generation's ranks reported (progress from output, stack signals) by
// reports_mu_, taken before write_mu_ where both are held.
#include "agent/agent.h"

#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include "agent/progress_pattern.h"
#include "agent/tier_store.h"
#include "agent/worker_set.h"
#include "common/env.h"
#include "common/hash.h"
#include "core/log_classifier.h"
#include "proto/endure.grpc.pb.h"

namespace endure::agent {
namespace {

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// execve does not search PATH; a bare program name is looked up here.
std::string ResolveProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return program;
}

double JsonLoss(const nlohmann::json& v) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// Signals a worker may ask to be sent for a stack dump: never one whose
// default action a program relies on (SIGTERM, SIGINT, ...) or that cannot
// be caught (SIGKILL, SIGSTOP).
bool AcceptableStackSignal(int64_t sig) {
  if (sig < 1 || sig > 64) return false;
  return sig == SIGUSR1 || sig == SIGUSR2 || (sig >= SIGRTMIN && sig <= SIGRTMAX);
}

class Agent {
 public:
  Agent(AgentOptions options, core::LogClassifier classifier)
      : o_(std::move(options)), classifier_(std::move(classifier)) {}

  Status Run();

 private:
  void Send(proto::AgentEvent event, int64_t generation);
  Status OpenSocket();
  void ReceiveDatagrams();
  // One datagram from a worker; a field of the wrong type throws
  // nlohmann::json::exception.
  void HandleDatagram(std::string_view text);
  void OnWorkerExit(int64_t generation, const WorkerEnd& end);
  // A line of a worker's output (watcher thread); only with a progress pattern.
  void OnWorkerLine(int64_t generation, int rank, std::string_view line);
  // Bookkeeping of a datagram from `rank` of the current generation `gen`
  // that matters to the output progress or to stack dumps. Returns false
  // when the datagram is to be dropped.
  bool NoteDatagram(int64_t gen, int rank, const std::string& type, const nlohmann::json& m);
  void Start(int64_t generation, const proto::StartGeneration& start);
  void Stop(int64_t generation, double grace_s);
  void DumpStacks(int64_t generation, double timeout_s);
  void Inject(const proto::InjectFault& inject);
  void OnPersisted(const PersistReport& report);

  // Warm standbys: workers started ahead of the next generation so that a
  // restart skips loading the program. Refilled once a generation has made
  // its first step, so that their start does not slow the restart itself.
  void RefillStandbys();
  std::optional<Standby> TakeStandby(const std::vector<std::string>& argv);

  AgentOptions o_;
  core::LogClassifier classifier_;
  std::mutex standby_mu_;
  std::vector<Standby> standbys_;          // GUARDED_BY(standby_mu_)
  std::vector<std::string> standby_argv_;  // GUARDED_BY(standby_mu_)
  int standby_count_ = 0;                  // GUARDED_BY(standby_mu_)
  bool refill_pending_ = false;            // GUARDED_BY(standby_mu_)
  std::unique_ptr<grpc::ClientReaderWriter<proto::AgentEvent, proto::AgentCommand>> stream_;
  std::mutex write_mu_;
  std::atomic<int64_t> generation_{-1};
  std::unique_ptr<WorkerSet> workers_;  // touched by the command thread only
  std::unique_ptr<TierStore> tiers_;    // checkpoint memory (T0, T1) and persistence
  // Injected memory corruption (tier, shard), applied once the workers stop.
  std::vector<std::pair<checkpoint::Tier, int>> pending_corruption_;  // command thread only
  int socket_fd_ = -1;
  std::string socket_path_;
  std::atomic<bool> done_{false};

  // What the ranks of the current generation reported.
  std::mutex reports_mu_;
  int64_t reports_generation_ = -1;                // GUARDED_BY(reports_mu_)
  std::set<int> local_ranks_;                      // GUARDED_BY(reports_mu_)
  std::optional<OutputReports> output_;            // GUARDED_BY(reports_mu_); with a pattern
  std::map<int, int> stack_signals_;               // GUARDED_BY(reports_mu_); rank -> signal
  std::chrono::steady_clock::time_point started_;  // GUARDED_BY(reports_mu_)
};

void Agent::Send(proto::AgentEvent event, int64_t generation) {
  event.set_token(o_.token);
  event.set_generation(generation);
  event.set_time_s(WallSeconds());
  std::lock_guard<std::mutex> lock(write_mu_);
  if (stream_) stream_->Write(event);
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
  char buf[65536];
  auto next_beat = std::chrono::steady_clock::now();
  while (!done_) {
    // The controller hears from the agent every second, whatever the
    // workers do; silence means a frozen or cut-off node.
    if (std::chrono::steady_clock::now() >= next_beat) {
      proto::AgentEvent beat;
      beat.mutable_heartbeat();
      Send(std::move(beat), generation_);
      next_beat += std::chrono::seconds(1);
    }
    ssize_t n = ::recv(socket_fd_, buf, sizeof buf, 0);
    if (n <= 0) continue;
    try {
      HandleDatagram(std::string_view(buf, static_cast<size_t>(n)));
    } catch (const nlohmann::json::exception&) {
      // A field of the wrong type (value() throws): not a datagram we send.
    }
  }
}

void Agent::HandleDatagram(std::string_view text) {
  nlohmann::json m = nlohmann::json::parse(text, nullptr, false);
  if (!m.is_object() || m.value("token", "") != o_.token) return;  // not from our workers
  const int64_t gen = m.value("generation", int64_t{-1});
  if (gen != generation_) return;  // a stale generation
  const std::string type = m.value("type", "");
  const int rank = m.value("rank", -1);
  if (!NoteDatagram(gen, rank, type, m)) return;
  proto::AgentEvent e;
  if (type == "step") RefillStandbys();
  if (type == "step" || type == "skip") {
    auto* s = e.mutable_step();
    s->set_rank(rank);
    s->set_step(m.value("step", int64_t{0}));
    // A step without a loss (null: the program does not know it) is
    // progress with nothing to judge, like a skipped one.
    const bool no_loss = type == "skip" || !m.contains("loss") || m["loss"].is_null();
    s->set_skipped(no_loss);
    s->set_tokens(m.value("tokens", int64_t{0}));
    s->set_loss(no_loss ? 0.0 : JsonLoss(m["loss"]));
    s->set_compute_s(m.value("compute_s", 0.0));
    s->set_comm_s(m.value("comm_s", 0.0));
    s->set_ckpt_stall_s(m.value("ckpt_stall_s", 0.0));
    s->set_checkpoint_step(m.value("checkpoint_step", int64_t{-1}));
  } else if (type == "ready") {
    auto* r = e.mutable_worker_ready();
    r->set_rank(rank);
    r->set_start_step(m.value("start_step", int64_t{0}));
    r->set_restore_s(m.value("restore_s", 0.0));
    r->set_init_s(m.value("init_s", 0.0));
  } else if (type == "snapshot") {
    tiers_->Notify({rank, m.value("step", int64_t{0}), m.value("shards", 1), m.value("path", "")});
    return;
  } else if (type == "fault") {
    auto* f = e.mutable_fault_fired();
    f->set_rank(rank);
    f->set_fault_id(m.value("id", ""));
    f->set_kind(m.value("kind", ""));
    f->set_step(m.value("step", int64_t{0}));
  } else {
    return;  // heartbeats: the worker's liveness is its process, progress its steps;
             // "stacks": noted above
  }
  e.set_token(o_.token);
  e.set_generation(gen);
  // The worker's own clock says when it happened (a fault fires just before
  // its process dies); the controller maps it onto its own clock.
  e.set_time_s(m.value("t", WallSeconds()));
  std::lock_guard<std::mutex> lock(write_mu_);
  if (stream_) stream_->Write(e);
}

bool Agent::NoteDatagram(int64_t gen, int rank, const std::string& type, const nlohmann::json& m) {
  std::lock_guard<std::mutex> lock(reports_mu_);
  const bool known = gen == reports_generation_ && local_ranks_.count(rank);
  if (type == "stacks") {
    // Only a rank of this node may say how to ask it for its stacks, and
    // only with a signal meant for that.
    const nlohmann::json sig = m.contains("signal") ? m["signal"] : nlohmann::json();
    const char* refused = nullptr;
    if (!known) {
      refused = "the rank does not run on this node in this generation";
    } else if (!sig.is_number_integer() || !AcceptableStackSignal(sig.get<int64_t>())) {
      refused = "only SIGUSR1, SIGUSR2 or a real-time signal may be used";
    }
    if (refused != nullptr) {
      std::fprintf(stderr,
                   "endure agent %s: ignored a \"stacks\" datagram from rank %d: signal %s: %s\n",
                   o_.node_id.c_str(), rank, sig.dump().c_str(), refused);
      return false;
    }
    stack_signals_[rank] = sig.get<int>();
    return false;  // nothing for the controller
  }
  if (known && output_) output_->OnDatagram(rank, type);
  return true;
}

void Agent::OnWorkerLine(int64_t generation, int rank, std::string_view line) {
  bool stepped = false;
  {
    std::lock_guard<std::mutex> lock(reports_mu_);
    if (generation != reports_generation_ || !output_) return;
    const double init_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    for (const OutputReport& r : output_->OnLine(rank, line)) {
      proto::AgentEvent e;
      if (r.kind == OutputReport::Kind::kReady) {
        auto* w = e.mutable_worker_ready();
        w->set_rank(r.rank);
        w->set_start_step(0);  // what an unmodified program restored is unknown
        w->set_init_s(init_s);
      } else {
        auto* s = e.mutable_step();
        s->set_rank(r.rank);
        s->set_step(r.step);
        s->set_checkpoint_step(-1);
        // Without a loss there is nothing to judge (the loss detector would
        // take a missing one for NaN).
        s->set_skipped(!r.loss.has_value());
        s->set_loss(r.loss.value_or(0.0));
        stepped = true;
      }
      Send(std::move(e), generation);
    }
  }
  if (stepped) RefillStandbys();
}

void Agent::OnWorkerExit(int64_t generation, const WorkerEnd& end) {
  // A worker that finished leaves its final state durable before the
  // controller hears that it finished.
  if (end.status.Success()) tiers_->PersistNewest(end.rank);
  if (!end.status.Success()) {
    if (std::optional<core::LogMatch> m = classifier_.Classify(end.tail)) {
      proto::AgentEvent e;
      auto* lm = e.mutable_log_match();
      lm->set_rank(end.rank);
      lm->set_cause(m->cause);
      lm->set_action(std::string(core::LogActionName(m->action)));
      lm->set_rule(m->rule);
      lm->set_line(m->line);
      Send(std::move(e), generation);
    }
  }
  proto::AgentEvent e;
  auto* x = e.mutable_worker_exited();
  x->set_rank(end.rank);
  x->set_exited(end.status.exited);
  x->set_exit_code(end.status.code);
  x->set_signal(end.status.signal);
  std::smatch match;
  static const std::regex kFingerprint("param_fingerprint=([0-9a-f]{16})");
  if (std::regex_search(end.tail, match, kFingerprint)) x->set_param_fingerprint(match[1].str());
  Send(std::move(e), generation);
}

void Agent::RefillStandbys() {
  std::lock_guard<std::mutex> lock(standby_mu_);
  if (!refill_pending_) return;
  refill_pending_ = false;
  while (static_cast<int>(standbys_.size()) < standby_count_) {
    Result<Standby> s = StartStandby(standby_argv_, {});
    if (!s.ok()) break;  // cold starts still work
    standbys_.push_back(std::move(s).value());
  }
}

std::optional<Standby> Agent::TakeStandby(const std::vector<std::string>& argv) {
  std::lock_guard<std::mutex> lock(standby_mu_);
  for (auto it = standbys_.begin(); it != standbys_.end(); ++it) {
    if (it->argv == argv) {
      Standby s = std::move(*it);
      standbys_.erase(it);
      return s;
    }
  }
  return std::nullopt;
}

void Agent::Start(int64_t generation, const proto::StartGeneration& start) {
  if (workers_) workers_->StopAll(std::chrono::milliseconds(0));
  generation_ = generation;
  bool read_progress = false;
  {
    std::lock_guard<std::mutex> lock(reports_mu_);
    reports_generation_ = generation;
    started_ = std::chrono::steady_clock::now();
    local_ranks_.clear();
    for (const proto::RankAssignment& r : start.ranks()) local_ranks_.insert(r.rank());
    stack_signals_.clear();
    output_.reset();
    if (!start.progress_pattern().empty()) {
      // The controller validated it (job_spec.cc); a refusal here means
      // the two disagree, and training goes on without it.
      Result<ProgressPattern> p = ProgressPattern::Compile(start.progress_pattern());
      if (p.ok()) {
        output_.emplace(std::move(p).value(), std::clamp(start.world_size(), 0, 1 << 20));
      } else {
        std::fprintf(stderr, "endure agent %s: progress_pattern ignored: %s\n", o_.node_id.c_str(),
                     p.status().message().c_str());
      }
    }
    read_progress = output_.has_value();
  }
  WorkerSet::LineObserver on_line;
  if (read_progress) {
    on_line = [this, generation](int rank, std::string_view line) {
      OnWorkerLine(generation, rank, line);
    };
  }
  workers_ = std::make_unique<WorkerSet>(
      [this, generation](const WorkerEnd& end) { OnWorkerExit(generation, end); },
      std::move(on_line));
  std::vector<std::string> argv(start.command().begin(), start.command().end());
  if (argv.empty()) return;
  argv[0] = ResolveProgram(argv[0]);
  {
    std::lock_guard<std::mutex> lock(standby_mu_);
    // Standbys of another program (a changed command) are of no use.
    for (Standby& s : standbys_) {
      if (s.argv != argv) DiscardStandby(s);
    }
    std::erase_if(standbys_, [](const Standby& s) { return !s.process; });
    standby_argv_ = argv;
    standby_count_ = o_.standby ? start.ranks_size() : 0;
    refill_pending_ = true;
  }
  const proto::CheckpointConfig& ckpt = start.checkpoint();
  TierConfig tiers;
  tiers.durable_dir = ckpt.dir();
  tiers.persist_every_steps = ckpt.persist_every_steps();
  tiers.replica_peer = ckpt.replica_peer();
  tiers.memory_budget = ckpt.memory_budget();
  tiers_->Configure(tiers, ckpt.discard_after());
  std::string skip;
  for (int64_t s : start.skip_steps()) skip += (skip.empty() ? "" : ",") + std::to_string(s);
  std::error_code ec;
  // Absolute: workers may change their directory before they write there.
  const std::string logs = std::filesystem::absolute(JoinPath(o_.work_dir, "logs"), ec).string();
  (void)Env::Default()->CreateDirs(logs);
  for (const proto::RankAssignment& r : start.ranks()) {
    WorkerSpec spec;
    spec.rank = r.rank();
    spec.argv = argv;
    const std::string name =
        "gen" + std::to_string(generation) + "-rank" + std::to_string(r.rank());
    spec.log_path = JoinPath(logs, name + ".log");
    spec.stacks_path = JoinPath(logs, name + ".stacks");
    spec.env = {{"RANK", std::to_string(r.rank())},
                {"LOCAL_RANK", std::to_string(r.local_rank())},
                {"WORLD_SIZE", std::to_string(start.world_size())},
                {"LOCAL_WORLD_SIZE", std::to_string(start.ranks_size())},
                {"GROUP_RANK", std::to_string(r.rank() / std::max(1, start.ranks_size()))},
                {"MASTER_ADDR", start.master_addr()},
                {"MASTER_PORT", std::to_string(start.master_port())},
                {"ENDURE_AGENT_SOCKET", socket_path_},
                {"ENDURE_TOKEN", o_.token},
                {"ENDURE_GENERATION", std::to_string(generation)},
                {"ENDURE_NODE_ID", o_.node_id},
                {"ENDURE_RESTORE_STEP", std::to_string(start.restore_step())},
                {"ENDURE_SKIP_STEPS", skip},
                {"ENDURE_FAULTS", r.faults_json()},
                {"ENDURE_STACKS_FILE", spec.stacks_path}};
    for (const auto& [k, v] : start.env()) spec.env.emplace_back(k, v);
    if (ckpt.enabled()) {
      spec.env.emplace_back("ENDURE_T0_DIR", tiers_->t0_dir());
      spec.env.emplace_back("ENDURE_T0_SLOT_BYTES", std::to_string(ckpt.slot_bytes()));
    }
    if (!ckpt.restore_plan_json().empty()) {
      spec.env.emplace_back("ENDURE_RESTORE_PLAN", ckpt.restore_plan_json());
    }
    Status st = Unavailable("no standby");
    if (std::optional<Standby> standby = TakeStandby(argv)) {
      st = workers_->Adopt(std::move(*standby), spec);
    }
    if (!st.ok()) st = workers_->Start(spec);
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
    }
    Send(std::move(e), generation);
  }
}

void Agent::Stop(int64_t generation, double grace_s) {
  const auto start = std::chrono::steady_clock::now();
  int count = 0;
  if (workers_) {
    count = static_cast<int>(workers_->Pids().size());
    workers_->StopAll(std::chrono::milliseconds(static_cast<int64_t>(grace_s * 1000)));
  }
  const double teardown_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // With the workers gone the memory tiers hold still: report them, verified.
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
    p->set_tier(std::string(checkpoint::TierName(c.tier)));
    p->set_path(c.path);
    p->set_bytes(c.bytes);
    p->set_xxh3(HexU64(c.xxh3));
    p->set_refused(c.refused);
  }
  const MemoryUsage used = tiers_->Usage();
  stopped->set_t0_bytes(used.t0_bytes);
  stopped->set_t1_bytes(used.t1_bytes);
  Send(std::move(e), generation);
}

void Agent::DumpStacks(int64_t generation, double timeout_s) {
  if (!workers_) return;
  const auto start = std::chrono::steady_clock::now();
  std::map<int, int> signals;  // ranks that dump their own stacks
  {
    std::lock_guard<std::mutex> lock(reports_mu_);
    if (generation == reports_generation_) signals = stack_signals_;
  }
  std::map<int, std::string> stacks = workers_->CaptureStacks(
      std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)), signals);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
  if (inject.kind() == "kill-agent") {
    // The node dies at once: no goodbye to the controller, workers with it.
    std::fprintf(stderr, "endure agent %s: injected fault %s: the node dies now\n",
                 o_.node_id.c_str(), inject.fault_id().c_str());
    if (workers_) {
      for (const auto& [rank, pid] : workers_->Pids()) ::kill(-pid, SIGKILL);
    }
    (void)Env::Default()->RemoveAll(tiers_->shm_dir());  // its memory goes with it
    ::kill(::getpid(), SIGKILL);
  }
  if (inject.kind() == "disk-full" || inject.kind() == "disk-error") {
    std::fprintf(stderr,
                 "endure agent %s: injected fault %s: persisting fails with %s from now on\n",
                 o_.node_id.c_str(), inject.fault_id().c_str(),
                 inject.kind() == "disk-full" ? "ENOSPC" : "EIO");
    tiers_->FailPersistence(inject.kind() == "disk-full" ? InjectedError::kNoSpace
                                                         : InjectedError::kIO);
    return;
  }
  if (inject.kind() == "corrupt-t0" || inject.kind() == "corrupt-t1") {
    pending_corruption_.emplace_back(
        inject.kind() == "corrupt-t0" ? checkpoint::Tier::kT0 : checkpoint::Tier::kT1,
        inject.rank());
    return;
  }
  if (!workers_) return;
  if (inject.kind() == "hang") {
    workers_->Signal(inject.rank(), SIGSTOP);
  } else {
    workers_->Signal(inject.rank(), SIGKILL);
  }
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
  Send(std::move(e), generation_);
}

Status Agent::Run() {
  ENDURE_RETURN_IF_ERROR(Env::Default()->CreateDirs(o_.work_dir));
  ENDURE_RETURN_IF_ERROR(OpenSocket());
  TierStoreOptions tier_options;
  tier_options.node = o_.node_id;
  // Checkpoint memory lives in shared memory, which outlives a crashed worker.
  const std::string shm = Env::Default()->Exists("/dev/shm") ? "/dev/shm" : o_.work_dir;
  tier_options.shm_dir = JoinPath(shm, "endure-" + std::to_string(::getpid()) + "-" + o_.node_id);
  tier_options.token = o_.token;
  tier_options.host = o_.host;
  ENDURE_ASSIGN_OR_RETURN(
      tiers_, TierStore::Start(tier_options, [this](const PersistReport& r) { OnPersisted(r); }));
  auto channel = grpc::CreateChannel(o_.controller, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(15))) {
    return Unavailable("cannot reach the controller at " + o_.controller);
  }
  auto stub = proto::Controller::NewStub(channel);
  grpc::ClientContext context;
  stream_ = stub->Attach(&context);
  proto::AgentEvent hello;
  auto* reg = hello.mutable_register_();
  reg->set_node_id(o_.node_id);
  reg->set_slots(o_.slots);
  reg->set_host(o_.host);
  reg->set_pid(::getpid());
  reg->set_replica_address(o_.host + ":" + std::to_string(tiers_->replica_port()));
  Send(std::move(hello), -1);
  std::thread receiver(&Agent::ReceiveDatagrams, this);

  Status result = Status::Ok();
  proto::AgentCommand cmd;
  bool shutdown = false;
  while (!shutdown && stream_->Read(&cmd)) {
    if (cmd.token() != o_.token) continue;
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
      case proto::AgentCommand::kShutdown:
        shutdown = true;
        break;
      default:
        break;
    }
  }
  if (workers_) workers_->StopAll(std::chrono::milliseconds(shutdown ? 2000 : 0));
  {
    std::lock_guard<std::mutex> lock(standby_mu_);
    for (Standby& s : standbys_) DiscardStandby(s);
    standbys_.clear();
    standby_count_ = 0;
  }
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_->WritesDone();
  }
  grpc::Status st = stream_->Finish();
  if (!shutdown) {
    if (st.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      result = InvalidArgument("the controller refused this agent: " + st.error_message());
    } else {
      result = Unavailable("lost the controller at " + o_.controller + ": " +
                           (st.ok() ? "stream closed" : st.error_message()));
    }
  }
  done_ = true;
  receiver.join();
  {
    std::lock_guard<std::mutex> lock(write_mu_);
    stream_.reset();
  }
  ::close(socket_fd_);
  ::unlink(socket_path_.c_str());
  tiers_.reset();
  return result;
}

}  // namespace

Status AgentOptions::Validate() const {
  if (controller.empty()) return InvalidArgument("--controller: required (host:port)");
  if (node_id.empty()) return InvalidArgument("--node-id: required");
  if (slots < 1) return InvalidArgument("--ranks: must be at least 1");
  if (token.empty()) {
    return InvalidArgument("no job token: set ENDURE_TOKEN or pass --token-file");
  }
  if (work_dir.empty()) return InvalidArgument("--work-dir: required");
  return Status::Ok();
}

Status RunAgent(const AgentOptions& options) {
  ENDURE_RETURN_IF_ERROR(options.Validate());
  // A worker that dies while we write to it must not take the agent along.
  ::signal(SIGPIPE, SIG_IGN);
  // Checkpoint replicas arrive every step: keep freed buffers in the heap
  // rather than handing them back to the kernel and faulting fresh pages in
  // for the next one (about 3 ms per MB on a VM).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
  Result<std::string> rules_text = Env::Default()->ReadFile(options.log_rules);
  if (!rules_text.ok()) return InvalidArgument("--log-rules: " + rules_text.status().message());
  ENDURE_ASSIGN_OR_RETURN(core::LogClassifier classifier,
                          core::LogClassifier::FromToml(*rules_text, options.log_rules));
  Agent agent(options, std::move(classifier));
  return agent.Run();
}

}  // namespace endure::agent
