// `endure controller` against agents written by hand with the gRPC API: a
// stream that never says hello is cancelled, a node name that would be a
// path is refused, streams beyond the job's bound are refused, and streams
// that end are forgotten, so that their places can be taken again.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "common/subprocess.h"
#include "proto/endure.grpc.pb.h"
#include "tests/support/test_support.h"

namespace endure {
namespace {

using namespace std::chrono_literals;
using testing_support::ReadAll;
using testing_support::ScratchDir;
using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "limits-token";

class ControllerLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.Path("job.toml"))
        << "[job]\nname = \"limits\"\ncommand = [\"/bin/true\"]\nnodes = 2\nstate_dir = \""
        << dir_.Path("state") << "\"\n";
    std::ofstream(dir_.Path("token")) << kToken << "\n";
    Result<Subprocess> p = Subprocess::Start(
        {.argv = {ENDURE_BIN, "controller", "--spec", dir_.Path("job.toml"), "--token-file",
                  dir_.Path("token"), "--address-file", dir_.Path("addr")},
         .output_path = dir_.Path("controller.out")});
    ASSERT_TRUE(p.ok());
    controller_.emplace(std::move(*p));
    for (int i = 0; i < 500 && ReadAll(dir_.Path("addr")).empty(); ++i) {
      std::this_thread::sleep_for(20ms);
    }
    const std::string addr = ReadAll(dir_.Path("addr"));
    ASSERT_FALSE(addr.empty()) << ReadAll(dir_.Path("controller.out"));
    channel_ = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
    stub_ = proto::Controller::NewStub(channel_);
  }
  void TearDown() override {
    if (controller_) {
      controller_->Signal(SIGKILL);
      controller_->Wait();
    }
  }

  // One hand-made agent's stream.
  struct Agent {
    std::unique_ptr<grpc::ClientContext> context = std::make_unique<grpc::ClientContext>();
    std::unique_ptr<grpc::ClientReaderWriter<proto::AgentEvent, proto::AgentCommand>> stream;
  };

  // Opens a stream and registers `node` on it (nothing is read back).
  Agent Register(const std::string& node, std::chrono::milliseconds deadline = 30000ms) {
    Agent a;
    a.context->set_deadline(std::chrono::system_clock::now() + deadline);
    a.stream = stub_->Attach(a.context.get());
    proto::AgentEvent hello;
    hello.set_token(kToken);
    hello.mutable_register_()->set_node_id(node);
    hello.mutable_register_()->set_slots(1);
    hello.mutable_register_()->set_host("127.0.0.1");
    a.stream->Write(hello);
    return a;
  }

  // Reads until the controller ends the stream; its status.
  static grpc::Status Drain(Agent& a) {
    proto::AgentCommand cmd;
    while (a.stream->Read(&cmd)) {
    }
    return a.stream->Finish();
  }

  ScratchDir dir_{"endure_controller_limits"};
  std::optional<Subprocess> controller_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Controller::Stub> stub_;
};

TEST_F(ControllerLimitsTest, AStreamThatNeverSaysHelloIsCancelled) {
  Agent silent;
  silent.context->set_deadline(std::chrono::system_clock::now() + 60s);
  silent.stream = stub_->Attach(silent.context.get());
  const auto start = Clock::now();
  const grpc::Status st = Drain(silent);
  const double waited = std::chrono::duration<double>(Clock::now() - start).count();
  // The controller's hello timeout is 10 s (checked at least once a second);
  // before, the stream and its server thread were held until the client left.
  EXPECT_NE(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  EXPECT_LT(waited, 10.0 + 3.0);
  EXPECT_GE(waited, 10.0 - 1.0);
}

TEST_F(ControllerLimitsTest, ANodeNameThatWouldBeAPathIsRefused) {
  for (const char* name : {"../../etc", "", "node/0", ".."}) {
    Agent a = Register(name);
    const grpc::Status st = Drain(a);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name;
    EXPECT_NE(st.error_message().find("node_id"), std::string::npos) << st.error_message();
  }
  EXPECT_NE(ReadAll(dir_.Path("controller.out")).find("refused an agent"), std::string::npos);
}

TEST_F(ControllerLimitsTest, StreamsBeyondTheBoundAreRefusedAndEndedOnesForgotten) {
  // A job of 2 nodes takes 2 x 2 + 64 = 68 streams.
  std::vector<Agent> agents;
  for (int i = 0; i < 68; ++i) agents.push_back(Register("node" + std::to_string(i)));
  // Registered (a refused one would end at once): give the controller time
  // to take every hello before the 69th.
  std::this_thread::sleep_for(1s);
  Agent extra = Register("node68");
  const grpc::Status refused = Drain(extra);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  for (Agent& a : agents) a.context->TryCancel();
  for (Agent& a : agents) EXPECT_EQ(a.stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  agents.clear();
  std::this_thread::sleep_for(1s);
  // Their places are free again: 68 new agents are taken (each waits for
  // commands until its 2 s deadline, instead of being refused).
  for (int i = 0; i < 68; ++i) agents.push_back(Register("again" + std::to_string(i), 2000ms));
  int refused_again = 0;
  for (Agent& a : agents) {
    refused_again += Drain(a).error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  }
  EXPECT_EQ(refused_again, 0);
}

}  // namespace
}  // namespace endure
