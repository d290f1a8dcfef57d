// `endure nodes [--json] STATE_DIR`: the node health ledger
// (STATE_DIR/nodes.db, the [cluster] state_dir the jobs share, or a job's
// own state_dir): every node ever struck, its strikes since it was last
// released (cause, hard or soft, when, what was seen), and its state as
// core::JudgeNode sees it now under the policy the last controller used.
// `endure nodes release NODE --state-dir DIR [--note TEXT]` returns a
// quarantined node to service: its earlier strikes no longer count; the
// history stays.
#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/env.h"
#include "common/names.h"
#include "controller/node_ledger.h"
#include "core/node_health.h"
#include "tools/endure/cli_util.h"
#include "tools/endure/verbs.h"

namespace endure::cli {
namespace {

struct NodesFlags {
  std::string state_dir;
  bool json = false;
  std::string release_node;
  std::string note;
};

// The ledger of `state_dir`, or why not.
Result<controller::NodeLedger> OpenLedger(const std::string& state_dir) {
  ENDURE_ASSIGN_OR_RETURN(std::string path,
                          StateDatabase(state_dir, "nodes.db", "node health ledger"));
  return controller::NodeLedger::OpenExisting(path);
}

int List(const NodesFlags& flags) {
  Result<controller::NodeLedger> ledger = OpenLedger(flags.state_dir);
  if (!ledger.ok()) return Fail("nodes", ledger.status());
  Result<std::vector<controller::NodeRecord>> nodes = ledger->List();
  if (!nodes.ok()) return Fail("nodes", nodes.status());
  Result<core::NodeHealthOptions> policy = ledger->Policy();
  if (!policy.ok()) return Fail("nodes", policy.status());
  const int64_t now = NowUnixMs();
  nlohmann::json out = nlohmann::json::array();
  for (const controller::NodeRecord& n : *nodes) {
    const core::NodeVerdict v = core::JudgeNode(n.strikes, now, *policy);
    nlohmann::json strikes = nlohmann::json::array();
    for (const core::Strike& s : n.strikes) {
      strikes.push_back({{"cause", s.cause},
                         {"class", std::string(core::StrikeClassName(s.cls))},
                         {"at_unix_ms", s.unix_ms},
                         {"at", Utc(s.unix_ms)},
                         {"detail", s.detail}});
    }
    nlohmann::json j = {{"node", n.node},
                        {"state", std::string(core::HealthStateName(v.state))},
                        {"reason", v.reason},
                        {"strikes", strikes},
                        {"total_strikes", n.total_strikes}};
    if (n.released_at_ms) {
      j["released_at"] = Utc(*n.released_at_ms);
      j["release_note"] = n.release_note;
    }
    out.push_back(std::move(j));
  }
  if (flags.json) {
    std::cout << nlohmann::json{{"ledger", controller::NodeLedger::PathIn(flags.state_dir)},
                                {"soft_strikes", policy->soft_strikes},
                                {"soft_window_s", Seconds(policy->soft_window)},
                                {"nodes", out}}
                     .dump(2)
              << "\n";
    return kExitOk;
  }
  std::printf("node health ledger %s (quarantine: a hard strike, or %d soft within %s)\n",
              controller::NodeLedger::PathIn(flags.state_dir).c_str(), policy->soft_strikes,
              FormatDuration(policy->soft_window).c_str());
  if (out.empty()) {
    std::printf("no node has been struck\n");
    return kExitOk;
  }
  std::printf("%-20s %-12s %8s  %s\n", "NODE", "STATE", "STRIKES", "WHY");
  for (const nlohmann::json& n : out) {
    std::printf("%-20s %-12s %8zu  %s\n", n["node"].get<std::string>().c_str(),
                n["state"].get<std::string>().c_str(), n["strikes"].size(),
                n["reason"].get<std::string>().c_str());
    for (const nlohmann::json& s : n["strikes"]) {
      std::string detail = s["detail"].get<std::string>();
      if (detail.size() > 100) detail = detail.substr(0, 97) + "...";
      std::printf("    %s  %-4s %-20s %s\n", s["at"].get<std::string>().c_str(),
                  s["class"].get<std::string>().c_str(), s["cause"].get<std::string>().c_str(),
                  detail.c_str());
    }
    if (n.contains("released_at")) {
      std::printf("    released %s%s%s\n", n["released_at"].get<std::string>().c_str(),
                  n["release_note"].get<std::string>().empty() ? "" : ": ",
                  n["release_note"].get<std::string>().c_str());
    }
  }
  return kExitOk;
}

int Release(const NodesFlags& flags) {
  if (!IsValidNodeName(flags.release_node)) {
    std::fprintf(stderr, "endure nodes release: '%s' is not a node name\n",
                 flags.release_node.c_str());
    return kExitUsage;
  }
  Result<controller::NodeLedger> ledger = OpenLedger(flags.state_dir);
  if (!ledger.ok()) return Fail("nodes release", ledger.status());
  if (Status st = ledger->Release(flags.release_node, NowUnixMs(), flags.note); !st.ok()) {
    return Fail("nodes release", st);
  }
  std::printf("%s is back in service: its earlier strikes no longer count\n",
              flags.release_node.c_str());
  return kExitOk;
}

}  // namespace

Verb AddNodesVerb(CLI::App& root) {
  auto flags = std::make_shared<NodesFlags>();
  CLI::App* cmd = root.add_subcommand(
      "nodes",
      "List the node health ledger of a state directory: each node's strikes and whether it is "
      "healthy, suspect or quarantined; `nodes release` returns one to service");
  cmd->add_option("state_dir", flags->state_dir,
                  "The [cluster] state_dir the jobs share, or a job's state_dir");
  cmd->add_flag("--json", flags->json, "Print the ledger as JSON");
  CLI::App* release = cmd->add_subcommand(
      "release", "Return a quarantined node to service (its earlier strikes no longer count)");
  release->add_option("node", flags->release_node, "The node's name, e.g. node3")->required();
  release
      ->add_option("--state-dir", flags->state_dir,
                   "The [cluster] state_dir the jobs share, or a job's state_dir")
      ->required();
  release->add_option("--note", flags->note, "Why (kept in the ledger), e.g. \"GPU replaced\"");
  return {cmd, [flags, release] {
            if (release->parsed()) return Release(*flags);
            if (flags->state_dir.empty()) {
              std::fprintf(stderr, "endure nodes: pass a state directory: endure nodes DIR\n");
              return kExitUsage;
            }
            return List(*flags);
          }};
}

}  // namespace endure::cli
