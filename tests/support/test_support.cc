// Test helpers; see test_support.h.
#include "tests/support/test_support.h"

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/env.h"
#include "common/subprocess.h"

namespace endure::testing_support {

std::string ReadAll(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

CommandOutcome RunCommand(const std::vector<std::string>& argv) {
  static std::atomic<int> counter{0};
  const std::string out = "/tmp/endure_test_command." + std::to_string(getpid()) + "." +
                          std::to_string(counter++) + ".out";
  (void)Env::Default()->RemoveFile(out);
  ProcessSpec spec;
  spec.argv = argv;
  spec.output_path = out;
  Result<Subprocess> p = Subprocess::Start(spec);
  if (!p.ok()) return {-1, p.status().ToString()};
  const ExitStatus st = p->Wait();
  CommandOutcome outcome{st.exited ? st.code : -st.signal, ReadAll(out)};
  (void)Env::Default()->RemoveFile(out);
  return outcome;
}

ScratchDir::ScratchDir(const std::string& prefix) {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp") + "/" +
                     prefix + ".XXXXXX";
  if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

const std::vector<std::string>& SmallTrainerFlags() {
  static const std::vector<std::string> flags = {"--layers",        "2",
                                                 "--d-model",       "64",
                                                 "--heads",         "4",
                                                 "--context",       "64",
                                                 "--global-batch",  "16",
                                                 "--micro-batch",   "8",
                                                 "--threads",       "1",
                                                 "--log-every",     "1",
                                                 "--eval-batches",  "1",
                                                 "--sample-tokens", "16",
                                                 "--data",          "/usr/share/games/fortunes"};
  return flags;
}

}  // namespace endure::testing_support
