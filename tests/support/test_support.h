// Helpers shared by the tests that run Endure's binaries: reading a file
// whole, running a command with its output captured, a scratch directory of
// a test's own, and the flags that make endure-train small enough for a test
// run to take seconds.
#pragma once

#include <string>
#include <vector>

namespace endure::testing_support {

// The file's contents; empty when it cannot be read.
std::string ReadAll(const std::string& path);

struct CommandOutcome {
  int code = -1;       // the exit code, or minus the signal that ended it
  std::string output;  // stdout and stderr together
};

// Runs `argv` (argv[0] a path) to completion and captures its output in a
// temporary file unique to this process.
CommandOutcome RunCommand(const std::vector<std::string>& argv);

// A directory of the caller's own, made by mkdtemp under $TMPDIR (else
// /tmp) and removed with its contents when this goes out of scope. ctest
// runs tests in parallel: files they write go here, never to a fixed path.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix = "endure_test");
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  // `name` inside the directory.
  std::string Path(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// --layers 2 --d-model 64 ... --data /usr/share/games/fortunes: about 50 ms a
// step on 2 ranks here, and log lines every step.
const std::vector<std::string>& SmallTrainerFlags();

}  // namespace endure::testing_support
