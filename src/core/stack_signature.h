// Hang localization by stack signature (ByteRobust §5.1): on a hang, the
// ranks stuck in the same place (waiting in the allreduce for the one that
// never arrives) share a stack, and the rank that is elsewhere (asleep,
// spinning in its data loader, inside a driver call) stands out. Grouping the
// ranks by a normalized stack and naming the minority finds that rank without
// any knowledge of the program.
//
// The dumps are the agent's (src/agent/worker_set.cc): gdb's "thread apply
// all bt" (the agent keeps the "Thread N (...)" and "#N ..." lines, the main
// thread first), a Python process's own faulthandler dump (first line
// "Python stacks (faulthandler):", then "Thread 0x...
// (most recent call first):" blocks of `File "...", line N in FUNC` lines),
// or glibc backtrace_symbols lines ("./trainer(_ZN...+0x1a) [0x55...]").
// Lines of none of these forms (the agent's notes, "rank 3:", gdb's chatter)
// are ignored, so a dump may mix them.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/ids.h"

namespace endure::core {

// The signature of one rank's stack dump: what is left when everything that
// differs between two processes stuck in the same code is taken away.
//
// Kept: each thread's function names in call order (C++ names without
// their parameter lists, "[clone .isra.0]" suffixes and argument values;
// Python frames as "FUNC (FILE.py)", the file's base name without its
// directory, so that installation paths do not matter either).
// Removed: frame numbers and addresses, thread numbers, ids, names and LWPs,
// pids, argument values, source files and line numbers of C++ frames, line
// numbers of Python frames. Runs of unresolved "??" frames count as one (the
// depth of a JIT or driver region varies with where it was interrupted).
// Thread order does not matter: the threads are sorted, and a thread stack
// that repeats (a pool's idle workers) counts once, so that pool sizes do
// not split ranks either.
//
// The result is one line per distinct thread, frames innermost first joined
// by " <- ", the lines sorted and joined by '\n'. Equal signatures mean the
// same stacks; "" means no frame was found (a capture that failed or timed
// out, an empty dump).
std::string StackSignature(std::string_view dump);

// The ranks are grouped by their main thread's signature (the training
// loop's thread: gdb's "Thread 1", faulthandler's oldest thread): the other
// threads of a process (a communication library's send and receive threads,
// data loader workers) are caught in whatever state they happened to be in,
// and would split ranks that are stuck in the same place.
struct StackGroups {
  // Ranks by signature, ascending within a group: the groups of ranks with a
  // stack, largest first (ties: the group with the lowest rank first), then,
  // last whatever its size, the ranks whose dump held no frame ("no stack").
  std::vector<std::vector<Rank>> groups;
  // Per group, where its ranks are: the function at which its main thread
  // leaves the call chain of the majority (for the largest group: of the
  // next largest), then, after " > ", the innermost frame below it that is
  // not a wait primitive (futex, poll, condition_variable::wait, ...), e.g.
  // "Allreduce" and "BeginStep > sleep_for"; with nothing to compare with,
  // that innermost frame; "no stack" for the ranks without one. The main
  // thread is gdb's "Thread 1", faulthandler's last (oldest) thread, or
  // the first one listed.
  std::vector<std::string> locations;
  // Ranks of every group but the largest when that group holds a strict
  // majority of all the ranks given (ranks without a stack count in the
  // total and are suspects then), ascending. Empty otherwise.
  std::vector<Rank> suspects;
  // A strict-majority group and at least one outlier. All ranks equal, no
  // strict majority (2 vs 2), or no stacks at all: false, no suspects.
  bool resolved = false;
  // One line for the incident, e.g. "3 of 4 ranks share one stack (in
  // Allreduce); rank 1 differs (in BeginStep > sleep_for)"; "... rank 3 has
  // no stack"; "no stack is shared by a strict majority of the 4 ranks:
  // ranks 0-1 (in X), ranks 2-3 (in Y)"; "all 4 ranks share one stack (in
  // X): no outlier".
  std::string reason;
};

// Groups the ranks' dumps by StackSignature. A rank given twice counts once
// (its first dump).
StackGroups GroupStacks(const std::vector<std::pair<Rank, std::string>>& dumps);

}  // namespace endure::core
