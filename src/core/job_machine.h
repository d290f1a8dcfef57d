// JobMachine: the controller's decision core for one training job. It owns
// the generation lifecycle (start, run, stop, restart), turns what the
// agents report into incidents with a cause, a detection latency and a
// recovery timeline, decides the recovery with RecoveryPolicy and
// AnomalyPolicy, fires time-scheduled faults, and keeps the ETTR ledger.
//
// Sans-I/O: Step(event, now) -> actions. The controller's shell feeds it
// real events from the gRPC streams and carries out the actions; tests feed
// scripted events. Deterministic: its state is a function of its options,
// its start and the (event, time) inputs, so the shell's journal of those
// inputs replayed into a fresh machine rebuilds it exactly (nothing else
// changes it). Not thread-safe (one event loop owns it).
//
// Lifecycle: kWaitingForNodes -> kRunning(g) -> [failure] -> kStopping(g) ->
// [backoff / waiting for a replacement node] -> kRunning(g+1) ... -> kDone.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "common/duration.h"
#include "core/anomaly_policy.h"
#include "core/cause.h"
#include "core/checkpoint_book.h"
#include "core/ettr_ledger.h"
#include "core/hang_detector.h"
#include "core/heartbeat_monitor.h"
#include "core/ids.h"
#include "core/log_classifier.h"
#include "core/loss_anomaly_detector.h"
#include "core/node_health.h"
#include "core/pairwise.h"
#include "core/recovery_policy.h"
#include "core/recovery_route.h"
#include "core/sdc_check.h"
#include "core/stack_signature.h"
#include "core/straggler.h"
#include "faults/fault.h"

namespace endure::core {

// Implicit failures and isolation (issue 12): stragglers, the SDC check,
// hang localization, pairwise tests, strikes.
struct IsolationOptions {
  StragglerOptions straggler;
  // Every this many steps each rank fingerprints its parameters after the
  // optimizer step (the workers' ENDURE_SDC_CHECK_EVERY); 0: no SDC check.
  int64_t sdc_check_every = 0;
  // A hang whose stacks single out a minority: evict the suspects' nodes
  // (ByteRobust's over-eviction) rather than restart them in place.
  bool over_evict = true;
  // Ambiguous collective failures (a hang with no stack outlier, a
  // communication error) run the two-round pairwise test before the
  // restart.
  bool pairwise_test = true;
  PairwiseOptions pairwise;
  Duration pairwise_timeout = std::chrono::seconds(10);  // per round
  NodeHealthOptions health;
  // The straggler decision's estimates, until the job measures its own: the
  // remaining training time when the workers do not say their step count,
  // the cost of a restart, and the wait for a replacement node.
  Duration straggler_horizon = std::chrono::hours(1);
  Duration restart_cost = std::chrono::seconds(30);
  Duration replacement_wait = std::chrono::minutes(5);

  Status Validate() const;
};

struct JobMachineOptions {
  int nodes = 1;           // nodes a generation needs
  int ranks_per_node = 1;  // ranks each node runs
  // Elastic: the fewest nodes the job goes on with when nodes leave and no
  // spare takes their place (RecoveryRoute kShrink); it grows back to
  // `nodes`, in process, as healthy nodes register. 0: every generation
  // needs `nodes` ([job] min_nodes).
  int min_nodes = 0;
  HangDetectorOptions hang;
  HeartbeatMonitorOptions heartbeat;  // agents silent this long are lost
  LossAnomalyOptions loss;
  AnomalyPolicyOptions anomaly;
  RecoveryPolicyOptions recovery;
  IsolationOptions isolation;
  bool detect_loss_anomalies = true;
  // Restart in process where it can (core/recovery_route.h): the ranks that
  // did not fail keep their process and state, and only the failed ones
  // start, taking the state from a peer ([recovery] in_process).
  bool in_process = true;
  // How long the job waits, after a failure, for enough healthy nodes to
  // start its next generation (a replacement for one it lost or evicted)
  // before it gives up (exit 3, naming the nodes it has). Zero: forever.
  Duration replacement_timeout = std::chrono::minutes(10);
  // The number of this machine's first generation: a controller that
  // carries on a state directory numbers its generations after the earlier
  // runs' ones, so that a message of an earlier controller's generation (a
  // resuming agent's old workers ending) is never taken for one of its own.
  Generation first_generation;
  // The checkpoints: retention, replicas, the durable cadence, the memory
  // budget (its ranks_per_node is the machine's own).
  CheckpointBookOptions checkpoint;

  Status Validate() const;
};

// A fault that the controller fires from outside the workers: a whole node
// (kill-agent), or any kind at a scheduled time since the job started.
struct ExternalFault {
  std::string id;
  faults::FaultKind kind = faults::FaultKind::kKill;
  Rank rank{-1};               // the target rank (kill-agent: its node)
  StepNumber step{-1};         // fire when the job reaches this step...
  std::optional<Duration> at;  // ...or at this time since the job started
};

// ---- Events ----
struct NodeUp {
  NodeId node;
  std::string name;
  int slots = 0;
  // Non-empty: the node may not run the job, and why: its health check
  // failed, or the node health ledger has it quarantined (the shell asks
  // JudgeNode). It stays registered, and named in the report.
  std::string refused;
};
// The node health ledger quarantined a node during the run (its strikes
// reached the limit): no later generation uses it.
struct NodeQuarantined {
  NodeId node;
  std::string reason;
};
struct NodeDown {  // the agent's stream dropped or it exited
  NodeId node;
  std::string reason;
  // When its stream broke, where the loss was declared only after a grace
  // for the agent to come back: the fault's time (the time in between was
  // detection, not training). nullopt: now.
  std::optional<TimePoint> since;
};
struct NodeHeartbeat {  // the agent is alive
  NodeId node;
};
struct WorkerReady {
  Generation generation;
  Rank rank;
  StepNumber start_step;
  double restore_s = 0;
  // The worker rejoins later generations in place (an in-process restart
  // may keep it): client.h Session::Rejoin.
  bool rejoin = false;
  // The program computes the same loss bit for bit when it replays a step
  // (client.h Session::DeclareDeterministic): a loss anomaly is then judged
  // by replaying it (AnomalyPolicy).
  bool deterministic = false;
  // An unmodified program (its progress read from its output) does not say
  // what it restored (start_step is 0): the first step it reports does, and
  // the work after that step was lost (JobMachine::RestoredTo).
  bool start_step_unknown = false;
  // It rejoins, and then restores its part of the state from the tiers
  // (client.h RejoinRestore::kFromTiers: a sharded state).
  bool rejoin_from_tiers = false;
};
struct StepEnd {
  Generation generation;
  Rank rank;
  StepNumber step;  // steps completed
  double loss = 0;
  double ckpt_stall_s = 0;
  StepNumber checkpoint_step{-1};  // -1: no checkpoint committed with this step
  bool skipped = false;            // skipped on purpose after an anomaly: no loss to judge
  double compute_s = 0;            // the rank's compute before its allreduce wait (0: unknown)
  int64_t total_steps = 0;  // the steps the job will train, when the worker says (0: unknown)
};
// The steps of one node's ranks, reported together (proto NodeSteps): one
// input, stepped as the node's heartbeat and then its StepEnds one after
// another at the same time, each of `generation`.
// A node's report holds at most one step per rank it runs, and a node runs
// at most this many (the controller's kMaxRanksPerNode).
inline constexpr size_t kMaxNodeStepsRanks = 1024;
struct NodeStepsEnd {
  NodeId node;
  Generation generation;
  std::vector<StepEnd> steps;  // their own `generation` is this one's
};
// A rank entered a phase of its loop (session.phase("eval")): see
// HangDetector. `phase` is checked by the agent (^[a-z][a-z0-9_]{0,31}$).
struct PhaseChanged {
  Generation generation;
  Rank rank;
  std::string phase;
};
// A replica's parameter fingerprint after the optimizer step of `step`.
struct FingerprintReported {
  Generation generation;
  Rank rank;
  StepNumber step;
  std::string fingerprint;  // 16 hex digits
};
// One pair's result of the pairwise test `test` (RunPairTestAction).
struct PairTestResult {
  int test = 0;
  int round = 0;
  NodeId a, b;
  bool ok = false;
  double seconds = 0;
  std::string error;
};
struct WorkerExitEvent {
  Generation generation;
  Rank rank;
  NodeId node;
  std::optional<int> exit_code;
  std::optional<int> signal;
  // From the log classifier over the worker's last output, when a rule
  // matched (log_action: nullopt when none did, or the agent named no known
  // action).
  std::string log_cause;
  std::optional<LogAction> log_action;
  std::string log_rule, log_line;
  // The agent stopped or killed it (a stop, a node's death): no failure of
  // its own.
  bool stopped = false;
};
struct FaultFiredEvent {
  Generation generation;
  Rank rank;
  std::string id;
  faults::FaultKind kind = faults::FaultKind::kKill;
  StepNumber step;
  TimePoint at;  // when it fired (the agent's report, on the controller's clock)
};
struct GenerationStoppedEvent {
  Generation generation;
  NodeId node;
};
struct StackDumpEvent {
  Generation generation;
  Rank rank;
  std::string text;
};
// Writing a checkpoint shard to durable storage (T2) failed. Training goes
// on from the memory tiers; the job's first such failure is an incident (the
// report counts them all).
struct PersistFailedEvent {
  Generation generation;
  int shard = 0;  // the shard of rank `shard`
  StepNumber step;
  NodeId node;
  std::string error;
};

// The checkpoint book's inputs (core/checkpoint_book.h): DurableListed,
// ShardPersisted, ManifestWritten, StepRemoved, InventoryReported and
// ShardRefused. An inventory arrives before its node's GenerationStopped.

// Where generation `generation` restores from, as the shell planned it from
// the book (CheckpointBook::Plan, the durable copies verified): the text
// (the copies it chose across the tiers, and what it refused) is recorded
// on the incident that generation recovers from, and the book's timeline
// begins at `restored_step`.
struct RestoreChosen {
  Generation generation;
  std::string text;
  // The step restored (0: a fresh start); -1: nothing was restored from the
  // tiers (the ranks that kept their state hand it on, in process).
  StepNumber restored_step{-1};
  // The shards taken from each tier.
  int from_t0 = 0, from_t1 = 0, from_t2 = 0;
};

// The controller carried on after an outage of its own (a restart that
// replayed its journal, or a standby that took over): nothing was watched
// since the previous input, so neither the agents' silence nor the ranks'
// meanwhile counts against them; both are judged afresh from now.
struct ControllerResumed {};

// The job's configuration: the machine's first input (a machine made with
// its options steps it at once), so that a journal holds all a replay needs.
// A later one changes nothing: a run keeps the configuration it began with.
struct Configure {
  JobMachineOptions options;  // must be valid (CHECKed)
  std::vector<ExternalFault> faults;
};

struct Tick {};

using JobEvent =
    std::variant<NodeUp, NodeDown, NodeHeartbeat, WorkerReady, StepEnd, WorkerExitEvent,
                 FaultFiredEvent, GenerationStoppedEvent, StackDumpEvent, PersistFailedEvent,
                 DurableListed, RestoreChosen, ControllerResumed, Configure, Tick, PhaseChanged,
                 FingerprintReported, PairTestResult, NodeQuarantined, ShardPersisted,
                 ManifestWritten, StepRemoved, InventoryReported, ShardRefused, NodeStepsEnd>;

// ---- Actions ----
struct StartGenerationAction {
  Generation generation;
  std::vector<NodeId> nodes;  // node i runs ranks [i * ranks_per_node, (i+1) * ranks_per_node)
  // -1: newest that verifies (a start or a crash restart); 0: fresh; N: newest
  // at or before N (a rollback: N is the step before the anomaly, whichever
  // run wrote the checkpoint that the tiers find there).
  StepNumber restore_step{-1};
  // >= 0 on a rollback: the anomalous step. Checkpoints of it and later hold
  // its update (the abandoned timeline); the shell removes those this run
  // wrote. -1: nothing is abandoned.
  StepNumber abandoned_from{-1};
  std::vector<StepNumber> skip_steps;
  std::set<std::string> fired_faults;  // faults the workers must not fire again
  // An in-process restart (RecoveryRoute kInProcess or kSpare): the workers
  // alive on their node keep their process and state and rejoin; the others
  // start and take the state from them. restore_step is then unused.
  bool rejoin = false;
  // ... and the ranks said they restore their parts from the tiers instead
  // (a sharded state): the generation carries a restore plan.
  bool rejoin_from_tiers = false;
};
struct StopGenerationAction {
  Generation generation;
  bool dump_stacks = false;  // capture every rank's stack first (a hang)
};
struct EvictNodeAction {  // the node leaves the job (it is shut down)
  NodeId node;
  std::string reason;
};
struct InjectFaultAction {  // fire an external fault now
  ExternalFault fault;
  NodeId node;
  Generation generation;
};
// A strike against a node in the node health ledger (the shell records it
// with the wall-clock time and feeds NodeQuarantined back when the node's
// strikes reach the limit). A hard strike quarantines at once: the machine
// has already stopped using the node.
struct StrikeNodeAction {
  NodeId node;
  std::string node_name;
  std::string cause;  // "straggler", "sdc", "hang_suspect", "xid_79", ...
  bool hard = false;
  std::string detail;
};
// Run round `round` of pairwise test `test`: for each pair, node a's agent
// allreduces a buffer with node b's and reports a PairTestResult.
struct RunPairTestAction {
  int test = 0;
  int round = 0;
  std::vector<std::pair<NodeId, NodeId>> pairs;
};
struct FinishAction {
  int exit_code = 0;  // 0 success, 3 gave up
  std::string reason;
};
// The checkpoint book's actions (ListDurableAction, WriteManifestAction,
// RemoveStepAction: core/checkpoint_book.h) are the machine's too.
using JobAction = std::variant<StartGenerationAction, StopGenerationAction, EvictNodeAction,
                               InjectFaultAction, FinishAction, StrikeNodeAction, RunPairTestAction,
                               ListDurableAction, WriteManifestAction, RemoveStepAction>;

// The job changed size without a failure: a shrunk job grew back, in
// process, when healthy nodes registered (a shrink is an incident's route).
struct Resize {
  Generation generation;  // the generation it started
  TimePoint at;
  int from_nodes = 0, to_nodes = 0;
  StepNumber step;  // the job's step when it grew
  std::string reason;
};

// One failure and what was done about it. Times are on the controller clock.
struct Incident {
  int id = 0;
  Generation generation;
  IncidentCause cause;
  Rank rank{-1};
  NodeId node;
  std::string node_name;
  std::optional<TimePoint> injected_at;  // injected faults only
  TimePoint fault_at;                    // injected_at, or the best estimate
  TimePoint detected_at;
  std::optional<TimePoint> stopped_at;     // every agent confirmed teardown
  std::optional<TimePoint> relaunched_at;  // next generation started
  std::optional<TimePoint> ready_at;       // every rank of it restored
  std::optional<TimePoint> recovered_at;   // its first step ended
  double restore_s = 0;
  // Highest step reached before the failure; for a loss anomaly at step s,
  // s - 1 (the newest step not in question), so that a rollback to it loses
  // nothing.
  StepNumber failed_at_step;
  StepNumber restored_step{-1};  // where the next generation started
  std::string action;
  std::string reason;
  // How the job got back to training (none for a stop), and why that way.
  std::optional<RecoveryRoute> route;
  std::string route_reason;
  std::string log_line;
  std::string restore;              // where the restart restored from, and what it refused
  std::vector<std::string> stacks;  // "rank N:\n<stack>" per rank, for hangs
  // The nodes the localization named (stack outliers, the pairwise test's
  // faulty or slow nodes, an SDC's minority), by name.
  std::vector<std::string> suspects;

  int64_t steps_lost() const {
    return restored_step.value < 0
               ? 0
               : std::max<int64_t>(0, failed_at_step.value - restored_step.value);
  }
};

// kTesting: stopped after an ambiguous collective failure, running the
// pairwise test before the restart.
// A straggler the machine flagged and kept (moving it would cost more than
// it does): training goes on, so it is no incident; the report lists it,
// and the node is struck (soft) in the health ledger.
struct StragglerReport {
  Generation generation;
  Rank rank;
  NodeId node;
  std::string node_name;
  StepNumber step;  // when it was flagged
  TimePoint at;
  double slowdown = 1;  // its compute against its peers' median
  std::string reason;   // the detector's and the decision's numbers
};

enum class JobPhase { kWaitingForNodes, kRunning, kStopping, kTesting, kWaiting, kDone };
std::string_view JobPhaseName(JobPhase phase);

class JobMachine {
 public:
  // An unconfigured machine for a job that starts at `start`: it ignores
  // every input until a Configure.
  explicit JobMachine(TimePoint start);
  // A machine stepped with Configure{options, external_faults} at `start`.
  // `options` must be valid (CHECKed).
  JobMachine(JobMachineOptions options, std::vector<ExternalFault> external_faults,
             TimePoint start);

  std::vector<JobAction> Step(const JobEvent& event, TimePoint now);

  // When Step(Tick) should next be called, or nullopt if nothing is timed.
  std::optional<TimePoint> NextDeadline() const;

  JobPhase phase() const { return phase_; }
  Generation generation() const { return generation_; }
  // Generations this machine started (from options.first_generation on).
  int generations_started() const {
    return generation_.value - options_.first_generation.value + 1;
  }
  StepNumber step() const { return job_step_; }  // highest step every rank completed
  double last_loss() const { return last_loss_; }
  const std::vector<Incident>& incidents() const { return incidents_; }
  const std::vector<StragglerReport>& stragglers() const { return stragglers_kept_; }
  // The straggler detector's view of the current generation: each rank's
  // mean compute time over its window (NaN: none yet), and whether it was
  // flagged.
  const StragglerDetector& straggler_detector() const { return stragglers_; }
  // Loss anomalies a replay showed to be the data's, trained through.
  const std::vector<DataAnomaly>& data_anomalies() const { return anomaly_.data_anomalies(); }
  // Steps whose data the job skips after an anomaly, ascending.
  const std::vector<StepNumber>& skipped_steps() const { return anomaly_.skipped_steps(); }
  // How loss anomalies are judged in the current generation: "replay" when
  // every rank said it is deterministic, else "rollback".
  std::string_view anomaly_mode() const;
  const std::vector<Resize>& resizes() const { return resizes_; }
  // The nodes of the current generation, in rank order (node i runs ranks
  // [i * ranks_per_node, (i+1) * ranks_per_node)).
  const std::vector<NodeId>& members() const { return members_; }
  int ranks_per_node() const { return options_.ranks_per_node; }
  const EttrLedger& ledger() const { return ledger_; }
  // What the job knows of its checkpoints, and where it restores from.
  const CheckpointBook& checkpoints() const { return book_; }
  // The restore point for `start` (a generation that does not rejoin), from
  // the book: its nodes' memory tiers and the durable steps of this timeline.
  checkpoint::RestorePlan PlanRestore(const StartGenerationAction& start) const;
  const std::set<std::string>& fired_faults() const { return fired_; }
  std::string NodeName(NodeId node) const;
  // The node running `rank` in the current generation (invalid if none).
  NodeId NodeOfRank(Rank rank) const;
  // The nodes registered and not lost or evicted, ascending.
  std::vector<NodeId> NodesUp() const;
  // The nodes that may not run the job (a failed health check, the ledger's
  // quarantine), by name, with why.
  std::map<std::string, std::string> RefusedNodes() const;
  // Every node that registered, by id, with its name.
  std::vector<std::pair<NodeId, std::string>> Nodes() const;
  // Every node that registered, by id, as the live status shows it.
  struct NodeView {
    NodeId node;
    std::string name;
    bool up = false;            // registered and not lost or evicted
    std::optional<Rank> first;  // a member of the current worker set: its first rank
    std::string refused;        // why it may not run the job (empty: it may)
  };
  std::vector<NodeView> NodeViews() const;

  // A snapshot of the machine: its configuration and every part of its
  // state, its times as offsets from the job's start (core/job_snapshot.cc).
  // FromSnapshot(s.Snapshot(), start) acts on every later input as `s`
  // does, with its times moved to a job that started at `start`. A damaged
  // or foreign snapshot is an error that says what is wrong with it.
  std::string Snapshot() const;
  static Result<JobMachine> FromSnapshot(std::string_view snapshot, TimePoint start);
  // The state a snapshot holds (job_snapshot.cc): every member below but
  // the configuration (options_, external_), which it keeps as a Configure.
  template <class Archive>
  void serialize(Archive& ar);

 private:
  struct Node {
    std::string name;
    int slots = 0;
    bool up = true;
    std::string refused;  // NodeUp.refused, or the quarantine's reason

    template <class Archive>
    void serialize(Archive& ar) {
      ar(name, slots, up, refused);
    }
  };
  struct Failure {
    IncidentCause cause;
    Rank rank{-1};
    NodeId node;
    TimePoint fault_at;
    std::optional<TimePoint> injected_at;
    std::optional<LogAction> log_action;
    std::string log_line, extra_reason;
    bool evict = false;    // the node itself is bad
    bool anomaly = false;  // a loss anomaly: roll back to a checkpoint before it
    std::optional<LossAnomaly> loss_anomaly;
    // A replay's verdict already decided what to do about the anomaly.
    std::optional<AnomalyDecision> anomaly_decision;
    // Decided by the detector's own policy (a straggler's move, an SDC's
    // rollback) rather than by RecoveryPolicy: the action's name and why.
    std::optional<std::string> decided_action;
    std::vector<NodeId> evict_nodes;        // with decided_action
    std::optional<StepNumber> rollback_to;  // restore the newest checkpoint at or before it
    std::vector<std::string> suspects;

    // An injected fault explains this failure: it happened when it fired.
    void InjectedBy(const FaultFiredEvent* fired) {
      if (fired == nullptr) return;
      fault_at = fired->at;
      injected_at = fired->at;
    }
  };

  // The last fault fired in the current generation that `matches`, or null.
  const FaultFiredEvent* LastFiredFault(
      const std::function<bool(const FaultFiredEvent&)>& matches) const;

  // Step's handlers. StepAnyPhase takes the inputs whose effect does not
  // depend on the phase (registrations, heartbeats, lost nodes, fired
  // faults, checkpoint inventories and restore notes, the controller's
  // resume, stacks, persistence failures) and the phase-independent part of
  // a tick; it returns false when the phase's handler is to see the input
  // too. Each phase's handler takes what only that phase acts on.
  void OnConfigure(const Configure& c);
  // A replayed anomaly's verdict: record it, strike what changed, or roll
  // back (skip) or stop as the verdict says.
  void OnReplayVerdict(const ReplayVerdict& v, TimePoint now, std::vector<JobAction>& out);
  // A worker's own death reported while the generation stops: the cause of
  // an incident opened on a collective failure (its victim's report).
  void OnExitWhileStopping(const WorkerExitEvent& e);
  // A failure whose log rule says stop_if_repeated, in the restart after an
  // incident of the same cause: its recurrence is confirmed.
  bool ConfirmsItsRecurrence(const Failure& failure) const;
  // The pairwise test named `faulty`: a collective failure reported from it
  // while the generation stopped is the incident's cause.
  void BlameTheFaultyNode(Incident& inc, NodeId faulty);
  // A member node is lost while the generation stops after a collective
  // failure of one of its peers: the loss is the cause (see the .cc).
  void OnNodeLostWhileStopping(NodeId node, const std::string& reason, std::vector<JobAction>& out);
  bool StepAnyPhase(const JobEvent& event, TimePoint now, std::vector<JobAction>& out);
  void StepWaitingForNodes(const JobEvent& event, TimePoint now, std::vector<JobAction>& out);
  void StepRunning(const JobEvent& event, TimePoint now, std::vector<JobAction>& out);
  void StepStopping(const JobEvent& event, TimePoint now, std::vector<JobAction>& out);
  void StepWaiting(const JobEvent& event, TimePoint now, std::vector<JobAction>& out);

  // kRunning: a message of the running generation, from a rank of its world.
  void OnWorkerReady(const WorkerReady& e, TimePoint now);
  // Every rank restored `step` (told at ready, or by the first step of a
  // program that does not say): the detectors and the ledger go back to it.
  void RestoredTo(StepNumber step, TimePoint now);
  void OnStepEnd(const StepEnd& e, TimePoint now, std::vector<JobAction>& out);
  void OnWorkerExit(const WorkerExitEvent& e, TimePoint now, std::vector<JobAction>& out);
  // A hang is judged only while every member's agent is heard from: a
  // quiet one (no heartbeat for QuietAfter) explains the lack of progress
  // (its link, or the controller's own, is down), and the heartbeat timeout
  // decides about it. When all are heard again, progress is judged afresh.
  void CheckHang(TimePoint now, std::vector<JobAction>& out);
  bool AnyMemberQuiet(TimePoint now) const;
  Duration QuietAfter() const;

  void OnFailure(const Failure& failure, TimePoint now, std::vector<JobAction>& out);

  // Issue 12's detectors, from kRunning.
  void OnStragglers(const std::vector<StragglerFlag>& flags, TimePoint now,
                    std::vector<JobAction>& out);
  void OnSdcVerdict(const SdcVerdict& v, TimePoint now, std::vector<JobAction>& out);
  // After the stop of a hang or a collective failure: the stacks' groups,
  // then the pairwise test. Returns true when a test started (kTesting).
  bool Localize(TimePoint now, std::vector<JobAction>& out);
  void StepTesting(const JobEvent& event, TimePoint now, std::vector<JobAction>& out);
  void EndPairwiseRound(TimePoint now, std::vector<JobAction>& out);
  // Stops using `node` for the job: evicts it (its agent is shut down).
  void EvictNode(NodeId node, const std::string& reason, std::vector<JobAction>& out);
  void Strike(NodeId node, std::string_view cause, std::string detail, std::vector<JobAction>& out);
  Duration MedianStepTime() const;
  // When the training stopped, if it did: the last step's end plus a median
  // step, once that is past (nullopt while not productive, before a step,
  // or while a rank is in another phase, whose silence is no stall).
  std::optional<TimePoint> StalledSince() const;
  StepNumber NewestCheckpoint() const;
  // A rollback to restore_step_ was decided: the book abandons the
  // checkpoints from abandoned_from_ (removals go into `out`).
  void RollBackCheckpoints(std::vector<JobAction>& out);
  // Any phase: `node` is lost (at `fault_at`, the best estimate: its last
  // heartbeat, or now when its stream dropped); a failure when it is a
  // member of the running generation, the end of its stop when the
  // generation was stopping.
  void OnNodeLost(NodeId node, const std::string& reason, TimePoint fault_at, TimePoint now,
                  std::vector<JobAction>& out);
  // kStopping: every member confirmed the stop; on to kWaiting.
  void Stopped(TimePoint now, std::vector<JobAction>& out);
  void MaybeStart(TimePoint now, std::vector<JobAction>& out);
  // kRunning, at a step every rank completed: a shrunk job grows back onto
  // healthy nodes outside the generation, in process.
  void MaybeGrow(TimePoint now, std::vector<JobAction>& out);
  // Starts generation g+1 on `nodes` (the members, in rank order); `rejoin`:
  // in process (StartGenerationAction::rejoin).
  void StartGeneration(std::vector<NodeId> nodes, bool rejoin, TimePoint now,
                       std::vector<JobAction>& out);
  // The facts of a restart after `failure` for ChooseRoute.
  RouteFacts FactsFor(const Failure& failure, RecoveryAction action,
                      const std::vector<NodeId>& evict) const;
  void FireDueFaults(TimePoint now, std::vector<JobAction>& out);
  void Finish(int code, std::string reason, TimePoint now, std::vector<JobAction>& out);
  std::vector<NodeId> HealthyNodes() const;
  // Healthy registered nodes outside this generation, and not `leaving`: a
  // replacement now.
  int SparesAvailable(const std::vector<NodeId>& leaving = {}) const;
  // The first rank a member of this generation runs.
  Rank FirstRankOf(NodeId member) const;
  Incident* OpenIncident();
  // The current generation's ranks (fewer than the job's when it shrank).
  int world_size() const { return static_cast<int>(members_.size()) * options_.ranks_per_node; }

  bool configured_ = false;  // a Configure came: the other inputs count
  JobMachineOptions options_;
  std::vector<ExternalFault> external_;
  TimePoint start_;
  EttrLedger ledger_;
  HangDetector hang_;
  HeartbeatMonitor heartbeats_;
  LossAnomalyDetector loss_;
  AnomalyPolicy anomaly_;
  RecoveryPolicy recovery_;

  JobPhase phase_ = JobPhase::kWaitingForNodes;
  std::map<NodeId, Node> nodes_;
  Generation generation_;
  std::vector<NodeId> members_;  // nodes of the current generation, in rank order
  std::set<NodeId> member_set_;  // the same, for lookups
  std::set<NodeId> awaiting_stop_;
  std::vector<StepNumber> rank_step_;  // by rank
  // How many ranks are at each step of rank_step_: the job's step (the
  // lowest) and the highest without a walk over every rank.
  std::map<StepNumber, int> ranks_at_step_;
  std::vector<bool> rank_ready_, rank_done_;
  int ranks_ready_ = 0;  // of rank_ready_
  // The ledger's productive total when the first report of each step of
  // this generation arrived (since the newest copy): a copy whose report
  // comes late is safe as of its step, not of its report.
  std::map<StepNumber, Duration> step_productive_;
  std::vector<bool> rank_rejoins_;        // ready, and said it rejoins in place
  std::vector<bool> rank_from_tiers_;     // ... restoring its part from the tiers
  std::vector<bool> rank_deterministic_;  // ready, and said it is deterministic
  // Each rank's newest loss of this generation and its step (the losses of
  // an anomalous step, for its replay).
  std::vector<std::pair<StepNumber, double>> rank_loss_;
  // The incident whose step is being replayed, and the world size then.
  int replay_incident_ = 0;
  int replay_world_ = 0;
  Generation replay_generation_;
  double max_restore_s_ = 0;
  StepNumber job_step_;
  // The job's step when an in-process restart or regrow was decided (-1:
  // none pending): ranks ready at an older step restored a checkpoint, and
  // the time trained since it is recompute.
  StepNumber in_process_from_{-1};
  // When every rank of this generation was ready, and how long the first
  // step of the latest generation took from then (StalledSince's estimate
  // of a step before the job has measured any).
  std::optional<TimePoint> all_ready_at_;
  std::optional<Duration> first_step_took_;
  StepNumber start_step_;  // step the current generation started from
  // Some rank of this generation did not say what it restored
  // (WorkerReady::start_step_unknown), and the first step reported since has
  // not said it yet (restore_unknown_): the lowest step reported meanwhile.
  bool unannounced_ = false;
  bool restore_unknown_ = false;
  std::optional<StepNumber> first_reported_;
  // The fewest steps rank 0 advanced by in one report (a program that
  // prints every 10th step: 10); unset until it advanced twice. A program
  // that did not say what it restored restored the step one stride before
  // the first it reports.
  std::optional<int64_t> step_stride_;
  // A generation of such a program failed: the ledger's rollback waits for
  // the restore point (its own checkpoints are none the ledger heard of), and
  // these are its step_productive_.
  std::optional<std::map<StepNumber, Duration>> rollback_pending_;
  bool productive_ = false;  // the current generation has completed a step
  double last_loss_ = 0;
  CheckpointBook book_;
  // What a rollback's book kept (another run's steps after its target), for
  // the restore text of the generation that recovers.
  std::vector<std::string> rollback_notes_;
  std::set<std::string> fired_;
  std::map<std::string, TimePoint> fired_at_;  // fault id -> time, current generation
  std::vector<std::pair<Generation, FaultFiredEvent>> fired_events_;
  // Collective failures the ranks reported themselves while the generation
  // stopped: which of them was the culprit's is the pairwise test's to say.
  std::vector<WorkerExitEvent> stopping_collective_;
  std::optional<TimePoint> wait_until_;  // backoff before the next start
  // While kWaiting for nodes: when the job gives up (replacement_timeout).
  std::optional<TimePoint> replacement_deadline_;
  StepNumber restore_step_{-1};
  StepNumber abandoned_from_{-1};
  std::vector<StepNumber> skip_steps_;
  std::vector<Incident> incidents_;
  bool incident_open_ = false;
  bool persist_failure_reported_ = false;  // the first persistence failure is an incident
  bool hang_held_ = false;  // CheckHang found a member quiet: no verdict until it is heard

  // Two replicas disagreed and one suspect node was swapped for a spare: the
  // next check of a later generation decides which was corrupt.
  struct SdcRecompute {
    Generation generation;  // the one that disagreed
    NodeId kept, swapped;
    std::string reason;

    template <class Archive>
    void serialize(Archive& ar) {
      ar(generation, kept, swapped, reason);
    }
  };
  std::optional<SdcRecompute> sdc_recompute_;
  StragglerDetector stragglers_;
  std::vector<StragglerReport> stragglers_kept_;
  std::vector<Resize> resizes_;
  SdcChecker sdc_;
  std::vector<std::pair<Rank, std::string>> stacks_;  // of the current generation's hang
  std::deque<Duration> step_times_;                   // the job's recent step intervals
  std::optional<TimePoint> last_job_step_at_;
  int64_t total_steps_ = 0;  // as the workers say; 0: unknown
  // The pairwise test in progress (kTesting).
  std::optional<PairwiseTest> pairwise_;
  int pair_tests_ = 0;  // tests started in this run (ids)
  std::vector<std::pair<NodeId, NodeId>> pairs_asked_;
  std::vector<PairResult> pair_results_;
  std::optional<TimePoint> pairwise_deadline_;
};

}  // namespace endure::core
