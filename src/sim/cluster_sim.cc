// The deterministic cluster simulation; see cluster_sim.h.
#include "sim/cluster_sim.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <set>
#include <utility>
#include <variant>

#include "common/duration.h"
#include "contract/worker_contract.h"
#include "core/agent_events.h"
#include "core/job_codec.h"
#include "core/job_machine.h"
#include "core/log_classifier.h"
#include "core/node_machine.h"
#include "proto/endure.pb.h"

namespace endure::sim {
namespace {

using namespace std::chrono_literals;
using core::Generation;
using core::JobAction;
using core::JobEvent;
using core::JobMachine;
using core::NodeId;
using core::Rank;
using core::StepNumber;
using core::TimePoint;

constexpr Duration kStepTime = 1s;
constexpr Duration kHeartbeatEvery = 1s;
constexpr Duration kStartup = 3s;          // a new worker's launch and restore
constexpr Duration kRejoin = 200ms;        // a survivor's rejoin in process
constexpr Duration kStopTime = 500ms;      // the agent stops its workers
constexpr Duration kCommTimeout = 5s;      // a collective with a dead peer fails
constexpr Duration kStreamGrace = 2s;      // a closed stream's NodeDown (the machine's drop grace)
constexpr Duration kResumeGrace = 20s;     // a restarted controller holds the run's nodes
constexpr Duration kReconnectAtMost = 4s;  // an agent's reconnection after its stream broke
constexpr Duration kRepair = 90s;          // an evicted or lost node returns
constexpr Duration kControllerDown = 3s;   // a controller restart's outage
constexpr Duration kDeadline = 4h;         // the job must be done by then
// What the network's delays may add to the productive time the ledger books.
constexpr Duration kLedgerSlack = 2s;
constexpr double kWallEpoch = 1.8e9;  // the simulated wall clock at the start
constexpr char kToken[] = "sim-job-token";

enum class FaultKind {
  kCrash,
  kHang,
  kNodeSilent,
  kNodeClosed,
  kControllerRestart,
  kSlowNetwork,
  kDiskError,
  kPartition,
  kStreamBreak,
};
constexpr int kFaultKinds = 9;

const char* FaultName(FaultKind k) {
  switch (k) {
    case FaultKind::kCrash:
      return "crash";
    case FaultKind::kHang:
      return "hang";
    case FaultKind::kNodeSilent:
      return "node-silent";
    case FaultKind::kNodeClosed:
      return "node-closed";
    case FaultKind::kControllerRestart:
      return "controller-restart";
    case FaultKind::kSlowNetwork:
      return "slow-network";
    case FaultKind::kDiskError:
      return "disk-error";
    case FaultKind::kPartition:
      return "partition";
    case FaultKind::kStreamBreak:
      return "stream-break";
  }
  return "?";
}

// A fault fires as the job reaches `step` (on the node running `rank`), or,
// when `at` is set, at that time whatever the job is doing (starting,
// stopping, recovering) on node `node`, a spare or an idle one included.
struct PlannedFault {
  FaultKind kind;
  int64_t step = 0;
  int rank = 0;
  std::optional<Duration> at;
  int node = 0;
  int local = 0;
  bool fired = false;
};

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ULL;
  return h ^ (h >> 29);
}

// A rank's parameters after training `step` steps of a run without faults.
uint64_t Reference(int64_t step) {
  uint64_t h = 1;
  for (int64_t s = 1; s <= step; ++s) h = Mix(h, static_cast<uint64_t>(s));
  return h;
}

struct Process {
  bool alive = false;
  bool hung = false;
  int64_t step = 0;  // steps trained
  uint64_t params = 1;
};

struct SimNode {
  std::string name;
  bool up = false;           // running, its agent started
  bool faulty = false;       // had a fault of its own since it joined
  uint64_t incarnation = 0;  // its agent: a lost node's comes back as a new one
  // The agent's decision core (none while the node is down), as the agent
  // runs it: worker datagrams and exits in, the stream's events out.
  std::optional<core::NodeMachine> agent;
  // Its stream to the controller: what was in flight on an older one is
  // lost. `connected`: one is open.
  uint64_t stream = 0;
  bool connected = false;
  bool registered = false;  // its agent had a stream: it resumes on the next
  int generation = -1;      // the generation its processes run
  std::vector<int> ranks;   // their ranks in it, by local rank
  std::vector<Process> procs;
  TimePoint last_delivery;  // the stream is FIFO, both ways
  TimePoint last_command;
  TimePoint slow_until;  // a slow-network fault delays its messages
  // A partition between the node and the controller: what the node sends
  // meanwhile is held (its agent's outage buffer) and arrives when it heals.
  TimePoint partitioned_until;
  // The controller's side: its stream dropped at `dropped_at` and the node
  // is held for `grace` (the stream grace; after a controller's restart,
  // kResumeGrace) for its agent to come back resuming.
  std::optional<TimePoint> dropped_at;
  Duration grace{0};
};

class Cluster {
 public:
  Cluster(uint64_t seed, const ClusterSimOptions& o) : o_(o), rng_(seed), m_(Start()) {
    result_.seed = seed;
    const int all = o_.nodes + o_.spares;
    nodes_.resize(all);
    for (int n = 0; n < all; ++n) {
      nodes_[n].name = "node" + std::to_string(n);
      nodes_[n].procs.resize(o_.ranks_per_node);
    }
    // The faults, drawn up front so that the network's draws do not move
    // them.
    const int count = static_cast<int>(Draw(o_.max_faults + 1));
    const int world = o_.nodes * o_.ranks_per_node;
    const uint64_t span_ms = static_cast<uint64_t>(o_.total_steps) * 1500;
    for (int i = 0; i < count; ++i) {
      PlannedFault f;
      f.kind = static_cast<FaultKind>(Draw(kFaultKinds));
      f.step = 1 + static_cast<int64_t>(Draw(static_cast<uint64_t>(o_.total_steps - 1)));
      f.rank = static_cast<int>(Draw(static_cast<uint64_t>(world)));
      if (Draw(2) == 1) {
        f.at = std::chrono::milliseconds(Draw(span_ms));
        f.node = static_cast<int>(Draw(static_cast<uint64_t>(all)));
        f.local = static_cast<int>(Draw(static_cast<uint64_t>(o_.ranks_per_node)));
      }
      faults_.push_back(f);
    }
  }

  ClusterSimResult Run() {
    core::JobMachineOptions options;
    options.nodes = o_.nodes;
    options.ranks_per_node = o_.ranks_per_node;
    options.in_process = o_.in_process;
    options.recovery.backoff_initial = Duration(0);
    options.recovery.paths["node_lost"] = core::RecoveryPath::kEvictAndReplace;
    options.isolation.pairwise_test = false;
    options.replacement_timeout = Duration(0);
    options.checkpoint.keep = o_.keep;
    Input(core::Configure{options, {}});
    Carry(core::ListDurableAction{});  // as the shell does at the start
    for (size_t n = 0; n < nodes_.size(); ++n) Join(NodeId{static_cast<int>(n)});
    for (PlannedFault& f : faults_) {
      if (f.at) At(Start() + *f.at, [this, &f] { Fire(f); });
    }
    while (!queue_.empty() && result_.violation.empty() && !result_.finished) {
      Timed next = queue_.top();
      queue_.pop();
      if (next.at > Start() + kDeadline) {
        Violate("the job did not finish within " + FormatDuration(kDeadline) + " (phase " +
                std::to_string(static_cast<int>(m_.phase())) + ", step " +
                std::to_string(m_.step().value) + ")");
        break;
      }
      now_ = next.at;
      next.fn();
    }
    if (result_.violation.empty() && !result_.finished) Violate("nothing left to happen");
    if (result_.violation.empty()) CheckOutcome();
    if (result_.violation.empty()) CheckReplay("at the end");
    result_.generations = m_.generations_started();
    result_.ettr = m_.ledger().Ettr();
    return std::move(result_);
  }

 private:
  struct Timed {
    TimePoint at;
    uint64_t seq;
    std::function<void()> fn;
    bool operator<(const Timed& o) const {  // a min-heap on (at, seq)
      return at != o.at ? at > o.at : seq > o.seq;
    }
  };

  static TimePoint Start() { return TimePoint{} + std::chrono::hours(1); }

  // Uniform in [0, n): the low bits of a 64-bit draw (mt19937_64's output
  // is the same everywhere; the standard distributions are not).
  uint64_t Draw(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  void At(TimePoint t, std::function<void()> fn) { queue_.push({t, seq_++, std::move(fn)}); }

  void Trace(const std::string& line) {
    char t[32];
    std::snprintf(t, sizeof t, "%.3f ", Seconds(now_ - Start()));
    result_.trace.push_back(t + line);
    result_.fingerprint = Mix(result_.fingerprint, std::hash<std::string>{}(result_.trace.back()));
  }

  void Violate(const std::string& what) {
    if (!result_.violation.empty()) return;
    result_.violation = what;
    Trace("VIOLATION " + what);
  }

  // ---- The controller: its machine, its journal, its inputs ----

  void Input(const JobEvent& e) {
    ENDURE_CHECK(!controller_down_);  // the streams broke with it: nothing arrives
    ++result_.inputs;
    const std::string line = core::EncodeEvent(e);
    journal_.push_back({now_, line});
    Trace("< " + line);
    const std::vector<JobAction> actions = m_.Step(e, now_);
    // As the controller does: now and then a snapshot, the journal cut
    // behind it (here at a fixed count of inputs, so that restarts land at
    // every distance from one).
    if (journal_.size() >= kSnapshotEvery) {
      snapshot_ = m_.Snapshot();
      journal_.clear();
    }
    for (const JobAction& a : actions) Trace("> " + core::EncodeAction(a));
    for (const JobAction& a : actions) Carry(a);
    CheckInvariants();
    ScheduleTick();
  }

  void ScheduleTick() {
    const std::optional<TimePoint> due = m_.NextDeadline();
    if (!due || (tick_at_ && *tick_at_ <= *due && *tick_at_ > now_)) return;
    tick_at_ = std::max(*due, now_);
    At(*tick_at_, [this, t = *tick_at_] {
      if (tick_at_ != t) return;
      tick_at_.reset();
      const std::optional<TimePoint> due = m_.NextDeadline();
      if (due && *due <= now_ && !controller_down_) {
        Input(core::Tick{});
      } else {
        ScheduleTick();
      }
    });
  }

  // The controller dies and comes back from its journal: every agent's
  // stream breaks with it (what was in flight is lost; what happens
  // meanwhile waits in the agents' outage buffers), and the new controller
  // holds the run's nodes for kResumeGrace while the agents reconnect and
  // resume.
  void RestartController() {
    ++result_.controller_restarts;
    Trace("controller restarts");
    controller_down_ = true;
    tick_at_.reset();
    heard_late_ += kControllerDown + kReconnectAtMost;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      SimNode& n = nodes_[i];
      n.dropped_at.reset();
      if (n.connected) BreakStream(NodeId{static_cast<int>(i)});
    }
    At(now_ + kControllerDown, [this] {
      CheckReplay("after a controller restart");
      if (!result_.violation.empty()) return;
      m_ = Replayed();
      controller_down_ = false;
      Input(core::ControllerResumed{});
      Carry(core::ListDurableAction{});
      for (NodeId id : m_.NodesUp()) Hold(id, kResumeGrace);
      for (size_t i = 0; i < nodes_.size(); ++i) {
        const NodeId id{static_cast<int>(i)};
        At(now_ + std::chrono::milliseconds(100 + Draw(2000)), [this, id] { Connect(id); });
        static_assert(kReconnectAtMost >= std::chrono::milliseconds(2100));
      }
    });
  }

  // The controller holds `id`, whose stream dropped, for `grace`: no resume
  // by then is a lost node.
  void Hold(NodeId id, Duration grace) {
    SimNode& n = nodes_[id.value];
    n.dropped_at = now_;
    n.grace = grace;
    At(now_ + grace, [this, id, since = now_] {
      SimNode& n = nodes_[id.value];
      if (controller_down_ || n.dropped_at != since) return;
      n.dropped_at.reset();
      Input(core::NodeDown{id, "stream closed", since});
    });
  }

  // A registration arrived on `id`'s new stream: a fresh agent's is a node
  // up; a resuming one is judged as the controller's shell judges it
  // (ControllerShell::OnResume): taken back when it was held and resumes
  // the generation the job still runs, else its stale workers are stopped
  // and it joins as a fresh node.
  void OnHello(NodeId id, const proto::Register& hello) {
    SimNode& n = nodes_[id.value];
    bool held = false;
    if (n.dropped_at) {
      held = now_ - *n.dropped_at < n.grace;
      if (!held) Input(core::NodeDown{id, "stream closed", *n.dropped_at});
      n.dropped_at.reset();
    }
    if (!hello.resuming()) {
      if (held) Input(core::NodeDown{id, "the agent registered again without resuming"});
      Input(core::NodeUp{id, n.name, hello.slots(), ""});
      return;
    }
    const int64_t generation = hello.generation();
    const core::JobPhase phase = m_.phase();
    const bool same = generation >= 0 && generation == m_.generation().value &&
                      (phase == core::JobPhase::kRunning || phase == core::JobPhase::kStopping ||
                       phase == core::JobPhase::kWaiting);
    if (held && same) {
      Trace(n.name + " resumes generation " + std::to_string(generation) + ": taken back");
      if (phase != core::JobPhase::kRunning) Command(id, StopCommand(generation));
      return;
    }
    if (held && MissedItsStart(id, generation)) {
      Trace(n.name + " resumes generation " + std::to_string(generation) +
            ": taken back; it missed the start of generation " +
            std::to_string(m_.generation().value));
      if (generation >= 0) Command(id, StopCommand(generation));
      Command(id, starts_.at(id.value));
      return;
    }
    if (generation >= 0) Command(id, StopCommand(generation));
    if (held) {
      Input(core::NodeDown{id, "the agent " + n.name + " came back resuming generation " +
                                   std::to_string(generation) + ", which the job has left"});
    }
    Input(core::NodeUp{id, n.name, hello.slots(), ""});
  }

  // Whether `id`, resuming `generation`, is a member of the newer
  // generation the job runs whose start went out while its stream was
  // down (core::MissedItsStart).
  bool MissedItsStart(NodeId id, int64_t generation) const {
    const std::vector<NodeId>& members = m_.members();
    return core::MissedItsStart(generation, m_.generation().value, m_.phase(),
                                std::find(members.begin(), members.end(), id) != members.end()) &&
           starts_.count(id.value) > 0;
  }

  // An agent's event arrived, read as the controller's shell reads it.
  void Receive(NodeId id, const proto::AgentEvent& e) {
    if (e.has_register_()) {
      OnHello(id, e.register_());
      return;
    }
    core::AgentEventContext context;
    context.node_named = [this](const std::string& name) -> std::optional<NodeId> {
      for (size_t i = 0; i < nodes_.size(); ++i) {
        if (nodes_[i].name == name) return NodeId{static_cast<int>(i)};
      }
      return std::nullopt;
    };
    context.fault_ids = &fault_ids_;
    context.now = now_;
    context.wall_now_s = Wall();
    const core::AgentEventRead read = core::ReadAgentEvent(e, id, context);
    if (read.event) Input(*read.event);
  }

  static proto::AgentCommand StopCommand(int64_t generation) {
    proto::AgentCommand stop;
    stop.set_token(kToken);
    stop.set_generation(generation);
    stop.mutable_stop()->set_grace_s(Seconds(kStopTime));
    return stop;
  }

  // What a restarted controller holds: the newest snapshot, and the journal
  // after it replayed.
  JobMachine Replayed() const {
    JobMachine fresh(Start());
    if (snapshot_) {
      Result<JobMachine> restored = JobMachine::FromSnapshot(*snapshot_, Start());
      ENDURE_CHECK(restored.ok());
      fresh = std::move(*restored);
    }
    for (const auto& [at, line] : journal_) {
      Result<JobEvent> e = core::DecodeEvent(line);
      ENDURE_CHECK(e.ok());
      fresh.Step(*e, at);
    }
    return fresh;
  }

  static std::string State(const JobMachine& m) {
    std::string s = "phase " + std::to_string(static_cast<int>(m.phase())) + " generation " +
                    std::to_string(m.generation().value) + " step " +
                    std::to_string(m.step().value) + " checkpoints";
    for (StepNumber c : m.checkpoints().Restorable()) s += " " + std::to_string(c.value);
    const core::CheckpointTotals t = m.checkpoints().totals();
    s += " commits " + std::to_string(t.durable_commits) + " durable " +
         std::to_string(t.newest_durable.value);
    s += " members";
    for (NodeId n : m.members()) s += " " + std::to_string(n.value);
    s += " up";
    for (NodeId n : m.NodesUp()) s += " " + std::to_string(n.value);
    for (int c = 0; c <= static_cast<int>(core::LedgerCategory::kOther); ++c) {
      s += " " + std::to_string(m.ledger().total(static_cast<core::LedgerCategory>(c)).count());
    }
    for (const core::Incident& i : m.incidents()) s += "\n" + core::EncodeIncident(i, Start());
    return s;
  }

  void CheckReplay(const std::string& when) {
    const std::string live = State(m_), replayed = State(Replayed());
    if (live != replayed) {
      Violate("the journal replays to another state " + when + ":\n  live:     " + live +
              "\n  replayed: " + replayed);
    }
  }

  // ---- Invariants ----

  void CheckInvariants() {
    const core::EttrLedger& ledger = m_.ledger();
    Duration sum{0};
    for (int c = 0; c <= static_cast<int>(core::LedgerCategory::kOther); ++c) {
      sum += ledger.total(static_cast<core::LedgerCategory>(c));
    }
    if (sum != ledger.wall() || ledger.wall() > now_ - Start()) {
      Violate("the ledger sums to " + FormatDuration(sum) + " of a wall time of " +
              FormatDuration(ledger.wall()) + " at " + FormatDuration(now_ - Start()));
    }
    // What the book holds as the newest durable step of the timeline is on
    // the disk (a restore may need it).
    const StepNumber newest = m_.checkpoints().totals().newest_durable;
    if (newest.value > 0 && !durable_.count(newest.value)) {
      Violate("the newest committed checkpoint (step " + std::to_string(newest.value) +
              ") was deleted");
    }
  }

  void CheckOutcome() {
    if (exit_code_ != 0) {
      Violate("the job ended with exit code " + std::to_string(exit_code_) + ": " + finish_reason_);
      return;
    }
    // Every step that counts was trained once in a surviving timeline, in
    // kStepTime: the ledger may book no more than that as productive (the
    // network's delays aside, and the partitions': what the controller
    // hears late it books late). A recovery's first step is booked as
    // recovery, and a controller outage as what it interrupted, so less is
    // no violation.
    const Duration productive = m_.ledger().total(core::LedgerCategory::kProductive);
    const Duration trained = kStepTime * o_.total_steps;
    if (productive > trained + kLedgerSlack + heard_late_) {
      Violate("the ledger books " + FormatDuration(productive) + " as productive for " +
              std::to_string(o_.total_steps) + " steps of " + FormatDuration(kStepTime) +
              ": some steps were counted twice");
      return;
    }
    const uint64_t expected = Reference(o_.total_steps);
    for (NodeId n : m_.members()) {
      const SimNode& node = nodes_[n.value];
      for (size_t l = 0; l < node.procs.size(); ++l) {
        const Process& p = node.procs[l];
        if (p.step != o_.total_steps || p.params != expected) {
          Violate(node.name + " process " + std::to_string(l) + " ended at step " +
                  std::to_string(p.step) + " with parameters other than a run without faults");
          return;
        }
      }
    }
  }

  // ---- The network ----

  // What a message of `n`'s stream waits: the network's delay (more under a
  // slow-network fault), behind the stream's earlier messages and any
  // partition.
  TimePoint Arrival(SimNode& n, TimePoint* last) {
    Duration delay = std::chrono::microseconds(100 + Draw(2000));
    if (now_ < n.slow_until) delay += std::chrono::milliseconds(Draw(1500));
    const TimePoint at = std::max({now_ + delay, *last + 1ns, n.partitioned_until + delay});
    *last = at;
    return at;
  }

  // Sends `e` up `node`'s stream to the controller: lost when the stream
  // breaks before it arrives.
  void Up(NodeId node, proto::AgentEvent e) {
    SimNode& n = nodes_[node.value];
    const TimePoint at = Arrival(n, &n.last_delivery);
    At(at, [this, node, e = std::move(e), stream = n.stream] {
      if (nodes_[node.value].stream != stream) {
        ++result_.messages_lost;
        return;
      }
      Receive(node, e);
    });
  }

  // Sends `cmd` down `node`'s stream to its agent: lost likewise.
  void Command(NodeId node, proto::AgentCommand cmd) {
    SimNode& n = nodes_[node.value];
    if (!n.connected) return;  // no stream: the controller sends nothing
    const TimePoint at = Arrival(n, &n.last_command);
    At(at, [this, node, cmd = std::move(cmd), stream = n.stream] {
      if (nodes_[node.value].stream != stream) {
        ++result_.messages_lost;
        return;
      }
      if (Agent(node, core::CommandArrived{&cmd})) CarryOut(node, cmd);
    });
  }

  // ---- The agents ----

  double Wall() const { return kWallEpoch + Seconds(now_ - Start()); }

  // Steps `id`'s agent core with `in` and carries out what it says; true
  // when it says to carry out the command that arrived.
  bool Agent(NodeId id, const core::NodeInput& in) {
    SimNode& n = nodes_[id.value];
    if (!n.agent) return false;
    bool carry_out = false;
    for (core::NodeAction& a : n.agent->Step(in, core::NodeTime{now_, Wall()})) {
      if (auto* t = std::get_if<core::Transmit>(&a)) {
        Up(id, std::move(t->event));
      } else if (const auto* l = std::get_if<core::LogLine>(&a)) {
        Trace(n.name + ": " + l->text);
      } else if (std::holds_alternative<core::CarryOut>(a)) {
        carry_out = true;
      }
    }
    return carry_out;
  }

  // What the agent of `id` reports of its own (`generation` < 0: its
  // current one).
  void Report(NodeId id, proto::AgentEvent e, int64_t generation = -1) {
    Agent(id, core::Report{std::move(e), generation});
  }

  // A worker's datagram to its agent, with the generation's credential.
  void Datagram(NodeId id, int g, int64_t rank, contract::DatagramMessage message) {
    contract::Datagram d;
    d.token = Credential(id, g);
    d.generation = g;
    d.rank = static_cast<int>(rank);
    d.message = std::move(message);
    Agent(id, core::DatagramArrived{contract::EncodeDatagram(d), 0});
  }

  std::string Credential(NodeId id, int g) const {
    return "credential-" + std::to_string(g) + "-" + nodes_[id.value].name;
  }

  core::NodeMachine NewAgent() const {
    Result<core::LogClassifier> rules = core::LogClassifier::Create({}, "none");
    ENDURE_CHECK(rules.ok());
    core::NodeMachineOptions options;
    options.token = kToken;
    return core::NodeMachine(options, std::move(rules).value(), contract::DatagramContext{});
  }

  proto::AgentEvent Hello(const SimNode& n, bool resuming) const {
    proto::AgentEvent hello;
    hello.set_token(kToken);
    proto::Register* r = hello.mutable_register_();
    r->set_node_id(n.name);
    r->set_slots(o_.ranks_per_node);
    if (resuming) {
      bool alive = n.generation >= 0;
      for (const Process& p : n.procs) alive = alive && p.alive;
      r->set_resuming(true);
      r->set_generation(n.agent->generation());
      r->set_workers_alive(alive);
    }
    hello.set_generation(r->generation());
    return hello;
  }

  // The agent's stream breaks: what is in flight either way is lost, and
  // the controller (when it runs) holds the node for the stream grace.
  void BreakStream(NodeId id) {
    SimNode& n = nodes_[id.value];
    ++n.stream;
    n.connected = false;
    Agent(id, core::StreamLost{});
    if (!controller_down_) Hold(id, kStreamGrace);
  }

  // The agent opens a new stream (none while the controller is down: the
  // restarted one's reconnect pass opens it): a fresh agent registers, one
  // that had a stream resumes on it (the registration, what its outage
  // buffer kept, its ranks' last words).
  void Connect(NodeId id) {
    SimNode& n = nodes_[id.value];
    if (!n.up || n.connected || controller_down_ || result_.finished) return;
    ++n.stream;
    n.connected = true;
    const bool resuming = n.registered;
    n.registered = true;
    Agent(id, core::StreamOpened{Hello(n, resuming), resuming});
  }

  // ---- The nodes ----

  void Join(NodeId id) {
    SimNode& n = nodes_[id.value];
    n.up = true;
    n.faulty = false;
    ++n.incarnation;
    n.connected = false;
    n.registered = false;
    n.generation = -1;
    for (Process& p : n.procs) p = Process{};
    n.agent.emplace(NewAgent());
    Connect(id);
    Heartbeat(id, n.incarnation);
  }

  void Heartbeat(NodeId id, uint64_t incarnation) {
    SimNode& n = nodes_[id.value];
    if (!n.up || n.incarnation != incarnation || result_.finished) return;
    proto::AgentEvent beat;
    beat.mutable_heartbeat();
    Report(id, std::move(beat));
    At(now_ + kHeartbeatEvery, [this, id, incarnation] { Heartbeat(id, incarnation); });
  }

  // The node goes away: its agent and processes with it. `closed`: its
  // stream closes and the controller hears of it; otherwise it falls silent.
  void Lose(NodeId id, bool closed, bool repair) {
    SimNode& n = nodes_[id.value];
    if (!n.up) return;
    n.up = false;
    ++n.incarnation;
    ++n.stream;
    n.connected = false;
    n.agent.reset();
    for (Process& p : n.procs) p.alive = false;
    if (closed && !controller_down_) Hold(id, kStreamGrace);
    if (repair) At(now_ + kRepair, [this, id] { Join(id); });
  }

  SimNode* NodeRunning(int rank) {
    const std::vector<NodeId>& members = gen_nodes_;
    const size_t i = static_cast<size_t>(rank / o_.ranks_per_node);
    return i < members.size() ? &nodes_[members[i].value] : nullptr;
  }

  // ---- The machine's actions ----

  void Carry(const JobAction& a) {
    if (std::holds_alternative<core::ListDurableAction>(a)) {
      core::DurableListed listed;
      for (const auto& [step, d] : durable_)
        listed.committed.push_back({StepNumber{step}, d.shards});
      Input(listed);
    } else if (const auto* w = std::get_if<core::WriteManifestAction>(&a)) {
      durable_[w->step.value] =
          Durable{saved_.at(w->step.value), static_cast<int>(w->shards.size())};
      Input(core::ManifestWritten{w->step, ""});
    } else if (const auto* r = std::get_if<core::RemoveStepAction>(&a)) {
      auto it = durable_.find(r->step.value);
      if (o_.bug == PlantedBug::kRetentionDropsNewest &&
          r->reason == core::RemoveReason::kRetention && !durable_.empty()) {
        it = std::prev(durable_.end());
      }
      if (it != durable_.end()) durable_.erase(it);
      Input(core::StepRemoved{r->step, ""});
    } else if (const auto* s = std::get_if<core::StartGenerationAction>(&a)) {
      StartGeneration(*s);
    } else if (const auto* s = std::get_if<core::StopGenerationAction>(&a)) {
      StopGeneration(s->generation);
    } else if (const auto* e = std::get_if<core::EvictNodeAction>(&a)) {
      const SimNode& n = nodes_[e->node.value];
      if (n.up && !n.faulty) {
        Violate("healthy " + n.name + " evicted: " + e->reason);
        return;
      }
      Lose(e->node, /*closed=*/false, /*repair=*/n.up);
    } else if (const auto* p = std::get_if<core::RunPairTestAction>(&a)) {
      for (const auto& [x, y] : p->pairs) {
        proto::AgentEvent done;
        proto::PairTestDone* t = done.mutable_pair_test();
        t->set_test(p->test);
        t->set_round(p->round);
        t->set_peer_node(nodes_[y.value].name);
        t->set_ok(true);
        t->set_seconds(0.01);
        Report(x, std::move(done));
      }
    } else if (const auto* f = std::get_if<core::FinishAction>(&a)) {
      result_.finished = true;
      exit_code_ = f->exit_code;
      result_.exit_code = f->exit_code;
      finish_reason_ = f->reason;
    }
  }

  // The machine starts a generation: the shell's half (the restore point,
  // the peer state an in-process restart hands to fresh ranks) here, each
  // node's half when its start command arrives and its agent carries it out.
  void StartGeneration(const core::StartGenerationAction& s) {
    generation_ = s.generation.value;
    gen_nodes_ = s.nodes;
    ready_left_ = static_cast<int>(s.nodes.size()) * o_.ranks_per_node;
    rejoin_ = s.rejoin;
    skip_ = std::set<int64_t>();
    for (StepNumber k : s.skip_steps) skip_.insert(k.value);
    starts_.clear();
    // A peer's state, for the ranks that start in process.
    peer_.reset();
    if (s.rejoin) {
      for (NodeId id : s.nodes) {
        for (const Process& p : nodes_[id.value].procs) {
          if (p.alive && !p.hung && nodes_[id.value].generation >= 0) peer_ = p;
        }
      }
    }
    // The restore point, as the shell chooses it: the book's plan, its
    // durable copies checked against the disk (the book chooses again
    // without one that is missing).
    restore_ = 0;
    if (!s.rejoin) {
      checkpoint::RestorePlan plan;
      for (bool refused = true; refused;) {
        plan = m_.PlanRestore(s);
        refused = false;
        for (const checkpoint::RestoreSource& src : plan.sources) {
          if (durable_.count(src.copy.step)) continue;
          refused = true;
          Input(core::ShardRefused{StepNumber{src.copy.step}, src.copy.shard, "missing"});
        }
      }
      restore_ = plan.step;
      Input(core::RestoreChosen{s.generation, plan.Summary(), StepNumber{plan.step}, 0, 0,
                                static_cast<int>(plan.sources.size())});
    }
    for (size_t i = 0; i < s.nodes.size(); ++i) {
      proto::AgentCommand cmd;
      cmd.set_token(kToken);
      cmd.set_generation(generation_);
      proto::StartGeneration* start = cmd.mutable_start();
      start->set_world_size(static_cast<int>(s.nodes.size()) * o_.ranks_per_node);
      start->set_restore_step(restore_);
      start->set_rejoin(s.rejoin);
      for (int l = 0; l < o_.ranks_per_node; ++l) {
        proto::RankAssignment* r = start->add_ranks();
        r->set_rank(static_cast<int>(i) * o_.ranks_per_node + l);
        r->set_local_rank(l);
      }
      starts_[s.nodes[i].value] = cmd;
      Command(s.nodes[i], std::move(cmd));
    }
  }

  // A command `id`'s agent carries out.
  void CarryOut(NodeId id, const proto::AgentCommand& cmd) {
    if (cmd.has_start()) {
      StartOnNode(id, cmd);
    } else if (cmd.has_stop()) {
      StopOnNode(id, static_cast<int>(cmd.generation()));
    }
  }

  void StartOnNode(NodeId id, const proto::AgentCommand& cmd) {
    SimNode& n = nodes_[id.value];
    const int g = static_cast<int>(cmd.generation());
    // A start the job has left behind (its generation stopped while the
    // command travelled) starts nothing.
    if (g != generation_) return;
    core::GenerationStarted started;
    started.generation = g;
    started.credential = Credential(id, g);
    for (const proto::RankAssignment& r : cmd.start().ranks()) started.ranks.insert(r.rank());
    started.rejoin = cmd.start().rejoin();
    started.world_size = cmd.start().world_size();
    Agent(id, started);
    const bool kept_node = n.generation >= 0;
    n.generation = g;
    n.ranks.assign(o_.ranks_per_node, 0);
    for (const proto::RankAssignment& r : cmd.start().ranks())
      n.ranks.at(r.local_rank()) = r.rank();
    for (const proto::RankAssignment& r : cmd.start().ranks()) {
      const int l = r.local_rank();
      Process& p = n.procs[l];
      const bool kept = rejoin_ && kept_node && p.alive && !p.hung;
      if (!kept) {
        p = Process{};
        p.alive = true;
        if (rejoin_ && peer_) {
          p.step = peer_->step;
          p.params = peer_->params;
        } else {
          Restore(p, restore_);
        }
      }
      const Duration delay = kept ? kRejoin : kStartup;
      At(now_ + delay, [this, id, l, rank = r.rank(), g] {
        SimNode& node = nodes_[id.value];
        if (node.generation != g || !node.procs[l].alive) return;
        contract::ReadyMessage ready;
        ready.start_step = node.procs[l].step;
        ready.restore_s = 0.1;
        ready.rejoin = true;
        Datagram(id, g, rank, ready);
        if (g == generation_ && --ready_left_ == 0)
          At(now_ + kStepTime, [this, g] { TrainStep(g); });
      });
    }
  }

  void Restore(Process& p, int64_t from) {
    p.step = from;
    p.params = from > 0 ? durable_.at(from).params : 1;
    if (o_.bug == PlantedBug::kRestoreSkipsAStep && from > 0) ++p.step;
  }

  void StopGeneration(Generation g) {
    if (g.value != generation_) return;
    generation_ = -1;  // training stops
    for (NodeId id : m_.members()) Command(id, StopCommand(g.value));
  }

  // The agent of `id` stops its workers of generation `g` (or older) and
  // says so; one for a generation it never ran is answered all the same.
  void StopOnNode(NodeId id, int g) {
    At(now_ + kStopTime, [this, id, g, inc = nodes_[id.value].incarnation] {
      SimNode& n = nodes_[id.value];
      if (!n.up || n.incarnation != inc) return;
      if (n.generation >= 0 && n.generation <= g) {
        for (size_t l = 0; l < n.procs.size(); ++l) {
          Process& p = n.procs[l];
          if (!p.alive) continue;
          p.alive = false;
          Exit(id, n.generation, l, std::nullopt, 15, /*stopped=*/true);
        }
        n.generation = -1;
      }
      proto::AgentEvent stopped;
      stopped.mutable_stopped();
      Report(id, std::move(stopped), g);
    });
  }

  // A worker (local rank `local`) of generation `g` on `node` ended: by
  // `exit_code`, by `signal`, or stopped by its agent.
  void Exit(NodeId node, int g, size_t local, std::optional<int> exit_code,
            std::optional<int> signal, bool stopped = false) {
    core::WorkerExited e;
    e.generation = g;
    e.rank = static_cast<int>(RankOf(node, local));
    e.exited = exit_code.has_value();
    e.exit_code = exit_code.value_or(0);
    e.signal = signal.value_or(0);
    e.stopped = stopped;
    Agent(node, e);
  }

  // The rank the worker `local` of `id` runs in the node's generation.
  int64_t RankOf(NodeId id, size_t local) const {
    const std::vector<int>& ranks = nodes_[id.value].ranks;
    return local < ranks.size() ? ranks[local] : 0;
  }

  // One lockstep step of generation `g`: every rank trains it, or, with a
  // dead or hung peer, the collective blocks (and fails after
  // kCommTimeout where a peer died).
  void TrainStep(int g) {
    if (g != generation_ || result_.finished) return;
    const int64_t step = JobStep() + 1;
    if (step > o_.total_steps) {
      // Restarted with nothing left to train (the last step was done when
      // a node was lost): the workers end at once.
      for (size_t i = 0; i < gen_nodes_.size(); ++i) {
        for (int l = 0; l < o_.ranks_per_node; ++l) {
          Exit(gen_nodes_[i], g, static_cast<size_t>(l), 0, std::nullopt);
        }
      }
      return;
    }
    for (PlannedFault& f : faults_) {
      if (!f.fired && !f.at && f.step <= step) Fire(f);
    }
    if (g != generation_) return;
    bool dead = false, hung = false;
    for (NodeId id : gen_nodes_) {
      for (const Process& p : nodes_[id.value].procs) {
        dead = dead || !p.alive;
        hung = hung || p.hung;
      }
    }
    if (dead) {
      At(now_ + kCommTimeout, [this, g] { FailCollective(g); });
      return;
    }
    if (hung) return;  // blocked until the machine stops the generation
    const bool skipped = skip_.count(step) > 0;
    // Durable storage failing: the step's checkpoint is not committed, and
    // the agent of rank 0 says so.
    const bool disk_fails = step % o_.ckpt_every == 0 && now_ < disk_failing_until_;
    const bool ckpt = step % o_.ckpt_every == 0 && !disk_fails;
    if (disk_fails) {
      proto::AgentEvent failed;
      failed.mutable_persisted()->set_step(step);
      failed.mutable_persisted()->set_error("No space left on device");
      Report(gen_nodes_[0], std::move(failed), g);
    }
    for (size_t i = 0; i < gen_nodes_.size(); ++i) {
      SimNode& n = nodes_[gen_nodes_[i].value];
      for (int l = 0; l < o_.ranks_per_node; ++l) {
        Process& p = n.procs[l];
        p.step = step;
        if (!skipped) p.params = Mix(p.params, static_cast<uint64_t>(step));
        contract::StepMessage m;
        m.step = step;
        m.loss = 3.0 - 0.001 * static_cast<double>(step);
        m.skipped = skipped;
        m.checkpoint_step = ckpt ? step : -1;
        m.compute_s = 0.9;
        m.total_steps = o_.total_steps;
        Datagram(gen_nodes_[i], g, static_cast<int64_t>(i) * o_.ranks_per_node + l, m);
      }
    }
    if (ckpt) {
      // Each node persists its ranks' shards (T2), behind training.
      saved_[step] = nodes_[gen_nodes_[0].value].procs[0].params;
      const int world = static_cast<int>(gen_nodes_.size()) * o_.ranks_per_node;
      for (size_t i = 0; i < gen_nodes_.size(); ++i) {
        for (int l = 0; l < o_.ranks_per_node; ++l) {
          const int shard = static_cast<int>(i) * o_.ranks_per_node + l;
          proto::AgentEvent persisted;
          proto::ShardPersisted* p = persisted.mutable_persisted();
          p->set_step(step);
          p->set_shard(shard);
          p->set_shards(world);
          p->set_bytes(64);
          char xxh3[17];
          std::snprintf(xxh3, sizeof xxh3, "%016llx", static_cast<unsigned long long>(step));
          p->set_xxh3(xxh3);
          Report(gen_nodes_[i], std::move(persisted), g);
        }
      }
    }
    if (step == o_.total_steps) {
      for (size_t i = 0; i < gen_nodes_.size(); ++i) {
        for (int l = 0; l < o_.ranks_per_node; ++l) {
          Exit(gen_nodes_[i], g, static_cast<size_t>(l), 0, std::nullopt);
        }
      }
      return;
    }
    At(now_ + kStepTime, [this, g] { TrainStep(g); });
  }

  int64_t JobStep() const {
    int64_t step = 0;
    for (NodeId id : gen_nodes_) {
      for (const Process& p : nodes_[id.value].procs) {
        if (p.alive) step = std::max(step, p.step);
      }
    }
    return step;
  }

  void FailCollective(int g) {
    if (g != generation_) return;
    for (NodeId id : gen_nodes_) {
      SimNode& n = nodes_[id.value];
      if (!n.up) continue;
      for (size_t l = 0; l < n.procs.size(); ++l) {
        Process& p = n.procs[l];
        if (!p.alive || p.hung) continue;
        p.alive = false;
        Exit(id, g, l, 1, std::nullopt);
      }
    }
  }

  void Fire(PlannedFault& f) {
    if (f.fired || result_.finished) return;
    f.fired = true;
    ++result_.faults;
    SimNode* node = f.at ? &nodes_[f.node] : NodeRunning(f.rank);
    if (node == nullptr || !node->up) return;
    const NodeId id{static_cast<int>(node - nodes_.data())};
    const size_t local = static_cast<size_t>(f.at ? f.local : f.rank % o_.ranks_per_node);
    Trace(std::string("fault ") + FaultName(f.kind) + " on " + node->name + " process " +
          std::to_string(local));
    switch (f.kind) {
      case FaultKind::kCrash: {
        Process& p = node->procs[local];
        if (!p.alive || node->generation < 0) return;
        p.alive = false;
        node->faulty = true;
        Exit(id, node->generation, local, std::nullopt, 9);
        return;
      }
      case FaultKind::kHang:
        if (!node->procs[local].alive) return;
        node->procs[local].hung = true;
        node->faulty = true;
        return;
      case FaultKind::kNodeSilent:
      case FaultKind::kNodeClosed:
        node->faulty = true;
        Lose(id, f.kind == FaultKind::kNodeClosed, /*repair=*/true);
        return;
      case FaultKind::kControllerRestart:
        if (!controller_down_) RestartController();
        return;
      case FaultKind::kSlowNetwork:
        node->slow_until = now_ + 10s;
        return;
      case FaultKind::kDiskError:
        disk_failing_until_ = now_ + 25s;
        return;
      case FaultKind::kPartition: {
        // 2 to 20 s: within the heartbeat timeout (10 s) the node's backlog
        // arrives and nothing happened; beyond it, the node was lost, its
        // late messages are of a generation gone, and its agent, fenced,
        // comes back as a fresh node.
        node->faulty = true;
        const Duration length = std::chrono::milliseconds(2000 + Draw(18000));
        heard_late_ += length;
        node->partitioned_until = std::max(node->partitioned_until, now_ + length);
        At(node->partitioned_until + 1s, [this, id, inc = node->incarnation] {
          SimNode& n = nodes_[id.value];
          if (!n.up || n.incarnation != inc || now_ < n.partitioned_until + 1s) return;
          const std::vector<NodeId> up = m_.NodesUp();
          if (std::find(up.begin(), up.end(), id) != up.end()) return;  // not lost
          Lose(id, /*closed=*/false, /*repair=*/false);
          Join(id);
        });
        return;
      }
      case FaultKind::kStreamBreak: {
        // The agent's stream breaks (a connection reset): what is in flight
        // either way is lost, and the agent reconnects after 0.1 to 4 s and
        // resumes: taken back within the stream grace (2 s), a fresh node
        // after it.
        if (!node->connected) return;
        node->faulty = true;
        BreakStream(id);
        heard_late_ += kReconnectAtMost;
        At(now_ + std::chrono::milliseconds(100 + Draw(3900)), [this, id, inc = node->incarnation] {
          if (nodes_[id.value].incarnation == inc) Connect(id);
        });
        return;
      }
    }
  }

  const ClusterSimOptions o_;
  std::mt19937_64 rng_;
  JobMachine m_;
  ClusterSimResult result_;
  std::vector<SimNode> nodes_;
  std::vector<PlannedFault> faults_;
  std::priority_queue<Timed> queue_;
  uint64_t seq_ = 0;
  TimePoint now_ = Start();
  std::optional<TimePoint> tick_at_;
  std::vector<std::pair<TimePoint, std::string>> journal_;  // since snapshot_
  std::optional<std::string> snapshot_;
  static constexpr size_t kSnapshotEvery = 97;
  bool controller_down_ = false;
  std::set<std::string> fault_ids_;            // the spec's: none
  std::map<int, proto::AgentCommand> starts_;  // the generation's start, by node
  // The generation training now (-1: none), its nodes in rank order, the
  // ranks not yet ready, the steps it skips.
  int generation_ = -1;
  std::vector<NodeId> gen_nodes_;
  int ready_left_ = 0;
  std::set<int64_t> skip_;
  // How its ranks start: in process (a peer's state for fresh ranks), or
  // from the restore point.
  bool rejoin_ = false;
  std::optional<Process> peer_;
  int64_t restore_ = 0;
  // The durable tier: committed step -> parameters, and its shards; the
  // parameters each checkpointed step saved.
  struct Durable {
    uint64_t params = 1;
    int shards = 1;
  };
  std::map<int64_t, Durable> durable_;
  std::map<int64_t, uint64_t> saved_;
  TimePoint disk_failing_until_;
  // How long the controller may have heard of the job late, summed: the
  // partitions, its own outages and the agents' reconnections after them,
  // broken streams until their agent resumed.
  Duration heard_late_{0};
  int exit_code_ = -1;
  std::string finish_reason_;
};

}  // namespace

ClusterSimResult RunClusterSim(uint64_t seed, const ClusterSimOptions& options) {
  return Cluster(seed, options).Run();
}

}  // namespace endure::sim
