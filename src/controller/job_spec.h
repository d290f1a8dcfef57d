// The job spec: the TOML file that describes one training job to `endure run`
// and `endure controller` — what to run and on how many nodes, when to
// checkpoint, how to detect failures, how to recover, and which faults to
// inject. docs/job_spec.md documents every key.
//
// Parsing is strict: unknown keys and tables, wrong types, bad durations and
// values out of range are refused with an InvalidArgument whose message reads
// "FILE:LINE: key 'section.key': what to fix". Defaults are applied for every
// optional key, so a parsed JobSpec is complete and valid.
//
// Pure functions apart from LoadJobSpec, which reads the file; all are safe to
// call from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "contract/worker_contract.h"
#include "core/job_machine.h"
#include "faults/fault.h"

namespace endure::controller {

// Bounds that keep an absurd spec from crashing or exhausting the machine:
// refused with the file, line and key like any other bad value.
inline constexpr int kMaxNodes = 100'000;
inline constexpr int kMaxRanksPerNode = 1024;                  // workers (GPUs) of one machine
inline constexpr int kMaxWorldSize = contract::kMaxWorldSize;  // nodes x ranks_per_node
inline constexpr int kMaxDetectionWindow = 100'000;            // hang_window, loss_window (steps)
inline constexpr Duration kMaxStopTimeout = std::chrono::hours(1);  // grace_period, stack_timeout
inline constexpr Duration kMaxControllerGrace = std::chrono::hours(24 * 30);
inline constexpr int64_t kMaxSpecBytes = 1 << 20;  // the spec file
// `endure run` starts every node (an agent) and every rank (a worker) on this
// one machine; beyond these it refuses and points to `endure controller` and
// `endure agent` across machines.
inline constexpr int kMaxEmbeddedNodes = 256;
inline constexpr int kMaxEmbeddedWorldSize = 1024;
// The etcd that `endure run` starts for [control_plane] standby (Debian's
// etcd-server).
inline constexpr char kEtcdBinary[] = "/usr/bin/etcd";

// [checkpoint]
struct CheckpointSpec {
  int64_t every_steps = 0;  // 0: no checkpoints
  std::string dir;          // default: STATE_DIR/ckpt
  int keep = 3;             // durable checkpoints kept (>= 1)
  // Checkpoints go to node memory (T0) every `every_steps`, are replicated
  // to a peer node's memory (T1, when `replicas` is 1) and persisted (T2).
  int64_t persist_every_steps = 0;  // persist every N-th step; 0: every checkpoint
  int replicas = 1;                 // peer-memory replicas of each node's checkpoint (0 or 1)
  int64_t memory_budget_bytes = 0;  // T0 + T1 bytes per node; 0: no limit
  // false: no memory tiers; rank 0 writes each checkpoint to `dir` inside
  // the step, synchronously (the baseline the benchmark compares with).
  bool memory = true;
};

// [detection]
struct DetectionSpec {
  Duration hang_timeout_floor = std::chrono::seconds(2);
  double hang_timeout_k = 3.0;
  int hang_window = 100;
  Duration startup_timeout = std::chrono::seconds(60);
  Duration heartbeat_timeout = std::chrono::seconds(10);
  bool loss_anomalies = true;
  double loss_spike_z = 8.0;         // robust deviations (1.4826 x MAD) above the median
  double loss_spike_min_jump = 1.0;  // ... and at least this x |median| above it
  int loss_window = 200;
  core::AnomalyRecurrence on_recurrence = core::AnomalyRecurrence::kSkipStep;
  std::string log_rules;  // a file or directory; empty: the shipped config/log_rules/
  Duration stack_timeout = std::chrono::seconds(2);
  // Step progress read from worker output, for programs without the client
  // library: an RE2 pattern with a named group `step` (steps completed) and
  // optionally `loss`; empty: none. See docs/progress_pattern.md.
  std::string progress_pattern;
  // A phase the workers name (session.phase("eval")), the first time it is
  // seen: how long it may take (later ones: learned, as for steps).
  Duration phase_timeout = std::chrono::minutes(10);
  // Fail-slow stragglers: a rank whose compute time before the allreduce
  // exceeds (1 + straggler_theta) x the median in straggler_min_slow of its
  // last straggler_window steps is flagged with its node.
  bool stragglers = true;
  double straggler_theta = 0.10;
  int straggler_window = 20;
  int straggler_min_slow = 12;
  // ... and only by more than this much compute a step (timer resolution and
  // scheduling below it).
  Duration straggler_min_excess = std::chrono::milliseconds(10);
  // [anomaly] on_data_spike: a deterministic program's loss spike that its
  // replay reproduced.
  core::DataSpikeAction on_data_spike = core::DataSpikeAction::kContinue;
  // Every this many steps each rank fingerprints its parameters after the
  // optimizer step; the replicas must agree bit for bit. 0: no SDC check.
  int64_t sdc_check_every = 0;
};
// [isolation]: what the job does about the nodes its detectors suspect.
struct IsolationSpec {
  bool over_evict = true;     // a hang's stack outliers: evict their nodes
  bool pairwise_test = true;  // ambiguous collective failures: test pairs of nodes
  Duration pairwise_timeout = std::chrono::seconds(10);  // per round
  double pairwise_slow_factor = 3.0;
  // Multi-strike quarantine of soft causes (hard ones quarantine at once).
  int soft_strikes = 3;
  Duration soft_window = std::chrono::hours(24);
  // The straggler decision's estimates until the job measures its own.
  Duration restart_cost = std::chrono::seconds(30);
  Duration replacement_wait = std::chrono::minutes(5);
  Duration straggler_horizon = std::chrono::hours(1);
  // Each node runs its health check before it joins or rejoins.
  bool health_check = true;
};
// [cluster]: what jobs on the same nodes share.
struct ClusterSpec {
  // The node health ledger's directory (nodes.db), shared by every job
  // whose spec names it; empty: the job's own state_dir.
  std::string state_dir;
};

// [recovery]
struct RecoverySpec {
  int max_restarts = 20;  // within restart_window; 0: unlimited
  Duration restart_window = std::chrono::hours(1);
  Duration backoff_initial = std::chrono::seconds(1);
  Duration backoff_max = std::chrono::seconds(30);
  Duration grace_period = std::chrono::seconds(2);  // SIGTERM -> SIGKILL
  int structural_repeats = 3;
  int evict_node_after = 2;
  int startup_repeats = 3;
  Duration repair_delay = std::chrono::seconds(5);  // embedded mode: replacement node
  // After a failure, how long to wait for enough nodes before giving up
  // (exit 3); 0: forever (core::JobMachineOptions::replacement_timeout).
  Duration replacement_timeout = std::chrono::minutes(10);
  // Agents keep a warm standby worker per rank, so that a restart does not
  // wait for the program to load. The program must call
  // endure::AwaitStandbyAssignment() (endure-train does).
  bool warm_standby = false;
  // In-process restart (core/recovery_route.h): when a rank fails, the
  // others keep their process and state and rejoin the next generation;
  // only the failed ones start, taking the state from a peer. Used when
  // every other rank said it rejoins (endure-train does).
  bool in_process = true;
  // Cause -> recovery path, the defaults ("node_lost" -> evict) merged with
  // the spec's [recovery] paths.
  std::map<std::string, core::RecoveryPath> paths;
};

// [control_plane]
struct ControlPlaneSpec {
  // How long the agents keep their workers training while they cannot reach
  // the controller (they reconnect meanwhile and report what happened);
  // past it they stop the workers as on SIGTERM and exit. `endure run`
  // passes it to its agents (--controller-grace).
  Duration controller_grace = std::chrono::minutes(5);
  // `endure run` starts a local etcd and two controllers, a leader and a
  // standby that takes over through an etcd lease when the leader dies
  // (`endure controller --etcd`); the agents get both addresses.
  bool standby = false;
  // The leadership lease: a standby takes over within about this long of
  // the leader's death. Whole seconds in [2s, 1h].
  Duration lease = std::chrono::seconds(5);
};

// [faults_schedule]: a seeded Poisson schedule, already expanded into
// JobSpec::faults; kept for the report and for reproducing the run.
struct FaultScheduleSpec {
  Duration mtbf{0};
  uint64_t seed = 1;
  faults::FaultKind kind = faults::FaultKind::kKill;
  Duration horizon = std::chrono::minutes(10);
  double node_loss_share = 0;  // this share of the faults are kill-agent (a node lost)
};

struct JobSpec {
  std::string path;  // the file it was read from (for messages)
  // The text's XXH3-64, in hex: the same spec (a controller carries on an
  // unfinished run only under the spec that began it).
  std::string digest;

  // [job]
  std::string name;                  // [A-Za-z0-9_.-]+
  std::vector<std::string> command;  // argv of every worker, non-empty
  int nodes = 1;
  int ranks_per_node = 1;
  // Spare nodes: `endure run` starts this many agents beyond `nodes`; they
  // register, pass the health check and (with warm_standby) keep standby
  // workers, so that a lost node's ranks move to one at once.
  int spares = 0;
  // Elastic: with nodes lost and no spare for them, the job goes on with as
  // few as this many nodes (the same global batch, more micro-batches per
  // rank) and grows back as nodes return. 0: it needs all `nodes`.
  int min_nodes = 0;
  std::string state_dir;                   // as written: relative to the current directory
  std::map<std::string, std::string> env;  // extra worker environment
  std::string listen = "127.0.0.1:0";      // controller gRPC address
  std::string token;                       // empty: generated at start
  // Mutual TLS between every process of the job (gRPC and the replica link)
  // even on loopback: `endure run` makes the job's certificates under
  // STATE_DIR/tls (common/tls.h). Beyond loopback TLS is required either way.
  bool tls = false;

  CheckpointSpec checkpoint;
  DetectionSpec detection;
  RecoverySpec recovery;
  ControlPlaneSpec control_plane;
  IsolationSpec isolation;
  ClusterSpec cluster;

  // [[faults]] in file order, then the expanded [faults_schedule] (ids
  // "sched-N"). Every fault is valid and ids are unique.
  std::vector<faults::Fault> faults;
  std::optional<FaultScheduleSpec> schedule;

  // The line of every key the file set ("job.nodes" -> 4), for messages of
  // checks made after parsing (ValidateForEmbeddedRun).
  std::map<std::string, int> key_lines;

  int world_size() const { return nodes * ranks_per_node; }
};

// Parses the spec text read from `path` (used in messages only).
Result<JobSpec> ParseJobSpec(std::string_view text, const std::string& path);

// Reads and parses the spec at `path`. A file that cannot be read, or is
// larger than kMaxSpecBytes, is an InvalidArgument naming the path.
Result<JobSpec> LoadJobSpec(const std::string& path);

// The limits of `endure run`, which starts every node and rank on this
// machine: at most kMaxEmbeddedNodes nodes and kMaxEmbeddedWorldSize ranks.
// InvalidArgument "FILE:LINE: key 'job.nodes': ..." saying to run `endure
// controller` and `endure agent` across machines for more. [control_plane]
// standby needs kEtcdBinary.
Status ValidateForEmbeddedRun(const JobSpec& spec);

// The decision cores' options for `spec`: nodes and ranks, the hang and loss
// detectors, the anomaly and recovery policies. Valid for every parsed spec.
core::JobMachineOptions MachineOptions(const JobSpec& spec);

// The faults the controller fires itself, as JobMachine takes them: every
// kill-agent fault and every fault keyed to a time (`at`). Step-keyed worker
// faults are left to the workers (faults::FaultsForRank). A kill-agent fault
// names its node ("nodeN") or a rank; either becomes the node's first rank.
std::vector<core::ExternalFault> ExternalFaults(const JobSpec& spec);

}  // namespace endure::controller
