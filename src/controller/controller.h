// The controller process: a gRPC server that agents attach to, and one event
// loop that owns core::JobMachine. Events from the agents' streams are
// queued with their arrival time; the loop steps the machine with them (and
// with ticks at the machine's deadlines) and carries out its actions by
// sending commands down the streams. Controller state — the job, its
// generations, incidents and ledger — goes to SQLite under the state
// directory, the live status to STATE_DIR/status.json and over HTTP
// (/metrics, /api/status, /), and the final report to STATE_DIR/report.json.
// The loop's logic is ControllerShell (controller_shell.h), on a Transport
// (transport.h: gRPC here, a fake in tests) and a Clock.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/duration.h"
#include "common/status.h"
#include "controller/job_spec.h"

namespace endure::controller {

struct ControllerOptions {
  JobSpec spec;
  std::string state_dir;
  std::string listen = "127.0.0.1:0";
  std::string token;         // every agent must present it
  std::string address_file;  // if set, the bound host:port is written here
  // HTTP: /metrics (Prometheus), /api/status (JSON), / (dashboard). The
  // bound host:port is written to STATE_DIR/http.addr.
  std::string http_listen = "127.0.0.1:0";
  // Mutual TLS on the agents' gRPC streams: DIR/ca.pem, controller.pem and
  // controller.key from `endure certs` (docs/security.md). Every agent must
  // present a certificate of the job's CA that names the node it registers.
  // Required when `listen` is beyond loopback; empty: plain TCP.
  std::string tls_dir;
  // Begin a new run even when the state directory's newest run is
  // unfinished (`endure run` starting afresh: its agents are new too).
  // Otherwise such a run is carried on (ControllerShell::CarryOn).
  bool new_run = false;
  // Standby controllers (`--etcd`, docs/deploy.md): etcd's client
  // endpoints. With them this controller stands by until it holds the job's
  // leader key through a lease of `lease` (leader_election.h), then runs the
  // job on `state_dir` as alone; `listen` must name its port (the agents
  // list every controller's address). It exits at once (1) should the lease
  // lapse, and exits with the job's code when the job ends under another
  // leader. Empty: it leads alone.
  std::vector<std::string> etcd;
  Duration lease = std::chrono::seconds(5);
  // The decision core is snapshotted and the journal cut behind it once the
  // journal since the last snapshot is as large as that snapshot and at
  // least this large (ControllerShell's SnapshotDue): a restart replays at
  // most about a snapshot's worth of journal, and the disk takes at most
  // about twice what the journal alone would.
  uint64_t snapshot_after_bytes = 4 << 20;
};

// Runs the job to its end. Returns its exit code: 0 when training completed,
// 3 when the controller gave up (the report says why).
Result<int> RunController(const ControllerOptions& options);

}  // namespace endure::controller
