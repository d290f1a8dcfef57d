// ParseDatagram, DatagramGate and LogRateLimiter: what the agent takes from
// its workers' socket, and what it refuses (with a reason, never a throw).
#include "core/datagram_gate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "checkpoint/snapshot_file.h"

namespace endure::core {
namespace {

using Json = nlohmann::json;
using contract::kMaxCount;
using contract::kMaxWorldSize;
using namespace std::chrono_literals;

const DatagramContext kContext{"/dev/shm/endure-42-node0/t0"};

// A datagram as the client library sends it (src/client/client.cc).
Json Envelope(const char* type) {
  return {{"type", type}, {"token", "c0ffee"}, {"generation", 3}, {"rank", 1}, {"t", 1.7e9}};
}

Result<Datagram> Parse(const Json& j) { return ParseDatagram(j.dump(), kContext); }

// The refusal of `j`, which must be refused.
std::string Refusal(const Json& j) {
  Result<Datagram> d = Parse(j);
  EXPECT_FALSE(d.ok()) << j.dump();
  if (d.ok()) return "";
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  return d.status().message();
}

TEST(ParseDatagram, ReadsAStepAsTheClientSendsIt) {
  Json j = Envelope("step");
  j.update({{"step", 12},
            {"loss", 2.5},
            {"compute_s", 0.05},
            {"comm_s", 0.01},
            {"ckpt_stall_s", 0.0},
            {"checkpoint_step", 10},
            {"tokens", 4096},
            {"total_steps", 500}});
  Result<Datagram> d = Parse(j);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->token, "c0ffee");
  EXPECT_EQ(d->generation, 3);
  EXPECT_EQ(d->rank, 1);
  EXPECT_EQ(d->time_s, 1.7e9);
  EXPECT_EQ(DatagramType(*d), "step");
  const auto& m = std::get<StepMessage>(d->message);
  EXPECT_FALSE(m.skipped);
  EXPECT_EQ(m.step, 12);
  EXPECT_EQ(m.loss, 2.5);
  EXPECT_EQ(m.tokens, 4096);
  EXPECT_EQ(m.total_steps, 500);
  EXPECT_DOUBLE_EQ(m.compute_s, 0.05);
  EXPECT_DOUBLE_EQ(m.comm_s, 0.01);
  EXPECT_EQ(m.checkpoint_step, 10);
}

TEST(ParseDatagram, ReadsEveryTypeTheClientSends) {
  Json ready = Envelope("ready");
  ready.update({{"start_step", 10}, {"restore_s", 0.2}, {"init_s", 1.5}, {"rejoin", true}});
  Json skip = Envelope("skip");
  skip.update({{"step", 7}, {"ckpt_stall_s", 0.0}, {"checkpoint_step", -1}});
  Json beat = Envelope("heartbeat");
  beat["step"] = -1;
  Json snapshot = Envelope("snapshot");
  snapshot.update({{"step", 9},
                   {"shard", 1},
                   {"shards", 2},
                   {"path", checkpoint::SlotPath(kContext.t0_dir, 1, 1)},
                   {"bytes", 100},
                   {"xxh3", "0123456789abcdef"}});
  Json fault = Envelope("fault");
  fault.update({{"id", "fault-3"}, {"kind", "kill-agent"}, {"step", 12}});
  Json stacks = Envelope("stacks");
  stacks["signal"] = 12;
  Json phase = Envelope("phase");
  phase.update({{"phase", "eval"}, {"step", 40}});
  Json early_phase = Envelope("phase");
  early_phase.update({{"phase", "data"}, {"step", -1}});
  Json fingerprint = Envelope("fingerprint");
  fingerprint.update({{"step", 40}, {"fingerprint", "0123456789abcdef"}});

  Result<Datagram> d = Parse(ready);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(std::get<ReadyMessage>(d->message).start_step, 10);
  EXPECT_DOUBLE_EQ(std::get<ReadyMessage>(d->message).init_s, 1.5);
  EXPECT_TRUE(std::get<ReadyMessage>(d->message).rejoin);
  d = Parse(skip);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(std::get<StepMessage>(d->message).skipped);
  EXPECT_FALSE(std::get<StepMessage>(d->message).loss.has_value());
  EXPECT_EQ(DatagramType(*d), "skip");
  d = Parse(beat);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(std::get<HeartbeatMessage>(d->message).step, -1);
  d = Parse(snapshot);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(std::get<SnapshotMessage>(d->message).step, 9);
  EXPECT_EQ(std::get<SnapshotMessage>(d->message).shards, 2);
  EXPECT_EQ(std::get<SnapshotMessage>(d->message).path,
            checkpoint::SlotPath(kContext.t0_dir, 1, 1));
  d = Parse(fault);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(std::get<FaultMessage>(d->message).id, "fault-3");
  EXPECT_EQ(std::get<FaultMessage>(d->message).kind, faults::FaultKind::kKillAgent);
  d = Parse(stacks);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(std::get<StacksMessage>(d->message).signal, 12);
  d = Parse(phase);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(DatagramType(*d), "phase");
  EXPECT_EQ(std::get<PhaseMessage>(d->message).name, "eval");
  EXPECT_EQ(std::get<PhaseMessage>(d->message).step, 40);
  d = Parse(early_phase);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(std::get<PhaseMessage>(d->message).name, "data");
  EXPECT_EQ(std::get<PhaseMessage>(d->message).step, -1);
  d = Parse(fingerprint);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(DatagramType(*d), "fingerprint");
  EXPECT_EQ(std::get<FingerprintMessage>(d->message).step, 40);
  EXPECT_EQ(std::get<FingerprintMessage>(d->message).fingerprint, "0123456789abcdef");
  // The new fault kinds the client fires travel like the others.
  for (const char* kind : {"bitflip", "comm-fail", "comm-slow"}) {
    Json f = Envelope("fault");
    f.update({{"id", "f9"}, {"kind", kind}, {"step", 3}});
    d = Parse(f);
    ASSERT_TRUE(d.ok()) << kind << ": " << d.status().ToString();
    EXPECT_EQ(faults::FaultKindName(std::get<FaultMessage>(d->message).kind), kind);
  }
}

TEST(ParseDatagram, LossIsANumberNanInfOrNone) {
  const std::pair<Json, std::optional<double>> cases[] = {
      {2.25, 2.25}, {-1, -1.0}, {"inf", INFINITY}, {"-inf", -INFINITY}, {nullptr, std::nullopt},
  };
  for (const auto& [loss, expected] : cases) {
    Json j = Envelope("step");
    j["step"] = 1;
    j["loss"] = loss;
    Result<Datagram> d = Parse(j);
    ASSERT_TRUE(d.ok()) << j.dump() << " " << d.status().ToString();
    EXPECT_EQ(std::get<StepMessage>(d->message).loss, expected) << j.dump();
  }
  Json nan = Envelope("step");
  nan.update({{"step", 1}, {"loss", "nan"}});
  Result<Datagram> d = Parse(nan);
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(std::isnan(*std::get<StepMessage>(d->message).loss));
  Json absent = Envelope("step");
  absent["step"] = 1;
  d = Parse(absent);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(std::get<StepMessage>(d->message).loss.has_value());
  // A loss the program did not mean is not taken for a NaN (a rollback).
  for (const Json& bad : {Json("abc"), Json("NaN"), Json(true), Json::array({1}), Json::object()}) {
    Json j = Envelope("step");
    j.update({{"step", 1}, {"loss", bad}});
    EXPECT_NE(Refusal(j).find("field 'loss'"), std::string::npos) << j.dump();
  }
}

TEST(ParseDatagram, RefusesMalformedInputWithAReasonAndNeverThrows) {
  const std::pair<std::string, const char*> raw[] = {
      {R"({"token":1})", "field 'type'"},
      {R"({"type":"step","token":1})", "field 'token'"},
      {"", "not a JSON object"},
      {"[1,2]", "not a JSON object"},
      {"{\"type\":\"step\"", "not a JSON object"},
      {"{\"type\":\"st\xe9p\"}", "not a JSON object"},  // not UTF-8
      {std::string(kMaxDatagramBytes + 1, ' '), "the limit is 65536"},
      {R"({"type":"step","x":[[[[[[1]]]]]]})", "nested more than 4"},
      {std::string(10000, '[') + std::string(10000, ']'), "nested more than 4"},
  };
  for (const auto& [bytes, reason] : raw) {
    Result<Datagram> d = ParseDatagram(bytes, kContext);
    ASSERT_FALSE(d.ok()) << bytes.substr(0, 80);
    EXPECT_NE(d.status().message().find(reason), std::string::npos)
        << reason << " in " << d.status().message();
  }
  struct Case {
    const char* type;
    const char* field;
    Json value;  // null: the field is removed
    const char* reason;
  };
  const Case cases[] = {
      {"step", "type", "bogus", "unknown datagram type 'bogus'"},
      {"step", "type", 7, "field 'type'"},
      {"step", "token", "", "field 'token'"},
      {"step", "token", std::string(300, 'x'), "field 'token'"},
      {"step", "generation", -1, "field 'generation'"},
      {"step", "generation", 1.5, "field 'generation'"},
      {"step", "generation", "3", "field 'generation'"},
      {"step", "generation", uint64_t{1} << 63, "field 'generation'"},
      {"step", "rank", nullptr,
       "field 'rank': expected an integer in [0, 1048575], but it is missing"},
      {"step", "rank", -1, "field 'rank'"},
      {"step", "rank", kMaxWorldSize, "field 'rank'"},
      {"step", "rank", "0", "field 'rank'"},
      {"step", "t", "now", "field 't'"},
      {"step", "t", -5, "field 't'"},
      {"step", "step", nullptr, "field 'step'"},
      {"step", "step", -1, "field 'step'"},
      {"step", "step", 1e300, "field 'step'"},
      {"step", "step", kMaxCount + 1, "field 'step'"},
      {"step", "compute_s", -0.5, "field 'compute_s'"},
      {"step", "compute_s", 1e30, "field 'compute_s'"},
      {"step", "comm_s", "fast", "field 'comm_s'"},
      {"step", "tokens", -3, "field 'tokens'"},
      {"step", "checkpoint_step", -2, "field 'checkpoint_step'"},
      {"ready", "start_step", -1, "field 'start_step'"},
      {"ready", "init_s", "1", "field 'init_s'"},
      {"ready", "rejoin", "yes", "field 'rejoin'"},
      {"ready", "rejoin", 1, "field 'rejoin'"},
      {"heartbeat", "step", -2, "field 'step'"},
      {"fault", "id", "../../x", "field 'id'"},
      {"fault", "id", std::string(129, 'a'), "field 'id'"},
      {"fault", "kind", "Kill;rm", "field 'kind'"},
      {"fault", "kind", "teleport", "field 'kind'"},  // well formed, but no kind
      {"fault", "step", "12", "field 'step'"},
      {"stacks", "signal", "SIGUSR1", "field 'signal'"},
      {"phase", "phase", nullptr, "field 'phase'"},
      {"phase", "phase", "", "field 'phase'"},
      {"phase", "phase", "Eval", "field 'phase'"},
      {"phase", "phase", "1st", "field 'phase'"},
      {"phase", "phase", "eval-loop", "field 'phase'"},
      {"phase", "phase", "eval\n", "field 'phase'"},
      {"phase", "phase", std::string(33, 'a'), "field 'phase'"},
      {"phase", "phase", 3, "field 'phase'"},
      {"phase", "step", nullptr, "field 'step'"},
      {"phase", "step", -2, "field 'step'"},
      {"phase", "step", 1.5, "field 'step'"},
      {"fingerprint", "step", 0, "field 'step'"},
      {"fingerprint", "step", nullptr, "field 'step'"},
      {"fingerprint", "fingerprint", nullptr, "field 'fingerprint'"},
      {"fingerprint", "fingerprint", "0123456789ABCDEF", "field 'fingerprint'"},
      {"fingerprint", "fingerprint", "0123456789abcde", "field 'fingerprint'"},
      {"fingerprint", "fingerprint", "0123456789abcdef0", "field 'fingerprint'"},
      {"fingerprint", "fingerprint", "0123456789abcdeg", "field 'fingerprint'"},
      {"fingerprint", "fingerprint", 81985529216486895, "field 'fingerprint'"},
      {"stacks", "signal", 1e10, "field 'signal'"},
      {"snapshot", "shards", 0, "field 'shards'"},
      {"snapshot", "shards", 1, "rank 1 of 1 shards"},
  };
  for (const Case& c : cases) {
    Json j = Envelope(c.type);
    j.update({{"step", 5},
              {"id", "f1"},
              {"kind", "kill"},
              {"signal", 10},
              {"phase", "eval"},
              {"fingerprint", "0123456789abcdef"},
              {"shards", 2},
              {"path", checkpoint::SlotPath(kContext.t0_dir, 1, 0)}});
    if (c.value.is_null()) {
      j.erase(c.field);
    } else {
      j[c.field] = c.value;
    }
    const std::string why = Refusal(j);
    EXPECT_NE(why.find(c.reason), std::string::npos) << c.reason << " in: " << why;
  }
}

TEST(ParseDatagram, ASnapshotPathMustBeOneOfTheSendersOwnSlots) {
  const std::string t0 = kContext.t0_dir;
  const std::string accepted[] = {
      checkpoint::SlotPath(t0, 1, 0),
      checkpoint::SlotPath(t0, 1, 1),
      checkpoint::SlotPath(t0, 1, checkpoint::kT0Slots - 1),
      t0 + "/./rank-1.slot-0",
      t0 + "/../t0/rank-1.slot-1",
  };
  for (const std::string& path : accepted) {
    Json j = Envelope("snapshot");
    j.update({{"step", 5}, {"shards", 2}, {"path", path}});
    EXPECT_TRUE(Parse(j).ok()) << path;
  }
  const std::string refused[] = {
      "/etc/passwd",
      t0 + "/../../../etc/passwd",
      checkpoint::SlotPath(t0, 0, 0),                     // another rank's slot
      checkpoint::SlotPath(t0, 1, checkpoint::kT0Slots),  // no such slot
      t0,
      "rank-1.slot-0",
      checkpoint::SlotPath(t0, 1, 0) + std::string("\0x", 2),
      std::string(5000, 'a'),
  };
  for (const std::string& path : refused) {
    Json j = Envelope("snapshot");
    j.update({{"step", 5}, {"shards", 2}, {"path", path}});
    EXPECT_NE(Refusal(j).find("field 'path'"), std::string::npos) << path.substr(0, 80);
  }
  // Without checkpoints there is no slot to name.
  Json j = Envelope("snapshot");
  j.update({{"step", 5}, {"shards", 2}, {"path", checkpoint::SlotPath(t0, 1, 0)}});
  Result<Datagram> d = ParseDatagram(j.dump(), DatagramContext{});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("checkpoints are off"), std::string::npos);
}

TEST(DatagramGate, AcceptsOnlyThisGenerationsCredentialFromALocalRank) {
  DatagramGate gate;
  gate.generation = 3;
  gate.credential = "4f3c9a0d5b6e7f8091a2b3c4d5e6f708";
  gate.local_ranks = {0, 1};
  Json j = Envelope("heartbeat");
  j["token"] = gate.credential;
  Result<Datagram> d = Parse(j);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(gate.Admit(*d), DatagramGate::Verdict::kAccept);
  // The job token, the previous generation's credential, a near miss.
  for (const char* token : {"the-job-token", "4f3c9a0d5b6e7f8091a2b3c4d5e6f709",
                            "4f3c9a0d5b6e7f8091a2b3c4d5e6f70", "x"}) {
    Datagram other = *d;
    other.token = token;
    EXPECT_EQ(gate.Admit(other), DatagramGate::Verdict::kBadCredential) << token;
  }
  Datagram stale = *d;
  stale.generation = 2;
  EXPECT_EQ(gate.Admit(stale), DatagramGate::Verdict::kStale);
  Datagram foreign = *d;
  foreign.rank = 5;
  EXPECT_EQ(gate.Admit(foreign), DatagramGate::Verdict::kForeignRank);
  // Before the first generation there is no credential to match.
  DatagramGate none;
  Datagram empty = *d;
  empty.generation = -1;
  empty.token = "";
  EXPECT_EQ(none.Admit(empty), DatagramGate::Verdict::kBadCredential);
}

TEST(LogRateLimiter, LetsABurstThroughThenOnePerIntervalAndCountsTheRest) {
  LogRateLimiter limiter(3, 1s);
  const auto t0 = LogRateLimiter::Clock::time_point() + 100s;
  int64_t held = -1;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limiter.Allow(t0, &held));
    EXPECT_EQ(held, 0);
  }
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(limiter.Allow(t0 + 1ms * i));
  EXPECT_EQ(limiter.held_back(), 1000);
  EXPECT_TRUE(limiter.Allow(t0 + 1s, &held));
  EXPECT_EQ(held, 1000);
  EXPECT_FALSE(limiter.Allow(t0 + 1500ms));
  EXPECT_TRUE(limiter.Allow(t0 + 2s, &held));
  EXPECT_EQ(held, 1);
  // A quiet spell refills the burst, no more.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Allow(t0 + 60s));
  EXPECT_FALSE(limiter.Allow(t0 + 60s));
}

}  // namespace
}  // namespace endure::core
