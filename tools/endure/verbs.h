// The verbs of the `endure` command line. Each verb lives in its own file,
// tools/endure/<verb>.cc, and exposes one Add<Verb>Verb function that adds
// its CLI11 subcommand (flags and --help) to the root app and returns how to
// run it once the command line has been parsed. main.cc lists them.
//
// A verb's run function returns the process exit code: 0 success, 2 usage or
// configuration error (the message names the flag, or the file, line and
// key), 3 the job gave up, 1 internal error.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace endure::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInternal = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitGaveUp = 3;

struct Verb {
  CLI::App* command = nullptr;  // owned by the root app
  std::function<int()> run;
};

// `endure sim`: the cluster simulator and ETTR models (sim.cc).
Verb AddSimVerb(CLI::App& root);

// `endure classify`: runs the log rules over text (classify.cc).
Verb AddClassifyVerb(CLI::App& root);

// `endure report`: prints a job's report from its state directory (report.cc).
Verb AddReportVerb(CLI::App& root);

// `endure controller`, `endure agent`: the long-running processes (processes.cc).
Verb AddControllerVerb(CLI::App& root);
Verb AddAgentVerb(CLI::App& root);

// `endure run JOB.toml`: the embedded single-machine mode (run.cc).
Verb AddRunVerb(CLI::App& root);

// `endure certs`: the job's CA and mutual-TLS certificates (certs.cc).
Verb AddCertsVerb(CLI::App& root);

// `endure nodes`: the node health ledger, and releasing a node (nodes.cc).
Verb AddNodesVerb(CLI::App& root);

// `endure incidents`: the incident knowledge base, and resolving an incident
// (incidents.cc).
Verb AddIncidentsVerb(CLI::App& root);

}  // namespace endure::cli
