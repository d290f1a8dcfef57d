// NodeMachine's rules outside the scenario files: the restore route of a
// starting rank, the durable cadence, and the link's order under failing
// writes, checked over many interleavings.
#include "core/node_machine.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

#include "core/snapshot_queue.h"

namespace endure::core {
namespace {

TEST(RestoreRouteOf, FollowsTheRestartAndWhatTheWorkerKept) {
  // An in-process restart: a live worker keeps its state, a fresh one takes
  // a healthy replica's, whatever the plan says.
  EXPECT_EQ(RestoreRouteOf(true, true, true), RestoreRoute::kKeepsItsState);
  EXPECT_EQ(RestoreRouteOf(true, true, false), RestoreRoute::kKeepsItsState);
  EXPECT_EQ(RestoreRouteOf(true, false, true), RestoreRoute::kFromPeers);
  EXPECT_EQ(RestoreRouteOf(true, false, false), RestoreRoute::kFromPeers);
  // A full restart: the plan when there is one.
  EXPECT_EQ(RestoreRouteOf(false, false, true), RestoreRoute::kFromPlan);
  EXPECT_EQ(RestoreRouteOf(false, false, false), RestoreRoute::kFromScratch);
  EXPECT_EQ(RestoreRouteName(RestoreRoute::kFromPeers), "from_peers");
}

TEST(DurableStepDue, EveryNthStepOrEverySnapshot) {
  EXPECT_TRUE(DurableStepDue(7, 0));
  EXPECT_TRUE(DurableStepDue(7, -3));
  EXPECT_TRUE(DurableStepDue(20, 10));
  EXPECT_FALSE(DurableStepDue(25, 10));
  EXPECT_TRUE(DurableStepDue(0, 10));
}

TEST(OutageBuffer, KeepsTheNewestInOrderAndDropsProgressBeforeReports) {
  auto step = [](int64_t s) {
    proto::AgentEvent e;
    e.mutable_step()->set_step(s);
    return e;
  };
  auto exit = [](int rank) {
    proto::AgentEvent e;
    e.mutable_worker_exited()->set_rank(rank);
    return e;
  };
  OutageBuffer buffer(4);
  proto::AgentEvent beat;
  beat.mutable_heartbeat();
  buffer.Push(beat);  // never kept
  buffer.Push(step(1));
  buffer.Push(exit(0));
  buffer.Push(step(2));
  buffer.Push(step(3));
  buffer.Push(step(4));  // full: step 1 goes
  proto::AgentEvent persisted;
  persisted.mutable_persisted()->set_step(3);
  buffer.Push(persisted);  // step 2 goes
  EXPECT_EQ(buffer.dropped(), 2);
  std::vector<std::string> kept;
  for (OutageBuffer copy = buffer; !copy.empty(); copy.PopFront()) {
    const proto::AgentEvent& e = copy.front();
    kept.push_back(e.has_step()            ? "step " + std::to_string(e.step().step())
                   : e.has_worker_exited() ? "exit"
                                           : "persisted");
  }
  EXPECT_EQ(kept, (std::vector<std::string>{"exit", "step 3", "step 4", "persisted"}));
  // With no progress left to drop, the oldest report goes.
  OutageBuffer reports(2);
  reports.Push(exit(0));
  reports.Push(exit(1));
  reports.Push(exit(2));
  EXPECT_EQ(reports.size(), 2u);
  EXPECT_EQ(reports.front().worker_exited().rank(), 1);
  EXPECT_EQ(reports.dropped(), 1);
}

struct Notice {
  int rank = 0;
  int64_t step = 0;
  bool durable = false;
  bool operator==(const Notice&) const = default;
};

TEST(QueueSnapshot, KeepsTheNewestOfEachRankAndNeverSupersedesADueStep) {
  std::deque<Notice> q;
  QueueSnapshot(q, Notice{0, 9, false});
  QueueSnapshot(q, Notice{1, 9, false});
  QueueSnapshot(q, Notice{0, 10, true});   // due: supersedes step 9
  QueueSnapshot(q, Notice{0, 11, false});  // waits behind the due step 10
  QueueSnapshot(q, Notice{0, 12, false});  // supersedes 11, not 10
  QueueSnapshot(q, Notice{1, 10, true});
  EXPECT_EQ(q, (std::deque<Notice>{{0, 10, true}, {0, 12, false}, {1, 10, true}}));
  QueueSnapshot(q, Notice{0, 11, false});  // late: dropped
  QueueSnapshot(q, Notice{0, 20, true});   // a newer due step supersedes both
  EXPECT_EQ(q, (std::deque<Notice>{{1, 10, true}, {0, 20, true}}));
}

// However far the store lags, a due step leaves the queue only by being taken
// up or by a newer due step of its rank: never for a newer step that is not
// due (with one notice per rank, as before, most due steps were lost so).
TEST(QueueSnapshot, ALaggingStoreLosesNoDueStepToANewerStepThatIsNotDue) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    std::deque<Notice> q;
    std::set<int64_t> waiting;  // due steps announced, neither taken nor superseded by a due one
    const int64_t every = 1 + static_cast<int64_t>(rng() % 7);
    const uint64_t lag = 1 + rng() % 6;  // the store takes a notice up one time in `lag`
    for (int64_t step = 1; step <= 300; ++step) {
      const bool due = step % every == 0;
      if (due) waiting.clear();  // a newer due step supersedes the ones waiting
      QueueSnapshot(q, Notice{0, step, due});
      if (due) waiting.insert(step);
      ASSERT_LE(q.size(), 2u);
      if (rng() % lag == 0 && !q.empty()) {
        if (q.front().durable) waiting.erase(q.front().step);
        q.pop_front();
      }
    }
    for (; !q.empty(); q.pop_front()) {
      if (q.front().durable) waiting.erase(q.front().step);
    }
    EXPECT_TRUE(waiting.empty()) << "due step " << *waiting.begin() << " was lost";
  }
}

proto::AgentEvent Hello(bool resuming) {
  proto::AgentEvent hello;
  hello.mutable_register_()->set_node_id("node0");
  hello.mutable_register_()->set_resuming(resuming);
  return hello;
}

// Whatever the pattern of broken writes and reconnections, the controller
// hears every step report a rank made exactly once, in order (the outage
// buffer is large enough to drop none), and each stream starts with a
// registration.
// The log rules of the tests below: one, for a CUDA out-of-memory.
Result<LogClassifier> OneRuleClassifier() {
  return LogClassifier::FromToml(R"(
[[rule]]
name = "oom"
pattern = 'CUDA out of memory'
cause = "cuda_oom"
action = "restart"
)",
                                 "one rule");
}

// A progress pattern that matches nothing the workers print: after
// kUnmatchedLinesToWarn lines over kUnmatchedForToWarn, once a generation, a
// log line and a ProgressUnmatched go up; never before, and never once the
// pattern matched.
TEST(NodeMachineOutput, APatternThatMatchesNothingIsReportedOnceAGeneration) {
  Result<LogClassifier> classifier = OneRuleClassifier();
  ASSERT_TRUE(classifier.ok()) << classifier.status().message();
  NodeMachineOptions options;
  options.token = "job";
  NodeMachine m(options, std::move(classifier).value(), {});
  NodeTime time{Clock::TimePoint{}, 1e9};
  int warned = 0;
  std::string logged;
  const auto feed = [&](const NodeInput& in) {
    for (NodeAction& a : m.Step(in, time)) {
      if (auto* t = std::get_if<Transmit>(&a); t && t->event.has_progress_unmatched()) {
        ++warned;
        EXPECT_EQ(t->event.progress_unmatched().lines(), kUnmatchedLinesToWarn);
        EXPECT_EQ(t->event.progress_unmatched().last_line(), "Epoch 0:  99%|#### | 99/100");
      }
      if (auto* l = std::get_if<LogLine>(&a)) logged += l->text + "\n";
    }
  };
  feed(StreamOpened{Hello(false), false});
  const auto start = [&](int64_t generation) {
    GenerationStarted g;
    g.generation = generation;
    g.credential = "c";
    g.ranks = {0};
    g.world_size = 1;
    g.progress_pattern = R"(step (?P<step>\d+))";
    feed(g);
  };
  const auto lines = [&](int64_t generation, int n, std::chrono::milliseconds apart) {
    for (int i = 0; i < n; ++i) {
      time.now += apart;
      time.wall_s += std::chrono::duration<double>(apart).count();
      feed(OutputLine{generation, 0, i + 1 == n ? "Epoch 0:  99%|#### | 99/100" : "banner"});
    }
  };
  start(1);
  lines(1, kUnmatchedLinesToWarn - 1, std::chrono::seconds(1));  // long enough, too few lines
  EXPECT_EQ(warned, 0);
  lines(1, 1, std::chrono::milliseconds(10));
  EXPECT_EQ(warned, 1);
  EXPECT_NE(logged.find("progress_pattern has matched none of the 100 lines"), std::string::npos)
      << logged;
  lines(1, 500, std::chrono::milliseconds(10));
  EXPECT_EQ(warned, 1) << "once a generation";

  start(2);  // many lines, but within kUnmatchedForToWarn
  lines(2, 500, std::chrono::milliseconds(10));
  EXPECT_EQ(warned, 1);
  start(3);  // the pattern matched: the lines after are no warning
  feed(OutputLine{3, 0, "step 1"});
  lines(3, 500, std::chrono::milliseconds(100));
  EXPECT_EQ(warned, 1);
}

TEST(NodeMachineLink, EveryStepReportArrivesOnceAndInOrderThroughOutages) {
  for (uint64_t seed = 1; seed <= 50; ++seed) {
    Result<LogClassifier> classifier = OneRuleClassifier();
    ASSERT_TRUE(classifier.ok()) << classifier.status().message();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    NodeMachineOptions options;
    options.token = "job";
    NodeMachine m(options, std::move(classifier).value(), {});
    NodeTime time{Clock::TimePoint{}, 1e9};
    bool broken = false;
    std::vector<int64_t> heard;  // the steps the controller received
    bool registered = false;
    const auto feed = [&](const NodeInput& in) {
      std::vector<proto::AgentEvent> unsent;
      for (NodeAction& a : m.Step(in, time)) {
        auto* t = std::get_if<Transmit>(&a);
        if (t == nullptr) continue;
        if (broken || !unsent.empty()) {
          unsent.push_back(t->event);
          continue;
        }
        if (t->event.has_register_()) registered = true;
        if (t->event.has_node_steps()) {  // the node's one rank: one step each
          ASSERT_TRUE(registered);
          ASSERT_EQ(t->event.node_steps().ranks_size(), 1);
          heard.push_back(t->event.node_steps().ranks(0).step());
        }
      }
      if (!unsent.empty()) m.Step(TransmitFailed{unsent}, time);
    };
    feed(StreamOpened{Hello(false), false});
    GenerationStarted g;
    g.generation = 1;
    g.credential = "c1";
    g.ranks = {0};
    feed(g);
    bool open = true;
    int64_t step = 0;
    for (int i = 0; i < 200; ++i) {
      time.now += std::chrono::milliseconds(100);
      time.wall_s += 0.1;
      const int r = static_cast<int>(rng() % 10);
      if (r == 0 && open) {
        broken = true;  // the stream breaks; the shell notices at its next read
      } else if (r == 1 && (broken || !open)) {
        feed(StreamLost{});
        broken = false;
        open = false;
        registered = false;
      } else if (r == 2 && !open) {
        open = true;
        feed(StreamOpened{Hello(true), true});
      } else {
        contract::Datagram d;
        d.token = "c1";
        d.generation = 1;
        d.rank = 0;
        d.message = contract::StepMessage{false, ++step, 2.0};
        const std::string bytes = contract::EncodeDatagram(d);
        feed(DatagramArrived{bytes, 0});
      }
    }
    // A last reconnection carries whatever is still kept.
    feed(StreamLost{});
    broken = false;
    feed(StreamOpened{Hello(true), true});
    std::vector<int64_t> want(static_cast<size_t>(step));
    for (int64_t s = 1; s <= step; ++s) want[static_cast<size_t>(s - 1)] = s;
    EXPECT_EQ(heard, want);
  }
}

}  // namespace
}  // namespace endure::core
