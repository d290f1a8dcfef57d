// WorkerSet: processes, pipes and gdb.
#include "agent/worker_set.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>

namespace endure::agent {
namespace {

constexpr size_t kTailLines = 60;

}  // namespace

WorkerSet::WorkerSet(std::function<void(const WorkerEnd&)> on_exit)
    : on_exit_(std::move(on_exit)) {}

WorkerSet::~WorkerSet() { StopAll(std::chrono::milliseconds(0)); }

Result<Standby> StartStandby(const std::vector<std::string>& argv,
                             const std::vector<std::pair<std::string, std::string>>& env) {
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0) return IOError("pipe: cannot create");
  if (::pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return IOError("pipe: cannot create");
  }
  ProcessSpec ps;
  ps.argv = argv;
  ps.env = env;
  ps.env.emplace_back("ENDURE_STANDBY", "1");
  ps.input_fd = in[0];
  ps.output_fd = out[1];
  ps.new_process_group = true;
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
  s.process.emplace(std::move(p).value());
  s.input_fd = in[1];
  s.output_fd = out[0];
  return s;
}

void DiscardStandby(Standby& standby) {
  if (standby.input_fd >= 0) ::close(standby.input_fd);
  if (standby.output_fd >= 0) ::close(standby.output_fd);
  standby.input_fd = standby.output_fd = -1;
  if (standby.process) {
    // End-of-file tells it to exit; a kill makes sure, and reaps it.
    standby.process->SignalGroup(SIGKILL);
    standby.process->Wait();
    standby.process.reset();
  }
}

Status WorkerSet::Adopt(Standby standby, const WorkerSpec& spec) {
  if (!standby.process || standby.process->WaitFor(std::chrono::milliseconds(0))) {
    standby.process.reset();  // already reaped above
    DiscardStandby(standby);
    return Unavailable("the standby worker had exited");
  }
  std::string assignment;
  for (const auto& [k, v] : spec.env) assignment += k + "=" + v + "\n";
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
  std::lock_guard<std::mutex> lock(mu_);
  auto w = std::make_unique<Worker>();
  w->rank = spec.rank;
  w->pid = standby.process->pid();
  Worker* raw = w.get();  // owned by workers_, which outlives the watcher (joined in StopAll)
  w->watcher = std::thread(&WorkerSet::Watch, this, raw, std::move(*standby.process),
                           standby.output_fd, spec.log_path);
  workers_.push_back(std::move(w));
  return Status::Ok();
}

Status WorkerSet::Start(const WorkerSpec& spec) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return IOError("pipe: cannot create");
  ProcessSpec ps;
  ps.argv = spec.argv;
  ps.env = spec.env;
  ps.output_fd = fds[1];
  ps.new_process_group = true;
  ps.die_with_parent = true;
  Result<Subprocess> p = Subprocess::Start(ps);
  ::close(fds[1]);
  if (!p.ok()) {
    ::close(fds[0]);
    return p.status();
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto w = std::make_unique<Worker>();
  w->rank = spec.rank;
  w->pid = p->pid();
  Worker* raw = w.get();  // owned by workers_, which outlives the watcher (joined in StopAll)
  w->watcher =
      std::thread(&WorkerSet::Watch, this, raw, std::move(p).value(), fds[0], spec.log_path);
  workers_.push_back(std::move(w));
  return Status::Ok();
}

void WorkerSet::Watch(Worker* worker, Subprocess process, int out_fd, std::string log_path) {
  // Drain the output until EOF (every writer gone), then reap: the exit is
  // reported with the worker's last words, never before them.
  std::ofstream log(log_path, std::ios::app);
  std::deque<std::string> tail;
  std::string partial;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(out_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    log.write(buf, n);
    partial.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = partial.find('\n')) != std::string::npos) {
      tail.push_back(partial.substr(0, nl));
      partial.erase(0, nl + 1);
      if (tail.size() > kTailLines) tail.pop_front();
    }
    log.flush();
  }
  ::close(out_fd);
  if (!partial.empty()) tail.push_back(partial);
  WorkerEnd end;
  end.rank = worker->rank;
  end.status = process.Wait();
  for (const std::string& line : tail) end.tail += line + "\n";
  {
    std::lock_guard<std::mutex> lock(mu_);
    worker->done = true;
  }
  on_exit_(end);
}

void WorkerSet::StopAll(std::chrono::milliseconds grace) {
  std::vector<std::unique_ptr<Worker>> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers.swap(workers_);
    for (auto& w : workers) {
      if (!w->done) ::kill(-w->pid, grace.count() > 0 ? SIGTERM : SIGKILL);
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (auto& w : workers) {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (w->done) break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(-w->pid, SIGKILL);
        ::kill(-w->pid, SIGCONT);  // a SIGSTOPped worker must run to die
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  for (auto& w : workers) {
    if (w->watcher.joinable()) w->watcher.join();
  }
}

bool WorkerSet::Signal(int rank, int sig) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& w : workers_) {
    if (w->rank == rank && !w->done) {
      ::kill(-w->pid, sig);
      return true;
    }
  }
  return false;
}

std::map<int, pid_t> WorkerSet::Pids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<int, pid_t> out;
  for (const auto& w : workers_) {
    if (!w->done) out[w->rank] = w->pid;
  }
  return out;
}

std::map<int, std::string> WorkerSet::CaptureStacks(std::chrono::milliseconds timeout) {
  std::map<int, std::string> out;
  for (const auto& [rank, pid] : Pids()) {
    char path[] = "/tmp/endure_stack.XXXXXX";
    int fd = ::mkstemp(path);
    if (fd < 0) continue;
    ::close(fd);
    ProcessSpec ps;
    ps.argv = {"/usr/bin/gdb",       "-p",  std::to_string(pid),  "-batch", "-nx", "-ex",
               "set pagination off", "-ex", "thread apply all bt"};
    ps.output_path = path;
    ps.unset_env = {"DEBUGINFOD_URLS"};
    Result<Subprocess> gdb = Subprocess::Start(ps);
    if (!gdb.ok()) {
      out[rank] = "stack capture failed: " + gdb.status().message();
      continue;
    }
    if (!gdb->WaitFor(timeout)) {
      gdb->Signal(SIGKILL);
      gdb->Wait();
      out[rank] = "stack capture timed out after " + std::to_string(timeout.count()) + " ms";
    } else {
      std::ifstream f(path);
      std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      // Keep the frames, not gdb's chatter about loading symbols, with the
      // main thread (gdb's "Thread 1", printed last) first: that is where
      // the training loop is.
      std::string main_thread, others, *current = &others;
      size_t pos = 0;
      while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string::npos) nl = text.size();
        std::string line = text.substr(pos, nl - pos);
        if (line.rfind("Thread ", 0) == 0) {
          current = line.rfind("Thread 1 ", 0) == 0 ? &main_thread : &others;
        }
        if (line.rfind("#", 0) == 0 || line.rfind("Thread ", 0) == 0) *current += line + "\n";
        pos = nl + 1;
      }
      out[rank] = main_thread.empty() && others.empty() ? text : main_thread + others;
    }
    std::remove(path);
  }
  return out;
}

}  // namespace endure::agent
