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
  l.CopyTaken(StepNumber{1}, At(seconds(105)));
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

// Copies of steps 10, 20 and 30 were taken 10 s apart; the job fails at
// 35 s and its restart restores step 10 (the copies of 20 and 30 were lost
// with a node, or did not verify): the 20 s of work after step 10's copy
// is recomputed as well as the 5 s after step 30's, and nothing is booked
// productive twice.
TEST(EttrLedger, ARestoreOlderThanTheNewestCopyChargesTheCopiesLostSince) {
  EttrLedger l(At(seconds(0)));
  l.Enter(C::kProductive, At(seconds(0)));
  l.RestoredTo(StepNumber{0}, At(seconds(0)));
  for (int64_t step : {10, 20, 30}) l.CopyTaken(StepNumber{step}, At(seconds(step)));
  l.Enter(C::kRecovery, At(seconds(35)));
  l.RollBack(At(seconds(35)));
  EXPECT_EQ(l.total(C::kRecompute), seconds(5));
  l.RestoredTo(StepNumber{10}, At(seconds(40)));
  EXPECT_EQ(l.total(C::kProductive), seconds(10));
  EXPECT_EQ(l.total(C::kRecompute), seconds(25));
  EXPECT_EQ(SumOfCategories(l), l.wall());
  // The new timeline's copies count from there: a restore of its own newest
  // copy charges nothing more; one before its start charges all since.
  l.Enter(C::kProductive, At(seconds(40)));
  l.CopyTaken(StepNumber{15}, At(seconds(45)));
  l.Enter(C::kRecovery, At(seconds(45)));
  l.RestoredTo(StepNumber{15}, At(seconds(46)));
  EXPECT_EQ(l.total(C::kRecompute), seconds(25));
  l.RestoredTo(StepNumber{5}, At(seconds(47)));
  EXPECT_EQ(l.total(C::kProductive), seconds(0));
  EXPECT_EQ(l.total(C::kRecompute), seconds(40));
  EXPECT_EQ(SumOfCategories(l), l.wall());
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
  l.CopyTaken(StepNumber{1}, At(seconds(10)));
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
