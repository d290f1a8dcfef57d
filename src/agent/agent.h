// Agent: Endure's per-node process. It registers with the controller over
// gRPC and holds one bidirectional stream: it carries out the controller's
// commands (start a generation of workers, stop it, dump stacks, inject a
// fault, shut down) and sends up what happens on the node (workers started,
// ready, steps, exits with their classified last words, stacks, fired
// faults). Workers report to it over a Unix datagram socket through the
// client library (include/endure/client.h).
#pragma once

#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "agent/health_check.h"
#include "common/duration.h"
#include "common/status.h"

namespace endure::agent {

struct AgentOptions {
  // host:port of the controller; with standby controllers, every one of
  // the job's, comma-separated: the agent attaches to the one that leads.
  std::string controller;
  std::string node_id;             // e.g. "node0"
  int slots = 1;                   // ranks this node can run
  std::string token;               // the job token (ENDURE_TOKEN or --token-file)
  std::string host = "127.0.0.1";  // address this node's workers are reachable at
  std::string work_dir;            // logs/ and the worker socket go here
  std::string log_rules;           // the log rules: a file or a directory of them
  // The node's kernel log (agent/kernel_log.h): its hardware records join a
  // failed worker's last lines; "" or "none": not read. Unreadable (a
  // container without access): the agent says so once and goes on.
  std::string kernel_log = "/dev/kmsg";
  // Where a relative [checkpoint] dir of the job (T2) is, on this host: the
  // controller sends the spec's directory as written, and the agent resolves
  // it here (--checkpoint-root); empty: the agent's working directory.
  std::string checkpoint_root;
  // Keep one warm standby per rank, started ahead of the next generation
  // (the program must call endure::AwaitStandbyAssignment, as endure-train
  // does); a restart then skips loading the program.
  bool standby = false;
  // Mutual TLS on every connection of this agent (gRPC to the controller,
  // the replica link both ways): DIR/ca.pem, NODE.pem and NODE.key from
  // `endure certs` (docs/security.md). Required when the controller or this
  // node's host is beyond loopback; empty: plain TCP.
  std::string tls_dir;
  // How long the agent rides out a controller it cannot reach: its stream
  // broke (or the controller closed it without a shutdown), and the workers
  // keep training while it reconnects with backoff, keeping what happens
  // meanwhile for the controller. Past this long without one it stops the
  // workers as on SIGTERM and exits (--controller-grace; [control_plane]
  // controller_grace under `endure run`).
  Duration controller_grace = std::chrono::minutes(5);
  // Run the node's health check (agent/health_check.h) before each fresh
  // registration; a node that fails it is refused by the controller.
  bool health_check = true;
  // Probes forced to fail, for tests (ENDURE_HEALTH_FAULT=matmul,disk).
  std::set<HealthProbe> health_faults;

  Status Validate() const;
};

// Runs the agent until the controller tells it to shut down (OK), the
// controller stays out of reach for longer than `controller_grace`
// (kUnavailable), or the token is refused (kInvalidArgument). Workers never
// outlive it.
Status RunAgent(const AgentOptions& options);

}  // namespace endure::agent
