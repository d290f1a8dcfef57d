// Subprocess via fork/exec.
#include "common/subprocess.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

namespace endure {

std::string ExitStatus::ToString() const {
  if (exited) return "exit code " + std::to_string(code);
  return "signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
}

ExitStatus DecodeWaitStatus(int wstatus) {
  ExitStatus s;
  if (WIFEXITED(wstatus)) {
    s.exited = true;
    s.code = WEXITSTATUS(wstatus);
  } else if (WIFSIGNALED(wstatus)) {
    s.signal = WTERMSIG(wstatus);
  }
  return s;
}

Result<Subprocess> Subprocess::Start(const ProcessSpec& spec) {
  if (spec.argv.empty()) return InvalidArgument("empty command");
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls are allowed.
  std::vector<char*> argv;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string key = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [k, v] : spec.env) replaced |= (k == key);
    for (const auto& k : spec.unset_env) replaced |= (k == key);
    if (!replaced) env_strings.push_back(std::move(entry));
  }
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  int out_fd = -1;
  if (!spec.output_path.empty()) {
    out_fd = ::open(spec.output_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (out_fd < 0) {
      return IOError("cannot open '" + spec.output_path + "': " + std::strerror(errno));
    }
  }
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    if (out_fd >= 0) ::close(out_fd);
    return IOError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    if (spec.new_session) {
      ::setsid();
    } else if (spec.new_process_group) {
      ::setpgid(0, 0);
    }
    if (spec.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    }
    if (spec.input_fd >= 0) ::dup2(spec.input_fd, 0);
    if (out_fd < 0 && spec.output_fd >= 0) out_fd = spec.output_fd;
    if (out_fd >= 0) {
      ::dup2(out_fd, 1);
      ::dup2(out_fd, 2);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (out_fd >= 0) ::close(out_fd);
  return Subprocess(pid);
}

void Subprocess::Signal(int sig) const {
  if (pid_ > 0) ::kill(pid_, sig);
}

void Subprocess::SignalGroup(int sig) const {
  if (pid_ > 0) ::kill(-pid_, sig);
}

ExitStatus Subprocess::Wait() {
  int wstatus = 0;
  while (::waitpid(pid_, &wstatus, 0) < 0 && errno == EINTR) {
  }
  return DecodeWaitStatus(wstatus);
}

std::optional<ExitStatus> Subprocess::WaitFor(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int wstatus = 0;
    pid_t r = ::waitpid(pid_, &wstatus, WNOHANG);
    if (r == pid_) return DecodeWaitStatus(wstatus);
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

namespace {

// Reads at most `max` bytes of a /proc file (whose size stat does not tell).
std::string ReadProcFile(const std::string& path, size_t max) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string out;
  char buf[4096];
  while (out.size() < max) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out.substr(0, max);
}

// The process group and session of a live `pid` from /proc/PID/stat ("PID
// (COMM) STATE PPID PGRP SESSION ..."; COMM may hold spaces and
// parentheses); false for a zombie or a process that is gone.
bool GroupAndSession(pid_t pid, pid_t* pgrp, pid_t* session) {
  const std::string stat = ReadProcFile("/proc/" + std::to_string(pid) + "/stat", 4096);
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return false;
  long long ppid = 0, group = 0, sid = 0;
  char state = 0;
  if (std::sscanf(stat.c_str() + paren + 1, " %c %lld %lld %lld", &state, &ppid, &group, &sid) !=
      4) {
    return false;
  }
  if (state == 'Z' || state == 'X') return false;
  *pgrp = static_cast<pid_t>(group);
  *session = static_cast<pid_t>(sid);
  return true;
}

bool EnvironHolds(pid_t pid, std::string_view entry) {
  // ARG_MAX bounds the environment a process was started with.
  const std::string env = ReadProcFile("/proc/" + std::to_string(pid) + "/environ", 4 << 20);
  size_t pos = 0;
  while (pos < env.size()) {
    size_t end = env.find('\0', pos);
    if (end == std::string::npos) end = env.size();
    if (std::string_view(env).substr(pos, end - pos) == entry) return true;
    pos = end + 1;
  }
  return false;
}

}  // namespace

std::vector<pid_t> ProcessTree::Members() const {
  std::vector<pid_t> out;
  if (leader <= 1) return out;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return out;
  const pid_t self = ::getpid();
  while (const dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    const long n = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || n <= 1 || n == self) continue;
    const pid_t pid = static_cast<pid_t>(n);
    pid_t pgrp = 0, session = 0;
    if (!GroupAndSession(pid, &pgrp, &session)) continue;  // dead, or gone meanwhile
    if (pgrp == leader || session == leader ||
        (!env_marker.empty() && EnvironHolds(pid, env_marker))) {
      out.push_back(pid);
    }
  }
  ::closedir(proc);
  return out;
}

int ProcessTree::Signal(int sig) const {
  if (leader <= 1) return 0;
  // Found first, so that the count does not depend on how fast the group dies.
  const std::vector<pid_t> members = Members();
  ::kill(-leader, sig);
  for (pid_t pid : members) ::kill(pid, sig);
  return static_cast<int>(members.size());
}

bool Subprocess::Exited(bool block) {
  for (;;) {
    siginfo_t info{};
    const int r =
        ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT | (block ? 0 : WNOHANG));
    if (r < 0 && errno == EINTR) continue;
    // With WNOHANG and no exit yet, waitid returns 0 and leaves si_pid 0.
    return r == 0 && info.si_pid == pid_;
  }
}

std::string ResolveProgram(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return program;
}

Result<int> PickFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IOError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    return IOError(std::string("bind 127.0.0.1:0: ") + std::strerror(err));
  }
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace endure
