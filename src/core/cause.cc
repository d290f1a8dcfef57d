// Incident causes; see cause.h.
#include "core/cause.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <iterator>
#include <optional>

#include "common/status.h"
#include "core/crash_detector.h"

namespace endure::core {
namespace {

struct CatalogueEntry {
  std::string_view name;
  CauseClass cause_class;
  StrikeClass strike;
  bool collective;  // a collective's failure: the reporting rank may be a victim
};

// The catalogue (cause.h). Every cause name of config/log_rules/, of the job
// machine (CauseName), of the heartbeat monitor and the health check, and of
// the simulator's failure mixes (src/sim/scenario.cc); a unit test checks the
// shipped rules and the mixes against it.
constexpr CatalogueEntry kCatalogue[] = {
    // A component of the node failed (the log rules' evict_node causes, the
    // heartbeat monitor's, the SDC check's, the health check's, the
    // simulator's llama3 mix).
    {"node_lost", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"node_failure", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"nic_firmware_timeout", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"pcie_aer_fatal", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"faulty_gpu", CauseClass::kHardware, StrikeClass::kHard, false},
    {"gpu_lost", CauseClass::kHardware, StrikeClass::kHard, false},
    {"gpu_fallen_off", CauseClass::kHardware, StrikeClass::kHard, false},
    {"gpu_init_failed", CauseClass::kHardware, StrikeClass::kHard, false},
    {"gpu_hbm3", CauseClass::kHardware, StrikeClass::kHard, false},
    {"gpu_sram", CauseClass::kHardware, StrikeClass::kHard, false},
    {"gpu_system_processor", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"gpu_thermal_interface_sensor", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"ecc_uncorrectable", CauseClass::kHardware, StrikeClass::kHard, false},
    {"gpu_reset_required", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"row_remap_failure", CauseClass::kHardware, StrikeClass::kHard, false},
    {"nvlink_error", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"dcgm_diag_failed", CauseClass::kHardware, StrikeClass::kHard, false},
    {"slurm_node_failure", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"sdc", CauseClass::kHardware, StrikeClass::kHard, false},
    {"silent_data_corruption", CauseClass::kHardware, StrikeClass::kHard, false},
    {"health_check_failed", CauseClass::kHardware, StrikeClass::kHard, false},
    {"nic", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"network_switch_cable", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"host_maintenance", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"ssd", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"power_supply", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"server_chassis", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"io_expansion_board", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"cpu", CauseClass::kHardware, StrikeClass::kSoft, false},
    {"system_memory", CauseClass::kHardware, StrikeClass::kSoft, false},
    // The program, its data or its configuration: it fails on any node alike
    // (the log rules' stop verdicts among them).
    {"user_exception", CauseClass::kSoftware, StrikeClass::kSoft, false},
    {"user_error", CauseClass::kSoftware, StrikeClass::kSoft, false},
    {"software_bug", CauseClass::kSoftware, StrikeClass::kSoft, false},
    {"native_exception", CauseClass::kSoftware, StrikeClass::kSoft, false},
    {"cuda_device_assert", CauseClass::kSoftware, StrikeClass::kSoft, false},
    {"oom", CauseClass::kSoftware, StrikeClass::kSoft, false},
    {"slurm_oom", CauseClass::kSoftware, StrikeClass::kSoft, false},
    {"cuda_oom", CauseClass::kSoftware, StrikeClass::kSoft, false},
    {"shm_exhausted", CauseClass::kSoftware, StrikeClass::kSoft, false},
    {"loss_nan", CauseClass::kSoftware, StrikeClass::kSoft, false},
    {"loss_inf", CauseClass::kSoftware, StrikeClass::kSoft, false},
    {"loss_spike", CauseClass::kSoftware, StrikeClass::kSoft, false},
    {"loss_anomaly", CauseClass::kSoftware, StrikeClass::kSoft, false},
    // Either: the same symptom has a software and a hardware reading, or the
    // failing rank is a victim of another's failure.
    {"hang", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"straggler", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"nccl_timeout", CauseClass::kAmbiguous, StrikeClass::kSoft, true},
    {"nccl_watchdog_timeout", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"nccl_error", CauseClass::kAmbiguous, StrikeClass::kSoft, true},
    {"nccl_remote_error", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"gloo_timeout", CauseClass::kAmbiguous, StrikeClass::kSoft, true},
    {"gloo_error", CauseClass::kAmbiguous, StrikeClass::kSoft, true},
    {"comm_error", CauseClass::kAmbiguous, StrikeClass::kSoft, true},
    {"socket_error", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"store_error", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"rendezvous_timeout", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"rendezvous_closed", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"address_in_use", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"ib_error", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"ib_link_down", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"ib_link_flap", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"fabric_error", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"pcie_aer_nonfatal", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"pcie_aer_corrected", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"nvml_error", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"dcgm_health_warning", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"cuda_error", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"cuda_unavailable", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"disk_full", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"filesystem_read_only", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"io_error", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"stale_file_handle", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"segfault", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"dataloader_worker_died", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"worker_failed", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"killed", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"interrupted", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"dependency", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"slurm_cancelled", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"slurm_preempted", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"slurm_prolog_failure", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
    {"slurm_time_limit", CauseClass::kAmbiguous, StrikeClass::kSoft, false},
};

// Xids that name the GPU or its links (a reset or a repair): those of
// config/log_rules/10_gpu.toml's evict_node buckets in NVIDIA's catalogue
// that GPUs print in practice. The catalogue's RESTART_APP and IGNORE Xids
// (13, 31, 43, 63, 92, 94, ...) are the application's, or nothing. Of them,
// 48 (double-bit ECC), 79 (fallen off the bus) and 95 (uncontained ECC)
// are hard strikes; the others often clear with a GPU reset: soft, so that
// they quarantine on repetition.
constexpr int kHardwareXids[] = {46, 48, 54, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143};
constexpr int kHardXids[] = {48, 79, 95};

const CatalogueEntry* Find(std::string_view name) {
  for (const CatalogueEntry& e : kCatalogue) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

// "xid_79" -> 79; nullopt for anything else.
std::optional<int> XidOf(std::string_view name) {
  if (!name.starts_with("xid_") || name.size() <= 4 || name.size() > 7) return std::nullopt;
  int xid = 0;
  for (char ch : name.substr(4)) {
    if (ch < '0' || ch > '9') return std::nullopt;
    xid = xid * 10 + (ch - '0');
  }
  return xid;
}

template <size_t N>
bool Contains(const int (&list)[N], int value) {
  return std::find(std::begin(list), std::end(list), value) != std::end(list);
}

// "health_check_failed", with a suffix naming the test that failed.
bool IsHealthCheckFailure(std::string_view name) {
  constexpr std::string_view kHealthCheck = "health_check_failed";
  return name.starts_with(kHealthCheck) &&
         (name.size() == kHealthCheck.size() || name[kHealthCheck.size()] == ' ' ||
          name[kHealthCheck.size()] == ':');
}

constexpr Cause kFixed[] = {Cause::kNodeLost,  Cause::kHang,      Cause::kLossNan,
                            Cause::kLossInf,   Cause::kLossSpike, Cause::kPersistenceFailing,
                            Cause::kStraggler, Cause::kSdc};

}  // namespace

std::string_view CauseName(Cause kind) {
  switch (kind) {
    case Cause::kWorkerExit:
      return "worker_exit";
    case Cause::kSignal:
      return "signal";
    case Cause::kNodeLost:
      return "node_lost";
    case Cause::kHang:
      return "hang";
    case Cause::kLossNan:  // the detector names its kinds
      return LossAnomalyCause(LossAnomalyKind::kNaN);
    case Cause::kLossInf:
      return LossAnomalyCause(LossAnomalyKind::kInf);
    case Cause::kLossSpike:
      return LossAnomalyCause(LossAnomalyKind::kSpike);
    case Cause::kPersistenceFailing:
      return "checkpoint persistence failing";
    case Cause::kStraggler:
      return "straggler";
    case Cause::kSdc:
      return "sdc";
    case Cause::kLogRule:
      return "log_rule";
  }
  return "?";
}

IncidentCause FixedCause(Cause kind) {
  ENDURE_CHECK(kind != Cause::kWorkerExit && kind != Cause::kSignal && kind != Cause::kLogRule);
  return IncidentCause{kind, std::string(CauseName(kind))};
}

IncidentCause LossAnomalyCauseOf(LossAnomalyKind kind) {
  switch (kind) {
    case LossAnomalyKind::kNaN:
      return FixedCause(Cause::kLossNan);
    case LossAnomalyKind::kInf:
      return FixedCause(Cause::kLossInf);
    case LossAnomalyKind::kSpike:
      return FixedCause(Cause::kLossSpike);
  }
  return FixedCause(Cause::kLossNan);
}

IncidentCause ParseIncidentCause(std::string_view name) {
  for (Cause kind : kFixed) {
    if (CauseName(kind) == name) return FixedCause(kind);
  }
  // The crash detector's names (crash_detector.cc).
  if (name.starts_with("worker_exit code ")) return {Cause::kWorkerExit, std::string(name)};
  if (name.starts_with("signal ")) return {Cause::kSignal, std::string(name)};
  return {Cause::kLogRule, std::string(name)};
}

std::vector<std::string_view> CatalogueNames() {
  std::vector<std::string_view> out;
  for (const CatalogueEntry& e : kCatalogue) out.push_back(e.name);
  return out;
}

std::string CauseLabel(std::string_view cause) {
  if (Find(cause) != nullptr) return std::string(cause);
  if (cause.starts_with("worker_exit code ")) return "worker_exit";
  if (IsHealthCheckFailure(cause)) return "health_check_failed";
  if (std::optional<int> xid = XidOf(cause)) {
    return Contains(kHardwareXids, *xid) ? "xid_" + std::to_string(*xid) : "xid_other";
  }
  if (cause.starts_with("signal ")) {
    int number = 0;
    const std::string_view digits = cause.substr(7);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), number);
    const std::string_view name = SignalName(number);
    if (ec != std::errc() || name == "SIG?") return "signal_other";
    std::string label = "signal_";
    for (char ch : name) label += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return label;
  }
  return "other";
}

std::vector<std::string> CauseLabels() {
  std::vector<std::string> out;
  auto add = [&](std::string label) {
    if (std::find(out.begin(), out.end(), label) == out.end()) out.push_back(std::move(label));
  };
  for (const CatalogueEntry& e : kCatalogue) add(std::string(e.name));
  add("worker_exit");
  add("health_check_failed");
  for (int signal : KnownSignals()) add(CauseLabel("signal " + std::to_string(signal)));
  add("signal_other");
  for (int xid : kHardwareXids) add("xid_" + std::to_string(xid));
  add("xid_other");
  add("other");
  return out;
}

bool IsCatalogued(std::string_view name) {
  if (const size_t brace = name.find('{'); brace != std::string_view::npos) {
    // A rule's cause with a placeholder: its family.
    return name.substr(0, brace) == "xid_";
  }
  return Find(name) != nullptr || XidOf(name).has_value() || IsHealthCheckFailure(name) ||
         name.starts_with("worker_exit code ") || name.starts_with("signal ");
}

CauseClass ClassifyCause(std::string_view cause) {
  if (const CatalogueEntry* e = Find(cause)) return e->cause_class;
  if (std::optional<int> xid = XidOf(cause)) {
    return Contains(kHardwareXids, *xid) ? CauseClass::kHardware : CauseClass::kAmbiguous;
  }
  if (IsHealthCheckFailure(cause)) return CauseClass::kHardware;
  // The crash detector's names: the worker ended on its own ("worker_exit
  // code 1"), or a signal the agent did not send killed it ("signal 9
  // SIGKILL": the OOM killer, a segfault, someone's kill -9).
  if (cause.starts_with("worker_exit")) return CauseClass::kSoftware;
  return CauseClass::kAmbiguous;
}

StrikeClass StrikeClassOf(std::string_view cause) {
  if (const CatalogueEntry* e = Find(cause)) return e->strike;
  if (std::optional<int> xid = XidOf(cause)) {
    return Contains(kHardXids, *xid) ? StrikeClass::kHard : StrikeClass::kSoft;
  }
  return IsHealthCheckFailure(cause) ? StrikeClass::kHard : StrikeClass::kSoft;
}

bool IsCollectiveCause(std::string_view name) {
  const CatalogueEntry* e = Find(name);
  return e != nullptr && e->collective;
}

}  // namespace endure::core
