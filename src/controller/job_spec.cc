// Job spec parsing; see job_spec.h and docs/job_spec.md.
#include "controller/job_spec.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include "common/env.h"
#include "common/hash.h"
#include "core/progress_pattern.h"

namespace endure::controller {
namespace {

constexpr std::string_view kTables =
    "[job], [checkpoint], [detection], [anomaly], [isolation], [recovery], [control_plane], "
    "[cluster], "
    "[[faults]], "
    "[faults_schedule]";

int LineOf(const toml::source_region& src) { return static_cast<int>(src.begin.line); }

std::string TypeName(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a floating-point number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    case toml::node_type::none:
      break;
  }
  return "nothing";
}

// Parses "2GiB", "512MB", "1024" (bytes) or a bare integer.
Result<int64_t> ParseBytes(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    ++i;
  }
  if (i == 0)
    return InvalidArgument("expected a size such as \"2GiB\", got \"" + std::string(text) + "\"");
  const std::string number(text.substr(0, i));
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size()) {
    return InvalidArgument("malformed number in size \"" + std::string(text) + "\"");
  }
  std::string_view unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  struct Unit {
    std::string_view name;
    double bytes;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},     {"B", 1},    {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
      {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}};
  for (const Unit& u : kUnits) {
    if (unit == u.name) {
      const double bytes = value * u.bytes;
      if (!std::isfinite(bytes) || bytes > 9.2e18) {
        return InvalidArgument("size \"" + std::string(text) + "\" is too large");
      }
      return static_cast<int64_t>(std::llround(bytes));
    }
  }
  return InvalidArgument("unknown unit in size \"" + std::string(text) +
                         "\" (use B, KiB, MiB, GiB, KB, MB or GB)");
}

// "node12" -> 12; nullopt for anything else (no sign, no spaces, fits an int).
std::optional<int> NodeIndex(std::string_view name) {
  constexpr std::string_view kPrefix = "node";
  if (name.size() <= kPrefix.size() || name.substr(0, kPrefix.size()) != kPrefix) {
    return std::nullopt;
  }
  const std::string_view digits = name.substr(kPrefix.size());
  int n = -1;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec != std::errc() || end != digits.data() + digits.size() || n < 0) return std::nullopt;
  return n;
}

bool ValidJobName(std::string_view name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
  });
}

// Reads one table at a time, keeping the file name for messages. Every error
// is "FILE:LINE: key 'KEY': MESSAGE".
class SpecParser {
 public:
  explicit SpecParser(std::string path) : path_(std::move(path)) {}

  Status Error(int line, std::string_view key, std::string_view message) const {
    return InvalidArgument(path_ + ":" + std::to_string(std::max(line, 1)) + ": key '" +
                           std::string(key) + "': " + std::string(message));
  }
  Status Error(const toml::node& node, std::string_view key, std::string_view message) const {
    return Error(LineOf(node.source()), key, message);
  }
  Status WrongType(const toml::node& node, std::string_view key, std::string_view expected) const {
    return Error(node, key, "expected " + std::string(expected) + ", got " + TypeName(node));
  }

  Result<std::string> String(const toml::node& node, std::string_view key) const {
    if (!node.is_string()) return WrongType(node, key, "a string");
    return node.as_string()->get();
  }

  Result<int64_t> Integer(const toml::node& node, std::string_view key, int64_t min,
                          int64_t max = std::numeric_limits<int64_t>::max()) const {
    if (!node.is_integer()) return WrongType(node, key, "an integer");
    const int64_t v = node.as_integer()->get();
    if (v < min) {
      return Error(node, key,
                   "must be at least " + std::to_string(min) + ", got " + std::to_string(v));
    }
    if (v > max) {
      return Error(node, key,
                   "must be at most " + std::to_string(max) + ", got " + std::to_string(v));
    }
    return v;
  }

  Result<int> Int(const toml::node& node, std::string_view key, int min) const {
    ENDURE_ASSIGN_OR_RETURN(int64_t v, Integer(node, key, min, std::numeric_limits<int>::max()));
    return static_cast<int>(v);
  }

  // A number; integers are accepted as well. `min_exclusive` / `min` bound it.
  Result<double> Number(const toml::node& node, std::string_view key, double min,
                        bool exclusive) const {
    double v = 0;
    if (node.is_floating_point()) {
      v = node.as_floating_point()->get();
    } else if (node.is_integer()) {
      v = static_cast<double>(node.as_integer()->get());
    } else {
      return WrongType(node, key, "a number");
    }
    if (!std::isfinite(v) || (exclusive ? !(v > min) : !(v >= min))) {
      std::ostringstream bound;
      bound << min;
      return Error(node, key,
                   std::string("must be a finite number ") + (exclusive ? "> " : ">= ") +
                       bound.str() + ", got " + std::to_string(v));
    }
    return v;
  }

  Result<bool> Bool(const toml::node& node, std::string_view key) const {
    if (!node.is_boolean()) return WrongType(node, key, "a boolean (true or false)");
    return node.as_boolean()->get();
  }

  Result<Duration> Dur(const toml::node& node, std::string_view key, bool positive) const {
    if (!node.is_string())
      return WrongType(node, key, "a duration string such as \"2s\" or \"500ms\"");
    Result<Duration> d = ParseDuration(node.as_string()->get());
    if (!d.ok()) return Error(node, key, d.status().message());
    if (positive && *d <= Duration(0)) return Error(node, key, "must be longer than 0");
    return *d;
  }

  // Stop paths wait this long at most: a deadline of days is no deadline.
  // `max_text` is `max` as the message shows it.
  Status AtMost(const toml::node& node, std::string_view key, Duration d, Duration max,
                std::string_view max_text) const {
    if (d <= max) return Status::Ok();
    return Error(node, key,
                 "must be at most " + std::string(max_text) + ", got " + node.as_string()->get());
  }

  Result<int64_t> Bytes(const toml::node& node, std::string_view key) const {
    if (node.is_integer()) return Integer(node, key, 0);
    if (!node.is_string()) {
      return WrongType(node, key, "a size string such as \"2GiB\" or an integer number of bytes");
    }
    Result<int64_t> b = ParseBytes(node.as_string()->get());
    if (!b.ok()) return Error(node, key, b.status().message());
    return *b;
  }

  using Handler = std::function<Status(const toml::node&, const std::string& key)>;

  // Runs the handler of each key of `table` (section `section`); refuses keys
  // without one, listing the valid keys.
  Status Keys(const toml::table& table, const std::string& section,
              const std::vector<std::pair<std::string, Handler>>& handlers) {
    // In file order, so that the first error reported is the first in the file.
    std::vector<std::pair<const toml::key*, const toml::node*>> entries;
    for (const auto& [k, value] : table) entries.emplace_back(&k, &value);
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
      return a.first->source().begin.line < b.first->source().begin.line;
    });
    const std::string label = section.rfind("faults[", 0) == 0 ? "[[faults]]" : "[" + section + "]";
    for (const auto& [k, value] : entries) {
      const std::string name(k->str());
      const std::string key = section + "." + name;
      lines_[key] = LineOf(k->source());
      auto it = std::find_if(handlers.begin(), handlers.end(),
                             [&](const auto& h) { return h.first == name; });
      if (it == handlers.end()) {
        std::string valid;
        for (const auto& h : handlers) valid += (valid.empty() ? "" : ", ") + h.first;
        return Error(LineOf(k->source()), key,
                     std::string(value->is_table() ? "unknown table" : "unknown key") + " in " +
                         label + "; valid keys are " + valid);
      }
      ENDURE_RETURN_IF_ERROR(it->second(*value, key));
    }
    return Status::Ok();
  }

  Status Parse(std::string_view text, JobSpec& spec);
  const std::map<std::string, int>& lines() const { return lines_; }

 private:
  Status ParseJob(const toml::table& t, JobSpec& spec);
  Status ParseCheckpoint(const toml::table& t, JobSpec& spec);
  Status ParseDetection(const toml::table& t, JobSpec& spec);
  Status ParseRecovery(const toml::table& t, JobSpec& spec);
  Status ParseControlPlane(const toml::table& t, JobSpec& spec);
  Status ParseIsolation(const toml::table& t, JobSpec& spec);
  Status ParseFault(const toml::table& t, int index, JobSpec& spec);
  Status ParseSchedule(const toml::table& t, JobSpec& spec);

  std::string path_;
  // The line of every key read so far (and of [faults_schedule]), for the
  // cross-checks that point at one, and for JobSpec::key_lines.
  std::map<std::string, int> lines_;
};

Status SpecParser::Parse(std::string_view text, JobSpec& spec) {
  toml::table root;
  try {
    root = toml::parse(text, std::string_view(path_));
  } catch (const toml::parse_error& e) {
    return InvalidArgument(path_ + ":" + std::to_string(LineOf(e.source())) +
                           ": TOML syntax error: " + std::string(e.description()));
  }

  // Top level: tables only, each of the right shape.
  for (const auto& [k, value] : root) {
    const std::string name(k.str());
    const int line = LineOf(k.source());
    if (name == "faults") {
      const toml::array* array = value.as_array();
      if (array == nullptr || !array->is_array_of_tables()) {
        return Error(line, name, "expected an array of tables: write each fault as [[faults]]");
      }
    } else if (name == "job" || name == "checkpoint" || name == "detection" || name == "anomaly" ||
               name == "recovery" || name == "control_plane" || name == "faults_schedule" ||
               name == "isolation" || name == "cluster") {
      if (!value.is_table())
        return Error(line, name, "expected a table: write it as [" + name + "]");
    } else {
      return Error(
          line, name,
          std::string(value.is_table() || value.is_array() ? "unknown table" : "unknown key") +
              "; the spec has the tables " + std::string(kTables));
    }
  }

  const toml::table* job = root["job"].as_table();
  if (job == nullptr) {
    return Error(1, "job", "missing [job] table: add one with name, command and state_dir");
  }
  ENDURE_RETURN_IF_ERROR(ParseJob(*job, spec));
  if (const toml::table* t = root["checkpoint"].as_table()) {
    ENDURE_RETURN_IF_ERROR(ParseCheckpoint(*t, spec));
  }
  if (spec.checkpoint.dir.empty()) spec.checkpoint.dir = JoinPath(spec.state_dir, "ckpt");
  if (const toml::table* t = root["detection"].as_table()) {
    ENDURE_RETURN_IF_ERROR(ParseDetection(*t, spec));
  }
  if (const toml::table* t = root["anomaly"].as_table()) {
    ENDURE_RETURN_IF_ERROR(
        Keys(*t, "anomaly",
             {{"on_data_spike", [&](const toml::node& v, const std::string& key) -> Status {
                 ENDURE_ASSIGN_OR_RETURN(std::string name, String(v, key));
                 Result<core::DataSpikeAction> a = core::ParseDataSpikeAction(name);
                 if (!a.ok()) return Error(v, key, a.status().message());
                 spec.detection.on_data_spike = *a;
                 return Status::Ok();
               }}}));
  }
  spec.recovery.paths["node_lost"] = core::RecoveryPath::kEvictAndReplace;
  if (const toml::table* t = root["recovery"].as_table()) {
    ENDURE_RETURN_IF_ERROR(ParseRecovery(*t, spec));
  }
  if (spec.min_nodes > 0 && !spec.recovery.in_process) {
    return Error(lines_["job.min_nodes"], "job.min_nodes",
                 "a job shrinks and grows back in process: it needs [recovery] in_process = "
                 "true");
  }
  if (const toml::table* t = root["control_plane"].as_table()) {
    ENDURE_RETURN_IF_ERROR(ParseControlPlane(*t, spec));
  }
  if (const toml::table* t = root["isolation"].as_table()) {
    ENDURE_RETURN_IF_ERROR(ParseIsolation(*t, spec));
  }
  if (const toml::table* t = root["cluster"].as_table()) {
    ENDURE_RETURN_IF_ERROR(Keys(
        *t, "cluster", {{"state_dir", [&](const toml::node& v, const std::string& key) -> Status {
                           ENDURE_ASSIGN_OR_RETURN(spec.cluster.state_dir, String(v, key));
                           if (spec.cluster.state_dir.empty()) {
                             return Error(v, key, "must not be empty (leave it out instead)");
                           }
                           return Status::Ok();
                         }}}));
  }
  if (const toml::array* faults = root["faults"].as_array()) {
    int index = 0;
    for (const toml::node& element : *faults) {
      ENDURE_RETURN_IF_ERROR(ParseFault(*element.as_table(), index++, spec));
    }
  }
  if (const toml::table* t = root["faults_schedule"].as_table()) {
    ENDURE_RETURN_IF_ERROR(ParseSchedule(*t, spec));
  }
  // Ids are unique across [[faults]] and the schedule.
  std::map<std::string, int> ids;
  for (size_t i = 0; i < spec.faults.size(); ++i) {
    const std::string& id = spec.faults[i].id;
    if (!ids.emplace(id, static_cast<int>(i)).second) {
      const std::string key = "faults[" + std::to_string(i) + "].id";
      return Error(lines_[key] > 0 ? lines_[key] : lines_["faults_schedule"], key,
                   "duplicate fault id '" + id + "': give each fault its own id");
    }
  }
  return Status::Ok();
}

Status SpecParser::ParseJob(const toml::table& t, JobSpec& spec) {
  ENDURE_RETURN_IF_ERROR(Keys(
      t, "job",
      {{"name",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(spec.name, String(v, key));
          if (!ValidJobName(spec.name)) {
            return Error(v, key,
                         "'" + spec.name +
                             "' is not a valid job name: use letters, digits, '_', "
                             "'.' and '-'");
          }
          return Status::Ok();
        }},
       {"command",
        [&](const toml::node& v, const std::string& key) -> Status {
          const toml::array* a = v.as_array();
          if (a == nullptr)
            return WrongType(v, key, "an array of strings such as [\"python\", \"train.py\"]");
          if (a->empty())
            return Error(v, key, "must not be empty: give the worker's program and arguments");
          for (const toml::node& arg : *a) {
            if (!arg.is_string()) return WrongType(arg, key, "an array of strings");
            spec.command.push_back(arg.as_string()->get());
          }
          if (spec.command[0].empty()) return Error(v, key, "the program (first element) is empty");
          return Status::Ok();
        }},
       {"nodes",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(int64_t n, Integer(v, key, 1, kMaxNodes));
          spec.nodes = static_cast<int>(n);
          return Status::Ok();
        }},
       {"min_nodes",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(int64_t n, Integer(v, key, 1, kMaxNodes));
          spec.min_nodes = static_cast<int>(n);
          return Status::Ok();
        }},
       {"spares",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(int64_t n, Integer(v, key, 0, kMaxNodes));
          spec.spares = static_cast<int>(n);
          return Status::Ok();
        }},
       {"ranks_per_node",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(int64_t n, Integer(v, key, 1));
          if (n > kMaxRanksPerNode) {
            return Error(v, key,
                         "must be at most " + std::to_string(kMaxRanksPerNode) + ", got " +
                             std::to_string(n) +
                             ": it is the number of workers (GPUs) on one machine; use more "
                             "nodes for a larger world");
          }
          spec.ranks_per_node = static_cast<int>(n);
          return Status::Ok();
        }},
       {"state_dir",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(spec.state_dir, String(v, key));
          if (spec.state_dir.empty()) return Error(v, key, "must not be empty: give a directory");
          return Status::Ok();
        }},
       {"env",
        [&](const toml::node& v, const std::string& key) -> Status {
          const toml::table* env = v.as_table();
          if (env == nullptr)
            return WrongType(v, key, "a table of strings such as { NAME = \"value\" }");
          for (const auto& [name, value] : *env) {
            const std::string var_key = key + "." + std::string(name.str());
            if (name.str().empty() || name.str().find('=') != std::string_view::npos) {
              return Error(LineOf(name.source()), var_key, "not a valid environment variable name");
            }
            ENDURE_ASSIGN_OR_RETURN(spec.env[std::string(name.str())], String(value, var_key));
          }
          return Status::Ok();
        }},
       {"listen",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(spec.listen, String(v, key));
          const size_t colon = spec.listen.rfind(':');
          const std::string port = colon == std::string::npos ? "" : spec.listen.substr(colon + 1);
          int number = -1;
          const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), number);
          if (colon == 0 || port.empty() || ec != std::errc() || end != port.data() + port.size() ||
              number < 0 || number > 65535) {
            return Error(v, key,
                         "'" + spec.listen +
                             "' is not HOST:PORT (e.g. \"127.0.0.1:0\", port 0 picks a free one)");
          }
          return Status::Ok();
        }},
       {"token",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(spec.token, String(v, key));
          return Status::Ok();
        }},
       {"tls", [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(spec.tls, Bool(v, key));
          return Status::Ok();
        }}}));
  for (const char* required : {"name", "command", "state_dir"}) {
    if (t.get(required) == nullptr) {
      return Error(LineOf(t.source()), std::string("job.") + required,
                   "missing: [job] needs name, command and state_dir");
    }
  }
  // Each factor is bounded, so the product fits; it is checked in 64 bits anyway.
  const int64_t world = int64_t{spec.nodes} * spec.ranks_per_node;
  if (world > kMaxWorldSize) {
    const std::string key =
        lines_["job.nodes"] > lines_["job.ranks_per_node"] ? "job.nodes" : "job.ranks_per_node";
    return Error(lines_[key], key,
                 "the world size nodes x ranks_per_node = " + std::to_string(spec.nodes) + " x " +
                     std::to_string(spec.ranks_per_node) + " = " + std::to_string(world) +
                     " is more than " + std::to_string(kMaxWorldSize) + " ranks");
  }
  if (spec.min_nodes > spec.nodes) {
    return Error(lines_["job.min_nodes"], "job.min_nodes",
                 "must be at most nodes = " + std::to_string(spec.nodes) + ", got " +
                     std::to_string(spec.min_nodes) +
                     " (the fewest nodes the job goes on with after losing some)");
  }
  return Status::Ok();
}

Status SpecParser::ParseCheckpoint(const toml::table& t, JobSpec& spec) {
  CheckpointSpec& c = spec.checkpoint;
  return Keys(t, "checkpoint",
              {{"every_steps",
                [&](const toml::node& v, const std::string& key) -> Status {
                  ENDURE_ASSIGN_OR_RETURN(c.every_steps, Integer(v, key, 0));
                  return Status::Ok();
                }},
               {"dir",
                [&](const toml::node& v, const std::string& key) -> Status {
                  ENDURE_ASSIGN_OR_RETURN(c.dir, String(v, key));
                  if (c.dir.empty())
                    return Error(v, key, "must not be empty (leave it out for STATE_DIR/ckpt)");
                  return Status::Ok();
                }},
               {"keep",
                [&](const toml::node& v, const std::string& key) -> Status {
                  ENDURE_ASSIGN_OR_RETURN(c.keep, Int(v, key, 1));
                  return Status::Ok();
                }},
               {"persist_every_steps",
                [&](const toml::node& v, const std::string& key) -> Status {
                  ENDURE_ASSIGN_OR_RETURN(c.persist_every_steps, Integer(v, key, 0));
                  return Status::Ok();
                }},
               {"replicas",
                [&](const toml::node& v, const std::string& key) -> Status {
                  ENDURE_ASSIGN_OR_RETURN(c.replicas, Int(v, key, 0));
                  if (c.replicas > 1) {
                    return Error(v, key,
                                 "must be 0 or 1 (one peer replica per node), got " +
                                     std::to_string(c.replicas));
                  }
                  return Status::Ok();
                }},
               {"memory",
                [&](const toml::node& v, const std::string& key) -> Status {
                  ENDURE_ASSIGN_OR_RETURN(c.memory, Bool(v, key));
                  return Status::Ok();
                }},
               {"memory_budget", [&](const toml::node& v, const std::string& key) -> Status {
                  ENDURE_ASSIGN_OR_RETURN(c.memory_budget_bytes, Bytes(v, key));
                  return Status::Ok();
                }}});
}

Status SpecParser::ParseDetection(const toml::table& t, JobSpec& spec) {
  DetectionSpec& d = spec.detection;
  auto duration = [&](Duration* out, bool positive) -> Handler {
    return [this, out, positive](const toml::node& v, const std::string& key) -> Status {
      ENDURE_ASSIGN_OR_RETURN(*out, Dur(v, key, positive));
      return Status::Ok();
    };
  };
  ENDURE_RETURN_IF_ERROR(Keys(
      t, "detection",
      {{"hang_timeout_floor", duration(&d.hang_timeout_floor, true)},
       {"hang_timeout_k",
        [&](const toml::node& v, const std::string& key) -> Status {
          // The learned timeout is k x p99 step time: below 1 it would fire on
          // an ordinary slow step.
          ENDURE_ASSIGN_OR_RETURN(d.hang_timeout_k, Number(v, key, 1.0, false));
          return Status::Ok();
        }},
       {"hang_window",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(int64_t n, Integer(v, key, 1, kMaxDetectionWindow));
          d.hang_window = static_cast<int>(n);
          return Status::Ok();
        }},
       {"startup_timeout", duration(&d.startup_timeout, true)},
       {"heartbeat_timeout", duration(&d.heartbeat_timeout, true)},
       {"loss_anomalies",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(d.loss_anomalies, Bool(v, key));
          return Status::Ok();
        }},
       {"loss_spike_z",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(d.loss_spike_z, Number(v, key, 0.0, true));
          return Status::Ok();
        }},
       {"loss_spike_min_jump",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(d.loss_spike_min_jump, Number(v, key, 0.0, false));
          return Status::Ok();
        }},
       {"loss_window",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(int64_t n, Integer(v, key, 2, kMaxDetectionWindow));
          d.loss_window = static_cast<int>(n);
          return Status::Ok();
        }},
       {"on_recurrence",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(std::string name, String(v, key));
          Result<core::AnomalyRecurrence> r = core::ParseAnomalyRecurrence(name);
          if (!r.ok()) return Error(v, key, r.status().message());
          d.on_recurrence = *r;
          return Status::Ok();
        }},
       {"log_rules",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(d.log_rules, String(v, key));
          return Status::Ok();
        }},
       {"stack_timeout",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(d.stack_timeout, Dur(v, key, true));
          return AtMost(v, key, d.stack_timeout, kMaxStopTimeout, "1h");
        }},
       {"progress_pattern",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(const std::string text, String(v, key));
          if (text.empty()) {
            return Error(v, key,
                         "must not be empty (leave it out to read no progress from output)");
          }
          // A preset's name, or a pattern, which the agents compile.
          d.progress_pattern = core::ExpandProgressPattern(text);
          if (Status st = core::ProgressPattern::Compile(d.progress_pattern).status(); !st.ok()) {
            return Error(v, key, st.message());
          }
          return Status::Ok();
        }},
       {"phase_timeout", duration(&d.phase_timeout, true)},
       {"stragglers",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(d.stragglers, Bool(v, key));
          return Status::Ok();
        }},
       {"straggler_theta",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(d.straggler_theta, Number(v, key, 0.0, true));
          if (d.straggler_theta > 10) return Error(v, key, "must be in (0, 10]");
          return Status::Ok();
        }},
       {"straggler_window",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(int64_t n, Integer(v, key, 1, kMaxDetectionWindow));
          d.straggler_window = static_cast<int>(n);
          return Status::Ok();
        }},
       {"straggler_min_excess", duration(&d.straggler_min_excess, false)},
       {"straggler_min_slow",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(int64_t n, Integer(v, key, 1, kMaxDetectionWindow));
          d.straggler_min_slow = static_cast<int>(n);
          lines_[key] = LineOf(v.source());
          return Status::Ok();
        }},
       {"sdc_check_every", [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(d.sdc_check_every, Integer(v, key, 0, int64_t{1} << 40));
          return Status::Ok();
        }}}));
  if (d.straggler_min_slow > d.straggler_window) {
    return Error(lines_["detection.straggler_min_slow"], "detection.straggler_min_slow",
                 "must not exceed straggler_window (" + std::to_string(d.straggler_window) +
                     "): it counts slow steps among the window's");
  }
  return Status::Ok();
}

Status SpecParser::ParseIsolation(const toml::table& t, JobSpec& spec) {
  IsolationSpec& i = spec.isolation;
  auto boolean = [&](bool* out) -> Handler {
    return [this, out](const toml::node& v, const std::string& key) -> Status {
      ENDURE_ASSIGN_OR_RETURN(*out, Bool(v, key));
      return Status::Ok();
    };
  };
  auto duration = [&](Duration* out) -> Handler {
    return [this, out](const toml::node& v, const std::string& key) -> Status {
      ENDURE_ASSIGN_OR_RETURN(*out, Dur(v, key, true));
      return Status::Ok();
    };
  };
  return Keys(t, "isolation",
              {{"over_evict", boolean(&i.over_evict)},
               {"pairwise_test", boolean(&i.pairwise_test)},
               {"health_check", boolean(&i.health_check)},
               {"pairwise_timeout", duration(&i.pairwise_timeout)},
               {"pairwise_slow_factor",
                [&](const toml::node& v, const std::string& key) -> Status {
                  ENDURE_ASSIGN_OR_RETURN(i.pairwise_slow_factor, Number(v, key, 1.0, true));
                  return Status::Ok();
                }},
               {"soft_strikes",
                [&](const toml::node& v, const std::string& key) -> Status {
                  ENDURE_ASSIGN_OR_RETURN(int64_t n, Integer(v, key, 1, 1000));
                  i.soft_strikes = static_cast<int>(n);
                  return Status::Ok();
                }},
               {"soft_window", duration(&i.soft_window)},
               {"restart_cost", duration(&i.restart_cost)},
               {"replacement_wait", duration(&i.replacement_wait)},
               {"straggler_horizon", duration(&i.straggler_horizon)}});
}

Status SpecParser::ParseRecovery(const toml::table& t, JobSpec& spec) {
  RecoverySpec& r = spec.recovery;
  auto duration = [&](Duration* out, bool positive) -> Handler {
    return [this, out, positive](const toml::node& v, const std::string& key) -> Status {
      lines_[key] = LineOf(v.source());
      ENDURE_ASSIGN_OR_RETURN(*out, Dur(v, key, positive));
      return Status::Ok();
    };
  };
  auto integer = [&](int* out) -> Handler {
    return [this, out](const toml::node& v, const std::string& key) -> Status {
      ENDURE_ASSIGN_OR_RETURN(*out, Int(v, key, 0));
      return Status::Ok();
    };
  };
  ENDURE_RETURN_IF_ERROR(
      Keys(t, "recovery",
           {{"max_restarts", integer(&r.max_restarts)},
            {"restart_window", duration(&r.restart_window, true)},
            {"backoff_initial", duration(&r.backoff_initial, false)},
            {"backoff_max", duration(&r.backoff_max, false)},
            {"grace_period",
             [&](const toml::node& v, const std::string& key) -> Status {
               ENDURE_ASSIGN_OR_RETURN(r.grace_period, Dur(v, key, false));
               return AtMost(v, key, r.grace_period, kMaxStopTimeout, "1h");
             }},
            {"structural_repeats", integer(&r.structural_repeats)},
            {"evict_node_after", integer(&r.evict_node_after)},
            {"startup_repeats", integer(&r.startup_repeats)},
            {"repair_delay", duration(&r.repair_delay, false)},
            {"replacement_timeout", duration(&r.replacement_timeout, false)},
            {"warm_standby",
             [&](const toml::node& v, const std::string& key) -> Status {
               ENDURE_ASSIGN_OR_RETURN(r.warm_standby, Bool(v, key));
               return Status::Ok();
             }},
            {"in_process",
             [&](const toml::node& v, const std::string& key) -> Status {
               ENDURE_ASSIGN_OR_RETURN(r.in_process, Bool(v, key));
               return Status::Ok();
             }},
            {"paths", [&](const toml::node& v, const std::string& key) -> Status {
               const toml::table* paths = v.as_table();
               if (paths == nullptr) {
                 return WrongType(v, key, "a table of cause = \"restart\" | \"evict\" | \"wait\"");
               }
               for (const auto& [cause, value] : *paths) {
                 const std::string cause_key = key + "." + std::string(cause.str());
                 ENDURE_ASSIGN_OR_RETURN(std::string name, String(value, cause_key));
                 Result<core::RecoveryPath> p = core::ParseRecoveryPath(name);
                 if (!p.ok()) return Error(value, cause_key, p.status().message());
                 r.paths[std::string(cause.str())] = *p;
               }
               return Status::Ok();
             }}}));
  if (r.backoff_max < r.backoff_initial) {
    const int line = lines_.count("recovery.backoff_max") ? lines_["recovery.backoff_max"]
                                                          : lines_["recovery.backoff_initial"];
    return Error(line, "recovery.backoff_max",
                 "must be at least backoff_initial (" + FormatDuration(r.backoff_initial) +
                     "), got " + FormatDuration(r.backoff_max));
  }
  return Status::Ok();
}

Status SpecParser::ParseFault(const toml::table& t, int index, JobSpec& spec) {
  const std::string prefix = "faults[" + std::to_string(index) + "]";
  const int line = LineOf(t.source());
  faults::Fault f;
  f.id = "fault-" + std::to_string(index);
  ENDURE_RETURN_IF_ERROR(Keys(
      t, prefix,
      {{"kind",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(std::string name, String(v, key));
          Result<faults::FaultKind> k = faults::ParseFaultKind(name);
          if (!k.ok()) return Error(v, key, k.status().message());
          f.kind = *k;
          return Status::Ok();
        }},
       {"rank",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(f.rank, Int(v, key, 0));
          if (f.rank >= spec.world_size()) {
            return Error(v, key,
                         "rank " + std::to_string(f.rank) + " is outside the job's " +
                             std::to_string(spec.world_size()) + " ranks (nodes x ranks_per_node)");
          }
          return Status::Ok();
        }},
       {"node",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(f.node, String(v, key));
          const std::optional<int> n = NodeIndex(f.node);
          if (!n || *n >= spec.nodes) {
            return Error(v, key,
                         "'" + f.node + "' is not a node of this job: use node0 .. node" +
                             std::to_string(spec.nodes - 1));
          }
          return Status::Ok();
        }},
       {"step",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(f.step, Integer(v, key, 1));
          return Status::Ok();
        }},
       {"at",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(f.at, Dur(v, key, false));
          return Status::Ok();
        }},
       {"exit_code",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(f.exit_code, Int(v, key, 1));
          return Status::Ok();
        }},
       {"factor",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(f.factor, Number(v, key, 1.0, true));
          return Status::Ok();
        }},
       {"line",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(f.line, String(v, key));
          return Status::Ok();
        }},
       // bitflip: which parameter tensor, element and bit.
       {"tensor",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(int64_t n, Integer(v, key, 0, 1 << 30));
          f.tensor = static_cast<int>(n);
          return Status::Ok();
        }},
       {"element",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(f.element, Integer(v, key, 0, int64_t{1} << 53));
          return Status::Ok();
        }},
       {"bit",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(int64_t n, Integer(v, key, 0, 63));
          f.bit = static_cast<int>(n);
          return Status::Ok();
        }},
       {"id", [&](const toml::node& v, const std::string& key) -> Status {
          lines_[key] = LineOf(v.source());
          ENDURE_ASSIGN_OR_RETURN(f.id, String(v, key));
          if (f.id.empty())
            return Error(v, key, "must not be empty (leave it out for \"fault-N\")");
          return Status::Ok();
        }}}));
  if (t.get("kind") == nullptr) {
    return Error(
        line, prefix + ".kind",
        "missing: say which fault (kill, exit, hang, nan, slow, log, kill-agent, disk-full, "
        "disk-error, corrupt-t0, corrupt-t1, bitflip, comm-fail or comm-slow)");
  }
  if (f.kind == faults::FaultKind::kKillAgent && !f.node.empty() && f.rank >= 0 &&
      f.rank / spec.ranks_per_node != NodeIndex(f.node)) {
    return Error(line, prefix + ".node",
                 "rank " + std::to_string(f.rank) + " does not run on " + f.node +
                     ": give the node or a rank, not both");
  }
  if (f.kind != faults::FaultKind::kKillAgent && !f.node.empty()) {
    return Error(line, prefix + ".node", "only kill-agent faults take a node; give a rank instead");
  }
  if (Status st = faults::Validate(f); !st.ok()) return Error(line, prefix, st.message());
  if (!lines_.count(prefix + ".id")) lines_[prefix + ".id"] = line;
  spec.faults.push_back(std::move(f));
  return Status::Ok();
}

Status SpecParser::ParseControlPlane(const toml::table& t, JobSpec& spec) {
  ControlPlaneSpec& c = spec.control_plane;
  ENDURE_RETURN_IF_ERROR(Keys(
      t, "control_plane",
      {{"controller_grace",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(c.controller_grace, Dur(v, key, false));
          return AtMost(v, key, c.controller_grace, kMaxControllerGrace, "30d");
        }},
       {"standby",
        [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(c.standby, Bool(v, key));
          return Status::Ok();
        }},
       {"lease", [&](const toml::node& v, const std::string& key) -> Status {
          ENDURE_ASSIGN_OR_RETURN(c.lease, Dur(v, key, true));
          // etcd's lease TTL: whole seconds, and nothing shorter than 2 s.
          if (c.lease < std::chrono::seconds(2) || c.lease > std::chrono::hours(1) ||
              c.lease % std::chrono::seconds(1) != Duration::zero()) {
            return Error(
                v, key,
                "must be whole seconds in [2s, 1h] (an etcd lease), got " + v.as_string()->get());
          }
          return Status::Ok();
        }}}));
  // The agents must ride out a takeover: with a grace no longer than the
  // lease (and a second to move), they would stop the workers first.
  if (c.standby && c.controller_grace <= c.lease + std::chrono::seconds(1)) {
    const bool grace_set = lines_.count("control_plane.controller_grace") > 0;
    const std::string key = grace_set ? "control_plane.controller_grace" : "control_plane.lease";
    return Error(lines_[key], key,
                 "controller_grace (" + FormatDuration(c.controller_grace) +
                     ") must be longer than the standby's lease (" + FormatDuration(c.lease) +
                     ") and a second, or the agents stop their workers before a standby "
                     "takes over");
  }
  return Status::Ok();
}

Status SpecParser::ParseSchedule(const toml::table& t, JobSpec& spec) {
  FaultScheduleSpec s;
  ENDURE_RETURN_IF_ERROR(
      Keys(t, "faults_schedule",
           {{"mtbf",
             [&](const toml::node& v, const std::string& key) -> Status {
               ENDURE_ASSIGN_OR_RETURN(s.mtbf, Dur(v, key, true));
               return Status::Ok();
             }},
            {"seed",
             [&](const toml::node& v, const std::string& key) -> Status {
               ENDURE_ASSIGN_OR_RETURN(int64_t seed, Integer(v, key, 0));
               s.seed = static_cast<uint64_t>(seed);
               return Status::Ok();
             }},
            {"kind",
             [&](const toml::node& v, const std::string& key) -> Status {
               ENDURE_ASSIGN_OR_RETURN(std::string name, String(v, key));
               Result<faults::FaultKind> k = faults::ParseFaultKind(name);
               if (!k.ok()) return Error(v, key, k.status().message());
               s.kind = *k;
               return Status::Ok();
             }},
            {"horizon",
             [&](const toml::node& v, const std::string& key) -> Status {
               ENDURE_ASSIGN_OR_RETURN(s.horizon, Dur(v, key, true));
               return Status::Ok();
             }},
            {"node_loss_share", [&](const toml::node& v, const std::string& key) -> Status {
               std::optional<double> share = v.value<double>();
               if (!share || !(*share >= 0 && *share <= 1)) {
                 return Error(v, key,
                              "must be a number from 0 to 1 (the share of the faults "
                              "that are node losses, kill-agent)");
               }
               s.node_loss_share = *share;
               return Status::Ok();
             }}}));
  const int line = LineOf(t.source());
  lines_["faults_schedule"] = line;
  if (t.get("mtbf") == nullptr) {
    return Error(line, "faults_schedule.mtbf",
                 "missing: give the mean time between faults, e.g. \"60s\"");
  }
  // Bounded with the listed faults: the total is what the controller holds.
  const int64_t room =
      std::max<int64_t>(0, faults::kMaxScheduledFaults - static_cast<int64_t>(spec.faults.size()));
  Result<std::vector<faults::Fault>> drawn = faults::PoissonSchedule(
      s.mtbf, s.seed, s.horizon, spec.world_size(), s.kind, room, s.node_loss_share);
  if (!drawn.ok()) {
    const std::string key = "faults_schedule.mtbf";
    return Error(lines_.count(key) ? lines_[key] : line, key, drawn.status().message());
  }
  for (faults::Fault& f : *drawn) spec.faults.push_back(std::move(f));
  spec.schedule = s;
  return Status::Ok();
}

}  // namespace

Result<JobSpec> ParseJobSpec(std::string_view text, const std::string& path) {
  JobSpec spec;
  spec.path = path;
  SpecParser parser(path);
  ENDURE_RETURN_IF_ERROR(parser.Parse(text, spec));
  spec.key_lines = parser.lines();
  spec.digest = HexU64(Xxh3(text));
  return spec;
}

Result<JobSpec> LoadJobSpec(const std::string& path) {
  // A spec is a page of TOML: a huge file (or a device) is not read whole.
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(st)) {
    if (!std::filesystem::is_regular_file(st)) {
      return InvalidArgument(path + ": cannot read the job spec: not a regular file");
    }
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (!ec && size > static_cast<uintmax_t>(kMaxSpecBytes)) {
      return InvalidArgument(path + ": the job spec is " + std::to_string(size) +
                             " bytes; at most " + std::to_string(kMaxSpecBytes) + " are read");
    }
  }
  Result<std::string> text = Env::Default()->ReadFile(path);
  if (!text.ok()) {
    return InvalidArgument(path + ": cannot read the job spec: " + text.status().message());
  }
  return ParseJobSpec(*text, path);
}

Status ValidateForEmbeddedRun(const JobSpec& spec) {
  auto error = [&](const std::string& key, const std::string& message) {
    auto it = spec.key_lines.find(key);
    const int line = it == spec.key_lines.end() ? 1 : std::max(it->second, 1);
    return InvalidArgument(spec.path + ":" + std::to_string(line) + ": key '" + key +
                           "': " + message);
  };
  const std::string across =
      "; for more, run `endure controller` on one host and `endure agent` on each node "
      "(README, \"How it works\")";
  if (spec.nodes + spec.spares > kMaxEmbeddedNodes) {
    return error(spec.spares > 0 ? "job.spares" : "job.nodes",
                 "endure run starts every node as a process on this machine: at most " +
                     std::to_string(kMaxEmbeddedNodes) + " nodes (spares included), got " +
                     std::to_string(spec.nodes + spec.spares) + across);
  }
  if (spec.world_size() > kMaxEmbeddedWorldSize) {
    auto line = [&](const char* key) {
      auto it = spec.key_lines.find(key);
      return it == spec.key_lines.end() ? 0 : it->second;
    };
    const std::string key =
        line("job.nodes") > line("job.ranks_per_node") ? "job.nodes" : "job.ranks_per_node";
    return error(key, "endure run starts every rank as a process on this machine: at most " +
                          std::to_string(kMaxEmbeddedWorldSize) + " ranks (nodes x " +
                          "ranks_per_node), got " + std::to_string(spec.world_size()) + across);
  }
  if (spec.control_plane.standby && !Env::Default()->Exists(kEtcdBinary)) {
    return error("control_plane.standby",
                 std::string("a standby controller needs etcd, and ") + kEtcdBinary +
                     " is missing: install Debian's etcd-server (scripts/install-deps)");
  }
  return Status::Ok();
}

core::JobMachineOptions MachineOptions(const JobSpec& spec) {
  core::JobMachineOptions o;
  o.nodes = spec.nodes;
  o.ranks_per_node = spec.ranks_per_node;
  o.min_nodes = spec.min_nodes;
  const DetectionSpec& d = spec.detection;
  o.hang.floor = d.hang_timeout_floor;
  o.heartbeat.timeout = d.heartbeat_timeout;
  // A node whose stream dropped is lost after the grace or the heartbeat
  // timeout, whichever is shorter: a timeout under the grace shortens it.
  o.heartbeat.drop_grace = std::min(o.heartbeat.drop_grace, d.heartbeat_timeout);
  o.hang.k = d.hang_timeout_k;
  o.hang.window = d.hang_window;
  o.hang.min_samples = std::min(o.hang.min_samples, d.hang_window);
  o.hang.startup_timeout = d.startup_timeout;
  o.detect_loss_anomalies = d.loss_anomalies;
  o.loss.window = d.loss_window;
  o.loss.min_count = std::min(o.loss.min_count, d.loss_window);
  o.loss.z_threshold = d.loss_spike_z;
  o.loss.min_jump = d.loss_spike_min_jump;
  o.anomaly.on_data_spike = d.on_data_spike;
  o.isolation.straggler.min_excess_s = Seconds(d.straggler_min_excess);
  o.anomaly.on_recurrence = d.on_recurrence;
  o.hang.phase_first_timeout = d.phase_timeout;
  o.isolation.straggler.enabled = d.stragglers;
  o.isolation.straggler.theta = d.straggler_theta;
  o.isolation.straggler.window = d.straggler_window;
  o.isolation.straggler.min_slow = d.straggler_min_slow;
  o.isolation.sdc_check_every = d.sdc_check_every;
  const IsolationSpec& i = spec.isolation;
  o.isolation.over_evict = i.over_evict;
  o.isolation.pairwise_test = i.pairwise_test;
  o.isolation.pairwise_timeout = i.pairwise_timeout;
  o.isolation.pairwise.slow_factor = i.pairwise_slow_factor;
  o.isolation.health.soft_strikes = i.soft_strikes;
  o.isolation.health.soft_window = i.soft_window;
  o.isolation.restart_cost = i.restart_cost;
  o.isolation.replacement_wait = i.replacement_wait;
  o.isolation.straggler_horizon = i.straggler_horizon;
  const RecoverySpec& r = spec.recovery;
  o.recovery.max_restarts_in_window = r.max_restarts;
  o.recovery.restart_window = r.restart_window;
  o.recovery.backoff_initial = r.backoff_initial;
  o.recovery.backoff_max = r.backoff_max;
  o.recovery.structural_repeats = r.structural_repeats;
  o.recovery.evict_node_after = r.evict_node_after;
  o.recovery.startup_repeats = r.startup_repeats;
  o.replacement_timeout = r.replacement_timeout;
  o.in_process = r.in_process;
  o.recovery.paths.clear();
  for (const auto& [cause, path] : r.paths) o.recovery.paths[cause] = path;
  const CheckpointSpec& c = spec.checkpoint;
  o.checkpoint.keep = c.keep;
  o.checkpoint.replicas = c.replicas;
  o.checkpoint.persist_every_steps = c.persist_every_steps;
  o.checkpoint.memory_budget = static_cast<uint64_t>(c.memory_budget_bytes);
  o.checkpoint.ranks_per_node = spec.ranks_per_node;
  return o;
}

std::vector<core::ExternalFault> ExternalFaults(const JobSpec& spec) {
  std::vector<core::ExternalFault> out;
  for (const faults::Fault& f : spec.faults) {
    const bool agent = f.kind == faults::FaultKind::kKillAgent;
    if (!faults::FiredByController(f.kind) && !f.at) continue;
    core::ExternalFault e;
    e.id = f.id;
    e.kind = f.kind;
    int rank = f.rank;
    // The parser accepted only "nodeN" with N a node of the job.
    if (agent && !f.node.empty()) rank = NodeIndex(f.node).value_or(0) * spec.ranks_per_node;
    if (agent && rank >= 0) rank -= rank % spec.ranks_per_node;
    e.rank = core::Rank{rank};
    e.step = core::StepNumber{f.step};
    e.at = f.at;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace endure::controller
