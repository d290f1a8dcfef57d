// Stack signatures and grouping; see stack_signature.h.
#include "core/stack_signature.h"

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>

namespace endure::core {
namespace {

struct Thread {
  std::vector<std::string> frames;  // normalized, innermost first
};

struct ParsedDump {
  std::vector<Thread> threads;
  int main_thread = -1;  // index into threads; -1: none had frames
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHexDigit(char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; }

// The index of the '(' that matches the ')' ending `s`, skipping quoted
// argument values (gdb prints char* arguments as 0x... "text"); npos when
// unbalanced.
size_t MatchingOpenParen(std::string_view s) {
  int depth = 0;
  bool quoted = false;
  for (size_t i = s.size(); i-- > 0;) {
    const char c = s[i];
    if (c == '"' && (i == 0 || s[i - 1] != '\\')) quoted = !quoted;
    if (quoted) continue;
    if (c == ')') ++depth;
    if (c == '(' && --depth == 0) return i;
  }
  return std::string_view::npos;
}

void EraseClones(std::string& name) {
  // GCC's specialized copies ("foo [clone .isra.0]", "foo.constprop.0" in
  // some symbolizers) are the same function for our purpose.
  for (size_t pos; (pos = name.find(" [clone ")) != std::string::npos;) {
    const size_t end = name.find(']', pos);
    name.erase(pos, end == std::string::npos ? std::string::npos : end - pos + 1);
  }
}

// A C++ function name without its parameter list and qualifiers:
// "std::condition_variable::wait<P>(std::unique_lock<std::mutex>&, P)" ->
// "std::condition_variable::wait<P>". Names of unknown or special frames
// ("??", "<signal handler called>") pass unchanged.
std::string NormalizeFunctionName(std::string_view name) {
  name = Trim(name);
  for (std::string_view q : {" const", " volatile", " &&", " &", "&&", "&"}) {
    if (name.ends_with(q) && name.size() > q.size() && name[name.size() - q.size() - 1] == ')') {
      name.remove_suffix(q.size());
    }
  }
  if (name.ends_with(')')) {
    const size_t open = MatchingOpenParen(name);
    if (open != std::string_view::npos && open > 0 && !Trim(name.substr(0, open)).empty() &&
        !name.substr(0, open).ends_with("operator")) {
      name = Trim(name.substr(0, open));
    }
  }
  std::string out(name);
  EraseClones(out);
  return std::string(Trim(out));
}

// One gdb frame line after "#N": "0x00007f.. in NAME (ARGS) at FILE:LINE",
// "NAME (ARGS) at FILE:LINE" (inlined or at a line's first instruction),
// "0x.. in NAME () from /lib/libX.so", or the bare "NAME" of the agent's
// tests and hand-written dumps.
std::string NormalizeGdbFrame(std::string_view rest) {
  rest = Trim(rest);
  if (rest.starts_with("0x")) {
    size_t i = 2;
    while (i < rest.size() && IsHexDigit(rest[i])) ++i;
    rest = Trim(rest.substr(i));
    if (rest.starts_with("in ")) rest = Trim(rest.substr(3));
  }
  // " at FILE:LINE" and " from LIB" follow the argument list; an argument
  // value that happens to contain " at " is not followed by one bare token.
  for (std::string_view marker : {" at ", " from "}) {
    const size_t pos = rest.rfind(marker);
    if (pos == std::string_view::npos) continue;
    const std::string_view tail = rest.substr(pos + marker.size());
    if (Trim(rest.substr(0, pos)).ends_with(')') && !tail.empty() &&
        tail.find_first_of(" \"") == std::string_view::npos) {
      rest = Trim(rest.substr(0, pos));
    }
  }
  if (rest.starts_with('<')) return std::string(rest);  // "<signal handler called>"
  // The argument list: the balanced "(...)" at the end, after a space.
  if (rest.ends_with(')')) {
    const size_t open = MatchingOpenParen(rest);
    if (open != std::string_view::npos && open > 0 && rest[open - 1] == ' ') {
      rest = Trim(rest.substr(0, open));
    }
  }
  return NormalizeFunctionName(rest);
}

std::string Demangle(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> out(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), &std::free);
  return status == 0 && out ? std::string(out.get()) : mangled;
}

// glibc backtrace_symbols: "./trainer(_ZN6endure4StepEv+0x1a) [0x55d0c8a1b2c4]",
// "/lib/x86_64-linux-gnu/libc.so.6(+0x29d90) [0x7f..]"; backtrace_symbols_fd
// writes no space before the '[' (the C++ client's dump). Returns false for
// any other line.
bool ParseBacktraceSymbol(std::string_view line, std::string* frame) {
  if (!line.ends_with(']')) return false;
  const size_t bracket = line.rfind("[0x");
  if (bracket == std::string_view::npos) return false;
  const std::string_view head = Trim(line.substr(0, bracket));
  if (!head.ends_with(')') || head.find(' ') != std::string_view::npos) return false;
  const size_t open = head.find('(');
  if (open == std::string_view::npos) return false;
  std::string_view symbol = head.substr(open + 1, head.size() - open - 2);
  if (const size_t plus = symbol.rfind('+'); plus != std::string_view::npos) {
    symbol = symbol.substr(0, plus);
  }
  *frame = symbol.empty() ? "??" : NormalizeFunctionName(Demangle(std::string(symbol)));
  return true;
}

// A Python frame's file without its directory, so that installation paths
// do not matter.
std::string_view BaseName(std::string_view file) {
  const size_t slash = file.rfind('/');
  return slash == std::string_view::npos ? file : file.substr(slash + 1);
}

// faulthandler: `File "/usr/lib/python3.11/threading.py", line 327 in wait`.
bool ParsePythonFrame(std::string_view line, std::string* frame) {
  if (!line.starts_with("File \"")) return false;
  const size_t file_end = line.find("\", line ", 6);
  if (file_end == std::string_view::npos) return false;
  const size_t in = line.find(" in ", file_end + 8);
  if (in == std::string_view::npos) return false;
  *frame = std::string(Trim(line.substr(in + 4))) + " (" +
           std::string(BaseName(line.substr(6, file_end - 6))) + ")";
  return true;
}

// py-spy: `stuck_here (/work/train.py:15)`, `Tensor.backward
// (torch/_tensor.py:488)`: a name without spaces, then the file and line in
// parentheses. The name is Python's qualified one (3.11's co_qualname);
// faulthandler prints the bare one, and so does the signature.
bool ParsePySpyFrame(std::string_view line, std::string* frame) {
  if (!line.ends_with(')')) return false;
  const size_t open = line.rfind(" (");
  if (open == std::string_view::npos || open == 0) return false;
  std::string_view name = line.substr(0, open);
  if (name.find_first_of(" \t") != std::string_view::npos) return false;
  std::string_view where = line.substr(open + 2, line.size() - open - 3);
  const size_t colon = where.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == where.size() ||
      !std::all_of(where.begin() + static_cast<std::ptrdiff_t>(colon) + 1, where.end(), IsDigit)) {
    return false;
  }
  const std::string_view file = BaseName(where.substr(0, colon));
  if (const size_t dot = name.rfind('.'); dot != std::string_view::npos && dot + 1 < name.size()) {
    name = name.substr(dot + 1);
  }
  *frame = std::string(name) + " (" + std::string(file) + ")";
  return true;
}

ParsedDump Parse(std::string_view dump) {
  ParsedDump d;
  int gdb_main = -1;     // gdb's "Thread 1": the process's first thread
  int python_main = -1;  // faulthandler lists the newest thread first
  auto current = [&d]() -> Thread& {
    if (d.threads.empty()) d.threads.emplace_back();
    return d.threads.back();
  };
  auto add = [&current](std::string frame) {
    Thread& t = current();
    // A run of unresolved frames is one: its depth is noise.
    if (frame == "??" && !t.frames.empty() && t.frames.back() == "??") return;
    t.frames.push_back(std::move(frame));
  };
  size_t pos = 0;
  while (pos <= dump.size()) {
    size_t nl = dump.find('\n', pos);
    if (nl == std::string_view::npos) nl = dump.size();
    const std::string_view line = Trim(dump.substr(pos, nl - pos));
    pos = nl + 1;
    std::string frame;
    if (line.starts_with("Thread 0x") || line.starts_with("Current thread 0x") ||
        line.starts_with("Stack (most recent call first)")) {
      d.threads.emplace_back();
      python_main = static_cast<int>(d.threads.size()) - 1;
    } else if (line.starts_with("Thread ") && line.size() > 7 && IsDigit(line[7])) {
      d.threads.emplace_back();
      if (line.starts_with("Thread 1 ") || line == "Thread 1") {
        gdb_main = static_cast<int>(d.threads.size()) - 1;
      } else if (line.ends_with(": \"MainThread\"")) {  // py-spy's
        python_main = static_cast<int>(d.threads.size()) - 1;
      }
    } else if (line.size() > 1 && line[0] == '#' && IsDigit(line[1])) {
      size_t i = 1;
      while (i < line.size() && IsDigit(line[i])) ++i;
      if (i == line.size() || line[i] == ' ' || line[i] == '\t') {
        std::string f = NormalizeGdbFrame(line.substr(i));
        if (!f.empty()) add(std::move(f));
      }
    } else if (ParsePythonFrame(line, &frame) || ParseBacktraceSymbol(line, &frame) ||
               ParsePySpyFrame(line, &frame)) {
      add(std::move(frame));
    } else if (line == "<no Python frame>" || line == "...") {
      add(std::string(line));
    }
  }
  auto has_frames = [&d](int i) {
    return i >= 0 && i < static_cast<int>(d.threads.size()) && !d.threads[i].frames.empty();
  };
  if (has_frames(gdb_main)) {
    d.main_thread = gdb_main;
  } else if (has_frames(python_main)) {
    d.main_thread = python_main;
  } else {
    for (int i = 0; i < static_cast<int>(d.threads.size()); ++i) {
      if (has_frames(i)) {
        d.main_thread = i;
        break;
      }
    }
  }
  return d;
}

std::string ThreadLine(const Thread& t) {
  std::string s;
  for (const std::string& f : t.frames) s += (s.empty() ? "" : " <- ") + f;
  return s;
}

std::set<std::string> ThreadLines(const ParsedDump& d) {
  std::set<std::string> lines;
  for (const Thread& t : d.threads) {
    if (!t.frames.empty()) lines.insert(ThreadLine(t));
  }
  return lines;
}

// What a person calls a frame: "std::this_thread::sleep_for<long, ...>" ->
// "sleep_for", "gloo::Buf::waitRecv" -> "waitRecv", "wait (threading.py)"
// -> "wait".
std::string ShortName(const std::string& frame) {
  // Python's "FUNC (FILE.py)", "FUNC (<frozen importlib._bootstrap>)".
  if (frame.ends_with(".py)") || frame.ends_with(">)")) {
    const size_t open = frame.rfind(" (");
    if (open != std::string::npos) return frame.substr(0, open);
  }
  if (frame.empty() || frame[0] == '<') return frame;
  std::string flat;  // the name with template arguments and parentheses removed
  int depth = 0;
  for (size_t i = 0; i < frame.size(); ++i) {
    const char c = frame[i];
    if (c == '<' || c == '(' || c == '{') {
      ++depth;
    } else if ((c == '>' || c == ')' || c == '}') && depth > 0) {
      --depth;
    } else if (depth == 0) {
      flat += c;
    }
  }
  const size_t colons = flat.rfind("::");
  std::string last = colons == std::string::npos ? flat : flat.substr(colons + 2);
  last = std::string(Trim(last));
  if (last == "operator") last = "operator()";
  return last.empty() ? frame : last;
}

// Frames that say only that a thread waits, not where in the program.
bool IsWaitPrimitive(const std::string& short_name) {
  static const std::set<std::string, std::less<>> kPrimitives = {"??",
                                                                 "syscall",
                                                                 "poll",
                                                                 "ppoll",
                                                                 "epoll_wait",
                                                                 "select",
                                                                 "pselect",
                                                                 "nanosleep",
                                                                 "sleep",
                                                                 "usleep",
                                                                 "read",
                                                                 "recv",
                                                                 "recvmsg",
                                                                 "recvfrom",
                                                                 "accept",
                                                                 "sched_yield",
                                                                 "clock_nanosleep",
                                                                 "futex_wait",
                                                                 "sem_wait",
                                                                 "wait",
                                                                 "wait_for",
                                                                 "wait_until"};
  return short_name.starts_with('_') || short_name.starts_with("pthread_") ||
         kPrimitives.contains(short_name);
}

const std::vector<std::string>* MainFrames(const ParsedDump& d) {
  if (d.main_thread < 0) return nullptr;
  return &d.threads[d.main_thread].frames;
}

// The innermost frame of the main thread that names a place in the program.
std::string InnermostLocation(const ParsedDump& d) {
  const std::vector<std::string>* frames = MainFrames(d);
  if (frames == nullptr || frames->empty()) return "no stack";
  for (const std::string& f : *frames) {
    const std::string name = ShortName(f);
    if (!IsWaitPrimitive(name)) return name;
  }
  return ShortName(frames->front());
}

// "Allreduce > waitRecv": the frame at `from` (index, innermost first), and
// the innermost frame below it that names a place in the program, if any.
std::string PathFrom(const std::vector<std::string>& frames, size_t from) {
  const std::string top = ShortName(frames[from]);
  for (size_t i = 0; i < from; ++i) {
    const std::string name = ShortName(frames[i]);
    if (!IsWaitPrimitive(name)) return name == top ? top : top + " > " + name;
  }
  return top;
}

// Where `d`'s stack leaves `ref`'s: the first frame of its main thread,
// counted from the outermost, that `ref`'s main thread does not share.
std::string DivergentLocation(const ParsedDump& d, const ParsedDump& ref) {
  const std::vector<std::string>* mine = MainFrames(d);
  const std::vector<std::string>* theirs = MainFrames(ref);
  if (mine == nullptr) return "no stack";
  if (theirs == nullptr) return InnermostLocation(d);
  const size_t n = mine->size(), m = theirs->size();
  size_t k = 0;
  while (k < n && k < m && (*mine)[n - 1 - k] == (*theirs)[m - 1 - k]) ++k;
  if (k < n) return PathFrom(*mine, n - 1 - k);
  if (k < m) return ShortName(mine->front());  // stopped short of where `ref` went
  // The same main thread: the difference is in another thread.
  const std::set<std::string> ref_lines = ThreadLines(ref);
  for (const Thread& t : d.threads) {
    if (t.frames.empty() || ref_lines.contains(ThreadLine(t))) continue;
    for (const std::string& f : t.frames) {
      if (!IsWaitPrimitive(ShortName(f))) return ShortName(f) + " (another thread)";
    }
    return ShortName(t.frames.front()) + " (another thread)";
  }
  return InnermostLocation(d);
}

std::string SignatureOf(const ParsedDump& d) {
  std::string sig;
  for (const std::string& line : ThreadLines(d)) sig += (sig.empty() ? "" : "\n") + line;
  return sig;
}

// The main thread's line: where the training loop is.
std::string MainSignatureOf(const ParsedDump& d) {
  return d.main_thread < 0 ? "" : ThreadLine(d.threads[d.main_thread]);
}

}  // namespace

std::string StackSignature(std::string_view dump) { return SignatureOf(Parse(dump)); }

StackGroups GroupStacks(const std::vector<std::pair<Rank, std::string>>& dumps) {
  struct Entry {
    Rank rank;
    std::string signature;
    ParsedDump parsed;
  };
  std::vector<Entry> entries;
  std::set<Rank> seen;
  for (const auto& [rank, dump] : dumps) {
    if (!seen.insert(rank).second) continue;
    ParsedDump parsed = Parse(dump);
    // By the main thread: a communication library's send and receive
    // threads, a data loader's workers, are caught in whatever state they
    // happened to be in, and would split ranks stuck in the same place.
    std::string signature = MainSignatureOf(parsed);
    entries.push_back(Entry{rank, std::move(signature), std::move(parsed)});
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.rank < b.rank; });

  // Groups in order of their lowest rank, so that the stable sort by size
  // breaks ties by it.
  std::vector<std::vector<const Entry*>> stack_groups;
  std::vector<const Entry*> no_stack;
  std::map<std::string, size_t> index;
  for (const Entry& e : entries) {
    if (e.signature.empty()) {
      no_stack.push_back(&e);
      continue;
    }
    auto [it, inserted] = index.emplace(e.signature, stack_groups.size());
    if (inserted) stack_groups.emplace_back();
    stack_groups[it->second].push_back(&e);
  }
  std::stable_sort(stack_groups.begin(), stack_groups.end(),
                   [](const auto& a, const auto& b) { return a.size() > b.size(); });

  StackGroups out;
  const size_t total = entries.size();
  auto ranks_of = [](const std::vector<const Entry*>& group) {
    std::vector<Rank> r;
    for (const Entry* e : group) r.push_back(e->rank);
    return r;
  };
  for (size_t i = 0; i < stack_groups.size(); ++i) {
    out.groups.push_back(ranks_of(stack_groups[i]));
    const ParsedDump& rep = stack_groups[i].front()->parsed;
    if (i == 0) {
      out.locations.push_back(stack_groups.size() > 1
                                  ? DivergentLocation(rep, stack_groups[1].front()->parsed)
                                  : InnermostLocation(rep));
    } else {
      out.locations.push_back(DivergentLocation(rep, stack_groups[0].front()->parsed));
    }
  }
  if (!no_stack.empty()) {
    out.groups.push_back(ranks_of(no_stack));
    out.locations.push_back("no stack");
  }

  if (total == 0) {
    out.reason = "no stacks to compare";
    return out;
  }
  if (stack_groups.empty()) {
    out.reason = "no rank's dump held a stack (" + FormatRanks(out.groups[0]) + ")";
    return out;
  }
  const size_t largest = stack_groups[0].size();
  const bool majority = 2 * largest > total;
  auto describe = [&out](size_t i, bool verb) {
    const std::vector<Rank>& g = out.groups[i];
    const bool one = g.size() == 1;
    return FormatRanks(g) + (verb ? (one ? " differs" : " differ") : "") + " (in " +
           out.locations[i] + ")";
  };
  auto describe_no_stack = [&out, &no_stack]() {
    return FormatRanks(out.groups.back()) + (no_stack.size() == 1 ? " has" : " have") + " no stack";
  };
  if (majority) {
    for (size_t i = 1; i < out.groups.size(); ++i) {
      for (Rank r : out.groups[i]) out.suspects.push_back(r);
    }
    std::sort(out.suspects.begin(), out.suspects.end());
    out.resolved = !out.suspects.empty();
    if (!out.resolved) {
      out.reason = total == 1 ? "only " + FormatRanks(out.groups[0]) + "'s stack (in " +
                                    out.locations[0] + "): nothing to compare it with"
                              : "all " + std::to_string(total) + " ranks share one stack (in " +
                                    out.locations[0] + "): no outlier";
      return out;
    }
    out.reason = std::to_string(largest) + " of " + std::to_string(total) +
                 " ranks share one stack (in " + out.locations[0] + ")";
    for (size_t i = 1; i < stack_groups.size(); ++i) out.reason += "; " + describe(i, true);
    if (!no_stack.empty()) out.reason += "; " + describe_no_stack();
    return out;
  }
  out.reason =
      "no stack is shared by a strict majority of the " + std::to_string(total) + " ranks: ";
  for (size_t i = 0; i < stack_groups.size(); ++i) {
    out.reason += (i > 0 ? ", " : "") + describe(i, false);
  }
  if (!no_stack.empty()) out.reason += ", " + describe_no_stack();
  return out;
}

}  // namespace endure::core
