#include "core/job_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace endure::core {
namespace {

using namespace std::chrono_literals;

// Every kind of event reads back as it was written, field for field (the
// journal replays what it wrote).
TEST(JobCodec, EveryEventKindRoundTrips) {
  const std::vector<JobEvent> events = {
      NodeUp{NodeId{3}, "host-a", 8},
      NodeDown{NodeId{1}, "stream dropped: \"reset\"\nby peer\t\x01"},
      NodeHeartbeat{NodeId{0}},
      WorkerReady{2, 7, 40, 0.1 + 0.2},
      StepEnd{1, 0, 12, 2.4810000000000001, 0.003, 10, true},
      StepEnd{1, 1, 13, std::numeric_limits<double>::quiet_NaN(), 0, -1, false},
      StepEnd{1, 1, 14, -std::numeric_limits<double>::infinity(), 0, -1, false},
      WorkerExitEvent{0, 1, NodeId{1}, std::nullopt, 9, "cuda", "restart", "xid",
                      "Xid 79 \xc3\xa9"},
      WorkerExitEvent{0, 1, NodeId{1}, 3, std::nullopt, "", "", "", ""},
      FaultFiredEvent{0, 1, "f1", "kill", 12, At(1234567890ns)},
      GenerationStoppedEvent{4, NodeId{2}},
      StackDumpEvent{1, 0, "#0 0x1 in main ()\n#1 ..."},
      PersistFailedEvent{0, 1, 5, NodeId{1}, "No space left on device"},
      CheckpointsFound{{10, 20, 30}},
      CheckpointsFound{{}},
      RestoreChosen{1, "step 10 from T0 x2"},
      ControllerResumed{},
      Tick{},
  };
  for (const JobEvent& e : events) {
    const std::string line = EncodeEvent(e);
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
    Result<JobEvent> back = DecodeEvent(line);
    ASSERT_TRUE(back.ok()) << line << ": " << back.status().message();
    EXPECT_EQ(back->index(), e.index()) << line;
    EXPECT_EQ(EncodeEvent(*back), line);
  }
}

TEST(JobCodec, DoublesReadBackBitForBit) {
  for (double loss : {2.4810000000000001, 1.0 / 3.0, 5e-324, 1.7976931348623157e308, -0.0}) {
    Result<JobEvent> back = DecodeEvent(EncodeEvent(StepEnd{0, 0, 1, loss, 0, -1, false}));
    ASSERT_TRUE(back.ok());
    const double got = std::get<StepEnd>(*back).loss;
    EXPECT_EQ(std::signbit(got), std::signbit(loss));
    EXPECT_EQ(got, loss);
  }
  Result<JobEvent> nan = DecodeEvent(
      EncodeEvent(StepEnd{0, 0, 1, std::numeric_limits<double>::quiet_NaN(), 0, -1, false}));
  ASSERT_TRUE(nan.ok());
  EXPECT_TRUE(std::isnan(std::get<StepEnd>(*nan).loss));
}

TEST(JobCodec, ALineReadsAsWritten) {
  EXPECT_EQ(EncodeEvent(WorkerExitEvent{0, 1, NodeId{1}, std::nullopt, 9, "", "", "", ""}),
            "worker_exit generation=0 rank=1 node=1 exit_code=- signal=9 log_cause=\"\" "
            "log_action=\"\" log_rule=\"\" log_line=\"\"");
  Result<JobEvent> e = DecodeEvent(
      "step_end  rank=1 generation=2 step=5 loss=2.5 ckpt_stall_s=0 "
      "checkpoint_step=-1 skipped=false");
  ASSERT_TRUE(e.ok()) << e.status().message();
  const StepEnd& s = std::get<StepEnd>(*e);
  EXPECT_EQ(s.generation, 2);
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.step, 5);
  EXPECT_EQ(s.loss, 2.5);
}

// A damaged line is refused with what is wrong, never half-read.
TEST(JobCodec, MalformedLinesSayWhatIsWrong) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "unknown event kind ''"},
      {"reboot node=1", "unknown event kind 'reboot'"},
      {"heartbeat", "heartbeat: missing field node"},
      {"heartbeat node=x", "heartbeat: node: expected an integer, got 'x'"},
      {"heartbeat node=1 node=2", "heartbeat: field node appears twice"},
      {"heartbeat node=1 colour=2", "heartbeat: unknown field colour"},
      {"heartbeat node=99999999999", "expected an integer"},
      {"heartbeat node", "heartbeat: expected key=value at 'node'"},
      {"node_down node=1 reason=unquoted", "node_down: reason: expected a quoted string"},
      {"node_down node=1 reason=\"open", "reason: a quoted string is not closed"},
      {"node_down node=1 reason=\"\\q\"", "unknown escape \\q"},
      {"node_down node=1 reason=\"\\x4\"", "two hex digits"},
      {"node_up node=\"1\" name=\"a\" slots=1", "node: expected a number or word"},
      {"step_end generation=0 rank=0 step=1 loss=fast ckpt_stall_s=0 checkpoint_step=-1 "
       "skipped=false",
       "loss: expected a number, got 'fast'"},
      {"step_end generation=0 rank=0 step=1 loss=1 ckpt_stall_s=0 checkpoint_step=-1 "
       "skipped=yes",
       "skipped: expected true or false, got 'yes'"},
      {"checkpoints_found steps=1,,2", "steps: expected an integer, got ''"},
  };
  for (const auto& [line, want] : cases) {
    Result<JobEvent> e = DecodeEvent(line);
    ASSERT_FALSE(e.ok()) << line;
    EXPECT_NE(e.status().message().find(want), std::string::npos)
        << line << " -> " << e.status().message();
  }
}

TEST(JobCodec, ActionsAndIncidentsAreOneLineEach) {
  ExternalFault fault{"f2", "kill-agent", 1, -1, 5s};
  EXPECT_EQ(EncodeAction(InjectFaultAction{fault, NodeId{1}, 0}),
            "inject_fault fault=\"f2\" kind=\"kill-agent\" rank=1 step=-1 at=5000000000 node=1 "
            "generation=0");
  EXPECT_EQ(EncodeAction(StartGenerationAction{1, {NodeId{0}, NodeId{2}}, -1, -1, {}, {"a", "b"}}),
            "start_generation generation=1 nodes=0,2 restore_step=-1 abandoned_from=-1 "
            "skip_steps=- fired_faults=\"a\",\"b\"");
  Incident inc;
  inc.id = 1;
  inc.cause = "worker_crash";
  inc.fault_at = At(1500ms);
  inc.detected_at = At(1600ms);
  inc.reason = "a\nb";
  const std::string line = EncodeIncident(inc, At(0s));
  EXPECT_NE(line.find("fault_s=1.5 detected_s=1.6 stopped_s=-"), std::string::npos) << line;
  EXPECT_NE(line.find("reason=\"a\\nb\""), std::string::npos) << line;
}

}  // namespace
}  // namespace endure::core
