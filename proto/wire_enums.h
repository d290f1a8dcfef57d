// The one map between the code's enums and the wire's (proto/endure.proto):
// fault kinds, log actions and checkpoint tiers travel as proto enums, never
// as names. A wire value the code does not know (0, or one from a newer
// sender) maps to nullopt: the receiver treats it as absent.
#pragma once

#include <optional>

#include "checkpoint/restore_plan.h"
#include "core/log_classifier.h"
#include "faults/fault.h"
#include "proto/endure.pb.h"

namespace endure::wire {

proto::FaultKind ToWire(faults::FaultKind kind);
std::optional<faults::FaultKind> FromWire(proto::FaultKind kind);

proto::LogAction ToWire(core::LogAction action);
std::optional<core::LogAction> FromWire(proto::LogAction action);

proto::Tier ToWire(checkpoint::Tier tier);
std::optional<checkpoint::Tier> FromWire(proto::Tier tier);

}  // namespace endure::wire
