// Fuzz target: contract::ParseDatagram, what an agent reads from any process
// that can reach its worker socket, on any bytes. It never throws; what it
// accepts is within the documented ranges, a snapshot names one of the
// sender's own slots (kT0Slots), the gate takes it only with the credential,
// and the client's encoding of what it accepted reads back the same.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "checkpoint/snapshot_file.h"
#include "core/datagram_gate.h"
#include "fuzz/fuzz_util.h"

using namespace endure;
using namespace endure::core;
using namespace endure::contract;

namespace {

bool InRange(double v, double lo, double hi) { return std::isfinite(v) && v >= lo && v <= hi; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const DatagramContext kContext{"/dev/shm/endure-42-node0/t0"};
  Result<Datagram> d = ParseDatagram(fuzz::AsText(data, size), kContext);
  if (!d.ok()) {
    FUZZ_CHECK(d.status().code() == StatusCode::kInvalidArgument);
    FUZZ_CHECK(!d.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(size <= kMaxDatagramBytes);
  FUZZ_CHECK(!d->token.empty() && d->token.size() <= 256);
  FUZZ_CHECK(d->generation >= 0 && d->generation <= INT32_MAX);
  FUZZ_CHECK(d->rank >= 0 && d->rank < kMaxWorldSize);
  FUZZ_CHECK(!d->time_s || InRange(*d->time_s, 0, 1e11));
  const std::string_view type = DatagramType(*d);
  if (const auto* m = std::get_if<StepMessage>(&d->message)) {
    FUZZ_CHECK(type == (m->skipped ? "skip" : "step"));
    FUZZ_CHECK(m->step >= 0 && m->step <= kMaxCount);
    FUZZ_CHECK(!m->skipped || !m->loss);
    FUZZ_CHECK(!m->loss || std::isfinite(*m->loss) || std::isnan(*m->loss) || std::isinf(*m->loss));
    FUZZ_CHECK(m->tokens >= 0 && m->tokens <= kMaxCount);
    FUZZ_CHECK(InRange(m->compute_s, 0, kMaxSeconds) && InRange(m->comm_s, 0, kMaxSeconds) &&
               InRange(m->ckpt_stall_s, 0, kMaxSeconds));
    FUZZ_CHECK(m->checkpoint_step >= -1 && m->checkpoint_step <= kMaxCount);
  } else if (const auto* m = std::get_if<ReadyMessage>(&d->message)) {
    FUZZ_CHECK(m->start_step >= 0 && InRange(m->restore_s, 0, kMaxSeconds) &&
               InRange(m->init_s, 0, kMaxSeconds));
  } else if (const auto* m = std::get_if<HeartbeatMessage>(&d->message)) {
    FUZZ_CHECK(m->step >= -1);
  } else if (const auto* m = std::get_if<SnapshotMessage>(&d->message)) {
    FUZZ_CHECK(m->step >= 0 && m->shards >= 1 && d->rank < m->shards);
    // One of the sender's own slots, whatever spelling reached it.
    FUZZ_CHECK(m->path.find('\0') == std::string::npos);
    const std::filesystem::path p = std::filesystem::path(m->path).lexically_normal();
    FUZZ_CHECK(p.parent_path() == std::filesystem::path(kContext.t0_dir));
    const std::string prefix = "rank-" + std::to_string(d->rank) + ".slot-";
    bool own_slot = false;
    for (int slot = 0; slot < checkpoint::kT0Slots; ++slot) {
      own_slot = own_slot || p.filename() == prefix + std::to_string(slot);
    }
    FUZZ_CHECK(own_slot);
  } else if (const auto* m = std::get_if<FaultMessage>(&d->message)) {
    // The kind is an enum: only a name ParseFaultKind knows gets this far.
    FUZZ_CHECK(!m->id.empty() && m->id.size() <= 128 && m->id.find('/') == std::string::npos);
  }
  // The gate: only this generation's credential, from a rank that runs here.
  DatagramGate gate;
  gate.generation = d->generation;
  gate.credential = d->token;
  gate.local_ranks = {d->rank};
  FUZZ_CHECK(gate.Admit(*d) == DatagramGate::Verdict::kAccept);
  gate.credential = d->token + "x";
  FUZZ_CHECK(gate.Admit(*d) == DatagramGate::Verdict::kBadCredential);
  // The worker contract's two halves agree: what the agent accepted, the
  // client's encoder writes so that it parses back to the same datagram.
  const std::string encoded = EncodeDatagram(*d);
  Result<Datagram> again = ParseDatagram(encoded, kContext);
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(EncodeDatagram(*again) == encoded);
  return 0;
}
