// NodeLoop: tasks run one at a time in the order they came, on one thread;
// posting waits for room beyond the bound; after Stop a call runs on the
// caller and a post is dropped.
#include "agent/node_loop.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace endure::agent {
namespace {

TEST(NodeLoop, RunsTasksInOrderOnItsOwnThread) {
  NodeLoop loop;
  std::vector<int> order;  // the loop's alone
  std::thread::id ran_on;
  for (int i = 0; i < 100; ++i) loop.Post([&order, i] { order.push_back(i); });
  const size_t seen = loop.Call([&] {
    ran_on = std::this_thread::get_id();
    return order.size();
  });
  EXPECT_EQ(seen, 100u);  // a call runs after what was posted before it
  EXPECT_NE(ran_on, std::this_thread::get_id());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
}

TEST(NodeLoop, APostWaitsForRoomWhileTheLoopIsBusy) {
  NodeLoop loop(/*max_posted=*/4);
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  loop.Post([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  // The busy task is taken up; four more fill the queue.
  std::atomic<int> posted{0};
  std::thread poster([&] {
    for (int i = 0; i < 10; ++i) {
      loop.Post([&] { ++ran; });
      ++posted;
    }
  });
  // However long the loop stays busy, the poster gets no further than the
  // bound (plus the one task taken up).
  for (int i = 0; i < 200 && posted < 4; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_LE(posted.load(), 5);
  release = true;
  poster.join();
  EXPECT_EQ(loop.Call([&] { return ran.load(); }), 10);
}

TEST(NodeLoop, AfterStopACallRunsOnTheCallerAndAPostIsDropped) {
  NodeLoop loop;
  int value = 0;
  loop.Post([&] { value = 1; });
  loop.Stop();  // runs what was queued
  EXPECT_EQ(value, 1);
  loop.Post([&] { value = 2; });
  EXPECT_EQ(value, 1);
  EXPECT_EQ(loop.Call([&] { return std::this_thread::get_id(); }), std::this_thread::get_id());
}

}  // namespace
}  // namespace endure::agent
