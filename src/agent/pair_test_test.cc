// The pair test between two agents on 127.0.0.1: a clean test passes with
// its time, a comm-fail fault on either side fails it with the reason, a
// comm-slow fault makes it measurably slower, hostile and wrong requests are
// refused with a reason, a silent peer costs at most the timeout, and the
// server stops promptly whatever its client does.
#include "agent/pair_test.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <thread>

#include "common/tls.h"
#include "tests/support/test_support.h"

namespace endure::agent {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "job-token-1234";

std::unique_ptr<PairTestServer> StartServer(const std::string& node,
                                            std::shared_ptr<const tls::Context> tls = nullptr) {
  PairTestServerOptions options;
  options.host = "127.0.0.1";
  options.token = kToken;
  options.node = node;
  options.tls = std::move(tls);
  Result<std::unique_ptr<PairTestServer>> server = PairTestServer::Start(options);
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(*server) : nullptr;
}

PairTestTarget Target(int port, const std::string& node) {
  PairTestTarget t;
  t.host = "127.0.0.1";
  t.port = port;
  t.token = kToken;
  t.node = node;
  return t;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Waits (at most 5 s) until `done` holds: the server records a client's
// failure on its own thread.
template <typename Pred>
bool Eventually(Pred done) {
  const Clock::time_point until = Clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// A blocking client socket connected to 127.0.0.1:port, reads bounded by 5 s.
int RawConnect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

// Sends `bytes` raw and returns the server's first line ("" when none came).
std::string RawExchange(int port, const std::string& bytes) {
  const int fd = RawConnect(port);
  EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
  std::string line;
  char c = 0;
  while (line.size() < 4096 && ::recv(fd, &c, 1, 0) == 1 && c != '\n') line.push_back(c);
  ::close(fd);
  return line;
}

std::string Frame(const std::string& json) {
  std::string f = "ENDPAIR1";
  const uint32_t len = static_cast<uint32_t>(json.size());
  for (int shift : {24, 16, 8, 0}) f.push_back(static_cast<char>((len >> shift) & 0xff));
  return f + json;
}

// A port that nothing listens on: bound, never listened on.
class UnusedPort {
 public:
  UnusedPort() : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~UnusedPort() { ::close(fd_); }
  int port() const { return port_; }
  // Listens without ever accepting: the kernel completes connections and
  // takes the client's bytes, and nobody answers.
  void Listen() { EXPECT_EQ(::listen(fd_, 4), 0); }

 private:
  int fd_;
  int port_ = 0;
};

TEST(PairTest, PassesBetweenTwoAgents) {
  std::unique_ptr<PairTestServer> a = StartServer("node-a");
  std::unique_ptr<PairTestServer> b = StartServer("node-b");
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->port(), 0);
  EXPECT_NE(a->port(), b->port());

  Result<PairOutcome> ab = RunPairTest(Target(b->port(), "node-a"), PairFault::None());
  ASSERT_TRUE(ab.ok()) << ab.status().ToString();
  EXPECT_TRUE(ab->ok) << ab->error;
  EXPECT_EQ(ab->error, "");
  EXPECT_GT(ab->seconds, 0);
  EXPECT_LT(ab->seconds, 5);

  Result<PairOutcome> ba = RunPairTest(Target(a->port(), "node-b"), PairFault::None());
  ASSERT_TRUE(ba.ok()) << ba.status().ToString();
  EXPECT_TRUE(ba->ok) << ba->error;
  EXPECT_EQ(a->served(), 1);
  EXPECT_EQ(b->served(), 1);
  EXPECT_EQ(a->errors() + b->errors(), 0);
  std::printf("pair test of 4 MiB: %.1f ms and %.1f ms\n", ab->seconds * 1e3, ba->seconds * 1e3);
}

TEST(PairTest, FailFaultOnTheServerFailsIt) {
  std::unique_ptr<PairTestServer> b = StartServer("node-b");
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->set_fault(PairFault::Fail()).ok());
  EXPECT_EQ(b->fault().kind, PairFault::Kind::kFail);
  Result<PairOutcome> r = RunPairTest(Target(b->port(), "node-a"), PairFault::None());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->ok);
  EXPECT_THAT(r->error, HasSubstr("injected comm-fail: node node-b's collectives fail"));
  EXPECT_THAT(r->error, HasSubstr("127.0.0.1:" + std::to_string(b->port())));
  EXPECT_EQ(b->served(), 0);
  EXPECT_EQ(b->errors(), 1);
  EXPECT_THAT(b->last_error(), HasSubstr("injected comm-fail"));

  // Cleared, the same server passes again.
  ASSERT_TRUE(b->set_fault(PairFault::None()).ok());
  Result<PairOutcome> again = RunPairTest(Target(b->port(), "node-a"), PairFault::None());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->ok) << again->error;
}

TEST(PairTest, FailFaultOnTheClientFailsIt) {
  std::unique_ptr<PairTestServer> b = StartServer("node-b");
  ASSERT_TRUE(b);
  Result<PairOutcome> r = RunPairTest(Target(b->port(), "node-a"), PairFault::Fail());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->ok);
  EXPECT_THAT(r->error, HasSubstr("injected comm-fail: node node-a's collectives fail"));
  // The server sees the connection break before the client's buffer.
  ASSERT_TRUE(Eventually([&] { return b->errors() == 1; }));
  EXPECT_THAT(b->last_error(), HasSubstr("connection closed after 0 of 4194304 bytes"));
  EXPECT_EQ(b->served(), 0);
}

// The median of three runs, to steady the clean figure on a shared machine.
double MedianSeconds(const PairTestTarget& target, PairFault local) {
  std::vector<double> s;
  for (int i = 0; i < 3; ++i) {
    Result<PairOutcome> r = RunPairTest(target, local);
    EXPECT_TRUE(r.ok() && r->ok) << (r.ok() ? r->error : r.status().ToString());
    s.push_back(r.ok() ? r->seconds : 0);
  }
  std::sort(s.begin(), s.end());
  return s[1];
}

TEST(PairTest, SlowFaultOnEitherSideMakesItSlower) {
  std::unique_ptr<PairTestServer> b = StartServer("node-b");
  ASSERT_TRUE(b);
  const PairTestTarget target = Target(b->port(), "node-a");
  const double clean = MedianSeconds(target, PairFault::None());

  ASSERT_TRUE(b->set_fault(PairFault::Slow(3)).ok());
  const double server_slow = MedianSeconds(target, PairFault::None());
  ASSERT_TRUE(b->set_fault(PairFault::None()).ok());
  const double client_slow = MedianSeconds(target, PairFault::Slow(3));
  std::printf("clean %.1f ms, server slow x3 %.1f ms, client slow x3 %.1f ms\n", clean * 1e3,
              server_slow * 1e3, client_slow * 1e3);
  EXPECT_GT(server_slow / clean, 1.5);
  EXPECT_GT(client_slow / clean, 1.5);
  // At least 50 ms x (3 - 1) was waited.
  EXPECT_GE(server_slow, 0.1);
  EXPECT_GE(client_slow, 0.1);
}

TEST(PairTest, WrongTokenIsRefused) {
  std::unique_ptr<PairTestServer> b = StartServer("node-b");
  ASSERT_TRUE(b);
  PairTestTarget target = Target(b->port(), "node-a");
  target.token = "not-the-token";
  Result<PairOutcome> r = RunPairTest(target, PairFault::None());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("wrong token"));
  EXPECT_EQ(b->errors(), 1);
  EXPECT_THAT(b->last_error(), HasSubstr("pair test from node-a"));
  EXPECT_EQ(b->served(), 0);
}

TEST(PairTest, HostileFramesAreRefusedWithAReason) {
  std::unique_ptr<PairTestServer> b = StartServer("node-b");
  ASSERT_TRUE(b);
  const std::string ok_json =
      std::string(R"({"token":")") + kToken + R"(","node":"node-a","bytes":)";
  const std::pair<std::string, std::string> cases[] = {
      {"GARBAGE!and more", "bad magic 'GARBAGE!'"},
      {std::string("ENDPAIR1\x00\x10\x00\x00", 12), "header of 1048576 bytes; the limit is 4096"},
      {std::string("ENDPAIR1\xff\xff\xff\xff", 12), "header of 4294967295 bytes"},
      {Frame("not json"), "not a JSON object"},
      {Frame(R"({"token":"x"})"), "lacks a valid 'node'"},
      {Frame(ok_json + "-4}"), "lacks a valid 'bytes'"},
      {Frame(ok_json + "134217728}"), "134217728 bytes exceeds the limit of 67108864"},
      {Frame(ok_json + "6}"), "positive multiple of 4"},
      {Frame(ok_json + "0}"), "positive multiple of 4"},
      {Frame(std::string(R"({"token":")") + kToken + R"(","node":"../etc","bytes":4})"), "'node'"},
  };
  int64_t errors = 0;
  for (const auto& [bytes, reason] : cases) {
    SCOPED_TRACE(reason);
    const std::string line = RawExchange(b->port(), bytes);
    EXPECT_THAT(line, StartsWith("ERR INVALID_ARGUMENT "));
    EXPECT_THAT(line, HasSubstr(reason));
    EXPECT_TRUE(Eventually([&] { return b->errors() == errors + 1; }));
    errors = b->errors();
  }
  // A header cut short: the server gives up after its idle limit or when
  // the client leaves; here the client leaves.
  const int fd = RawConnect(b->port());
  ASSERT_EQ(::send(fd, "ENDPAIR1\x00\x00", 10, MSG_NOSIGNAL), 10);
  ::close(fd);
  EXPECT_TRUE(Eventually([&] { return b->errors() == errors + 1; }));
  EXPECT_THAT(b->last_error(), HasSubstr("header length"));
  // And it still serves a good client.
  Result<PairOutcome> r = RunPairTest(Target(b->port(), "node-a"), PairFault::None());
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->ok) << r->error;
}

TEST(PairTest, ASilentPeerTimesOut) {
  UnusedPort silent;
  silent.Listen();
  PairTestTarget target = Target(silent.port(), "node-a");
  target.timeout = std::chrono::seconds(1);
  const Clock::time_point start = Clock::now();
  Result<PairOutcome> r = RunPairTest(target, PairFault::None());
  const double took = Seconds(start);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->ok);
  EXPECT_THAT(r->error, HasSubstr("timed out after 1.0s"));
  EXPECT_THAT(r->error, HasSubstr("the go-ahead"));
  EXPECT_GE(took, 0.99);
  EXPECT_LT(took, 2.0);
}

TEST(PairTest, APeerThatIsNotThereFailsFast) {
  UnusedPort closed;
  Result<PairOutcome> r = RunPairTest(Target(closed.port(), "node-a"), PairFault::None());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->ok);
  EXPECT_THAT(r->error, HasSubstr("Connection refused"));
  EXPECT_LT(r->seconds, 1.0);
}

TEST(PairTest, BadRequestsAreInvalidArguments) {
  const PairTestTarget good = Target(1234, "node-a");
  const auto code = [](const PairTestTarget& t, PairFault f = PairFault::None()) {
    return RunPairTest(t, f).status().code();
  };
  PairTestTarget t = good;
  t.bytes = 0;
  EXPECT_EQ(code(t), StatusCode::kInvalidArgument);
  t.bytes = 6;
  EXPECT_EQ(code(t), StatusCode::kInvalidArgument);
  t.bytes = kMaxPairTestBytes + 4;
  EXPECT_EQ(code(t), StatusCode::kInvalidArgument);
  t = good;
  t.node = "";
  EXPECT_EQ(code(t), StatusCode::kInvalidArgument);
  t = good;
  t.port = 0;
  EXPECT_EQ(code(t), StatusCode::kInvalidArgument);
  t = good;
  t.timeout = Duration::zero();
  EXPECT_EQ(code(t), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(good, PairFault::Slow(0.5)), StatusCode::kInvalidArgument);
  EXPECT_EQ(code(good, PairFault::Slow(1000)), StatusCode::kInvalidArgument);

  PairTestServerOptions options;
  options.node = "node-b";
  EXPECT_THAT(PairTestServer::Start(options).status().message(), HasSubstr("token"));
  options.token = kToken;
  options.max_bytes = kMaxPairTestBytes + 1;
  EXPECT_THAT(PairTestServer::Start(options).status().message(), HasSubstr("max_bytes"));
  options.max_bytes = 1 << 20;
  options.node = "bad/name";
  EXPECT_EQ(PairTestServer::Start(options).status().code(), StatusCode::kInvalidArgument);
}

TEST(PairTest, SetFaultRefusesABadFactorAndKeepsTheOldOne) {
  std::unique_ptr<PairTestServer> b = StartServer("node-b");
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->set_fault(PairFault::Slow(2.5)).ok());
  const Status st = b->set_fault(PairFault::Slow(1));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("(1, 100]"));
  EXPECT_EQ(b->fault().ToString(), "slow x2.5");
  EXPECT_EQ(PairFault::None().ToString(), "none");
  EXPECT_EQ(PairFault::Fail().ToString(), "fail");
  EXPECT_EQ(PairFault::Slow(3).ToString(), "slow x3");
}

TEST(PairTest, ServerStopsPromptlyWithAStalledClient) {
  std::unique_ptr<PairTestServer> b = StartServer("node-b");
  ASSERT_TRUE(b);
  const int fd = RawConnect(b->port());
  ASSERT_EQ(::send(fd, "ENDPA", 5, MSG_NOSIGNAL), 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the server is reading the magic
  const Clock::time_point start = Clock::now();
  b.reset();
  EXPECT_LT(Seconds(start), 1.0);
  ::close(fd);
}

TEST(PairTest, ServerStopsPromptlyDuringASlowDelay) {
  std::unique_ptr<PairTestServer> b = StartServer("node-b");
  ASSERT_TRUE(b);
  ASSERT_TRUE(b->set_fault(PairFault::Slow(100)).ok());  // waits >= 4.95 s before its buffer
  std::future<Result<PairOutcome>> client = std::async(std::launch::async, [port = b->port()] {
    return RunPairTest(Target(port, "node-a"), PairFault::None());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const Clock::time_point start = Clock::now();
  b.reset();
  EXPECT_LT(Seconds(start), 1.0);
  Result<PairOutcome> r = client.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->ok);
  EXPECT_LT(r->seconds, 3.0);
}

// Mutual TLS as on the replica link: both sides with the job's certificates
// pass; a client without TLS, or one whose frame names another node than its
// certificate, is refused.
TEST(PairTest, MutualTls) {
  testing_support::ScratchDir dir("pairtls");
  tls::CertRequest request;
  request.dir = dir.Path("certs");
  request.nodes = {"node-a", "node-b"};
  ASSERT_TRUE(tls::MakeCertificates(request).ok());
  Result<std::shared_ptr<const tls::Context>> a = tls::LoadContext(request.dir, "node-a");
  Result<std::shared_ptr<const tls::Context>> b = tls::LoadContext(request.dir, "node-b");
  ASSERT_TRUE(a.ok() && b.ok());
  std::unique_ptr<PairTestServer> server = StartServer("node-b", *b);
  ASSERT_TRUE(server);

  PairTestTarget target = Target(server->port(), "node-a");
  target.tls = *a;
  Result<PairOutcome> r = RunPairTest(target, PairFault::None());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->ok) << r->error;

  PairTestTarget plain = Target(server->port(), "node-a");
  Result<PairOutcome> refused = RunPairTest(plain, PairFault::None());
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("requires TLS"));

  PairTestTarget impostor = target;
  impostor.node = "node-c";
  Result<PairOutcome> wrong = RunPairTest(impostor, PairFault::None());
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("certificate is for node 'node-a'"));
  EXPECT_EQ(server->served(), 1);
}

}  // namespace
}  // namespace endure::agent
