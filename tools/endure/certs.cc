// `endure certs --dir DIR --nodes node0,node1 [--nodes-count N] [--host H ...]
// [--valid 365d]`: makes a job's private CA and the certificates for mutual
// TLS between its processes (docs/security.md): DIR/ca.pem + ca.key and
// NAME.pem + NAME.key for the controller and each node. Run again on the
// same DIR to add nodes under the same CA. The work is in common/tls; this
// file parses flags and says what was written.
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/duration.h"
#include "common/env.h"
#include "common/names.h"
#include "common/tls.h"
#include "tools/endure/verbs.h"

namespace endure::cli {
namespace {

constexpr int kMaxNodesCount = 100000;

struct CertsFlags {
  std::string dir;
  std::vector<std::string> nodes;
  int nodes_count = -1;  // -1: not given
  std::vector<std::string> hosts;
  std::string valid = "365d";
};

Result<tls::CertRequest> BuildRequest(const CertsFlags& flags) {
  tls::CertRequest r;
  r.dir = flags.dir;
  Result<Duration> valid = ParseDuration(flags.valid);
  if (!valid.ok()) return InvalidArgument("--valid: " + valid.status().message());
  if (*valid <= Duration::zero()) return InvalidArgument("--valid: must be positive");
  r.validity = *valid;
  if (flags.nodes_count == 0 || flags.nodes_count < -1 || flags.nodes_count > kMaxNodesCount) {
    return InvalidArgument("--nodes-count: must be between 1 and " +
                           std::to_string(kMaxNodesCount) + ", got " +
                           std::to_string(flags.nodes_count));
  }
  std::vector<std::string> names = flags.nodes;
  for (int i = 0; i < flags.nodes_count; ++i) names.push_back("node" + std::to_string(i));
  // --nodes and --nodes-count may name a node twice; it gets one certificate.
  std::set<std::string> seen;
  for (const std::string& name : names) {
    ENDURE_RETURN_IF_ERROR(CheckNodeName(name, "--nodes"));
    if (name == tls::kControllerName || name == "ca") {
      return InvalidArgument("--nodes: '" + name + "' is reserved (" + name + ".pem is the " +
                             (name == "ca" ? "CA's" : "controller's") +
                             " certificate): pick another node name");
    }
    if (seen.insert(name).second) r.nodes.push_back(name);
  }
  if (r.nodes.empty()) return InvalidArgument("no nodes: give --nodes NAME,... or --nodes-count N");
  for (const std::string& host : flags.hosts) {
    ENDURE_RETURN_IF_ERROR(tls::CheckSanHost(host, "--host"));
  }
  r.hosts = flags.hosts;
  return r;
}

int Run(const CertsFlags& flags) {
  Result<tls::CertRequest> request = BuildRequest(flags);
  if (!request.ok()) {
    std::fprintf(stderr, "endure certs: %s\n", request.status().message().c_str());
    return kExitUsage;
  }
  const std::string& dir = request->dir;
  const std::string ca_pem = JoinPath(dir, "ca.pem");
  const std::string ca_key = JoinPath(dir, "ca.key");
  const bool reused = Env::Default()->Exists(ca_pem) && Env::Default()->Exists(ca_key);
  const Status st = tls::MakeCertificates(*request);
  if (!st.ok()) {
    std::fprintf(stderr, "endure certs: %s\n", st.message().c_str());
    // A directory that cannot be written is the user's to fix, like bad input.
    const bool usage =
        st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kIOError;
    return usage ? kExitUsage : kExitInternal;
  }
  if (reused) {
    std::printf("kept the CA %s (key %s)\n", ca_pem.c_str(), ca_key.c_str());
  } else {
    std::printf("wrote the CA %s and its key %s\n", ca_pem.c_str(), ca_key.c_str());
  }
  std::vector<std::string> names = {tls::kControllerName};
  names.insert(names.end(), request->nodes.begin(), request->nodes.end());
  for (const std::string& name : names) {
    std::printf("wrote %s and %s (key mode 0600)\n", JoinPath(dir, name + ".pem").c_str(),
                JoinPath(dir, name + ".key").c_str());
  }
  std::string extra;
  for (const std::string& host : request->hosts) extra += (extra.empty() ? "" : ", ") + host;
  std::printf("valid for %s (at most until the CA expires)%s\n", flags.valid.c_str(),
              extra.empty() ? "" : (", also naming " + extra).c_str());
  std::printf(
      "Give each host ca.pem and its own NAME.pem and NAME.key (keys mode 0600): the controller\n"
      "uses controller.*, node N's agent N.*; start them with --tls-dir. Keep ca.key off the\n"
      "hosts: it is needed only to add nodes (endure certs --dir %s --nodes NEW).\n",
      dir.c_str());
  return kExitOk;
}

}  // namespace

Verb AddCertsVerb(CLI::App& root) {
  auto flags = std::make_shared<CertsFlags>();
  CLI::App* cmd = root.add_subcommand(
      "certs",
      "Make a job's CA and the mutual-TLS certificates of its controller and nodes "
      "(docs/security.md); run again on the same --dir to add nodes");
  cmd->add_option("--dir", flags->dir, "Directory for the files (made 0700 if missing)")
      ->required();
  cmd->add_option("--nodes", flags->nodes, "Node names, comma-separated (e.g. node0,node1)")
      ->delimiter(',');
  cmd->add_option("--nodes-count", flags->nodes_count, "Also make node0 .. node<N-1>");
  cmd->add_option("--host", flags->hosts,
                  "A DNS name or IP address to put in every certificate (repeatable)");
  cmd->add_option("--valid", flags->valid, "How long the certificates are valid, e.g. 90d")
      ->capture_default_str();
  return {cmd, [flags] { return Run(*flags); }};
}

}  // namespace endure::cli
