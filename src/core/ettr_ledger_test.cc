#include "core/ettr_ledger.h"

#include <gtest/gtest.h>

namespace endure::core {
namespace {

using std::chrono::seconds;
using C = LedgerCategory;

Duration SumOfCategories(const EttrLedger& l) {
  Duration sum{0};
  for (int i = 0; i < kNumLedgerCategories; ++i) sum += l.total(static_cast<C>(i));
  return sum;
}

TEST(EttrLedger, EverySecondInExactlyOneCategory) {
  EttrLedger l(At(seconds(0)));
  l.Enter(C::kProductive, At(seconds(10)));  // 10 s startup
  l.Enter(C::kCheckpointStall, At(seconds(100)));
  l.Enter(C::kProductive, At(seconds(105)));
  l.CopyTaken(At(seconds(105)));
  l.Enter(C::kDetection, At(seconds(145)));  // 40 s of work lost
  l.RollBack(At(seconds(145)));
  l.Enter(C::kRecovery, At(seconds(175)));
  l.Enter(C::kOther, At(seconds(235)));
  l.Enter(C::kProductive, At(seconds(240)));
  l.Advance(At(seconds(300)));

  EXPECT_EQ(l.total(C::kStartup), seconds(10));
  EXPECT_EQ(l.total(C::kProductive), seconds(90 + 60));
  EXPECT_EQ(l.uncommitted(), seconds(60));
  EXPECT_EQ(l.total(C::kCheckpointStall), seconds(5));
  EXPECT_EQ(l.total(C::kRecompute), seconds(40));
  EXPECT_EQ(l.total(C::kDetection), seconds(30));
  EXPECT_EQ(l.total(C::kRecovery), seconds(60));
  EXPECT_EQ(l.total(C::kOther), seconds(5));
  EXPECT_EQ(l.wall(), seconds(300));
  EXPECT_EQ(SumOfCategories(l), l.wall());
  EXPECT_DOUBLE_EQ(l.Ettr(), 150.0 / 300.0);
}

TEST(EttrLedger, SlowdownChargesTheLostShareElsewhere) {
  EttrLedger l(At(seconds(0)));
  l.Enter(C::kProductive, At(seconds(0)));
  l.SetSlowdown(1.5, C::kDetection, At(seconds(0)));
  l.Advance(At(seconds(30)));
  EXPECT_EQ(l.total(C::kProductive), seconds(20));
  EXPECT_EQ(l.total(C::kDetection), seconds(10));
  l.SetSlowdown(1.0, C::kOther, At(seconds(30)));
  l.Advance(At(seconds(40)));
  EXPECT_EQ(l.total(C::kProductive), seconds(30));
  // An odd split still adds up exactly.
  l.SetSlowdown(3.0, C::kOther, At(seconds(40)));
  l.Advance(At(seconds(40)) + Duration(1000000001));
  EXPECT_EQ(SumOfCategories(l), l.wall());
}

TEST(EttrLedger, ReclassifyMovesRecentUncommittedTime) {
  EttrLedger l(At(seconds(0)));
  l.Enter(C::kProductive, At(seconds(0)));
  l.CopyTaken(At(seconds(10)));
  // A fault hit at 14 s and was detected at 15 s.
  l.Reclassify(seconds(1), C::kDetection, At(seconds(15)));
  EXPECT_EQ(l.total(C::kDetection), seconds(1));
  EXPECT_EQ(l.uncommitted(), seconds(4));
  // Never more than the uncommitted time.
  l.Reclassify(seconds(100), C::kCheckpointStall, At(seconds(15)));
  EXPECT_EQ(l.total(C::kCheckpointStall), seconds(4));
  EXPECT_EQ(l.total(C::kProductive), seconds(10));
  EXPECT_EQ(SumOfCategories(l), l.wall());
}

TEST(EttrLedger, CategoryNames) {
  EXPECT_EQ(LedgerCategoryName(C::kCheckpointStall), "checkpoint_stall");
  EXPECT_EQ(LedgerCategoryName(C::kOther), "other");
}

}  // namespace
}  // namespace endure::core
