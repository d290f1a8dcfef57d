// endure-train with the client library, end to end: a real trainer process
// reports to a Unix datagram socket standing in for the agent, while faults
// are injected through ENDURE_FAULTS. Asserts the datagrams and their order,
// how each fault ends (or does not end) the process, that a NaN fault leaves
// the model untouched, that ENDURE_RESTORE_STEP rolls back bit-exactly, that
// ENDURE_SKIP_STEPS skips, and exit code 2 for a malformed variable.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "common/subprocess.h"
#include "tests/support/test_support.h"

namespace endure {
namespace {

using testing_support::ReadAll;

namespace fs = std::filesystem;
using Json = nlohmann::json;
using namespace std::chrono_literals;

const std::vector<std::string>& kSmall = testing_support::SmallTrainerFlags();

struct TrainerRun {
  ExitStatus exit;
  std::string output;         // stdout and stderr
  std::vector<Json> reports;  // every datagram but heartbeats, in arrival order
  int heartbeats = 0;

  std::string Fingerprint() const {
    std::smatch m;
    return std::regex_search(output, m, std::regex("param_fingerprint=([0-9a-f]{16})")) ? m[1].str()
                                                                                        : "";
  }
  // "ready", "step 1", "fault kill 3", ...: the reports in a comparable form.
  std::vector<std::string> Summary() const {
    std::vector<std::string> out;
    for (const Json& j : reports) {
      const std::string type = j["type"];
      if (type == "ready") out.push_back("ready " + j["start_step"].dump());
      if (type == "step") out.push_back("step " + j["step"].dump());
      if (type == "skip") out.push_back("skip " + j["step"].dump());
      if (type == "fault")
        out.push_back("fault " + j["kind"].get<std::string>() + " " + j["step"].dump());
    }
    return out;
  }
  const Json* Step(int64_t n) const {
    for (const Json& j : reports) {
      if (j["type"] == "step" && j["step"] == n) return &j;
    }
    return nullptr;
  }
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure_client_it.XXXXXX";
    dir_ = mkdtemp(tmpl);
    socket_path_ = (dir_ / "agent.sock").string();
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_path_.c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << strerror(errno);
  }
  void TearDown() override {
    close(fd_);
    fs::remove_all(dir_);
  }

  // Receives datagrams for up to `timeout`; false when none came.
  bool Receive(TrainerRun* run, std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
    char buf[65536];
    const ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return false;
    Json j = Json::parse(std::string(buf, static_cast<size_t>(n)));
    EXPECT_EQ(j["token"], "test-token") << j.dump();
    EXPECT_EQ(j["generation"], 4) << j.dump();
    EXPECT_EQ(j["rank"], 0) << j.dump();
    if (j["type"] == "heartbeat") {
      ++run->heartbeats;
    } else {
      run->reports.push_back(std::move(j));
    }
    return true;
  }

  Subprocess Start(const std::vector<std::string>& args, std::map<std::string, std::string> env,
                   const std::string& tag) {
    std::vector<std::string> argv = {ENDURE_TRAIN_BIN};
    argv.insert(argv.end(), kSmall.begin(), kSmall.end());
    argv.insert(argv.end(), args.begin(), args.end());
    std::map<std::string, std::string> vars = {{"ENDURE_AGENT_SOCKET", socket_path_},
                                               {"ENDURE_TOKEN", "test-token"},
                                               {"ENDURE_GENERATION", "4"},
                                               {"RANK", "0"},
                                               {"ENDURE_HEARTBEAT_INTERVAL", "50ms"}};
    for (auto& [k, v] : env) vars[k] = v;
    ProcessSpec spec;
    spec.argv = argv;
    spec.env.assign(vars.begin(), vars.end());
    spec.unset_env = {"WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
    spec.output_path = (dir_ / (tag + ".out")).string();
    return Subprocess::Start(spec).value();
  }

  // Runs endure-train to its end, collecting every datagram.
  TrainerRun Train(const std::vector<std::string>& args, std::map<std::string, std::string> env,
                   const std::string& tag) {
    Subprocess p = Start(args, std::move(env), tag);
    TrainerRun run;
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    std::optional<ExitStatus> e;
    while (!(e = p.WaitFor(0ms))) {
      Receive(&run, 20ms);
      if (std::chrono::steady_clock::now() > deadline) {
        p.Signal(SIGKILL);
        e = p.Wait();
        ADD_FAILURE() << tag << " did not end";
        break;
      }
    }
    while (Receive(&run, 0ms)) {
    }
    run.exit = *e;
    run.output = ReadAll(dir_ / (tag + ".out"));
    return run;
  }

  // The fingerprint of a 4-step run without faults, computed once.
  std::string CleanFingerprint() {
    static std::string fingerprint;
    if (fingerprint.empty()) {
      TrainerRun clean = Train({"--steps", "4"}, {}, "clean");
      EXPECT_TRUE(clean.exit.Success()) << clean.output;
      fingerprint = clean.Fingerprint();
    }
    return fingerprint;
  }

  fs::path dir_;
  std::string socket_path_;
  int fd_ = -1;
};

TEST_F(ClientTest, KillFaultReportsItselfThenDiesBySigkill) {
  TrainerRun run =
      Train({"--steps", "6"},
            {{"ENDURE_FAULTS", R"([{"id":"k1","kind":"kill","rank":0,"step":3}])"}}, "kill");
  EXPECT_FALSE(run.exit.exited) << run.exit.ToString() << "\n" << run.output;
  EXPECT_EQ(run.exit.signal, SIGKILL);
  EXPECT_EQ(run.Summary(),
            (std::vector<std::string>{"ready 0", "step 1", "step 2", "fault kill 3"}));
  ASSERT_FALSE(run.reports.empty());
  const Json& ready = run.reports.front();
  EXPECT_GE(ready["init_s"].get<double>(), 0.0);
  EXPECT_LT(ready["init_s"].get<double>(), 60.0);
  EXPECT_GE(ready["restore_s"].get<double>(), 0.0);
  EXPECT_EQ(run.reports.back()["id"], "k1");
  const Json* step1 = run.Step(1);
  ASSERT_NE(step1, nullptr);
  EXPECT_TRUE((*step1)["loss"].is_number());
  EXPECT_GT((*step1)["compute_s"].get<double>(), 0.0);
  EXPECT_EQ((*step1)["checkpoint_step"], -1);
  EXPECT_EQ((*step1)["tokens"], 16 * 64);  // global batch x context
  EXPECT_GE(run.heartbeats, 1);
}

TEST_F(ClientTest, ExitFaultExitsWithItsCode) {
  TrainerRun run =
      Train({"--steps", "6"},
            {{"ENDURE_FAULTS", R"([{"id":"e1","kind":"exit","rank":0,"step":2,"exit_code":7}])"}},
            "exit");
  EXPECT_TRUE(run.exit.exited && run.exit.code == 7) << run.exit.ToString() << "\n" << run.output;
  EXPECT_EQ(run.Summary(), (std::vector<std::string>{"ready 0", "step 1", "fault exit 2"}));
}

TEST_F(ClientTest, LogFaultPrintsItsLineAndExitsOne) {
  const std::string line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.";
  Json faults =
      Json::array({{{"id", "l1"}, {"kind", "log"}, {"rank", 0}, {"step", 2}, {"line", line}}});
  TrainerRun run = Train({"--steps", "6"}, {{"ENDURE_FAULTS", faults.dump()}}, "log");
  EXPECT_TRUE(run.exit.exited && run.exit.code == 1) << run.exit.ToString() << "\n" << run.output;
  EXPECT_NE(run.output.find(line + "\n"), std::string::npos) << run.output;
  EXPECT_EQ(run.Summary(), (std::vector<std::string>{"ready 0", "step 1", "fault log 2"}));
}

TEST_F(ClientTest, HangFaultStopsProgressWhileHeartbeatsGoOn) {
  Subprocess p =
      Start({"--steps", "6"},
            {{"ENDURE_FAULTS", R"([{"id":"h1","kind":"hang","rank":0,"step":2}])"}}, "hang");
  TrainerRun run;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while ((run.reports.empty() || run.reports.back()["type"] != "fault") &&
         std::chrono::steady_clock::now() < deadline) {
    Receive(&run, 20ms);
  }
  ASSERT_EQ(run.Summary(), (std::vector<std::string>{"ready 0", "step 1", "fault hang 2"}));
  // Half a second later: alive, beating, and still inside step 2.
  const int beats = run.heartbeats;
  const auto until = std::chrono::steady_clock::now() + 500ms;
  while (std::chrono::steady_clock::now() < until) Receive(&run, 20ms);
  EXPECT_FALSE(p.WaitFor(0ms).has_value()) << "the hung process exited";
  EXPECT_GE(run.heartbeats - beats, 3);
  EXPECT_EQ(run.reports.size(), 3u) << run.reports.back().dump();
  p.Signal(SIGKILL);
  p.Wait();
}

TEST_F(ClientTest, NanFaultReachesTheReportButNotTheModel) {
  TrainerRun run =
      Train({"--steps", "4"},
            {{"ENDURE_FAULTS", R"([{"id":"n1","kind":"nan","rank":0,"step":2}])"}}, "nan");
  ASSERT_TRUE(run.exit.Success()) << run.output;
  EXPECT_EQ(run.Summary(), (std::vector<std::string>{"ready 0", "step 1", "fault nan 2", "step 2",
                                                     "step 3", "step 4"}));
  ASSERT_NE(run.Step(2), nullptr);
  EXPECT_EQ((*run.Step(2))["loss"], "nan");
  EXPECT_TRUE((*run.Step(3))["loss"].is_number());
  EXPECT_NE(run.output.find("step      2/4 | loss nan"), std::string::npos) << run.output;
  EXPECT_EQ(run.Fingerprint(), CleanFingerprint());
}

TEST_F(ClientTest, RestoreStepRollsBackBitExactly) {
  const std::string ckpt = (dir_ / "ckpt").string();
  const std::map<std::string, std::string> env = {{"ENDURE_CKPT_DIR", ckpt},
                                                  {"ENDURE_CKPT_EVERY", "10"}};
  TrainerRun first = Train({"--steps", "20"}, env, "first");
  ASSERT_TRUE(first.exit.Success()) << first.output;
  ASSERT_NE(first.Step(10), nullptr);
  EXPECT_EQ((*first.Step(10))["checkpoint_step"], 10);  // ENDURE_CKPT_* override the flags
  EXPECT_GT((*first.Step(10))["ckpt_stall_s"].get<double>(), 0.0);
  EXPECT_EQ((*first.Step(9))["checkpoint_step"], -1);
  EXPECT_EQ((*first.Step(9))["ckpt_stall_s"], 0.0);
  ASSERT_TRUE(fs::exists(fs::path(ckpt) / "step-00000020"));

  std::map<std::string, std::string> rollback = env;
  rollback["ENDURE_RESTORE_STEP"] = "10";
  TrainerRun second = Train({"--steps", "20"}, rollback, "second");
  ASSERT_TRUE(second.exit.Success()) << second.output;
  ASSERT_GE(second.reports.size(), 2u);
  EXPECT_EQ(second.reports[0]["type"], "ready");
  EXPECT_EQ(second.reports[0]["start_step"], 10);
  EXPECT_GT(second.reports[0]["restore_s"].get<double>(), 0.0);
  EXPECT_EQ(second.reports[1]["step"], 11);
  EXPECT_NE(second.output.find("rollback: removed"), std::string::npos) << second.output;
  EXPECT_EQ(second.Fingerprint(), first.Fingerprint());
  for (int64_t n = 11; n <= 20; ++n) {
    ASSERT_NE(second.Step(n), nullptr) << n;
    EXPECT_EQ((*second.Step(n))["loss"], (*first.Step(n))["loss"]) << "step " << n;
  }
}

TEST_F(ClientTest, SkippedStepHasNoUpdate) {
  TrainerRun run = Train({"--steps", "4"}, {{"ENDURE_SKIP_STEPS", "2"}}, "skip");
  ASSERT_TRUE(run.exit.Success()) << run.output;
  EXPECT_EQ(run.Summary(),
            (std::vector<std::string>{"ready 0", "step 1", "skip 2", "step 3", "step 4"}));
  EXPECT_FALSE(run.reports[2].contains("loss")) << run.reports[2].dump();
  EXPECT_NE(run.output.find("step      2/4 skipped (ENDURE_SKIP_STEPS)"), std::string::npos)
      << run.output;
  EXPECT_EQ(run.output.find("step      2/4 | loss"), std::string::npos) << run.output;
  ASSERT_EQ(run.Fingerprint().size(), 16u);
  EXPECT_NE(run.Fingerprint(), CleanFingerprint());
}

TEST_F(ClientTest, MalformedVariableExitsTwoWithOneLine) {
  TrainerRun run = Train({"--steps", "4"}, {{"ENDURE_RESTORE_STEP", "latest"}}, "bad");
  EXPECT_TRUE(run.exit.exited && run.exit.code == 2) << run.exit.ToString();
  EXPECT_NE(run.output.find("ENDURE_RESTORE_STEP='latest'"), std::string::npos) << run.output;
  EXPECT_EQ(std::count(run.output.begin(), run.output.end(), '\n'), 1) << run.output;
  EXPECT_TRUE(run.reports.empty());
}

}  // namespace
}  // namespace endure
