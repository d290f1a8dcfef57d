#include "trainer/exact_sum.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace endure::trainer {
namespace {

TEST(SlotsOfRank, EverySlotBelongsToOneRankInOrder) {
  for (int slots = 1; slots <= 12; ++slots) {
    for (int world = 1; world <= slots; ++world) {
      int next = 0;
      for (int r = 0; r < world; ++r) {
        const SlotRange s = SlotsOfRank(r, world, slots);
        EXPECT_EQ(s.first, next) << slots << " slots, " << world << " ranks, rank " << r;
        EXPECT_GE(s.count, slots / world);
        EXPECT_LE(s.count, slots / world + 1);
        next = s.first + s.count;
      }
      EXPECT_EQ(next, slots);
    }
  }
}

TEST(MaxAbs, AnyNonFiniteValueIsInfinity) {
  const std::vector<float> a = {1.0f, -3.5f, 2.0f};
  EXPECT_EQ(MaxAbs(a.data(), a.size(), 0), 3.5f);
  EXPECT_EQ(MaxAbs(a.data(), a.size(), 4.0f), 4.0f);
  const std::vector<float> nan = {1.0f, std::nanf(""), 2.0f};
  EXPECT_TRUE(std::isinf(MaxAbs(nan.data(), nan.size(), 0)));
  EXPECT_TRUE(std::isinf(MaxAbs(a.data(), a.size(), std::nanf(""))));
}

TEST(FixedPointExponent, LeavesRoomForEveryTerm) {
  EXPECT_EQ(FixedPointExponent(0, 4), 0);
  for (float m : {1e-30f, 0.5f, 1.0f, 3.0f, 1e30f, std::numeric_limits<float>::max()}) {
    for (int terms : {1, 2, 3, 8, 1000}) {
      const int s = FixedPointExponent(m, terms);
      // terms * m * 2^s stays below 2^62 and above 2^59 (no bits wasted).
      const double total = double(terms) * std::ldexp(double(m), s);
      EXPECT_LT(total, std::ldexp(1.0, 62)) << m << " x " << terms;
      EXPECT_GT(std::ldexp(double(m), s) * 2 * terms, std::ldexp(1.0, 59)) << m << " x " << terms;
    }
  }
}

// The property elastic training rests on: slots summed by any partition
// into ranks, each rank's part in any order, give the same bits, for
// values spanning many binades (where float addition would not).
TEST(ExactSum, AnyPartitionOfTheSlotsGivesTheSameBits) {
  constexpr int kSlots = 8;
  constexpr size_t kN = 4096;
  std::mt19937 rng(7);
  std::lognormal_distribution<float> magnitude(0, 6);
  std::vector<std::vector<float>> slot(kSlots, std::vector<float>(kN));
  float max_abs = 0;
  for (auto& s : slot) {
    for (float& x : s) x = (rng() & 1 ? 1 : -1) * magnitude(rng) * 1e-3f;
    max_abs = MaxAbs(s.data(), s.size(), max_abs);
  }
  const int e = FixedPointExponent(max_abs, kSlots);

  auto sum_by = [&](int world, bool reverse) {
    std::vector<int64_t> total(kN, 0);
    for (int r = 0; r < world; ++r) {
      const SlotRange mine = SlotsOfRank(r, world, kSlots);
      std::vector<int64_t> part(kN, 0);
      for (int k = 0; k < mine.count; ++k) {
        const int i = reverse ? mine.first + mine.count - 1 - k : mine.first + k;
        AccumulateFixed(slot[i].data(), kN, e, part.data());
      }
      for (size_t j = 0; j < kN; ++j) total[j] += part[j];
    }
    std::vector<float> out(kN);
    FromFixed(total.data(), kN, e, out.data());
    return out;
  };
  const std::vector<float> one = sum_by(1, false);
  for (int world : {2, 3, 4, 5, 8}) {
    for (bool reverse : {false, true}) {
      const std::vector<float> other = sum_by(world, reverse);
      EXPECT_EQ(std::memcmp(one.data(), other.data(), kN * sizeof(float)), 0)
          << world << " ranks" << (reverse ? ", reversed" : "");
    }
  }
  // And it is the sum: within float rounding of one in double precision.
  for (size_t j = 0; j < kN; ++j) {
    double exact = 0;
    for (const auto& s : slot) exact += s[j];
    EXPECT_NEAR(one[j], exact, std::fabs(exact) * 1e-6 + max_abs * 1e-15) << j;
  }
  // Float addition, for contrast, depends on the grouping for such values.
  int differ = 0;
  for (size_t j = 0; j < kN; ++j) {
    float seq = 0, a = 0, b = 0;
    for (int i = 0; i < kSlots; ++i) seq += slot[i][j];
    for (int i = 0; i < kSlots / 2; ++i) a += slot[i][j];
    for (int i = kSlots / 2; i < kSlots; ++i) b += slot[i][j];
    differ += seq != a + b;
  }
  EXPECT_GT(differ, 0);
}

}  // namespace
}  // namespace endure::trainer
