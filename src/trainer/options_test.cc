#include "trainer/options.h"

#include <gtest/gtest.h>

namespace endure::trainer {
namespace {

TEST(TrainerOptions, DefaultsAreValidForOneAndTwoRanks) {
  TrainerOptions o;
  EXPECT_TRUE(o.Validate(1).ok());
  EXPECT_TRUE(o.Validate(2).ok());
  EXPECT_EQ(o.AccumulationSteps(1), 2);
  EXPECT_EQ(o.AccumulationSteps(2), 1);
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

}  // namespace
}  // namespace endure::trainer
