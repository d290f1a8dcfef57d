#include "controller/event_queue.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

namespace endure::controller {
namespace {

using Clock = std::chrono::steady_clock;

// A flooding agent is refused past its bound; others, and control events,
// still get in, and the flood's place frees as the loop takes its events.
TEST(EventQueue, BoundsEachSourceAndNeverRefusesControlEvents) {
  EventQueue<std::string> q(3);
  auto flood = q.NewSource();
  auto quiet = q.NewSource();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(q.Post("flood" + std::to_string(i), flood));
  EXPECT_FALSE(q.Post("flood3", flood));
  EXPECT_TRUE(q.Post("quiet", quiet));
  q.PostControl("node down");
  q.PostControl("stop", /*urgent=*/true);
  EXPECT_EQ(q.size(), 6u);
  EXPECT_EQ(*q.PopUntil(Clock::now()), "stop");
  EXPECT_EQ(*q.PopUntil(Clock::now()), "flood0");
  EXPECT_TRUE(q.Post("flood4", flood));  // one of its events was taken
  EXPECT_FALSE(q.Post("flood5", flood));
  for (const char* next : {"flood1", "flood2", "quiet", "node down", "flood4"}) {
    EXPECT_EQ(*q.PopUntil(Clock::now()), next);
  }
  EXPECT_FALSE(q.PopUntil(Clock::now() + std::chrono::milliseconds(1)).has_value());
}

TEST(EventQueue, APostWakesTheWaitingLoop) {
  EventQueue<int> q(10);
  auto source = q.NewSource();
  std::thread producer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(q.Post(7, source));
  });
  EXPECT_EQ(q.PopUntil(Clock::now() + std::chrono::seconds(10)), 7);
  producer.join();
}

}  // namespace
}  // namespace endure::controller
