#include "trainer/schedule.h"

#include <gtest/gtest.h>

namespace endure::trainer {
namespace {

TEST(LearningRate, WarmsUpThenDecaysToTheFloor) {
  TrainerOptions o;
  o.lr = 1.0;
  o.min_lr_ratio = 0.1;
  o.warmup_steps = 10;
  o.steps = 110;
  EXPECT_DOUBLE_EQ(LearningRate(o, 0), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(o, 9), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(o, 10), 1.0);
  EXPECT_NEAR(LearningRate(o, 60), 0.55, 1e-12);
  EXPECT_NEAR(LearningRate(o, 110), 0.1, 1e-12);
  for (int64_t s = 11; s < 110; ++s) EXPECT_LT(LearningRate(o, s), LearningRate(o, s - 1));
}

}  // namespace
}  // namespace endure::trainer
