// `endure <verb> [flags]`: the single command-line entry point. Dispatches to
// the verbs declared in verbs.h; add a verb by writing tools/endure/<verb>.cc
// and listing its Add function below.
#include <cstdio>
#include <vector>

#include "tools/endure/verbs.h"

int main(int argc, char** argv) {
  using endure::cli::Verb;
  CLI::App app{"Endure: a fault-tolerant runtime for LLM training", "endure"};
  app.require_subcommand(1);
  app.fallthrough(false);

  std::vector<Verb> verbs = {
      endure::cli::AddSimVerb(app),        endure::cli::AddClassifyVerb(app),
      endure::cli::AddReportVerb(app),     endure::cli::AddRunVerb(app),
      endure::cli::AddControllerVerb(app), endure::cli::AddAgentVerb(app),
      endure::cli::AddCertsVerb(app),      endure::cli::AddNodesVerb(app),
      endure::cli::AddIncidentsVerb(app),
  };

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; every other parse error is a usage error.
    int rc = app.exit(e);
    return rc == 0 ? endure::cli::kExitOk : endure::cli::kExitUsage;
  }
  for (const Verb& verb : verbs) {
    if (verb.command->parsed()) return verb.run();
  }
  return endure::cli::kExitUsage;
}
