// The worker contract: what the client library writes is what the agent
// reads back, field for field, at the bounds; what is out of bounds is
// refused with the field's name; the validators the controller applies
// again are the same ones.
#include "contract/worker_contract.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "checkpoint/snapshot_file.h"

namespace endure::contract {
namespace {

const DatagramContext kContext{"/dev/shm/endure-42-node0/t0"};

Datagram From(int rank, DatagramMessage message) {
  Datagram d;
  d.token = "c0ffee";
  d.generation = 3;
  d.rank = rank;
  d.time_s = 1.7e9;
  d.message = std::move(message);
  return d;
}

// Encodes `d`, parses it back, and expects the same datagram.
void ExpectRoundTrip(const Datagram& d) {
  const std::string bytes = EncodeDatagram(d);
  Result<Datagram> back = ParseDatagram(bytes, kContext);
  ASSERT_TRUE(back.ok()) << bytes << ": " << back.status().ToString();
  EXPECT_EQ(back->token, d.token);
  EXPECT_EQ(back->generation, d.generation);
  EXPECT_EQ(back->rank, d.rank);
  EXPECT_EQ(back->time_s, d.time_s);
  EXPECT_EQ(DatagramType(*back), DatagramType(d)) << bytes;
  ASSERT_EQ(back->message.index(), d.message.index()) << bytes;
}

TEST(WorkerContract, EveryMessageReadsBackAsItWasWritten) {
  ReadyMessage ready{kMaxCount, 0.25, kMaxSeconds, true, true};
  Datagram d = From(1, ready);
  ExpectRoundTrip(d);
  Result<Datagram> back = ParseDatagram(EncodeDatagram(d), kContext);
  ASSERT_TRUE(back.ok());
  const auto& r = std::get<ReadyMessage>(back->message);
  EXPECT_EQ(r.start_step, kMaxCount);
  EXPECT_EQ(r.restore_s, 0.25);
  EXPECT_EQ(r.init_s, kMaxSeconds);
  EXPECT_TRUE(r.rejoin);
  EXPECT_TRUE(r.deterministic);
  EXPECT_FALSE(r.start_step_unknown);
  EXPECT_FALSE(r.rejoin_from_tiers);

  ReadyMessage sharded;
  sharded.rejoin = sharded.rejoin_from_tiers = true;
  back = ParseDatagram(EncodeDatagram(From(1, sharded)), kContext);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(std::get<ReadyMessage>(back->message).rejoin_from_tiers);
  // Restoring from the tiers after a rejoin says nothing of a worker that
  // does not rejoin: a contradiction, refused.
  std::string bytes = EncodeDatagram(From(1, sharded));
  const size_t at = bytes.find("\"rejoin\":true");
  ASSERT_NE(at, std::string::npos) << bytes;
  bytes.replace(at, 13, "\"rejoin\":false");
  EXPECT_FALSE(ParseDatagram(bytes, kContext).ok()) << bytes;

  ReadyMessage unknown;
  unknown.start_step_unknown = true;
  back = ParseDatagram(EncodeDatagram(From(1, unknown)), kContext);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(std::get<ReadyMessage>(back->message).start_step_unknown);
  EXPECT_EQ(std::get<ReadyMessage>(back->message).start_step, 0);

  StepMessage step;
  step.step = 12;
  step.loss = 2.375;
  step.tokens = 4096;
  step.total_steps = kMaxCount;
  step.compute_s = 0.125;
  step.comm_s = 0.0625;
  step.ckpt_stall_s = 0.5;
  step.checkpoint_step = 12;
  back = ParseDatagram(EncodeDatagram(From(1, step)), kContext);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  const auto& s = std::get<StepMessage>(back->message);
  EXPECT_FALSE(s.skipped);
  EXPECT_EQ(s.step, 12);
  EXPECT_EQ(s.loss, 2.375);
  EXPECT_EQ(s.tokens, 4096);
  EXPECT_EQ(s.total_steps, kMaxCount);
  EXPECT_EQ(s.compute_s, 0.125);
  EXPECT_EQ(s.comm_s, 0.0625);
  EXPECT_EQ(s.ckpt_stall_s, 0.5);
  EXPECT_EQ(s.checkpoint_step, 12);

  StepMessage skip;
  skip.skipped = true;
  skip.step = 7;
  skip.loss = 1.0;  // a skipped step carries none
  back = ParseDatagram(EncodeDatagram(From(1, skip)), kContext);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(std::get<StepMessage>(back->message).skipped);
  EXPECT_FALSE(std::get<StepMessage>(back->message).loss.has_value());

  const std::string slot = checkpoint::SlotPath(kContext.t0_dir, 1, checkpoint::kT0Slots - 1);
  const std::vector<Datagram> others = {
      From(0, HeartbeatMessage{-1}),
      From(kMaxWorldSize - 1, HeartbeatMessage{kMaxCount}),
      From(1, SnapshotMessage{9, 2, slot, 5 << 20, "0123456789abcdef"}),
      From(1, FaultMessage{"fault-3:a.b_c", faults::FaultKind::kCommSlow, 12}),
      From(1, StacksMessage{12}),
      From(1, PhaseMessage{"eval", -1}),
      From(1, PhaseMessage{"a_31_characters_long_phase_name", 40}),
      From(1, FingerprintMessage{1, "0123456789abcdef"}),
  };
  for (const Datagram& o : others) ExpectRoundTrip(o);
  back = ParseDatagram(EncodeDatagram(others[2]), kContext);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::get<SnapshotMessage>(back->message).path, slot);
  EXPECT_EQ(std::get<SnapshotMessage>(back->message).shards, 2);
  EXPECT_EQ(std::get<SnapshotMessage>(back->message).bytes, 5 << 20);
  EXPECT_EQ(std::get<SnapshotMessage>(back->message).xxh3, "0123456789abcdef");
  // The shard travels too, for a reader that builds a restore plan from it.
  EXPECT_NE(EncodeDatagram(others[2]).find("\"shard\":1"), std::string::npos);
  back = ParseDatagram(EncodeDatagram(others[3]), kContext);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(std::get<FaultMessage>(back->message).kind, faults::FaultKind::kCommSlow);
  EXPECT_EQ(std::get<FaultMessage>(back->message).id, "fault-3:a.b_c");
}

// A ready that says its start step is unknown names none: one that does
// both contradicts itself and is refused.
TEST(WorkerContract, AReadyWithAnUnknownStartStepNamesNone) {
  ReadyMessage ready;
  ready.start_step = 7;
  ready.start_step_unknown = true;
  Result<Datagram> back = ParseDatagram(EncodeDatagram(From(1, ready)), kContext);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("start_step_unknown"), std::string::npos)
      << back.status().message();
}

TEST(WorkerContract, ALossOfNoNumberTravelsAsItsName) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (std::optional<double> loss : {std::optional<double>(nan), std::optional<double>(inf),
                                     std::optional<double>(-inf), std::optional<double>()}) {
    StepMessage m;
    m.step = 5;
    m.loss = loss;
    Result<Datagram> back = ParseDatagram(EncodeDatagram(From(1, m)), kContext);
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    const std::optional<double> got = std::get<StepMessage>(back->message).loss;
    ASSERT_EQ(got.has_value(), loss.has_value());
    if (!loss) continue;
    if (std::isnan(*loss)) {
      EXPECT_TRUE(std::isnan(*got));
    } else {
      EXPECT_EQ(*got, *loss);
    }
  }
}

TEST(WorkerContract, AValueOutOfBoundsIsWrittenAndRefusedByName) {
  // A program's bad number costs its report, never the program: the
  // encoder writes it, the agent refuses it and says which field.
  StepMessage m;
  m.step = 5;
  m.compute_s = -1;
  Result<Datagram> back = ParseDatagram(EncodeDatagram(From(1, m)), kContext);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("field 'compute_s'"), std::string::npos)
      << back.status().message();

  m.compute_s = 0;
  m.total_steps = kMaxCount + 1;
  back = ParseDatagram(EncodeDatagram(From(1, m)), kContext);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("field 'total_steps'"), std::string::npos);

  m.total_steps = 0;
  m.comm_s = std::numeric_limits<double>::quiet_NaN();
  back = ParseDatagram(EncodeDatagram(From(1, m)), kContext);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("field 'comm_s'"), std::string::npos);

  // A fault id that is not UTF-8 is encoded, not thrown, and refused.
  back = ParseDatagram(
      EncodeDatagram(From(1, FaultMessage{"bad\xff", faults::FaultKind::kKill, 1})), kContext);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("field 'id'"), std::string::npos);

  // Another rank's slot is not this rank's to announce.
  back = ParseDatagram(
      EncodeDatagram(From(1, SnapshotMessage{9, 2, checkpoint::SlotPath(kContext.t0_dir, 0, 0)})),
      kContext);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("field 'path'"), std::string::npos);
}

TEST(WorkerContract, TheValidatorsTheControllerAppliesAgain) {
  EXPECT_TRUE(IsFingerprint("0123456789abcdef"));
  EXPECT_FALSE(IsFingerprint("0123456789ABCDEF"));
  EXPECT_FALSE(IsFingerprint("0123456789abcde"));
  EXPECT_FALSE(IsFingerprint("0123456789abcdef0"));
  EXPECT_FALSE(IsFingerprint("0123456789abcdeg"));
  EXPECT_FALSE(IsFingerprint(""));

  EXPECT_TRUE(IsPhaseName("train"));
  EXPECT_TRUE(IsPhaseName("eval_2"));
  EXPECT_TRUE(IsPhaseName(std::string(kMaxPhaseBytes, 'a')));
  EXPECT_FALSE(IsPhaseName(std::string(kMaxPhaseBytes + 1, 'a')));
  EXPECT_FALSE(IsPhaseName("2eval"));
  EXPECT_FALSE(IsPhaseName("Eval"));
  EXPECT_FALSE(IsPhaseName("ev al"));
  EXPECT_FALSE(IsPhaseName(""));

  EXPECT_TRUE(IsSeconds(0));
  EXPECT_TRUE(IsSeconds(kMaxSeconds));
  EXPECT_FALSE(IsSeconds(-0.001));
  EXPECT_FALSE(IsSeconds(kMaxSeconds * 2));
  EXPECT_FALSE(IsSeconds(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_FALSE(IsSeconds(std::numeric_limits<double>::infinity()));
}

}  // namespace
}  // namespace endure::contract
