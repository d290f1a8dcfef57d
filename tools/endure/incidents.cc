// `endure incidents [--json] [--similar ID] STATE_DIR`: the incident knowledge
// base (STATE_DIR/incidents.db, the [cluster] state_dir the jobs share, or a
// job's own): every incident of every job with its cause, what the controller
// did and what an operator recorded; with --similar, the incidents most like
// one of them (core::FindSimilar), with their resolutions.
// `endure incidents resolve ID --action A [--cause C] [--note TEXT]
// --state-dir DIR` records an operator's resolution, which later incidents
// like it are proposed (and `endure classify --suggest` turns into rules).
#include <cctype>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "controller/incident_kb.h"
#include "core/log_classifier.h"
#include "tools/endure/cli_util.h"
#include "tools/endure/verbs.h"

namespace endure::cli {
namespace {

using Json = nlohmann::ordered_json;

struct IncidentsFlags {
  std::string state_dir;
  bool json = false;
  int64_t similar = 0;
  int64_t resolve_id = 0;
  std::string action, cause, note;
};

Result<controller::IncidentKb> OpenKb(const std::string& state_dir) {
  ENDURE_ASSIGN_OR_RETURN(std::string path,
                          StateDatabase(state_dir, "incidents.db", "incident knowledge base"));
  return controller::IncidentKb::OpenExisting(path);
}

// The line that says most: the last non-blank one of the excerpt.
std::string Headline(const controller::KbIncident& k) {
  size_t end = k.excerpt.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  const size_t start = k.excerpt.rfind('\n', end);
  std::string line = k.excerpt.substr(start == std::string::npos ? 0 : start + 1,
                                      end - (start == std::string::npos ? 0 : start + 1) + 1);
  return line.size() > 110 ? line.substr(0, 107) + "..." : line;
}

Json ToJson(const controller::KbIncident& k) {
  Json j = {{"id", k.id},
            {"at", Utc(k.at_unix_ms)},
            {"job", k.job},
            {"job_dir", k.job_dir},
            {"run", k.run},
            {"job_incident", k.job_incident},
            {"node", k.node},
            {"rank", k.rank},
            {"cause", k.cause},
            {"action", k.action},
            {"log_rule", k.log_rule.empty() ? Json() : Json(k.log_rule)},
            {"excerpt", k.excerpt},
            {"stack_signature", k.stack_signature}};
  if (k.resolution) {
    j["resolution"] = {{"action", std::string(core::LogActionName(*k.resolution))},
                       {"cause", k.resolution_cause},
                       {"note", k.resolution_note},
                       {"at", Utc(k.resolved_at_unix_ms)}};
  } else {
    j["resolution"] = nullptr;
  }
  return j;
}

Json ToJson(const controller::Recurrence& r) {
  return {{"id", r.id},
          {"score", std::round(r.score * 1000) / 1000},
          {"job", r.job},
          {"job_incident", r.job_incident},
          {"cause", r.cause},
          {"action", r.action},
          {"resolved", r.resolved},
          {"note", r.note}};
}

std::string Resolution(const controller::KbIncident& k) {
  if (!k.resolution) return "-";
  return std::string(core::LogActionName(*k.resolution)) +
         (k.resolution_note.empty() ? "" : ": " + k.resolution_note);
}

int List(const IncidentsFlags& flags) {
  Result<controller::IncidentKb> kb = OpenKb(flags.state_dir);
  if (!kb.ok()) return Fail("incidents", kb.status());
  Result<std::vector<controller::KbIncident>> all = kb->List();
  if (!all.ok()) return Fail("incidents", all.status());
  if (flags.json) {
    Json out = Json::array();
    for (const controller::KbIncident& k : *all) out.push_back(ToJson(k));
    std::printf("%s\n", out.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%s: %zu incident%s\n", kb->path().c_str(), all->size(), all->size() == 1 ? "" : "s");
  std::printf("%5s  %-20s  %-16s %-8s %-22s %-18s %s\n", "ID", "AT", "JOB#INCIDENT", "NODE",
              "CAUSE", "ACTION", "RESOLUTION");
  for (const controller::KbIncident& k : *all) {
    const std::string job = k.job + "#" + std::to_string(k.job_incident);
    std::printf("%5lld  %-20s  %-16s %-8s %-22s %-18s %s\n", static_cast<long long>(k.id),
                Utc(k.at_unix_ms).c_str(), job.c_str(), k.node.c_str(), k.cause.c_str(),
                k.action.c_str(), Resolution(k).c_str());
    if (const std::string h = Headline(k); !h.empty()) std::printf("       %s\n", h.c_str());
  }
  return kExitOk;
}

int Similar(const IncidentsFlags& flags) {
  Result<controller::IncidentKb> kb = OpenKb(flags.state_dir);
  if (!kb.ok()) return Fail("incidents", kb.status());
  Result<std::optional<controller::KbIncident>> k = kb->Get(flags.similar);
  if (!k.ok()) return Fail("incidents", k.status());
  if (!k->has_value()) {
    return Fail("incidents", NotFound("no incident " + std::to_string(flags.similar) + " in " +
                                      kb->path() + "; `endure incidents DIR` lists them"));
  }
  Result<std::vector<controller::Recurrence>> similar =
      kb->Similar(**k, 10, /*min_score=*/0.2, /*earlier_only=*/false);
  if (!similar.ok()) return Fail("incidents", similar.status());
  if (flags.json) {
    Json j = ToJson(**k);
    Json s = Json::array();
    for (const controller::Recurrence& r : *similar) s.push_back(ToJson(r));
    j["similar"] = s;
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("incident %lld (%s#%d, %s on %s): %s\n", static_cast<long long>((*k)->id),
              (*k)->job.c_str(), (*k)->job_incident, (*k)->cause.c_str(), (*k)->node.c_str(),
              Headline(**k).c_str());
  if (similar->empty()) {
    std::printf("no incident is similar to it (score >= 0.2)\n");
    return kExitOk;
  }
  std::printf("%6s %5s  %-16s %-22s %s\n", "SCORE", "ID", "JOB#INCIDENT", "CAUSE", "RESOLUTION");
  for (const controller::Recurrence& r : *similar) {
    const std::string job = r.job + "#" + std::to_string(r.job_incident);
    std::printf("%6.2f %5lld  %-16s %-22s %s%s%s\n", r.score, static_cast<long long>(r.id),
                job.c_str(), r.cause.c_str(), r.resolved ? "" : "(controller) ", r.action.c_str(),
                r.note.empty() ? "" : (": " + r.note).c_str());
  }
  return kExitOk;
}

int Resolve(const IncidentsFlags& flags) {
  Result<core::LogAction> action = core::ParseLogAction(flags.action);
  if (!action.ok()) {
    return Fail("incidents resolve", InvalidArgument("--action: " + action.status().message()));
  }
  for (char c : flags.cause) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') {
      return Fail("incidents resolve",
                  InvalidArgument("--cause '" + flags.cause +
                                  "': use letters, digits and '_', e.g. hca_firmware"));
    }
  }
  Result<controller::IncidentKb> kb = OpenKb(flags.state_dir);
  if (!kb.ok()) return Fail("incidents resolve", kb.status());
  if (Status st = kb->Resolve(flags.resolve_id, *action, flags.cause, flags.note, NowUnixMs());
      !st.ok()) {
    return Fail("incidents resolve", st);
  }
  std::printf("incident %lld resolved: %s%s%s\n", static_cast<long long>(flags.resolve_id),
              flags.action.c_str(), flags.note.empty() ? "" : ": ", flags.note.c_str());
  return kExitOk;
}

}  // namespace

Verb AddIncidentsVerb(CLI::App& root) {
  auto flags = std::make_shared<IncidentsFlags>();
  CLI::App* cmd = root.add_subcommand(
      "incidents",
      "List the incident knowledge base of a state directory (every job's incidents, their "
      "causes and resolutions); --similar ID shows the incidents most like one; "
      "`incidents resolve` records an operator's resolution");
  cmd->add_option("state_dir", flags->state_dir,
                  "The [cluster] state_dir the jobs share, or a job's state_dir");
  cmd->add_flag("--json", flags->json, "Print JSON");
  cmd->add_option("--similar", flags->similar,
                  "Show the incidents most similar to incident ID, with their resolutions")
      ->check(CLI::PositiveNumber);
  CLI::App* resolve = cmd->add_subcommand(
      "resolve", "Record what resolved an incident; similar incidents later are proposed it");
  resolve->add_option("id", flags->resolve_id, "The incident's ID (endure incidents DIR)")
      ->required()
      ->check(CLI::PositiveNumber);
  resolve->add_option("--action", flags->action, "restart, evict_node, stop or investigate")
      ->required();
  resolve->add_option("--cause", flags->cause,
                      "The cause as found, e.g. hca_firmware (default: the incident's)");
  resolve->add_option("--note", flags->note, "What was found and done, e.g. \"replaced the HCA\"");
  resolve
      ->add_option("--state-dir", flags->state_dir,
                   "The [cluster] state_dir the jobs share, or a job's state_dir")
      ->required();
  return {cmd, [flags, resolve] {
            if (resolve->parsed()) return Resolve(*flags);
            if (flags->state_dir.empty()) {
              std::fprintf(stderr,
                           "endure incidents: pass a state directory: endure incidents DIR\n");
              return kExitUsage;
            }
            return flags->similar > 0 ? Similar(*flags) : List(*flags);
          }};
}

}  // namespace endure::cli
