// The worker contract's datagrams: the JSON wire format, written by
// EncodeDatagram and checked field by field by ParseDatagram.
#include "contract/worker_contract.h"

#include <signal.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "checkpoint/snapshot_file.h"
#include "common/names.h"

namespace endure::contract {
namespace {

using Json = nlohmann::json;

constexpr int kMaxDepth = 4;
constexpr size_t kMaxTokenBytes = 256;
constexpr size_t kMaxPathBytes = 4096;
constexpr size_t kMaxIdBytes = 128;
constexpr size_t kMaxKindBytes = 32;
constexpr double kMaxWallSeconds = 1e11;  // the year 5138

// `v` for an error message: its JSON, cut short.
std::string Shown(const Json& v) {
  return QuoteForLog(v.dump(-1, ' ', false, Json::error_handler_t::replace), 40);
}

Status Bad(const char* field, const std::string& expected, const Json* got) {
  std::string m = std::string("field '") + field + "': expected " + expected;
  m += got ? ", got " + Shown(*got) : ", but it is missing";
  return InvalidArgument(m);
}

// Integer field `name` in [lo, hi]; `fallback` when it is absent (required
// when there is none). Floating-point numbers are refused: 5.0 is not a step.
Result<int64_t> Int(const Json& j, const char* name, int64_t lo, int64_t hi,
                    std::optional<int64_t> fallback = std::nullopt) {
  const std::string range =
      "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  auto it = j.find(name);
  if (it == j.end()) {
    if (fallback) return *fallback;
    return Bad(name, range, nullptr);
  }
  int64_t v = 0;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Bad(name, range, &*it);
    }
    v = static_cast<int64_t>(u);
  } else if (it->is_number_integer()) {
    v = it->get<int64_t>();
  } else {
    return Bad(name, range, &*it);
  }
  if (v < lo || v > hi) return Bad(name, range, &*it);
  return v;
}

// Finite number field `name` in [lo, hi], `fallback` when absent.
Result<double> Real(const Json& j, const char* name, double lo, double hi,
                    std::optional<double> fallback = std::nullopt) {
  char range[96];
  std::snprintf(range, sizeof range, "a number in [%g, %g]", lo, hi);
  auto it = j.find(name);
  if (it == j.end()) {
    if (fallback) return *fallback;
    return Bad(name, range, nullptr);
  }
  if (!it->is_number()) return Bad(name, range, &*it);
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) return Bad(name, range, &*it);
  return v;
}

// Boolean field `name`, `fallback` when absent.
Result<bool> Bool(const Json& j, const char* name, bool fallback) {
  auto it = j.find(name);
  if (it == j.end()) return fallback;
  if (!it->is_boolean()) return Bad(name, "true or false", &*it);
  return it->get<bool>();
}

// String field `name` of 1 to `max` bytes.
Result<std::string> Str(const Json& j, const char* name, size_t max) {
  const std::string expected = "a string of 1 to " + std::to_string(max) + " bytes";
  auto it = j.find(name);
  if (it == j.end()) return Bad(name, expected, nullptr);
  if (!it->is_string()) return Bad(name, expected, &*it);
  const std::string& s = it->get_ref<const std::string&>();
  if (s.empty() || s.size() > max) return Bad(name, expected, &*it);
  return s;
}

// The loss: absent or null (none), a finite number, or "nan", "inf", "-inf".
Result<std::optional<double>> Loss(const Json& j) {
  auto it = j.find("loss");
  if (it == j.end() || it->is_null()) return std::optional<double>();
  if (it->is_number()) {
    const double v = it->get<double>();
    if (std::isfinite(v)) return std::optional<double>(v);
  } else if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    if (s == "nan") return std::optional<double>(std::numeric_limits<double>::quiet_NaN());
    if (s == "inf") return std::optional<double>(std::numeric_limits<double>::infinity());
    if (s == "-inf") return std::optional<double>(-std::numeric_limits<double>::infinity());
  }
  return Bad("loss", "a finite number, \"nan\", \"inf\", \"-inf\" or null", &*it);
}

bool MatchesId(std::string_view s, size_t max) {
  if (s.empty() || s.size() > max) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z');
    if (i == 0 ? !alnum : !(alnum || c == '.' || c == '_' || c == ':' || c == '-')) return false;
  }
  return true;
}

// Whether `path` names one of `rank`'s T0 slots in `t0_dir`.
bool IsOwnSlot(const std::string& path, const std::string& t0_dir, int rank) {
  if (path.find('\0') != std::string::npos) return false;
  const std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  for (int slot = 0; slot < checkpoint::kT0Slots; ++slot) {
    if (p == std::filesystem::path(checkpoint::SlotPath(t0_dir, rank, slot)).lexically_normal()) {
      return true;
    }
  }
  return false;
}

Result<DatagramMessage> ParseMessage(const std::string& type, const Json& j, int rank,
                                     const DatagramContext& context) {
  if (type == "ready") {
    ReadyMessage m;
    ENDURE_ASSIGN_OR_RETURN(m.start_step, Int(j, "start_step", 0, kMaxCount, 0));
    ENDURE_ASSIGN_OR_RETURN(m.restore_s, Real(j, "restore_s", 0, kMaxSeconds, 0.0));
    ENDURE_ASSIGN_OR_RETURN(m.init_s, Real(j, "init_s", 0, kMaxSeconds, 0.0));
    ENDURE_ASSIGN_OR_RETURN(m.rejoin, Bool(j, "rejoin", false));
    ENDURE_ASSIGN_OR_RETURN(m.rejoin_from_tiers, Bool(j, "rejoin_from_tiers", false));
    if (m.rejoin_from_tiers && !m.rejoin) {
      return InvalidArgument("a ready with rejoin_from_tiers must say rejoin");
    }
    ENDURE_ASSIGN_OR_RETURN(m.deterministic, Bool(j, "deterministic", false));
    ENDURE_ASSIGN_OR_RETURN(m.start_step_unknown, Bool(j, "start_step_unknown", false));
    if (m.start_step_unknown && m.start_step != 0) {
      return InvalidArgument("a ready with start_step_unknown names no start_step");
    }
    return DatagramMessage(m);
  }
  if (type == "heartbeat") {
    HeartbeatMessage m;
    ENDURE_ASSIGN_OR_RETURN(m.step, Int(j, "step", -1, kMaxCount, -1));
    return DatagramMessage(m);
  }
  if (type == "step" || type == "skip") {
    StepMessage m;
    m.skipped = type == "skip";
    ENDURE_ASSIGN_OR_RETURN(m.step, Int(j, "step", 0, kMaxCount));
    if (!m.skipped) {
      ENDURE_ASSIGN_OR_RETURN(m.loss, Loss(j));
    }
    ENDURE_ASSIGN_OR_RETURN(m.tokens, Int(j, "tokens", 0, kMaxCount, 0));
    ENDURE_ASSIGN_OR_RETURN(m.total_steps, Int(j, "total_steps", 0, kMaxCount, 0));
    ENDURE_ASSIGN_OR_RETURN(m.compute_s, Real(j, "compute_s", 0, kMaxSeconds, 0.0));
    ENDURE_ASSIGN_OR_RETURN(m.comm_s, Real(j, "comm_s", 0, kMaxSeconds, 0.0));
    ENDURE_ASSIGN_OR_RETURN(m.ckpt_stall_s, Real(j, "ckpt_stall_s", 0, kMaxSeconds, 0.0));
    ENDURE_ASSIGN_OR_RETURN(m.checkpoint_step, Int(j, "checkpoint_step", -1, kMaxCount, -1));
    return DatagramMessage(m);
  }
  if (type == "snapshot") {
    if (context.t0_dir.empty()) {
      return InvalidArgument("a \"snapshot\" datagram, but checkpoints are off on this node");
    }
    SnapshotMessage m;
    ENDURE_ASSIGN_OR_RETURN(m.step, Int(j, "step", 0, kMaxCount));
    ENDURE_ASSIGN_OR_RETURN(const int64_t shards, Int(j, "shards", 1, kMaxWorldSize, 1));
    if (rank >= shards) {
      return InvalidArgument("field 'shards': rank " + std::to_string(rank) + " of " +
                             std::to_string(shards) + " shards");
    }
    m.shards = static_cast<int>(shards);
    ENDURE_ASSIGN_OR_RETURN(m.path, Str(j, "path", kMaxPathBytes));
    if (!IsOwnSlot(m.path, context.t0_dir, rank)) {
      return InvalidArgument("field 'path': '" + QuoteForLog(m.path, 200) +
                             "' is not one of rank " + std::to_string(rank) + "'s slots in " +
                             context.t0_dir);
    }
    ENDURE_ASSIGN_OR_RETURN(m.bytes, Int(j, "bytes", 0, kMaxCount, 0));
    if (j.contains("xxh3")) {
      ENDURE_ASSIGN_OR_RETURN(m.xxh3, Str(j, "xxh3", kFingerprintChars));
      if (!IsFingerprint(m.xxh3)) return Bad("xxh3", "16 lowercase hex digits", &*j.find("xxh3"));
    }
    return DatagramMessage(m);
  }
  if (type == "fault") {
    FaultMessage m;
    ENDURE_ASSIGN_OR_RETURN(m.id, Str(j, "id", kMaxIdBytes));
    if (!MatchesId(m.id, kMaxIdBytes)) {
      return Bad("id", "an id matching ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", &*j.find("id"));
    }
    ENDURE_ASSIGN_OR_RETURN(const std::string kind, Str(j, "kind", kMaxKindBytes));
    Result<faults::FaultKind> parsed = faults::ParseFaultKind(kind);
    if (!parsed.ok()) return Bad("kind", "a fault kind (faults/fault.h)", &*j.find("kind"));
    m.kind = *parsed;
    ENDURE_ASSIGN_OR_RETURN(m.step, Int(j, "step", 0, kMaxCount));
    return DatagramMessage(m);
  }
  if (type == "stacks") {
    StacksMessage m;
    ENDURE_ASSIGN_OR_RETURN(const int64_t sig, Int(j, "signal", INT_MIN, INT_MAX));
    m.signal = static_cast<int>(sig);
    return DatagramMessage(m);
  }
  if (type == "phase") {
    PhaseMessage m;
    ENDURE_ASSIGN_OR_RETURN(m.name, Str(j, "phase", kMaxPhaseBytes));
    if (!IsPhaseName(m.name)) {
      return Bad("phase", "a phase name matching ^[a-z][a-z0-9_]{0,31}$", &*j.find("phase"));
    }
    ENDURE_ASSIGN_OR_RETURN(m.step, Int(j, "step", -1, kMaxCount));
    return DatagramMessage(m);
  }
  if (type == "fingerprint") {
    FingerprintMessage m;
    ENDURE_ASSIGN_OR_RETURN(m.step, Int(j, "step", 1, kMaxCount));
    ENDURE_ASSIGN_OR_RETURN(m.fingerprint, Str(j, "fingerprint", kFingerprintChars));
    if (!IsFingerprint(m.fingerprint)) {
      return Bad("fingerprint", "16 lowercase hex digits", &*j.find("fingerprint"));
    }
    return DatagramMessage(m);
  }
  return InvalidArgument("unknown datagram type '" + QuoteForLog(type, 40) + "'");
}

}  // namespace

bool IsStackSignal(int64_t sig) {
  if (sig < 1 || sig > 64) return false;
  return sig == SIGUSR1 || sig == SIGUSR2 || (sig >= SIGRTMIN && sig <= SIGRTMAX);
}

std::string_view DatagramType(const Datagram& d) {
  struct Name {
    std::string_view operator()(const ReadyMessage&) const { return "ready"; }
    std::string_view operator()(const HeartbeatMessage&) const { return "heartbeat"; }
    std::string_view operator()(const StepMessage& m) const { return m.skipped ? "skip" : "step"; }
    std::string_view operator()(const SnapshotMessage&) const { return "snapshot"; }
    std::string_view operator()(const FaultMessage&) const { return "fault"; }
    std::string_view operator()(const StacksMessage&) const { return "stacks"; }
    std::string_view operator()(const PhaseMessage&) const { return "phase"; }
    std::string_view operator()(const FingerprintMessage&) const { return "fingerprint"; }
  };
  return std::visit(Name{}, d.message);
}

Result<Datagram> ParseDatagram(std::string_view bytes, const DatagramContext& context) {
  if (bytes.size() > kMaxDatagramBytes) {
    return InvalidArgument("a datagram of " + std::to_string(bytes.size()) +
                           " bytes; the limit is " + std::to_string(kMaxDatagramBytes));
  }
  // The parser is iterative and the input bounded; the callback bounds the
  // nesting of what it builds.
  bool too_deep = false;
  const Json::parser_callback_t depth = [&](int d, Json::parse_event_t, Json&) {
    if (d > kMaxDepth) too_deep = true;
    return d <= kMaxDepth;
  };
  const Json j = Json::parse(bytes.begin(), bytes.end(), depth, /*allow_exceptions=*/false);
  if (too_deep) {
    return InvalidArgument("nested more than " + std::to_string(kMaxDepth) + " levels deep");
  }
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("not a JSON object");
  Datagram d;
  ENDURE_ASSIGN_OR_RETURN(const std::string type, Str(j, "type", 32));
  ENDURE_ASSIGN_OR_RETURN(d.token, Str(j, "token", kMaxTokenBytes));
  ENDURE_ASSIGN_OR_RETURN(d.generation, Int(j, "generation", 0, INT_MAX));
  ENDURE_ASSIGN_OR_RETURN(const int64_t rank, Int(j, "rank", 0, kMaxWorldSize - 1));
  d.rank = static_cast<int>(rank);
  if (j.contains("t")) {
    ENDURE_ASSIGN_OR_RETURN(d.time_s, Real(j, "t", 0, kMaxWallSeconds));
  }
  Result<DatagramMessage> message = ParseMessage(type, j, d.rank, context);
  if (!message.ok()) {
    return message.status().WithContext("a \"" + QuoteForLog(type, 32) + "\" datagram");
  }
  d.message = std::move(message).value();
  return d;
}

namespace {

// JSON has no NaN or infinity: those travel as strings.
Json LossJson(double loss) {
  if (std::isnan(loss)) return "nan";
  if (std::isinf(loss)) return loss > 0 ? "inf" : "-inf";
  return loss;
}

struct Fields {
  Json& j;
  int rank;
  void operator()(const ReadyMessage& m) const {
    j["start_step"] = m.start_step;
    j["restore_s"] = m.restore_s;
    j["init_s"] = m.init_s;
    if (m.rejoin) j["rejoin"] = true;
    if (m.rejoin_from_tiers) j["rejoin_from_tiers"] = true;
    if (m.deterministic) j["deterministic"] = true;
    if (m.start_step_unknown) j["start_step_unknown"] = true;
  }
  void operator()(const HeartbeatMessage& m) const { j["step"] = m.step; }
  void operator()(const StepMessage& m) const {
    j["step"] = m.step;
    if (!m.skipped) j["loss"] = m.loss ? LossJson(*m.loss) : Json();
    j["compute_s"] = m.compute_s;
    j["comm_s"] = m.comm_s;
    j["ckpt_stall_s"] = m.ckpt_stall_s;
    j["checkpoint_step"] = m.checkpoint_step;
    if (m.tokens > 0) j["tokens"] = m.tokens;
    if (m.total_steps > 0) j["total_steps"] = m.total_steps;
  }
  void operator()(const SnapshotMessage& m) const {
    j["step"] = m.step;
    j["shard"] = rank;
    j["shards"] = m.shards;
    j["path"] = m.path;
    if (m.bytes > 0) j["bytes"] = m.bytes;
    if (!m.xxh3.empty()) j["xxh3"] = m.xxh3;
  }
  void operator()(const FaultMessage& m) const {
    j["id"] = m.id;
    j["kind"] = faults::FaultKindName(m.kind);
    j["step"] = m.step;
  }
  void operator()(const StacksMessage& m) const { j["signal"] = m.signal; }
  void operator()(const PhaseMessage& m) const {
    j["phase"] = m.name;
    j["step"] = m.step;
  }
  void operator()(const FingerprintMessage& m) const {
    j["step"] = m.step;
    j["fingerprint"] = m.fingerprint;
  }
};

}  // namespace

std::string EncodeDatagram(const Datagram& d) {
  Json j = {{"type", DatagramType(d)},
            {"token", d.token},
            {"generation", d.generation},
            {"rank", d.rank}};
  if (d.time_s) j["t"] = *d.time_s;
  std::visit(Fields{j, d.rank}, d.message);
  // A string the program gave (a fault id, a path) that is not UTF-8 is
  // replaced, not thrown: ParseDatagram refuses what it cannot check.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace endure::contract
