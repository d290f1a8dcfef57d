#include "core/sdc_check.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>

namespace endure::core {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr char kGood[] = "9f8e7d6c5b4a3f2e";
constexpr char kBad[] = "1a2b3c4d5e6f7a8b";
constexpr char kOther[] = "00000000ffffffff";

// Reports `fingerprints[r]` for each rank r in order; returns the verdict of
// the last report (earlier ones must return none).
std::optional<SdcVerdict> Check(SdcChecker& checker, int64_t step,
                                const std::vector<std::string>& fingerprints) {
  for (size_t r = 0; r + 1 < fingerprints.size(); ++r) {
    EXPECT_FALSE(
        checker.OnFingerprint(Rank{static_cast<int32_t>(r)}, StepNumber{step}, fingerprints[r]));
  }
  return checker.OnFingerprint(Rank{static_cast<int32_t>(fingerprints.size() - 1)},
                               StepNumber{step}, fingerprints.back());
}

TEST(SdcChecker, AgreementAdvancesLastAgreed) {
  SdcChecker checker;
  EXPECT_EQ(checker.last_agreed(), StepNumber{-1});
  checker.OnGenerationStart(4);
  std::optional<SdcVerdict> v = Check(checker, 10, {kGood, kGood, kGood, kGood});
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->step, StepNumber{10});
  EXPECT_TRUE(v->agreed);
  EXPECT_TRUE(v->decided);
  EXPECT_THAT(v->suspects, IsEmpty());
  EXPECT_EQ(v->majority_fingerprint, kGood);
  EXPECT_EQ(v->reason, "step 10: all 4 replicas agree (9f8e7d6c5b4a3f2e)");
  EXPECT_EQ(checker.last_agreed(), StepNumber{10});
  EXPECT_EQ(checker.pending_checks(), 0u);
}

TEST(SdcChecker, MinorityOfThreeIsTheSuspect) {
  SdcChecker checker;
  checker.OnGenerationStart(3);
  ASSERT_TRUE(Check(checker, 10, {kGood, kGood, kGood}));
  std::optional<SdcVerdict> v = Check(checker, 20, {kGood, kBad, kGood});
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->agreed);
  EXPECT_TRUE(v->decided);
  EXPECT_THAT(v->suspects, ElementsAre(Rank{1}));
  EXPECT_EQ(v->majority_fingerprint, kGood);
  EXPECT_EQ(v->reason,
            "step 20: rank 1's fingerprint 1a2b3c4d5e6f7a8b differs from the 2 others' "
            "9f8e7d6c5b4a3f2e");
  EXPECT_EQ(checker.last_agreed(), StepNumber{10});
}

TEST(SdcChecker, MinorityOfFourIsTheSuspect) {
  SdcChecker checker;
  checker.OnGenerationStart(4);
  std::optional<SdcVerdict> v = Check(checker, 40, {kGood, kGood, kGood, kBad});
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->agreed);
  EXPECT_TRUE(v->decided);
  EXPECT_THAT(v->suspects, ElementsAre(Rank{3}));
  EXPECT_EQ(v->reason,
            "step 40: rank 3's fingerprint 1a2b3c4d5e6f7a8b differs from the 3 others' "
            "9f8e7d6c5b4a3f2e");
  EXPECT_EQ(checker.last_agreed(), StepNumber{-1});
}

TEST(SdcChecker, SeveralMinorityReplicasAreAllSuspects) {
  SdcChecker checker;
  checker.OnGenerationStart(5);
  std::optional<SdcVerdict> v = Check(checker, 5, {kGood, kBad, kGood, kOther, kGood});
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->decided);
  EXPECT_THAT(v->suspects, ElementsAre(Rank{1}, Rank{3}));
  EXPECT_EQ(v->reason,
            "step 5: ranks 1, 3 differ from the 3 others' 9f8e7d6c5b4a3f2e (rank 1: "
            "1a2b3c4d5e6f7a8b; rank 3: 00000000ffffffff)");
}

TEST(SdcChecker, TwoReplicasThatDisagreeAreBothSuspects) {
  SdcChecker checker;
  checker.OnGenerationStart(2);
  std::optional<SdcVerdict> v = Check(checker, 10, {kGood, kBad});
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->agreed);
  EXPECT_FALSE(v->decided);
  EXPECT_THAT(v->suspects, ElementsAre(Rank{0}, Rank{1}));
  EXPECT_THAT(v->majority_fingerprint, IsEmpty());
  EXPECT_EQ(v->reason,
            "step 10: the 2 replicas disagree (rank 0: 9f8e7d6c5b4a3f2e; rank 1: "
            "1a2b3c4d5e6f7a8b); both are suspects until a recomputation on another node "
            "decides");
}

TEST(SdcChecker, NoStrictMajorityIsUndecided) {
  SdcChecker checker;
  checker.OnGenerationStart(4);
  std::optional<SdcVerdict> v = Check(checker, 10, {kGood, kBad, kBad, kGood});
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->agreed);
  EXPECT_FALSE(v->decided);
  EXPECT_THAT(v->suspects, ElementsAre(Rank{0}, Rank{1}, Rank{2}, Rank{3}));
  // Equal groups: the one holding the lowest rank first.
  EXPECT_EQ(v->reason,
            "step 10: no strict majority among 4 replicas (ranks 0, 3: 9f8e7d6c5b4a3f2e; "
            "ranks 1-2: 1a2b3c4d5e6f7a8b); all are suspects");

  // Three different values among three replicas.
  checker.OnGenerationStart(3);
  v = Check(checker, 20, {kGood, kBad, kOther});
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->decided);
  EXPECT_THAT(v->suspects, ElementsAre(Rank{0}, Rank{1}, Rank{2}));
  EXPECT_EQ(checker.last_agreed(), StepNumber{-1});
}

// 100,000 replicas: three corrupted ones are named among the others; and
// when every replica disagrees with every other (a program that is not
// deterministic), the check is undecided, its reason bounded (it grouped
// the fingerprints by a linear search per rank: 10^10 comparisons).
TEST(SdcChecker, AHundredThousandReplicasAreJudgedInOnePass) {
  constexpr int kWorld = 100'000;
  SdcChecker checker;
  checker.OnGenerationStart(kWorld);
  std::vector<std::string> fingerprints(kWorld, kGood);
  for (int r : {7, 50'000, 99'999}) fingerprints[r] = kBad;
  std::optional<SdcVerdict> v = Check(checker, 10, fingerprints);
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->decided);
  EXPECT_THAT(v->suspects, ElementsAre(Rank{7}, Rank{50'000}, Rank{99'999}));

  char hex[17];
  for (int r = 0; r < kWorld; ++r) {
    std::snprintf(hex, sizeof hex, "%016x", r);
    fingerprints[r] = hex;
  }
  v = Check(checker, 20, fingerprints);
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->decided);
  EXPECT_EQ(v->suspects.size(), size_t{kWorld});
  EXPECT_LT(v->reason.size(), 1000u) << v->reason.substr(0, 200);
}

TEST(SdcChecker, OneReplicaAgreesWithItself) {
  SdcChecker checker;
  checker.OnGenerationStart(1);
  std::optional<SdcVerdict> v = checker.OnFingerprint(Rank{0}, StepNumber{3}, kGood);
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->agreed);
  EXPECT_EQ(checker.last_agreed(), StepNumber{3});
}

TEST(SdcChecker, LastAgreedSurvivesGenerationsAndFollowsRollBacks) {
  SdcChecker checker;
  checker.OnGenerationStart(3);
  ASSERT_TRUE(Check(checker, 10, {kGood, kGood, kGood}));
  ASSERT_TRUE(Check(checker, 20, {kGood, kGood, kGood}));
  ASSERT_TRUE(Check(checker, 30, {kGood, kBad, kGood}));
  EXPECT_EQ(checker.last_agreed(), StepNumber{20});

  // Rank 0 already reported step 40 when the job stops.
  EXPECT_FALSE(checker.OnFingerprint(Rank{0}, StepNumber{40}, kGood));
  EXPECT_EQ(checker.pending_checks(), 1u);

  // The restart: a new generation (the suspect's node replaced) restores the
  // newest checkpoint at or before step 20, say step 15.
  checker.OnGenerationStart(3);
  EXPECT_EQ(checker.pending_checks(), 0u);
  EXPECT_EQ(checker.last_agreed(), StepNumber{20});
  checker.RollBackTo(StepNumber{15});
  // The agreement at step 20 belonged to the abandoned trajectory; the
  // restored step 15 precedes it and is trusted.
  EXPECT_EQ(checker.last_agreed(), StepNumber{15});

  // Step 20 is recomputed and checked again.
  std::optional<SdcVerdict> v = Check(checker, 20, {kOther, kOther, kOther});
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->agreed);
  EXPECT_EQ(checker.last_agreed(), StepNumber{20});

  // A rollback to a step after last_agreed (a crash restored a later
  // checkpoint) does not make the unchecked steps agreed.
  checker.RollBackTo(StepNumber{25});
  EXPECT_EQ(checker.last_agreed(), StepNumber{20});
}

TEST(SdcChecker, RollBackAbandonsLaterChecksAndAllowsTheirReportsAgain) {
  SdcChecker checker;
  checker.OnGenerationStart(3);
  ASSERT_TRUE(Check(checker, 10, {kGood, kGood, kGood}));
  EXPECT_FALSE(checker.OnFingerprint(Rank{0}, StepNumber{20}, kBad));
  EXPECT_FALSE(checker.OnFingerprint(Rank{1}, StepNumber{20}, kBad));
  EXPECT_FALSE(checker.OnFingerprint(Rank{0}, StepNumber{30}, kBad));
  EXPECT_EQ(checker.pending_checks(), 2u);

  checker.RollBackTo(StepNumber{10});
  EXPECT_EQ(checker.pending_checks(), 0u);
  EXPECT_EQ(checker.last_agreed(), StepNumber{10});
  // Within the same generation, ranks report step 20 again after the
  // rollback; the abandoned reports do not count.
  std::optional<SdcVerdict> v = Check(checker, 20, {kGood, kGood, kGood});
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->agreed);
  EXPECT_EQ(checker.last_agreed(), StepNumber{20});
}

TEST(SdcChecker, IgnoresOutOfRangeDuplicateAndMalformedReports) {
  SdcChecker checker;
  // Before any generation.
  EXPECT_FALSE(checker.OnFingerprint(Rank{0}, StepNumber{10}, kGood));
  EXPECT_EQ(checker.pending_checks(), 0u);

  checker.OnGenerationStart(3);
  EXPECT_FALSE(checker.OnFingerprint(Rank{-1}, StepNumber{10}, kBad));
  EXPECT_FALSE(checker.OnFingerprint(Rank{3}, StepNumber{10}, kBad));
  EXPECT_FALSE(checker.OnFingerprint(Rank{7}, StepNumber{10}, kBad));
  EXPECT_EQ(checker.pending_checks(), 0u);

  EXPECT_FALSE(checker.OnFingerprint(Rank{0}, StepNumber{10}, kGood));
  // A duplicate does not replace the first report nor stand in for rank 1's.
  EXPECT_FALSE(checker.OnFingerprint(Rank{0}, StepNumber{10}, kBad));
  // Malformed: not evidence against rank 1, which may still report.
  EXPECT_FALSE(checker.OnFingerprint(Rank{1}, StepNumber{10}, "9F8E7D6C5B4A3F2E"));
  EXPECT_FALSE(checker.OnFingerprint(Rank{1}, StepNumber{10}, "not a fingerprint"));
  EXPECT_FALSE(checker.OnFingerprint(Rank{1}, StepNumber{10}, kGood));
  std::optional<SdcVerdict> v = checker.OnFingerprint(Rank{2}, StepNumber{10}, kGood);
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->agreed);
  // A late report of a decided step starts no new check.
  EXPECT_FALSE(checker.OnFingerprint(Rank{2}, StepNumber{10}, kBad));
  EXPECT_EQ(checker.pending_checks(), 0u);
}

TEST(SdcChecker, BoundsPendingChecksWhenARankStopsReporting) {
  SdcChecker checker;
  checker.OnGenerationStart(4);
  for (int64_t step = 10; step <= 1000; step += 10) {
    for (int r = 0; r < 3; ++r) {
      EXPECT_FALSE(checker.OnFingerprint(Rank{r}, StepNumber{step}, kGood));
    }
    EXPECT_LE(checker.pending_checks(), SdcChecker::kMaxPendingChecks);
  }
  EXPECT_EQ(checker.pending_checks(), SdcChecker::kMaxPendingChecks);
  // The newest checks are the ones kept: rank 3 catching up completes them.
  std::optional<SdcVerdict> v = checker.OnFingerprint(Rank{3}, StepNumber{1000}, kGood);
  ASSERT_TRUE(v.has_value());
  EXPECT_TRUE(v->agreed);
  EXPECT_EQ(checker.last_agreed(), StepNumber{1000});
}

}  // namespace
}  // namespace endure::core
