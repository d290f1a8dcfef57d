// WorkerSet: processes, pipes, and the targets of a stack capture.
#include "agent/worker_set.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/secret.h"
#include "contract/worker_contract.h"
#include "core/progress_pattern.h"

namespace endure::agent {
namespace {

using Clock = std::chrono::steady_clock;

// Without a pidfd (kernels before 5.3), how often a watcher checks whether
// its worker exited while the output pipe stays open.
constexpr auto kExitPoll = std::chrono::milliseconds(20);

// A tag no other worker of any agent carries: this agent's pid, a counter,
// and random bits against a pid reused by a later agent.
std::string NewTag() {
  static std::atomic<uint64_t> next{0};
  Result<std::string> random = RandomHex(4);
  return std::to_string(::getpid()) + "." + std::to_string(next.fetch_add(1)) + "." +
         (random.ok() ? *random
                      : std::to_string(Clock::now().time_since_epoch().count() & 0xffffffff));
}

std::string TagEntry(const std::string& tag) {
  return std::string(worker_env::kWorkerTag) + "=" + tag;
}

// A descriptor that turns readable when `pid` exits; -1 where the kernel
// has no pidfd_open.
int PidFd(pid_t pid) {
#ifdef SYS_pidfd_open
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) {
    ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
    return static_cast<int>(fd);
  }
#endif
  return -1;
}

}  // namespace

WorkerSet::WorkerSet(std::function<void(const WorkerEnd&)> on_exit, LineObserver on_line)
    : on_exit_(std::move(on_exit)), on_line_(std::move(on_line)) {}

WorkerSet::~WorkerSet() { StopAll(std::chrono::milliseconds(0)); }

Result<Standby> StartStandby(const std::vector<std::string>& argv,
                             const std::vector<std::pair<std::string, std::string>>& env,
                             const std::vector<std::string>& unset_env) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return IOError("pipe: cannot create");
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return IOError("pipe: cannot create");
  }
  const std::string tag = NewTag();
  ProcessSpec ps;
  ps.argv = argv;
  ps.env = env;
  ps.env.emplace_back(worker_env::kStandby, "1");
  ps.env.emplace_back(worker_env::kWorkerTag, tag);
  ps.unset_env = unset_env;
  ps.input_fd = in[0];
  ps.output_fd = out[1];
  ps.new_session = true;
  ps.die_with_parent = true;
  Result<Subprocess> p = Subprocess::Start(ps);
  ::close(in[0]);
  ::close(out[1]);
  if (!p.ok()) {
    ::close(in[1]);
    ::close(out[0]);
    return p.status();
  }
  Standby s;
  s.argv = argv;
  s.env = env;
  s.process.emplace(std::move(p).value());
  s.input_fd = in[1];
  s.output_fd = out[0];
  s.tag = tag;
  return s;
}

void DiscardStandby(Standby& standby) {
  if (standby.input_fd >= 0) ::close(standby.input_fd);
  if (standby.output_fd >= 0) ::close(standby.output_fd);
  standby.input_fd = standby.output_fd = -1;
  if (standby.process) {
    // End-of-file tells it to exit; a kill makes sure, and reaps it.
    const ProcessTree tree{standby.process->pid(), TagEntry(standby.tag)};
    tree.Signal(SIGKILL);
    standby.process->Exited(/*block=*/true);
    tree.Signal(SIGKILL);  // what it started meanwhile, while its pid is still reserved
    standby.process->Wait();
    standby.process.reset();
  }
}

std::string AssignmentText(const std::vector<std::pair<std::string, std::string>>& env) {
  std::string text;
  for (const auto& [k, v] : env) text += k + "=" + v + "\n";
  return text;
}

Status WorkerSet::Adopt(Standby standby, const WorkerSpec& spec) {
  if (!standby.process || standby.process->WaitFor(std::chrono::milliseconds(0))) {
    standby.process.reset();  // already reaped above
    DiscardStandby(standby);
    return Unavailable("the standby worker had exited");
  }
  const std::string assignment = AssignmentText(spec.env);
  // The assignment fits the pipe's buffer (64 KiB); a failed write means the
  // standby is gone.
  const bool written = ::write(standby.input_fd, assignment.data(), assignment.size()) ==
                       static_cast<ssize_t>(assignment.size());
  ::close(standby.input_fd);
  standby.input_fd = -1;
  if (!written) {
    DiscardStandby(standby);
    return Unavailable("could not hand the standby worker its assignment");
  }
  Add(spec, std::move(*standby.process), standby.output_fd, standby.tag);
  return Status::Ok();
}

void WorkerSet::Add(const WorkerSpec& spec, Subprocess process, int out_fd,
                    const std::string& tag) {
  MutexLock lock(&mu_);
  auto w = std::make_unique<Worker>();
  w->rank = spec.rank;
  w->pid = process.pid();
  w->tree = ProcessTree{process.pid(), TagEntry(tag)};
  w->stacks_path = spec.stacks_path;
  Worker* raw = w.get();  // owned by workers_, which outlives the watcher (joined in StopAll)
  w->watcher = std::thread(&WorkerSet::Watch, this, raw, std::move(process), out_fd, spec.log_path);
  workers_.push_back(std::move(w));
}

Status WorkerSet::Start(const WorkerSpec& spec) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return IOError("pipe: cannot create");
  const std::string tag = NewTag();
  ProcessSpec ps;
  ps.argv = spec.argv;
  ps.env = spec.env;
  ps.env.emplace_back(worker_env::kWorkerTag, tag);
  ps.unset_env = spec.unset_env;
  ps.output_fd = fds[1];
  ps.new_session = true;
  ps.die_with_parent = true;
  Result<Subprocess> p = Subprocess::Start(ps);
  ::close(fds[1]);
  if (!p.ok()) {
    ::close(fds[0]);
    return p.status();
  }
  Add(spec, std::move(p).value(), fds[0], tag);
  return Status::Ok();
}

void WorkerSet::Watch(Worker* worker, Subprocess process, int out_fd, std::string log_path) {
  // The output is read as it comes; the exit is found by the pid (a pidfd,
  // else a short poll), since a descendant may hold the pipe open for ever.
  // Once the worker has exited, the rest of its tree is killed and the
  // output drained until its end or kDrainAfterExit, then the exit goes up
  // with the worker's last words.
  std::ofstream log(log_path, std::ios::app);
  std::deque<std::string> tail;
  size_t tail_bytes = 0;
  uint64_t tail_epoch = 0;
  // A rejoin (WorkerSet::Rejoin) since the last line: what came before is
  // not this generation's.
  const auto forget_earlier_generations = [&] {
    const uint64_t now = worker->tail_epoch.load();
    if (now == tail_epoch) return;
    tail_epoch = now;
    tail.clear();
    tail_bytes = 0;
  };
  core::LineSplitter lines;
  const auto on_line = [&](std::string_view line) {
    forget_earlier_generations();
    tail.emplace_back(line);
    tail_bytes += line.size();
    while (tail.size() > kTailLines || (tail.size() > 1 && tail_bytes > kTailBytes)) {
      tail_bytes -= tail.front().size();
      tail.pop_front();
    }
    if (on_line_) on_line_(worker->rank, line);
  };
  ::fcntl(out_fd, F_SETFL, ::fcntl(out_fd, F_GETFL) | O_NONBLOCK);
  int pid_fd = PidFd(process.pid());
  std::optional<ExitStatus> status;
  // Kills what is left of the tree while the exited worker, not yet reaped,
  // keeps its pid (its group's and session's id) from reuse; then reaps it.
  const auto reap = [&] {
    worker->tree.Signal(SIGKILL);
    {
      MutexLock lock(&worker->mu);
      worker->reaped = true;
    }
    status = process.Wait();
  };
  Clock::time_point drain_until;
  bool eof = false;
  char buf[8192];
  while (!eof) {
    if (!status && process.Exited(/*block=*/false)) {
      reap();
      drain_until = Clock::now() + kDrainAfterExit;
      if (pid_fd >= 0) ::close(pid_fd);
      pid_fd = -1;
    }
    int timeout_ms = pid_fd >= 0 ? -1 : static_cast<int>(kExitPoll.count());
    if (status) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(drain_until - Clock::now()).count();
      if (left <= 0) break;
      timeout_ms = static_cast<int>(left);
    }
    pollfd fds[2] = {{out_fd, POLLIN, 0}, {pid_fd, POLLIN, 0}};
    if (::poll(fds, pid_fd >= 0 ? 2 : 1, timeout_ms) < 0 && errno != EINTR) break;
    for (;;) {
      const ssize_t n = ::read(out_fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) eof = true;
      if (n <= 0) break;
      log.write(buf, n);
      log.flush();
      lines.Feed(std::string_view(buf, static_cast<size_t>(n)), on_line);
    }
  }
  if (pid_fd >= 0) ::close(pid_fd);
  ::close(out_fd);
  lines.Finish(on_line);
  if (!status) {
    // Its output ended first (it closed it, or exited just now): wait for
    // the exit itself, which a stop makes come.
    process.Exited(/*block=*/true);
    reap();
  }
  forget_earlier_generations();
  WorkerEnd end;
  end.rank = worker->rank;
  end.status = *status;
  for (const std::string& line : tail) end.tail += line + "\n";
  {
    MutexLock lock(&worker->mu);
    worker->done = true;
    end.stopped = worker->stopped;
  }
  on_exit_(end);
}

void WorkerSet::StopAll(std::chrono::milliseconds grace) {
  std::vector<std::unique_ptr<Worker>> workers;
  {
    MutexLock lock(&mu_);
    workers.swap(workers_);
  }
  // Under the worker's mu so that its watcher cannot reap it (and free its
  // pid) between the check and the signal.
  const auto signal_tree = [&](Worker& w, int sig) {
    MutexLock lock(&w.mu);
    if (w.reaped) return;
    w.stopped = true;
    w.tree.Signal(sig);
    // A stopped (SIGSTOP) worker acts on SIGTERM only once continued, so
    // it would sit out the whole grace: continued, it ends at once, or runs
    // its own handler within the grace (systemd sends SIGCONT after its
    // kill signal for the same reason). Running workers ignore SIGCONT.
    ::kill(-w.pid, SIGCONT);
  };
  for (auto& w : workers) signal_tree(*w, grace.count() > 0 ? SIGTERM : SIGKILL);
  const auto deadline = Clock::now() + grace;
  for (auto& w : workers) {
    for (;;) {
      {
        MutexLock lock(&w->mu);
        if (w->done) break;
      }
      if (Clock::now() >= deadline) {
        signal_tree(*w, SIGKILL);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  for (auto& w : workers) {
    if (w->watcher.joinable()) w->watcher.join();
  }
}

void WorkerSet::KillAll() {
  MutexLock lock(&mu_);
  for (auto& w : workers_) {
    MutexLock worker(&w->mu);
    if (w->reaped) continue;
    w->stopped = true;
    w->tree.Signal(SIGKILL);
  }
}

bool WorkerSet::Signal(int rank, int sig) {
  MutexLock lock(&mu_);
  for (auto& w : workers_) {
    MutexLock worker(&w->mu);
    if (w->rank == rank && !w->reaped) {
      ::kill(-w->pid, sig);
      return true;
    }
  }
  return false;
}

bool WorkerSet::Rejoin(int rank, int new_rank) {
  MutexLock lock(&mu_);
  for (auto& w : workers_) {
    MutexLock worker(&w->mu);
    if (w->rank == rank && !w->done) {
      w->rank = new_rank;
      ++w->tail_epoch;
      return true;
    }
  }
  return false;
}

void WorkerSet::ForgetLastWords(int rank) {
  MutexLock lock(&mu_);
  for (auto& w : workers_) {
    MutexLock worker(&w->mu);
    if (w->rank == rank && !w->done) ++w->tail_epoch;
  }
}

std::map<int, pid_t> WorkerSet::Pids() const {
  MutexLock lock(&mu_);
  std::map<int, pid_t> out;
  for (const auto& w : workers_) {
    MutexLock worker(&w->mu);
    if (!w->done) out[w->rank] = w->pid;
  }
  return out;
}

std::map<int, std::string> WorkerSet::CaptureStacks(std::chrono::milliseconds timeout,
                                                    const std::map<int, int>& stack_signals) {
  std::vector<StackTarget> targets;
  {
    MutexLock lock(&mu_);
    for (const auto& w : workers_) {
      MutexLock worker(&w->mu);
      if (w->done) continue;
      StackTarget t{w->rank, w->pid, w->stacks_path};
      auto it = stack_signals.find(w->rank);
      if (it != stack_signals.end() && !w->stacks_path.empty()) t.signal = it->second;
      targets.push_back(std::move(t));
    }
  }
  return agent::CaptureStacks(targets, timeout);
}

}  // namespace endure::agent
