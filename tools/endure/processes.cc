// `endure controller` and `endure agent`: the two long-running processes,
// as started by `endure run` on one machine or by Slurm/Kubernetes on many.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "agent/agent.h"
#include "common/duration.h"
#include "common/env.h"
#include "common/names.h"
#include "common/shipped_files.h"
#include "controller/controller.h"
#include "controller/etcd_client.h"
#include "controller/leader_election.h"
#include "tools/endure/verbs.h"

namespace endure::cli {
namespace {

// The job token: ENDURE_TOKEN, else the first line of --token-file.
Result<std::string> ReadToken(const std::string& token_file) {
  if (!token_file.empty()) {
    Result<std::string> text = Env::Default()->ReadFile(token_file);
    if (!text.ok()) return InvalidArgument("--token-file: " + text.status().message());
    std::string token = text->substr(0, text->find_first_of("\r\n"));
    if (token.empty()) return InvalidArgument("--token-file: '" + token_file + "' is empty");
    return token;
  }
  const char* env = std::getenv("ENDURE_TOKEN");
  if (env != nullptr && *env != '\0') return std::string(env);
  return InvalidArgument("no job token: set ENDURE_TOKEN or pass --token-file");
}

int Fail(const char* verb, const Status& st) {
  std::fprintf(stderr, "endure %s: %s\n", verb, st.message().c_str());
  return st.code() == StatusCode::kInvalidArgument ? kExitUsage : kExitInternal;
}

// This host's node name (NodeNameOfHost of its host name).
Result<std::string> ShortHostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) {
    return InvalidArgument("cannot read the host's name; pass --node-id NAME");
  }
  return NodeNameOfHost(buf);
}

}  // namespace

Verb AddControllerVerb(CLI::App& root) {
  struct Flags {
    std::string spec, state_dir, listen, token_file, address_file, tls_dir, http = "127.0.0.1:0";
    bool new_run = false;
    std::string etcd, lease = "5s";
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = root.add_subcommand(
      "controller",
      "Run a job's controller (one per job); SIGTERM or SIGINT stops the job (exit 128 + N)");
  cmd->add_option("--spec", flags->spec, "Job spec (TOML)")->required();
  cmd->add_option("--state-dir", flags->state_dir, "State directory (default: the spec's)");
  cmd->add_option("--listen", flags->listen, "gRPC address (default: the spec's, 127.0.0.1:0)");
  cmd->add_option("--token-file", flags->token_file,
                  "File holding the job token (else ENDURE_TOKEN)");
  cmd->add_option("--address-file", flags->address_file, "Write the bound host:port here");
  cmd->add_option("--tls-dir", flags->tls_dir,
                  "Mutual TLS with the agents: DIR/ca.pem, controller.pem, controller.key from "
                  "`endure certs`; required beyond loopback");
  cmd->add_option(
         "--http", flags->http,
         "HTTP address for /metrics, /api/status and / (bound one in STATE_DIR/http.addr); "
         "beyond loopback every request needs the job token (Authorization: Bearer, "
         "or ?token=)")
      ->capture_default_str();
  cmd->add_flag("--new-run", flags->new_run,
                "Begin a new run even when the state directory's newest run is unfinished "
                "(by default a controller carries such a run on: it replays its journal and "
                "the agents resume into it)");
  cmd->add_option("--etcd", flags->etcd,
                  "Standby controllers: etcd's client endpoints HOST:PORT[,HOST:PORT]; the "
                  "controller stands by until it holds the job's leadership lease, then runs "
                  "the job on the state directory (--listen must name a port)");
  cmd->add_option("--lease", flags->lease,
                  "With --etcd: the leadership lease (whole seconds, at least 2s); a standby "
                  "takes over within about this long of the leader's end")
      ->capture_default_str();
  return {cmd, [flags] {
            Result<controller::JobSpec> spec = controller::LoadJobSpec(flags->spec);
            if (!spec.ok()) return Fail("controller", spec.status());
            Result<std::string> token = ReadToken(flags->token_file);
            if (!token.ok()) return Fail("controller", token.status());
            controller::ControllerOptions o;
            o.spec = *spec;
            o.state_dir = flags->state_dir.empty() ? spec->state_dir : flags->state_dir;
            o.listen = flags->listen.empty() ? spec->listen : flags->listen;
            o.token = *token;
            o.address_file = flags->address_file;
            o.http_listen = flags->http;
            o.tls_dir = flags->tls_dir;
            o.new_run = flags->new_run;
            if (!flags->etcd.empty()) {
              Result<std::vector<std::string>> etcd =
                  controller::ParseEtcdEndpoints(flags->etcd, "--etcd");
              if (!etcd.ok()) return Fail("controller", etcd.status());
              o.etcd = *etcd;
              Result<Duration> lease = ParseDuration(flags->lease);
              if (!lease.ok()) {
                return Fail("controller", InvalidArgument("--lease: " + lease.status().message()));
              }
              o.lease = *lease;
              controller::LeaderElectionOptions election{.lease_ttl = o.lease};
              if (Status st = election.Validate(); !st.ok()) {
                return Fail("controller", InvalidArgument("--" + st.message()));
              }
            }
            Result<int> code = controller::RunController(o);
            if (!code.ok()) return Fail("controller", code.status());
            return *code;
          }};
}

Verb AddAgentVerb(CLI::App& root) {
  auto o = std::make_shared<agent::AgentOptions>();
  auto token_file = std::make_shared<std::string>();
  CLI::App* cmd = root.add_subcommand("agent", "Run a node's agent (one per node)");
  cmd->add_option("--controller", o->controller,
                  "Controller address host:port; with standby controllers, every one of the "
                  "job's, comma-separated (the agent moves to whichever leads)")
      ->required();
  cmd->add_option("--node-id", o->node_id,
                  "This node's name, e.g. node0 (default: the host's name, up to its first dot)");
  cmd->add_option("--ranks", o->slots, "Ranks this node runs")->capture_default_str();
  cmd->add_option("--host", o->host, "Address of this node's workers")->capture_default_str();
  cmd->add_option("--work-dir", o->work_dir, "Logs and the worker socket (default ./endure-NODE)");
  cmd->add_option("--checkpoint-root", o->checkpoint_root,
                  "A relative [checkpoint] dir of the job is under DIR on this host (default: "
                  "the agent's working directory)");
  cmd->add_option(
      "--log-rules", o->log_rules,
      "Log rules: a file, or a directory of *.toml files (default: the shipped config/log_rules/)");
  cmd->add_option("--kernel-log", o->kernel_log,
                  "The node's kernel log, whose hardware records (NVIDIA Xids, NIC, PCIe AER, "
                  "machine checks) join a failed worker's output for the log rules; 'none': not "
                  "read (ENDURE_KERNEL_LOG sets the default)")
      ->capture_default_str();
  cmd->add_option("--token-file", *token_file, "File holding the job token (else ENDURE_TOKEN)");
  cmd->add_option("--tls-dir", o->tls_dir,
                  "Mutual TLS: DIR/ca.pem, NODE.pem, NODE.key from `endure certs`; required when "
                  "--controller or --host is beyond loopback");
  cmd->add_flag("--standby", o->standby,
                "Keep a warm standby worker per rank (the program must call "
                "endure::AwaitStandbyAssignment, as endure-train does)");
  auto no_health = std::make_shared<bool>(false);
  cmd->add_flag("--no-health-check", *no_health,
                "Register without the node's health check (known-answer matmul, memory, disk, "
                "loopback collective); ENDURE_HEALTH_FAULT=matmul,memory,disk,loopback forces "
                "probes to fail, for tests (NODE=PROBES;NODE=PROBES: only on the nodes named)");
  auto grace = std::make_shared<std::string>("5m");
  cmd->add_option("--controller-grace", *grace,
                  "How long the workers keep training while the controller cannot be reached "
                  "(the agent reconnects meanwhile); past it they are stopped and the agent exits")
      ->capture_default_str();
  return {cmd, [o, token_file, grace, no_health] {
            Result<Duration> controller_grace = ParseDuration(*grace);
            if (!controller_grace.ok()) {
              return Fail("agent", InvalidArgument("--controller-grace: " +
                                                   controller_grace.status().message()));
            }
            Result<std::string> token = ReadToken(*token_file);
            if (!token.ok()) return Fail("agent", token.status());
            agent::AgentOptions opts = *o;
            // The environment's kernel log unless the flag named one.
            if (const char* k = std::getenv("ENDURE_KERNEL_LOG");
                k != nullptr && *k && opts.kernel_log == agent::AgentOptions{}.kernel_log) {
              opts.kernel_log = k;
            }
            if (opts.node_id.empty()) {
              // Named by its host: what Slurm and Kubernetes call the node.
              Result<std::string> host = ShortHostName();
              if (!host.ok()) return Fail("agent", host.status());
              opts.node_id = *host;
            }
            opts.token = *token;
            opts.controller_grace = *controller_grace;
            opts.health_check = !*no_health;
            if (const char* fault = std::getenv("ENDURE_HEALTH_FAULT"); fault && *fault) {
              Result<std::set<agent::HealthProbe>> probes =
                  agent::ParseHealthFault(agent::HealthFaultFor(fault, opts.node_id));
              if (!probes.ok()) {
                return Fail("agent",
                            InvalidArgument("ENDURE_HEALTH_FAULT: " + probes.status().message()));
              }
              opts.health_faults = *probes;
            }
            if (opts.work_dir.empty()) opts.work_dir = "endure-" + opts.node_id;
            if (opts.log_rules.empty()) {
              Result<std::string> rules = FindShippedConfig("log_rules", "--log-rules PATH");
              if (!rules.ok()) return Fail("agent", rules.status());
              opts.log_rules = *rules;
            }
            Status st = agent::RunAgent(opts);
            if (!st.ok()) return Fail("agent", st);
            return kExitOk;
          }};
}

}  // namespace endure::cli
