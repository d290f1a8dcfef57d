#include "endure/client.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "checkpoint/snapshot_file.h"

namespace endure {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

// The agent's end: a bound Unix datagram socket in a temporary directory.
class Receiver {
 public:
  Receiver() {
    char tmpl[] = "/tmp/endure_client_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = (dir_ / "agent.sock").string();
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << strerror(errno);
  }
  ~Receiver() {
    Close();
    fs::remove_all(dir_);
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    fs::remove(path_);
  }
  const std::string& path() const { return path_; }

  // The next datagram, or a discarded value after `timeout`.
  Json Next(std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return Json(Json::value_t::discarded);
    char buf[65536];
    const ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return Json(Json::value_t::discarded);
    return Json::parse(std::string(buf, static_cast<size_t>(n)));
  }
  // The next datagram that is not a heartbeat.
  Json NextReport() {
    while (true) {
      Json j = Next();
      if (j.is_discarded() || j["type"] != "heartbeat") return j;
    }
  }

 private:
  fs::path dir_;
  std::string path_;
  int fd_ = -1;
};

// An environment made of a map, so that tests never touch the real one.
class FakeEnv {
 public:
  explicit FakeEnv(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}
  EnvLookup lookup() const {
    return [this](const char* name) -> const char* {
      auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
  }

 private:
  std::map<std::string, std::string> vars_;
};

std::map<std::string, std::string> AgentVars(const Receiver& r) {
  return {{"ENDURE_AGENT_SOCKET", r.path()},
          {"ENDURE_TOKEN", "secret"},
          {"ENDURE_GENERATION", "3"},
          {"RANK", "0"},
          {"ENDURE_HEARTBEAT_INTERVAL", "1h"}};
}

std::unique_ptr<Session> MustCreate(const std::map<std::string, std::string>& vars) {
  FakeEnv env(vars);
  Result<std::unique_ptr<Session>> s = Session::FromEnvironment(env.lookup());
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : Session::Disabled();
}

void ExpectEnvelope(const Json& j, const std::string& type) {
  ASSERT_FALSE(j.is_discarded()) << "no datagram of type " << type;
  EXPECT_EQ(j["type"], type) << j.dump();
  EXPECT_EQ(j["token"], "secret");
  EXPECT_EQ(j["generation"], 3);
  EXPECT_EQ(j["rank"], 0);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_NEAR(j["t"].get<double>(), now, 5.0);
}

TEST(Session, InactiveWithoutAgentSocket) {
  std::unique_ptr<Session> s = MustCreate({});
  EXPECT_FALSE(s->active());
  EXPECT_EQ(s->rank(), 0);
  EXPECT_EQ(s->generation(), 0);
  EXPECT_TRUE(s->checkpoint_dir().empty());
  EXPECT_FALSE(s->checkpoint_every().has_value());
  EXPECT_FALSE(s->restore_step().has_value());
  EXPECT_TRUE(s->skip_steps().empty());
  s->Ready(0, 0, 0);
  s->BeginStep(0);
  EXPECT_EQ(s->EndStep(0, 2.5, 0.1, 0.1, 0, -1), 2.5);
  EXPECT_EQ(s->dropped(), 0);
  EXPECT_FALSE(Session::Disabled()->active());
}

TEST(Session, ReadsEveryVariable) {
  std::unique_ptr<Session> s = MustCreate({{"RANK", "2"},
                                           {"ENDURE_GENERATION", "7"},
                                           {"ENDURE_CKPT_DIR", "/ckpt"},
                                           {"ENDURE_CKPT_EVERY", "0"},
                                           {"ENDURE_RESTORE_STEP", "-1"},
                                           {"ENDURE_SKIP_STEPS", " 12,3 ,3"},
                                           {"ENDURE_HEARTBEAT_INTERVAL", "250ms"},
                                           {"ENDURE_FAULTS", "[]"}});
  EXPECT_FALSE(s->active());  // no socket: nothing reported, settings still apply
  EXPECT_EQ(s->rank(), 2);
  EXPECT_EQ(s->generation(), 7);
  EXPECT_EQ(s->checkpoint_dir(), "/ckpt");
  EXPECT_EQ(s->checkpoint_every(), 0);
  EXPECT_EQ(s->restore_step(), -1);
  EXPECT_EQ(s->skip_steps(), (std::vector<int64_t>{3, 12}));
  EXPECT_TRUE(s->ShouldSkip(2));  // index 2 is step 3
  EXPECT_FALSE(s->ShouldSkip(3));
  EXPECT_TRUE(s->ShouldSkip(11));
  EXPECT_TRUE(MustCreate({{"ENDURE_SKIP_STEPS", ""}})->skip_steps().empty());
}

TEST(Session, MalformedVariablesAreConfigurationErrors) {
  struct Case {
    std::string name, value, expected;
  };
  const std::vector<Case> cases = {
      {"RANK", "one", "RANK='one': expected an integer >= 0"},
      {"ENDURE_GENERATION", "-1", "ENDURE_GENERATION='-1'"},
      {"ENDURE_CKPT_EVERY", "10x", "ENDURE_CKPT_EVERY='10x': expected a number of steps"},
      {"ENDURE_RESTORE_STEP", "-2", "ENDURE_RESTORE_STEP='-2': expected -1 (newest checkpoint)"},
      {"ENDURE_SKIP_STEPS", "3,x", "ENDURE_SKIP_STEPS='3,x': 'x' is not a step number"},
      {"ENDURE_SKIP_STEPS", "0", "'0' is not a step number (comma-separated integers >= 1)"},
      {"ENDURE_SKIP_STEPS", "3,,4", "empty entry"},
      {"ENDURE_HEARTBEAT_INTERVAL", "500", "ENDURE_HEARTBEAT_INTERVAL='500': invalid duration"},
      {"ENDURE_HEARTBEAT_INTERVAL", "0s", "must be longer than zero"},
      {"ENDURE_FAULTS", "[{\"id\":\"a\",\"kind\":\"boom\"}]",
       "ENDURE_FAULTS: faults[0].kind: unknown fault kind 'boom'"},
      {"ENDURE_FAULTS", "[{\"id\":\"a\",\"kind\":\"kill\",\"rank\":0}]",
       "ENDURE_FAULTS: fault 'a' (kill): needs exactly one of step and at"},
      {"ENDURE_AGENT_SOCKET", std::string(200, 'x'), "longer than a Unix socket path"},
  };
  for (const Case& c : cases) {
    FakeEnv env(std::map<std::string, std::string>{{c.name, c.value}, {"ENDURE_TOKEN", "t"}});
    Result<std::unique_ptr<Session>> s = Session::FromEnvironment(env.lookup());
    ASSERT_FALSE(s.ok()) << c.name << "=" << c.value;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(c.expected), std::string::npos) << s.status().message();
    EXPECT_EQ(s.status().message().find('\n'), std::string::npos) << "one line";
  }
  FakeEnv no_token(std::map<std::string, std::string>{{"ENDURE_AGENT_SOCKET", "/tmp/x.sock"}});
  Result<std::unique_ptr<Session>> s = Session::FromEnvironment(no_token.lookup());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("ENDURE_TOKEN is not"), std::string::npos);
}

TEST(Session, ReadsARestorePlanFromAFile) {
  // A plan of many shards does not fit an environment variable (E2BIG).
  char dir[] = "/tmp/endure-client-plan-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/plan.json";
  std::string plan = R"({"step":9,"sources":[)";
  for (int i = 0; i < 1000; ++i) {
    plan += (i ? "," : "") + std::string(R"({"shard":)") + std::to_string(i) +
            R"(,"shards":1000,"tier":"T2","node":"","path":"/ckpt/step-9/shard-)" +
            std::to_string(i) + R"(.bin","bytes":10,"xxh3":"00000000000000ff","loader_rank":)" +
            std::to_string(i) + "}";
  }
  plan += "]}";
  ASSERT_GT(plan.size(), 128u * 1024) << "bigger than one environment string may be";
  std::ofstream(path) << plan;
  std::unique_ptr<Session> s = MustCreate({{"ENDURE_RESTORE_PLAN_FILE", path}});
  ASSERT_TRUE(s->restore_plan().has_value());
  EXPECT_EQ(s->restore_plan()->step, 9);
  ASSERT_EQ(s->restore_plan()->sources.size(), 1000u);
  EXPECT_EQ(s->restore_plan()->sources[999].loader_rank, 999);
  EXPECT_EQ(s->restore_plan()->summary, "step 9 from T2 x1000");

  FakeEnv both(std::map<std::string, std::string>{{"ENDURE_RESTORE_PLAN_FILE", path},
                                                  {"ENDURE_RESTORE_PLAN", plan}});
  EXPECT_EQ(Session::FromEnvironment(both.lookup()).status().code(), StatusCode::kInvalidArgument);
  FakeEnv missing(std::map<std::string, std::string>{{"ENDURE_RESTORE_PLAN_FILE", path + ".gone"}});
  Result<std::unique_ptr<Session>> gone = Session::FromEnvironment(missing.lookup());
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.status().message().find("ENDURE_RESTORE_PLAN_FILE"), std::string::npos);
  FakeEnv device(std::map<std::string, std::string>{{"ENDURE_RESTORE_PLAN_FILE", "/dev/zero"}});
  Result<std::unique_ptr<Session>> zero = Session::FromEnvironment(device.lookup());
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("not a regular file"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Session, SendsReadyStepAndHeartbeatDatagrams) {
  Receiver r;
  std::map<std::string, std::string> vars = AgentVars(r);
  vars["ENDURE_HEARTBEAT_INTERVAL"] = "20ms";
  std::unique_ptr<Session> s = MustCreate(vars);
  ASSERT_TRUE(s->active());

  // The first heartbeat comes right away, before Ready.
  Json hb = r.Next();
  ExpectEnvelope(hb, "heartbeat");
  EXPECT_EQ(hb["step"], -1);

  s->Ready(10, 0.5, 1.25);
  Json ready = r.NextReport();
  ExpectEnvelope(ready, "ready");
  EXPECT_EQ(ready["start_step"], 10);
  EXPECT_EQ(ready["restore_s"], 0.5);
  EXPECT_EQ(ready["init_s"], 1.25);

  s->BeginStep(10);
  EXPECT_EQ(s->EndStep(10, 2.5, 0.1, 0.02, 0.003, 11), 2.5);
  Json step = r.NextReport();
  ExpectEnvelope(step, "step");
  EXPECT_EQ(step["step"], 11);
  EXPECT_EQ(step["loss"], 2.5);
  EXPECT_EQ(step["compute_s"], 0.1);
  EXPECT_EQ(step["comm_s"], 0.02);
  EXPECT_EQ(step["ckpt_stall_s"], 0.003);
  EXPECT_EQ(step["checkpoint_step"], 11);
  EXPECT_FALSE(step.contains("tokens"));

  // A program that does not know its loss: progress with nothing to judge.
  EXPECT_FALSE(s->EndStep(10, std::nullopt, 0.1, 0, 0, -1).has_value());
  Json no_loss = r.NextReport();
  ExpectEnvelope(no_loss, "step");
  EXPECT_TRUE(no_loss["loss"].is_null());

  // A worker that dumps its own stacks says on which signal.
  EXPECT_TRUE(s->AnnounceStackSignal(SIGUSR2).ok());
  Json stacks = r.NextReport();
  ExpectEnvelope(stacks, "stacks");
  EXPECT_EQ(stacks["signal"], SIGUSR2);
  EXPECT_EQ(s->AnnounceStackSignal(SIGKILL).code(), StatusCode::kInvalidArgument);

  s->EndSkippedStep(11, 0.25, 12);
  Json skipped = r.NextReport();
  ExpectEnvelope(skipped, "skip");
  EXPECT_EQ(skipped["step"], 12);
  EXPECT_FALSE(skipped.contains("loss"));
  EXPECT_EQ(skipped["ckpt_stall_s"], 0.25);
  EXPECT_EQ(skipped["checkpoint_step"], 12);

  s->SetTokensPerStep(4096);
  s->EndStep(12, 2.4, 0.1, 0.02, 0, -1);
  EXPECT_EQ(r.NextReport()["tokens"], 4096);
  s->SetTotalSteps(500);
  s->EndStep(13, 2.4, 0.1, 0.02, 0, -1);
  EXPECT_EQ(r.NextReport()["total_steps"], 500);

  // Heartbeats carry the steps completed.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (true) {
    Json j = r.Next();
    ASSERT_FALSE(j.is_discarded());
    ASSERT_LT(Clock::now(), deadline) << "no heartbeat with step 14";
    if (j["type"] == "heartbeat" && j["step"] == 14) break;
  }
  EXPECT_EQ(s->dropped(), 0);
}

// In-process restart: the agent offers a later generation in the rejoin
// file; Rejoin takes it (and only a well-formed, later one).
// Where the "training thread" waits while another thread raises its stack
// signal: exported (-rdynamic), outside the anonymous namespace and not
// inlined, so that its name is in the dump.
}  // namespace
__attribute__((noinline)) bool WaitInTheTrainingLoopForTheStackDump(const std::string& path) {
  for (int i = 0; i < 1000; ++i) {
    std::ifstream f(path);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (text.find("[0x") != std::string::npos && text.back() == '\n') return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}
namespace {

TEST(Session, DumpsTheTrainingThreadsStackOnItsSignalWhicheverThreadGetsIt) {
  Receiver r;
  char dir[] = "/tmp/endure_client_stacks.XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/rank0.stacks";
  std::map<std::string, std::string> vars = AgentVars(r);
  vars["ENDURE_STACKS_FILE"] = path;
  std::unique_ptr<Session> s = MustCreate(vars);
  EXPECT_EQ(s->DumpStacksOnSignal(SIGKILL).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(s->DumpStacksOnSignal(SIGUSR2).ok());
  Json stacks = r.NextReport();
  ExpectEnvelope(stacks, "stacks");
  EXPECT_EQ(stacks["signal"], SIGUSR2);
  // The signal reaches another thread (as the kernel may pick any): it is
  // passed on, and the dump is the calling thread's.
  std::thread other([] { ::syscall(SYS_tgkill, ::getpid(), ::syscall(SYS_gettid), SIGUSR2); });
  EXPECT_TRUE(WaitInTheTrainingLoopForTheStackDump(path));
  other.join();
  std::ifstream f(path);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("Native stack of the training thread (most recent call first):\n", 0), 0u)
      << text;
  EXPECT_NE(text.find("WaitInTheTrainingLoopForTheStackDump"), std::string::npos) << text;
  ::signal(SIGUSR2, SIG_DFL);
  std::filesystem::remove_all(dir);
  // Outside an agent there is no file, and nothing is installed.
  EXPECT_TRUE(MustCreate({})->DumpStacksOnSignal(SIGUSR2).ok());
}

TEST(Session, RejoinTakesALaterGenerationsOfferAndNothingElse) {
  Receiver r;
  char tmpl[] = "/tmp/endure_rejoin_test.XXXXXX";
  const fs::path dir = mkdtemp(tmpl);
  const std::string file = (dir / "rank0.rejoin").string();
  std::map<std::string, std::string> vars = AgentVars(r);
  vars["ENDURE_REJOIN_FILE"] = file;
  std::unique_ptr<Session> s = MustCreate(vars);
  ASSERT_TRUE(s->rejoin_offered_here());
  EXPECT_FALSE(s->peer_restore());
  s->DeclareRejoin();
  s->Ready(7, 0, 0);
  Json ready = r.NextReport();
  ExpectEnvelope(ready, "ready");
  EXPECT_EQ(ready["rejoin"], true);

  auto offer = [&](const std::string& text) {
    std::ofstream(file + ".tmp") << text;
    fs::rename(file + ".tmp", file);
  };
  const std::string base = "ENDURE_AGENT_SOCKET=" + r.path() +
                           "\nRANK=0\nENDURE_HEARTBEAT_INTERVAL=1h\nENDURE_TOKEN=next\n";
  // No offer, then one of the same generation: nothing to take.
  EXPECT_FALSE(s->RejoinPending());
  EXPECT_EQ(s->Rejoin(std::chrono::milliseconds(10)).code(), StatusCode::kUnavailable);
  offer(base + "ENDURE_GENERATION=3\n");
  EXPECT_FALSE(s->RejoinPending());
  // A later one that does not parse changes nothing. The session's offer
  // watch (started by DeclareRejoin) sees it within its 10 ms look.
  offer(base + "ENDURE_GENERATION=4\nENDURE_FAULTS=[{\"kind\":\"teleport\"}]\n");
  const auto seen_by = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!s->RejoinPending() && std::chrono::steady_clock::now() < seen_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(s->RejoinPending());
  EXPECT_EQ(s->Rejoin(std::chrono::milliseconds(10)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s->generation(), 3);
  // A good one: the session is generation 4's, with its token, and still
  // says it rejoins.
  offer(base + "ENDURE_GENERATION=4\n");
  ASSERT_TRUE(s->Rejoin(std::chrono::milliseconds(10)).ok());
  EXPECT_EQ(s->generation(), 4);
  EXPECT_FALSE(s->RejoinPending());
  s->Ready(7, 0.1, 0);
  Json again = r.NextReport();
  EXPECT_EQ(again["type"], "ready");
  EXPECT_EQ(again["generation"], 4);
  EXPECT_EQ(again["token"], "next");
  EXPECT_EQ(again["rejoin"], true);
  for (const char* v : {"ENDURE_AGENT_SOCKET", "RANK", "ENDURE_HEARTBEAT_INTERVAL", "ENDURE_TOKEN",
                        "ENDURE_GENERATION"}) {
    ::unsetenv(v);  // set by Rejoin, as a trainer needs them
  }
  fs::remove_all(dir);
}

TEST(Session, NonFiniteLossIsSentAsAString) {
  Receiver r;
  std::unique_ptr<Session> s = MustCreate(AgentVars(r));
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<double, std::string>> cases = {
      {std::nan(""), "nan"}, {inf, "inf"}, {-inf, "-inf"}};
  for (size_t i = 0; i < cases.size(); ++i) {
    s->EndStep(static_cast<int64_t>(i), cases[i].first, 0, 0, 0, -1);
    Json j = r.NextReport();
    EXPECT_EQ(j["loss"], cases[i].second) << j.dump();
  }
}

TEST(Session, NanFaultFiresOnceAtItsStep) {
  Receiver r;
  std::map<std::string, std::string> vars = AgentVars(r);
  vars["ENDURE_FAULTS"] =
      R"([{"id":"n1","kind":"nan","rank":0,"step":2},{"id":"other","kind":"nan","rank":1,"step":1}])";
  std::unique_ptr<Session> s = MustCreate(vars);
  EXPECT_EQ(s->EndStep(0, 3.0, 0, 0, 0, -1), 3.0);  // rank 1's fault is not ours
  EXPECT_EQ(r.NextReport()["loss"], 3.0);
  EXPECT_TRUE(std::isnan(s->EndStep(1, 2.9, 0, 0, 0, -1).value()));
  Json fault = r.NextReport();
  ExpectEnvelope(fault, "fault");
  EXPECT_EQ(fault["id"], "n1");
  EXPECT_EQ(fault["kind"], "nan");
  EXPECT_EQ(fault["step"], 2);
  Json step = r.NextReport();
  EXPECT_EQ(step["step"], 2);
  EXPECT_EQ(step["loss"], "nan");
  // Rolled back and run again in the same process: it does not fire twice.
  EXPECT_EQ(s->EndStep(1, 2.9, 0, 0, 0, -1), 2.9);
}

// Every step saved into node memory (T0, three slots) and reported. At step
// 31 the loss is NaN: the snapshot of step 30 is the rollback target while
// the controller judges it, so the saves of the steps that run meanwhile
// never overwrite it. A normal run keeps only the newest ones.
TEST(Session, TheSnapshotBeforeASuspectLossIsHeldInNodeMemory) {
  for (bool suspect : {true, false}) {
    SCOPED_TRACE(suspect ? "NaN at step 31" : "no anomaly");
    Receiver r;
    char tmpl[] = "/tmp/endure-hold-XXXXXX";
    const std::string t0 = mkdtemp(tmpl);
    std::map<std::string, std::string> vars = AgentVars(r);
    vars["ENDURE_T0_DIR"] = t0;
    std::unique_ptr<Session> s = MustCreate(vars);
    std::vector<float> w(16, 0.5f);
    for (int64_t done = 1; done <= 40; ++done) {
      const TensorRef t{"w", "float32", {16}, w.data(), w.size() * sizeof(float)};
      ASSERT_TRUE(s->SaveSnapshot(done, 1, "{}", {t}).value());
      s->EndStep(done - 1, suspect && done == 31 ? std::nan("") : 2.0 + 0.01 * (done % 3), 0, 0, 0,
                 done);
    }
    std::set<int64_t> held;
    for (int slot = 0; slot < 3; ++slot) {
      auto f = checkpoint::SnapshotFile::Open(t0 + "/rank-0.slot-" + std::to_string(slot));
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      held.insert((*f)->info().step);
    }
    EXPECT_EQ(held, suspect ? std::set<int64_t>({30, 39, 40}) : std::set<int64_t>({38, 39, 40}));
    std::filesystem::remove_all(t0);
  }
}

// A killed rank's replacement starts on its node: a fresh session of the
// same rank finds what the dead one saved in node memory, and reads it back
// verified; a slot whose bytes changed is a data loss, never a restore.
TEST(Session, AFreshSessionOfTheSameRankReadsItsNodesSnapshotsBack) {
  Receiver r;
  char tmpl[] = "/tmp/endure-local-XXXXXX";
  const std::string t0 = mkdtemp(tmpl);
  std::map<std::string, std::string> vars = AgentVars(r);
  vars["ENDURE_T0_DIR"] = t0;
  vars["RANK"] = "1";
  std::vector<float> w(16, 0.0f);
  {
    std::unique_ptr<Session> dead = MustCreate(vars);
    for (int64_t done = 1; done <= 5; ++done) {
      w[0] = static_cast<float>(done);
      const TensorRef t{"w", "float32", {16}, w.data(), w.size() * sizeof(float)};
      ASSERT_TRUE(dead->SaveSnapshot(done, 2, "{}", {t}).value());
    }
  }
  std::unique_ptr<Session> s = MustCreate(vars);
  const std::vector<int64_t> steps = s->LocalSnapshotSteps(2);
  ASSERT_GE(steps.size(), 2u);
  EXPECT_EQ(steps[0], 5);
  EXPECT_EQ(steps[1], 4);
  EXPECT_TRUE(s->LocalSnapshotSteps(3).empty());  // saved by another world size
  Result<std::string> bytes = s->ReadLocalSnapshot(5);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  Result<StoredShard> shard = DecodeShard(*bytes, "t0");
  ASSERT_TRUE(shard.ok()) << shard.status().ToString();
  ASSERT_EQ(shard->tensors.size(), 1u);
  float first = 0;
  std::memcpy(&first, shard->tensors[0].data.data(), sizeof first);
  EXPECT_EQ(first, 5.0f);
  EXPECT_EQ(s->ReadLocalSnapshot(17).status().code(), StatusCode::kNotFound);
  // Another rank's session on the node sees none of them.
  vars["RANK"] = "0";
  EXPECT_TRUE(MustCreate(vars)->LocalSnapshotSteps(2).empty());
  for (int slot = 0; slot < 3; ++slot) {
    auto f = checkpoint::SnapshotFile::Open(t0 + "/rank-1.slot-" + std::to_string(slot));
    if (f.ok() && (*f)->info().step == 5) (*f)->InjectCorruption();
  }
  EXPECT_EQ(s->ReadLocalSnapshot(5).status().code(), StatusCode::kDataLoss);
  std::filesystem::remove_all(t0);
}

// Where a generation's restore comes from is its own: an offer without a
// plan leaves no plan from the generation the process started in, and an
// offer with one (a sharded program reads it) gives it.
TEST(Session, ARejoinTakesTheRestoreRouteOfTheOfferOnly) {
  Receiver r;
  char tmpl[] = "/tmp/endure_rejoin_plan.XXXXXX";
  const fs::path dir = mkdtemp(tmpl);
  const std::string file = (dir / "rank0.rejoin").string();
  const std::string plan_file = (dir / "plan.json").string();
  std::ofstream(plan_file) << R"({"step":4,"sources":[]})";
  std::map<std::string, std::string> vars = AgentVars(r);
  vars["ENDURE_REJOIN_FILE"] = file;
  vars["ENDURE_RESTORE_PLAN_FILE"] = plan_file;
  for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  std::unique_ptr<Session> s = MustCreate(vars);
  ASSERT_TRUE(s->restore_plan().has_value());
  const std::string base = "ENDURE_AGENT_SOCKET=" + r.path() + "\nRANK=0\nENDURE_TOKEN=t\n";
  std::ofstream(file) << base << "ENDURE_GENERATION=4\n";
  ASSERT_TRUE(s->Rejoin(std::chrono::milliseconds(1000)).ok());
  EXPECT_FALSE(s->restore_plan().has_value());
  EXPECT_EQ(std::getenv("ENDURE_RESTORE_PLAN_FILE"), nullptr);
  std::ofstream(file) << base << "ENDURE_GENERATION=5\nENDURE_RESTORE_PLAN_FILE=" << plan_file
                      << "\n";
  ASSERT_TRUE(s->Rejoin(std::chrono::milliseconds(1000)).ok());
  ASSERT_TRUE(s->restore_plan().has_value());
  EXPECT_EQ(s->restore_plan()->step, 4);
  for (const auto& [k, v] : vars) ::unsetenv(k.c_str());
  for (const char* v : {"RANK", "ENDURE_TOKEN", "ENDURE_GENERATION", "ENDURE_RESTORE_PLAN_FILE"}) {
    ::unsetenv(v);
  }
  fs::remove_all(dir);
}

TEST(Session, StopsAtNamesTheStepsWhoseFaultsEndOrStopTheProcess) {
  Receiver r;
  std::map<std::string, std::string> vars = AgentVars(r);
  vars["ENDURE_FAULTS"] =
      R"([{"id":"k","kind":"kill","rank":0,"step":3},{"id":"h","kind":"hang","rank":0,"step":5},)"
      R"({"id":"n","kind":"nan","rank":0,"step":2},{"id":"o","kind":"exit","rank":1,"step":4}])";
  std::unique_ptr<Session> s = MustCreate(vars);
  // Step indexes are 0-based: index 2 is step 3.
  EXPECT_TRUE(s->StopsAt(2));
  EXPECT_TRUE(s->StopsAt(4));
  EXPECT_FALSE(s->StopsAt(1));  // a nan fault lets the process go on
  EXPECT_FALSE(s->StopsAt(3));  // rank 1's exit is not ours
  EXPECT_FALSE(s->StopsAt(0));
}

TEST(Session, SlowFaultStretchesEveryStepFromItsStepOn) {
  Receiver r;
  std::map<std::string, std::string> vars = AgentVars(r);
  vars["ENDURE_FAULTS"] = R"([{"id":"s1","kind":"slow","rank":0,"step":2,"factor":3}])";
  std::unique_ptr<Session> s = MustCreate(vars);
  auto start = Clock::now();
  s->EndStep(0, 1, 0.010, 0.005, 0, -1);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(20));
  EXPECT_EQ(r.NextReport()["compute_s"], 0.010);
  for (int64_t i = 1; i <= 2; ++i) {
    start = Clock::now();
    s->EndStep(i, 1, 0.010, 0.005, 0, -1);
    // (3 - 1) x 10 ms of compute; the 5 ms of communication (waiting for
    // peers, who may be slowed too) is not stretched.
    EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(20));
    Json j = r.NextReport();
    if (i == 1) {
      EXPECT_EQ(j["type"], "fault");
      EXPECT_EQ(j["kind"], "slow");
      j = r.NextReport();
    }
    EXPECT_NEAR(j["compute_s"].get<double>(), 0.030, 1e-9);  // reported as compute
    EXPECT_EQ(j["comm_s"], 0.005);
  }
}

TEST(Session, PhaseSendsItsNameWithTheStepsCompleted) {
  Receiver r;
  std::unique_ptr<Session> s = MustCreate(AgentVars(r));
  EXPECT_EQ(s->current_phase(), "train");
  ASSERT_TRUE(s->Phase("data").ok());  // before Ready: no step completed
  Json data = r.NextReport();
  ExpectEnvelope(data, "phase");
  EXPECT_EQ(data["phase"], "data");
  EXPECT_EQ(data["step"], -1);
  s->Ready(4, 0, 0);
  r.NextReport();
  s->EndStep(4, 1.0, 0, 0, 0, -1);
  r.NextReport();
  ASSERT_TRUE(s->Phase("eval").ok());
  Json eval = r.NextReport();
  ExpectEnvelope(eval, "phase");
  EXPECT_EQ(eval["phase"], "eval");
  EXPECT_EQ(eval["step"], 5);
  EXPECT_EQ(s->current_phase(), "eval");
  ASSERT_TRUE(s->Phase("train").ok());
  EXPECT_EQ(r.NextReport()["phase"], "train");
  // Names the agent would refuse are refused here, with the phase kept.
  for (const char* bad :
       {"", "Eval", "1eval", "eval-2", "eval phase", "e\n", "a_very_long_phase_name_of_33_char"}) {
    Status st = s->Phase(bad);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("not a phase name"), std::string::npos) << st.message();
  }
  EXPECT_TRUE(s->Phase("a_long_phase_name_of_32_chars_ok").ok());
  EXPECT_EQ(r.NextReport()["phase"], "a_long_phase_name_of_32_chars_ok");
  EXPECT_EQ(s->current_phase(), "a_long_phase_name_of_32_chars_ok");
  // Inactive: remembered, not sent; bad names are still refused.
  std::unique_ptr<Session> bare = Session::Disabled();
  EXPECT_TRUE(bare->Phase("checkpoint").ok());
  EXPECT_EQ(bare->current_phase(), "checkpoint");
  EXPECT_FALSE(bare->Phase("Bad").ok());
}

TEST(Session, FingerprintsAreDueEveryNStepsAndSentChecked) {
  Receiver r;
  std::map<std::string, std::string> vars = AgentVars(r);
  vars["ENDURE_SDC_CHECK_EVERY"] = "5";
  std::unique_ptr<Session> s = MustCreate(vars);
  EXPECT_EQ(s->sdc_check_every(), 5);
  std::vector<int64_t> due;
  for (int64_t i = 0; i < 16; ++i) {
    if (s->FingerprintDue(i)) due.push_back(i);
  }
  EXPECT_EQ(due, (std::vector<int64_t>{4, 9, 14}));  // steps 5, 10 and 15
  ASSERT_TRUE(s->ReportFingerprint(9, "0123456789abcdef").ok());
  Json j = r.NextReport();
  ExpectEnvelope(j, "fingerprint");
  EXPECT_EQ(j["step"], 10);
  EXPECT_EQ(j["fingerprint"], "0123456789abcdef");
  // What Fingerprint returns is accepted as it is.
  const float x[2] = {1.0f, 2.0f};
  const std::string fp = Fingerprint({TensorRef{"w", "float32", {2}, x, sizeof x}});
  EXPECT_TRUE(s->ReportFingerprint(14, fp).ok());
  EXPECT_EQ(r.NextReport()["fingerprint"], fp);
  for (const char* bad : {"", "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0",
                          "0123456789abcdeg", "0x23456789abcdef"}) {
    Status st = s->ReportFingerprint(4, bad);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(s->ReportFingerprint(-1, fp).code(), StatusCode::kInvalidArgument);
  // Off by default; refused when malformed.
  EXPECT_EQ(MustCreate({})->sdc_check_every(), 0);
  EXPECT_FALSE(MustCreate({})->FingerprintDue(0));
  EXPECT_FALSE(MustCreate({{"ENDURE_SDC_CHECK_EVERY", "0"}})->FingerprintDue(0));
  for (const char* bad : {"-1", "x", "5s"}) {
    FakeEnv env(std::map<std::string, std::string>{{"ENDURE_SDC_CHECK_EVERY", bad}});
    Result<std::unique_ptr<Session>> bad_session = Session::FromEnvironment(env.lookup());
    ASSERT_FALSE(bad_session.ok()) << bad;
    EXPECT_NE(bad_session.status().message().find("ENDURE_SDC_CHECK_EVERY='" + std::string(bad)),
              std::string::npos)
        << bad_session.status().message();
  }
}

TEST(Session, BitflipIsDueOnceAtItsStep) {
  Receiver r;
  std::map<std::string, std::string> vars = AgentVars(r);
  vars["ENDURE_FAULTS"] =
      R"([{"id":"b1","kind":"bitflip","rank":0,"step":3,"tensor":2,"element":7,"bit":12},)"
      R"({"id":"b2","kind":"bitflip","rank":0,"step":5},)"
      R"({"id":"other","kind":"bitflip","rank":1,"step":3}])";
  std::unique_ptr<Session> s = MustCreate(vars);
  EXPECT_FALSE(s->BitflipDue(0).has_value());
  EXPECT_FALSE(s->BitflipDue(1).has_value());
  std::optional<BitFlip> flip = s->BitflipDue(2);
  ASSERT_TRUE(flip.has_value());
  EXPECT_EQ(flip->tensor, 2);
  EXPECT_EQ(flip->element, 7);
  EXPECT_EQ(flip->bit, 12);
  Json fault = r.NextReport();
  ExpectEnvelope(fault, "fault");
  EXPECT_EQ(fault["id"], "b1");
  EXPECT_EQ(fault["kind"], "bitflip");
  EXPECT_EQ(fault["step"], 3);
  EXPECT_FALSE(s->BitflipDue(2).has_value());  // once
  std::optional<BitFlip> defaults = s->BitflipDue(4);
  ASSERT_TRUE(defaults.has_value());
  EXPECT_EQ(defaults->tensor, 0);
  EXPECT_EQ(defaults->element, 0);
  EXPECT_EQ(defaults->bit, 30);
  EXPECT_EQ(r.NextReport()["id"], "b2");
  // Without an agent the fault still fires (faults under torchrun).
  std::unique_ptr<Session> bare = MustCreate({{"ENDURE_FAULTS", vars["ENDURE_FAULTS"]}});
  EXPECT_TRUE(bare->BitflipDue(2).has_value());
}

TEST(FlipBit, FlipsTheBitOfTheElementModuloTheirRange) {
  float w[3] = {1.0f, 1.0f, 1.0f};
  // Bit 30 of a float32 is the top exponent bit but one: 1.0 (0x3f800000)
  // becomes 0x7f800000, infinity.
  ASSERT_TRUE(FlipBit(BitFlip{0, 1, 30}, w, 3, sizeof(float)));
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_TRUE(std::isinf(w[1]));
  EXPECT_EQ(w[2], 1.0f);
  ASSERT_TRUE(FlipBit(BitFlip{0, 1, 30}, w, 3, sizeof(float)));  // flipped back
  EXPECT_EQ(w[1], 1.0f);
  // Element 5 of 3 is element 2; bit 31 + 32 of a 32-bit value is its sign.
  ASSERT_TRUE(FlipBit(BitFlip{0, 5, 63}, w, 3, sizeof(float)));
  EXPECT_EQ(w[2], -1.0f);
  uint64_t v[1] = {0};
  ASSERT_TRUE(FlipBit(BitFlip{0, 0, 40}, v, 1, sizeof(uint64_t)));
  EXPECT_EQ(v[0], uint64_t{1} << 40);
  uint16_t h[2] = {0, 0};
  ASSERT_TRUE(FlipBit(BitFlip{0, 1, 17}, h, 2, sizeof(uint16_t)));  // bit 17 of 16: bit 1
  EXPECT_EQ(h[0], 0);
  EXPECT_EQ(h[1], 2);
  EXPECT_FALSE(FlipBit(BitFlip{}, w, 0, sizeof(float)));
  EXPECT_FALSE(FlipBit(BitFlip{}, w, 3, 3));
  EXPECT_FALSE(FlipBit(BitFlip{}, nullptr, 3, 4));
}

TEST(Session, CommSlowStretchesEachCollectiveFromItsStepOn) {
  Receiver r;
  std::map<std::string, std::string> vars = AgentVars(r);
  vars["ENDURE_FAULTS"] = R"([{"id":"cs","kind":"comm-slow","rank":0,"step":2,"factor":3}])";
  std::unique_ptr<Session> s = MustCreate(vars);
  auto timed = [&](int64_t step) {
    const auto start = Clock::now();
    s->BeforeCollective(step);
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  EXPECT_LT(timed(0), 0.02);  // before its step: untouched
  s->EndStep(0, 1, 0.01, 0.2, 0, -1);
  r.NextReport();
  // Step 2: (3 - 1) x the last comm_s, 0.2 s.
  double slept = timed(1);
  EXPECT_GE(slept, 0.4);
  EXPECT_LT(slept, 2.0);  // loosely: a loaded machine oversleeps
  Json fault = r.NextReport();
  ExpectEnvelope(fault, "fault");
  EXPECT_EQ(fault["id"], "cs");
  EXPECT_EQ(fault["kind"], "comm-slow");
  EXPECT_EQ(fault["step"], 2);
  // The trainer reports the sleep as communication; the next stretch is
  // computed from the collective's own 10 ms, so it does not compound, and
  // is at least (3 - 1) x 50 ms.
  s->EndStep(1, 1, 0.01, slept + 0.01, 0, -1);
  EXPECT_EQ(r.NextReport()["type"], "step");
  slept = timed(2);
  EXPECT_GE(slept, 0.1);
  EXPECT_LT(slept, 0.35);
  s->EndStep(2, 1, 0.01, slept + 0.01, 0, -1);
  // The fault datagram went out once.
  EXPECT_EQ(r.NextReport()["type"], "step");
  EXPECT_TRUE(r.Next(std::chrono::milliseconds(50)).is_discarded());
}

TEST(Session, CommFailExitsBeforeTheCollectiveWithTheErrorLine) {
  Receiver r;
  std::map<std::string, std::string> vars = AgentVars(r);
  vars["ENDURE_FAULTS"] = R"([{"id":"cf","kind":"comm-fail","rank":0,"step":3}])";
  std::unique_ptr<Session> s = MustCreate(vars);
  s->BeforeCollective(0);  // not yet
  s->BeforeCollective(1);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    dup2(pipe_fds[1], STDERR_FILENO);
    s->BeforeCollective(2);
    _exit(99);  // not reached
  }
  close(pipe_fds[1]);
  std::string err;
  char buf[512];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) err.append(buf, n);
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 1);
  EXPECT_NE(err.find("endure fault: collective failed: Connection reset by peer (comm-fail)"),
            std::string::npos)
      << err;
  // The agent learns which fault it was before the process is gone.
  Json fault = r.NextReport();
  ExpectEnvelope(fault, "fault");
  EXPECT_EQ(fault["id"], "cf");
  EXPECT_EQ(fault["kind"], "comm-fail");
  EXPECT_EQ(fault["step"], 3);
}

TEST(Session, EndStepDoesNotBlockWhenTheAgentIsGone) {
  Receiver r;
  std::unique_ptr<Session> s = MustCreate(AgentVars(r));
  r.Close();  // the socket file is gone too
  const auto start = Clock::now();
  for (int i = 0; i < 1000; ++i) s->EndStep(i, 1, 0, 0, 0, -1);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
  EXPECT_GE(s->dropped(), 1000);
}

TEST(Session, EndStepDoesNotBlockWhenTheAgentQueueIsFull) {
  Receiver r;  // bound, never read
  std::unique_ptr<Session> s = MustCreate(AgentVars(r));
  const auto start = Clock::now();
  for (int i = 0; i < 20000; ++i) s->EndStep(i, 1, 0, 0, 0, -1);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(1000));
  EXPECT_GT(s->dropped(), 0);
  // What was queued is intact and in order.
  EXPECT_EQ(r.NextReport()["step"], 1);
  EXPECT_EQ(r.NextReport()["step"], 2);
}

TEST(Session, DestructorStopsTheHeartbeatThreadPromptly) {
  Receiver r;
  std::unique_ptr<Session> s = MustCreate(AgentVars(r));  // interval 1h
  ASSERT_FALSE(r.Next().is_discarded());
  const auto start = Clock::now();
  s.reset();
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(100));
}

TEST(SecondsSinceProcessStart, IsTheAgeOfThisProcess) {
  const double age = SecondsSinceProcessStart();
  EXPECT_GT(age, 0);
  EXPECT_LT(age, 600);  // this test binary started moments ago
}

}  // namespace
}  // namespace endure
