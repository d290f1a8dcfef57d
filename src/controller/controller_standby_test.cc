// Standby controllers against a real etcd on 127.0.0.1 (started here with
// free ports and a scratch store; skipped without /usr/bin/etcd): the
// election of two candidates, the standby's takeover when the leader stops
// renewing, standing down on the job's end, fencing when etcd is gone; then
// two `endure controller --etcd` processes, the leader kill -9'd; and
// `endure run` with [control_plane] standby, its leader kill -9'd mid-job,
// on a Python worker that only prints its progress (no torch needed).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "common/subprocess.h"
#include "controller/etcd_client.h"
#include "controller/job_spec.h"
#include "controller/leader_election.h"
#include "tests/support/test_support.h"

namespace endure::controller {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing_support::ReadAll;
using testing_support::ScratchDir;
using SteadyClock = std::chrono::steady_clock;

double SecondsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// A child process killed (SIGKILL, with its group) when this goes away,
// unless it has been reaped.
class Child {
 public:
  explicit Child(Subprocess p) : p_(std::move(p)) {}
  ~Child() {
    if (exit_) return;
    p_.SignalGroup(SIGKILL);
    p_.Signal(SIGKILL);
    p_.Wait();
  }
  pid_t pid() const { return p_.pid(); }
  void Signal(int sig) { p_.Signal(sig); }
  std::optional<ExitStatus> WaitFor(std::chrono::milliseconds t) {
    if (!exit_) exit_ = p_.WaitFor(t);
    return exit_;
  }

 private:
  Subprocess p_;
  std::optional<ExitStatus> exit_;
};

std::unique_ptr<Child> Spawn(const std::vector<std::string>& argv, const std::string& out) {
  Result<Subprocess> p = Subprocess::Start(
      {.argv = argv, .output_path = out, .new_process_group = true, .die_with_parent = true});
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? std::make_unique<Child>(std::move(p).value()) : nullptr;
}

// Whether something accepts TCP connections on 127.0.0.1:`port`.
bool Listening(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

int FreePort() {
  Result<int> port = PickFreePort();
  EXPECT_TRUE(port.ok());
  return port.ok() ? *port : 0;
}

class StandbyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kEtcdBinary)) {
      GTEST_SKIP() << kEtcdBinary << " is missing: install Debian's etcd-server";
    }
    const int client = FreePort(), peer = FreePort();
    endpoint_ = "127.0.0.1:" + std::to_string(client);
    const std::string client_url = "http://" + endpoint_;
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    etcd_ = Spawn({kEtcdBinary, "--name", "t", "--data-dir", dir_.Path("etcd"),
                   "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                   "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
                   "--initial-cluster", "t=" + peer_url, "--logger", "zap", "--log-level", "warn"},
                  dir_.Path("etcd.log"));
    ASSERT_NE(etcd_, nullptr);
    std::unique_ptr<EtcdClient> client_ = EtcdClient::Make({.endpoints = {endpoint_}}).value();
    const auto deadline = SteadyClock::now() + 30s;
    Status answer = Unavailable("not asked");
    while (!answer.ok() && SteadyClock::now() < deadline) {
      std::this_thread::sleep_for(50ms);
      answer = client_->Ping("/ping", SteadyClock::now() + 500ms);
    }
    ASSERT_TRUE(answer.ok()) << answer.message() << "\n" << ReadAll(dir_.Path("etcd.log"));
  }

  std::unique_ptr<Candidate> MakeCandidate(const std::string& address,
                                           Duration lease = std::chrono::seconds(2)) {
    Result<std::unique_ptr<Candidate>> c = Candidate::Make({.etcd = {.endpoints = {endpoint_}},
                                                            .job = job_,
                                                            .address = address,
                                                            .election = {.lease_ttl = lease}});
    EXPECT_TRUE(c.ok()) << c.status().message();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  ScratchDir dir_{"endure_standby_test"};
  std::string endpoint_;
  std::string job_ = "standby-job";
  std::unique_ptr<Child> etcd_;
};

const auto kNever = [] { return false; };

TEST_F(StandbyTest, TheSecondCandidateTakesOverWithinTheLeaseOnceTheLeaderStopsRenewing) {
  std::unique_ptr<Candidate> a = MakeCandidate("127.0.0.1:1001");
  Result<Candidate::Outcome> first = a->Campaign(kNever);
  ASSERT_TRUE(first.ok() && first->leads) << first.status().message();
  a->KeepLeading([](const std::string& why) { ADD_FAILURE() << "a lost its lease: " << why; });

  std::unique_ptr<Candidate> b = MakeCandidate("127.0.0.1:1002");
  auto second = std::async(std::launch::async, [&] { return b->Campaign(kNever); });
  // While the leader renews, the standby stands by (for more than a lease).
  ASSERT_EQ(second.wait_for(3s), std::future_status::timeout);

  const auto died = SteadyClock::now();
  a.reset();  // stops renewing, as a leader killed with -9 would
  ASSERT_EQ(second.wait_for(10s), std::future_status::ready);
  const double took = SecondsSince(died);
  Result<Candidate::Outcome> outcome = second.get();
  ASSERT_TRUE(outcome.ok() && outcome->leads) << outcome.status().message();
  std::printf("takeover after the leader stopped renewing: %.2f s (lease 2 s)\n", took);
  // The lease was renewed at most a third of it before: it ran out between
  // 2/3 and 1 lease later, and a campaign follows within 250 ms.
  EXPECT_GE(took, 2.0 * 2 / 3 - 0.3);
  EXPECT_LE(took, 2.0 + 1.0);
}

TEST_F(StandbyTest, AResigningLeaderStandsTheStandbyDownWithTheJobsExitCode) {
  std::unique_ptr<Candidate> a = MakeCandidate("127.0.0.1:1001");
  ASSERT_TRUE(a->Campaign(kNever).value().leads);
  a->KeepLeading([](const std::string&) {});
  std::unique_ptr<Candidate> b = MakeCandidate("127.0.0.1:1002");
  auto second = std::async(std::launch::async, [&] { return b->Campaign(kNever); });
  ASSERT_EQ(second.wait_for(1s), std::future_status::timeout);
  const auto resigned = SteadyClock::now();
  ASSERT_TRUE(a->Resign(3).ok());
  ASSERT_EQ(second.wait_for(5s), std::future_status::ready);
  Result<Candidate::Outcome> outcome = second.get();
  ASSERT_TRUE(outcome.ok()) << outcome.status().message();
  EXPECT_FALSE(outcome->leads);
  EXPECT_EQ(outcome->exit_code, 3);
  EXPECT_LT(SecondsSince(resigned), 1.0);

  // A later job of the same name is not stood down by that end.
  std::unique_ptr<Candidate> c = MakeCandidate("127.0.0.1:1003");
  Result<Candidate::Outcome> later = c->Campaign(kNever);
  ASSERT_TRUE(later.ok()) << later.status().message();
  EXPECT_TRUE(later->leads);
}

TEST_F(StandbyTest, ALeaderFencesItselfBeforeItsLeaseCanExpireWhenEtcdIsGone) {
  std::unique_ptr<Candidate> a = MakeCandidate("127.0.0.1:1001");
  ASSERT_TRUE(a->Campaign(kNever).value().leads);
  std::promise<SteadyClock::time_point> lost;
  std::string why;
  a->KeepLeading([&](const std::string& reason) {
    why = reason;
    lost.set_value(SteadyClock::now());
  });
  std::this_thread::sleep_for(1500ms);  // renewed meanwhile
  const auto gone = SteadyClock::now();
  etcd_.reset();  // SIGKILL
  auto fenced = lost.get_future();
  ASSERT_EQ(fenced.wait_for(5s), std::future_status::ready);
  const double took = std::chrono::duration<double>(fenced.get() - gone).count();
  std::printf("fenced %.2f s after etcd died (lease 2 s): %s\n", took, why.c_str());
  // Before the lease could expire: within the lease of the last renewal
  // less the margin (0.5 s), and so always less than the lease.
  EXPECT_LT(took, 2.0 - 0.4);
  EXPECT_NE(why.find("could not be renewed"), std::string::npos) << why;
}

// A job whose workers never come: controllers that wait for their nodes.
std::string WriteSpec(const ScratchDir& dir, const std::string& name, const std::string& extra) {
  const std::string path = dir.Path(name + ".toml");
  std::ofstream(path) << "[job]\nname = \"" << name << "\"\ncommand = [\"/bin/true\"]\n"
                      << "nodes = 2\nstate_dir = \"" << dir.Path(name) << "\"\n"
                      << extra;
  return path;
}

TEST_F(StandbyTest, TwoControllersOneListensAndTheStandbyTakesOverAKilledLeader) {
  const std::string spec = WriteSpec(dir_, job_, "");
  std::ofstream(dir_.Path("token")) << "standby-token\n";
  const int port_a = FreePort(), port_b = FreePort();
  auto controller = [&](int port, const std::string& log, bool address_file) {
    std::vector<std::string> argv = {
        ENDURE_BIN,     "controller",       "--spec",   spec,
        "--token-file", dir_.Path("token"), "--listen", "127.0.0.1:" + std::to_string(port),
        "--etcd",       endpoint_,          "--lease",  "2s"};
    if (address_file) argv.insert(argv.end(), {"--address-file", dir_.Path("a.addr")});
    return Spawn(argv, dir_.Path(log));
  };
  std::unique_ptr<Child> a = controller(port_a, "a.log", true);
  for (int i = 0; i < 500 && ReadAll(dir_.Path("a.addr")).empty(); ++i) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(ReadAll(dir_.Path("a.addr")), "127.0.0.1:" + std::to_string(port_a))
      << ReadAll(dir_.Path("a.log"));
  std::unique_ptr<Child> b = controller(port_b, "b.log", false);
  for (int i = 0; i < 250 && ReadAll(dir_.Path("b.log")).find("standing by") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_NE(ReadAll(dir_.Path("b.log"))
                .find("standing by for job 'standby-job' (the leader is "
                      "127.0.0.1:" +
                      std::to_string(port_a)),
            std::string::npos)
      << ReadAll(dir_.Path("b.log"));
  // A standby does not listen: the agents' next address is the leader's.
  EXPECT_TRUE(Listening(port_a));
  EXPECT_FALSE(Listening(port_b));
  std::this_thread::sleep_for(1s);
  EXPECT_FALSE(b->WaitFor(0ms)) << ReadAll(dir_.Path("b.log"));

  const auto killed = SteadyClock::now();
  a->Signal(SIGKILL);
  ASSERT_TRUE(a->WaitFor(5s));
  while (!Listening(port_b) && SecondsSince(killed) < 15) std::this_thread::sleep_for(20ms);
  const double took = SecondsSince(killed);
  ASSERT_TRUE(Listening(port_b)) << ReadAll(dir_.Path("b.log"));
  std::printf("the standby controller listened %.2f s after the leader's kill -9 (lease 2 s)\n",
              took);
  EXPECT_LE(took, 2.0 + 2.0) << ReadAll(dir_.Path("b.log"));
  EXPECT_NE(ReadAll(dir_.Path("b.log")).find("leading job 'standby-job' on 127.0.0.1:"),
            std::string::npos)
      << ReadAll(dir_.Path("b.log"));

  // A standby of the new leader: stopping the leader stops it too, with
  // the same code.
  std::unique_ptr<Child> c = controller(port_a, "c.log", false);
  for (int i = 0; i < 250 && ReadAll(dir_.Path("c.log")).find("standing by") == std::string::npos;
       ++i) {
    std::this_thread::sleep_for(20ms);
  }
  b->Signal(SIGTERM);
  std::optional<ExitStatus> b_end = b->WaitFor(20s);
  ASSERT_TRUE(b_end) << ReadAll(dir_.Path("b.log"));
  EXPECT_EQ(b_end->code, 128 + SIGTERM) << b_end->ToString();
  std::optional<ExitStatus> c_end = c->WaitFor(5s);
  ASSERT_TRUE(c_end) << ReadAll(dir_.Path("c.log"));
  EXPECT_EQ(c_end->code, 128 + SIGTERM) << c_end->ToString() << "\n" << ReadAll(dir_.Path("c.log"));
  EXPECT_NE(ReadAll(dir_.Path("c.log")).find("the job ended under another leader (exit code 143)"),
            std::string::npos)
      << ReadAll(dir_.Path("c.log"));
}

TEST_F(StandbyTest, ControllerFlagsAreChecked) {
  const std::string spec = WriteSpec(dir_, job_, "");
  std::ofstream(dir_.Path("token")) << "standby-token\n";
  const std::vector<std::string> head = {ENDURE_BIN, "controller",   "--spec",
                                         spec,       "--token-file", dir_.Path("token")};
  struct Case {
    std::vector<std::string> flags;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {{"--etcd", endpoint_, "--listen", "127.0.0.1:0"}, "--listen must name a port"},
           {{"--etcd", "nowhere", "--listen", "127.0.0.1:7"}, "--etcd: 'nowhere' is not HOST:PORT"},
           {{"--etcd", endpoint_, "--listen", "127.0.0.1:7", "--lease", "1s"},
            "--lease: must be whole seconds in [2s, 1h]"}}) {
    std::vector<std::string> argv = head;
    argv.insert(argv.end(), c.flags.begin(), c.flags.end());
    const testing_support::CommandOutcome r = testing_support::RunCommand(argv);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.expected << "\n" << r.output;
  }
}

// `endure run` with [control_plane] standby: a local etcd, two controllers,
// the agents listing both. The leader is kill -9'd mid-job; the standby
// takes over, the agents (and their workers) move to it, and the job
// completes. The worker only prints its progress.
constexpr char kPrintingWorker[] = R"(import os, sys, time
rank = int(os.environ["RANK"])
steps = int(sys.argv[1])
for i in range(steps):
    time.sleep(0.2)
    if rank == 0:
        print(f"step {i + 1} loss {3.0 - 0.01 * i:.3f}", flush=True)
)";

std::vector<pid_t> ControllersOf(const std::string& spec) {
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = ReadAll(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(" controller ") != std::string::npos &&
        cmdline.find(spec) != std::string::npos) {
      pids.push_back(std::stoi(name));
    }
  }
  return pids;
}

TEST_F(StandbyTest, EndureRunWithAStandbyCarriesAJobThroughItsLeadersKill) {
  const std::string script = dir_.Path("worker.py");
  std::ofstream(script) << kPrintingWorker;
  const std::string name = "standby-run";
  const std::string state = dir_.Path(name);
  const std::string spec =
      WriteSpec(dir_, name,
                "[detection]\nstartup_timeout = \"60s\"\n"
                "progress_pattern = 'step (?P<step>\\d+) loss (?P<loss>\\S+)'\n"
                "[control_plane]\nstandby = true\nlease = \"2s\"\n");
  // The spec's command is /bin/true: point it at the worker.
  std::string text = ReadAll(spec);
  text.replace(text.find("[\"/bin/true\"]"), std::string("[\"/bin/true\"]").size(),
               "[\"/usr/bin/python3\", \"" + script + "\", \"60\"]");
  std::ofstream(spec) << text;

  std::unique_ptr<Child> run = Spawn({ENDURE_BIN, "run", spec, "--quiet"}, dir_.Path("run.out"));
  auto step = [&] {
    const nlohmann::json s = nlohmann::json::parse(ReadAll(state + "/status.json"), nullptr, false);
    return s.is_object() ? s.value("step", int64_t{0}) : int64_t{0};
  };
  const auto deadline = SteadyClock::now() + 60s;
  while (step() < 10 && SteadyClock::now() < deadline && !run->WaitFor(50ms)) {
  }
  ASSERT_GE(step(), 10) << ReadAll(dir_.Path("run.out")) << ReadAll(state + "/controller.log");
  std::vector<pid_t> controllers = ControllersOf(spec);
  ASSERT_EQ(controllers.size(), 2u) << ReadAll(dir_.Path("run.out"));
  // The leader is the one endure run waited for: it has --address-file.
  pid_t leader = -1;
  for (pid_t pid : controllers) {
    if (ReadAll("/proc/" + std::to_string(pid) + "/cmdline").find("--address-file") !=
        std::string::npos) {
      leader = pid;
    }
  }
  ASSERT_GT(leader, 0);
  ASSERT_EQ(::kill(leader, SIGKILL), 0);

  std::optional<ExitStatus> end = run->WaitFor(120s);
  const std::string out = ReadAll(dir_.Path("run.out"));
  const std::string log = ReadAll(state + "/controller.log");
  ASSERT_TRUE(end) << out;
  EXPECT_TRUE(end->Success()) << end->ToString() << "\n" << out << log;
  EXPECT_NE(out.find("the standby on 127.0.0.1:"), std::string::npos) << out;
  const nlohmann::json report =
      nlohmann::json::parse(ReadAll(state + "/report.json"), nullptr, false);
  ASSERT_TRUE(report.is_object()) << out << log;
  EXPECT_EQ(report.value("steps", 0), 60) << report.dump(2);
  // Each agent moved to the new leader within the lease and a few seconds
  // of losing the old one (its own measure of the outage).
  const std::regex reconnected("reconnected to the controller after ([0-9.]+)(ms|s)");
  int moved = 0;
  for (const char* node : {"node0", "node1"}) {
    const std::string agent = ReadAll(state + "/nodes/" + node + "/agent.log");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(agent, m, reconnected)) << node << "\n" << agent;
    const double s = std::stod(m[1]) / (m[2] == "ms" ? 1000.0 : 1.0);
    std::printf("%s moved to the new leader %.2f s after losing the old one (lease 2 s)\n", node,
                s);
    EXPECT_LE(s, 2.0 + 3.0) << agent;
    ++moved;
  }
  EXPECT_EQ(moved, 2);
  // No worker was restarted: every worker log is of the first generation.
  std::set<std::string> logs;
  for (const char* node : {"node0", "node1"}) {
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(state + "/nodes/" + node + "/logs", ec)) {
      logs.insert(f.path().filename().string());
    }
  }
  EXPECT_EQ(logs, (std::set<std::string>{"gen0-rank0.log", "gen0-rank1.log"})) << log;
  // Nothing of the run is left: both controllers and etcd went with it.
  EXPECT_TRUE(ControllersOf(spec).empty());
  for (const auto& entry : fs::directory_iterator("/proc")) {
    std::string cmdline = ReadAll(entry.path() / "cmdline");
    EXPECT_EQ(cmdline.find(state + "/etcd"), std::string::npos) << cmdline;
  }
  std::printf("%s", out.c_str());
}

}  // namespace
}  // namespace endure::controller
