// Stack capture on a hang: every live worker of the node at once, under one
// deadline. A worker that dumps its own stacks on a signal (the Python
// client through faulthandler, a native one through the C++ client's
// Session::DumpStacksOnSignal) is asked first; a worker that cannot answer
// (stopped with SIGSTOP, wedged, or not dumping at all) is read from
// outside: py-spy for a Python interpreter where it is installed (Python
// frames, read without stopping the process), gdb otherwise (native
// frames). Every capture runs in parallel with the others; when the deadline
// comes, what is still running is killed and its rank's text says what
// could not be captured and why. The restart is never held past it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace endure::agent {

// The most bytes of one rank's stacks (self-dumped or a tool's).
inline constexpr size_t kMaxStackBytes = 1 << 20;

struct StackTarget {
  int rank = 0;
  pid_t pid = -1;
  std::string stacks_path;  // where it dumps its own stacks; empty: it does not
  int signal = 0;           // > 0: the signal it announced for a dump
};

// The outside tools. `py_spy` empty: $ENDURE_PY_SPY, then `py-spy` beside
// the worker's interpreter (a virtualenv's bin), then on PATH; none found:
// gdb. A tool is a program given the pid: gdb as `gdb -p PID -batch ...`,
// py-spy as `py-spy dump --pid PID --nonblocking`.
struct StackTools {
  std::string gdb = "/usr/bin/gdb";
  std::string py_spy;
};

// rank -> the rank's stacks, or what could not be captured and why. Takes
// at most `timeout` (plus the time to kill what is still running then):
//   - a target with a signal is signalled at once (the process, not its
//     group) unless it is stopped; its file is taken once it is non-empty
//     and has not grown for 200 ms, under a first line "Python stacks
//     (faulthandler):" (a native program's: "Stacks (its own dump):"). One that writes nothing
//     within three quarters of the deadline (at most 3 s) is read from outside in the time left;
//   - every other target is read from outside at once. A Python
//     interpreter's text starts with "Python stacks (py-spy" when py-spy
//     read it; with gdb's native frames, a first line says why there are no
//     Python frames.
std::map<int, std::string> CaptureStacks(const std::vector<StackTarget>& targets,
                                         std::chrono::milliseconds timeout,
                                         const StackTools& tools = {});

}  // namespace endure::agent
