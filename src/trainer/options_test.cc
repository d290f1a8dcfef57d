#include "trainer/options.h"

#include <gtest/gtest.h>

namespace endure::trainer {
namespace {

TEST(TrainerOptions, DefaultsAreValidForOneAndTwoRanks) {
  TrainerOptions o;
  EXPECT_TRUE(o.Validate(1).ok());
  EXPECT_TRUE(o.Validate(2).ok());
  EXPECT_EQ(o.Slots(), 2);
}

TEST(TrainerOptions, AnyWorldUpToTheSlotsIsValid) {
  TrainerOptions o;
  o.global_batch = 48;
  o.micro_batch = 16;
  EXPECT_TRUE(o.Validate(2).ok());  // 3 slots over 2 ranks: 2 and 1
  EXPECT_TRUE(o.Validate(3).ok());
  Status st = o.Validate(4);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("3 micro-batches"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("fewer than the 4 ranks"), std::string::npos) << st.message();
}

TEST(TrainerOptions, BadCombinationsNameTheFlag) {
  TrainerOptions o;
  o.global_batch = 24;
  Status st = o.Validate(2);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("--global-batch 24"), std::string::npos) << st.message();

  TrainerOptions heads;
  heads.model.heads = 3;
  EXPECT_NE(heads.Validate(1).message().find("--d-model"), std::string::npos);

  TrainerOptions resume;
  resume.resume = true;
  EXPECT_NE(resume.Validate(1).message().find("--resume needs --ckpt-dir"), std::string::npos);
}

TEST(TrainerOptions, PeriodicEvaluationNeedsBothFlags) {
  TrainerOptions o;
  EXPECT_EQ(o.eval_every, 0);  // off by default
  o.eval_every = 10;
  o.eval_steps = 30;
  EXPECT_TRUE(o.Validate(1).ok());
  const std::pair<std::pair<int64_t, int>, const char*> bad[] = {
      {{-1, 1}, "--eval-every must not be negative"},
      {{10, -1}, "--eval-steps must not be negative"},
      {{10, 0}, "--eval-every needs --eval-steps"},
      {{0, 5}, "--eval-steps needs --eval-every"},
  };
  for (const auto& [values, expected] : bad) {
    TrainerOptions b;
    b.eval_every = values.first;
    b.eval_steps = values.second;
    Status st = b.Validate(1);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << expected;
    EXPECT_NE(st.message().find(expected), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace endure::trainer
