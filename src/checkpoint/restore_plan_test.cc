#include "checkpoint/restore_plan.h"

#include <gtest/gtest.h>

namespace endure::checkpoint {
namespace {

ShardCopy Copy(int64_t step, int shard, Tier tier, std::string node, std::string refused = "") {
  ShardCopy c;
  c.step = step;
  c.shard = shard;
  c.shards = 2;
  c.tier = tier;
  c.node = std::move(node);
  c.path = "/p/" + std::to_string(step) + "/" + std::to_string(shard);
  c.bytes = 100;
  c.xxh3 = 7;
  c.refused = std::move(refused);
  return c;
}

TEST(RestorePlanTest, NewestCompleteStepFromTheFastestTier) {
  std::vector<ShardCopy> copies = {
      Copy(42, 0, Tier::kT0, "node0"), Copy(42, 0, Tier::kT2, ""),
      Copy(42, 1, Tier::kT1, "node0"), Copy(42, 1, Tier::kT2, ""),
      Copy(43, 0, Tier::kT0, "node0"),  // shard 1 of step 43 was lost with its node
      Copy(40, 0, Tier::kT2, ""),      Copy(40, 1, Tier::kT2, ""),
  };
  RestorePlan plan = ChooseRestorePoint(copies, INT64_MAX);
  EXPECT_EQ(plan.step, 42);
  ASSERT_EQ(plan.sources.size(), 2u);
  EXPECT_EQ(plan.sources[0].copy.tier, Tier::kT0);
  EXPECT_EQ(plan.sources[1].copy.tier, Tier::kT1);
  EXPECT_EQ(plan.Summary(), "step 42 from T0 x1, T1 x1");
  ASSERT_EQ(plan.notes.size(), 1u);
  EXPECT_EQ(plan.notes[0], "step 43 incomplete: no verified copy of shard 1");
  // A rollback bound.
  EXPECT_EQ(ChooseRestorePoint(copies, 41).step, 40);
  EXPECT_EQ(ChooseRestorePoint(copies, 41).Summary(), "step 40 from T2 x2");
  // Nothing complete: a fresh start.
  EXPECT_EQ(ChooseRestorePoint(copies, 39).Summary(), "fresh start");
}

TEST(RestorePlanTest, RefusedCopiesFallBackToAnotherTierOrAnOlderStep) {
  std::vector<ShardCopy> copies = {
      Copy(42, 0, Tier::kT0, "node0", "checksum mismatch"),
      Copy(42, 0, Tier::kT1, "node1"),
      Copy(42, 1, Tier::kT0, "node1"),
  };
  RestorePlan plan = ChooseRestorePoint(copies, INT64_MAX);
  EXPECT_EQ(plan.step, 42);
  EXPECT_EQ(plan.sources[0].copy.tier, Tier::kT1);
  ASSERT_EQ(plan.notes.size(), 1u);
  EXPECT_EQ(plan.notes[0], "refused step 42 shard 0 in T0 on node0: checksum mismatch");

  copies[1].refused = "truncated";
  copies.push_back(Copy(41, 0, Tier::kT2, ""));
  copies.push_back(Copy(41, 1, Tier::kT2, ""));
  plan = ChooseRestorePoint(copies, INT64_MAX);
  EXPECT_EQ(plan.step, 41);
  EXPECT_EQ(plan.notes.back(), "step 42 incomplete: no verified copy of shard 0");
}

TEST(RestorePlanTest, LoadersAndJsonRoundTrip) {
  std::vector<ShardCopy> copies = {Copy(42, 0, Tier::kT0, "node0"), Copy(42, 1, Tier::kT2, "")};
  RestorePlan plan = ChooseRestorePoint(copies, INT64_MAX);
  ASSERT_TRUE(AssignLoaders(plan, {{"node0", {2, 3}}, {"node1", {0, 1}}}).ok());
  EXPECT_EQ(plan.sources[0].loader_rank, 2);
  EXPECT_EQ(plan.sources[1].loader_rank, 1);  // T2: the shard's own rank
  Result<RestorePlan> back = RestorePlanFromJson(RestorePlanToJson(plan).dump());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->step, 42);
  EXPECT_EQ(back->sources[0].copy.path, "/p/42/0");
  EXPECT_EQ(back->sources[1].copy.tier, Tier::kT2);
  EXPECT_EQ(back->sources[0].copy.xxh3, 7u);
  EXPECT_EQ(back->sources[1].loader_rank, 1);

  EXPECT_FALSE(AssignLoaders(plan, {{"node1", {0, 1}}}).ok());  // node0 left the job
  for (const char* bad : {"", "[]", "{\"step\":1}", "{\"step\":1,\"sources\":[{\"shard\":0}]}"}) {
    Result<RestorePlan> r = RestorePlanFromJson(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("restore plan"), std::string::npos);
  }
}

// An elastic job: a step saved by a world of one (after a shrink) restores
// into a world of two, and one saved by two into a world of one; each step
// counts with its own shards, the newest complete one wins.
TEST(RestorePlanTest, AStepRestoresIntoAWorldOfAnotherSize) {
  ShardCopy alone = Copy(50, 0, Tier::kT2, "");
  alone.shards = 1;
  std::vector<ShardCopy> copies = {Copy(42, 0, Tier::kT2, ""), Copy(42, 1, Tier::kT2, ""), alone};
  RestorePlan plan = ChooseRestorePoint(copies, INT64_MAX);
  EXPECT_EQ(plan.Summary(), "step 50 from T2 x1");
  ASSERT_TRUE(AssignLoaders(plan, {{"node0", {0}}, {"node1", {1}}}).ok());
  EXPECT_EQ(plan.sources[0].loader_rank, 0);

  plan = ChooseRestorePoint(copies, 49);
  EXPECT_EQ(plan.Summary(), "step 42 from T2 x2");
  ASSERT_TRUE(AssignLoaders(plan, {{"node1", {0}}}).ok());  // a world of one
  EXPECT_EQ(plan.sources[0].loader_rank, 0);
  EXPECT_EQ(plan.sources[1].loader_rank, 0);  // shard 1, and no rank 1 to load it
  // A shard count no job has is no step at all.
  ShardCopy absurd = Copy(60, 0, Tier::kT2, "");
  absurd.shards = 1 << 30;
  copies.push_back(absurd);
  EXPECT_EQ(ChooseRestorePoint(copies, INT64_MAX).step, 50);
}

// Found by fuzz/client_env_fuzz.cc: a float where an integer belongs (1e22
// read as bytes) was undefined behaviour; every field is now checked for type
// and range, and the error names it.
TEST(RestorePlanTest, MistypedOrOutOfRangeFieldsAreRefused) {
  std::vector<ShardCopy> copies = {Copy(42, 0, Tier::kT0, "node0"), Copy(42, 1, Tier::kT2, "")};
  RestorePlan plan = ChooseRestorePoint(copies, INT64_MAX);
  ASSERT_EQ(plan.sources.size(), 2u);
  ASSERT_TRUE(AssignLoaders(plan, {{"node0", {0, 1}}}).ok());
  const nlohmann::json good = RestorePlanToJson(plan);
  ASSERT_TRUE(RestorePlanFromJson(good.dump()).ok());
  const std::pair<const char*, nlohmann::json> cases[] = {
      {"bytes", 1e22}, {"bytes", -1},         {"bytes", "7"},
      {"shard", 1.5},  {"shard", 4294967296}, {"shards", 0},
      {"shard", 2},    {"loader_rank", -2},   {"loader_rank", 1e300},
      {"xxh3", " 7"},  {"xxh3", "-1"},        {"xxh3", "0x0000000000000007"},
      {"tier", 2},     {"node", nullptr},
  };
  for (const auto& [key, value] : cases) {
    nlohmann::json j = good;
    j["sources"][0][key] = value;
    Result<RestorePlan> r = RestorePlanFromJson(j.dump());
    ASSERT_FALSE(r.ok()) << key << " = " << value.dump();
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(key == std::string("shard") && value == 2 ? "below" : key),
              std::string::npos)
        << r.status().message();
  }
  nlohmann::json negative = good;
  negative["step"] = -5;
  EXPECT_FALSE(RestorePlanFromJson(negative.dump()).ok());
}

}  // namespace
}  // namespace endure::checkpoint
