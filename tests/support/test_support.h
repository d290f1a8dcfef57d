// Helpers shared by the tests that run Endure's binaries: reading a file
// whole, running a command with its output captured, and the flags that make
// endure-train small enough for a test run to take seconds.
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

// --layers 2 --d-model 64 ... --data /usr/share/games/fortunes: about 50 ms a
// step on 2 ranks here, and log lines every step.
const std::vector<std::string>& SmallTrainerFlags();

}  // namespace endure::testing_support
