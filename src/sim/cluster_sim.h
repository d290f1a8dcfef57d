// A deterministic simulation of the whole cluster (issue 28, item 5): the
// controller's decision core (core::JobMachine) and N simulated nodes, each
// with its agent's decision core (core::NodeMachine) and its ranks of a
// data-parallel job running in lockstep, on one simulated clock and a
// simulated network, driven by a seed. Workers report to their agent's core
// by datagram (the worker contract's encoding, the gate's credential); what
// the core transmits goes up the node's stream and is read by the
// controller's reader (core::ReadAgentEvent); commands come down the stream
// and are carried out where the core says so. The seed chooses the faults
// (worker crashes, hangs, nodes lost silently or with a closed stream,
// delayed messages, streams that break — what is in flight either way is
// lost, the agent keeps what happens meanwhile and resumes on a new stream,
// judged as the controller's shell judges a resume —, partitions between a
// node and the controller that heal — the node's reports held and
// delivered late, its agent fenced and back as a fresh node when the
// partition outlasted the heartbeat timeout —, failing durable writes,
// controller restarts that rebuild the machine from its journal, every
// stream breaking with them) and the network's delays; every input is
// journaled as the controller journals it (core::EncodeEvent). After every
// input the invariants are checked:
//
//   ledger     the ETTR ledger's categories sum to its wall time, which is
//              the simulated time the machine has seen;
//   eviction   no node is evicted that had no fault of its own;
//   retention  the newest durable checkpoint the machine's checkpoint book
//              holds is on the simulated disk (the book's commits,
//              retention and restore points are carried out here as the
//              controller's shell carries them out: manifests written,
//              steps removed, a restore plan's copies checked, each result
//              an input);
//   replay     the journal, replayed into a fresh machine, gives the same
//              state (at every controller restart and at the end);
//   outcome    the job finishes (exit 0) within the simulated deadline, and
//              every rank's parameters (a hash chain over the steps it
//              trained, restored from checkpoints or a peer) equal those of
//              a run without faults: no step skipped, none applied twice.
//
// The same seed gives the same run, event for event (the result's
// fingerprint). What it does not model: the memory tiers (every node
// persists its ranks' shards of each checkpointed step to the simulated
// disk, and a generation restores what the book's plan chose there) and the
// workers' datagrams lost on the node (UDP on one host).
// Single-threaded; no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace endure::sim {

// A bug the simulation plants in its own cluster, to show that the
// invariants find one (cluster_sim_test).
enum class PlantedBug {
  kNone,
  // The disk removes the newest durable checkpoint where retention named
  // an older one.
  kRetentionDropsNewest,
  // A restarted rank resumes one step after the checkpoint it restored.
  kRestoreSkipsAStep,
};

struct ClusterSimOptions {
  int nodes = 3;           // a generation's nodes
  int ranks_per_node = 2;  // ranks on each node
  int spares = 1;          // nodes registered beyond `nodes`
  int64_t total_steps = 120;
  int ckpt_every = 10;  // a durable checkpoint every this many steps
  int keep = 2;         // durable checkpoints retention keeps
  bool in_process = true;
  int max_faults = 4;  // the seed draws 0 to this many
  PlantedBug bug = PlantedBug::kNone;
};

struct ClusterSimResult {
  uint64_t seed = 0;
  std::string violation;  // empty: every invariant held
  bool finished = false;
  int exit_code = -1;
  int64_t inputs = 0;  // events stepped into the machine
  int faults = 0;
  int controller_restarts = 0;
  int64_t messages_lost = 0;  // in flight on a stream that broke
  int generations = 0;
  double ettr = 0;
  // Every input and action, one line each ("12.345 > start_generation ...").
  std::vector<std::string> trace;
  // A hash of the trace: the same seed and options give the same value.
  uint64_t fingerprint = 0;
};

ClusterSimResult RunClusterSim(uint64_t seed, const ClusterSimOptions& options);

}  // namespace endure::sim
