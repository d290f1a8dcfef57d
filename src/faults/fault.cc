// Fault kinds, validation, the ENDURE_FAULTS JSON format and the seeded
// Poisson schedule.
#include "faults/fault.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

namespace endure::faults {
namespace {

struct KindName {
  FaultKind kind;
  std::string_view name;
};
constexpr KindName kKinds[] = {
    {FaultKind::kKill, "kill"},
    {FaultKind::kExit, "exit"},
    {FaultKind::kHang, "hang"},
    {FaultKind::kNan, "nan"},
    {FaultKind::kSlow, "slow"},
    {FaultKind::kLog, "log"},
    {FaultKind::kKillAgent, "kill-agent"},
    {FaultKind::kDiskFull, "disk-full"},
    {FaultKind::kDiskError, "disk-error"},
    {FaultKind::kCorruptT0, "corrupt-t0"},
    {FaultKind::kCorruptT1, "corrupt-t1"},
    {FaultKind::kBitflip, "bitflip"},
    {FaultKind::kCommFail, "comm-fail"},
    {FaultKind::kCommSlow, "comm-slow"},
    {FaultKind::kSpike, "spike"},
};

std::string KindList() {
  std::string list;
  for (const KindName& k : kKinds) {
    if (!list.empty()) list += ", ";
    list += k.name;
  }
  return list;
}

// "90s", "1500ms", "250us", "7ns": the largest unit that keeps it exact.
std::string ExactDuration(Duration d) {
  const int64_t ns = d.count();
  if (ns % 1000000000 == 0) return std::to_string(ns / 1000000000) + "s";
  if (ns % 1000000 == 0) return std::to_string(ns / 1000000) + "ms";
  if (ns % 1000 == 0) return std::to_string(ns / 1000) + "us";
  return std::to_string(ns) + "ns";
}

// A double in [0, 1) from the top 53 bits of one draw.
double Unit53(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// A uniform integer in [0, n) by rejection, so that no value is favoured.
uint64_t UniformBelow(std::mt19937_64& rng, uint64_t n) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % n;
}

}  // namespace

std::string_view FaultKindName(FaultKind kind) {
  for (const KindName& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "unknown";
}

Result<FaultKind> ParseFaultKind(std::string_view name) {
  for (const KindName& k : kKinds) {
    if (k.name == name) return k.kind;
  }
  return InvalidArgument("unknown fault kind '" + std::string(name) + "' (one of " + KindList() +
                         ")");
}

bool FiredByController(FaultKind kind) {
  return kind == FaultKind::kKillAgent || kind == FaultKind::kDiskFull ||
         kind == FaultKind::kDiskError || kind == FaultKind::kCorruptT0 ||
         kind == FaultKind::kCorruptT1;
}

Status Validate(const Fault& f) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("fault '" + f.id + "' (" + std::string(FaultKindName(f.kind)) +
                           "): " + why);
  };
  if (f.kind == FaultKind::kKillAgent) {
    if (f.node.empty() && f.rank < 0) {
      return bad("needs the node to kill (node = \"node1\") or a rank running on it");
    }
  } else if (f.rank < 0) {
    return bad("needs rank >= 0");
  }
  const bool has_step = f.step != -1;
  if (has_step && f.step < 1) return bad("step must be >= 1 (steps are numbered from 1)");
  if (f.at && f.at->count() < 0) return bad("at must not be negative");
  if (has_step == f.at.has_value()) return bad("needs exactly one of step and at");
  const bool in_step = f.kind == FaultKind::kBitflip || f.kind == FaultKind::kCommFail ||
                       f.kind == FaultKind::kCommSlow || f.kind == FaultKind::kSpike;
  if (in_step && f.at) {
    // Only the worker can touch its parameters or its collectives, and it
    // knows steps, not the job's clock.
    return bad("needs a step, not at: it fires inside the rank's training step");
  }
  switch (f.kind) {
    case FaultKind::kExit:
      if (f.exit_code < 1 || f.exit_code > 255) return bad("exit_code must be in 1..255");
      break;
    case FaultKind::kSlow:
    case FaultKind::kCommSlow:
      if (!std::isfinite(f.factor) || f.factor <= 1) {
        return bad("factor must be a number > 1 (2 = twice as slow)");
      }
      break;
    case FaultKind::kSpike:
      if (!std::isfinite(f.factor) || f.factor <= 1) {
        return bad("factor must be a number > 1 (3 = a loss three times as high)");
      }
      break;
    case FaultKind::kBitflip:
      if (f.tensor < 0) return bad("tensor must be >= 0 (an index into the parameters)");
      if (f.element < 0) return bad("element must be >= 0");
      if (f.bit < 0 || f.bit > 63) return bad("bit must be in 0..63");
      break;
    case FaultKind::kLog:
      if (f.line.empty()) return bad("needs a non-empty line to print");
      break;
    default:
      break;
  }
  return Status::Ok();
}

Status ValidateFaults(const std::vector<Fault>& faults) {
  std::set<std::string> ids;
  for (size_t i = 0; i < faults.size(); ++i) {
    if (faults[i].id.empty()) {
      return InvalidArgument("faults[" + std::to_string(i) + "]: needs an id");
    }
    if (!ids.insert(faults[i].id).second) {
      return InvalidArgument("faults[" + std::to_string(i) + "]: id '" + faults[i].id +
                             "' is used twice");
    }
    ENDURE_RETURN_IF_ERROR(Validate(faults[i]));
  }
  return Status::Ok();
}

std::string EncodeFaults(const std::vector<Fault>& faults) {
  nlohmann::json array = nlohmann::json::array();
  const Fault defaults;
  for (const Fault& f : faults) {
    nlohmann::json j = {{"id", f.id}, {"kind", FaultKindName(f.kind)}};
    if (f.rank != defaults.rank) j["rank"] = f.rank;
    if (!f.node.empty()) j["node"] = f.node;
    if (f.step != defaults.step) j["step"] = f.step;
    if (f.at) j["at"] = ExactDuration(*f.at);
    if (f.exit_code != defaults.exit_code) j["exit_code"] = f.exit_code;
    if (f.factor != defaults.factor) j["factor"] = f.factor;
    if (!f.line.empty()) j["line"] = f.line;
    if (f.tensor != defaults.tensor) j["tensor"] = f.tensor;
    if (f.element != defaults.element) j["element"] = f.element;
    if (f.bit != defaults.bit) j["bit"] = f.bit;
    array.push_back(std::move(j));
  }
  return array.dump();
}

Result<std::vector<Fault>> DecodeFaults(std::string_view json) {
  std::vector<Fault> faults;
  if (json.find_first_not_of(" \t\r\n") == std::string_view::npos) return faults;
  nlohmann::json array = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (array.is_discarded()) return InvalidArgument("faults: not valid JSON");
  if (!array.is_array()) return InvalidArgument("faults: expected a JSON array of faults");
  for (size_t i = 0; i < array.size(); ++i) {
    const nlohmann::json& j = array[i];
    const std::string where = "faults[" + std::to_string(i) + "]";
    if (!j.is_object()) return InvalidArgument(where + ": expected an object");
    Fault f;
    auto bad = [&](const std::string& key, const std::string& why) {
      return InvalidArgument(where + "." + key + ": " + why);
    };
    auto get_int = [&](const std::string& key, int64_t lo, int64_t hi, int64_t* out) -> Status {
      const nlohmann::json& v = j.at(key);
      if (!v.is_number_integer()) return bad(key, "expected an integer, got " + v.dump());
      // Above INT64_MAX, get<int64_t>() would wrap (2^64 - 1 read as -1).
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
        return bad(key, v.dump() + " is out of range");
      }
      const int64_t n = v.get<int64_t>();
      if (n < lo || n > hi) return bad(key, std::to_string(n) + " is out of range");
      *out = n;
      return Status::Ok();
    };
    auto get_string = [&](const std::string& key, std::string* out) -> Status {
      if (!j.at(key).is_string()) return bad(key, "expected a string, got " + j.at(key).dump());
      *out = j.at(key).get<std::string>();
      return Status::Ok();
    };
    if (!j.contains("kind")) return bad("kind", "missing (one of " + KindList() + ")");
    for (const auto& [key, value] : j.items()) {
      int64_t n = 0;
      if (key == "id") {
        ENDURE_RETURN_IF_ERROR(get_string(key, &f.id));
      } else if (key == "kind") {
        std::string name;
        ENDURE_RETURN_IF_ERROR(get_string(key, &name));
        Result<FaultKind> kind = ParseFaultKind(name);
        if (!kind.ok()) return bad(key, kind.status().message());
        f.kind = *kind;
      } else if (key == "rank") {
        ENDURE_RETURN_IF_ERROR(get_int(key, -1, INT32_MAX, &n));
        f.rank = static_cast<int>(n);
      } else if (key == "node") {
        ENDURE_RETURN_IF_ERROR(get_string(key, &f.node));
      } else if (key == "step") {
        ENDURE_RETURN_IF_ERROR(get_int(key, -1, INT64_MAX, &f.step));
      } else if (key == "at") {
        if (value.is_string()) {
          Result<Duration> d = ParseDuration(value.get<std::string>());
          if (!d.ok()) return bad(key, d.status().message());
          f.at = *d;
        } else if (value.is_number() && std::isfinite(value.get<double>()) &&
                   value.get<double>() >= 0 && value.get<double>() < 9e9) {
          f.at = Duration(std::llround(value.get<double>() * 1e9));
        } else {
          return bad(key, "expected a duration such as \"90s\", got " + value.dump());
        }
      } else if (key == "exit_code") {
        ENDURE_RETURN_IF_ERROR(get_int(key, INT32_MIN, INT32_MAX, &n));
        f.exit_code = static_cast<int>(n);
      } else if (key == "factor") {
        if (!value.is_number()) return bad(key, "expected a number, got " + value.dump());
        f.factor = value.get<double>();
      } else if (key == "line") {
        ENDURE_RETURN_IF_ERROR(get_string(key, &f.line));
      } else if (key == "tensor") {
        ENDURE_RETURN_IF_ERROR(get_int(key, INT32_MIN, INT32_MAX, &n));
        f.tensor = static_cast<int>(n);
      } else if (key == "element") {
        ENDURE_RETURN_IF_ERROR(get_int(key, INT64_MIN, INT64_MAX, &f.element));
      } else if (key == "bit") {
        ENDURE_RETURN_IF_ERROR(get_int(key, INT32_MIN, INT32_MAX, &n));
        f.bit = static_cast<int>(n);
      } else {
        return InvalidArgument(where + ": unknown key '" + key +
                               "' (known: id, kind, rank, node, step, at, exit_code, factor, "
                               "line, tensor, element, bit)");
      }
    }
    faults.push_back(std::move(f));
  }
  return faults;
}

double ExpectedFaultCount(Duration mtbf, Duration horizon) {
  if (mtbf.count() <= 0) return std::numeric_limits<double>::infinity();
  return std::max(0.0, static_cast<double>(horizon.count()) / static_cast<double>(mtbf.count()));
}

Result<std::vector<Fault>> PoissonSchedule(Duration mtbf, uint64_t seed, Duration horizon,
                                           int world_size, FaultKind kind, int64_t max_faults,
                                           double node_loss_share) {
  ENDURE_CHECK(mtbf.count() > 0 && world_size >= 1);
  auto too_many = [&](const std::string& what) {
    return InvalidArgument(what + " over the horizon " + ExactDuration(horizon) + " with mtbf " +
                           ExactDuration(mtbf) + "; at most " + std::to_string(max_faults) +
                           " are allowed: raise the mtbf or shorten the horizon");
  };
  // Checked before drawing: an mtbf of a microsecond over ten minutes would
  // otherwise allocate hundreds of millions of faults first.
  const double expected = ExpectedFaultCount(mtbf, horizon);
  if (expected > static_cast<double>(max_faults)) {
    char count[32];
    std::snprintf(count, sizeof count, "%.3g", expected);
    return too_many(std::string("the schedule would hold about ") + count + " faults");
  }
  std::mt19937_64 rng(seed);
  std::vector<Fault> faults;
  const double mean_ns = static_cast<double>(mtbf.count());
  double t_ns = 0;
  while (true) {
    // Inverse transform: -mean * ln(1 - u) with u in [0, 1) never takes ln(0).
    t_ns += -mean_ns * std::log1p(-Unit53(rng));
    if (t_ns >= static_cast<double>(horizon.count())) break;
    if (static_cast<int64_t>(faults.size()) >= max_faults) {
      return too_many("seed " + std::to_string(seed) + " draws more than " +
                      std::to_string(max_faults) + " faults");
    }
    Fault f;
    f.id = "sched-" + std::to_string(faults.size() + 1);
    f.kind = kind;
    f.at = Duration(static_cast<int64_t>(t_ns));
    f.rank = static_cast<int>(UniformBelow(rng, static_cast<uint64_t>(world_size)));
    if (node_loss_share > 0 && Unit53(rng) < node_loss_share) f.kind = FaultKind::kKillAgent;
    if (f.kind == FaultKind::kLog) f.line = "endure: injected log fault " + f.id;
    faults.push_back(std::move(f));
  }
  return faults;
}

std::vector<Fault> FaultsForRank(const std::vector<Fault>& faults, int rank,
                                 const std::set<std::string>& fired) {
  std::vector<Fault> mine;
  for (const Fault& f : faults) {
    if (FiredByController(f.kind) || f.at || f.step < 1 || f.rank != rank) continue;
    if (fired.count(f.id) > 0) continue;
    mine.push_back(f);
  }
  return mine;
}

}  // namespace endure::faults
