// Subprocess: start a program with extra environment variables and its
// output sent to a file, signal it, and wait for it. Used by the tests and
// benchmarks that run real training processes, and by the agent that
// launches workers. A Subprocess is movable, not copyable, and not
// thread-safe; its destructor does not kill or reap the child.
//
// ProcessTree finds and signals everything a started program left behind:
// its process group, its session, and descendants that left both (setsid,
// a double fork) but kept a marker in their environment.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace endure {

struct ProcessSpec {
  std::vector<std::string> argv;                         // argv[0] is the program path
  std::vector<std::pair<std::string, std::string>> env;  // set on top of the parent's
  std::vector<std::string> unset_env;                    // removed from the parent's
  std::string output_path;         // stdout and stderr appended here; empty: inherit
  int output_fd = -1;              // or: stdout and stderr go to this descriptor (a pipe)
  int input_fd = -1;               // stdin reads from this descriptor; -1: inherit
  bool new_process_group = false;  // so that a signal to -pid reaches its children
  // setsid(): a new session and process group, both with the child's pid
  // (implies new_process_group); see ProcessTree.
  bool new_session = false;
  bool die_with_parent = false;  // SIGKILL when the parent dies (no orphans)
};

struct ExitStatus {
  bool exited = false;  // true: normal exit with `code`; false: killed by `signal`
  int code = 0;
  int signal = 0;
  bool Success() const { return exited && code == 0; }
  std::string ToString() const;  // "exit code 2", "signal 9 (Killed)"
};

class Subprocess {
 public:
  static Result<Subprocess> Start(const ProcessSpec& spec);

  Subprocess(Subprocess&& other) noexcept : pid_(std::exchange(other.pid_, -1)) {}
  Subprocess& operator=(Subprocess&& other) noexcept {
    pid_ = std::exchange(other.pid_, -1);
    return *this;
  }

  pid_t pid() const { return pid_; }
  void Signal(int sig) const;
  // Signals the child's process group (started with new_process_group).
  void SignalGroup(int sig) const;
  // Blocks until the child exits.
  ExitStatus Wait();
  // Waits at most `timeout`; nullopt if it is still running.
  std::optional<ExitStatus> WaitFor(std::chrono::milliseconds timeout);
  // Whether the child has exited, without reaping it: until Wait, its pid
  // (and so its process group and session id) cannot be reused, and a
  // signal to them cannot reach a stranger. `block`: waits for the exit.
  bool Exited(bool block);

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
};

ExitStatus DecodeWaitStatus(int wstatus);

// The processes that belong to a program started with new_session: its
// session and process group (both `leader`, its pid) and every process whose
// environment holds the entry `env_marker` ("NAME=VALUE", set for the
// program; empty: none), which its descendants inherit even when they start
// sessions of their own. Found by scanning /proc; processes of other users
// are not readable and not found. Thread-safe.
struct ProcessTree {
  pid_t leader = -1;
  std::string env_marker;

  // The live members (not zombies), never this process. Each call
  // scans /proc (about a millisecond per thousand processes).
  std::vector<pid_t> Members() const;
  // Sends `sig` to the process group and to every member; returns how many
  // members were found.
  int Signal(int sig) const;
};

// `program` as execve needs it: a name without '/' looked up on PATH (its
// first executable match; /usr/local/bin:/usr/bin:/bin without PATH);
// otherwise, or when nothing matches, `program` itself.
std::string ResolveProgram(const std::string& program);

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0 and
// released). Racy by nature; for handing a rendezvous port to child processes.
Result<int> PickFreePort();

}  // namespace endure
