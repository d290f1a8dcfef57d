// `endure controller --tls-dir` against agents written by hand with the gRPC
// API: mutual TLS with the job's CA from `endure certs`. An agent without a
// certificate, or with one from another CA, never reaches the service; a
// node's certificate registers that node and no other; an address beyond
// loopback without TLS is a configuration error, for the controller and for
// the agent.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <thread>

#include "common/subprocess.h"
#include "proto/endure.grpc.pb.h"
#include "tests/support/test_support.h"

namespace endure {
namespace {

using namespace std::chrono_literals;
using testing_support::ReadAll;
using testing_support::ScratchDir;

constexpr char kToken[] = "tls-token";

// Runs `endure ARGS...` to its end; its exit code and output.
std::pair<int, std::string> RunEndure(const ScratchDir& dir, std::vector<std::string> args) {
  args.insert(args.begin(), ENDURE_BIN);
  const std::string out = dir.Path("endure.out");
  Result<Subprocess> p = Subprocess::Start({.argv = args, .output_path = out});
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  if (!p.ok()) return {-1, ""};
  const ExitStatus e = p->Wait();
  return {e.exited ? e.code : 128 + e.signal, ReadAll(out)};
}

class ControllerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto [made, out] =
        RunEndure(dir_, {"certs", "--dir", dir_.Path("tls"), "--nodes", "node0,node1"});
    ASSERT_EQ(made, 0) << out;
    const auto [other, other_out] =
        RunEndure(dir_, {"certs", "--dir", dir_.Path("other"), "--nodes", "node0"});
    ASSERT_EQ(other, 0) << other_out;
    std::ofstream(dir_.Path("job.toml"))
        << "[job]\nname = \"tls\"\ncommand = [\"/bin/sleep\", \"30\"]\nnodes = 1\nstate_dir = \""
        << dir_.Path("state") << "\"\n";
    std::ofstream(dir_.Path("token")) << kToken << "\n";
    Result<Subprocess> p =
        Subprocess::Start({.argv = {ENDURE_BIN, "controller", "--spec", dir_.Path("job.toml"),
                                    "--token-file", dir_.Path("token"), "--address-file",
                                    dir_.Path("addr"), "--tls-dir", dir_.Path("tls")},
                           .output_path = dir_.Path("controller.out")});
    ASSERT_TRUE(p.ok());
    controller_.emplace(std::move(*p));
    for (int i = 0; i < 500 && ReadAll(dir_.Path("addr")).empty(); ++i) {
      std::this_thread::sleep_for(20ms);
    }
    addr_ = ReadAll(dir_.Path("addr"));
    ASSERT_FALSE(addr_.empty()) << ReadAll(dir_.Path("controller.out"));
  }
  void TearDown() override {
    if (controller_) {
      controller_->Signal(SIGKILL);
      controller_->Wait();
    }
  }

  // A channel presenting DIR/NAME.pem, trusting DIR/ca.pem; DIR "" is plain
  // TCP.
  std::shared_ptr<grpc::Channel> Channel(const std::string& dir, const std::string& name) {
    grpc::ChannelArguments args;
    if (dir.empty()) {
      return grpc::CreateCustomChannel(addr_, grpc::InsecureChannelCredentials(), args);
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadAll(dir_.Path(dir + "/ca.pem"));
    ssl.pem_cert_chain = ReadAll(dir_.Path(dir + "/" + name + ".pem"));
    ssl.pem_private_key = ReadAll(dir_.Path(dir + "/" + name + ".key"));
    args.SetSslTargetNameOverride("controller");
    return grpc::CreateCustomChannel(addr_, grpc::SslCredentials(ssl), args);
  }

  // Registers `node` over `channel` and reads the first command; the
  // stream's status when there is none.
  grpc::Status Register(const std::shared_ptr<grpc::Channel>& channel, const std::string& node,
                        proto::AgentCommand* first) {
    auto stub = proto::Controller::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 20s);
    auto stream = stub->Attach(&context);
    proto::AgentEvent hello;
    hello.set_token(kToken);
    hello.mutable_register_()->set_node_id(node);
    hello.mutable_register_()->set_slots(1);
    hello.mutable_register_()->set_host("127.0.0.1");
    stream->Write(hello);
    if (stream->Read(first)) {
      context.TryCancel();
      stream->Finish();
      return grpc::Status::OK;
    }
    return stream->Finish();
  }

  ScratchDir dir_{"endure_controller_tls"};
  std::optional<Subprocess> controller_;
  std::string addr_;
};

TEST_F(ControllerTlsTest, ANodesCertificateRegistersThatNode) {
  proto::AgentCommand first;
  const grpc::Status st = Register(Channel("tls", "node0"), "node0", &first);
  ASSERT_TRUE(st.ok()) << st.error_code() << " " << st.error_message() << "\n"
                       << ReadAll(dir_.Path("controller.out"));
  // The job of one node starts its first generation on it.
  EXPECT_TRUE(first.has_start()) << first.DebugString();
}

TEST_F(ControllerTlsTest, ACertificateForAnotherNodeIsRefused) {
  proto::AgentCommand first;
  const grpc::Status st = Register(Channel("tls", "node1"), "node0", &first);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  EXPECT_NE(st.error_message().find("node1"), std::string::npos) << st.error_message();
}

TEST_F(ControllerTlsTest, NoCertificateOrAnotherCaNeverReachesTheService) {
  for (const std::string& dir : {std::string(""), std::string("other")}) {
    proto::AgentCommand first;
    const grpc::Status st = Register(Channel(dir, "node0"), "node0", &first);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << dir << ": " << st.error_message();
  }
  // The controller is still there for the right certificate.
  proto::AgentCommand first;
  EXPECT_TRUE(Register(Channel("tls", "node0"), "node0", &first).ok());
}

TEST(TlsRequired, BeyondLoopbackWithoutTlsIsAConfigurationError) {
  ScratchDir dir("endure_tls_required");
  std::ofstream(dir.Path("job.toml")) << "[job]\nname = \"j\"\ncommand = [\"/bin/true\"]\n"
                                      << "state_dir = \"" << dir.Path("state") << "\"\n";
  std::ofstream(dir.Path("token")) << kToken << "\n";
  const auto [controller, controller_out] =
      RunEndure(dir, {"controller", "--spec", dir.Path("job.toml"), "--token-file",
                      dir.Path("token"), "--listen", "0.0.0.0:0"});
  EXPECT_EQ(controller, 2) << controller_out;
  EXPECT_NE(controller_out.find("--tls-dir"), std::string::npos) << controller_out;
  const auto [agent, agent_out] =
      RunEndure(dir, {"agent", "--controller", "10.1.2.3:5000", "--node-id", "node0",
                      "--token-file", dir.Path("token"), "--work-dir", dir.Path("work")});
  EXPECT_EQ(agent, 2) << agent_out;
  EXPECT_NE(agent_out.find("--tls-dir"), std::string::npos) << agent_out;
}

}  // namespace
}  // namespace endure
