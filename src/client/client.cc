// The client library's Session: environment parsing, datagrams to the agent,
// the heartbeat thread and fault firing.
#include "endure/client.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "common/duration.h"
#include "common/hash.h"
#include "faults/fault.h"

namespace endure {
namespace {

using faults::Fault;
using faults::FaultKind;

const auto kLibraryLoaded = std::chrono::steady_clock::now();

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Status BadVariable(const char* name, const std::string& value, const std::string& expected) {
  return InvalidArgument(std::string(name) + "='" + value + "': " + expected);
}

Result<int64_t> ParseInteger(const char* name, const std::string& text, int64_t lo, int64_t hi,
                             const std::string& expected) {
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE || n < lo || n > hi) {
    return BadVariable(name, text, expected);
  }
  return static_cast<int64_t>(n);
}

// "3, 7,12" -> {3, 7, 12}, sorted and without duplicates.
Result<std::vector<int64_t>> ParseStepList(const char* name, const std::string& text) {
  std::vector<int64_t> steps;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    const size_t b = item.find_first_not_of(" \t");
    if (b == std::string::npos) {
      if (text.find_first_not_of(" \t,") == std::string::npos) continue;  // all empty
      return BadVariable(name, text, "empty entry in the comma-separated step numbers");
    }
    item = item.substr(b, item.find_last_not_of(" \t") - b + 1);
    Result<int64_t> step = ParseInteger(name, item, 1, INT64_MAX, "");
    if (!step.ok()) {
      return BadVariable(name, text,
                         "'" + item + "' is not a step number (comma-separated integers >= 1)");
    }
    steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

// JSON has no NaN or infinity: those travel as strings.
nlohmann::json LossJson(double loss) {
  if (std::isnan(loss)) return "nan";
  if (std::isinf(loss)) return loss > 0 ? "inf" : "-inf";
  return loss;
}

// Every datagram's common fields.
nlohmann::json Envelope(const char* type, const std::string& token, int64_t generation, int rank) {
  return {{"type", type},
          {"token", token},
          {"generation", generation},
          {"rank", rank},
          {"t", WallSeconds()}};
}

}  // namespace

struct Session::PendingFault {
  Fault fault;
  bool fired = false;
};

namespace {
// Set when a standby worker received its assignment: the worker's useful
// life starts then.
std::optional<std::chrono::steady_clock::time_point> g_assigned_at;
}  // namespace

void AwaitStandbyAssignment() {
  const char* standby = std::getenv("ENDURE_STANDBY");
  if (standby == nullptr || std::string(standby) != "1") return;
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (text.empty()) std::exit(0);  // discarded before it was needed
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    ::setenv(line.substr(0, eq).c_str(), line.substr(eq + 1).c_str(), 1);
  }
  ::unsetenv("ENDURE_STANDBY");
  g_assigned_at = std::chrono::steady_clock::now();
}

double SecondsSinceProcessStart() {
  if (g_assigned_at) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - *g_assigned_at).count();
  }
  auto fallback = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - kLibraryLoaded).count();
  };
  std::ifstream f("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // Field 2 (comm) may hold spaces and parentheses: count fields from the
  // last ')'. The next field is 3 (state); starttime is field 22.
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return fallback();
  std::istringstream rest(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return fallback();
  }
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  timespec now{};
  if (ticks <= 0 || clock_gettime(CLOCK_BOOTTIME, &now) != 0) return fallback();
  const double started = std::strtod(field.c_str(), nullptr) / ticks;
  const double elapsed = static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9 - started;
  return elapsed >= 0 ? elapsed : fallback();
}

Session::Session() = default;

std::unique_ptr<Session> Session::Disabled() { return std::unique_ptr<Session>(new Session()); }

Result<std::unique_ptr<Session>> Session::FromEnvironment(const EnvLookup& lookup) {
  std::unique_ptr<Session> s(new Session());
  auto get = [&](const char* name) -> std::optional<std::string> {
    const char* v = lookup(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  // An empty variable counts as unset, as shells and launchers often export "".
  auto get_set = [&](const char* name) -> std::optional<std::string> {
    std::optional<std::string> v = get(name);
    if (v && v->empty()) return std::nullopt;
    return v;
  };

  if (auto v = get_set("RANK")) {
    ENDURE_ASSIGN_OR_RETURN(int64_t rank,
                            ParseInteger("RANK", *v, 0, INT32_MAX, "expected an integer >= 0"));
    s->rank_ = static_cast<int>(rank);
  }
  if (auto v = get_set("ENDURE_GENERATION")) {
    ENDURE_ASSIGN_OR_RETURN(s->generation_, ParseInteger("ENDURE_GENERATION", *v, 0, INT64_MAX,
                                                         "expected an integer >= 0"));
  }
  if (auto v = get_set("ENDURE_CKPT_DIR")) s->checkpoint_dir_ = *v;
  if (auto v = get_set("ENDURE_CKPT_EVERY")) {
    ENDURE_ASSIGN_OR_RETURN(
        s->checkpoint_every_,
        ParseInteger("ENDURE_CKPT_EVERY", *v, 0, INT64_MAX,
                     "expected a number of steps >= 0 (0: no periodic checkpoints)"));
  }
  if (auto v = get_set("ENDURE_RESTORE_STEP")) {
    ENDURE_ASSIGN_OR_RETURN(
        s->restore_step_,
        ParseInteger("ENDURE_RESTORE_STEP", *v, -1, INT64_MAX,
                     "expected -1 (newest checkpoint), 0 (fresh start) or a step N > 0"));
  }
  if (auto v = get_set("ENDURE_RESTORE_PLAN")) {
    Result<checkpoint::RestorePlan> plan = checkpoint::RestorePlanFromJson(*v);
    if (!plan.ok()) return plan.status().WithContext("ENDURE_RESTORE_PLAN");
    s->restore_plan_ = std::move(plan).value();
  }
  if (auto v = get_set("ENDURE_T0_DIR")) s->t0_dir_ = *v;
  if (auto v = get_set("ENDURE_T0_SLOT_BYTES")) {
    ENDURE_ASSIGN_OR_RETURN(int64_t bytes,
                            ParseInteger("ENDURE_T0_SLOT_BYTES", *v, 0, INT64_MAX,
                                         "expected a number of bytes >= 0 (0: no limit)"));
    s->t0_slot_bytes_ = static_cast<uint64_t>(bytes);
  }
  if (auto v = get("ENDURE_SKIP_STEPS")) {
    ENDURE_ASSIGN_OR_RETURN(s->skip_steps_, ParseStepList("ENDURE_SKIP_STEPS", *v));
  }
  if (auto v = get_set("ENDURE_HEARTBEAT_INTERVAL")) {
    Result<Duration> d = ParseDuration(*v);
    if (!d.ok()) return BadVariable("ENDURE_HEARTBEAT_INTERVAL", *v, d.status().message());
    if (d->count() <= 0) {
      return BadVariable("ENDURE_HEARTBEAT_INTERVAL", *v, "must be longer than zero");
    }
    s->heartbeat_interval_ = *d;
  }
  if (auto v = get_set("ENDURE_FAULTS")) {
    Result<std::vector<Fault>> all = faults::DecodeFaults(*v);
    if (!all.ok()) return all.status().WithContext("ENDURE_FAULTS");
    ENDURE_RETURN_IF_ERROR(faults::ValidateFaults(*all).WithContext("ENDURE_FAULTS"));
    for (Fault& f : faults::FaultsForRank(*all, s->rank_, {})) {
      s->faults_.push_back({std::move(f), false});
    }
  }

  std::optional<std::string> socket_path = get_set("ENDURE_AGENT_SOCKET");
  if (!socket_path) return s;
  if (socket_path->size() >= sizeof(sockaddr_un::sun_path)) {
    return BadVariable("ENDURE_AGENT_SOCKET", *socket_path,
                       "longer than a Unix socket path may be (" +
                           std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes)");
  }
  std::optional<std::string> token = get_set("ENDURE_TOKEN");
  if (!token) {
    return InvalidArgument(
        "ENDURE_AGENT_SOCKET is set but ENDURE_TOKEN is not: the agent refuses reports "
        "without the job token");
  }
  s->token_ = *token;
  s->socket_path_ = *socket_path;
  s->fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s->fd_ < 0) {
    return IOError(std::string("cannot create a Unix datagram socket: ") + std::strerror(errno));
  }
  s->heartbeat_ = std::thread([session = s.get()] { session->HeartbeatLoop(); });
  return s;
}

Session::~Session() {
  if (heartbeat_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    stop_cv_.notify_all();
    heartbeat_.join();
  }
  if (fd_ >= 0) close(fd_);
}

bool Session::ShouldSkip(int64_t step_index) const {
  return std::binary_search(skip_steps_.begin(), skip_steps_.end(), step_index + 1);
}

bool Session::Send(const std::string& datagram, bool retry) {
  if (fd_ < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path_.data(), socket_path_.size());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (true) {
    // Unconnected sendto: an agent that restarts and binds the path again
    // receives the next datagram without the worker doing anything.
    const ssize_t n = sendto(fd_, datagram.data(), datagram.size(), MSG_DONTWAIT | MSG_NOSIGNAL,
                             reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    if (n == static_cast<ssize_t>(datagram.size())) return true;
    if (n < 0 && errno == EINTR) continue;
    const bool full = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS);
    if (!retry || !full || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  dropped_.fetch_add(1);
  return false;
}

void Session::SendFault(const PendingFault& p, int64_t step) {
  if (fd_ < 0) return;
  nlohmann::json j = Envelope("fault", token_, generation_, rank_);
  j["id"] = p.fault.id;
  j["kind"] = faults::FaultKindName(p.fault.kind);
  j["step"] = step;
  Send(j.dump(), /*retry=*/true);
}

void Session::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    nlohmann::json j = Envelope("heartbeat", token_, generation_, rank_);
    j["step"] = steps_done_.load();
    lock.unlock();
    Send(j.dump(), /*retry=*/false);
    lock.lock();
    stop_cv_.wait_for(lock, heartbeat_interval_, [this] { return stop_; });
  }
}

void Session::Ready(int64_t start_step, double restore_s, double init_s) {
  steps_done_.store(start_step);
  if (fd_ < 0) return;
  nlohmann::json j = Envelope("ready", token_, generation_, rank_);
  j["start_step"] = start_step;
  j["restore_s"] = restore_s;
  j["init_s"] = init_s;
  Send(j.dump(), /*retry=*/false);
}

void Session::BeginStep(int64_t step_index) {
  const int64_t step = step_index + 1;
  for (PendingFault& p : faults_) {
    if (p.fired || p.fault.step != step) continue;
    const Fault& f = p.fault;
    switch (f.kind) {
      case FaultKind::kKill:
        p.fired = true;
        SendFault(p, step);
        std::fprintf(stderr, "endure: injected fault %s: SIGKILL at step %lld\n", f.id.c_str(),
                     static_cast<long long>(step));
        std::fflush(stderr);
        raise(SIGKILL);
        break;
      case FaultKind::kExit:
        p.fired = true;
        SendFault(p, step);
        std::fprintf(stderr, "endure: injected fault %s: exit %d at step %lld\n", f.id.c_str(),
                     f.exit_code, static_cast<long long>(step));
        std::fflush(nullptr);
        _exit(f.exit_code);
      case FaultKind::kHang:
        p.fired = true;
        SendFault(p, step);
        std::fprintf(stderr, "endure: injected fault %s: hanging in step %lld\n", f.id.c_str(),
                     static_cast<long long>(step));
        std::fflush(nullptr);
        // Like a collective that never returns: the process lives on and
        // its heartbeats continue, but the step never ends.
        while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
      case FaultKind::kLog:
        p.fired = true;
        SendFault(p, step);
        std::fflush(stdout);
        std::fprintf(stderr, "%s\n", f.line.c_str());
        std::fflush(nullptr);
        _exit(1);
      default:
        break;  // nan and slow take effect in EndStep
    }
  }
}

double Session::EndStep(int64_t step_index, double loss, double compute_s, double comm_s,
                        double ckpt_stall_s, int64_t checkpoint_step) {
  const int64_t step = step_index + 1;
  double logged = loss;
  for (PendingFault& p : faults_) {
    if (p.fired) continue;
    if (p.fault.kind == FaultKind::kNan && p.fault.step == step) {
      p.fired = true;
      SendFault(p, step);
      logged = std::nan("");
    } else if (p.fault.kind == FaultKind::kSlow && p.fault.step <= step) {
      p.fired = true;
      SendFault(p, step);
      slow_factor_ = std::max(slow_factor_, p.fault.factor);
    }
  }
  if (slow_factor_ > 1) {
    const double extra_s = (slow_factor_ - 1) * (compute_s + comm_s);
    std::this_thread::sleep_for(std::chrono::duration<double>(extra_s));
    compute_s += extra_s;
  }
  steps_done_.store(step);
  if (fd_ >= 0) {
    nlohmann::json j = Envelope("step", token_, generation_, rank_);
    j["step"] = step;
    j["loss"] = LossJson(logged);
    j["compute_s"] = compute_s;
    j["comm_s"] = comm_s;
    j["ckpt_stall_s"] = ckpt_stall_s;
    j["checkpoint_step"] = checkpoint_step;
    if (tokens_per_step_ > 0) j["tokens"] = tokens_per_step_;
    Send(j.dump(), /*retry=*/false);
  }
  return logged;
}

void Session::EndSkippedStep(int64_t step_index, double ckpt_stall_s, int64_t checkpoint_step) {
  const int64_t step = step_index + 1;
  steps_done_.store(step);
  if (fd_ < 0) return;
  nlohmann::json j = Envelope("skip", token_, generation_, rank_);
  j["step"] = step;
  j["ckpt_stall_s"] = ckpt_stall_s;
  j["checkpoint_step"] = checkpoint_step;
  Send(j.dump(), /*retry=*/false);
}

Result<bool> Session::SaveSnapshot(int64_t step, int shards,
                                   const std::vector<checkpoint::TensorView>& tensors) {
  if (t0_dir_.empty()) return InvalidArgument("SaveSnapshot: ENDURE_T0_DIR is not set");
  if (!snapshots_) {
    ENDURE_ASSIGN_OR_RETURN(
        snapshots_, checkpoint::SnapshotWriter::Open(t0_dir_, rank_, shards, t0_slot_bytes_));
  }
  ENDURE_ASSIGN_OR_RETURN(std::optional<checkpoint::SnapshotWriter::Saved> saved,
                          snapshots_->Save(step, tensors, std::chrono::seconds(30)));
  if (!saved) return false;
  if (fd_ >= 0) {
    nlohmann::json j = Envelope("snapshot", token_, generation_, rank_);
    j["step"] = step;
    j["shard"] = rank_;
    j["shards"] = shards;
    j["path"] = saved->path;
    j["bytes"] = saved->bytes;
    j["xxh3"] = HexU64(saved->xxh3);
    // Not retried: a training step never waits for the agent. The agent
    // also finds the slot when it next scans them.
    Send(j.dump(), /*retry=*/false);
  }
  return true;
}

}  // namespace endure
