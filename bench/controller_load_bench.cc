// The controller under the load of a large job (issue 24, item 1): one
// controller started as in production (`endure controller --spec`, on
// loopback), and N simulated agents in this process attached over the real
// gRPC protocol. Each registers with 8 slots, heartbeats every second,
// answers StartGeneration (each rank ready) and Stop (each rank's exit, then
// GenerationStopped) as the agent does, and reports a StepProgress for each
// of its ranks every step. For each N and step length it prints:
//
//   cpu%      the controller's CPU over the steady window (100 = one core)
//   rss_mb    its resident memory at the window's end
//   in/s      the agents' messages per second (the controller's inputs)
//   lag_s     how long ago the agents reported the first step the
//             controller has not applied (its live status): mean and worst
//             of one sample a second
//   behind    the worst the controller said of its own backlog (status
//             "controller.behind_s": the oldest queued input's wait)
//   rows/s    journal rows per second; kb/s what the controller wrote
//             (/proc/PID/io wchar: the journal, its status file, its log)
//   closed_s  a member's stream closed -> the next generation's start
//   silent_s  a member falls silent (stream open) -> the controller's stop
//   replay_s  the controller killed (-9) once the journal since its last
//             snapshot has grown to 90% of the size the next snapshot is due
//             at (status "controller.snapshot_due_bytes"), restarted on its
//             state directory -> its first status written (the snapshot
//             restored and the journal after it replayed): the longest a
//             restart takes at this size, however long the job has run —
//             after 10 minutes (--window-s 600) or a day, as the snapshot
//             holds no more after a day than after minutes (the journal
//             before it is cut; core::JobMachine keeps bounded windows, and
//             JobSnapshot.ASteadyJobsSnapshotStopsGrowing tests it). Killed
//             at the limit of the wait (kTailWait) when the journal grows
//             slower: tail_mb says what it replayed, snap_mb the snapshot
//   gen%      this process's CPU over the window, and late_ms the worst
//             lateness of its send loop: the load generator must not be
//             the bottleneck (it says so when it was)
//
// Two spare agents register beyond N: the closed and the silent node are
// replaced. A figure the controller never reached within its limit prints
// as "-".
//
//   build/bin/controller_load_bench [--nodes 128,1024] [--step-s 1,2]
//                                   [--window-s 20] [--controller PATH]
//                                   [--per-rank] [--dashboard] [WORK_DIR]
//
// --dashboard (issue 29) also measures, after the steady window, what the
// dashboard and Prometheus ask of the controller at that size: for each path
// the page or a scrape asks (/metrics, /api/status, /api/history,
// /api/steptimes, /api/nodes, /api/incidents, /), the median and worst
// answer time of 20 requests and the answer's size; the controller's CPU per
// round of every path (its CPU over 20 rounds, less its CPU over as long
// without them, per round); and the loop's own CPU building the live view
// and the metrics once a second (status "controller.view_cpu_s", as % of a
// core).
//
// --controller runs another build's `endure` (a before-and-after in one run).
// The agents report their ranks' steps in one NodeSteps per node and step, as
// the agent does; --per-rank, a StepProgress for each rank, as agents did
// before (and as a controller of then reads them).
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/subprocess.h"
#include "tests/support/simulated_agents.h"

namespace fs = std::filesystem;
using endure::loadgen::Clock;
using endure::loadgen::Since;
using namespace std::chrono_literals;

namespace {

constexpr int kSlots = endure::loadgen::kSlotsPerAgent;
constexpr char kToken[] = "load-bench-token";
// How long training goes on, at most, for the journal to grow to its
// largest before the controller is killed for replay_s.
constexpr std::chrono::seconds kTailWait{150};

std::string BinDir() {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  return fs::path(std::string(exe, n > 0 ? static_cast<size_t>(n) : 0)).parent_path().string();
}

// ---- The controller process ----

struct ProcStat {
  double cpu_s = 0;
  double rss_mb = 0;
  double written = 0;  // bytes passed to write() and the like (/proc/PID/io wchar)
};

ProcStat ReadProc(pid_t pid) {
  ProcStat st;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close != std::string::npos) {
    std::istringstream rest(text.substr(close + 2));
    std::string field;
    long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> field; ++i) {
      if (i == 14) utime = std::atol(field.c_str());
      if (i == 15) stime = std::atol(field.c_str());
    }
    st.cpu_s = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) st.rss_mb = std::atof(line.c_str() + 6) / 1024.0;
  }
  std::ifstream io("/proc/" + std::to_string(pid) + "/io");
  for (std::string line; std::getline(io, line);) {
    if (line.rfind("wchar:", 0) == 0) st.written = std::atof(line.c_str() + 6);
  }
  return st;
}

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// The first column of `sql`'s first row over the controller's store, or
// nullopt (no store, or a controller of before the tables it asks of).
std::optional<double> Query(const fs::path& state_dir, const char* sql) {
  sqlite3* db = nullptr;
  const std::string path = (state_dir / "controller.db").string();
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return std::nullopt;
  }
  sqlite3_busy_timeout(db, 2000);
  std::optional<double> value;
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) == SQLITE_OK &&
      sqlite3_step(stmt) == SQLITE_ROW) {
    value = sqlite3_column_double(stmt, 0);
  }
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return value;
}

// Inputs journaled so far: the newest journal entry's number (entries are
// numbered from 1, and a snapshot cuts the journal behind it; a controller
// of before snapshots has no such table).
int64_t JournalRows(const fs::path& state_dir) {
  std::optional<double> rows = Query(state_dir,
                                     "SELECT MAX(COALESCE((SELECT MAX(seq) FROM journal), 0), "
                                     "COALESCE((SELECT MAX(seq) FROM snapshots), 0))");
  if (!rows) rows = Query(state_dir, "SELECT COALESCE(MAX(seq), 0) FROM journal");
  return rows ? static_cast<int64_t>(*rows) : -1;
}

std::optional<nlohmann::json> Status(const fs::path& state_dir) {
  std::ifstream in(state_dir / "status.json");
  if (!in) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

std::string g_controller;  // the `endure` binary
bool g_dashboard = false;  // --dashboard
bool g_per_rank = false;   // agents report each rank's step apart (before node reports)

std::optional<endure::Subprocess> StartController(const fs::path& dir, const fs::path& spec,
                                                  const fs::path& address_file, bool new_run) {
  std::vector<std::string> argv = {g_controller,  "controller",     "--spec",
                                   spec.string(), "--address-file", address_file.string(),
                                   "--listen",    "127.0.0.1:0"};
  if (new_run) argv.push_back("--new-run");
  endure::Result<endure::Subprocess> p =
      endure::Subprocess::Start({.argv = argv,
                                 .env = {{"ENDURE_TOKEN", kToken}},
                                 .output_path = (dir / "controller.log").string(),
                                 .die_with_parent = true});
  if (!p.ok()) {
    std::fprintf(stderr, "controller_load_bench: %s\n", p.status().ToString().c_str());
    return std::nullopt;
  }
  return std::move(p).value();
}

std::string Fmt(std::optional<double> v, const char* format = "%.2f") {
  if (!v) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, format, *v);
  return buf;
}

// One configuration: N nodes x 8 ranks at `step_s` per step.
// The dashboard's figures at this size (--dashboard): lines to print under
// the size's row.
std::string DashboardFigures(const fs::path& state, pid_t controller) {
  std::string address;
  std::getline(std::ifstream(state / "http.addr"), address);
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "  dashboard: no http.addr\n";
  httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  http.set_read_timeout(30, 0);
  constexpr int kAsks = 20;
  const char* paths[] = {"/metrics",
                         "/api/status",
                         "/api/history",
                         "/api/steptimes",
                         "/api/nodes?page=0",
                         "/api/incidents?page=0",
                         "/"};
  std::string out;
  char line[256];
  const auto view_cpu = [&] {
    const std::optional<nlohmann::json> s = Status(state);
    return s ? s->value("controller", nlohmann::json::object()).value("view_cpu_s", 0.0) : 0.0;
  };
  // The controller without requests, then with kAsks rounds of every path.
  const ProcStat idle0 = ReadProc(controller);
  const double view0 = view_cpu();
  const Clock::time_point i0 = Clock::now();
  std::this_thread::sleep_for(5s);
  const ProcStat idle1 = ReadProc(controller);
  const double view1 = view_cpu();
  const double idle_rate = (idle1.cpu_s - idle0.cpu_s) / Since(i0);
  std::map<std::string, std::vector<double>> ms;
  std::map<std::string, size_t> bytes;
  const ProcStat busy0 = ReadProc(controller);
  const Clock::time_point b0 = Clock::now();
  for (int i = 0; i < kAsks; ++i) {
    for (const char* path : paths) {
      const Clock::time_point t0 = Clock::now();
      httplib::Result r = http.Get(path);
      ms[path].push_back(Since(t0) * 1000);
      bytes[path] = r && r->status == 200 ? r->body.size() : 0;
    }
  }
  const double busy_s = Since(b0);
  const ProcStat busy1 = ReadProc(controller);
  const double per_round_ms =
      1000.0 * std::max(0.0, (busy1.cpu_s - busy0.cpu_s) - idle_rate * busy_s) / kAsks;
  std::snprintf(line, sizeof line, "  dashboard: %-22s %9s %9s %10s\n", "path", "median_ms",
                "worst_ms", "bytes");
  out += line;
  for (const char* path : paths) {
    std::vector<double>& v = ms[path];
    std::sort(v.begin(), v.end());
    std::snprintf(line, sizeof line, "  dashboard: %-22s %9.2f %9.2f %10zu%s\n", path,
                  v[v.size() / 2], v.back(), bytes[path], bytes[path] == 0 ? "  (failed)" : "");
    out += line;
  }
  std::snprintf(line, sizeof line,
                "  dashboard: controller CPU per round of every path %.2f ms; the loop's live "
                "view and metrics %.2f%% of a core\n",
                per_round_ms, 100.0 * (view1 - view0) / 5.0);
  out += line;
  return out;
}

void RunOne(const fs::path& work, int nodes, double step_s, double window_s) {
  const fs::path dir = work / ("n" + std::to_string(nodes) + "-s" + Fmt(step_s, "%.0f"));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path state = dir / "state";
  const fs::path spec = dir / "job.toml";
  std::ofstream(spec) << "[job]\nname = \"load\"\ncommand = [\"/bin/true\"]\nnodes = " << nodes
                      << "\nranks_per_node = " << kSlots << "\nstate_dir = \"" << state.string()
                      << "\"\n";
  const fs::path address_file = dir / "controller.addr";
  std::optional<endure::Subprocess> controller =
      StartController(dir, spec, address_file, /*new_run=*/true);
  if (!controller) return;
  std::string address;
  for (int i = 0; i < 3000 && address.empty(); ++i) {
    std::ifstream in(address_file);
    std::getline(in, address);
    if (address.empty()) std::this_thread::sleep_for(10ms);
  }
  if (address.empty()) {
    std::printf("%6d %4.0f  the controller did not come up (see %s)\n", nodes, step_s,
                (dir / "controller.log").c_str());
    controller->Signal(SIGKILL);
    controller->Wait();
    return;
  }
  const Clock::duration step_time =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(step_s));
  const Clock::time_point attach = Clock::now();
  std::optional<double> startup_s, closed_s, silent_s, replay_s, tail_mb, snap_mb, behind;
  double cpu = 0, rss = 0, inputs = 0, rows = 0, kbps = 0, gen_cpu = 0, late_ms = 0;
  double lag_mean = 0, lag_max = 0;
  bool steady = false;
  std::string dashboard;
  {
    endure::loadgen::SimulatedAgents fleet(address, kToken, nodes + 2, step_time, g_per_rank);
    const Clock::duration limit = std::chrono::seconds(60 + nodes / 50);
    if (fleet.WaitStart(-1, limit)) startup_s = Since(attach);
    // Steady: wait two steps past the start-up, then measure the window.
    std::this_thread::sleep_for(step_time * 2 + 1s);
    if (startup_s) {
      steady = true;
      fleet.ResetLateness();
      const ProcStat p0 = ReadProc(controller->pid());
      const double self0 = SelfCpuSeconds();
      const int64_t sent0 = fleet.sent();
      const int64_t rows0 = JournalRows(state);
      const Clock::time_point w0 = Clock::now();
      int samples = 0;
      while (Since(w0) < window_s) {
        std::this_thread::sleep_for(1s);
        if (std::optional<nlohmann::json> s = Status(state)) {
          const double lag = fleet.Behind(s->value("step", int64_t{0}));
          lag_mean += lag;
          lag_max = std::max(lag_max, lag);
          ++samples;
          // The controller's own account of its backlog (a build without
          // it prints "-").
          if (s->contains("controller") && (*s)["controller"].is_object()) {
            behind = std::max(behind.value_or(0.0), (*s)["controller"].value("behind_s", 0.0));
          }
        }
      }
      const double w = Since(w0);
      const ProcStat p1 = ReadProc(controller->pid());
      cpu = 100.0 * (p1.cpu_s - p0.cpu_s) / w;
      rss = p1.rss_mb;
      gen_cpu = 100.0 * (SelfCpuSeconds() - self0) / w;
      late_ms = fleet.worst_lateness_ms();
      inputs = static_cast<double>(fleet.sent() - sent0) / w;
      rows = static_cast<double>(JournalRows(state) - rows0) / w;
      kbps = (p1.written - p0.written) / 1024.0 / w;
      lag_mean = samples > 0 ? lag_mean / samples : 0;
      if (g_dashboard) dashboard = DashboardFigures(state, controller->pid());

      // A member's stream closes: the time to the next generation's start.
      std::vector<int> members = fleet.started_agents();
      const int64_t g0 = fleet.generation();
      if (!members.empty()) {
        fleet.ForgetStarts();
        const Clock::time_point t0 = Clock::now();
        fleet.agent(members.front()).Close();
        if (std::optional<Clock::time_point> at = fleet.WaitStart(g0, 60s)) {
          closed_s = std::chrono::duration<double>(*at - t0).count();
        }
      }
      // A member falls silent with its stream open: the time to the
      // controller's stop of its generation.
      std::this_thread::sleep_for(step_time * 2 + 1s);
      members = fleet.started_agents();
      const int64_t g1 = fleet.generation();
      if (closed_s && !members.empty()) {
        const Clock::time_point t0 = Clock::now();
        fleet.agent(members.back()).FallSilent();
        if (std::optional<Clock::time_point> at = fleet.WaitStop(g1, 60s)) {
          silent_s = std::chrono::duration<double>(*at - t0).count();
        }
      }
      // Training goes on until the journal since the last snapshot is
      // nearly as large as it ever gets.
      const Clock::time_point t1 = Clock::now();
      while (Since(t1) < kTailWait.count()) {
        std::optional<nlohmann::json> s = Status(state);
        if (s && s->contains("controller") && (*s)["controller"].is_object()) {
          const nlohmann::json& c = (*s)["controller"];
          if (c.value("journal_bytes_since_snapshot", 0.0) >=
              0.9 * c.value("snapshot_due_bytes", 1e18)) {
            break;
          }
        }
        std::this_thread::sleep_for(50ms);
      }
    }
    // The controller dies under load and comes back on its state
    // directory: the snapshot restored, the journal after it replayed.
    controller->Signal(SIGKILL);
    controller->Wait();
  }
  tail_mb = Query(state, "SELECT COALESCE(SUM(LENGTH(event)), 0) / 1048576.0 FROM journal");
  snap_mb = Query(state, "SELECT COALESCE(MAX(LENGTH(state)), 0) / 1048576.0 FROM snapshots");
  fs::remove(state / "status.json");
  const Clock::time_point r0 = Clock::now();
  std::optional<endure::Subprocess> again =
      StartController(dir, spec, address_file, /*new_run=*/false);
  if (again) {
    for (int i = 0; i < 12000; ++i) {
      if (fs::exists(state / "status.json")) {
        replay_s = Since(r0);
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    again->Signal(SIGKILL);
    again->Wait();
  }
  std::printf(
      "%6d %4.0f %8s %6.1f %7.0f %9.0f %8.2f %6.2f %7s %8.0f %8.0f %8s %8s %8s %7s %7s %6.1f "
      "%7.0f%s\n",
      nodes, step_s, Fmt(startup_s, "%.1f").c_str(), cpu, rss, inputs, lag_mean, lag_max,
      Fmt(behind).c_str(), rows, kbps, Fmt(closed_s).c_str(), Fmt(silent_s).c_str(),
      Fmt(replay_s).c_str(), Fmt(tail_mb, "%.1f").c_str(), Fmt(snap_mb, "%.1f").c_str(), gen_cpu,
      late_ms,
      !steady            ? "  (never started)"
      : late_ms > 1000.0 ? "  (the load generator fell behind)"
                         : "");
  std::fputs(dashboard.c_str(), stdout);
  std::fflush(stdout);
}

std::vector<double> ParseList(const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (end == item.c_str() || *end != '\0' || v <= 0) {
      std::fprintf(stderr, "controller_load_bench: '%s' is not a positive number\n", item.c_str());
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> nodes = {128, 1024};
  std::vector<double> steps = {1, 2};
  double window_s = 20;
  fs::path work = fs::temp_directory_path() / "endure_controller_load";
  g_controller = BinDir() + "/endure";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--nodes" || a == "--step-s" || a == "--window-s") && i + 1 < argc) {
      const std::vector<double> v = ParseList(argv[++i]);
      if (a == "--nodes") nodes = v;
      if (a == "--step-s") steps = v;
      if (a == "--window-s") window_s = v.at(0);
    } else if (a == "--controller" && i + 1 < argc) {
      g_controller = argv[++i];
    } else if (a == "--per-rank") {
      g_per_rank = true;
    } else if (a == "--dashboard") {
      g_dashboard = true;
    } else if (!a.empty() && a[0] != '-') {
      work = a;
    } else {
      std::fprintf(stderr,
                   "usage: controller_load_bench [--nodes 128,1024] [--step-s 1,2] "
                   "[--window-s 20] [--controller PATH] [--per-rank] [--dashboard] [WORK_DIR]\n");
      return 2;
    }
  }
  // A stream each, on both sides of loopback.
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  std::printf("agents report %s\n", g_per_rank ? "each rank's step apart (--per-rank)"
                                               : "their ranks' steps in one message per node");
  std::printf("%6s %4s %8s %6s %7s %9s %8s %6s %7s %8s %8s %8s %8s %8s %7s %7s %6s %7s\n", "nodes",
              "step", "start_s", "cpu%", "rss_mb", "in/s", "lag_s", "worst", "behind", "rows/s",
              "kb/s", "closed_s", "silent_s", "replay_s", "tail_mb", "snap_mb", "gen%", "late_ms");
  for (double n : nodes) {
    for (double s : steps) RunOne(work, static_cast<int>(n), s, window_s);
  }
  return 0;
}
