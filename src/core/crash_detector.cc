// Worker exit classification; see crash_detector.h.
#include "core/crash_detector.h"

#include <csignal>

namespace endure::core {
namespace {

struct SignalInfo {
  int number;
  const char* name;
  const char* hint;  // why a training worker typically gets it; may be empty
};

// Built from <csignal> so the numbers are the platform's own.
constexpr SignalInfo kSignals[] = {
    {SIGHUP, "SIGHUP", "its terminal or session went away"},
    {SIGINT, "SIGINT", "Ctrl-C, or a launcher forwarding it"},
    {SIGQUIT, "SIGQUIT", ""},
    {SIGILL, "SIGILL", "an illegal instruction: a binary built for another CPU, or corruption"},
    {SIGTRAP, "SIGTRAP", ""},
    {SIGABRT, "SIGABRT",
     "abort(): a failed assertion, an uncaught C++ exception or a detected heap corruption"},
    {SIGBUS, "SIGBUS", "a bus error: often a truncated memory-mapped or shared-memory file"},
    {SIGFPE, "SIGFPE", "an arithmetic fault such as an integer division by zero"},
    {SIGKILL, "SIGKILL", "the kernel's OOM killer and `kill -9` send it"},
    {SIGUSR1, "SIGUSR1", ""},
    {SIGSEGV, "SIGSEGV", "a segmentation fault in native code"},
    {SIGUSR2, "SIGUSR2", ""},
    {SIGPIPE, "SIGPIPE", "it wrote to a closed pipe or socket"},
    {SIGALRM, "SIGALRM", ""},
    {SIGTERM, "SIGTERM", "a scheduler (Slurm, Kubernetes) preempting or cancelling the job"},
#ifdef SIGSTKFLT
    {SIGSTKFLT, "SIGSTKFLT", ""},
#endif
    {SIGCHLD, "SIGCHLD", ""},
    {SIGCONT, "SIGCONT", ""},
    {SIGSTOP, "SIGSTOP", ""},
    {SIGTSTP, "SIGTSTP", ""},
    {SIGTTIN, "SIGTTIN", ""},
    {SIGTTOU, "SIGTTOU", ""},
    {SIGURG, "SIGURG", ""},
    {SIGXCPU, "SIGXCPU", "its CPU-time limit ran out"},
    {SIGXFSZ, "SIGXFSZ", "it exceeded the file-size limit"},
    {SIGVTALRM, "SIGVTALRM", ""},
    {SIGPROF, "SIGPROF", ""},
    {SIGWINCH, "SIGWINCH", ""},
    {SIGIO, "SIGIO", ""},
#ifdef SIGPWR
    {SIGPWR, "SIGPWR", ""},
#endif
    {SIGSYS, "SIGSYS", "a forbidden system call (seccomp)"},
};

const SignalInfo* FindSignal(int signal) {
  for (const SignalInfo& s : kSignals) {
    if (s.number == signal) return &s;
  }
  return nullptr;
}

std::string Who(const WorkerExit& e) {
  std::string who = "rank " + std::to_string(e.rank);
  if (!e.node_name.empty()) {
    who += " on " + e.node_name;
  } else if (e.node.valid()) {
    who += " on node " + std::to_string(e.node.value);
  }
  return who;
}

}  // namespace

std::string_view SignalName(int signal) {
  const SignalInfo* s = FindSignal(signal);
  return s != nullptr ? s->name : "SIG?";
}

std::vector<int> KnownSignals() {
  std::vector<int> out;
  for (const SignalInfo& s : kSignals) out.push_back(s.number);
  return out;
}

std::optional<CrashReport> ClassifyWorkerExit(const WorkerExit& e) {
  if (e.stop_requested) return std::nullopt;
  CrashReport r;
  r.node = e.node;
  r.rank = e.rank;

  if (e.signal.has_value()) {
    const int sig = *e.signal;
    const SignalInfo* info = FindSignal(sig);
    r.kind = CrashKind::kSignal;
    r.cause = "signal " + std::to_string(sig) + " " + std::string(SignalName(sig));
    r.reason = Who(e) + " was killed by " + r.cause;
    if (e.core_dumped) r.reason += " (core dumped)";
    r.reason += ", which the agent did not send";
    if (info != nullptr && info->hint[0] != '\0') r.reason += std::string("; ") + info->hint;
    return r;
  }

  const int code = e.exit_code.value_or(-1);
  if (code == 0 && e.training_finished) return std::nullopt;
  r.kind = CrashKind::kWorkerExit;
  r.cause = "worker_exit code " + std::to_string(code);
  if (code == 0) {
    r.reason = Who(e) + " exited with code 0 before training finished";
    return r;
  }
  r.reason = Who(e) + " exited with code " + std::to_string(code);
  // Shells, torchrun and container runtimes report a child killed by signal N
  // as exit code 128 + N.
  if (code > 128 && code < 128 + 65) {
    const SignalInfo* info = FindSignal(code - 128);
    if (info != nullptr) {
      r.reason += ", which is how a wrapper reports signal " + std::to_string(code - 128) + " " +
                  info->name;
      if (info->hint[0] != '\0') r.reason += std::string(" (") + info->hint + ")";
    }
  }
  return r;
}

}  // namespace endure::core
