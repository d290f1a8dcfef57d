// The controller's shell around core::JobMachine: gRPC service, event loop,
// command dispatch, persistence and status.
#include "controller/controller.h"

#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/env.h"
#include "common/hash.h"
#include "common/names.h"
#include "common/secret.h"
#include "common/subprocess.h"
#include "common/utf8.h"
#include "controller/checkpoint_coordinator.h"
#include "controller/event_queue.h"
#include "controller/report.h"
#include "controller/state_store.h"
#include "core/log_classifier.h"
#include "proto/endure.grpc.pb.h"

namespace endure::controller {
namespace {

using core::NodeId;
using core::TimePoint;
using Stream = grpc::ServerReaderWriter<proto::AgentCommand, proto::AgentEvent>;

TimePoint Now() {
  return TimePoint(
      std::chrono::duration_cast<Duration>(std::chrono::steady_clock::now().time_since_epoch()));
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// What one agent can make the controller hold. An agent sends a heartbeat a
// second and a few events per rank and step; far more than that waiting for
// the loop is a flood (or a loop that cannot keep up), and the agent's
// stream is closed rather than the queue grown without bound.
constexpr int kMaxMessageBytes = 4 << 20;  // one AgentEvent (gRPC's receive limit)
constexpr int kMaxQueuedPerAgent = 10'000;
constexpr size_t kMaxFieldBytes = 256;  // host, replica address
constexpr auto kHelloTimeout = std::chrono::seconds(10);
constexpr size_t kMaxNodeNames = 4096;  // the report's list of nodes that took part

// Registered agents plus streams still waiting for their first message.
int MaxConnections(const JobSpec& spec) { return 2 * spec.nodes + 64; }

// Whether `host` (of a bind address) only accepts connections from this
// machine: 127.0.0.0/8, ::1 or localhost.
bool IsLoopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.rfind("127.", 0) == 0;
}

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

// One attached agent. The stream belongs to its Attach call; `open` turns
// false (under `mu`) before that call returns, after which nobody writes.
struct Connection {
  std::mutex mu;
  Stream* stream = nullptr;  // GUARDED_BY(mu); valid while open
  bool open = true;          // GUARDED_BY(mu)
  NodeId node;
  std::string name;
  std::string host;
  std::string replica_address;  // where peers send this node's checkpoint replicas
};

CoordinatorOptions CoordinatorFor(const JobSpec& spec) {
  std::error_code ec;
  CoordinatorOptions o;
  o.dir = std::filesystem::absolute(spec.checkpoint.dir, ec).string();
  o.keep = spec.checkpoint.keep;
  o.world_size = spec.world_size();
  o.ranks_per_node = spec.ranks_per_node;
  o.memory_budget = static_cast<uint64_t>(spec.checkpoint.memory_budget_bytes);
  o.replicas = spec.checkpoint.replicas;
  return o;
}

class Controller final : public proto::Controller::Service {
 public:
  Controller(ControllerOptions options, TimePoint start)
      : o_(std::move(options)),
        start_(start),
        start_unix_(WallSeconds()),
        machine_(MachineOptions(o_.spec), ExternalFaults(o_.spec), start),
        checkpoints_(Env::Default(), CoordinatorFor(o_.spec)) {
    for (const faults::Fault& f : o_.spec.faults) fault_ids_.insert(f.id);
  }

  Result<int> Run();

  grpc::Status Attach(grpc::ServerContext* context, Stream* stream) override;

  // SIGTERM or SIGINT arrived (from the signal thread): the loop stops the
  // job next, before any event already queued.
  void OnSignal(int sig);

 private:
  // What a stream thread hands to the loop: a core event, and what the shell
  // alone needs of it.
  struct Queued {
    std::optional<core::JobEvent> event;
    std::optional<proto::LogMatch> log_match;         // explains the exit that follows
    std::string fingerprint;                          // from a worker's last words
    int64_t tokens = 0;                               // tokens of a step
    std::optional<proto::GenerationStopped> stopped;  // with the node's checkpoint inventory
    std::optional<proto::ShardPersisted> persisted;
    NodeId node;
    TimePoint at;
    int stop_signal = 0;  // > 0: stop the job, a signal asked for it
  };
  // Queues a control event for the loop (never refused).
  void Post(core::JobEvent event);
  Queued Translate(const proto::AgentEvent& e, NodeId node);
  // A signal stops the job: every agent is told to stop its workers, and
  // from then on the loop makes no decision (the workers' exits are the
  // stop's) but still takes what the tiers report, so that a step the agents
  // persist on their way out commits. The stop ends (FinishStop) once every
  // agent has stopped or hung up, or at stop_deadline_.
  void StopOnSignal(int sig, TimePoint now);
  void FinishStop();
  bool EveryAgentStopped();
  // Cancels the streams whose first message is overdue.
  void CancelSilentHellos(TimePoint now);
  // Logs a failure to journal to the state store; the job goes on.
  void Journal(const std::string& what, const Status& st);
  // Waits until every agent hung up, or `deadline`.
  void AwaitAgents(TimePoint deadline);
  void Execute(const std::vector<core::JobAction>& actions, TimePoint now);
  void Send(NodeId node, proto::AgentCommand cmd);
  std::shared_ptr<Connection> Conn(NodeId node);
  void WriteStatus(TimePoint now, bool force);
  // Hands the live status to the HTTP server: /api/status as is, /metrics in
  // Prometheus' text format with the ETTR ledger.
  void Publish(const nlohmann::json& status);
  Result<std::string> StartHttp();
  void Persist();
  // Inventories, durable shards and lost nodes, for the checkpoint engine.
  void OnCheckpointEvent(const Queued& item);
  // The checkpoint part of a StartGeneration for the nodes `members`.
  proto::CheckpointConfig CheckpointFor(const core::StartGenerationAction& start);
  std::string NameOf(NodeId node) {
    std::shared_ptr<Connection> c = Conn(node);
    return c ? c->name : machine_.NodeName(node);
  }

  ControllerOptions o_;
  TimePoint start_;
  double start_unix_;
  core::JobMachine machine_;           // owned by the loop thread
  CheckpointCoordinator checkpoints_;  // owned by the loop thread
  std::optional<StateStore> store_;

  std::mutex conns_mu_;
  // Open streams only: an Attach erases its own when it returns.
  std::map<NodeId, std::shared_ptr<Connection>> conns_;  // GUARDED_BY(conns_mu_)
  int next_node_ = 0;                                    // GUARDED_BY(conns_mu_)
  // Streams waiting for their first message, and until when.
  std::map<grpc::ServerContext*, TimePoint> hellos_;  // GUARDED_BY(conns_mu_)
  std::vector<std::string> node_names_;               // GUARDED_BY(conns_mu_); that ever registered
  std::set<std::string> fault_ids_;                   // the spec's; immutable after construction

  EventQueue<Queued> queue_{kMaxQueuedPerAgent};

  // Loop-thread state.
  std::map<std::pair<int64_t, int>, proto::LogMatch> last_log_;  // (generation, rank)
  std::string fingerprint_;
  std::optional<core::FinishAction> finish_;
  int stop_signal_ = 0;     // the signal that stopped the job, if one did
  std::string stopped_by_;  // its name
  std::optional<TimePoint> stop_deadline_;
  std::set<NodeId> stopped_nodes_;  // agents that reported their workers stopped since
  httplib::Server http_;
  std::thread http_thread_;
  std::mutex http_mu_;
  std::string status_json_ = "{}";  // GUARDED_BY(http_mu_)
  std::string metrics_text_;        // GUARDED_BY(http_mu_)

  TimePoint last_status_{};
  TimePoint last_step_at_{};
  size_t saved_incidents_ = 0;
  int64_t tokens_per_step_ = 0;
  std::deque<std::pair<TimePoint, int64_t>> recent_steps_;  // for the rate
};

void Controller::Post(core::JobEvent event) {
  Queued item{std::move(event)};
  item.at = Now();
  queue_.PostControl(std::move(item));
}

void Controller::OnSignal(int sig) {
  Queued stop;
  stop.stop_signal = sig;
  stop.at = Now();
  queue_.PostControl(std::move(stop), /*urgent=*/true);
}

std::shared_ptr<Connection> Controller::Conn(NodeId node) {
  std::lock_guard<std::mutex> lock(conns_mu_);
  auto it = conns_.find(node);
  return it == conns_.end() ? nullptr : it->second;
}

void Controller::Send(NodeId node, proto::AgentCommand cmd) {
  std::shared_ptr<Connection> c = Conn(node);
  if (!c) return;
  cmd.set_token(o_.token);
  std::lock_guard<std::mutex> lock(c->mu);
  if (c->open) c->stream->Write(cmd);
}

grpc::Status Controller::Attach(grpc::ServerContext* context, Stream* stream) {
  {
    // Every stream holds a thread: at most a few more than the job's nodes,
    // and none may sit silent before its hello (CancelSilentHellos).
    std::lock_guard<std::mutex> lock(conns_mu_);
    if (static_cast<int>(conns_.size() + hellos_.size()) >= MaxConnections(o_.spec)) {
      std::fprintf(stderr, "endure controller: refused a connection from %s: %d streams open\n",
                   context->peer().c_str(), MaxConnections(o_.spec));
      return grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          "too many agent connections for a job of " + std::to_string(o_.spec.nodes) + " nodes");
    }
    hellos_[context] = Now() + kHelloTimeout;
  }
  proto::AgentEvent first;
  const bool got = stream->Read(&first);
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    hellos_.erase(context);
  }
  if (!got) return grpc::Status(grpc::StatusCode::CANCELLED, "no hello");
  if (!ConstantTimeEquals(first.token(), o_.token)) {
    std::fprintf(stderr, "endure controller: refused an agent from %s: wrong or missing token\n",
                 context->peer().c_str());
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "wrong or missing job token (ENDURE_TOKEN / --token-file)");
  }
  if (!first.has_register_()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "first message must register");
  }
  const proto::Register& hello = first.register_();
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
  if (!valid.ok()) {
    std::fprintf(stderr, "endure controller: refused an agent from %s: %s\n",
                 context->peer().c_str(), valid.message().c_str());
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, valid.message());
  }
  auto conn = std::make_shared<Connection>();
  conn->stream = stream;
  conn->name = hello.node_id();
  conn->host = hello.host();
  conn->replica_address = hello.replica_address();
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    conn->node = NodeId{next_node_++};
    conns_[conn->node] = conn;
    if (node_names_.size() < kMaxNodeNames &&
        std::find(node_names_.begin(), node_names_.end(), conn->name) == node_names_.end()) {
      node_names_.push_back(conn->name);
    }
  }
  Post(core::NodeUp{conn->node, conn->name, hello.slots()});
  std::string reason = "the agent's stream closed";
  grpc::Status status = grpc::Status::OK;
  const EventQueue<Queued>::Source source = queue_.NewSource();
  proto::AgentEvent e;
  while (stream->Read(&e)) {
    if (!ConstantTimeEquals(e.token(), o_.token)) continue;
    Queued q = Translate(e, conn->node);
    q.at = Now();
    if (!queue_.Post(std::move(q), source)) {
      reason = "the controller closed the agent's stream: " + std::to_string(kMaxQueuedPerAgent) +
               " of its events were waiting for the event loop (a flood)";
      std::fprintf(stderr, "endure controller: %s: %s\n", conn->name.c_str(), reason.c_str());
      status = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, reason);
      break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(conn->mu);
    conn->open = false;
  }
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    conns_.erase(conn->node);
  }
  Post(core::NodeDown{conn->node, reason});
  return status;
}

void Controller::CancelSilentHellos(TimePoint now) {
  std::lock_guard<std::mutex> lock(conns_mu_);
  for (const auto& [context, deadline] : hellos_) {
    // Safe: an Attach erases its context, under this mutex, before it returns.
    if (now >= deadline) context->TryCancel();
  }
}

void Controller::Journal(const std::string& what, const Status& st) {
  if (st.ok()) return;
  std::fprintf(stderr, "endure controller: journaling %s to %s failed: %s\n", what.c_str(),
               StateStore::PathIn(o_.state_dir).c_str(), st.message().c_str());
}

void Controller::StopOnSignal(int sig, TimePoint now) {
  stop_signal_ = sig;
  stopped_by_ = SignalName(sig);
  // The agents' grace period, their last persist (a second), and a margin.
  stop_deadline_ = now + o_.spec.recovery.grace_period + std::chrono::seconds(3);
  std::fprintf(stderr, "endure controller: %s: stopping the workers (grace %.1fs) and the agents\n",
               stopped_by_.c_str(), Seconds(o_.spec.recovery.grace_period));
  std::lock_guard<std::mutex> lock(conns_mu_);
  for (const auto& [node, conn] : conns_) {
    proto::AgentCommand stop;
    stop.set_token(o_.token);
    stop.set_generation(machine_.generation());
    stop.mutable_stop()->set_grace_s(Seconds(o_.spec.recovery.grace_period));
    std::lock_guard<std::mutex> conn_lock(conn->mu);
    if (conn->open) conn->stream->Write(stop);
  }
}

bool Controller::EveryAgentStopped() {
  std::lock_guard<std::mutex> lock(conns_mu_);
  for (const auto& [node, conn] : conns_) {
    if (!stopped_nodes_.count(node)) return false;
  }
  return true;
}

void Controller::FinishStop() {
  const nlohmann::json newest = checkpoints_.ReportJson()["newest_durable_step"];
  finish_ = core::FinishAction{
      128 + stop_signal_,
      "stopped by " + stopped_by_ + " at step " + std::to_string(machine_.step()) +
          " before training completed; running the spec again resumes from the newest "
          "checkpoint" +
          (newest.is_number() ? " (durable: step " + newest.dump() + ")" : std::string())};
  std::lock_guard<std::mutex> lock(conns_mu_);
  for (const auto& [node, conn] : conns_) {
    proto::AgentCommand shutdown;
    shutdown.set_token(o_.token);
    shutdown.set_generation(machine_.generation());
    shutdown.mutable_shutdown()->set_reason("the controller was stopped by " + stopped_by_);
    std::lock_guard<std::mutex> conn_lock(conn->mu);
    if (conn->open) conn->stream->Write(shutdown);
  }
}

void Controller::AwaitAgents(TimePoint deadline) {
  while (Now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(conns_mu_);
      if (conns_.empty()) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Runs on an agent's stream thread: a pure conversion.
Controller::Queued Controller::Translate(const proto::AgentEvent& e, NodeId node) {
  const int gen = static_cast<int>(e.generation());
  Queued q;
  q.node = node;
  switch (e.event_case()) {
    case proto::AgentEvent::kWorkerReady:
      q.event = core::WorkerReady{gen, e.worker_ready().rank(), e.worker_ready().start_step(),
                                  e.worker_ready().restore_s()};
      break;
    case proto::AgentEvent::kStep: {
      const auto& s = e.step();
      q.event = core::StepEnd{
          gen, s.rank(), s.step(), s.loss(), s.ckpt_stall_s(), s.checkpoint_step(), s.skipped()};
      q.tokens = s.tokens();
      break;
    }
    case proto::AgentEvent::kLogMatch:
      q.log_match = e.log_match();
      break;
    case proto::AgentEvent::kWorkerExited: {
      const auto& x = e.worker_exited();
      core::WorkerExitEvent exit;
      exit.generation = gen;
      exit.rank = x.rank();
      exit.node = node;
      if (x.exited()) {
        exit.exit_code = x.exit_code();
      } else {
        exit.signal = x.signal();
      }
      q.event = exit;
      q.fingerprint = x.param_fingerprint();
      break;
    }
    case proto::AgentEvent::kStackDump:
      q.event =
          core::StackDumpEvent{gen, e.stack_dump().rank(), SanitizeUtf8(e.stack_dump().text())};
      break;
    case proto::AgentEvent::kFaultFired: {
      const auto& f = e.fault_fired();
      // Only the spec's faults are remembered: any other id would grow the
      // set of fired faults handed to every later generation.
      if (!fault_ids_.count(f.fault_id())) break;
      // The worker's wall clock says when; map it onto the steady clock.
      const double ago = std::max(0.0, WallSeconds() - e.time_s());
      q.event = core::FaultFiredEvent{gen,      f.rank(), f.fault_id(),
                                      f.kind(), f.step(), Now() - FromSeconds(ago)};
      break;
    }
    case proto::AgentEvent::kStopped:
      q.event = core::GenerationStoppedEvent{gen, node};
      q.stopped = e.stopped();
      break;
    case proto::AgentEvent::kPersisted: {
      const auto& p = e.persisted();
      q.persisted = p;
      if (!p.error().empty()) {
        q.event = core::PersistFailedEvent{gen, p.shard(), p.step(), node, p.error()};
      }
      break;
    }
    case proto::AgentEvent::kHeartbeat:
      q.event = core::NodeHeartbeat{node};
      break;
    default:
      break;
  }
  return q;
}

void Controller::Execute(const std::vector<core::JobAction>& actions, TimePoint now) {
  const JobSpec& spec = o_.spec;
  for (const core::JobAction& action : actions) {
    if (const auto* a = std::get_if<core::StartGenerationAction>(&action)) {
      Result<int> port = PickFreePort();
      std::shared_ptr<Connection> first = Conn(a->nodes.at(0));
      proto::StartGeneration start;
      start.set_world_size(spec.world_size());
      start.set_master_addr(first ? first->host : "127.0.0.1");
      start.set_master_port(port.ok() ? *port : 29500);
      start.set_restore_step(a->restore_step);
      for (int64_t s : a->skip_steps) start.add_skip_steps(s);
      for (const std::string& arg : spec.command) start.add_command(arg);
      for (const auto& [k, v] : spec.env) (*start.mutable_env())[k] = v;
      if (spec.checkpoint.every_steps > 0) {
        std::error_code ec;
        (*start.mutable_env())["ENDURE_CKPT_DIR"] =
            std::filesystem::absolute(spec.checkpoint.dir, ec).string();
        (*start.mutable_env())["ENDURE_CKPT_EVERY"] = std::to_string(spec.checkpoint.every_steps);
      }
      *start.mutable_checkpoint() = CheckpointFor(*a);
      start.set_progress_pattern(spec.detection.progress_pattern);
      std::string names;
      for (size_t i = 0; i < a->nodes.size(); ++i) {
        proto::AgentCommand cmd;
        cmd.set_generation(a->generation);
        *cmd.mutable_start() = start;
        // Each node replicates to the next one, never to itself.
        if (spec.checkpoint.replicas > 0 && a->nodes.size() > 1) {
          std::shared_ptr<Connection> peer = Conn(a->nodes[(i + 1) % a->nodes.size()]);
          if (peer)
            cmd.mutable_start()->mutable_checkpoint()->set_replica_peer(peer->replica_address);
        }
        for (int l = 0; l < spec.ranks_per_node; ++l) {
          const int rank = static_cast<int>(i) * spec.ranks_per_node + l;
          proto::RankAssignment* r = cmd.mutable_start()->add_ranks();
          r->set_rank(rank);
          r->set_local_rank(l);
          r->set_faults_json(
              faults::EncodeFaults(faults::FaultsForRank(spec.faults, rank, a->fired_faults)));
        }
        Send(a->nodes[i], std::move(cmd));
        names += (names.empty() ? "" : ",") + machine_.NodeName(a->nodes[i]);
      }
      if (store_) {
        Journal("generation " + std::to_string(a->generation),
                store_->SaveGeneration({a->generation, Seconds(now - start_), a->restore_step,
                                        spec.world_size(), names, std::nullopt}));
      }
      // Log matches explain exits of their own generation only.
      std::erase_if(last_log_,
                    [&](const auto& entry) { return entry.first.first < a->generation; });
    } else if (const auto* a = std::get_if<core::StopGenerationAction>(&action)) {
      std::vector<NodeId> members;
      for (int r = 0; r < spec.world_size(); r += spec.ranks_per_node) {
        members.push_back(machine_.NodeOfRank(r));
      }
      for (NodeId n : members) {
        if (a->dump_stacks) {
          proto::AgentCommand dump;
          dump.set_generation(a->generation);
          dump.mutable_dump_stacks()->set_timeout_s(Seconds(spec.detection.stack_timeout));
          Send(n, std::move(dump));
        }
        proto::AgentCommand stop;
        stop.set_generation(a->generation);
        stop.mutable_stop()->set_grace_s(Seconds(spec.recovery.grace_period));
        Send(n, std::move(stop));
      }
    } else if (const auto* a = std::get_if<core::EvictNodeAction>(&action)) {
      proto::AgentCommand cmd;
      cmd.set_generation(machine_.generation());
      cmd.mutable_shutdown()->set_reason("evicted: " + a->reason);
      Send(a->node, std::move(cmd));
    } else if (const auto* a = std::get_if<core::InjectFaultAction>(&action)) {
      proto::AgentCommand cmd;
      cmd.set_generation(a->generation);
      cmd.mutable_inject()->set_rank(a->fault.rank);
      cmd.mutable_inject()->set_kind(a->fault.kind);
      cmd.mutable_inject()->set_fault_id(a->fault.id);
      NodeId target = a->node;
      if (a->fault.kind == "corrupt-t1") {
        // The replica of a node's shards lives on the next node of the generation.
        const int nodes = spec.nodes;
        const int i = a->fault.rank / spec.ranks_per_node;
        target = machine_.NodeOfRank(((i + 1) % nodes) * spec.ranks_per_node);
      }
      std::fprintf(stderr, "endure controller: injecting fault %s (%s) on %s\n",
                   a->fault.id.c_str(), a->fault.kind.c_str(), machine_.NodeName(target).c_str());
      Send(target, std::move(cmd));
    } else if (const auto* a = std::get_if<core::FinishAction>(&action)) {
      finish_ = *a;
      std::lock_guard<std::mutex> lock(conns_mu_);
      for (const auto& [node, conn] : conns_) {
        proto::AgentCommand cmd;
        cmd.set_token(o_.token);
        cmd.set_generation(machine_.generation());
        cmd.mutable_shutdown()->set_reason("the job ended: " + a->reason);
        std::lock_guard<std::mutex> conn_lock(conn->mu);
        if (conn->open) conn->stream->Write(cmd);
      }
    }
  }
}

void Controller::WriteStatus(TimePoint now, bool force) {
  if (!force && now - last_status_ < std::chrono::milliseconds(250)) return;
  last_status_ = now;
  double steps_per_s = 0;
  if (recent_steps_.size() >= 2) {
    const double dt = Seconds(recent_steps_.back().first - recent_steps_.front().first);
    const double ds = double(recent_steps_.back().second - recent_steps_.front().second);
    if (dt > 0 && ds > 0) steps_per_s = ds / dt;
  }
  nlohmann::json status = {
      {"phase", std::string(core::JobPhaseName(machine_.phase()))},
      {"generation", machine_.generation()},
      {"step", machine_.step()},
      {"loss", std::isfinite(machine_.last_loss()) ? nlohmann::json(machine_.last_loss())
                                                   : nlohmann::json("nan")},
      {"steps_per_s", steps_per_s},
      {"tokens_per_s", steps_per_s * double(tokens_per_step_)},
      {"ettr", machine_.ledger().Ettr()},
      {"elapsed_s", Seconds(now - start_)},
      {"incidents", machine_.incidents().size()},
  };
  if (!machine_.incidents().empty()) {
    const core::Incident& inc = machine_.incidents().back();
    status["last_incident"] =
        inc.cause + " (rank " + std::to_string(inc.rank) + ", " + inc.action + ")";
  }
  Publish(status);
  // Not durable on purpose: a live view, rewritten four times a second.
  const std::string path = JoinPath(o_.state_dir, "status.json");
  FILE* f = std::fopen((path + ".tmp").c_str(), "w");
  if (f == nullptr) return;
  std::fputs(status.dump().c_str(), f);
  std::fclose(f);
  std::rename((path + ".tmp").c_str(), path.c_str());
}

void Controller::OnCheckpointEvent(const Queued& item) {
  if (item.stopped) {
    std::vector<checkpoint::ShardCopy> copies;
    for (const proto::ShardCopy& p : item.stopped->inventory()) {
      Result<checkpoint::Tier> tier = checkpoint::TierFromName(p.tier());
      if (!tier.ok()) continue;
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
      copies.push_back(std::move(c));
    }
    checkpoints_.OnInventory(NameOf(item.node), std::move(copies), item.stopped->t0_bytes(),
                             item.stopped->t1_bytes());
  }
  if (item.persisted) {
    const proto::ShardPersisted& p = *item.persisted;
    checkpoints_.OnMemory(p.t0_bytes(), p.t1_bytes());
    if (!p.error().empty()) {
      checkpoints_.OnPersistFailed();
    } else {
      Status st =
          checkpoints_.OnPersisted(p.step(), p.shard(), p.shards(),
                                   {p.bytes(), std::strtoull(p.xxh3().c_str(), nullptr, 16)});
      if (!st.ok()) {
        std::fprintf(stderr, "endure controller: committing step %lld failed: %s\n",
                     static_cast<long long>(p.step()), st.message().c_str());
        checkpoints_.OnPersistFailed();
      }
    }
  }
  if (item.event) {
    if (const auto* down = std::get_if<core::NodeDown>(&*item.event)) {
      checkpoints_.OnNodeGone(NameOf(down->node));
    }
  }
}

proto::CheckpointConfig Controller::CheckpointFor(const core::StartGenerationAction& a) {
  const CheckpointSpec& spec = o_.spec.checkpoint;
  proto::CheckpointConfig c;
  if (spec.every_steps <= 0 || !spec.memory) return c;
  std::error_code ec;
  c.set_enabled(true);
  c.set_dir(std::filesystem::absolute(spec.dir, ec).string());
  c.set_persist_every_steps(spec.persist_every_steps);
  c.set_memory_budget(static_cast<uint64_t>(spec.memory_budget_bytes));
  c.set_slot_bytes(checkpoints_.SlotBytes());
  std::vector<std::string> members;
  for (NodeId n : a.nodes) members.push_back(NameOf(n));
  checkpoint::RestorePlan plan = checkpoints_.Plan(members, a.restore_step, a.abandoned_from);
  c.set_discard_after(a.generation > 0 ? plan.step : -1);
  c.set_restore_plan_json(checkpoint::RestorePlanToJson(plan).dump());
  std::string note = plan.Summary();
  for (const std::string& n : plan.notes) note += "; " + n;
  machine_.NoteRestore(a.generation, note);
  return c;
}

void Controller::Persist() {
  if (!store_) return;
  // Incidents change while they recover: save the open one and any new ones.
  const auto& incidents = machine_.incidents();
  for (size_t i = saved_incidents_ > 0 ? saved_incidents_ - 1 : 0; i < incidents.size(); ++i) {
    Journal("an incident", store_->SaveIncident(incidents[i], start_));
  }
  saved_incidents_ = incidents.size();
  Journal("the ledger", store_->SaveLedger(machine_.ledger()));
}

void Controller::Publish(const nlohmann::json& status) {
  const std::string job = "{job=\"" + o_.spec.name + "\"}";
  std::string m;
  auto gauge = [&](const char* name, const char* help, double value, const char* type = "gauge") {
    char line[64];
    std::snprintf(line, sizeof line, "%.9g", value);
    m += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
         name + job + " " + line + "\n";
  };
  gauge("endure_generation", "Current generation of the worker set.", machine_.generation());
  gauge("endure_step", "Steps every rank has completed.", static_cast<double>(machine_.step()));
  gauge("endure_loss", "Loss reported by rank 0 for its last step.", machine_.last_loss());
  gauge("endure_tokens_per_second", "Training throughput.", status.value("tokens_per_s", 0.0));
  gauge("endure_ettr", "Effective training time ratio so far (productive / wall).",
        machine_.ledger().Ettr());
  gauge("endure_incidents_total", "Failures detected so far.",
        static_cast<double>(machine_.incidents().size()), "counter");
  m += "# HELP endure_ledger_seconds Wall time so far, by ETTR ledger category.\n"
       "# TYPE endure_ledger_seconds counter\n";
  for (int c = 0; c < core::kNumLedgerCategories; ++c) {
    const auto category = static_cast<core::LedgerCategory>(c);
    char line[160];
    std::snprintf(line, sizeof line, "endure_ledger_seconds{job=\"%s\",category=\"%s\"} %.6f\n",
                  o_.spec.name.c_str(), std::string(core::LedgerCategoryName(category)).c_str(),
                  Seconds(machine_.ledger().total(category)));
    m += line;
  }
  std::lock_guard<std::mutex> lock(http_mu_);
  status_json_ = status.dump();
  metrics_text_ = std::move(m);
}

Result<std::string> Controller::StartHttp() {
  const size_t colon = o_.http_listen.rfind(':');
  if (colon == std::string::npos) {
    return InvalidArgument("--http: '" + o_.http_listen + "' is not HOST:PORT");
  }
  const std::string host = o_.http_listen.substr(0, colon);
  const std::string port_text = o_.http_listen.substr(colon + 1);
  int wanted = -1;
  const auto [end, ec] =
      std::from_chars(port_text.data(), port_text.data() + port_text.size(), wanted);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || wanted < 0 ||
      wanted > 65535) {
    return InvalidArgument("--http: '" + o_.http_listen + "' is not HOST:PORT (port 0..65535)");
  }
  // Beyond loopback anyone on the network can ask: every request must carry
  // the job token, as "Authorization: Bearer TOKEN" or "?token=TOKEN".
  const bool open = IsLoopback(host);
  http_.set_pre_routing_handler([this, open](const httplib::Request& req, httplib::Response& res) {
    if (open) return httplib::Server::HandlerResponse::Unhandled;
    std::string presented;
    const std::string auth = req.get_header_value("Authorization");
    if (auth.rfind("Bearer ", 0) == 0) {
      presented = auth.substr(7);
    } else if (req.has_param("token")) {
      presented = req.get_param_value("token");
    }
    if (!presented.empty() && ConstantTimeEquals(presented, o_.token)) {
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
    std::lock_guard<std::mutex> lock(http_mu_);
    res.set_content(metrics_text_, "text/plain; version=0.0.4");
  });
  http_.Get("/api/status", [this](const httplib::Request&, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(http_mu_);
    res.set_content(status_json_, "application/json");
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
  if (port <= 0) return InvalidArgument("--http: cannot listen on '" + o_.http_listen + "'");
  http_thread_ = std::thread([this] { http_.listen_after_bind(); });
  return host + ":" + std::to_string(port);
}

Result<int> Controller::Run() {
  ENDURE_RETURN_IF_ERROR(Env::Default()->CreateDirs(o_.state_dir));
  Result<StateStore> store = StateStore::Open(StateStore::PathIn(o_.state_dir));
  if (!store.ok()) return store.status();
  store_.emplace(std::move(store).value());
  JobRecord job;
  job.name = o_.spec.name;
  job.spec_path = o_.spec.path;
  job.started_at_unix = start_unix_;
  ENDURE_RETURN_IF_ERROR(store_->SaveJob(job));

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(o_.listen, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  // Each stream holds a thread of the synchronous server: bounded with the
  // connections (Attach refuses beyond them), plus the server's own pollers.
  grpc::ResourceQuota quota("endure-controller");
  quota.SetMaxThreads(2 * MaxConnections(o_.spec) + 32);
  builder.SetResourceQuota(quota);
  builder.RegisterService(this);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return InvalidArgument("--listen: cannot listen on '" + o_.listen + "'");
  }
  const std::string host = o_.listen.substr(0, o_.listen.rfind(':'));
  const std::string address = host + ":" + std::to_string(port);
  if (!o_.address_file.empty()) {
    ENDURE_RETURN_IF_ERROR(WriteFileAtomically(Env::Default(), o_.address_file, address));
  }
  Result<std::string> http = StartHttp();
  if (!http.ok()) return http.status();
  ENDURE_RETURN_IF_ERROR(
      WriteFileAtomically(Env::Default(), JoinPath(o_.state_dir, "http.addr"), *http));
  // What the durable directory already holds (an earlier run in this state
  // directory): a rollback before this run's first checkpoint goes there.
  if (!checkpoints_.found_steps().empty()) {
    const std::vector<int64_t>& found = checkpoints_.found_steps();
    std::fprintf(stderr,
                 "endure controller: the durable directory holds %zu committed step(s), "
                 "the newest %lld\n",
                 found.size(), static_cast<long long>(found.back()));
    const TimePoint now = Now();
    Execute(machine_.Step(core::CheckpointsFound{found}, now), now);
  }
  WriteStatus(Now(), true);
  std::fprintf(stderr, "endure controller: job '%s' listening on %s (gRPC), http://%s/ (metrics)\n",
               o_.spec.name.c_str(), address.c_str(), http->c_str());

  while (!finish_) {
    // At least once a second: silent new streams are cancelled on time.
    TimePoint wake = Now() + std::chrono::seconds(1);
    if (std::optional<TimePoint> deadline = machine_.NextDeadline()) {
      wake = std::min(wake, *deadline);
    }
    if (stop_deadline_) wake = std::min(wake, *stop_deadline_);
    std::optional<Queued> next = queue_.PopUntil(std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(wake.time_since_epoch())));
    const bool have = next.has_value();
    Queued item = have ? std::move(*next) : Queued{};
    const TimePoint now = Now();
    CancelSilentHellos(now);
    if (item.stop_signal > 0 && !stop_deadline_) StopOnSignal(item.stop_signal, now);
    if (stop_deadline_) {
      OnCheckpointEvent(item);
      if (item.stopped) stopped_nodes_.insert(item.node);
      if (EveryAgentStopped() || now >= *stop_deadline_) FinishStop();
      continue;
    }
    if (!have) {
      item.event = core::Tick{};
      item.at = now;
    }
    if (item.log_match) {
      const int rank = item.log_match->rank();
      if (rank >= 0 && rank < o_.spec.world_size()) {
        last_log_[{machine_.generation(), rank}] = *item.log_match;
      }
      continue;
    }
    OnCheckpointEvent(item);
    if (!item.event) continue;
    if (auto* exit = std::get_if<core::WorkerExitEvent>(&*item.event)) {
      auto it = last_log_.find({exit->generation, exit->rank});
      if (it != last_log_.end()) {
        exit->log_cause = SanitizeUtf8(it->second.cause());  // bytes: a worker's output
        exit->log_action = it->second.action();
        exit->log_rule = it->second.rule();
        exit->log_line = SanitizeUtf8(it->second.line());
      }
      if (!item.fingerprint.empty() && exit->rank == 0) fingerprint_ = item.fingerprint;
    }
    if (auto* step = std::get_if<core::StepEnd>(&*item.event); step && step->rank == 0) {
      if (item.tokens > 0) tokens_per_step_ = item.tokens;
      recent_steps_.emplace_back(item.at, step->step);
      while (recent_steps_.size() > 20) recent_steps_.pop_front();
    }
    const size_t incidents_before = machine_.incidents().size();
    // The machine's time never goes backwards: an event that waited in the
    // queue behind a tick is stepped at the tick's time.
    last_step_at_ = std::max(last_step_at_, std::min(item.at, now));
    std::vector<core::JobAction> actions = machine_.Step(*item.event, last_step_at_);
    Execute(actions, now);
    const bool changed = !actions.empty() || machine_.incidents().size() != incidents_before;
    if (changed) Persist();
    WriteStatus(now, changed);
  }

  // The end: the report, then let the agents hang up.
  const TimePoint end = Now();
  Persist();
  WriteStatus(end, true);
  ReportInputs in{machine_,
                  o_.spec.name,
                  start_,
                  end,
                  finish_->exit_code,
                  finish_->reason,
                  fingerprint_,
                  machine_.step(),
                  machine_.last_loss(),
                  {}};
  in.stopped_by = stopped_by_;
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    in.nodes = node_names_;
  }
  nlohmann::json report = BuildReport(in);
  report["checkpoint"] = checkpoints_.ReportJson();
  Journal("the report", store_->SaveReport(report));
  job.finished_at_unix = WallSeconds();
  job.exit_code = finish_->exit_code;
  job.verdict = finish_->reason;
  job.param_fingerprint = fingerprint_;
  Journal("the job", store_->SaveJob(job));
  ENDURE_RETURN_IF_ERROR(WriteFileAtomically(Env::Default(), JoinPath(o_.state_dir, "report.json"),
                                             report.dump(2) + "\n"));
  // The agents were told to shut down: give them their grace period to stop
  // their workers and hang up, then end the streams of any that did not.
  AwaitAgents(Now() + o_.spec.recovery.grace_period + std::chrono::seconds(3));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(3));
  http_.stop();
  if (http_thread_.joinable()) http_thread_.join();
  return finish_->exit_code;
}

}  // namespace

Result<int> RunController(const ControllerOptions& options) {
  ControllerOptions o = options;
  if (o.token.empty()) return InvalidArgument("no job token: set ENDURE_TOKEN or --token-file");
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
    Controller controller(std::move(o), Now());
    std::atomic<bool> done{false};
    std::thread signals([&] {
      while (!done) {
        const timespec poll{0, 100 * 1000 * 1000};
        const int sig = sigtimedwait(&stop_signals, nullptr, &poll);
        if (sig > 0) controller.OnSignal(sig);
      }
    });
    code = controller.Run();
    done = true;
    signals.join();
  }
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return code;
}

}  // namespace endure::controller
