// Stack capture under one deadline: self-dumps, py-spy and gdb in parallel.
#include "agent/stack_capture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "common/subprocess.h"

namespace endure::agent {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Self-dumped stacks: the most we wait for them (and at most three quarters
// of the deadline, so that a rank that does not answer is still read from
// outside in the rest),
// how long the file must stop growing to count as complete.
constexpr milliseconds kSelfDumpMaxWait{3000};
constexpr milliseconds kSelfDumpSettle{200};
// How often the files and the tools are looked at.
constexpr milliseconds kPoll{20};

// Whether `pid` is stopped (SIGSTOP, or a tracer holds it): it would handle
// a signal only once continued.
bool IsStopped(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // "PID (COMM) STATE ...": COMM may hold spaces and parentheses.
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
  const char state = stat[paren + 2];
  return state == 'T' || state == 't';
}

// Whether the executable of `pid` is a Python interpreter.
bool IsPython(pid_t pid) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec);
  return !ec && exe.filename().string().rfind("python", 0) == 0;
}

// How `pid` was started: the first word of its command line.
std::string Argv0(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline");
  std::string first;
  std::getline(f, first, '\0');
  return first;
}

bool IsExecutableFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

// py-spy for the interpreter of `pid`: $ENDURE_PY_SPY, beside the
// interpreter it was started as (a virtualenv's bin), then on PATH. Empty:
// none.
std::string FindPySpy(pid_t pid) {
  if (const char* env = std::getenv("ENDURE_PY_SPY"); env != nullptr && *env != '\0') {
    return IsExecutableFile(env) ? env : "";
  }
  const fs::path argv0 = Argv0(pid);
  if (argv0.is_absolute() && IsExecutableFile(argv0.parent_path() / "py-spy")) {
    return (argv0.parent_path() / "py-spy").string();
  }
  const std::string on_path = ResolveProgram("py-spy");
  return on_path != "py-spy" ? on_path : "";
}

// Empties the stacks file before a dump. The worker keeps its own descriptor
// (and offset) on it: a second dump may start past the end, so readers drop
// the NUL bytes of that hole.
void TruncateStacksFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd >= 0) ::close(fd);
}

// The file itself, never where a symlink put in its place points.
std::optional<off_t> FileSize(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return st.st_size;
}

// At most kMaxStackBytes of a regular file (a FIFO would never end), without
// the NUL bytes of a hole.
std::string ReadStacksFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return "";
  }
  std::string text(kMaxStackBytes, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  std::erase(text, '\0');
  return text;
}

std::string SignalName(int sig) {
  if (sig == SIGUSR1) return "SIGUSR1";
  if (sig == SIGUSR2) return "SIGUSR2";
  if (sig >= SIGRTMIN && sig <= SIGRTMAX) return "SIGRTMIN+" + std::to_string(sig - SIGRTMIN);
  return "signal " + std::to_string(sig);
}

// gdb's frames of "thread apply all bt", without its chatter about loading
// symbols, the main thread (gdb's "Thread 1", printed last) first: that is
// where the training loop is. Empty: no frame.
std::string GdbFrames(const std::string& text) {
  std::string main_thread, others, *current = &others;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    const std::string line = text.substr(pos, nl - pos);
    if (line.rfind("Thread ", 0) == 0) {
      current = line.rfind("Thread 1 ", 0) == 0 ? &main_thread : &others;
    }
    if (line.rfind("#", 0) == 0 || line.rfind("Thread ", 0) == 0) *current += line + "\n";
    pos = nl + 1;
  }
  return main_thread + others;
}

// The last lines of a tool's output that said why it failed, on one line.
std::string Gist(const std::string& text) {
  std::string s = text;
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  if (s.size() > 300) s = "..." + s.substr(s.size() - 300);
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s.empty() ? "no output" : s;
}

enum class Tool { kPySpy, kGdb };

std::string ToolName(Tool t) { return t == Tool::kPySpy ? "py-spy" : "gdb"; }

// One rank's capture as it goes.
struct Capture {
  StackTarget target;
  bool python = false;
  std::string note;  // lines before the stacks: why from outside, tools that failed
  // Waiting for its own dump.
  bool self = false;
  std::optional<off_t> size;
  Clock::time_point size_since;
  // Reading it from outside: the tools left to try, the one running.
  std::deque<std::pair<Tool, std::string>> tools;
  std::optional<Subprocess> running;
  Tool running_tool = Tool::kGdb;
  std::string output_path;
  std::optional<std::string> text;  // done
};

void RemoveOutput(Capture& c) {
  if (!c.output_path.empty()) std::remove(c.output_path.c_str());
  c.output_path.clear();
}

// Starts the next tool of `c`; none left, it ends with its notes (what each
// tool said) and "not captured".
void StartNextTool(Capture& c) {
  while (!c.tools.empty()) {
    const auto [tool, program] = c.tools.front();
    c.tools.pop_front();
    char path[] = "/tmp/endure_stack.XXXXXX";
    const int fd = ::mkstemp(path);
    if (fd < 0) {
      c.note += "could not read the stacks from outside: no temporary file\n";
      break;
    }
    ::close(fd);
    ProcessSpec ps;
    const std::string pid = std::to_string(c.target.pid);
    if (tool == Tool::kPySpy) {
      // --nonblocking: read the interpreter's memory without stopping it
      // (a stopped one stays as it is).
      ps.argv = {program, "dump", "--pid", pid, "--nonblocking"};
    } else {
      ps.argv = {program,
                 "-p",
                 pid,
                 "-batch",
                 "-nx",
                 "-ex",
                 "set pagination off",
                 "-ex",
                 "thread apply all bt"};
      ps.unset_env = {"DEBUGINFOD_URLS"};
    }
    ps.output_path = path;
    ps.die_with_parent = true;
    Result<Subprocess> started = Subprocess::Start(ps);
    if (!started.ok()) {
      std::remove(path);
      c.note += ToolName(tool) + " could not start: " + started.status().message() + "\n";
      continue;
    }
    c.running.emplace(std::move(*started));
    c.running_tool = tool;
    c.output_path = path;
    return;
  }
  c.text = c.note + "not captured";
}

// Reads `c` from outside: py-spy first for a Python interpreter where it is
// installed, gdb otherwise or after it.
void StartOutside(Capture& c, const StackTools& tools) {
  const std::string py_spy =
      c.python ? (tools.py_spy.empty() ? FindPySpy(c.target.pid) : tools.py_spy) : "";
  if (!py_spy.empty()) c.tools.emplace_back(Tool::kPySpy, py_spy);
  c.tools.emplace_back(Tool::kGdb, tools.gdb);
  StartNextTool(c);
}

// The running tool of `c` has exited: its stacks, or the next tool.
void FinishTool(Capture& c) {
  const ExitStatus status = c.running->Wait();
  c.running.reset();
  const std::string out = ReadStacksFile(c.output_path);
  RemoveOutput(c);
  if (c.running_tool == Tool::kPySpy) {
    if (status.Success() && !out.empty()) {
      c.text = c.note + "Python stacks (py-spy, read from outside):\n" + out;
      return;
    }
    c.note += "py-spy failed (" + status.ToString() + "): " + Gist(out) + "\n";
  } else {
    const std::string frames = GdbFrames(out);
    if (!frames.empty()) {
      c.text = c.note + frames;
      return;
    }
    c.note += "gdb found no stack (" + status.ToString() + "): " + Gist(out) + "\n";
  }
  StartNextTool(c);
}

// Its own dump, complete or as far as it got: a Python interpreter's is
// faulthandler's, a native program's its client's (Session::DumpStacksOnSignal).
std::optional<std::string> SelfDump(const Capture& c, bool complete) {
  const std::string text = ReadStacksFile(c.target.stacks_path);
  if (text.empty()) return std::nullopt;
  const std::string head = c.python ? "Python stacks (faulthandler" : "Stacks (its own dump";
  return head + (complete ? "" : ", still being written at its deadline") + "):\n" + text;
}

}  // namespace

std::map<int, std::string> CaptureStacks(const std::vector<StackTarget>& targets,
                                         milliseconds timeout, const StackTools& tools) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + timeout;
  const Clock::time_point self_until = start + std::min(timeout * 3 / 4, kSelfDumpMaxWait);
  const std::string deadline_text = std::to_string(timeout.count()) + " ms";

  std::vector<Capture> captures;
  for (const StackTarget& t : targets) {
    Capture c;
    c.target = t;
    c.python = IsPython(t.pid);
    captures.push_back(std::move(c));
  }
  // Every rank at once: the self-dumping ones signalled, the others read
  // from outside.
  for (Capture& c : captures) {
    if (c.target.signal > 0 && !c.target.stacks_path.empty()) {
      if (IsStopped(c.target.pid)) {
        c.note =
            "The process is stopped (SIGSTOP) and cannot dump its own stacks; read from "
            "outside.\n";
      } else {
        TruncateStacksFile(c.target.stacks_path);
        ::kill(c.target.pid, c.target.signal);  // the process only: its children may not handle it
        c.self = true;
        continue;
      }
    } else if (c.python) {
      c.note =
          "Python frames unavailable: the program does not use the endure Python client "
          "(endure.Session.from_env() registers a stack dump on a signal); read from outside.\n";
    }
    StartOutside(c, tools);
  }

  auto pending = [&] {
    return std::any_of(captures.begin(), captures.end(),
                       [](const Capture& c) { return !c.text.has_value(); });
  };
  while (pending() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::min<Clock::duration>(kPoll, deadline - Clock::now()));
    const Clock::time_point now = Clock::now();
    for (Capture& c : captures) {
      if (c.text) continue;
      if (c.self) {
        const std::optional<off_t> size = FileSize(c.target.stacks_path);
        if (size != c.size) {
          c.size = size;
          c.size_since = now;
        } else if (size && *size > 0 && now - c.size_since >= kSelfDumpSettle) {
          c.text = SelfDump(c, true);
        }
        if (!c.text && now >= self_until) {
          c.self = false;
          c.text = SelfDump(c, false);
          if (!c.text) {
            c.note = "No stacks arrived within " +
                     std::to_string(
                         std::chrono::duration_cast<milliseconds>(self_until - start).count()) +
                     " ms of " + SignalName(c.target.signal) +
                     " (the signal the program registered); read from outside.\n";
            StartOutside(c, tools);
          }
        }
      } else if (c.running && c.running->Exited(false)) {
        FinishTool(c);
      }
    }
  }
  // The deadline: what is still running is given up, and said.
  std::map<int, std::string> out;
  for (Capture& c : captures) {
    if (!c.text && c.self) c.text = SelfDump(c, false);
    if (!c.text && c.running) {
      c.tools.clear();  // no time for another
      if (c.running->Exited(false)) {
        FinishTool(c);
      } else {
        c.running->Signal(SIGKILL);
        c.running->Wait();
        c.running.reset();
        RemoveOutput(c);
        c.text = c.note + "not captured: " + ToolName(c.running_tool) + " gave no stacks within " +
                 "the " + deadline_text + " stack deadline (stack_timeout); the stop went on " +
                 "without them";
      }
    }
    if (!c.text) {
      c.text = c.note + "not captured within the " + deadline_text + " stack deadline";
    }
    out[c.target.rank] = *c.text;
  }
  return out;
}

}  // namespace endure::agent
