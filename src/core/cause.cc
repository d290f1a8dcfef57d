// Incident causes; see cause.h.
#include "core/cause.h"

#include "common/status.h"

namespace endure::core {
namespace {

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

bool IsCollectiveCause(std::string_view name) {
  return name == "gloo_error" || name == "gloo_timeout" || name == "nccl_error" ||
         name == "nccl_timeout" || name == "comm_error";
}

}  // namespace endure::core
