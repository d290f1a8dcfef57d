// The controller's shell around core::JobMachine: stream admission, the
// event loop, command dispatch, persistence and status.
#include "controller/controller_shell.h"

#include <signal.h>
#include <time.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "common/env.h"
#include "common/names.h"
#include "common/secret.h"
#include "common/utf8.h"
#include "contract/worker_contract.h"
#include "controller/report.h"
#include "core/agent_events.h"
#include "core/incident_match.h"
#include "core/job_codec.h"
#include "core/stack_signature.h"
#include "proto/wire_enums.h"

namespace endure::controller {
namespace {

using core::NodeId;
using core::TimePoint;

constexpr size_t kMaxFieldBytes = 256;  // host, replica address
constexpr size_t kMaxNodeNames = 4096;  // the report's list of nodes that took part

std::string SignalName(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    default:
      return "signal " + std::to_string(sig);
  }
}

// The durable directory (T2) where this host mounts it.
std::string DurableDir(const JobSpec& spec) {
  std::error_code ec;
  return std::filesystem::absolute(spec.checkpoint.dir, ec).string();
}

// This thread's CPU time (the loop's own cost of a part of its work).
// What every worker of the job is told whatever its rank and generation
// (the agent adds each rank's own): what torchrun tells its workers of the
// job, unless the spec's [job] env says otherwise, then the checkpoint
// settings. A warm standby starts with it too (it is in the Prepare of a
// spare node), so that an interpreter finds its modules as it starts.
std::map<std::string, std::string> JobEnvironment(const JobSpec& spec) {
  std::map<std::string, std::string> env;
  env["TORCHELASTIC_RUN_ID"] = spec.name;
  env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(spec.recovery.max_restarts);
  for (const auto& [k, v] : spec.env) env[k] = v;
  if (spec.detection.sdc_check_every > 0) {
    env[worker_env::kSdcCheckEvery] = std::to_string(spec.detection.sdc_check_every);
  }
  if (spec.checkpoint.every_steps > 0) {
    // As the spec names it: the agent resolves a relative one on its host.
    env[worker_env::kCkptDir] = spec.checkpoint.dir;
    env[worker_env::kCkptEvery] = std::to_string(spec.checkpoint.every_steps);
  }
  return env;
}

double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

}  // namespace

int MaxConnections(const JobSpec& spec) { return 2 * spec.nodes + 64; }

ControllerShell::ControllerShell(ControllerOptions options, Clock* clock, Transport* transport,
                                 PortPicker pick_port)
    : o_(std::move(options)),
      clock_(clock),
      transport_(transport),
      pick_port_(std::move(pick_port)),
      start_(Now()),
      start_unix_(clock_->WallSeconds()),
      stream_grace_(MachineOptions(o_.spec).heartbeat.drop_grace),
      machine_(MachineOptions(o_.spec), ExternalFaults(o_.spec), start_),
      durable_(Env::Default(), DurableDir(o_.spec)) {
  for (const faults::Fault& f : o_.spec.faults) fault_ids_.insert(f.id);
}

TimePoint ControllerShell::Now() const {
  return std::chrono::time_point_cast<Duration>(clock_->Now());
}

void ControllerShell::Post(core::JobEvent event) {
  Queued item{std::move(event)};
  item.at = Now();
  queue_.PostControl(std::move(item));
}

void ControllerShell::OnSignal(int sig) {
  Queued stop;
  stop.stop_signal = sig;
  stop.at = Now();
  queue_.PostControl(std::move(stop), /*urgent=*/true);
}

std::optional<ControllerShell::Agent> ControllerShell::AgentOf(NodeId node) const {
  MutexLock lock(&conns_mu_);
  auto it = agents_.find(node);
  if (it == agents_.end()) return std::nullopt;
  return it->second;
}

std::string ControllerShell::NameOf(NodeId node) const {
  std::optional<Agent> a = AgentOf(node);
  return a ? a->name : machine_.NodeName(node);
}

void ControllerShell::Send(NodeId node, proto::AgentCommand cmd) {
  std::optional<Agent> a = AgentOf(node);
  if (!a) return;
  cmd.set_token(o_.token);
  transport_->Send(a->connection, cmd);
}

void ControllerShell::Broadcast(proto::AgentCommand cmd) {
  cmd.set_token(o_.token);
  std::vector<ConnectionId> open;
  {
    MutexLock lock(&conns_mu_);
    for (const auto& [node, agent] : agents_) open.push_back(agent.connection);
  }
  // Outside conns_mu_: a transport may deliver an OnClose from Send.
  for (ConnectionId id : open) transport_->Send(id, cmd);
}

bool ControllerShell::AgentsGone() const {
  MutexLock lock(&conns_mu_);
  return agents_.empty();
}

// ---- Streams (the transport's threads) ----

StreamVerdict ControllerShell::OnOpen(ConnectionId id, const PeerInfo& peer) {
  // Every stream may hold a thread of the transport: at most a few more
  // than the job's nodes, and none may sit silent before its hello
  // (CancelSilentHellos).
  MutexLock lock(&conns_mu_);
  if (static_cast<int>(agents_.size() + hellos_.size()) >= MaxConnections(o_.spec)) {
    std::fprintf(stderr, "endure controller: refused a connection from %s: %d streams open\n",
                 peer.address.c_str(), MaxConnections(o_.spec));
    return StreamVerdict::Refuse(
        StreamVerdict::Code::kResourceExhausted,
        "too many agent connections for a job of " + std::to_string(o_.spec.nodes) + " nodes");
  }
  hellos_[id] = PendingHello{Now() + kHelloTimeout, peer};
  return StreamVerdict::Accept();
}

StreamVerdict ControllerShell::CheckRegistration(const PeerInfo& peer,
                                                 const proto::AgentEvent& first) const {
  if (!ConstantTimeEquals(first.token(), o_.token)) {
    std::fprintf(stderr, "endure controller: refused an agent from %s: wrong or missing token\n",
                 peer.address.c_str());
    return StreamVerdict::Refuse(StreamVerdict::Code::kUnauthenticated,
                                 "wrong or missing job token (ENDURE_TOKEN / --token-file)");
  }
  if (!first.has_register_()) {
    return StreamVerdict::Refuse(StreamVerdict::Code::kInvalidArgument,
                                 "first message must register");
  }
  const proto::Register& hello = first.register_();
  if (!o_.tls_dir.empty() && peer.certificate_name != hello.node_id()) {
    // With TLS a node is who its certificate says: node0's key cannot
    // register node1 (nor take its ranks and checkpoints).
    const std::string message =
        "the certificate names '" + QuoteForLog(peer.certificate_name.value_or("")) +
        "', not the registering node '" + QuoteForLog(hello.node_id()) + "'";
    std::fprintf(stderr, "endure controller: refused an agent from %s: %s\n", peer.address.c_str(),
                 message.c_str());
    return StreamVerdict::Refuse(StreamVerdict::Code::kPermissionDenied, message);
  }
  Status valid = CheckNodeName(hello.node_id(), "the registration's node_id");
  if (valid.ok() && (hello.slots() < 1 || hello.slots() > kMaxRanksPerNode)) {
    valid = InvalidArgument("the registration's slots must be in 1.." +
                            std::to_string(kMaxRanksPerNode) + ", got " +
                            std::to_string(hello.slots()));
  }
  if (valid.ok() &&
      (hello.host().size() > kMaxFieldBytes || hello.replica_address().size() > kMaxFieldBytes)) {
    valid = InvalidArgument("the registration's host or replica_address is longer than " +
                            std::to_string(kMaxFieldBytes) + " bytes");
  }
  if (valid.ok() && (hello.free_port() < 0 || hello.free_port() > 65535)) {
    valid = InvalidArgument("the registration's free_port must be 0 (none) or in 1..65535, got " +
                            std::to_string(hello.free_port()));
  }
  if (!valid.ok()) {
    std::fprintf(stderr, "endure controller: refused an agent from %s: %s\n", peer.address.c_str(),
                 valid.message().c_str());
    return StreamVerdict::Refuse(StreamVerdict::Code::kInvalidArgument, valid.message());
  }
  return StreamVerdict::Accept();
}

StreamVerdict ControllerShell::OnHello(ConnectionId id, const proto::AgentEvent& first) {
  PeerInfo peer;
  {
    MutexLock lock(&conns_mu_);
    auto it = hellos_.find(id);
    if (it != hellos_.end()) {
      peer = it->second.peer;
      hellos_.erase(it);
    }
  }
  const StreamVerdict verdict = CheckRegistration(peer, first);
  if (!verdict.accepted()) return verdict;
  // The registration is accepted: the stream is this node's from now on.
  const proto::Register& hello = first.register_();
  Agent agent;
  agent.connection = id;
  agent.name = hello.node_id();
  agent.host = hello.host();
  agent.replica_address = hello.replica_address();
  agent.free_port = hello.free_port();
  agent.pair_test_port =
      hello.pair_test_port() > 0 && hello.pair_test_port() <= 65535 ? hello.pair_test_port() : 0;
  agent.source = queue_.NewSource();
  NodeId node;
  bool taken_back = false;
  std::optional<ConnectionId> superseded;
  std::vector<core::NodeDown> lost;  // nodes this registration replaces
  {
    MutexLock lock(&conns_mu_);
    // The node this name stands for now: attached (a second registration
    // supersedes its stream), or dropped within the stream grace.
    std::optional<NodeId> previous;
    for (const auto& [n, a] : agents_) {
      if (a.name == agent.name) {
        previous = n;
        superseded = a.connection;
        registered_.erase(a.connection);
        agents_.erase(n);
        break;
      }
    }
    if (auto d = dropped_.find(agent.name); !previous && d != dropped_.end()) {
      if (Now() - d->second.at < d->second.grace) {
        previous = d->second.node;
      } else {
        // LoseDroppedNodes has not run yet.
        lost.push_back({d->second.node, d->second.reason, d->second.at});
      }
      dropped_.erase(d);
    }
    if (previous && hello.resuming()) {
      node = *previous;
      taken_back = true;
    } else {
      // A fresh agent under a known name: the node it was is gone, workers
      // and all.
      if (previous) {
        lost.push_back({*previous, "the agent " + agent.name +
                                       " registered again without resuming (it restarted)"});
      }
      node = NodeId{next_node_++};
    }
    lose_at_once_.erase(node);
    agents_[node] = agent;
    registered_[id] = node;
    if (node_names_.size() < kMaxNodeNames &&
        std::find(node_names_.begin(), node_names_.end(), agent.name) == node_names_.end()) {
      node_names_.push_back(agent.name);
    }
  }
  // Outside conns_mu_: its OnClose may come from within Close, and finds no
  // registration.
  if (superseded) {
    std::fprintf(stderr, "endure controller: %s registered again: its earlier stream is closed\n",
                 agent.name.c_str());
    transport_->Close(*superseded);
  }
  for (core::NodeDown& down : lost) Post(std::move(down));
  if (hello.resuming()) {
    Queued resume;
    resume.node = node;
    resume.resume = hello;
    resume.taken_back = taken_back;
    resume.at = Now();
    queue_.PostControl(std::move(resume));
  }
  if (!taken_back) {
    Queued up{core::NodeUp{node, agent.name, hello.slots(), ""}};
    up.at = Now();
    up.health_summary = SanitizeUtf8(hello.health_summary());
    up.health_ok = hello.health_summary().empty() || hello.health_ok();
    queue_.PostControl(std::move(up));
  }
  return StreamVerdict::Accept();
}

StreamVerdict ControllerShell::OnEvent(ConnectionId id, const proto::AgentEvent& e) {
  if (!ConstantTimeEquals(e.token(), o_.token)) return StreamVerdict::Accept();  // dropped
  NodeId node;
  EventQueue<Queued>::Source source;
  {
    MutexLock lock(&conns_mu_);
    auto it = registered_.find(id);
    if (it == registered_.end()) return StreamVerdict::Accept();
    node = it->second;
    Agent& agent = agents_.at(node);
    source = agent.source;
    // A port free on the node's host once its workers are gone: the next
    // rendezvous there. One out of range is ignored.
    if (e.has_stopped() && e.stopped().free_port() > 0 && e.stopped().free_port() <= 65535) {
      agent.free_port = e.stopped().free_port();
    }
    if (e.has_worker_started() && e.worker_started().free_port() > 0 &&
        e.worker_started().free_port() <= 65535) {
      agent.free_port = e.worker_started().free_port();
    }
  }
  Queued q = Translate(e, node);
  q.at = Now();
  if (!queue_.Post(std::move(q), source)) {
    const std::string reason =
        "the controller closed the agent's stream: " + std::to_string(kMaxQueuedPerAgent) +
        " of its events were waiting for the event loop (a flood)";
    std::fprintf(stderr, "endure controller: %s: %s\n", NameOf(node).c_str(), reason.c_str());
    {
      MutexLock lock(&conns_mu_);
      lose_at_once_.insert(node);  // cut on purpose: it is not coming back
    }
    return StreamVerdict::Refuse(StreamVerdict::Code::kResourceExhausted, reason);
  }
  return StreamVerdict::Accept();
}

void ControllerShell::OnClose(ConnectionId id, const std::string& reason) {
  NodeId node;
  std::optional<core::NodeDown> lost;
  {
    MutexLock lock(&conns_mu_);
    hellos_.erase(id);
    auto it = registered_.find(id);
    if (it == registered_.end()) return;  // never registered, or superseded
    node = it->second;
    registered_.erase(it);
    auto agent = agents_.find(node);
    const std::string name = agent != agents_.end() ? agent->second.name : "";
    agents_.erase(node);
    if (lose_at_once_.erase(node) > 0 || name.empty()) {
      lost = core::NodeDown{node, reason};
    } else {
      // Held for the stream grace: an agent that reconnects and resumes is
      // the same node (LoseDroppedNodes otherwise).
      if (auto d = dropped_.find(name); d != dropped_.end()) {
        lost = core::NodeDown{d->second.node, d->second.reason, d->second.at};
      }
      dropped_[name] = Dropped{node, Now(), reason, stream_grace_};
    }
  }
  if (lost) Post(std::move(*lost));
}

// Runs on an agent's stream thread: a pure conversion.
ControllerShell::Queued ControllerShell::Translate(const proto::AgentEvent& e, NodeId node) const {
  core::AgentEventContext context;
  context.node_named = [this](const std::string& name) -> std::optional<NodeId> {
    MutexLock lock(&conns_mu_);
    for (const auto& [n, a] : agents_) {
      if (a.name == name) return n;
    }
    return std::nullopt;
  };
  context.fault_ids = &fault_ids_;
  context.now = Now();
  context.wall_now_s = clock_->WallSeconds();
  core::AgentEventRead read = core::ReadAgentEvent(e, node, context);
  Queued q;
  q.node = node;
  q.event = std::move(read.event);
  q.log_match = std::move(read.log_match);
  q.progress_unmatched = std::move(read.progress_unmatched);
  q.fingerprint = std::move(read.fingerprint);
  q.tokens = read.tokens;
  q.stopped = std::move(read.stopped);
  return q;
}

// ---- The loop ----

void ControllerShell::CancelSilentHellos(TimePoint now) {
  std::vector<ConnectionId> overdue;
  {
    MutexLock lock(&conns_mu_);
    for (const auto& [id, pending] : hellos_) {
      if (now >= pending.deadline) overdue.push_back(id);
    }
  }
  // Outside conns_mu_: the OnClose that follows may come from within Close.
  for (ConnectionId id : overdue) transport_->Close(id);
}

std::optional<TimePoint> ControllerShell::LoseDroppedNodes(TimePoint now) {
  std::vector<core::NodeDown> lost;
  std::optional<TimePoint> next;
  {
    MutexLock lock(&conns_mu_);
    for (auto it = dropped_.begin(); it != dropped_.end();) {
      const TimePoint deadline = it->second.at + it->second.grace;
      if (now >= deadline) {
        lost.push_back({it->second.node,
                        it->second.reason + ", and the agent did not come back within " +
                            FormatDuration(it->second.grace),
                        it->second.at});
        it = dropped_.erase(it);
      } else {
        next = next ? std::min(*next, deadline) : deadline;
        ++it;
      }
    }
  }
  for (core::NodeDown& down : lost) Post(std::move(down));
  return next;
}

void ControllerShell::OnResume(const Queued& item) {
  const proto::Register& hello = *item.resume;
  const int64_t generation = hello.generation();
  const std::string& name = hello.node_id();
  proto::AgentCommand stop;
  stop.mutable_stop()->set_grace_s(Seconds(o_.spec.recovery.grace_period));
  if (stop_deadline_) {
    // A signal is stopping the job: this node stops with the others.
    stop.set_generation(machine_.generation().value);
    Send(item.node, std::move(stop));
    return;
  }
  // The generation the job still runs (or is stopping, or has just
  // stopped and not yet replaced): the node carries on where it was.
  const bool same = generation >= 0 && generation == machine_.generation().value &&
                    (machine_.phase() == core::JobPhase::kRunning ||
                     machine_.phase() == core::JobPhase::kStopping ||
                     machine_.phase() == core::JobPhase::kWaiting);
  if (item.taken_back && same) {
    std::fprintf(stderr,
                 "endure controller: %s came back resuming generation %lld (%s): taken back "
                 "without an incident\n",
                 name.c_str(), static_cast<long long>(generation),
                 hello.workers_alive() ? "its workers run" : "not every worker runs");
    if (machine_.phase() != core::JobPhase::kRunning) {
      // The stop may have gone out while its stream was down.
      stop.set_generation(generation);
      Send(item.node, std::move(stop));
    }
    return;
  }
  const std::vector<NodeId>& members = machine_.members();
  if (item.taken_back && starts_.count(item.node) > 0 &&
      core::MissedItsStart(generation, machine_.generation().value, machine_.phase(),
                           std::find(members.begin(), members.end(), item.node) != members.end())) {
    std::fprintf(stderr,
                 "endure controller: %s came back resuming generation %lld; it missed the start "
                 "of generation %d while its stream was down: taken back and started\n",
                 name.c_str(), static_cast<long long>(generation), machine_.generation().value);
    if (generation >= 0) {
      stop.set_generation(generation);
      Send(item.node, std::move(stop));
    }
    Send(item.node, starts_.at(item.node));
    return;
  }
  if (generation >= 0) {
    // Workers of a generation the job has left (or of one it no longer
    // holds this node in) must not train on.
    std::fprintf(stderr,
                 "endure controller: %s resumed generation %lld, which the job no longer runs "
                 "with it (generation %d): stopping its workers; it joins as a fresh node\n",
                 name.c_str(), static_cast<long long>(generation), machine_.generation().value);
    stop.set_generation(generation);
    Send(item.node, std::move(stop));
  }
  if (!item.taken_back) return;  // registered as a fresh node already
  NodeId fresh;
  {
    MutexLock lock(&conns_mu_);
    auto it = agents_.find(item.node);
    if (it == agents_.end()) return;  // its stream ended meanwhile: OnClose has it
    fresh = NodeId{next_node_++};
    agents_[fresh] = it->second;
    registered_[it->second.connection] = fresh;
    agents_.erase(it);
  }
  Post(core::NodeDown{item.node, "the agent " + name + " came back resuming generation " +
                                     std::to_string(generation) + ", which the job has left"});
  Post(core::NodeUp{fresh, name, hello.slots()});
}

void ControllerShell::Journal(const std::string& what, const Status& st) const {
  if (st.ok()) return;
  std::fprintf(stderr, "endure controller: journaling %s to %s failed: %s\n", what.c_str(),
               StateStore::PathIn(o_.state_dir).c_str(), st.message().c_str());
}

void ControllerShell::StopOnSignal(int sig, TimePoint now) {
  stop_signal_ = sig;
  stopped_by_ = SignalName(sig);
  // The agents' grace period, their last persist (a second), and a margin.
  stop_deadline_ = now + o_.spec.recovery.grace_period + std::chrono::seconds(3);
  std::fprintf(stderr, "endure controller: %s: stopping the workers (grace %.1fs) and the agents\n",
               stopped_by_.c_str(), Seconds(o_.spec.recovery.grace_period));
  proto::AgentCommand stop;
  stop.set_generation(machine_.generation().value);
  stop.mutable_stop()->set_grace_s(Seconds(o_.spec.recovery.grace_period));
  Broadcast(std::move(stop));
}

bool ControllerShell::EveryAgentStopped() const {
  MutexLock lock(&conns_mu_);
  for (const auto& [node, agent] : agents_) {
    if (!stopped_nodes_.count(node)) return false;
  }
  return true;
}

void ControllerShell::FinishStop() {
  const nlohmann::json newest = CheckpointJson()["newest_durable_step"];
  finish_ = core::FinishAction{
      128 + stop_signal_,
      "stopped by " + stopped_by_ + " at step " + std::to_string(machine_.step().value) +
          " before training completed; running the spec again resumes from the newest "
          "checkpoint" +
          (newest.is_number() ? " (durable: step " + newest.dump() + ")" : std::string())};
  proto::AgentCommand shutdown;
  shutdown.set_generation(machine_.generation().value);
  shutdown.mutable_shutdown()->set_reason("the controller was stopped by " + stopped_by_);
  Broadcast(std::move(shutdown));
}

Status ControllerShell::Start() {
  ENDURE_RETURN_IF_ERROR(Env::Default()->CreateDirs(o_.state_dir));
  Result<StateStore> store = StateStore::Open(StateStore::PathIn(o_.state_dir));
  if (!store.ok()) return store.status();
  store_.emplace(std::move(store).value());
  // The node health ledger: the cluster's, shared by the jobs that name it.
  ledger_dir_ = o_.spec.cluster.state_dir.empty() ? o_.state_dir : o_.spec.cluster.state_dir;
  ENDURE_RETURN_IF_ERROR(Env::Default()->CreateDirs(ledger_dir_));
  Result<NodeLedger> ledger = NodeLedger::Open(NodeLedger::PathIn(ledger_dir_));
  if (!ledger.ok()) return ledger.status();
  nodes_.emplace(std::move(ledger).value());
  // The incident knowledge base lives beside it: recurrences across jobs.
  Result<IncidentKb> kb = IncidentKb::Open(IncidentKb::PathIn(ledger_dir_));
  if (!kb.ok()) return kb.status();
  kb_.emplace(std::move(kb).value());
  ENDURE_RETURN_IF_ERROR(nodes_->SetPolicy(MachineOptions(o_.spec).isolation.health));
  job_.name = o_.spec.name;
  job_.spec_path = o_.spec.path;
  job_.started_at_unix = start_unix_;
  job_.spec_digest = o_.spec.digest;
  ENDURE_ASSIGN_OR_RETURN(const bool carried_on, CarryOn());
  if (carried_on) {
    // The machine is where the earlier controller left it; its agents
    // resume into it. A ControllerResumed tells it that nothing was
    // watched meanwhile.
    metrics_ = std::make_unique<JobMetrics>(o_.spec.name, store_->run());
    // The run's history so far, carried on with it (a damaged one is
    // begun again: it is a view, not the job's state).
    Result<std::optional<nlohmann::json>> saved = store_->LoadHistory();
    if (saved.ok() && *saved) {
      Result<LiveHistory> history = LiveHistory::FromJson(**saved);
      if (history.ok()) {
        history_ = std::move(history).value();
      } else {
        std::fprintf(stderr, "endure controller: %s; the history begins again\n",
                     history.status().message().c_str());
      }
    }
    const TimePoint now = Now();
    Execute(Input(core::ControllerResumed{}, now), now);
    // The durable directory may have changed meanwhile (a manifest this
    // controller asked for and never heard of, a step removed by hand).
    Execute({core::ListDurableAction{}}, now);
    CommitJournal();
    WriteStatus(now, true);
    return Status::Ok();
  }
  // A new run in the same database: the earlier runs' history stays.
  ENDURE_ASSIGN_OR_RETURN(const int run, store_->BeginRun(job_));
  metrics_ = std::make_unique<JobMetrics>(o_.spec.name, run);
  // The run's first input, journaled like the others: its configuration.
  // Generations are numbered after the earlier runs' ones: agents that rode
  // out a dead controller resume theirs, and what their old workers say must
  // not pass for this run's.
  core::JobMachineOptions options = MachineOptions(o_.spec);
  options.first_generation = FirstGeneration();
  machine_ = core::JobMachine(start_);
  Execute(Input(core::Configure{options, ExternalFaults(o_.spec)}, start_), start_);
  if (run > 1) {
    std::fprintf(stderr,
                 "endure controller: run %d in %s (runs 1 to %d kept); generations from %d\n", run,
                 o_.state_dir.c_str(), run - 1, options.first_generation.value);
  }
  // What the durable directory already holds (an earlier run in this state
  // directory): a rollback before this run's first checkpoint goes there.
  const TimePoint now = Now();
  Execute({core::ListDurableAction{}}, now);
  CommitJournal();
  WriteStatus(now, true);
  return Status::Ok();
}

void ControllerShell::LedgerError(const std::string& what, const Status& st) const {
  if (st.ok()) return;
  std::fprintf(stderr, "endure controller: the node health ledger: %s: %s\n", what.c_str(),
               st.message().c_str());
}

int64_t ControllerShell::WallMs() const {
  return static_cast<int64_t>(clock_->WallSeconds() * 1000);
}

void ControllerShell::JudgeRegistration(core::NodeUp& up, const Queued& item) {
  if (!nodes_) return;
  if (!item.health_ok) {
    up.refused = "its health check failed: " + item.health_summary;
    const core::Strike strike =
        core::StrikeFor("health_check_failed", WallMs(), item.health_summary);
    LedgerError("a strike against " + up.name, nodes_->AddStrike(up.name, strike, o_.spec.name));
    ++live_.strikes[up.name];
  } else {
    Result<std::vector<core::Strike>> strikes = nodes_->ActiveStrikes(up.name);
    if (!strikes.ok()) {
      LedgerError("the strikes of " + up.name, strikes.status());
      return;
    }
    live_.strikes[up.name] = static_cast<int>(strikes->size());
    const core::NodeVerdict v =
        core::JudgeNode(*strikes, WallMs(), MachineOptions(o_.spec).isolation.health);
    if (v.state == core::HealthState::kQuarantined) {
      up.refused = "quarantined by the node health ledger (" + v.reason +
                   "); `endure nodes release " + up.name + " --state-dir " + ledger_dir_ +
                   "` returns it to service";
    }
  }
  if (!up.refused.empty()) {
    std::fprintf(stderr, "endure controller: %s may not run the job: %s\n", up.name.c_str(),
                 up.refused.c_str());
  }
}

void ControllerShell::RecordStrike(const core::StrikeNodeAction& a) {
  std::fprintf(stderr, "endure controller: strike against %s: %s (%s)\n", a.node_name.c_str(),
               a.cause.c_str(), a.hard ? "hard" : "soft");
  if (!nodes_) return;
  const core::Strike strike = core::StrikeFor(a.cause, WallMs(), a.detail);
  Status st = nodes_->AddStrike(a.node_name, strike, o_.spec.name);
  LedgerError("a strike against " + a.node_name, st);
  if (st.ok()) ++live_.strikes[a.node_name];
  if (!st.ok() || a.hard) return;  // a hard strike: the machine stopped using the node
  Result<std::vector<core::Strike>> strikes = nodes_->ActiveStrikes(a.node_name);
  if (!strikes.ok()) return;
  live_.strikes[a.node_name] = static_cast<int>(strikes->size());
  const core::NodeVerdict v =
      core::JudgeNode(*strikes, WallMs(), MachineOptions(o_.spec).isolation.health);
  if (v.state == core::HealthState::kQuarantined) Post(core::NodeQuarantined{a.node, v.reason});
}

core::Generation ControllerShell::FirstGeneration() {
  int first = 0;
  for (int earlier = 1; earlier < store_->run(); ++earlier) {
    Result<std::vector<GenerationRecord>> generations = store_->LoadGenerations(earlier);
    if (!generations.ok()) continue;  // a run that never started one
    for (const GenerationRecord& g : *generations) first = std::max(first, g.generation + 1);
  }
  return core::Generation{first};
}

Result<bool> ControllerShell::CarryOn() {
  if (o_.new_run || store_->run() == 0) return false;
  const int run = store_->run();
  Result<JobRecord> last = store_->LoadJob();
  if (!last.ok()) return false;
  auto refuse = [&](const std::string& why) {
    std::fprintf(stderr, "endure controller: not carrying on run %d: %s; a new run begins\n", run,
                 why.c_str());
    return false;
  };
  if (last->finished_at_unix) return false;  // it ended: a rerun is a new run
  if (last->spec_digest != o_.spec.digest || last->name != o_.spec.name) {
    return refuse("it was begun under another spec");
  }
  // Everything the machine knows comes from its newest snapshot and the
  // journal after it, or from the whole journal, its configuration first.
  ENDURE_ASSIGN_OR_RETURN(const std::optional<SnapshotRecord> snapshot, store_->LoadSnapshot());
  const int64_t after = snapshot ? snapshot->seq : 0;
  ENDURE_ASSIGN_OR_RETURN(const std::vector<JournalEntry> journal,
                          store_->LoadJournal(StateStore::kCurrentRun, after));
  if (!snapshot && journal.empty()) return refuse("its journal is empty");
  const Duration last_input = journal.empty() ? snapshot->since_start : journal.back().since_start;
  // The run's clock goes on: its start lies as far back as the run began.
  // The replayed inputs must not lie in the future (a wall clock set back).
  const TimePoint now = Now();
  const Duration since =
      std::max(FromSeconds(clock_->WallSeconds() - last->started_at_unix), Duration(0));
  const TimePoint start = std::min(now - since, now - last_input);
  core::JobMachine machine(start);
  TimePoint at = start;
  if (snapshot) {
    Result<core::JobMachine> restored = core::JobMachine::FromSnapshot(snapshot->state, start);
    if (!restored.ok()) return refuse(restored.status().message());
    machine = std::move(*restored);
    at = start + snapshot->since_start;
  }
  std::optional<core::FinishAction> finished;
  for (const JournalEntry& entry : journal) {
    Result<core::JobEvent> event = core::DecodeEvent(entry.event);
    if (!event.ok()) {
      return refuse("journal entry " + std::to_string(entry.seq) +
                    " is damaged: " + event.status().message());
    }
    if (!snapshot && &entry == &journal.front() &&
        !std::holds_alternative<core::Configure>(*event)) {
      return refuse("its journal does not begin with the job's configuration");
    }
    at = std::max(at, start + entry.since_start);
    // The actions were carried out by the controller that journaled them.
    for (const core::JobAction& a : machine.Step(*event, at)) {
      if (const auto* f = std::get_if<core::FinishAction>(&a)) finished = *f;
    }
  }
  start_ = start;
  start_unix_ = last->started_at_unix;
  machine_ = std::move(machine);
  job_ = *last;
  journal_seq_ = journal.empty() ? snapshot->seq : journal.back().seq;
  snapshot_bytes_ = snapshot ? snapshot->state.size() : 0;
  last_step_at_ = at;
  saved_incidents_ = machine_.incidents().size();
  // An end decided but not reported before the crash is reported now.
  if (finished) finish_ = finished;
  int held = 0;
  {
    MutexLock lock(&conns_mu_);
    for (const auto& [node, name] : machine_.Nodes()) {
      next_node_ = std::max(next_node_, node.value + 1);
      if (node_names_.size() < kMaxNodeNames &&
          std::find(node_names_.begin(), node_names_.end(), name) == node_names_.end()) {
        node_names_.push_back(name);
      }
    }
    for (NodeId node : machine_.NodesUp()) {
      dropped_[machine_.NodeName(node)] =
          Dropped{node, now, "the controller restarted and its agent did not resume", kResumeGrace};
      ++held;
    }
  }
  std::fprintf(
      stderr,
      "endure controller: carrying on run %d in %s: %sreplayed %zu journaled inputs "
      "(generation %d, %s, step %lld, %zu incident(s)); holding %d node(s) for "
      "their agents to resume within %s\n",
      run, o_.state_dir.c_str(),
      snapshot ? ("restored the snapshot of input " + std::to_string(snapshot->seq) + ", ").c_str()
               : "",
      journal.size(), machine_.generation().value,
      std::string(core::JobPhaseName(machine_.phase())).c_str(),
      static_cast<long long>(machine_.step().value), machine_.incidents().size(), held,
      FormatDuration(kResumeGrace).c_str());
  return true;
}

std::vector<core::JobAction> ControllerShell::Input(const core::JobEvent& event, TimePoint at) {
  // The machine's time never goes backwards: an input stepped at an earlier
  // time than the last one is stepped at the last one's.
  last_step_at_ = std::max(last_step_at_, at);
  at = last_step_at_;
  if (store_ && !group_open_) {
    const Status st = store_->BeginTransaction();
    Journal("an input", st);
    group_open_ = st.ok();
    group_inputs_ = 0;
    group_started_ = Now();
  }
  if (group_open_) {
    std::string line = core::EncodeEvent(event);
    journaled_bytes_ += line.size();
    Journal("an input", store_->AppendJournal({++journal_seq_, at - start_, std::move(line)}));
    ++group_inputs_;
  }
  const size_t incidents_before = machine_.incidents().size();
  std::vector<core::JobAction> actions = machine_.Step(event, at);
  if (!actions.empty() || machine_.incidents().size() != incidents_before) Persist();
  return actions;
}

uint64_t SnapshotDueAt(uint64_t snapshot_bytes, uint64_t after_bytes) {
  return std::max(after_bytes, snapshot_bytes);
}

bool SnapshotDue(uint64_t journaled_bytes, uint64_t snapshot_bytes, uint64_t after_bytes) {
  return journaled_bytes >= SnapshotDueAt(snapshot_bytes, after_bytes);
}

void ControllerShell::CommitJournal() {
  if (!group_open_) return;
  group_open_ = false;
  const Status committed = store_->CommitTransaction();
  Journal("a group of inputs", committed);
  if (committed.ok() && SnapshotDue(journaled_bytes_, snapshot_bytes_, o_.snapshot_after_bytes)) {
    TakeSnapshot();
  }
}

void ControllerShell::TakeSnapshot() {
  const TimePoint began = Now();
  std::string state = machine_.Snapshot();
  const size_t bytes = state.size();
  const Status saved =
      store_->SaveSnapshot({journal_seq_, last_step_at_ - start_, std::move(state)});
  // Failed, the journal is whole (a restart replays more of it), and the
  // next try comes after as many bytes more.
  journaled_bytes_ = 0;
  if (!saved.ok()) {
    Journal("a snapshot", saved);
    return;
  }
  snapshot_bytes_ = bytes;
  ++snapshots_;
  snapshot_took_ = Now() - began;
}

void ControllerShell::RunOnce(bool block) {
  Turn(block);
  // The group of inputs journaled so far is committed before the loop waits
  // (nothing more is queued), or once it is large or old enough.
  if (group_open_ && (queue_.size() == 0 || group_inputs_ >= kJournalGroupInputs ||
                      Now() - group_started_ >= kJournalGroupAge)) {
    CommitJournal();
  }
  // A burst's last inputs are in the live status within kStatusEvery, also
  // when nothing follows them (while inputs queue, each writes it in turn).
  if (status_behind_ && queue_.size() == 0 && Now() - last_status_ >= kStatusEvery) {
    WriteStatus(Now(), false);
  }
}

void ControllerShell::Turn(bool block) {
  // At least once a second: silent new streams are cut on time.
  TimePoint wake = Now() + std::chrono::seconds(1);
  if (std::optional<TimePoint> deadline = machine_.NextDeadline()) {
    wake = std::min(wake, *deadline);
  }
  if (stop_deadline_) wake = std::min(wake, *stop_deadline_);
  if (status_behind_) wake = std::min(wake, last_status_ + kStatusEvery);
  if (std::optional<TimePoint> dropped = LoseDroppedNodes(Now())) wake = std::min(wake, *dropped);
  // The machine's deadlines are judged on time also while inputs queue up:
  // a tick comes between two inputs once a deadline has passed — as of the
  // oldest input still waiting, so that no node is judged silent whose
  // heartbeat sits in the queue (a backlog delays verdicts by its age, and
  // never makes one). Never two ticks in a row: the queue always moves.
  std::optional<TimePoint> oldest;
  queue_.PeekFront([&](const Queued& waiting) { oldest = waiting.at; });
  const TimePoint peeked = Now();
  JudgeLoad(peeked, oldest);
  const TimePoint judged_at = oldest ? std::min(peeked, *oldest) : peeked;
  const std::optional<TimePoint> due = machine_.NextDeadline();
  const bool tick_first = oldest && due && *due <= judged_at && !ticked_last_turn_;
  std::optional<Queued> next;
  if (!tick_first) {
    next = queue_.PopUntil(
        block ? std::chrono::time_point_cast<std::chrono::steady_clock::duration>(wake)
              : std::chrono::steady_clock::time_point{});
  }
  const bool have = next.has_value();
  ticked_last_turn_ = tick_first;
  Queued item = have ? std::move(*next) : Queued{};
  const TimePoint now = Now();
  CancelSilentHellos(now);
  if (item.stop_signal > 0 && !stop_deadline_) StopOnSignal(item.stop_signal, now);
  if (item.resume) {
    OnResume(item);
    return;
  }
  if (stop_deadline_) {
    // No decision is made any more, but what the tiers report is still
    // taken: a step the agents persist on their way out commits.
    OnInventory(item);
    if (item.event && std::holds_alternative<core::ShardPersisted>(*item.event)) {
      last_step_at_ = std::max(last_step_at_, std::min(item.at, now));
      Execute(Input(*item.event, last_step_at_), now);
    }
    if (item.stopped) stopped_nodes_.insert(item.node);
    if (EveryAgentStopped() || now >= *stop_deadline_) FinishStop();
    return;
  }
  if (!have) {
    item.event = core::Tick{};
    item.at = tick_first ? judged_at : now;
  }
  if (item.progress_unmatched) {
    const proto::ProgressUnmatched& u = *item.progress_unmatched;
    char what[128];
    std::snprintf(what, sizeof what, "%lld lines its workers printed over %.1fs",
                  static_cast<long long>(std::max<int64_t>(0, u.lines())),
                  std::isfinite(u.seconds()) ? std::max(0.0, u.seconds()) : 0.0);
    Warn(NameOf(item.node) + ": [detection] progress_pattern matched none of the " + what +
         " (the last: '" + SanitizeUtf8(u.last_line().substr(0, 200)) +
         "'), so no step is counted: fix the pattern (docs/progress_pattern.md has one for each "
         "framework) or report steps with the client library (docs/python.md)");
    return;
  }
  if (item.log_match) {
    const int rank = item.log_match->rank();
    if (rank >= 0 && rank < o_.spec.world_size()) {
      last_log_[{machine_.generation().value, rank}] = *item.log_match;
    }
    return;
  }
  OnInventory(item);
  if (!item.event) return;
  if (auto* exit = std::get_if<core::WorkerExitEvent>(&*item.event)) {
    auto it = last_log_.find({exit->generation.value, exit->rank.value});
    if (it != last_log_.end()) {
      exit->log_cause = SanitizeUtf8(it->second.cause());  // bytes: a worker's output
      // An action no rule has (none matched, or a newer agent's) is no action.
      if (std::optional<core::LogAction> action = wire::FromWire(it->second.action())) {
        exit->log_action = *action;
      }
      exit->log_rule = it->second.rule();
      exit->log_line = SanitizeUtf8(it->second.line());
    }
    if (!item.fingerprint.empty() && exit->rank == core::Rank{0}) fingerprint_ = item.fingerprint;
  }
  if (auto* up = std::get_if<core::NodeUp>(&*item.event)) JudgeRegistration(*up, item);
  // Rank 0's steps give the rate (status steps_per_s, tokens_per_s): one
  // StepEnd, or its step among its node's (NodeStepsEnd).
  const core::StepEnd* rank0 = std::get_if<core::StepEnd>(&*item.event);
  if (const auto* batch = std::get_if<core::NodeStepsEnd>(&*item.event)) {
    for (const core::StepEnd& s : batch->steps) {
      if (s.rank == core::Rank{0}) rank0 = &s;
    }
  }
  if (rank0 != nullptr && rank0->rank == core::Rank{0}) {
    if (item.tokens > 0) tokens_per_step_ = item.tokens;
    recent_steps_.emplace_back(item.at, rank0->step.value);
    while (recent_steps_.size() > 20) recent_steps_.pop_front();
  }
  const size_t incidents_before = machine_.incidents().size();
  // The machine's time never goes backwards: an event that waited in the
  // queue behind a tick is stepped at the tick's time.
  last_step_at_ = std::max(last_step_at_, std::min(item.at, now));
  const std::vector<core::JobAction> actions = Input(*item.event, last_step_at_);
  Execute(actions, now);
  if (const auto* up = std::get_if<core::NodeUp>(&*item.event); up && !up->refused.empty()) {
    // It may not run the job: its agent goes (a scheduler, or `endure run`,
    // brings another node in its place).
    proto::AgentCommand cmd;
    cmd.set_generation(machine_.generation().value);
    cmd.mutable_shutdown()->set_reason("refused: " + up->name + " " + up->refused);
    Send(up->node, std::move(cmd));
  }
  PrepareSpares();
  WriteStatus(now, !actions.empty() || machine_.incidents().size() != incidents_before);
}

void ControllerShell::PrepareSpares() {
  const JobSpec& spec = o_.spec;
  if (!spec.recovery.warm_standby || machine_.phase() != core::JobPhase::kRunning) return;
  const std::set<NodeId> members(machine_.members().begin(), machine_.members().end());
  const std::map<std::string, std::string> refused = machine_.RefusedNodes();
  for (NodeId n : machine_.NodesUp()) {
    if (members.count(n) > 0 || prepared_.count(n) > 0 || refused.count(machine_.NodeName(n))) {
      continue;
    }
    prepared_.insert(n);
    proto::AgentCommand cmd;
    cmd.set_generation(machine_.generation().value);
    for (const std::string& arg : spec.command) cmd.mutable_prepare()->add_command(arg);
    cmd.mutable_prepare()->set_standbys(spec.ranks_per_node);
    for (const auto& [k, v] : JobEnvironment(spec)) (*cmd.mutable_prepare()->mutable_env())[k] = v;
    Send(n, std::move(cmd));
  }
}

Result<int> ControllerShell::Finish() {
  ENDURE_CHECK(finish_.has_value());
  const TimePoint end = Now();
  Persist();
  CommitJournal();
  tables_built_at_.reset();  // the live view's last state, with the run's last history sample
  final_view_ = true;
  WriteStatus(end, true);
  ReportInputs in{machine_,
                  o_.spec.name,
                  start_,
                  end,
                  finish_->exit_code,
                  finish_->reason,
                  fingerprint_,
                  machine_.step().value,
                  machine_.last_loss(),
                  {}};
  in.stopped_by = stopped_by_;
  for (const auto& [id, entry] : kb_entries_) {
    in.recurrences[id] = {{"kb_id", entry.id}, {"similar", entry.recurrence}};
  }
  {
    MutexLock lock(&conns_mu_);
    in.nodes = node_names_;
  }
  nlohmann::json report = BuildReport(in);
  report["checkpoint"] = CheckpointJson();
  report["history"] = history_.ToJson();
  report["warnings"] = warnings_;
  if (store_) Journal("the run history", AddRunHistory(*store_, report));
  if (store_) Journal("the report", store_->SaveReport(report));
  job_.finished_at_unix = clock_->WallSeconds();
  job_.exit_code = finish_->exit_code;
  job_.verdict = finish_->reason;
  job_.param_fingerprint = fingerprint_;
  if (store_) Journal("the job", store_->SaveJob(job_));
  ENDURE_RETURN_IF_ERROR(WriteFileAtomically(Env::Default(), JoinPath(o_.state_dir, "report.json"),
                                             report.dump(2) + "\n"));
  return finish_->exit_code;
}

void ControllerShell::Execute(const std::vector<core::JobAction>& actions, TimePoint now) {
  // The inputs that led here are durable before any action is carried out.
  if (!actions.empty()) CommitJournal();
  const JobSpec& spec = o_.spec;
  for (const core::JobAction& action : actions) {
    if (IsCheckpointAction(action)) {
      CarryOutCheckpoint(action, now);
    } else if (const auto* a = std::get_if<core::StartGenerationAction>(&action)) {
      // The rendezvous (c10d's store) runs where rank 0 does: on a port its
      // node found free on its own host, each report used once; failing
      // that, one free on the controller's host.
      std::optional<Agent> first = AgentOf(a->nodes.at(0));
      int port = 0;
      {
        MutexLock lock(&conns_mu_);
        if (auto it = agents_.find(a->nodes.at(0)); it != agents_.end()) {
          std::swap(port, it->second.free_port);
        }
      }
      std::string port_origin = "free on the host of " + NameOf(a->nodes.at(0));
      if (port == 0) {
        Result<int> picked = pick_port_();
        port = picked.ok() ? *picked : 29500;
        port_origin = "picked on the controller's host: rank 0's node reported no free port";
      }
      proto::StartGeneration start;
      // The generation's own: fewer ranks than the spec's when the job shrank.
      const int world_size = static_cast<int>(a->nodes.size()) * spec.ranks_per_node;
      start.set_world_size(world_size);
      start.set_master_addr(first ? first->host : "127.0.0.1");
      start.set_master_port(port);
      std::fprintf(stderr, "endure controller: generation %d: rendezvous at %s:%d (%s)\n",
                   a->generation.value, start.master_addr().c_str(), port, port_origin.c_str());
      start.set_restore_step(a->restore_step.value);
      for (core::StepNumber s : a->skip_steps) start.add_skip_steps(s.value);
      for (const std::string& arg : spec.command) start.add_command(arg);
      for (const auto& [k, v] : JobEnvironment(spec)) (*start.mutable_env())[k] = v;
      *start.mutable_checkpoint() = CheckpointFor(*a);
      start.set_progress_pattern(spec.detection.progress_pattern);
      start.set_in_process(spec.recovery.in_process);
      start.set_rejoin(a->rejoin);
      std::string names;
      starts_.clear();
      for (size_t i = 0; i < a->nodes.size(); ++i) {
        proto::AgentCommand cmd;
        cmd.set_generation(a->generation.value);
        *cmd.mutable_start() = start;
        // Each node replicates to the next one, never to itself.
        if (std::optional<NodeId> next =
                core::ReplicaPeerOf(a->nodes, i, spec.checkpoint.replicas)) {
          if (std::optional<Agent> peer = AgentOf(*next)) {
            cmd.mutable_start()->mutable_checkpoint()->set_replica_peer(peer->replica_address);
          }
        }
        for (int l = 0; l < spec.ranks_per_node; ++l) {
          const int rank = static_cast<int>(i) * spec.ranks_per_node + l;
          proto::RankAssignment* r = cmd.mutable_start()->add_ranks();
          r->set_rank(rank);
          r->set_local_rank(l);
          r->set_faults_json(
              faults::EncodeFaults(faults::FaultsForRank(spec.faults, rank, a->fired_faults)));
        }
        starts_[a->nodes[i]] = cmd;
        Send(a->nodes[i], std::move(cmd));
        names += (names.empty() ? "" : ",") + machine_.NodeName(a->nodes[i]);
      }
      if (store_) {
        Journal("generation " + std::to_string(a->generation.value),
                store_->SaveGeneration({a->generation.value, Seconds(now - start_),
                                        a->restore_step.value, world_size, names, std::nullopt}));
      }
      // Log matches explain exits of their own generation only.
      std::erase_if(last_log_,
                    [&](const auto& entry) { return entry.first.first < a->generation.value; });
    } else if (const auto* a = std::get_if<core::StopGenerationAction>(&action)) {
      for (NodeId n : machine_.members()) {
        if (a->dump_stacks) {
          proto::AgentCommand dump;
          dump.set_generation(a->generation.value);
          dump.mutable_dump_stacks()->set_timeout_s(Seconds(spec.detection.stack_timeout));
          Send(n, std::move(dump));
        }
        proto::AgentCommand stop;
        stop.set_generation(a->generation.value);
        stop.mutable_stop()->set_grace_s(Seconds(spec.recovery.grace_period));
        Send(n, std::move(stop));
      }
    } else if (const auto* a = std::get_if<core::EvictNodeAction>(&action)) {
      proto::AgentCommand cmd;
      cmd.set_generation(machine_.generation().value);
      cmd.mutable_shutdown()->set_reason("evicted: " + a->reason);
      Send(a->node, std::move(cmd));
    } else if (const auto* a = std::get_if<core::InjectFaultAction>(&action)) {
      proto::AgentCommand cmd;
      cmd.set_generation(a->generation.value);
      cmd.mutable_inject()->set_rank(a->fault.rank.value);
      cmd.mutable_inject()->set_kind(wire::ToWire(a->fault.kind));
      cmd.mutable_inject()->set_fault_id(a->fault.id);
      NodeId target = a->node;
      if (a->fault.kind == faults::FaultKind::kCorruptT1) {
        // The replica of a node's shards lives on the next node of the generation.
        const int nodes = static_cast<int>(machine_.members().size());
        const int i = a->fault.rank.value / spec.ranks_per_node;
        target = machine_.NodeOfRank(core::Rank{((i + 1) % nodes) * spec.ranks_per_node});
      }
      std::fprintf(stderr, "endure controller: injecting fault %s (%s) on %s\n",
                   a->fault.id.c_str(), std::string(faults::FaultKindName(a->fault.kind)).c_str(),
                   machine_.NodeName(target).c_str());
      if (a->fault.kind == faults::FaultKind::kKillAgent) {
        MutexLock lock(&conns_mu_);
        lose_at_once_.insert(target);  // the node dies: its stream's end is its loss
      }
      Send(target, std::move(cmd));
    } else if (const auto* a = std::get_if<core::StrikeNodeAction>(&action)) {
      RecordStrike(*a);
    } else if (const auto* a = std::get_if<core::RunPairTestAction>(&action)) {
      for (const auto& [first, second] : a->pairs) {
        std::optional<Agent> peer = AgentOf(second);
        if (!peer || peer->pair_test_port == 0)
          continue;  // no answer: the round's timeout fails it
        proto::AgentCommand cmd;
        cmd.set_generation(machine_.generation().value);
        proto::PairTest* t = cmd.mutable_pair_test();
        t->set_test(a->test);
        t->set_round(a->round);
        t->set_peer_node(peer->name);
        t->set_peer_host(peer->host);
        t->set_peer_port(peer->pair_test_port);
        t->set_bytes(4 << 20);
        t->set_timeout_s(Seconds(spec.isolation.pairwise_timeout) * 0.8);
        Send(first, std::move(cmd));
      }
      std::fprintf(stderr, "endure controller: pairwise test %d round %d: %zu pair(s)\n", a->test,
                   a->round, a->pairs.size());
    } else if (const auto* a = std::get_if<core::FinishAction>(&action)) {
      finish_ = *a;
      proto::AgentCommand cmd;
      cmd.set_generation(machine_.generation().value);
      cmd.mutable_shutdown()->set_reason("the job ended: " + a->reason);
      Broadcast(std::move(cmd));
    }
  }
}

void ControllerShell::JudgeLoad(TimePoint now, std::optional<TimePoint> oldest) {
  behind_ = oldest ? std::max(Duration(0), now - *oldest) : Duration(0);
  const bool overloaded =
      overloaded_since_ ? behind_ > kCaughtUpWithin : behind_ > kOverloadedAfter;
  if (overloaded && !overloaded_since_) {
    overloaded_since_ = now;
    std::fprintf(stderr,
                 "endure controller: overloaded: the oldest of %zu queued inputs has waited %s; "
                 "decisions on inputs are that late (heartbeat timeouts and hangs are still "
                 "judged on time)\n",
                 queue_.size(), FormatDuration(behind_).c_str());
  } else if (!overloaded && overloaded_since_) {
    overloaded_for_ += now - *overloaded_since_;
    std::fprintf(stderr, "endure controller: caught up after %s overloaded\n",
                 FormatDuration(now - *overloaded_since_).c_str());
    overloaded_since_.reset();
  }
}

void ControllerShell::WriteStatus(TimePoint now, bool force) {
  if (!force && now - last_status_ < kStatusEvery) {
    status_behind_ = true;  // written at the latest kStatusEvery after the last
    return;
  }
  status_behind_ = false;
  last_status_ = now;
  // The durable ledger is at most a second old, also while training runs
  // with nothing to act on (Persist saves it only on a change): charged up
  // to now on a copy, since the machine's own ledger moves only with events.
  if (store_ && (force || now - ledger_saved_at_ >= std::chrono::seconds(1))) {
    core::EttrLedger current = machine_.ledger();
    current.Advance(std::max(now, last_step_at_));
    Journal("the ledger", store_->SaveLedger(current));
    ledger_saved_at_ = now;
  }
  double steps_per_s = 0;
  if (recent_steps_.size() >= 2) {
    const double dt = Seconds(recent_steps_.back().first - recent_steps_.front().first);
    const double ds = double(recent_steps_.back().second - recent_steps_.front().second);
    if (dt > 0 && ds > 0) steps_per_s = ds / dt;
  }
  nlohmann::json status = {
      {"phase", std::string(core::JobPhaseName(machine_.phase()))},
      {"generation", machine_.generation().value},
      {"step", machine_.step().value},
      {"loss", std::isfinite(machine_.last_loss()) ? nlohmann::json(machine_.last_loss())
                                                   : nlohmann::json("nan")},
      {"steps_per_s", steps_per_s},
      {"tokens_per_s", steps_per_s * double(tokens_per_step_)},
      {"ettr", machine_.ledger().Ettr()},
      {"elapsed_s", Seconds(now - start_)},
      {"incidents", machine_.incidents().size()},
      // Loss anomalies a replay showed to be the data's ([anomaly]), and how
      // anomalies are judged now.
      {"data_anomalies", machine_.data_anomalies().size()},
      {"anomaly_mode", std::string(machine_.anomaly_mode())},
      // The controller itself: how far behind its inputs it is, and its
      // journal since the last snapshot.
      {"controller",
       {{"inputs", journal_seq_},
        {"queued", queue_.size()},
        {"behind_s", Seconds(behind_)},
        {"overloaded", overloaded_since_.has_value()},
        {"overloaded_s",
         Seconds(overloaded_for_ + (overloaded_since_ ? now - *overloaded_since_ : Duration(0)))},
        {"journal_bytes_since_snapshot", journaled_bytes_},
        {"snapshot_due_bytes", SnapshotDueAt(snapshot_bytes_, o_.snapshot_after_bytes)},
        {"snapshot_bytes", snapshot_bytes_},
        {"snapshots", snapshots_},
        {"snapshot_s", Seconds(snapshot_took_)}}},
  };
  if (!machine_.incidents().empty()) {
    const core::Incident& inc = machine_.incidents().back();
    status["last_incident"] =
        inc.cause.name + " (rank " + std::to_string(inc.rank.value) + ", " + inc.action + ")";
    // Which way it went back to training, and why not a faster one (a
    // full restart under [recovery] in_process says what stood in the way).
    if (inc.route) {
      status["last_route"] =
          std::string(core::RecoveryRouteName(*inc.route)) + " (" + inc.route_reason + ")";
    }
  }
  status["name"] = o_.spec.name;
  status["warnings"] = warnings_;
  status["world_size"] = machine_.members().size() * machine_.ranks_per_node();
  status["stragglers_flagged"] = machine_.stragglers().size();
  const DurableView durable = Durable(now);
  status["durable"] = {
      {"step", durable.step},
      {"age_s", std::isfinite(durable.age_s) ? nlohmann::json(durable.age_s) : nlohmann::json()}};
  // The newest copy in node memory (every member's T0, its peer's T1).
  status["memory_step"] = machine_.checkpoints().NewestCopy().value;
  nlohmann::json ledger_s = nlohmann::json::object();
  for (int c = 0; c < core::kNumLedgerCategories; ++c) {
    const auto category = static_cast<core::LedgerCategory>(c);
    ledger_s[std::string(core::LedgerCategoryName(category))] =
        Seconds(machine_.ledger().total(category));
  }
  status["ledger_s"] = std::move(ledger_s);
  // What the dashboard and /metrics cost the loop (CPU time, whatever
  // the clock): status "controller.view_cpu_s".
  const double cpu0 = ThreadCpuSeconds();
  if (metrics_) metrics_->Update(machine_, status, durable);
  if (!tables_built_at_ || now - *tables_built_at_ >= kTablesEvery) {
    tables_built_at_ = now;
    BuildLiveView(now, status);
  }
  view_cpu_s_ += ThreadCpuSeconds() - cpu0;
  status["controller"]["view_cpu_s"] = view_cpu_s_;
  {
    MutexLock lock(&published_mu_);
    nlohmann::json by_state = nlohmann::json::object();
    for (int st = 0; st < kNumNodeStates; ++st) {
      by_state[std::string(NodeStateName(static_cast<NodeState>(st)))] =
          tables_->nodes_by_state[st];
    }
    status["nodes_by_state"] = std::move(by_state);
    status_json_ = status.dump();
  }
  // Not durable on purpose: a live view, rewritten four times a second.
  const std::string path = JoinPath(o_.state_dir, "status.json");
  FILE* f = std::fopen((path + ".tmp").c_str(), "w");
  if (f == nullptr) return;
  std::fputs(status.dump().c_str(), f);
  std::fclose(f);
  std::rename((path + ".tmp").c_str(), path.c_str());
}

void ControllerShell::Warn(const std::string& warning) {
  if (warnings_.size() >= kMaxWarnings ||
      std::find(warnings_.begin(), warnings_.end(), warning) != warnings_.end()) {
    return;
  }
  std::fprintf(stderr, "endure controller: warning: %s\n", warning.c_str());
  warnings_.push_back(warning);
}

DurableView ControllerShell::Durable(TimePoint now) {
  const core::CheckpointTotals totals = machine_.checkpoints().totals();
  const int64_t newest = totals.newest_durable.value;
  if (newest != durable_seen_) {
    if (newest >= 0 && !durable_at_) {
      // Committed before this controller: its directory's time says when.
      const std::optional<double> at = durable_.CommittedAtUnix(core::StepNumber{newest});
      durable_at_ = now - std::chrono::duration_cast<Duration>(std::chrono::duration<double>(
                              std::max(0.0, at ? clock_->WallSeconds() - *at : 0.0)));
    } else if (newest >= 0) {
      durable_at_ = now;
    }
    durable_seen_ = newest;
  }
  // A job that takes no checkpoints has no age to alert on (NaN: the
  // metric's comparisons are false).
  const double age_s = o_.spec.checkpoint.every_steps <= 0
                           ? std::nan("")
                           : Seconds(now - (newest >= 0 && durable_at_ ? *durable_at_ : start_));
  return {newest, age_s, totals.durable_commits};
}

void ControllerShell::BuildLiveView(TimePoint now, const nlohmann::json& status) {
  auto tables = std::make_shared<LiveTables>(BuildLiveTables(machine_, start_, live_));
  const double t_s = Seconds(now - start_);
  heat_.Add(t_s, *tables);
  tables->steptimes = heat_.ToJson();
  tables->steptimes["outliers"] = tables->outliers;
  nlohmann::json flagged = nlohmann::json::array();
  for (const core::StragglerReport& r : machine_.stragglers()) {
    flagged.push_back({{"rank", r.rank.value},
                       {"node", r.node_name},
                       {"step", r.step.value},
                       {"slowdown", r.slowdown},
                       {"at_s", Seconds(r.at - start_)}});
  }
  tables->steptimes["flagged"] = std::move(flagged);
  if (metrics_) metrics_->UpdateNodes(*tables);

  std::optional<std::string> history;
  if (final_view_ || history_.Due(t_s)) {
    HistorySample sample;
    sample.t_s = t_s;
    sample.ettr = machine_.ledger().Ettr();
    sample.step = machine_.step().value;
    sample.loss = machine_.step().value > 0 ? machine_.last_loss() : std::nan("");
    sample.tokens_per_s = status.value("tokens_per_s", 0.0);
    for (int c = 0; c < core::kNumLedgerCategories; ++c) {
      sample.ledger_s[c] = Seconds(machine_.ledger().total(static_cast<core::LedgerCategory>(c)));
    }
    history_.Add(sample);
    const nlohmann::json j = history_.ToJson();
    history = j.dump();
    // Saved with the ledger's cadence or slower: the report's plots.
    if (store_ &&
        (final_view_ || !history_saved_at_ || now - *history_saved_at_ >= kHistorySaveEvery)) {
      history_saved_at_ = now;
      Journal("the history", store_->SaveHistory(j));
    }
  }
  MutexLock lock(&published_mu_);
  tables_ = std::move(tables);
  if (history) history_json_ = std::move(*history);
}

std::string ControllerShell::StatusJson() const {
  MutexLock lock(&published_mu_);
  return status_json_;
}

Result<nlohmann::json> ControllerShell::TablePage(LiveTable table, std::string_view page) const {
  std::shared_ptr<const LiveTables> tables;
  {
    MutexLock lock(&published_mu_);
    tables = tables_;
  }
  return PageOf(table == LiveTable::kNodes ? tables->nodes : tables->incidents, page);
}

std::string ControllerShell::MetricsText() const {
  return metrics_ ? metrics_->Text() : std::string();
}

std::string ControllerShell::HistoryJson() const {
  MutexLock lock(&published_mu_);
  return history_json_;
}

std::string ControllerShell::StepTimesJson() const {
  std::shared_ptr<const LiveTables> tables;
  {
    MutexLock lock(&published_mu_);
    tables = tables_;
  }
  return tables->steptimes.dump();
}

void ControllerShell::NoteTiers(const Queued& item) {
  if (item.stopped) {
    NodeTiers& t = live_.tiers[NameOf(item.node)];
    t.t0_bytes = item.stopped->t0_bytes();
    t.t1_bytes = item.stopped->t1_bytes();
    t.t0_step = t.t1_step = -1;
    for (const proto::ShardCopy& c : item.stopped->inventory()) {
      const std::optional<checkpoint::Tier> tier = wire::FromWire(c.tier());
      if (!tier || !c.refused().empty()) continue;
      if (*tier == checkpoint::Tier::kT0) t.t0_step = std::max(t.t0_step, c.step());
      if (*tier == checkpoint::Tier::kT1) t.t1_step = std::max(t.t1_step, c.step());
    }
  } else if (item.event) {
    if (const auto* p = std::get_if<core::ShardPersisted>(&*item.event)) {
      NodeTiers& t = live_.tiers[NameOf(item.node)];
      t.t0_bytes = p->t0_bytes;
      t.t1_bytes = p->t1_bytes;
      t.persisted_step = std::max(t.persisted_step, p->step.value);
    }
  }
}

void ControllerShell::OnInventory(const Queued& item) {
  NoteTiers(item);
  if (!item.stopped) return;
  core::InventoryReported inventory{
      item.node, {}, item.stopped->t0_bytes(), item.stopped->t1_bytes()};
  for (const proto::ShardCopy& p : item.stopped->inventory()) {
    const std::optional<checkpoint::Tier> tier = wire::FromWire(p.tier());
    if (!tier || p.shards() < 1 || p.shard() < 0 || p.shard() >= p.shards()) continue;
    checkpoint::ShardCopy c;
    c.step = p.step();
    c.shard = p.shard();
    c.shards = p.shards();
    c.tier = *tier;
    c.node = NameOf(item.node);
    c.path = p.path();
    c.bytes = p.bytes();
    c.xxh3 = std::strtoull(p.xxh3().c_str(), nullptr, 16);
    c.refused = p.refused();
    inventory.copies.push_back(std::move(c));
  }
  last_step_at_ = std::max(last_step_at_, std::min(item.at, Now()));
  Execute(Input(inventory, last_step_at_), Now());
}

void ControllerShell::CarryOutCheckpoint(const core::JobAction& action, TimePoint now) {
  if (std::optional<core::JobEvent> result = durable_.CarryOut(action)) {
    Execute(Input(*result, last_step_at_), now);
  }
}

nlohmann::json ControllerShell::CheckpointJson() const {
  const core::CheckpointTotals t = machine_.checkpoints().totals();
  nlohmann::json shards = nlohmann::json::object();
  for (const auto& [tier, n] : t.restored_shards_by_tier) {
    if (n > 0) shards[tier] = n;
  }
  return {{"durable_commits", t.durable_commits},
          {"newest_durable_step",
           t.newest_durable.value < 0 ? nlohmann::json() : nlohmann::json(t.newest_durable.value)},
          {"persist_failures", t.persist_failures},
          {"memory_budget_bytes", o_.spec.checkpoint.memory_budget_bytes},
          {"peak_t0_bytes", t.peak_t0_bytes},
          {"peak_t1_bytes", t.peak_t1_bytes},
          {"restored_shards_by_tier", shards}};
}

proto::CheckpointConfig ControllerShell::CheckpointFor(const core::StartGenerationAction& a) {
  const CheckpointSpec& spec = o_.spec.checkpoint;
  proto::CheckpointConfig c;
  if (a.rejoin) {
    // The ranks that kept their state hand it to the others, or, when each
    // holds a different part of it (sharded), every rank restores its part
    // from the tiers (the plan below, or its node's memory).
    const std::vector<core::JobAction> none =
        Input(core::RestoreChosen{a.generation,
                                  a.rejoin_from_tiers
                                      ? "in process: each rank restores its part of the state "
                                        "(sharded) from the tiers in its process"
                                      : "in process: the state of the ranks that kept it, "
                                        "broadcast to the ranks that started"},
              last_step_at_);
    ENDURE_CHECK(none.empty());
  }
  if (spec.every_steps <= 0 || !spec.memory) return c;
  c.set_enabled(true);
  // As the spec names it: a relative directory is resolved by each agent on
  // its own host (under its --checkpoint-root), never here.
  c.set_dir(spec.dir);
  c.set_persist_every_steps(spec.persist_every_steps);
  c.set_memory_budget(static_cast<uint64_t>(spec.memory_budget_bytes));
  c.set_slot_bytes(machine_.checkpoints().SlotBytes());
  if (a.rejoin) {
    c.set_discard_after(-1);  // the snapshots already taken stay
    if (!a.rejoin_from_tiers) return c;
  }
  checkpoint::RestorePlan plan = VerifiedPlan(
      machine_, durable_, a,
      [this](const core::JobEvent& refused) { Execute(Input(refused, last_step_at_), Now()); });
  if (!a.rejoin) c.set_discard_after(a.generation.value > 0 ? plan.step : -1);
  // Durable copies go down relative to the T2 directory, which the
  // controller reads where this host mounts it and each agent where its
  // own host does.
  checkpoint::RestorePlan sent = plan;
  std::error_code ec;
  const std::filesystem::path t2 = std::filesystem::absolute(spec.dir, ec);
  for (checkpoint::RestoreSource& s : sent.sources) {
    if (s.copy.tier != checkpoint::Tier::kT2) continue;
    s.copy.path = std::filesystem::path(s.copy.path).lexically_relative(t2).string();
  }
  c.set_restore_plan_json(checkpoint::RestorePlanToJson(sent).dump());
  if (a.rejoin) return c;
  // An input to the machine like any other (it asks for nothing): the
  // book's new timeline begins at the restore point.
  const std::vector<core::JobAction> none =
      Input(RestoreChosenFor(a.generation, plan), last_step_at_);
  ENDURE_CHECK(none.empty());
  return c;
}

void ControllerShell::Persist() {
  if (!store_) return;
  // Incidents change while they recover: save the open one and any new ones.
  const auto& incidents = machine_.incidents();
  for (size_t i = saved_incidents_ > 0 ? saved_incidents_ - 1 : 0; i < incidents.size(); ++i) {
    Journal("an incident", store_->SaveIncident(incidents[i], start_));
  }
  saved_incidents_ = incidents.size();
  Journal("the ledger", store_->SaveLedger(machine_.ledger()));
  RecordInKnowledgeBase();
}

void ControllerShell::RecordInKnowledgeBase() {
  if (!kb_ || !store_) return;
  for (const core::Incident& inc : machine_.incidents()) {
    auto known = kb_entries_.find(inc.id);
    if (known != kb_entries_.end()) {
      if (known->second.action != inc.action) {
        Journal("an incident's action", kb_->UpdateAction(known->second.id, inc.action));
        known->second.action = inc.action;
      }
      continue;
    }
    KbIncident k;
    k.job = o_.spec.name;
    k.job_dir = o_.state_dir;
    k.run = store_->run();
    k.job_incident = inc.id;
    k.at_unix_ms = static_cast<int64_t>((start_unix_ + Seconds(inc.detected_at - start_)) * 1000);
    k.node = inc.node_name;
    k.rank = inc.rank.value;
    k.cause = inc.cause.name;
    k.action = inc.action;
    if (auto it = last_log_.find({inc.generation.value, inc.rank.value}); it != last_log_.end()) {
      k.log_rule = it->second.rule();
      // An action no rule has (none matched, or a newer agent's) is no action.
      if (std::optional<core::LogAction> a = wire::FromWire(it->second.action())) {
        k.log_action = *a;
      }
      k.excerpt = SanitizeUtf8(it->second.excerpt());  // bytes: a worker's output
    }
    k.normalized = core::NormalizeExcerpt(k.excerpt);
    // A hang's signature: the stuck rank's main thread ("rank N:\n<stack>").
    const std::string prefix = "rank " + std::to_string(inc.rank.value) + ":\n";
    for (const std::string& stack : inc.stacks) {
      if (stack.rfind(prefix, 0) == 0)
        k.stack_signature = core::StackSignature(stack.substr(prefix.size()));
    }
    // The earlier incidents like it, before it joins them.
    nlohmann::json recurrence = nlohmann::json::array();
    Result<std::vector<Recurrence>> similar =
        kb_->Similar(k, 3, core::kRecurrenceScore, /*earlier_only=*/true);
    if (similar.ok()) {
      for (const Recurrence& r : *similar) {
        recurrence.push_back({{"kb_id", r.id},
                              {"score", std::round(r.score * 1000) / 1000},
                              {"job", r.job},
                              {"incident", r.job_incident},
                              {"cause", r.cause},
                              {"resolution", r.action},
                              {"resolved_by_operator", r.resolved},
                              {"note", r.note}});
      }
    } else {
      Journal("similar incidents", similar.status());
    }
    Result<int64_t> id = kb_->Record(k);
    if (!id.ok()) {
      Journal("the incident knowledge base", id.status());
      continue;
    }
    if (!recurrence.empty()) live_.recurrences[inc.id] = recurrence;
    kb_entries_[inc.id] = {*id, inc.action, std::move(recurrence)};
  }
}

}  // namespace endure::controller
