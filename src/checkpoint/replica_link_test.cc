// ReplicaServer and SendReplica over 127.0.0.1: intact delivery, every kind
// of refusal, hostile and stalled clients, and prompt shutdown; in plain TCP
// and in mutual TLS.
#include "checkpoint/replica_link.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <vector>

#include "common/hash.h"
#include "common/mutex.h"
#include "common/subprocess.h"
#include "common/tls.h"

namespace endure::checkpoint {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A loopback socket that listens but never accepts: a sender connects, and
// nothing ever answers. `port` is 0 when it could not be set up.
struct SilentListener {
  SilentListener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        ::listen(fd, 4) == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port = ntohs(addr.sin_port);
    }
  }
  ~SilentListener() {
    if (fd >= 0) ::close(fd);
  }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  int fd = -1;
  int port = 0;
};

constexpr Duration kTimeout = 30s;
constexpr char kToken[] = "job-42-token";

ReplicaHeader HeaderFor(std::string_view payload) {
  ReplicaHeader h;
  h.node = "node1";
  h.shard = 2;
  h.shards = 4;
  h.step = 120;
  h.bytes = payload.size();
  h.xxh3 = Xxh3(payload);
  return h;
}

// Magic, big-endian length and `json`: the start of a frame, for raw clients.
std::string FrameStart(const std::string& json) {
  std::string s = "ENDREPL1";
  const uint32_t len = static_cast<uint32_t>(json.size());
  for (int shift : {24, 16, 8, 0}) s.push_back(static_cast<char>((len >> shift) & 0xff));
  return s + json;
}

nlohmann::json HeaderJson(uint64_t bytes) {
  return {{"token", kToken}, {"node", "node9"},           {"shard", 0}, {"shards", 1}, {"step", 5},
          {"bytes", bytes},  {"xxh3", "0000000000000000"}};
}

// A blocking client that speaks whatever bytes the test gives it.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{10, 0};  // a broken server fails the test instead of hanging it
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawClient() { ::close(fd_); }

  bool connected() const { return connected_; }
  int fd() const { return fd_; }

  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // The next line without its '\n'; what came before EOF or an error otherwise.
  std::string ReadLine() {
    std::string line;
    char c = 0;
    while (::recv(fd_, &c, 1, 0) == 1 && c != '\n') line.push_back(c);
    return line;
  }

  // True when the server has closed the connection (EOF or reset).
  bool ClosedByServer() {
    char c = 0;
    const ssize_t n = ::recv(fd_, &c, 1, 0);
    return n == 0 || (n < 0 && errno == ECONNRESET);
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

struct Delivery {
  ReplicaHeader header;
  std::string payload;
};

class ReplicaLinkTest : public ::testing::Test {
 protected:
  void StartServer(uint64_t max_bytes = 64 << 20,
                   std::shared_ptr<const tls::Context> tls = nullptr) {
    auto server = ReplicaServer::Start(
        "127.0.0.1", 0, kToken, max_bytes,
        ReplicaServer::WholePayloads([this](const ReplicaHeader& h, std::string payload) {
          MutexLock lock(&mu_);
          deliveries_.push_back({h, std::move(payload)});
        }),
        std::move(tls));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }

  std::string Address() const { return "127.0.0.1:" + std::to_string(server_->port()); }

  size_t DeliveryCount() {
    MutexLock lock(&mu_);
    return deliveries_.size();
  }

  // Sends `payload` with a correct header and checks that the sink got it exactly.
  void ExpectDelivered(const std::string& payload,
                       std::shared_ptr<const tls::Context> tls = nullptr) {
    const size_t before = DeliveryCount();
    const ReplicaHeader h = HeaderFor(payload);
    const Status st = SendReplica(Address(), kToken, h, payload, kTimeout, -1, std::move(tls));
    ASSERT_TRUE(st.ok()) << st.ToString();
    // SendReplica returns after the acknowledgement, which follows the sink.
    MutexLock lock(&mu_);
    ASSERT_EQ(deliveries_.size(), before + 1);
    const Delivery& d = deliveries_.back();
    EXPECT_EQ(d.header.node, "node1");
    EXPECT_EQ(d.header.shard, 2);
    EXPECT_EQ(d.header.shards, 4);
    EXPECT_EQ(d.header.step, 120);
    EXPECT_EQ(d.header.bytes, payload.size());
    EXPECT_EQ(d.header.xxh3, h.xxh3);
    EXPECT_EQ(d.payload.size(), payload.size());
    EXPECT_TRUE(d.payload == payload) << "payload bytes differ";
  }

  Mutex mu_;
  std::vector<Delivery> deliveries_ GUARDED_BY(mu_);
  // Declared last so that it is destroyed first, while the sink's state lives.
  std::unique_ptr<ReplicaServer> server_;
};

TEST_F(ReplicaLinkTest, DeliversOneBytePayload) {
  StartServer();
  ExpectDelivered("x");
  EXPECT_EQ(server_->received(), 1);
  EXPECT_EQ(server_->errors(), 0);
  EXPECT_EQ(server_->last_error(), "");
}

TEST_F(ReplicaLinkTest, DeliversEmptyPayload) {
  StartServer();
  ExpectDelivered("");
  EXPECT_EQ(server_->received(), 1);
  EXPECT_EQ(server_->errors(), 0);
}

TEST_F(ReplicaLinkTest, DeliversTwentyMegabytePayload) {
  StartServer();
  std::mt19937_64 rng(20240611);  // fixed seed: the same bytes every run
  std::string payload(20 << 20, '\0');
  for (size_t i = 0; i + 8 <= payload.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(payload.data() + i, &v, 8);
  }
  ExpectDelivered(payload);
  ExpectDelivered("after the big one");
  EXPECT_EQ(server_->received(), 2);
  EXPECT_EQ(server_->errors(), 0);
}

TEST_F(ReplicaLinkTest, RefusesWrongToken) {
  StartServer();
  const std::string payload = "secret shard";
  const Status st = SendReplica(Address(), "other-job", HeaderFor(payload), payload, kTimeout);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("token"), std::string::npos) << st.message();
  EXPECT_EQ(DeliveryCount(), 0u);
  EXPECT_EQ(server_->received(), 0);
  EXPECT_EQ(server_->errors(), 1);
  EXPECT_NE(server_->last_error().find("wrong token"), std::string::npos) << server_->last_error();
  EXPECT_NE(server_->last_error().find("127.0.0.1"), std::string::npos) << server_->last_error();
}

TEST_F(ReplicaLinkTest, RefusesOversizePayload) {
  StartServer(/*max_bytes=*/1024);
  const std::string big(1025, 'b');
  const Status st = SendReplica(Address(), kToken, HeaderFor(big), big, kTimeout);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("exceeds"), std::string::npos) << st.message();
  EXPECT_EQ(DeliveryCount(), 0u);
  EXPECT_EQ(server_->errors(), 1);
  ExpectDelivered(std::string(1024, 'a'));  // exactly the limit is allowed
}

TEST_F(ReplicaLinkTest, RefusesChecksumMismatch) {
  StartServer();
  const std::string payload = "bytes that rotted in memory";
  ReplicaHeader h = HeaderFor(payload);
  h.xxh3 ^= 1;
  const Status st = SendReplica(Address(), kToken, h, payload, kTimeout);
  EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.ToString();
  EXPECT_NE(st.message().find("checksum mismatch"), std::string::npos) << st.message();
  EXPECT_EQ(DeliveryCount(), 0u);
  EXPECT_EQ(server_->received(), 0);
  EXPECT_EQ(server_->errors(), 1);
}

TEST_F(ReplicaLinkTest, SurvivesGarbageThenServesTheNextFrame) {
  StartServer();
  {
    RawClient raw(server_->port());
    ASSERT_TRUE(raw.connected());
    ASSERT_TRUE(raw.Send("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    // The server closes with the rest of the request unread, so the kernel
    // may reset the connection before the refusal can be read.
    const std::string reply = raw.ReadLine();
    EXPECT_TRUE(reply.empty() || reply.rfind("ERR INVALID_ARGUMENT bad magic", 0) == 0) << reply;
    EXPECT_TRUE(raw.ClosedByServer());
  }
  ExpectDelivered("good frame");
  EXPECT_EQ(server_->errors(), 1);
  EXPECT_NE(server_->last_error().find("bad magic"), std::string::npos) << server_->last_error();
  EXPECT_EQ(server_->received(), 1);
}

TEST_F(ReplicaLinkTest, SurvivesTruncatedPayloadThenServesTheNextFrame) {
  StartServer();
  {
    RawClient raw(server_->port());
    ASSERT_TRUE(raw.connected());
    ASSERT_TRUE(raw.Send(FrameStart(HeaderJson(1000).dump())));
    ASSERT_EQ(raw.ReadLine(), "GO");
    ASSERT_TRUE(raw.Send(std::string(10, 'p')));
  }  // closes with 990 bytes missing
  // The server serves connections in order, so the truncated one is done
  // when this one is acknowledged.
  ExpectDelivered("good frame");
  EXPECT_EQ(server_->errors(), 1);
  EXPECT_NE(server_->last_error().find("10 of 1000 bytes of the payload"), std::string::npos)
      << server_->last_error();
  EXPECT_EQ(DeliveryCount(), 1u);
}

TEST_F(ReplicaLinkTest, RefusesMalformedHeaders) {
  StartServer();
  nlohmann::json no_node = HeaderJson(1);
  no_node.erase("node");
  nlohmann::json bad_shard = HeaderJson(1);
  bad_shard["shard"] = 1;  // of 1 shard
  nlohmann::json bad_xxh3 = HeaderJson(1);
  bad_xxh3["xxh3"] = "not-hex";
  nlohmann::json step_as_string = HeaderJson(1);
  step_as_string["step"] = "5";
  std::string too_long = "ENDREPL1";
  too_long += std::string("\x00\x10\x00\x00", 4);  // 1 MiB of header announced
  const std::vector<std::pair<std::string, std::string>> cases = {
      {too_long, "frame header of 1048576 bytes"},
      {FrameStart("{not json"), "not a JSON object"},
      {FrameStart(no_node.dump()), "'node'"},
      {FrameStart(bad_shard.dump()), "shard 1 of 1"},
      {FrameStart(bad_xxh3.dump()), "16 hex digits"},
      {FrameStart(step_as_string.dump()), "'step'"},
  };
  for (const auto& [frame, reason] : cases) {
    RawClient raw(server_->port());
    ASSERT_TRUE(raw.connected());
    ASSERT_TRUE(raw.Send(frame));
    const std::string reply = raw.ReadLine();
    EXPECT_EQ(reply.rfind("ERR INVALID_ARGUMENT ", 0), 0u) << reply;
    EXPECT_NE(reply.find(reason), std::string::npos) << reply;
  }
  EXPECT_EQ(server_->errors(), static_cast<int64_t>(cases.size()));
  EXPECT_EQ(DeliveryCount(), 0u);
  ExpectDelivered("still serving");
}

TEST_F(ReplicaLinkTest, NoListenerIsUnavailableQuickly) {
  Result<int> port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  const auto start = Clock::now();
  const Status st =
      SendReplica("127.0.0.1:" + std::to_string(*port), kToken, HeaderFor("x"), "x", kTimeout);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("refused"), std::string::npos) << st.message();
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST_F(ReplicaLinkTest, TimesOutWhenTheReceiverNeverAnswers) {
  // The kernel completes the connection and buffers the header, and no
  // reply ever comes.
  SilentListener silent;
  ASSERT_GT(silent.port, 0);
  const auto start = Clock::now();
  const Status st =
      SendReplica("127.0.0.1:" + std::to_string(silent.port), kToken, HeaderFor("x"), "x", 300ms);
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("timed out after"), std::string::npos) << st.message();
  EXPECT_GE(elapsed, 300ms);
  EXPECT_LT(elapsed, 5s);
}

TEST_F(ReplicaLinkTest, DestructorReturnsPromptlyWithAnIdleConnection) {
  StartServer();
  RawClient raw(server_->port());
  ASSERT_TRUE(raw.connected());
  ASSERT_TRUE(raw.Send(FrameStart(HeaderJson(1000).dump())));
  ASSERT_EQ(raw.ReadLine(), "GO");  // the server now waits for a payload that never comes
  const auto start = Clock::now();
  server_.reset();
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_EQ(raw.ReadLine().rfind("ERR UNAVAILABLE", 0), 0u);
  EXPECT_TRUE(raw.ClosedByServer());
  EXPECT_EQ(DeliveryCount(), 0u);
}

TEST_F(ReplicaLinkTest, DestructorReturnsPromptlyWithAnUnservedConnection) {
  StartServer();
  RawClient raw(server_->port());
  ASSERT_TRUE(raw.connected());
  const auto start = Clock::now();
  server_.reset();
  EXPECT_LT(Clock::now() - start, 2s);
  // Served and cut off, or reset while still queued: either way, closed.
  const std::string reply = raw.ReadLine();
  EXPECT_TRUE(reply.empty() || reply.rfind("ERR UNAVAILABLE", 0) == 0) << reply;
  EXPECT_TRUE(raw.ClosedByServer());
}

TEST(ReplicaLink, RefusesBadArguments) {
  const std::string payload = "abc";
  ReplicaHeader h = HeaderFor(payload);
  h.bytes = 4;
  EXPECT_EQ(SendReplica("127.0.0.1:1", kToken, h, payload, kTimeout).code(),
            StatusCode::kInvalidArgument);
  for (const char* address : {"127.0.0.1", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:70000"}) {
    EXPECT_EQ(SendReplica(address, kToken, HeaderFor(payload), payload, kTimeout).code(),
              StatusCode::kInvalidArgument)
        << address;
  }
  auto no_sink = ReplicaServer::Start("127.0.0.1", 0, kToken, 1024, nullptr);
  EXPECT_EQ(no_sink.status().code(), StatusCode::kInvalidArgument);
}

TEST(ReplicaLink, StartFailsOnAPortInUse) {
  auto sink = ReplicaServer::WholePayloads([](const ReplicaHeader&, std::string) {});
  auto first = ReplicaServer::Start("127.0.0.1", 0, kToken, 1024, sink);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = ReplicaServer::Start("127.0.0.1", (*first)->port(), kToken, 1024, sink);
  EXPECT_EQ(second.status().code(), StatusCode::kIOError);
  EXPECT_NE(second.status().message().find("127.0.0.1:"), std::string::npos)
      << second.status().message();
}

TEST(ReplicaFrame, EncodeDecodeRoundTrip) {
  const ReplicaHeader h = HeaderFor("payload");
  Result<std::string> frame = EncodeReplicaFrame(kToken, h);
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  EXPECT_EQ(frame->substr(0, 8), "ENDREPL1");
  Result<ReplicaFrame> back = DecodeReplicaFrame(*frame);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->token, kToken);
  EXPECT_EQ(back->header.node, h.node);
  EXPECT_EQ(back->header.shard, h.shard);
  EXPECT_EQ(back->header.shards, h.shards);
  EXPECT_EQ(back->header.step, h.step);
  EXPECT_EQ(back->header.bytes, h.bytes);
  EXPECT_EQ(back->header.xxh3, h.xxh3);
}

TEST(ReplicaFrame, DecodeRefusesWhatTheReceiverRefuses) {
  const std::string json = HeaderJson(3).dump();
  ASSERT_TRUE(DecodeReplicaFrame(FrameStart(json)).ok());
  const std::pair<std::string, const char*> cases[] = {
      {"", "bad magic"},
      {"ENDREPL2" + FrameStart(json).substr(8), "bad magic"},
      {"ENDREPL1\x00\x00", "truncated frame"},
      {FrameStart(json).substr(0, 20), "announces a header of"},
      {FrameStart(json) + " ", "announces a header of"},
      {"ENDREPL1" + std::string("\x00\x10\x00\x00", 4), "frame header of 1048576 bytes"},
      {FrameStart("[]"), "not a JSON object"},
      {FrameStart(R"({"token":1})"), "lacks a valid 'token'"},
  };
  for (const auto& [bytes, expected] : cases) {
    Result<ReplicaFrame> f = DecodeReplicaFrame(bytes);
    ASSERT_FALSE(f.ok()) << expected;
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find(expected), std::string::npos) << f.status().message();
  }
}

// ---- Hostile frames (issue 9) ----

// Peak resident memory of this process (VmHWM), in bytes.
uint64_t PeakResidentBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

TEST_F(ReplicaLinkTest, RefusesANodeNameThatWouldLeaveTheReplicaDirectory) {
  StartServer();
  for (const char* node : {"../../../tmp/evil", "..", ".", "a/b", "/etc/cron.d/x", ""}) {
    nlohmann::json j = HeaderJson(1);
    j["node"] = node;
    RawClient raw(server_->port());
    ASSERT_TRUE(raw.connected());
    ASSERT_TRUE(raw.Send(FrameStart(j.dump())));
    const std::string reply = raw.ReadLine();
    EXPECT_EQ(reply.rfind("ERR INVALID_ARGUMENT ", 0), 0u) << node << ": " << reply;
    EXPECT_NE(reply.find("is not a valid node name"), std::string::npos) << reply;
    EXPECT_FALSE(DecodeReplicaFrame(FrameStart(j.dump())).ok()) << node;
  }
  EXPECT_EQ(DeliveryCount(), 0u);
  ExpectDelivered("still serving");
}

TEST_F(ReplicaLinkTest, AClaimedSizeIsNeitherAllocatedNorZeroFilledBeforeItsBytesArrive) {
  // A frame within the limit that claims 2 GiB and sends 1 KiB: the receiver
  // commits memory for what arrived, not for the claim.
  const uint64_t claimed = uint64_t{2} << 30;
  StartServer(/*max_bytes=*/uint64_t{4} << 30);
  const uint64_t before = PeakResidentBytes();
  {
    RawClient raw(server_->port());
    ASSERT_TRUE(raw.connected());
    ASSERT_TRUE(raw.Send(FrameStart(HeaderJson(claimed).dump())));
    ASSERT_EQ(raw.ReadLine(), "GO");
    ASSERT_TRUE(raw.Send(std::string(1024, 'x')));
  }  // closed: the payload is truncated
  for (int i = 0; i < 500 && server_->errors() == 0; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(server_->errors(), 1);
  EXPECT_NE(server_->last_error().find("connection closed after 1024 of"), std::string::npos)
      << server_->last_error();
  EXPECT_LT(PeakResidentBytes() - before, uint64_t{256} << 20);
  EXPECT_EQ(DeliveryCount(), 0u);
}

// A target that records what it was given and whether it was committed.
struct Recorded {
  Mutex mu;
  std::string bytes;
  int writes = 0;
  int commits = 0;
  int dropped = 0;  // destroyed without a commit
};

class RecordingTarget : public ReplicaTarget {
 public:
  explicit RecordingTarget(Recorded* r) : r_(r) {}
  ~RecordingTarget() override {
    MutexLock lock(&r_->mu);
    if (!committed_) ++r_->dropped;
  }
  Status Write(std::string_view chunk) override {
    MutexLock lock(&r_->mu);
    r_->bytes.append(chunk);
    ++r_->writes;
    return Status::Ok();
  }
  Status Commit() override {
    MutexLock lock(&r_->mu);
    committed_ = true;
    ++r_->commits;
    return Status::Ok();
  }

 private:
  Recorded* r_;
  bool committed_ = false;
};

TEST(ReplicaLink, APayloadStreamsIntoItsTargetInChunksAndIsCommittedOnlyWhenItsChecksumMatches) {
  Recorded recorded;
  auto server =
      ReplicaServer::Start("127.0.0.1", 0, kToken, 64 << 20,
                           [&](const ReplicaHeader&) -> Result<std::unique_ptr<ReplicaTarget>> {
                             return std::unique_ptr<ReplicaTarget>(new RecordingTarget(&recorded));
                           });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  std::string payload(5 << 20, '\0');
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<char>(i * 7 + i / 4096);
  ASSERT_TRUE(SendReplica(address, kToken, HeaderFor(payload), payload, kTimeout).ok());
  {
    MutexLock lock(&recorded.mu);
    EXPECT_TRUE(recorded.bytes == payload);
    EXPECT_GT(recorded.writes, 1) << "the payload came in one piece, not streamed";
    EXPECT_EQ(recorded.commits, 1);
    EXPECT_EQ(recorded.dropped, 0);
    recorded.bytes.clear();
  }
  ReplicaHeader wrong = HeaderFor(payload);
  wrong.xxh3 ^= 1;
  EXPECT_EQ(SendReplica(address, kToken, wrong, payload, kTimeout).code(), StatusCode::kDataLoss);
  MutexLock lock(&recorded.mu);
  EXPECT_EQ(recorded.commits, 1);
  EXPECT_EQ(recorded.dropped, 1);
}

TEST(ReplicaLink, ASinkThatRefusesAReplicaIsHeardByTheSenderBeforeThePayloadIsSent) {
  auto server =
      ReplicaServer::Start("127.0.0.1", 0, kToken, 64 << 20,
                           [](const ReplicaHeader& h) -> Result<std::unique_ptr<ReplicaTarget>> {
                             return Unavailable("replica of " + std::to_string(h.bytes) +
                                                " bytes would exceed the memory budget");
                           });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*server)->port());
  const std::string payload(1 << 20, 'x');
  const Status st = SendReplica(address, kToken, HeaderFor(payload), payload, kTimeout);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("would exceed the memory budget"), std::string::npos) << st.message();
  EXPECT_EQ((*server)->received(), 0);
}

TEST_F(ReplicaLinkTest, ANewLimitAppliesToTheNextFrame) {
  StartServer();
  server_->set_max_bytes(8);
  EXPECT_EQ(server_->max_bytes(), 8u);
  const std::string payload = "more than eight bytes";
  const Status st = SendReplica(Address(), kToken, HeaderFor(payload), payload, kTimeout);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("exceeds this agent's limit of 8"), std::string::npos)
      << st.message();
  server_->set_max_bytes(0);  // ignored: a limit is positive
  EXPECT_EQ(server_->max_bytes(), 8u);
  ExpectDelivered("eight b");
}

TEST(ReplicaLink, ASenderStopsAtOnceWhenCancelled) {
  // A listener that never answers; the cancel descriptor is already readable.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  int cancel[2];
  ASSERT_EQ(::pipe(cancel), 0);
  ASSERT_EQ(::write(cancel[1], "x", 1), 1);
  const auto start = Clock::now();
  const Status st = SendReplica("127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), kToken,
                                HeaderFor("x"), "x", 30s, cancel[0]);
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  ::close(cancel[0]);
  ::close(cancel[1]);
  ::close(fd);
}

// ---- Mutual TLS ----

// A job's certificates (controller, node0, node1) and another job's, in a
// directory of the test's own; the server is node0 and the senders node1
// (HeaderFor names node1).
class TlsReplicaLinkTest : public ReplicaLinkTest {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/replica_tlsXXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    for (const char* job : {"job", "other"}) {
      tls::CertRequest r;
      r.dir = root_ + "/" + job;
      r.nodes = {"node0", "node1"};
      const Status st = tls::MakeCertificates(r);
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    server_tls_ = Load("job", "node0");
    sender_tls_ = Load("job", "node1");
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(root_);
  }

  std::shared_ptr<const tls::Context> Load(const std::string& job, const std::string& name) {
    Result<tls::Identity> id = tls::LoadIdentity(root_ + "/" + job, name);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    if (!id.ok()) return nullptr;
    return Make(*id);
  }
  static std::shared_ptr<const tls::Context> Make(const tls::Identity& id) {
    Result<std::shared_ptr<const tls::Context>> ctx = tls::Context::Make(id);
    EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
    return ctx.ok() ? *ctx : nullptr;
  }

  void StartTlsServer() { StartServer(64 << 20, server_tls_); }

  Status Send(const std::string& payload, std::shared_ptr<const tls::Context> tls,
              Duration timeout = kTimeout) {
    return SendReplica(Address(), kToken, HeaderFor(payload), payload, timeout, -1, std::move(tls));
  }

  std::string root_;
  std::shared_ptr<const tls::Context> server_tls_;
  std::shared_ptr<const tls::Context> sender_tls_;
};

TEST_F(TlsReplicaLinkTest, DeliversReplicasIntact) {
  StartTlsServer();
  EXPECT_TRUE(server_->uses_tls());
  std::mt19937_64 rng(7);              // fixed seed: the same bytes every run
  std::string payload(9 << 20, '\0');  // several payload chunks and many TLS records
  for (size_t i = 0; i + 8 <= payload.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(payload.data() + i, &v, 8);
  }
  ExpectDelivered(payload, sender_tls_);
  ExpectDelivered("", sender_tls_);
  ExpectDelivered("x", sender_tls_);
  EXPECT_EQ(server_->received(), 3);
  EXPECT_EQ(server_->errors(), 0);
  EXPECT_EQ(server_->last_error(), "");
}

TEST_F(TlsReplicaLinkTest, TheTokenIsStillChecked) {
  StartTlsServer();
  const std::string payload = "p";
  const Status st =
      SendReplica(Address(), "other-job", HeaderFor(payload), payload, kTimeout, -1, sender_tls_);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("wrong token"), std::string::npos) << st.message();
  EXPECT_EQ(DeliveryCount(), 0u);
}

TEST_F(TlsReplicaLinkTest, RefusesASenderCertificateFromAnotherCa) {
  StartTlsServer();
  // It trusts this job's CA (so it accepts the receiver) but presents a
  // certificate that another CA signed: the receiver must refuse it.
  Result<tls::Identity> foreign = tls::LoadIdentity(root_ + "/other", "node1");
  ASSERT_TRUE(foreign.ok()) << foreign.status().ToString();
  Result<tls::Identity> ours = tls::LoadIdentity(root_ + "/job", "node1");
  ASSERT_TRUE(ours.ok());
  foreign->ca_pem = ours->ca_pem;
  const auto start = Clock::now();
  const Status st = Send("stolen shard", Make(*foreign));
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("TLS"), std::string::npos) << st.message();
  EXPECT_EQ(DeliveryCount(), 0u);
  // The refusal (a TLS alert) leaves before the receiver counts it; once the
  // next connection is served, it has been counted.
  ExpectDelivered("still serving", sender_tls_);
  EXPECT_EQ(server_->received(), 1);
  EXPECT_EQ(server_->errors(), 1);
  EXPECT_NE(server_->last_error().find("certificate verify failed"), std::string::npos)
      << server_->last_error();
}

TEST_F(TlsReplicaLinkTest, ASenderOfAnotherJobRefusesTheReceiver) {
  StartTlsServer();
  const Status st = Send("shard", Load("other", "node1"));
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("not from this job's CA"), std::string::npos) << st.message();
  EXPECT_EQ(DeliveryCount(), 0u);
  // The sender gave up first; the receiver has counted it once the next
  // connection is served.
  ExpectDelivered("still serving", sender_tls_);
  EXPECT_EQ(server_->errors(), 1);
}

TEST_F(TlsReplicaLinkTest, RefusesAPlainSenderWithinItsDeadline) {
  StartTlsServer();
  const auto start = Clock::now();
  const Status st = Send("plain shard", nullptr, 5s);
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("requires TLS"), std::string::npos) << st.message();
  EXPECT_EQ(DeliveryCount(), 0u);
  EXPECT_EQ(server_->errors(), 1);
  EXPECT_NE(server_->last_error().find("requires TLS"), std::string::npos) << server_->last_error();
  ExpectDelivered("still serving", sender_tls_);
}

// A TLS client that trusts `ca_pem` and presents no certificate; sends
// `frame` and returns the first line of the reply, "" when the session fails.
std::string SendWithoutCertificate(int port, const std::string& ca_pem, const std::string& frame) {
  ::signal(SIGPIPE, SIG_IGN);  // OpenSSL's own socket BIO writes with write(2)
  RawClient raw(port);
  std::string line;
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  BIO* bio = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
  X509* ca = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), ca);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, raw.fd());
  if (SSL_connect(ssl) == 1 && SSL_write(ssl, frame.data(), static_cast<int>(frame.size())) > 0) {
    char c = 0;
    while (SSL_read(ssl, &c, 1) == 1 && c != '\n') line.push_back(c);
  }
  SSL_free(ssl);
  X509_free(ca);
  BIO_free(bio);
  SSL_CTX_free(ctx);
  return line;
}

TEST_F(TlsReplicaLinkTest, RefusesATlsSenderWithoutACertificate) {
  StartTlsServer();
  Result<tls::Identity> ours = tls::LoadIdentity(root_ + "/job", "node1");
  ASSERT_TRUE(ours.ok());
  nlohmann::json j = HeaderJson(1);
  j["node"] = "node1";
  EXPECT_EQ(SendWithoutCertificate(server_->port(), ours->ca_pem, FrameStart(j.dump())), "");
  EXPECT_EQ(DeliveryCount(), 0u);
  ExpectDelivered("still serving", sender_tls_);
  EXPECT_EQ(server_->errors(), 1);
  EXPECT_NE(server_->last_error().find("TLS handshake"), std::string::npos)
      << server_->last_error();
}

TEST_F(TlsReplicaLinkTest, RefusesAFrameForAnotherNodeThanTheCertificate) {
  StartTlsServer();
  // node0's certificate, a frame that says node1 (HeaderFor).
  const Status st = Send("planted shard", Load("job", "node0"));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("'node1'"), std::string::npos) << st.message();
  EXPECT_EQ(DeliveryCount(), 0u);
  EXPECT_EQ(server_->errors(), 1);
  const std::string error = server_->last_error();
  EXPECT_NE(error.find("the frame names node 'node1', but the sender's certificate is for node "
                       "'node0'"),
            std::string::npos)
      << error;
  ExpectDelivered("still serving", sender_tls_);
}

TEST_F(TlsReplicaLinkTest, ATlsSenderToAPlainReceiverFailsWithinItsDeadline) {
  StartServer();  // no TLS
  const auto start = Clock::now();
  const Status st = Send("shard", sender_tls_, 5s);
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("TLS"), std::string::npos) << st.message();
  EXPECT_EQ(DeliveryCount(), 0u);
  ExpectDelivered("still serving");  // in plain TCP: after it, the refusal is counted
  EXPECT_EQ(server_->errors(), 1);
  EXPECT_NE(server_->last_error().find("opened a TLS handshake"), std::string::npos)
      << server_->last_error();
}

TEST_F(TlsReplicaLinkTest, AHandshakeWithASilentReceiverTimesOut) {
  // The ClientHello is buffered and never answered.
  SilentListener silent;
  ASSERT_GT(silent.port, 0);
  const auto start = Clock::now();
  const Status st = SendReplica("127.0.0.1:" + std::to_string(silent.port), kToken, HeaderFor("x"),
                                "x", 300ms, -1, sender_tls_);
  const auto elapsed = Clock::now() - start;
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("timed out after"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("TLS handshake"), std::string::npos) << st.message();
  EXPECT_GE(elapsed, 300ms);
  EXPECT_LT(elapsed, 5s);
}

TEST_F(TlsReplicaLinkTest, DestructorCutsOffAStalledHandshakePromptly) {
  StartTlsServer();
  RawClient raw(server_->port());
  ASSERT_TRUE(raw.connected());
  // A handshake record header that announces 255 bytes, and nothing more.
  ASSERT_TRUE(raw.Send(std::string("\x16\x03\x01\x00\xff", 5)));
  std::this_thread::sleep_for(100ms);  // the server is now inside the handshake
  const auto start = Clock::now();
  server_.reset();
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_TRUE(raw.ClosedByServer());
  EXPECT_EQ(DeliveryCount(), 0u);
}

}  // namespace
}  // namespace endure::checkpoint
