// Fuzz target: endure::Session::FromEnvironment, the client library's
// reading of its ENDURE_* variables, with fuzzed values. The input is lines
// NAME=VALUE; ENDURE_AGENT_SOCKET is never set, so no socket or thread is
// made, and ENDURE_RESTORE_PLAN_FILE's value is put in a scratch file that
// the variable then names. A session it accepts holds values in their
// documented ranges.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include "endure/client.h"
#include "fuzz/fuzz_util.h"

using namespace endure;

namespace {

// A file of this process for ENDURE_RESTORE_PLAN_FILE, removed at exit.
std::string PlanScratchFile() {
  char path[] = "/tmp/endure-fuzz-plan-XXXXXX";
  const int fd = ::mkstemp(path);
  FUZZ_CHECK(fd >= 0);
  ::close(fd);
  static std::string name = path;
  std::atexit([] { ::unlink(name.c_str()); });
  return name;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> vars;
  std::string_view text = fuzz::AsText(data, size);
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) continue;
    vars[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  vars.erase("ENDURE_AGENT_SOCKET");
  // ENDURE_RESTORE_PLAN_FILE names a file: the fuzzed value becomes the
  // contents of a scratch file of this process, "-" a file that is missing.
  if (auto it = vars.find("ENDURE_RESTORE_PLAN_FILE"); it != vars.end() && !it->second.empty()) {
    static const std::string scratch = PlanScratchFile();
    if (it->second == "-") {
      it->second = scratch + ".missing";
    } else {
      std::ofstream(scratch, std::ios::binary | std::ios::trunc) << it->second;
      it->second = scratch;
    }
  }
  const EnvLookup lookup = [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };

  Result<std::unique_ptr<Session>> session = Session::FromEnvironment(lookup);
  if (!session.ok()) {
    const StatusCode code = session.status().code();
    FUZZ_CHECK(code == StatusCode::kInvalidArgument ||
               (code == StatusCode::kNotFound && vars.count("ENDURE_RESTORE_PLAN_FILE") > 0));
    return 0;
  }
  const Session& s = **session;
  FUZZ_CHECK(!s.active());
  FUZZ_CHECK(s.rank() >= 0 && s.generation() >= 0);
  FUZZ_CHECK(!s.checkpoint_every() || *s.checkpoint_every() >= 0);
  FUZZ_CHECK(!s.restore_step() || *s.restore_step() >= -1);
  const std::vector<int64_t>& skip = s.skip_steps();
  for (size_t i = 0; i < skip.size(); ++i) {
    FUZZ_CHECK(skip[i] >= 1);
    if (i > 0) FUZZ_CHECK(skip[i - 1] < skip[i]);
  }
  if (s.restore_plan()) {
    const RestorePlan& plan = *s.restore_plan();
    for (size_t i = 0; i < plan.sources.size(); ++i) {
      FUZZ_CHECK(plan.sources[i].shard == static_cast<int>(i));
    }
    FUZZ_CHECK(!plan.summary.empty());
    FUZZ_CHECK(!s.ReadRestoreShard(plan.sources.size()).ok());
  }
  return 0;
}
