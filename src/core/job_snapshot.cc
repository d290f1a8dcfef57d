// JobMachine::Snapshot and FromSnapshot: the machine's state in cereal's
// portable binary archive (libcereal-dev), behind a header line and the
// job's configuration as the journal writes it.
//
//   endure-job-snapshot 2 bytes=<size of what follows> xxh3=<its checksum>\n
//   <the Configure input, EncodeEvent's line>\n
//   <the archive>
//
// Every part of the machine lists its own state in a `serialize` member next
// to its fields (a field added there must be added to it); the plain structs
// it keeps are listed here. Times are written as offsets from the job's
// start, so that a snapshot taken by one controller process restores in
// another whose clock began elsewhere (every time moves with the job's,
// so that every difference of two times is kept). The checksum is checked before anything is read,
// and the archive is read in one place that turns every failure into an error. UserDataAdapter (the
// archive carries the epoch its times are offsets from) is behind cereal's "future experimental"
// switch in 1.3.
#define CEREAL_FUTURE_EXPERIMENTAL
#include <cereal/archives/adapters.hpp>
#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/array.hpp>
#include <cereal/types/deque.hpp>
#include <cereal/types/map.hpp>
#include <cereal/types/optional.hpp>
#include <cereal/types/set.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/utility.hpp>
#include <cereal/types/vector.hpp>
#include <charconv>
#include <sstream>
#include <type_traits>

#include "common/hash.h"
#include "core/job_codec.h"
#include "core/job_machine.h"

namespace endure::core {
namespace {

// What the archive's times are offsets from.
struct Epoch {
  TimePoint start;
};

// The number is the archive's layout: raised whenever a `serialize` list
// changes, so that a snapshot of another build is refused (and a new run
// begun, saying so), never misread. 2: the hang detector's deadline groups;
// 3: restore points of programs that do not say them.
constexpr std::string_view kMagic = "endure-job-snapshot 3";

}  // namespace
}  // namespace endure::core

// Times and durations, found by cereal for the standard types they are.
namespace cereal {

template <class Archive>
void save(Archive& ar, const std::chrono::nanoseconds& d) {
  ar(static_cast<int64_t>(d.count()));
}
template <class Archive>
void load(Archive& ar, std::chrono::nanoseconds& d) {
  int64_t count = 0;
  ar(count);
  d = std::chrono::nanoseconds(count);
}

template <class Archive>
void save(Archive& ar, const endure::core::TimePoint& t) {
  ar(t - get_user_data<endure::core::Epoch>(ar).start);
}
template <class Archive>
void load(Archive& ar, endure::core::TimePoint& t) {
  std::chrono::nanoseconds since{0};
  ar(since);
  t = get_user_data<endure::core::Epoch>(ar).start + since;
}

}  // namespace cereal

namespace endure {
namespace checkpoint {

template <class Archive>
void serialize(Archive& ar, ShardCopy& c) {
  ar(c.step, c.shard, c.shards, c.tier, c.node, c.path, c.bytes, c.xxh3, c.refused);
}

}  // namespace checkpoint

namespace core {

// The distinct value types of ids.h: their number.
template <class Archive, class Id>
requires std::is_same_v<Id, NodeId> || std::is_same_v<Id, StepNumber> || std::is_same_v<Id, Rank> ||
    std::is_same_v<Id, Generation>
void serialize(Archive& ar, Id& id) { ar(id.value); }
template <class Archive>
void serialize(Archive& ar, IncidentCause& c) {
  ar(c.kind, c.name);
}
template <class Archive>
void serialize(Archive& ar, Incident& i) {
  ar(i.id, i.generation, i.cause, i.rank, i.node, i.node_name, i.injected_at, i.fault_at,
     i.detected_at, i.stopped_at, i.relaunched_at, i.ready_at, i.recovered_at, i.restore_s,
     i.failed_at_step, i.restored_step, i.action, i.reason, i.route, i.route_reason, i.log_line,
     i.restore, i.stacks, i.suspects);
}
template <class Archive>
void serialize(Archive& ar, StragglerReport& r) {
  ar(r.generation, r.rank, r.node, r.node_name, r.step, r.at, r.slowdown, r.reason);
}
template <class Archive>
void serialize(Archive& ar, Resize& r) {
  ar(r.generation, r.at, r.from_nodes, r.to_nodes, r.step, r.reason);
}
template <class Archive>
void serialize(Archive& ar, LossAnomaly& a) {
  ar(a.step, a.kind, a.loss, a.median, a.deviation, a.z, a.reason);
}
template <class Archive>
void serialize(Archive& ar, DataAnomaly& a) {
  ar(a.step, a.kind, a.loss, a.reason);
}
template <class Archive>
void serialize(Archive& ar, FaultFiredEvent& e) {
  ar(e.generation, e.rank, e.id, e.kind, e.step, e.at);
}
template <class Archive>
void serialize(Archive& ar, WorkerExitEvent& e) {
  ar(e.generation, e.rank, e.node, e.exit_code, e.signal, e.log_cause, e.log_action, e.log_rule,
     e.log_line, e.stopped);
}
template <class Archive>
void serialize(Archive& ar, PairResult& r) {
  ar(r.a, r.b, r.ok, r.seconds, r.error);
}
template <class Archive>
void serialize(Archive& ar, PairwiseOptions& o) {
  ar(o.slow_factor, o.min_slow_s);
}
template <class Archive>
void serialize(Archive& ar, PairwiseVerdict& v) {
  ar(v.faulty, v.slow, v.suspects, v.resolved, v.reason);
}
template <class Archive>
void serialize(Archive& ar, CheckpointTotals& t) {
  ar(t.copies_taken, t.durable_commits, t.newest_durable, t.persist_failures, t.peak_t0_bytes,
     t.peak_t1_bytes, t.restored_shards_by_tier);
}

template <class Archive>
void JobMachine::serialize(Archive& ar) {
  ar(start_, ledger_, hang_, heartbeats_, loss_, anomaly_, recovery_, phase_, nodes_, generation_,
     members_, member_set_, awaiting_stop_, rank_step_, ranks_at_step_, rank_ready_, rank_done_,
     ranks_ready_, step_productive_, rank_rejoins_, rank_deterministic_, rank_loss_);
  ar(replay_incident_, replay_world_, replay_generation_, max_restore_s_, job_step_,
     in_process_from_, all_ready_at_, first_step_took_, start_step_, productive_, last_loss_, book_,
     rollback_notes_, fired_, fired_at_, fired_events_, stopping_collective_, wait_until_,
     replacement_deadline_, restore_step_, abandoned_from_, skip_steps_);
  ar(incidents_, incident_open_, persist_failure_reported_, hang_held_, sdc_recompute_, stragglers_,
     stragglers_kept_, resizes_, sdc_, stacks_, step_times_, last_job_step_at_, total_steps_,
     pairwise_, pair_tests_, pairs_asked_, pair_results_, pairwise_deadline_);
  ar(unannounced_, restore_unknown_, first_reported_, step_stride_, rollback_pending_,
     rank_from_tiers_);
}

std::string JobMachine::Snapshot() const {
  ENDURE_CHECK(configured_);
  std::ostringstream state;
  {
    Epoch epoch{start_};
    cereal::UserDataAdapter<Epoch, cereal::PortableBinaryOutputArchive> ar(epoch, state);
    ar(*this);
  }
  std::string body = EncodeEvent(Configure{options_, external_}) + "\n" + std::move(state).str();
  return std::string(kMagic) + " bytes=" + std::to_string(body.size()) +
         " xxh3=" + HexU64(Xxh3(body)) + "\n" + body;
}

Result<JobMachine> JobMachine::FromSnapshot(std::string_view snapshot, TimePoint start) {
  auto damaged = [](const std::string& why) {
    return DataLoss("the job snapshot is damaged or not one: " + why);
  };
  const size_t header_end = snapshot.find('\n');
  if (header_end == std::string_view::npos ||
      snapshot.substr(0, kMagic.size() + 1) != std::string(kMagic) + " ") {
    return damaged("it does not begin with \"" + std::string(kMagic) + "\"");
  }
  const std::string_view header = snapshot.substr(0, header_end);
  const std::string_view body = snapshot.substr(header_end + 1);
  size_t bytes = 0;
  const size_t size_at = header.find(" bytes=");
  const size_t sum_at = header.find(" xxh3=");
  if (size_at == std::string_view::npos || sum_at == std::string_view::npos) {
    return damaged("its header has no bytes= or xxh3=");
  }
  const char* size_text = header.data() + size_at + 7;
  if (std::from_chars(size_text, header.data() + sum_at, bytes).ptr != header.data() + sum_at) {
    return damaged("its size is not a number");
  }
  if (bytes != body.size()) {
    return damaged("it holds " + std::to_string(body.size()) + " bytes where its header says " +
                   std::to_string(bytes) + " (cut short?)");
  }
  if (header.substr(sum_at + 6) != HexU64(Xxh3(body))) {
    return damaged("its checksum does not match its contents");
  }
  const size_t config_end = body.find('\n');
  if (config_end == std::string_view::npos) return damaged("it has no configuration line");
  Result<JobEvent> configure = DecodeEvent(body.substr(0, config_end));
  if (!configure.ok()) return damaged("its configuration: " + configure.status().message());
  const auto* c = std::get_if<Configure>(&*configure);
  if (c == nullptr) return damaged("its first line is not the job's configuration");

  JobMachine machine(start);
  machine.Step(*c, start);
  try {
    std::istringstream state(std::string(body.substr(config_end + 1)));
    Epoch epoch{start};
    cereal::UserDataAdapter<Epoch, cereal::PortableBinaryInputArchive> ar(epoch, state);
    ar(machine);
    if (state.peek() != std::char_traits<char>::eof()) {
      return damaged("bytes follow the machine's state (a snapshot of another version?)");
    }
  } catch (const std::exception& e) {
    // A checksum that matches a state this build cannot read: another
    // version's snapshot, or one written wrong.
    return damaged(std::string("its state does not read back: ") + e.what());
  }
  return machine;
}

}  // namespace core
}  // namespace endure
