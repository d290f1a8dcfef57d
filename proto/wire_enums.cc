#include "proto/wire_enums.h"

#include <array>
#include <utility>

namespace endure::wire {
namespace {

// Each table lists every enumerator of the code's enum once; the tests
// check both directions for every value.
constexpr std::array<std::pair<faults::FaultKind, proto::FaultKind>, 15> kFaultKinds = {{
    {faults::FaultKind::kKill, proto::FAULT_KILL},
    {faults::FaultKind::kExit, proto::FAULT_EXIT},
    {faults::FaultKind::kHang, proto::FAULT_HANG},
    {faults::FaultKind::kNan, proto::FAULT_NAN},
    {faults::FaultKind::kSlow, proto::FAULT_SLOW},
    {faults::FaultKind::kLog, proto::FAULT_LOG},
    {faults::FaultKind::kKillAgent, proto::FAULT_KILL_AGENT},
    {faults::FaultKind::kDiskFull, proto::FAULT_DISK_FULL},
    {faults::FaultKind::kDiskError, proto::FAULT_DISK_ERROR},
    {faults::FaultKind::kCorruptT0, proto::FAULT_CORRUPT_T0},
    {faults::FaultKind::kCorruptT1, proto::FAULT_CORRUPT_T1},
    {faults::FaultKind::kBitflip, proto::FAULT_BITFLIP},
    {faults::FaultKind::kCommFail, proto::FAULT_COMM_FAIL},
    {faults::FaultKind::kCommSlow, proto::FAULT_COMM_SLOW},
    {faults::FaultKind::kSpike, proto::FAULT_SPIKE},
}};

constexpr std::array<std::pair<core::LogAction, proto::LogAction>, 5> kLogActions = {{
    {core::LogAction::kRestart, proto::LOG_ACTION_RESTART},
    {core::LogAction::kEvictNode, proto::LOG_ACTION_EVICT_NODE},
    {core::LogAction::kStop, proto::LOG_ACTION_STOP},
    {core::LogAction::kInvestigate, proto::LOG_ACTION_INVESTIGATE},
    {core::LogAction::kStopIfRepeated, proto::LOG_ACTION_STOP_IF_REPEATED},
}};

constexpr std::array<std::pair<checkpoint::Tier, proto::Tier>, 3> kTiers = {{
    {checkpoint::Tier::kT0, proto::TIER_T0},
    {checkpoint::Tier::kT1, proto::TIER_T1},
    {checkpoint::Tier::kT2, proto::TIER_T2},
}};

template <class Table>
auto Find(const Table& table, typename Table::value_type::first_type value) {
  for (const auto& [code, wire] : table) {
    if (code == value) return wire;
  }
  return typename Table::value_type::second_type{};  // unreachable: every enumerator is listed
}

template <class Table>
auto Reverse(const Table& table, typename Table::value_type::second_type value)
    -> std::optional<typename Table::value_type::first_type> {
  for (const auto& [code, wire] : table) {
    if (wire == value) return code;
  }
  return std::nullopt;
}

}  // namespace

proto::FaultKind ToWire(faults::FaultKind kind) { return Find(kFaultKinds, kind); }
std::optional<faults::FaultKind> FromWire(proto::FaultKind kind) {
  return Reverse(kFaultKinds, kind);
}

proto::LogAction ToWire(core::LogAction action) { return Find(kLogActions, action); }
std::optional<core::LogAction> FromWire(proto::LogAction action) {
  return Reverse(kLogActions, action);
}

proto::Tier ToWire(checkpoint::Tier tier) { return Find(kTiers, tier); }
std::optional<checkpoint::Tier> FromWire(proto::Tier tier) { return Reverse(kTiers, tier); }

}  // namespace endure::wire
