// `endure report STATE_DIR [--json | --html [-o FILE]] [--run N]`: prints a
// job's report again from its controller database (STATE_DIR/controller.db):
// the ETTR ledger and the incidents of the newest run (or run N) as a table,
// then one line per earlier run; or the report JSON, with every run under
// "runs"; or writes it as one self-contained HTML page with charts
// (STATE_DIR/report.html, or FILE) and prints the page's path. For a run
// that is still going, or whose controller stopped before the end, it shows
// the figures as last saved and says so. The report itself is built in
// src/controller/report, the page in src/controller/report_html.
#include "controller/report.h"

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>

#include "common/env.h"
#include "controller/report_html.h"
#include "controller/state_store.h"
#include "tools/endure/verbs.h"

namespace endure::cli {
namespace {

struct ReportFlags {
  std::string state_dir;
  bool json = false;
  bool html = false;
  std::string output;  // --html's file; empty: STATE_DIR/report.html
  bool all = false;
  int run = controller::StateStore::kCurrentRun;  // the newest
};

// Where --html writes: a usage error (exit 2) unless it names a file in a
// directory that exists, checked before any work is done.
Result<std::string> HtmlPath(const ReportFlags& flags) {
  if (flags.output.empty()) return JoinPath(flags.state_dir, "report.html");
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(flags.output, ec)) {
    return InvalidArgument("-o " + flags.output +
                           ": is a directory; pass the file to write, e.g. " + flags.output +
                           "/report.html");
  }
  fs::path dir = fs::path(flags.output).parent_path();
  if (dir.empty()) dir = ".";
  if (!fs::is_directory(dir, ec)) {
    return InvalidArgument("-o " + flags.output + ": no such directory " + dir.string() +
                           "; pass a file in an existing directory");
  }
  return flags.output;
}

// Writes the page atomically (a browser that has it open sees the old page
// or the new one) and prints its path.
int WriteHtml(controller::StateStore& store, const nlohmann::json& report,
              const std::string& path) {
  Result<nlohmann::json> runs = controller::RunHistory(store);
  if (!runs.ok()) {
    std::fprintf(stderr, "endure report: %s\n", runs.status().message().c_str());
    return kExitInternal;
  }
  Status st =
      WriteFileAtomically(Env::Default(), path, controller::RenderReportHtml(report, *runs));
  if (!st.ok()) {
    std::fprintf(stderr,
                 "endure report: writing %s: %s; pass -o FILE to write the page elsewhere\n",
                 path.c_str(), st.message().c_str());
    return kExitInternal;
  }
  std::cout << path << "\n";
  return kExitOk;
}

int Run(const ReportFlags& flags) {
  const std::string hint =
      "pass the state directory of a job, the state_dir of its [job] table (e.g. runs/demo)";
  if (!Env::Default()->Exists(flags.state_dir)) {
    std::fprintf(stderr, "endure report: %s: no such directory; %s\n", flags.state_dir.c_str(),
                 hint.c_str());
    return kExitUsage;
  }
  std::string html_path;
  if (flags.html) {
    Result<std::string> path = HtmlPath(flags);
    if (!path.ok()) {
      std::fprintf(stderr, "endure report: %s\n", path.status().message().c_str());
      return kExitUsage;
    }
    html_path = *path;
  }
  const std::string db = controller::StateStore::PathIn(flags.state_dir);
  if (!Env::Default()->Exists(db)) {
    std::fprintf(stderr, "endure report: %s: no controller database (%s) here; %s\n",
                 flags.state_dir.c_str(), db.c_str(), hint.c_str());
    return kExitUsage;
  }
  Result<controller::StateStore> store = controller::StateStore::OpenExisting(db);
  if (!store.ok()) {
    std::fprintf(stderr, "endure report: %s\n", store.status().message().c_str());
    return store.status().code() == StatusCode::kIOError ? kExitInternal : kExitUsage;
  }
  Result<nlohmann::json> report = controller::ReportFromStore(*store, flags.run);
  if (!report.ok()) {
    std::fprintf(stderr, "endure report: %s\n", report.status().message().c_str());
    return report.status().code() == StatusCode::kNotFound ? kExitUsage : kExitInternal;
  }
  if (flags.html) return WriteHtml(*store, *report, html_path);
  if (flags.json) {
    Result<nlohmann::json> runs = controller::RunHistory(*store);
    if (!runs.ok()) {
      std::fprintf(stderr, "endure report: %s\n", runs.status().message().c_str());
      return kExitInternal;
    }
    (*report)["runs"] = std::move(runs).value();
    std::cout << report->dump(2) << "\n";
  } else {
    std::cout << controller::RenderReport(*report, flags.all ? 0 : controller::kReportRows);
  }
  return kExitOk;
}

}  // namespace

Verb AddReportVerb(CLI::App& root) {
  auto flags = std::make_shared<ReportFlags>();
  CLI::App* cmd = root.add_subcommand(
      "report",
      "Print a job's report again from its state directory: wall time by category, ETTR and "
      "every incident of its newest run, and a line for each earlier run");
  cmd->add_option("state_dir", flags->state_dir, "The job's state directory ([job] state_dir)")
      ->required();
  CLI::Option* json =
      cmd->add_flag("--json", flags->json,
                    "Print the report as JSON, with a summary of every run under \"runs\"");
  CLI::Option* html =
      cmd->add_flag("--html", flags->html,
                    "Write the report as one self-contained HTML page (charts inline, no "
                    "scripts): the ledger, ETTR over time, every incident, every run; to "
                    "STATE_DIR/report.html unless -o is given, and print its path")
          ->excludes(json);
  cmd->add_option("-o,--output", flags->output,
                  "The file --html writes (default STATE_DIR/report.html)")
      ->type_name("FILE")
      ->needs(html);
  cmd->add_flag("--all", flags->all,
                "Show every node, straggler and incident (by default the table shows the newest " +
                    std::to_string(controller::kReportRows) + " of each and counts the others)");
  cmd->add_option("--run", flags->run,
                  "Print run N's report (each start of the job on this state directory is a "
                  "run: 1, 2, ...); the newest by default")
      ->check(CLI::PositiveNumber);
  return {cmd, [flags] { return Run(*flags); }};
}

}  // namespace endure::cli
