#include "core/spare_pool.h"

#include <gtest/gtest.h>

namespace endure::core {
namespace {

TEST(SparePool, SwapsInSparesThenWaitsForRepairs) {
  SparePool pool(4, 2);
  EXPECT_EQ(pool.size(), 6);
  EXPECT_EQ(pool.spares_available(), 2);
  EXPECT_EQ(pool.state(NodeId{3}), NodeState::kActive);
  EXPECT_EQ(pool.state(NodeId{4}), NodeState::kSpare);

  pool.Evict(NodeId{1});
  EXPECT_EQ(pool.Acquire(), NodeId{4});
  pool.Evict(NodeId{2});
  EXPECT_EQ(pool.Acquire(), NodeId{5});
  pool.Evict(NodeId{0});
  EXPECT_EQ(pool.Acquire(), std::nullopt);
  EXPECT_EQ(pool.repairing(), 3);

  pool.MarkRepaired(NodeId{2});
  EXPECT_EQ(pool.state(NodeId{2}), NodeState::kSpare);
  EXPECT_EQ(pool.Acquire(), NodeId{2});
  EXPECT_EQ(pool.state(NodeId{2}), NodeState::kActive);
  EXPECT_EQ(pool.repairing(), 2);
}

TEST(SparePool, EvictingASpareRemovesItFromThePool) {
  SparePool pool(1, 2);
  pool.Evict(NodeId{1});
  EXPECT_EQ(pool.spares_available(), 1);
  EXPECT_EQ(pool.Acquire(), NodeId{2});
}

}  // namespace
}  // namespace endure::core
