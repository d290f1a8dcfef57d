// ControllerShell: the controller's logic around core::JobMachine, apart
// from its process. It takes the agents' streams from a Transport — checks
// each stream's token and registration, turns its AgentEvents into the
// machine's events — and runs one event loop that steps the machine (with
// ticks at its deadlines, read from a Clock) and carries out its actions as
// AgentCommands down the streams. It coordinates the checkpoint tiers,
// journals the job to SQLite under the state directory, writes
// STATE_DIR/status.json and, at the end, STATE_DIR/report.json.
//
// Agents that lose their stream and come back: a stream that drops is not a
// lost node at once. The node is held for the core's stream grace
// (HeartbeatMonitorOptions::drop_grace); a registration under its name that
// says it resumes the generation the job still runs takes it back, ranks and
// all, with no incident, and the events the agent kept meanwhile flow in as
// usual. A resume of a generation the job has left gets a Stop for it and
// joins as a fresh node; no resume within the grace is a NodeDown. A second
// registration under a name whose stream is still open supersedes it (the
// old stream is closed). A stream cut for a flood, or of a node killed by an
// injected kill-agent fault, is a lost node at once.
//
// RunController (controller.h) wires it to gRPC, the real clock, signals
// and the HTTP status server; tests wire it to a FakeTransport and a
// FakeClock and drive the loop with RunOnce.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/restore_plan.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "controller/controller.h"
#include "controller/durable_tier.h"
#include "controller/event_queue.h"
#include "controller/incident_kb.h"
#include "controller/live_history.h"
#include "controller/live_tables.h"
#include "controller/metrics.h"
#include "controller/node_ledger.h"
#include "controller/state_store.h"
#include "controller/transport.h"
#include "core/job_machine.h"

namespace endure::controller {

// What one agent may have waiting for the event loop: an agent sends a
// heartbeat a second and a few events per rank and step; far more than that
// waiting is a flood (or a loop that cannot keep up), and the agent's stream
// is closed rather than the queue grown without bound.
inline constexpr int kMaxQueuedPerAgent = 10'000;
// Inputs are journaled in groups: one transaction holds the inputs the loop
// takes one after another while more are queued, and is committed before
// any action of theirs is carried out, when the queue drains, or at this
// many inputs or this age, whichever comes first. Inputs lost with an
// uncommitted group (the controller killed) moved nothing outside it.
inline constexpr int kJournalGroupInputs = 1'000;
inline constexpr Duration kJournalGroupAge = std::chrono::milliseconds(50);
// Whether the machine is to be snapshotted (JobMachine::Snapshot,
// StateStore::SaveSnapshot) and the journal cut behind it, after
// `journaled_bytes` of journal since the last snapshot of `snapshot_bytes`:
// ControllerOptions::snapshot_after_bytes. SnapshotDueAt: the journal
// bytes it is due at, the most a restart replays.
bool SnapshotDue(uint64_t journaled_bytes, uint64_t snapshot_bytes, uint64_t after_bytes);
uint64_t SnapshotDueAt(uint64_t snapshot_bytes, uint64_t after_bytes);
// The live status (STATE_DIR/status.json, /api/status) is written at most
// this often, and at the latest this long after the input it misses.
inline constexpr Duration kStatusEvery = std::chrono::milliseconds(250);
// The live node and incident tables are built again at most this often
// (a walk over every node: 12,500 at a large job's scale).
inline constexpr Duration kTablesEvery = std::chrono::seconds(1);
// How often the history (the report's plots) is saved in the state store.
inline constexpr Duration kHistorySaveEvery = std::chrono::seconds(10);
// The controller is overloaded while the oldest input in its queue has
// waited longer than kOverloadedAfter, until it is back within
// kCaughtUpWithin: it says so in the log, the status ("controller") and the
// metrics. Liveness is judged on time meanwhile (Turn); decisions on the
// inputs themselves are as late as the backlog.
inline constexpr Duration kOverloadedAfter = std::chrono::seconds(2);
inline constexpr Duration kCaughtUpWithin = std::chrono::milliseconds(500);
// A stream must say hello (register) within this long of opening.
inline constexpr Duration kHelloTimeout = std::chrono::seconds(10);
// A controller that carried on a run holds the run's nodes this long for
// their agents to come back and resume (they retry with backoff); the
// machine's heartbeat timeout, judged afresh from the restart, may end the
// wait first.
inline constexpr Duration kResumeGrace = std::chrono::seconds(20);

// Streams the controller holds at once, registered or waiting for their
// hello: a few more than the job's nodes.
int MaxConnections(const JobSpec& spec);

// Thread safety: the TransportSink calls, OnSignal, AgentsGone, StatusJson,
// MetricsText and queued() may come from any thread; Start, RunOnce, done
// and Finish from one loop thread, which owns the machine and the state
// store.
class ControllerShell final : public TransportSink {
 public:
  // The rendezvous port for a generation's rank 0 (StartGeneration's
  // master_port) when rank 0's node reported no free port of its own host
  // (Register.free_port, GenerationStopped.free_port); 29500 is sent when it
  // fails.
  using PortPicker = std::function<Result<int>()>;

  // `clock` and `transport` must outlive the shell; the job starts now (on
  // `clock`). Commands go down `transport`, whose sink this shell must be.
  ControllerShell(ControllerOptions options, Clock* clock, Transport* transport,
                  PortPicker pick_port);

  // Makes the state directory, opens its state store and journals the job;
  // learns the durable steps an earlier run left (a rollback before this
  // run's first checkpoint goes there); writes the first status. Errors:
  // the state directory or its database cannot be made or written.
  [[nodiscard]] Status Start();

  // One turn of the event loop: the next queued event — with `block`,
  // waiting for one until the loop's next deadline (at most a second) — or,
  // when none is queued, a tick at the clock's time. Steps the machine,
  // carries out its actions, cuts the streams whose hello is overdue.
  // With a FakeClock, `block` waits for nothing (its deadlines are long past
  // on the real clock).
  void RunOnce(bool block);
  // The job has ended: nothing more for RunOnce; Finish next.
  bool done() const { return finish_.has_value(); }
  // Once done: journals the end and writes STATE_DIR/report.json. Returns
  // the job's exit code: 0 training completed, 3 the controller gave up,
  // 128 + N a signal N stopped it. Error: report.json cannot be written.
  [[nodiscard]] Result<int> Finish();
  // No agent is attached any more (after the end: they all hung up).
  bool AgentsGone() const;

  // SIGTERM or SIGINT arrived: the loop stops the job next, before any event
  // already queued.
  void OnSignal(int sig);

  // The live status, as /api/status serves it (JSON) and as /metrics serves
  // it (Prometheus' text format, with the ETTR ledger).
  std::string StatusJson() const;
  std::string MetricsText() const;
  // /api/history and /api/steptimes (docs/monitoring.md).
  std::string HistoryJson() const;
  std::string StepTimesJson() const;
  // A page of the live node or incident table (live_tables.h), as
  // /api/nodes and /api/incidents serve it: at most a second old.
  enum class LiveTable { kNodes, kIncidents };
  Result<nlohmann::json> TablePage(LiveTable table, std::string_view page) const;
  // Events waiting for the loop.
  size_t queued() const { return queue_.size(); }

  // TransportSink. Registration is accepted in OnHello.
  StreamVerdict OnOpen(ConnectionId id, const PeerInfo& peer) override;
  StreamVerdict OnHello(ConnectionId id, const proto::AgentEvent& first) override;
  StreamVerdict OnEvent(ConnectionId id, const proto::AgentEvent& event) override;
  void OnClose(ConnectionId id, const std::string& reason) override;

 private:
  // What a stream thread hands to the loop: a core event, and what the shell
  // alone needs of it.
  struct Queued {
    std::optional<core::JobEvent> event;
    std::optional<proto::LogMatch> log_match;                    // explains the exit that follows
    std::optional<proto::ProgressUnmatched> progress_unmatched;  // the pattern counts nothing
    std::string fingerprint;                                     // from a worker's last words
    int64_t tokens = 0;                                          // tokens of a step
    std::optional<proto::GenerationStopped> stopped;  // with the node's checkpoint inventory
    core::NodeId node;
    core::TimePoint at;
    int stop_signal = 0;  // > 0: stop the job, a signal asked for it
    // A registration that says it resumes (node: the one it was bound to);
    // `taken_back`: bound to the node it was before, for the loop to check
    // against the generation the job runs.
    std::optional<proto::Register> resume;
    bool taken_back = false;
    // With a NodeUp: the node's health check as it reported it (empty: it
    // ran none).
    std::string health_summary;
    bool health_ok = true;
  };
  // A registered node whose stream dropped, held for `grace` (the stream
  // grace; after the controller's own restart, kResumeGrace).
  struct Dropped {
    core::NodeId node;
    core::TimePoint at;
    std::string reason;
    Duration grace{0};
  };
  // A stream waiting for its hello.
  struct PendingHello {
    core::TimePoint deadline;
    PeerInfo peer;
  };
  // A registered agent whose stream is open.
  struct Agent {
    ConnectionId connection;
    std::string name;
    std::string host;
    std::string replica_address;  // where peers send this node's checkpoint replicas
    // A port free on its host, as it last reported (Register, then each
    // GenerationStopped); 0: none, or already handed to a generation.
    int free_port = 0;
    int pair_test_port = 0;  // its pairwise-test listener on `host`; 0: none
    EventQueue<Queued>::Source source;
  };

  core::TimePoint Now() const;
  // Whether `first` may register an agent: the job's token, a Register with
  // a valid node name, slots and fields. Refusals say what to fix.
  StreamVerdict CheckRegistration(const PeerInfo& peer, const proto::AgentEvent& first) const;
  // Queues a control event for the loop (never refused).
  void Post(core::JobEvent event);
  // A pure conversion, on the stream's thread.
  Queued Translate(const proto::AgentEvent& e, core::NodeId node) const;
  // A signal stops the job: every agent is told to stop its workers, and
  // from then on the loop makes no decision (the workers' exits are the
  // stop's) but still takes what the tiers report, so that a step the agents
  // persist on their way out commits. The stop ends (FinishStop) once every
  // agent has stopped or hung up, or at stop_deadline_.
  void StopOnSignal(int sig, core::TimePoint now);
  void FinishStop();
  bool EveryAgentStopped() const;
  // Cuts the streams whose first message is overdue.
  void CancelSilentHellos(core::TimePoint now);
  // Nodes whose stream dropped more than the stream grace ago, and that did
  // not come back: each a NodeDown, queued. Returns the next such deadline.
  std::optional<core::TimePoint> LoseDroppedNodes(core::TimePoint now);
  // A resuming registration (the loop's half): a node taken back that
  // resumes the generation the job runs carries on (told to stop again if
  // the generation is stopping); otherwise its stale workers are stopped and
  // a node taken back becomes a fresh one (NodeDown, then NodeUp).
  void OnResume(const Queued& item);
  // Logs a failure to journal to the state store; the job goes on.
  void Journal(const std::string& what, const Status& st) const;
  // Records the incidents new since the last call in the knowledge base,
  // with the earlier ones like them, and updates the actions that changed.
  void RecordInKnowledgeBase();
  // Every input of the machine goes through here: journaled (before it is
  // acted on), stepped, and what it changed saved, in one transaction.
  std::vector<core::JobAction> Input(const core::JobEvent& event, core::TimePoint at);
  // The generation number the current run's machine starts from: after the
  // earlier runs' ones.
  core::Generation FirstGeneration();
  // When the state directory's newest run is unfinished, was begun under
  // this spec and journaled its inputs: replays the journal into a fresh
  // machine, makes the run current again and holds its nodes for their
  // agents to resume into (kResumeGrace). Returns whether it did; false
  // (with the reason on stderr) means a new run begins. A damaged journal
  // entry is such a reason: the history stays, the new run starts afresh.
  Result<bool> CarryOn();
  void Execute(const std::vector<core::JobAction>& actions, core::TimePoint now);
  // With [recovery] warm_standby: each healthy node outside the running
  // generation (a spare) is told once to keep warm standbys (proto Prepare).
  void PrepareSpares();
  // Sends `cmd`, with the job's token, to `node`'s agent; dropped when its
  // stream has ended.
  void Send(core::NodeId node, proto::AgentCommand cmd);
  // Sends `cmd`, with the job's token, to every attached agent.
  void Broadcast(proto::AgentCommand cmd);
  std::optional<Agent> AgentOf(core::NodeId node) const;
  std::string NameOf(core::NodeId node) const;
  void WriteStatus(core::TimePoint now, bool force);
  // How far behind its inputs the loop is (`oldest`: the queue's first
  // input's time), and whether it is overloaded (kOverloadedAfter).
  void JudgeLoad(core::TimePoint now, std::optional<core::TimePoint> oldest);
  void Persist();
  // Commits the open group of journaled inputs (kJournalGroupInputs), and
  // takes a snapshot when one is due (SnapshotDue).
  void CommitJournal();
  void TakeSnapshot();
  // RunOnce's turn, before the group's commit.
  void Turn(bool block);
  // A registration's NodeUp, before the machine sees it: refused when the
  // node failed its health check (a hard strike) or the ledger has it
  // quarantined.
  void JudgeRegistration(core::NodeUp& up, const Queued& item);
  // Records a strike in the ledger; a node it quarantines is posted to the
  // machine (NodeQuarantined) unless the machine already stopped using it.
  void RecordStrike(const core::StrikeNodeAction& strike);
  int64_t WallMs() const;
  void LedgerError(const std::string& what, const Status& st) const;
  // A node's memory tiers, reported with its workers' stop: an input of the
  // checkpoint book, before the stop itself (which may start the next
  // generation, whose restore point they are).
  void OnInventory(const Queued& item);
  // The checkpoint book's actions, carried out on the durable directory,
  // each result an input of the machine.
  void CarryOutCheckpoint(const core::JobAction& action, core::TimePoint now);
  // The checkpoint part of a StartGeneration.
  proto::CheckpointConfig CheckpointFor(const core::StartGenerationAction& start);
  // "checkpoint" in the report, from the book's totals.
  nlohmann::json CheckpointJson() const;

  const ControllerOptions o_;
  Clock* const clock_;
  Transport* const transport_;
  const PortPicker pick_port_;
  core::TimePoint start_;  // the run's start (CarryOn: the earlier controller's)
  double start_unix_;
  const Duration stream_grace_;      // a dropped node's time to come back
  std::set<std::string> fault_ids_;  // the spec's; immutable after construction
  core::JobMachine machine_;         // owned by the loop thread
  DurableTier durable_;              // T2, as this host mounts it; the loop thread's
  std::optional<StateStore> store_;  // owned by the loop thread
  std::optional<NodeLedger> nodes_;  // the node health ledger; owned by the loop thread
  JobRecord job_;                    // owned by the loop thread
  std::string ledger_dir_;           // where nodes.db and incidents.db are
  std::optional<IncidentKb> kb_;     // the incident knowledge base; owned by the loop thread
  // The incidents of this run recorded in kb_, by incident id: their id
  // there, the action last recorded, and the earlier incidents like them.
  struct KbEntry {
    int64_t id = 0;
    std::string action;
    nlohmann::json recurrence;
  };
  std::map<int, KbEntry> kb_entries_;  // owned by the loop thread

  mutable Mutex conns_mu_;
  std::map<ConnectionId, PendingHello> hellos_ GUARDED_BY(conns_mu_);
  std::map<ConnectionId, core::NodeId> registered_ GUARDED_BY(conns_mu_);
  std::map<core::NodeId, Agent> agents_ GUARDED_BY(conns_mu_);  // open streams only
  int next_node_ GUARDED_BY(conns_mu_) = 0;
  std::vector<std::string> node_names_ GUARDED_BY(conns_mu_);     // that ever registered
  std::map<std::string, Dropped> dropped_ GUARDED_BY(conns_mu_);  // by node name
  // Nodes whose stream's end is a lost node at once: cut for a flood, or
  // killed by an injected kill-agent fault (nothing comes back).
  std::set<core::NodeId> lose_at_once_ GUARDED_BY(conns_mu_);

  EventQueue<Queued> queue_{kMaxQueuedPerAgent};

  // Loop-thread state.
  std::map<std::pair<int64_t, int>, proto::LogMatch> last_log_;  // (generation, rank)
  std::set<core::NodeId> prepared_;                              // PrepareSpares sent
  // The start of the newest generation, by node: sent again to a member
  // that missed it while its stream was down (core::MissedItsStart).
  std::map<core::NodeId, proto::AgentCommand> starts_;
  std::string fingerprint_;
  std::optional<core::FinishAction> finish_;
  int stop_signal_ = 0;     // the signal that stopped the job, if one did
  std::string stopped_by_;  // its name
  std::optional<core::TimePoint> stop_deadline_;
  std::set<core::NodeId> stopped_nodes_;  // agents that reported their workers stopped since
  int64_t journal_seq_ = 0;               // the last input journaled
  uint64_t journaled_bytes_ = 0;          // since the last snapshot
  uint64_t snapshot_bytes_ = 0;           // of the last snapshot
  int snapshots_ = 0;                     // taken by this controller
  Duration snapshot_took_{0};             // the last one's time on the loop
  double view_cpu_s_ = 0;                 // the loop's CPU building the live view and the metrics
  Duration behind_{0};                    // the oldest queued input's wait (JudgeLoad)
  std::optional<core::TimePoint> overloaded_since_;
  Duration overloaded_for_{0};  // overloaded, before overloaded_since_
  // The open group of journaled inputs (a transaction), its size and start.
  bool group_open_ = false;
  int group_inputs_ = 0;
  core::TimePoint group_started_{};
  core::TimePoint last_status_{};
  bool status_behind_ = false;     // a write was skipped since last_status_
  bool ticked_last_turn_ = false;  // a deadline's tick came before the queue's next input
  core::TimePoint last_step_at_{};
  size_t saved_incidents_ = 0;
  core::TimePoint ledger_saved_at_{};  // when SaveLedger last ran (SaveLedgerNow)
  int64_t tokens_per_step_ = 0;
  std::deque<std::pair<core::TimePoint, int64_t>> recent_steps_;  // for the rate

  mutable Mutex published_mu_;
  std::string status_json_ GUARDED_BY(published_mu_) = "{}";
  std::shared_ptr<const LiveTables> tables_ GUARDED_BY(published_mu_) =
      std::make_shared<const LiveTables>();
  std::optional<core::TimePoint> tables_built_at_;  // the loop's: when tables_ was built
  // What the live status and the report warn of (a progress pattern that
  // matches nothing), each once, at most kMaxWarnings; the loop's.
  void Warn(const std::string& warning);
  std::vector<std::string> warnings_;
  static constexpr size_t kMaxWarnings = 64;
  // The live view beyond the machine (the loop thread's): strikes and tiers
  // by node, the knowledge base's recurrences; the history and the step-time
  // heatmap; the newest durable step and when it was committed.
  void BuildLiveView(core::TimePoint now, const nlohmann::json& status);
  void NoteTiers(const Queued& item);
  DurableView Durable(core::TimePoint now);
  LiveInputs live_;
  LiveHistory history_;
  std::optional<core::TimePoint> history_saved_at_;
  bool final_view_ = false;  // Finish's: the history's last sample, saved
  StepHeat heat_;
  int64_t durable_seen_ = -1;
  std::optional<core::TimePoint> durable_at_;
  // Prometheus' registry: set by Start before any HTTP thread asks for it,
  // thread-safe itself.
  std::unique_ptr<JobMetrics> metrics_;
  std::string history_json_ GUARDED_BY(published_mu_) = "{}";
};

}  // namespace endure::controller
