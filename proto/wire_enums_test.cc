#include "proto/wire_enums.h"

#include <gtest/gtest.h>

#include <set>

namespace endure::wire {
namespace {

// Every enumerator of the code's enum maps to a distinct wire value and back,
// and every wire value but 0 maps to one of them: a kind, action or tier
// added on one side only fails here.
template <class Code, class Wire>
void ExpectABijection(int code_count, const google::protobuf::EnumDescriptor* wire) {
  std::set<int> seen;
  for (int i = 0; i < code_count; ++i) {
    const Code code = static_cast<Code>(i);
    const Wire w = ToWire(code);
    EXPECT_NE(static_cast<int>(w), 0) << "code value " << i << " has no wire value";
    EXPECT_TRUE(seen.insert(static_cast<int>(w)).second) << "wire value " << w << " twice";
    EXPECT_EQ(FromWire(w), code) << "code value " << i;
  }
  for (int i = 0; i < wire->value_count(); ++i) {
    const int number = wire->value(i)->number();
    if (number == 0) {
      EXPECT_EQ(FromWire(static_cast<Wire>(number)), std::nullopt);
    } else {
      EXPECT_TRUE(FromWire(static_cast<Wire>(number)).has_value()) << wire->value(i)->name();
    }
  }
  EXPECT_EQ(FromWire(static_cast<Wire>(9999)), std::nullopt);  // a newer sender's value
}

TEST(WireEnumsTest, FaultKindsMapBothWays) {
  ExpectABijection<faults::FaultKind, proto::FaultKind>(
      static_cast<int>(faults::FaultKind::kSpike) + 1, proto::FaultKind_descriptor());
}

TEST(WireEnumsTest, LogActionsMapBothWays) {
  ExpectABijection<core::LogAction, proto::LogAction>(
      static_cast<int>(core::LogAction::kStopIfRepeated) + 1, proto::LogAction_descriptor());
}

TEST(WireEnumsTest, TiersMapBothWays) {
  ExpectABijection<checkpoint::Tier, proto::Tier>(static_cast<int>(checkpoint::Tier::kT2) + 1,
                                                  proto::Tier_descriptor());
}

}  // namespace
}  // namespace endure::wire
