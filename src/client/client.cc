// The client library's Session: environment parsing, datagrams to the agent,
// the heartbeat thread, phases, fingerprints and fault firing. Session is a
// thin handle over Session::Impl, which owns the socket, the heartbeat
// thread and the snapshot slots.
#include "endure/client.h"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/restore_plan.h"
#include "checkpoint/snapshot_file.h"
#include "checkpoint/tensor_blob.h"
#include "common/duration.h"
#include "common/env.h"
#include "common/hash.h"
#include "common/mutex.h"
#include "contract/worker_contract.h"
#include "core/loss_anomaly_detector.h"
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

// A datagram from this rank, stamped now, in the worker contract's
// encoding (contract/worker_contract.h: what the agent parses).
std::string Encode(const std::string& token, int64_t generation, int rank,
                   contract::DatagramMessage message) {
  contract::Datagram d;
  d.token = token;
  d.generation = generation;
  d.rank = rank;
  d.time_s = WallSeconds();
  d.message = std::move(message);
  return contract::EncodeDatagram(d);
}

struct PendingFault {
  Fault fault;
  bool fired = false;
};

// The least a comm-slow fault stretches a collective by, per unit of
// (factor - 1): a collective that took no measurable time (one rank, or the
// first step) must still show as slow to a pairwise test.
constexpr double kMinSlowCommS = 0.05;

}  // namespace

struct Session::Impl {
  // Sends one datagram; `retry` waits up to 100 ms for room in the agent's
  // queue. Returns whether it was queued; counts a drop otherwise.
  bool Send(const std::string& datagram, bool retry);
  void SendFault(const PendingFault& fault, int64_t step);
  void HeartbeatLoop();
  // Reads the offer file every 10 ms into `offered` until Stop().
  void WatchOffers();
  void StartWatchingOffers();
  void Stop();

  std::string socket_path;
  std::string token;
  int64_t generation = 0;
  int rank = 0;
  std::string checkpoint_dir;
  std::optional<int64_t> checkpoint_every;
  std::optional<int64_t> restore_step;
  std::vector<int64_t> skip_steps;
  std::optional<checkpoint::RestorePlan> plan;  // as the agent gave it
  std::optional<RestorePlan> public_plan;       // the same, as the public API shows it
  std::string t0_dir;
  uint64_t t0_slot_bytes = 0;
  std::string stacks_file;
  std::string rejoin_file;    // ENDURE_REJOIN_FILE
  bool peer_restore = false;  // ENDURE_PEER_RESTORE=1
  bool declares_rejoin = false;
  bool rejoins_from_tiers = false;  // DeclareRejoin(kFromTiers)
  bool declares_deterministic = false;
  // The losses this rank reports, watched more keenly than the controller
  // does (half its default bars): the snapshot before a suspect step is held
  // back in node memory, the rollback target while the controller judges it.
  core::LossAnomalyDetector loss_watch{[] {
    core::LossAnomalyOptions o;
    o.z_threshold = 4;
    o.min_jump = 0.5;
    return o;
  }()};
  std::unique_ptr<checkpoint::SnapshotWriter> snapshots;  // training thread only
  std::chrono::nanoseconds heartbeat_interval{500'000'000};
  std::vector<PendingFault> faults;  // only touched by the training thread
  double slow_factor = 1.0;          // active slow fault; training thread only
  int64_t tokens_per_step = 0;       // training thread only
  int64_t total_steps = 0;           // training thread only
  std::string phase = "train";       // training thread only
  int64_t sdc_check_every = 0;
  // comm-slow (training thread only): the active factor, the last step's
  // comm_s without what was slept here, and what was slept since EndStep.
  double comm_slow_factor = 1.0;
  double natural_comm_s = 0;
  double injected_comm_s = 0;

  int fd = -1;
  std::atomic<int64_t> dropped{0};
  std::atomic<int64_t> steps_done{-1};  // for heartbeats
  Mutex mu;
  CondVar stop_cv;
  bool stop GUARDED_BY(mu) = false;
  std::thread heartbeat;
  // The newest generation the agent's offer file named (-1: none), kept by
  // the offer watch once the program declares that it rejoins, so that
  // RejoinPending() costs an atomic load (a gradient hook may ask it).
  std::atomic<int64_t> offered{-1};
  std::thread offer_watch;
};

namespace {
// Set when a standby worker received its assignment: the worker's useful
// life starts then.
std::optional<std::chrono::steady_clock::time_point> g_assigned_at;
}  // namespace

void AwaitStandbyAssignment() {
  const char* standby = std::getenv(worker_env::kStandby);
  if (standby == nullptr || std::string(standby) != "1") return;
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (text.empty()) std::exit(0);  // discarded before it was needed
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    ::setenv(line.substr(0, eq).c_str(), line.substr(eq + 1).c_str(), 1);
  }
  ::unsetenv(worker_env::kStandby);
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

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Session> Session::Disabled() {
  return std::unique_ptr<Session>(new Session(std::make_unique<Impl>()));
}

namespace {

// The restore plan file the agent wrote: a regular file of bounded size (a
// FIFO or /dev/zero named by mistake must not wedge the worker's start).
Result<std::string> ReadPlanFile(const std::string& path) {
  constexpr off_t kMaxPlanBytes = 64 << 20;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return InvalidArgument("ENDURE_RESTORE_PLAN_FILE='" + path + "': " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode) || st.st_size > kMaxPlanBytes) {
    return InvalidArgument("ENDURE_RESTORE_PLAN_FILE='" + path +
                           "': not a regular file of at most 64 MiB");
  }
  Result<std::string> text = Env::Default()->ReadFile(path);
  if (!text.ok()) return text.status().WithContext(worker_env::kRestorePlanFile);
  return text;
}

RestorePlan PublicPlan(const checkpoint::RestorePlan& plan) {
  RestorePlan p;
  p.step = plan.step;
  p.notes = plan.notes;
  p.summary = plan.Summary();
  for (const checkpoint::RestoreSource& s : plan.sources) {
    p.sources.push_back(RestoreSource{s.copy.shard, std::string(checkpoint::TierName(s.copy.tier)),
                                      s.copy.node, s.loader_rank, s.copy.Describe()});
  }
  return p;
}

}  // namespace

Result<std::unique_ptr<Session>> Session::FromEnvironment(const EnvLookup& lookup) {
  auto s = std::make_unique<Impl>();
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
    s->rank = static_cast<int>(rank);
  }
  if (auto v = get_set(worker_env::kGeneration)) {
    ENDURE_ASSIGN_OR_RETURN(s->generation, ParseInteger(worker_env::kGeneration, *v, 0, INT64_MAX,
                                                        "expected an integer >= 0"));
  }
  if (auto v = get_set(worker_env::kCkptDir)) s->checkpoint_dir = *v;
  if (auto v = get_set(worker_env::kCkptEvery)) {
    ENDURE_ASSIGN_OR_RETURN(
        s->checkpoint_every,
        ParseInteger(worker_env::kCkptEvery, *v, 0, INT64_MAX,
                     "expected a number of steps >= 0 (0: no periodic checkpoints)"));
  }
  if (auto v = get_set(worker_env::kRestoreStep)) {
    ENDURE_ASSIGN_OR_RETURN(
        s->restore_step,
        ParseInteger(worker_env::kRestoreStep, *v, -1, INT64_MAX,
                     "expected -1 (newest checkpoint), 0 (fresh start) or a step N > 0"));
  }
  // A plan of many shards outgrows an environment variable (E2BIG): the
  // agent then writes it to a file and names that instead.
  std::optional<std::string> plan_text = get_set(worker_env::kRestorePlan);
  const char* plan_source = worker_env::kRestorePlan;
  if (auto path = get_set(worker_env::kRestorePlanFile)) {
    if (plan_text) {
      return InvalidArgument("ENDURE_RESTORE_PLAN and ENDURE_RESTORE_PLAN_FILE are both set");
    }
    ENDURE_ASSIGN_OR_RETURN(plan_text, ReadPlanFile(*path));
    plan_source = worker_env::kRestorePlanFile;
  }
  if (plan_text) {
    Result<checkpoint::RestorePlan> plan = checkpoint::RestorePlanFromJson(*plan_text);
    if (!plan.ok()) return plan.status().WithContext(plan_source);
    s->public_plan = PublicPlan(*plan);
    s->plan = std::move(plan).value();
  }
  if (auto v = get_set(worker_env::kT0Dir)) s->t0_dir = *v;
  if (auto v = get_set(worker_env::kT0SlotBytes)) {
    ENDURE_ASSIGN_OR_RETURN(int64_t bytes,
                            ParseInteger(worker_env::kT0SlotBytes, *v, 0, INT64_MAX,
                                         "expected a number of bytes >= 0 (0: no limit)"));
    s->t0_slot_bytes = static_cast<uint64_t>(bytes);
  }
  if (auto v = get(worker_env::kSkipSteps)) {
    ENDURE_ASSIGN_OR_RETURN(s->skip_steps, ParseStepList(worker_env::kSkipSteps, *v));
  }
  if (auto v = get_set(worker_env::kHeartbeatInterval)) {
    Result<Duration> d = ParseDuration(*v);
    if (!d.ok()) return BadVariable(worker_env::kHeartbeatInterval, *v, d.status().message());
    if (d->count() <= 0) {
      return BadVariable(worker_env::kHeartbeatInterval, *v, "must be longer than zero");
    }
    s->heartbeat_interval = *d;
  }
  if (auto v = get_set(worker_env::kFaults)) {
    Result<std::vector<Fault>> all = faults::DecodeFaults(*v);
    if (!all.ok()) return all.status().WithContext(worker_env::kFaults);
    ENDURE_RETURN_IF_ERROR(faults::ValidateFaults(*all).WithContext(worker_env::kFaults));
    for (Fault& f : faults::FaultsForRank(*all, s->rank, {})) {
      s->faults.push_back({std::move(f), false});
    }
  }
  if (auto v = get_set(worker_env::kStacksFile)) s->stacks_file = *v;
  if (auto v = get_set(worker_env::kRejoinFile)) s->rejoin_file = *v;
  if (auto v = get_set(worker_env::kPeerRestore)) {
    if (*v != "0" && *v != "1") return BadVariable(worker_env::kPeerRestore, *v, "expected 0 or 1");
    s->peer_restore = *v == "1";
  }
  if (auto v = get_set(worker_env::kSdcCheckEvery)) {
    ENDURE_ASSIGN_OR_RETURN(s->sdc_check_every,
                            ParseInteger(worker_env::kSdcCheckEvery, *v, 0, INT64_MAX,
                                         "expected a number of steps >= 0 (0: no check)"));
  }

  std::optional<std::string> socket_path = get_set(worker_env::kAgentSocket);
  if (!socket_path) return std::unique_ptr<Session>(new Session(std::move(s)));
  if (socket_path->size() >= sizeof(sockaddr_un::sun_path)) {
    return BadVariable(worker_env::kAgentSocket, *socket_path,
                       "longer than a Unix socket path may be (" +
                           std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes)");
  }
  std::optional<std::string> token = get_set(worker_env::kToken);
  if (!token) {
    return InvalidArgument(
        "ENDURE_AGENT_SOCKET is set but ENDURE_TOKEN is not: the agent refuses reports "
        "without the job token");
  }
  s->token = *token;
  s->socket_path = *socket_path;
  s->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s->fd < 0) {
    return IOError(std::string("cannot create a Unix datagram socket: ") + std::strerror(errno));
  }
  s->heartbeat = std::thread([impl = s.get()] { impl->HeartbeatLoop(); });
  return std::unique_ptr<Session>(new Session(std::move(s)));
}

void Session::Impl::Stop() {
  if (heartbeat.joinable() || offer_watch.joinable()) {
    {
      MutexLock lock(&mu);
      stop = true;
    }
    stop_cv.NotifyAll();
    if (heartbeat.joinable()) heartbeat.join();
    if (offer_watch.joinable()) offer_watch.join();
  }
  if (fd >= 0) close(fd);
  fd = -1;
}

Session::~Session() { impl_->Stop(); }

bool Session::active() const { return impl_->fd >= 0; }
int Session::rank() const { return impl_->rank; }
int64_t Session::generation() const { return impl_->generation; }
const std::string& Session::checkpoint_dir() const { return impl_->checkpoint_dir; }
std::optional<int64_t> Session::checkpoint_every() const { return impl_->checkpoint_every; }
std::optional<int64_t> Session::restore_step() const { return impl_->restore_step; }
const std::optional<RestorePlan>& Session::restore_plan() const { return impl_->public_plan; }
bool Session::memory_checkpoints() const { return !impl_->t0_dir.empty(); }
const std::string& Session::stacks_file() const { return impl_->stacks_file; }
const std::vector<int64_t>& Session::skip_steps() const { return impl_->skip_steps; }
void Session::SetTokensPerStep(int64_t tokens) { impl_->tokens_per_step = tokens; }

void Session::SetTotalSteps(int64_t steps) { impl_->total_steps = std::max<int64_t>(0, steps); }
int64_t Session::dropped() const { return impl_->dropped.load(); }
const std::string& Session::current_phase() const { return impl_->phase; }
int64_t Session::sdc_check_every() const { return impl_->sdc_check_every; }

bool Session::FingerprintDue(int64_t step_index) const {
  const int64_t every = impl_->sdc_check_every;
  return every > 0 && step_index >= 0 && (step_index + 1) % every == 0;
}

Status Session::Phase(std::string_view name) {
  if (!contract::IsPhaseName(name)) {
    return InvalidArgument("Phase: '" + std::string(name.substr(0, 64)) +
                           "' is not a phase name (^[a-z][a-z0-9_]{0,31}$, e.g. \"eval\")");
  }
  Impl& s = *impl_;
  s.phase = std::string(name);
  if (s.fd < 0) return Status::Ok();
  const std::string datagram =
      Encode(s.token, s.generation, s.rank, contract::PhaseMessage{s.phase, s.steps_done.load()});
  // Retried: a lost "eval" would leave the agent timing a long evaluation
  // as a training step, and phases change a few times per evaluation at most.
  s.Send(datagram, /*retry=*/true);
  return Status::Ok();
}

Status Session::ReportFingerprint(int64_t step_index, std::string_view fingerprint) {
  if (step_index < 0) {
    return InvalidArgument("ReportFingerprint: step index " + std::to_string(step_index) + " < 0");
  }
  if (!contract::IsFingerprint(fingerprint)) {
    return InvalidArgument("ReportFingerprint: '" + std::string(fingerprint.substr(0, 64)) +
                           "' is not 16 lowercase hex digits (as Fingerprint returns)");
  }
  Impl& s = *impl_;
  if (s.fd < 0) return Status::Ok();
  // Not retried, like a step report: a lost one costs one check, and the
  // next check compares the same (still corrupted) parameters.
  s.Send(Encode(s.token, s.generation, s.rank,
                contract::FingerprintMessage{step_index + 1, std::string(fingerprint)}),
         /*retry=*/false);
  return Status::Ok();
}

std::optional<BitFlip> Session::BitflipDue(int64_t step_index) {
  Impl& s = *impl_;
  const int64_t step = step_index + 1;
  for (PendingFault& p : s.faults) {
    if (p.fired || p.fault.kind != FaultKind::kBitflip || p.fault.step != step) continue;
    p.fired = true;
    s.SendFault(p, step);
    const Fault& f = p.fault;
    std::fprintf(stderr,
                 "endure: injected fault %s: bitflip of bit %d of element %lld of parameter "
                 "tensor %d after step %lld\n",
                 f.id.c_str(), f.bit, static_cast<long long>(f.element), f.tensor,
                 static_cast<long long>(step));
    std::fflush(stderr);
    return BitFlip{f.tensor, f.element, f.bit};
  }
  return std::nullopt;
}

void Session::BeforeCollective(int64_t step_index) {
  Impl& s = *impl_;
  const int64_t step = step_index + 1;
  for (PendingFault& p : s.faults) {
    if (p.fired || p.fault.step > step) continue;
    if (p.fault.kind == FaultKind::kCommFail) {
      p.fired = true;
      s.SendFault(p, step);
      std::fflush(stdout);
      std::fprintf(stderr,
                   "endure fault: collective failed: Connection reset by peer (comm-fail)\n");
      std::fflush(nullptr);
      _exit(1);
    }
    if (p.fault.kind == FaultKind::kCommSlow) {
      p.fired = true;
      s.SendFault(p, step);
      std::fprintf(stderr, "endure: injected fault %s: collectives %.2fx slower from step %lld\n",
                   p.fault.id.c_str(), p.fault.factor, static_cast<long long>(step));
      std::fflush(stderr);
      s.comm_slow_factor = std::max(s.comm_slow_factor, p.fault.factor);
    }
  }
  if (s.comm_slow_factor <= 1) return;
  // Stretched from the collective's own time, not from what was reported
  // with the sleep in it: otherwise each step would stretch the last
  // stretch and the delay would grow geometrically.
  const double extra_s = (s.comm_slow_factor - 1) * std::max(s.natural_comm_s, kMinSlowCommS);
  std::this_thread::sleep_for(std::chrono::duration<double>(extra_s));
  s.injected_comm_s += extra_s;
}

Result<std::string> Session::ReadRestoreShard(size_t index) const {
  if (!impl_->plan) return InvalidArgument("ReadRestoreShard: the agent gave no restore plan");
  if (index >= impl_->plan->sources.size()) {
    return InvalidArgument("ReadRestoreShard: source " + std::to_string(index) +
                           " of a plan with " + std::to_string(impl_->plan->sources.size()));
  }
  return checkpoint::ReadShardCopy(impl_->plan->sources[index].copy);
}

namespace {

// This rank's T0 slots that hold a complete snapshot (ready, or pinned by
// the agent while it copies it), of this rank's shard.
std::vector<std::pair<checkpoint::SnapshotInfo, std::unique_ptr<checkpoint::SnapshotFile>>>
LocalSnapshots(const std::string& t0_dir, int rank) {
  std::vector<std::pair<checkpoint::SnapshotInfo, std::unique_ptr<checkpoint::SnapshotFile>>> out;
  if (t0_dir.empty()) return out;
  for (int slot = 0; slot < checkpoint::kT0Slots; ++slot) {
    Result<std::unique_ptr<checkpoint::SnapshotFile>> f =
        checkpoint::SnapshotFile::Open(checkpoint::SlotPath(t0_dir, rank, slot));
    if (!f.ok()) continue;
    const checkpoint::SnapshotInfo info = (*f)->info();
    const bool complete =
        info.state == checkpoint::SlotState::kReady || info.state == checkpoint::SlotState::kPinned;
    if (complete && info.shard == rank && info.step > 0) out.emplace_back(info, std::move(*f));
  }
  return out;
}

}  // namespace

std::vector<int64_t> Session::LocalSnapshotSteps(int shards) const {
  std::vector<int64_t> steps;
  for (const auto& [info, file] : LocalSnapshots(impl_->t0_dir, impl_->rank)) {
    if (info.shards == shards) steps.push_back(info.step);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

Result<std::string> Session::ReadLocalSnapshot(int64_t step) const {
  for (const auto& [info, file] : LocalSnapshots(impl_->t0_dir, impl_->rank)) {
    if (info.step != step) continue;
    ENDURE_RETURN_IF_ERROR(file->Verify());
    ENDURE_ASSIGN_OR_RETURN(std::string_view bytes, file->payload());
    std::string copy(bytes);
    // The slot may have been reused while it was read: the copy counts
    // only if it is still the snapshot verified.
    if (file->info().step != step) break;
    return copy;
  }
  return NotFound("rank " + std::to_string(impl_->rank) + " holds no snapshot of step " +
                  std::to_string(step) + " in node memory (" + impl_->t0_dir + ")");
}

bool Session::ShouldSkip(int64_t step_index) const {
  return std::binary_search(impl_->skip_steps.begin(), impl_->skip_steps.end(), step_index + 1);
}

bool Session::Impl::Send(const std::string& datagram, bool retry) {
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (true) {
    // Unconnected sendto: an agent that restarts and binds the path again
    // receives the next datagram without the worker doing anything.
    const ssize_t n = sendto(fd, datagram.data(), datagram.size(), MSG_DONTWAIT | MSG_NOSIGNAL,
                             reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    if (n == static_cast<ssize_t>(datagram.size())) return true;
    if (n < 0 && errno == EINTR) continue;
    const bool full = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS);
    if (!retry || !full || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  dropped.fetch_add(1);
  return false;
}

void Session::Impl::SendFault(const PendingFault& p, int64_t step) {
  if (fd < 0) return;
  Send(Encode(token, generation, rank, contract::FaultMessage{p.fault.id, p.fault.kind, step}),
       /*retry=*/true);
}

void Session::Impl::HeartbeatLoop() {
  MutexLock lock(&mu);
  while (!stop) {
    const std::string datagram =
        Encode(token, generation, rank, contract::HeartbeatMessage{steps_done.load()});
    lock.Unlock();
    Send(datagram, /*retry=*/false);
    lock.Lock();
    stop_cv.WaitFor(lock, heartbeat_interval, [this]() REQUIRES(mu) { return stop; });
  }
}

namespace {

// DumpStacksOnSignal's handler state: the stacks file and the thread whose
// stack is dumped. Set before the handler is installed.
std::atomic<int> g_stack_fd{-1};
std::atomic<pid_t> g_stack_tid{0};

pid_t CurrentTid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// Async-signal-safe: backtrace (its first call, which may load libgcc_s,
// was made before the handler went in), backtrace_symbols_fd and write.
void DumpStackOnSignal(int sig) {
  const int saved_errno = errno;
  const pid_t tid = g_stack_tid.load();
  if (tid != 0 && CurrentTid() != tid) {
    ::syscall(SYS_tgkill, ::getpid(), tid, sig);  // the training thread dumps
  } else if (const int fd = g_stack_fd.load(); fd >= 0) {
    void* frames[128];
    const int n = ::backtrace(frames, 128);
    // Frames 0 and 1 are this handler and the kernel's signal trampoline:
    // the dump starts where the thread was interrupted.
    constexpr int kHandlerFrames = 2;
    static constexpr char kHead[] =
        "Native stack of the training thread (most recent call first):\n";
    if (n > kHandlerFrames && ::write(fd, kHead, sizeof kHead - 1) >= 0) {
      ::backtrace_symbols_fd(frames + kHandlerFrames, n - kHandlerFrames, fd);
    }
  }
  errno = saved_errno;
}

// kInvalidArgument naming `caller` for a signal the agent would refuse.
Status CheckStackSignal(const char* caller, int signal) {
  if (contract::IsStackSignal(signal)) return Status::Ok();
  return InvalidArgument(std::string(caller) + ": signal " + std::to_string(signal) +
                         " is not SIGUSR1, SIGUSR2 or a real-time signal");
}

}  // namespace

Status Session::DumpStacksOnSignal(int signal) {
  ENDURE_RETURN_IF_ERROR(CheckStackSignal("DumpStacksOnSignal", signal));
  if (impl_->stacks_file.empty()) return Status::Ok();
  // O_APPEND: the agent empties the file before each dump.
  const int fd = ::open(impl_->stacks_file.c_str(),
                        O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Unavailable("DumpStacksOnSignal: cannot open " + impl_->stacks_file + ": " +
                       std::strerror(errno));
  }
  void* warm[4];
  ::backtrace(warm, 4);
  g_stack_tid.store(CurrentTid());
  if (const int old = g_stack_fd.exchange(fd); old >= 0) ::close(old);
  struct sigaction sa {};
  sa.sa_handler = DumpStackOnSignal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(signal, &sa, nullptr) != 0) {
    return Unavailable(std::string("DumpStacksOnSignal: sigaction: ") + std::strerror(errno));
  }
  return AnnounceStackSignal(signal);
}

Status Session::AnnounceStackSignal(int signal) {
  ENDURE_RETURN_IF_ERROR(CheckStackSignal("AnnounceStackSignal", signal));
  if (impl_->fd < 0) return Status::Ok();
  // Retried: unlike a step report, this one is sent once, at start-up.
  impl_->Send(Encode(impl_->token, impl_->generation, impl_->rank, contract::StacksMessage{signal}),
              /*retry=*/true);
  return Status::Ok();
}

void Session::SendReady(int64_t start_step, bool unknown, double restore_s, double init_s) {
  Impl& s = *impl_;
  s.steps_done.store(start_step);
  if (s.fd < 0) return;
  contract::ReadyMessage m;
  m.start_step = start_step;
  m.start_step_unknown = unknown;
  m.restore_s = restore_s;
  m.init_s = init_s;
  m.rejoin = s.declares_rejoin;
  m.rejoin_from_tiers = s.declares_rejoin && s.rejoins_from_tiers;
  m.deterministic = s.declares_deterministic;
  s.Send(Encode(s.token, s.generation, s.rank, m), /*retry=*/false);
}

void Session::Ready(int64_t start_step, double restore_s, double init_s) {
  SendReady(start_step, /*unknown=*/false, restore_s, init_s);
}

void Session::ReadyAtUnknownStep(double restore_s, double init_s) {
  SendReady(0, /*unknown=*/true, restore_s, init_s);
}

bool Session::rejoin_offered_here() const { return !impl_->rejoin_file.empty(); }
void Session::DeclareRejoin(RejoinRestore restore) {
  impl_->declares_rejoin = !impl_->rejoin_file.empty();
  impl_->rejoins_from_tiers = restore == RejoinRestore::kFromTiers;
  impl_->StartWatchingOffers();
}
void Session::DeclareDeterministic() { impl_->declares_deterministic = true; }
bool Session::peer_restore() const { return impl_->peer_restore; }

namespace {

// The KEY=VALUE lines of a rejoin offer (at most 1 MiB), and the generation
// it offers; nullopt when the file is missing, or holds no valid generation
// (a half-written file cannot occur: the agent renames it into place).
struct RejoinOffer {
  std::vector<std::pair<std::string, std::string>> variables;
  int64_t generation = -1;
};

std::optional<RejoinOffer> ReadRejoinOffer(const std::string& path) {
  std::ifstream f(path);
  if (!f) return std::nullopt;
  RejoinOffer offer;
  size_t bytes = 0;
  for (std::string line; std::getline(f, line);) {
    bytes += line.size() + 1;
    if (bytes > (1 << 20)) return std::nullopt;
    const size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    if (key == worker_env::kGeneration) {
      Result<int64_t> g = ParseInteger(worker_env::kGeneration, value, 0, INT64_MAX, "");
      if (!g.ok()) return std::nullopt;
      offer.generation = *g;
    }
    offer.variables.emplace_back(std::move(key), std::move(value));
  }
  if (offer.generation < 0) return std::nullopt;
  return offer;
}

}  // namespace

void Session::Impl::StartWatchingOffers() {
  if (!declares_rejoin || offer_watch.joinable()) return;
  offer_watch = std::thread([this] { WatchOffers(); });
}

void Session::Impl::WatchOffers() {
  constexpr std::chrono::milliseconds kLook{10};
  MutexLock lock(&mu);
  while (!stop) {
    lock.Unlock();
    std::optional<RejoinOffer> offer = ReadRejoinOffer(rejoin_file);
    if (offer && offer->generation > offered.load()) offered.store(offer->generation);
    lock.Lock();
    stop_cv.WaitFor(lock, kLook, [this]() REQUIRES(mu) { return stop; });
  }
}

bool Session::RejoinPending() const {
  if (impl_->rejoin_file.empty()) return false;
  if (impl_->offer_watch.joinable()) return impl_->offered.load() > impl_->generation;
  std::optional<RejoinOffer> offer = ReadRejoinOffer(impl_->rejoin_file);
  return offer && offer->generation > impl_->generation;
}

Status Session::Rejoin(std::chrono::milliseconds timeout) {
  Impl& old = *impl_;
  if (old.rejoin_file.empty()) {
    return InvalidArgument("no ENDURE_REJOIN_FILE: the agent does not offer in-process restarts");
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::optional<RejoinOffer> offer;
  while (true) {
    offer = ReadRejoinOffer(old.rejoin_file);
    if (offer && offer->generation > old.generation) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      return Unavailable("no later generation offered within " + std::to_string(timeout.count()) +
                         " ms");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // Checked before anything changes: a malformed offer leaves the session
  // and the environment as they were.
  std::map<std::string, std::string> variables(offer->variables.begin(), offer->variables.end());
  // Where the restore comes from is the generation's alone: a plan (or a
  // peer restore) this process started with must not outlive it.
  constexpr const char* kPerGeneration[] = {worker_env::kRestoreStep, worker_env::kRestorePlan,
                                            worker_env::kRestorePlanFile, worker_env::kPeerRestore};
  auto per_generation = [&](const char* name) {
    return std::any_of(std::begin(kPerGeneration), std::end(kPerGeneration),
                       [&](const char* v) { return std::strcmp(v, name) == 0; });
  };
  auto lookup = [&](const char* name) -> const char* {
    auto it = variables.find(name);
    if (it != variables.end()) return it->second.c_str();
    return per_generation(name) ? nullptr : std::getenv(name);
  };
  ENDURE_ASSIGN_OR_RETURN(std::unique_ptr<Session> fresh, FromEnvironment(lookup));
  for (const char* name : kPerGeneration) {
    if (variables.count(name) == 0) ::unsetenv(name);
  }
  for (const auto& [key, value] : offer->variables) ::setenv(key.c_str(), value.c_str(), 1);
  Impl& next = *fresh->impl_;
  next.tokens_per_step = old.tokens_per_step;
  next.total_steps = old.total_steps;
  next.phase = old.phase;
  next.declares_rejoin = old.declares_rejoin;
  next.rejoins_from_tiers = old.rejoins_from_tiers;
  next.declares_deterministic = old.declares_deterministic;
  next.loss_watch = old.loss_watch;
  next.peer_restore = false;  // this process holds its state
  next.steps_done.store(old.steps_done.load());
  if (next.rank == old.rank && next.t0_dir == old.t0_dir) next.snapshots = std::move(old.snapshots);
  old.Stop();
  next.StartWatchingOffers();
  std::swap(impl_, fresh->impl_);
  return Status::Ok();
}

bool Session::StopsAt(int64_t step_index) const {
  return std::any_of(impl_->faults.begin(), impl_->faults.end(), [&](const PendingFault& p) {
    const FaultKind k = p.fault.kind;
    return !p.fired && p.fault.step == step_index + 1 &&
           (k == FaultKind::kKill || k == FaultKind::kExit || k == FaultKind::kHang ||
            k == FaultKind::kLog);
  });
}

void Session::BeginStep(int64_t step_index) {
  Impl& s = *impl_;
  const int64_t step = step_index + 1;
  for (PendingFault& p : s.faults) {
    if (p.fired || p.fault.step != step) continue;
    const Fault& f = p.fault;
    switch (f.kind) {
      case FaultKind::kKill:
        p.fired = true;
        s.SendFault(p, step);
        std::fprintf(stderr, "endure: injected fault %s: SIGKILL at step %lld\n", f.id.c_str(),
                     static_cast<long long>(step));
        std::fflush(stderr);
        raise(SIGKILL);
        break;
      case FaultKind::kExit:
        p.fired = true;
        s.SendFault(p, step);
        std::fprintf(stderr, "endure: injected fault %s: exit %d at step %lld\n", f.id.c_str(),
                     f.exit_code, static_cast<long long>(step));
        std::fflush(nullptr);
        _exit(f.exit_code);
      case FaultKind::kHang:
        p.fired = true;
        s.SendFault(p, step);
        std::fprintf(stderr, "endure: injected fault %s: hanging in step %lld\n", f.id.c_str(),
                     static_cast<long long>(step));
        std::fflush(nullptr);
        // Like a collective that never returns: the process lives on and
        // its heartbeats continue, but the step never ends.
        while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
      case FaultKind::kLog:
        p.fired = true;
        s.SendFault(p, step);
        std::fflush(stdout);
        std::fprintf(stderr, "%s\n", f.line.c_str());
        std::fflush(nullptr);
        _exit(1);
      default:
        break;  // nan and slow take effect in EndStep
    }
  }
}

std::optional<double> Session::EndStep(int64_t step_index, std::optional<double> loss,
                                       double compute_s, double comm_s, double ckpt_stall_s,
                                       int64_t checkpoint_step) {
  Impl& s = *impl_;
  const int64_t step = step_index + 1;
  std::optional<double> logged = loss;
  for (PendingFault& p : s.faults) {
    if (p.fired) continue;
    if (p.fault.kind == FaultKind::kNan && p.fault.step == step) {
      p.fired = true;
      s.SendFault(p, step);
      logged = std::nan("");
    } else if (p.fault.kind == FaultKind::kSpike && p.fault.step == step && logged) {
      p.fired = true;
      s.SendFault(p, step);
      logged = *logged * p.fault.factor;
    } else if (p.fault.kind == FaultKind::kSlow && p.fault.step <= step) {
      p.fired = true;
      s.SendFault(p, step);
      s.slow_factor = std::max(s.slow_factor, p.fault.factor);
    }
  }
  if (s.slow_factor > 1) {
    // Only the rank's own compute is stretched: its communication time
    // includes waiting for peers, which are slowed too when they carry the
    // same fault, and scaling that would compound step after step.
    const double extra_s = (s.slow_factor - 1) * compute_s;
    std::this_thread::sleep_for(std::chrono::duration<double>(extra_s));
    compute_s += extra_s;
  }
  if (logged && s.snapshots && s.loss_watch.Observe(core::StepNumber{step}, *logged)) {
    s.snapshots->Hold(step - 1);
  }
  s.natural_comm_s = std::max(0.0, comm_s - s.injected_comm_s);
  s.injected_comm_s = 0;
  s.steps_done.store(step);
  if (s.fd >= 0) {
    contract::StepMessage m;
    m.step = step;
    m.loss = logged;
    m.compute_s = compute_s;
    m.comm_s = comm_s;
    m.ckpt_stall_s = ckpt_stall_s;
    m.checkpoint_step = checkpoint_step;
    m.tokens = std::max<int64_t>(0, s.tokens_per_step);
    m.total_steps = std::max<int64_t>(0, s.total_steps);
    s.Send(Encode(s.token, s.generation, s.rank, m), /*retry=*/false);
  }
  return logged;
}

void Session::EndSkippedStep(int64_t step_index, double ckpt_stall_s, int64_t checkpoint_step) {
  Impl& s = *impl_;
  const int64_t step = step_index + 1;
  s.injected_comm_s = 0;  // a skipped step's collectives (if any) are not measured
  s.steps_done.store(step);
  if (s.fd < 0) return;
  contract::StepMessage m;
  m.skipped = true;
  m.step = step;
  m.ckpt_stall_s = ckpt_stall_s;
  m.checkpoint_step = checkpoint_step;
  s.Send(Encode(s.token, s.generation, s.rank, m), /*retry=*/false);
}

namespace {

// The views of `tensors`, checked: each one's bytes must match its dtype
// and shape, and the metadata must be a JSON object.
Result<std::vector<checkpoint::TensorView>> CheckedViews(const std::vector<TensorRef>& tensors) {
  std::vector<checkpoint::TensorView> views;
  views.reserve(tensors.size() + 1);
  for (const TensorRef& t : tensors) {
    const size_t elem = checkpoint::DTypeSize(t.dtype);
    if (elem == 0) {
      return InvalidArgument("tensor '" + t.name + "': unsupported dtype '" + t.dtype + "'");
    }
    uint64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return InvalidArgument("tensor '" + t.name + "': negative dimension");
      elements *= static_cast<uint64_t>(d);
    }
    if (elements * elem != t.bytes || (t.bytes > 0 && t.data == nullptr)) {
      return InvalidArgument("tensor '" + t.name + "': " + std::to_string(t.bytes) +
                             " bytes do not match its dtype and shape");
    }
    views.push_back(checkpoint::TensorView{t.name, t.dtype, t.shape, t.data, t.bytes});
  }
  return views;
}

Result<nlohmann::json> MetaObject(const std::string& meta_json) {
  nlohmann::json meta = nlohmann::json::parse(meta_json, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object()) {
    return InvalidArgument("checkpoint metadata must be a JSON object");
  }
  return meta;
}

}  // namespace

Result<bool> Session::SaveSnapshot(int64_t step, int shards, const std::string& meta_json,
                                   const std::vector<TensorRef>& tensors) {
  Impl& s = *impl_;
  if (s.t0_dir.empty()) return InvalidArgument("SaveSnapshot: ENDURE_T0_DIR is not set");
  if (shards < 1 || s.rank >= shards) {
    return InvalidArgument("SaveSnapshot: rank " + std::to_string(s.rank) + " of " +
                           std::to_string(shards) + " shards");
  }
  ENDURE_ASSIGN_OR_RETURN(nlohmann::json meta, MetaObject(meta_json));
  ENDURE_ASSIGN_OR_RETURN(std::vector<checkpoint::TensorView> views, CheckedViews(tensors));
  meta["step"] = step;
  meta["shard"] = s.rank;
  meta["shards"] = shards;
  const std::string meta_text = meta.dump();
  if (!s.snapshots) {
    ENDURE_ASSIGN_OR_RETURN(
        s.snapshots, checkpoint::SnapshotWriter::Open(s.t0_dir, s.rank, shards, s.t0_slot_bytes));
  }
  ENDURE_ASSIGN_OR_RETURN(
      std::optional<checkpoint::SnapshotWriter::Saved> saved,
      s.snapshots->Save(step, checkpoint::ShardViews(meta_text, std::move(views)),
                        std::chrono::seconds(30)));
  if (!saved) return false;
  if (s.fd >= 0) {
    const std::string datagram =
        Encode(s.token, s.generation, s.rank,
               contract::SnapshotMessage{step, shards, saved->path,
                                         static_cast<int64_t>(saved->bytes), HexU64(saved->xxh3)});
    // Not retried: a training step never waits for the agent. The agent
    // also finds the slot when it next scans them.
    s.Send(datagram, /*retry=*/false);
  }
  return true;
}

// ---- Checkpoint state helpers ----

size_t DTypeBytes(std::string_view dtype) { return checkpoint::DTypeSize(dtype); }

Result<StoredShard> DecodeShard(std::string_view bytes, const std::string& source) {
  ENDURE_ASSIGN_OR_RETURN(checkpoint::DecodedShard shard, checkpoint::DecodeShard(bytes, source));
  StoredShard out;
  out.meta_json = shard.meta.dump();
  out.tensors.reserve(shard.tensors.size());
  for (checkpoint::TensorBlob& t : shard.tensors) {
    out.tensors.push_back(
        StoredTensor{std::move(t.name), std::move(t.dtype), std::move(t.shape), std::move(t.data)});
  }
  return out;
}

std::vector<int> PartitionBySize(const std::vector<uint64_t>& bytes, int shards) {
  return checkpoint::PartitionBySize(bytes, shards);
}

bool FlipBit(const BitFlip& flip, void* data, int64_t numel, size_t element_bytes) {
  if (data == nullptr || numel <= 0 || flip.element < 0 || flip.bit < 0) return false;
  if (element_bytes != 1 && element_bytes != 2 && element_bytes != 4 && element_bytes != 8) {
    return false;
  }
  const int64_t element = flip.element % numel;
  const int bit = flip.bit % static_cast<int>(8 * element_bytes);
  // Bit b has value 2^b in the element read as an integer in host byte
  // order: byte b / 8 from the low end.
  const size_t low_byte = static_cast<size_t>(bit / 8);
  const size_t byte =
      std::endian::native == std::endian::little ? low_byte : element_bytes - 1 - low_byte;
  unsigned char* p = static_cast<unsigned char*>(data) + element * element_bytes + byte;
  *p ^= static_cast<unsigned char>(1u << (bit % 8));
  return true;
}

std::string Fingerprint(const std::vector<TensorRef>& tensors) {
  Xxh3Hasher h;
  for (const TensorRef& t : tensors) {
    h.Update(t.name);
    h.Update(t.data, t.bytes);
  }
  return HexU64(h.Digest());
}

Status CommitCheckpoint(const std::string& dir, int64_t step, const std::string& meta_json,
                        const std::vector<TensorRef>& tensors, int keep) {
  if (step < 0) return InvalidArgument("CommitCheckpoint: step " + std::to_string(step) + " < 0");
  ENDURE_ASSIGN_OR_RETURN(nlohmann::json meta, MetaObject(meta_json));
  ENDURE_ASSIGN_OR_RETURN(std::vector<checkpoint::TensorView> views, CheckedViews(tensors));
  ENDURE_RETURN_IF_ERROR(Env::Default()->CreateDirs(dir));
  checkpoint::CheckpointDir ckpt(Env::Default(), dir);
  ENDURE_RETURN_IF_ERROR(ckpt.CommitViews(step, meta, views).status());
  if (keep > 0) ENDURE_RETURN_IF_ERROR(ckpt.Retain(keep));
  return Status::Ok();
}

Result<std::optional<LoadedCheckpoint>> LoadNewestCheckpoint(const std::string& dir, int64_t limit,
                                                             std::vector<std::string>* refused) {
  checkpoint::CheckpointDir ckpt(Env::Default(), dir);
  Result<checkpoint::TrainingState> state = ckpt.LoadNewestAtOrBefore(limit, refused);
  if (!state.ok()) {
    if (state.status().code() == StatusCode::kNotFound) return std::optional<LoadedCheckpoint>();
    return state.status();
  }
  LoadedCheckpoint out;
  out.step = state->step;
  out.state.meta_json = state->meta.dump();
  for (checkpoint::TensorBlob& t : state->tensors) {
    out.state.tensors.push_back(
        StoredTensor{std::move(t.name), std::move(t.dtype), std::move(t.shape), std::move(t.data)});
  }
  return std::optional<LoadedCheckpoint>(std::move(out));
}

Result<std::vector<int64_t>> RemoveCheckpointsAfter(const std::string& dir, int64_t step) {
  checkpoint::CheckpointDir ckpt(Env::Default(), dir);
  return ckpt.RemoveAfter(step);
}

}  // namespace endure
