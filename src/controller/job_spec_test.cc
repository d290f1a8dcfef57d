// Job spec parsing: the issue-3 example, defaults, every class of error with
// its file, line and key, and the mapping into the cores' options.
#include "controller/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include "common/env.h"

namespace endure::controller {
namespace {

using testing::AllOf;
using testing::HasSubstr;

constexpr char kIssueExample[] = R"([job]
name = "demo"
command = ["build/bin/endure-train", "--steps", "300"]
nodes = 2
ranks_per_node = 1
state_dir = "runs/demo"
[checkpoint]
every_steps = 10
[detection]
hang_timeout_floor = "2s"
startup_timeout = "60s"
[recovery]
max_restarts = 20
[[faults]]
kind = "kill"
rank = 1
step = 40
)";

constexpr char kMinimal[] = R"([job]
name = "j"
command = ["train"]
state_dir = "st"
)";

// Error message of parsing `text` as "job.toml".
std::string ErrorOf(const std::string& text) {
  Result<JobSpec> spec = ParseJobSpec(text, "job.toml");
  EXPECT_FALSE(spec.ok()) << text;
  if (spec.ok()) return "";
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  return spec.status().message();
}

// A heartbeat timeout under the default grace of a dropped stream (2 s)
// made machine options that do not validate: the controller stopped on its
// check when it built the job machine (found by fuzz_job_spec).
TEST(JobSpec, AHeartbeatTimeoutUnderTheDropGraceShortensIt) {
  for (const char* timeout : {"1s", "1.s", "500ms", "10s"}) {
    SCOPED_TRACE(timeout);
    Result<JobSpec> spec = ParseJobSpec(
        std::string(kMinimal) + "[detection]\nheartbeat_timeout = \"" + timeout + "\"\n",
        "job.toml");
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const core::JobMachineOptions o = MachineOptions(*spec);
    EXPECT_TRUE(o.Validate().ok()) << o.Validate().ToString();
    EXPECT_EQ(o.heartbeat.timeout, spec->detection.heartbeat_timeout);
    EXPECT_LE(o.heartbeat.drop_grace, o.heartbeat.timeout);
  }
}

// Issue 14: spares, the in-process route and a schedule with node losses.
TEST(JobSpec, SparesInProcessAndNodeLossShare) {
  Result<JobSpec> plain = ParseJobSpec(kMinimal, "job.toml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->spares, 0);
  EXPECT_TRUE(plain->recovery.in_process);
  EXPECT_TRUE(MachineOptions(*plain).in_process);
  Result<JobSpec> set = ParseJobSpec(std::string(kMinimal) +
                                         "nodes = 2\nspares = 1\n[recovery]\nin_process = false\n"
                                         "[faults_schedule]\nmtbf = \"10s\"\nhorizon = \"1h\"\n"
                                         "node_loss_share = 0.5\n",
                                     "job.toml");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->spares, 1);
  EXPECT_FALSE(set->recovery.in_process);
  EXPECT_FALSE(MachineOptions(*set).in_process);
  int losses = 0;
  for (const faults::Fault& f : set->faults) losses += f.kind == faults::FaultKind::kKillAgent;
  EXPECT_GT(losses, 0);
  EXPECT_LT(losses, static_cast<int>(set->faults.size()));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "spares = -1\n"), HasSubstr("job.toml:5"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[recovery]\nin_process = \"yes\"\n"),
              HasSubstr("job.toml:6: key 'recovery.in_process'"));
  EXPECT_THAT(
      ErrorOf(std::string(kMinimal) + "[faults_schedule]\nmtbf = \"1m\"\nnode_loss_share = 1.5\n"),
      HasSubstr("job.toml:7: key 'faults_schedule.node_loss_share': must be a number "
                "from 0 to 1"));
}

TEST(JobSpec, MinNodesMakesTheJobElasticDownToIt) {
  Result<JobSpec> plain = ParseJobSpec(kMinimal, "job.toml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(MachineOptions(*plain).min_nodes, 0);
  Result<JobSpec> set =
      ParseJobSpec(std::string(kMinimal) + "nodes = 4\nmin_nodes = 2\n", "job.toml");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(MachineOptions(*set).min_nodes, 2);
  EXPECT_TRUE(MachineOptions(*set).Validate().ok());
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "nodes = 2\nmin_nodes = 3\n"),
              HasSubstr("job.toml:6: key 'job.min_nodes': must be at most nodes = 2, got 3"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "min_nodes = 0\n"), HasSubstr("key 'job.min_nodes'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "nodes = 2\nmin_nodes = 1\n[recovery]\n"
                                              "in_process = false\n"),
              HasSubstr("key 'job.min_nodes': a job shrinks and grows back in process"));
}

TEST(JobSpec, TlsIsABoolOffByDefault) {
  Result<JobSpec> plain = ParseJobSpec(kMinimal, "job.toml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->tls);
  Result<JobSpec> on = ParseJobSpec(std::string(kMinimal) + "tls = true\n", "job.toml");
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_TRUE(on->tls);
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "tls = \"yes\"\n"),
              AllOf(HasSubstr("job.toml:5"), HasSubstr("job.tls")));
}

TEST(JobSpec, ControllerGraceDefaultsToFiveMinutesAndIsBounded) {
  Result<JobSpec> plain = ParseJobSpec(kMinimal, "job.toml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->control_plane.controller_grace, std::chrono::minutes(5));
  Result<JobSpec> set = ParseJobSpec(
      std::string(kMinimal) + "[control_plane]\ncontroller_grace = \"90s\"\n", "job.toml");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(set->control_plane.controller_grace, std::chrono::seconds(90));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[control_plane]\ncontroller_grace = 90\n"),
              AllOf(HasSubstr("job.toml:6"), HasSubstr("control_plane.controller_grace")));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[control_plane]\ncontroller_grace = \"31d\"\n"),
              HasSubstr("must be at most 30d"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[control_plane]\nstandbye = true\n"),
              HasSubstr("unknown key in [control_plane]; valid keys are controller_grace"));
}

TEST(JobSpec, StandbyIsOffByDefaultAndItsLeaseIsWholeSecondsFromTwo) {
  Result<JobSpec> plain = ParseJobSpec(kMinimal, "job.toml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_FALSE(plain->control_plane.standby);
  EXPECT_EQ(plain->control_plane.lease, std::chrono::seconds(5));
  Result<JobSpec> set = ParseJobSpec(
      std::string(kMinimal) + "[control_plane]\nstandby = true\nlease = \"3s\"\n", "job.toml");
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_TRUE(set->control_plane.standby);
  EXPECT_EQ(set->control_plane.lease, std::chrono::seconds(3));
  EXPECT_THAT(
      ErrorOf(std::string(kMinimal) + "[control_plane]\nstandby = \"yes\"\n"),
      AllOf(HasSubstr("job.toml:6"), HasSubstr("control_plane.standby"), HasSubstr("a boolean")));
  for (const char* bad : {"1s", "2500ms", "2h"}) {
    EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[control_plane]\nlease = \"" + bad + "\"\n"),
                AllOf(HasSubstr("job.toml:6"), HasSubstr("control_plane.lease"),
                      HasSubstr("whole seconds in [2s, 1h]")))
        << bad;
  }
  // The agents' grace must outlast a takeover.
  EXPECT_THAT(ErrorOf(std::string(kMinimal) +
                      "[control_plane]\nstandby = true\nlease = \"10s\"\ncontroller_grace = "
                      "\"10s\"\n"),
              AllOf(HasSubstr("job.toml:8"), HasSubstr("control_plane.controller_grace"),
                    HasSubstr("must be longer than the standby's lease")));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[control_plane]\nstandby = true\nlease = \"1h\"\n"),
              AllOf(HasSubstr("job.toml:7"), HasSubstr("control_plane.lease"),
                    HasSubstr("controller_grace (5m")));
  EXPECT_TRUE(
      ParseJobSpec(std::string(kMinimal) + "[control_plane]\nlease = \"1h\"\n", "job.toml").ok())
      << "without a standby the lease does not matter";
}

TEST(JobSpec, ParsesTheIssueExample) {
  Result<JobSpec> spec = ParseJobSpec(kIssueExample, "demo.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->path, "demo.toml");
  EXPECT_EQ(spec->name, "demo");
  EXPECT_EQ(spec->command, (std::vector<std::string>{"build/bin/endure-train", "--steps", "300"}));
  EXPECT_EQ(spec->nodes, 2);
  EXPECT_EQ(spec->ranks_per_node, 1);
  EXPECT_EQ(spec->world_size(), 2);
  EXPECT_EQ(spec->state_dir, "runs/demo");
  EXPECT_EQ(spec->checkpoint.every_steps, 10);
  EXPECT_EQ(spec->checkpoint.dir, "runs/demo/ckpt");
  EXPECT_EQ(spec->detection.hang_timeout_floor, std::chrono::seconds(2));
  EXPECT_EQ(spec->detection.startup_timeout, std::chrono::seconds(60));
  EXPECT_EQ(spec->recovery.max_restarts, 20);
  ASSERT_EQ(spec->faults.size(), 1u);
  EXPECT_EQ(spec->faults[0].id, "fault-0");
  EXPECT_EQ(spec->faults[0].kind, faults::FaultKind::kKill);
  EXPECT_EQ(spec->faults[0].rank, 1);
  EXPECT_EQ(spec->faults[0].step, 40);
  EXPECT_FALSE(spec->faults[0].at.has_value());
}

TEST(JobSpec, ShippedDemoParses) {
  Result<JobSpec> spec = LoadJobSpec(std::string(ENDURE_SOURCE_DIR) + "/examples/demo.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->nodes, 2);
  EXPECT_EQ(spec->faults.size(), 3u);
}

TEST(JobSpec, AppliesDefaults) {
  Result<JobSpec> spec = ParseJobSpec(kMinimal, "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->nodes, 1);
  EXPECT_EQ(spec->ranks_per_node, 1);
  EXPECT_TRUE(spec->env.empty());
  EXPECT_EQ(spec->listen, "127.0.0.1:0");
  EXPECT_EQ(spec->token, "");
  EXPECT_EQ(spec->checkpoint.every_steps, 0);
  EXPECT_EQ(spec->checkpoint.dir, "st/ckpt");
  EXPECT_EQ(spec->checkpoint.keep, 3);
  EXPECT_EQ(spec->checkpoint.persist_every_steps, 0);
  EXPECT_EQ(spec->checkpoint.replicas, 1);
  EXPECT_EQ(spec->checkpoint.memory_budget_bytes, 0);
  const DetectionSpec& d = spec->detection;
  EXPECT_EQ(d.hang_timeout_floor, std::chrono::seconds(2));
  EXPECT_DOUBLE_EQ(d.hang_timeout_k, 3.0);
  EXPECT_EQ(d.hang_window, 100);
  EXPECT_EQ(d.startup_timeout, std::chrono::seconds(60));
  EXPECT_EQ(d.heartbeat_timeout, std::chrono::seconds(10));
  EXPECT_TRUE(d.loss_anomalies);
  EXPECT_DOUBLE_EQ(d.loss_spike_z, 8.0);
  EXPECT_DOUBLE_EQ(d.loss_spike_min_jump, 1.0);
  EXPECT_EQ(d.loss_window, 200);
  EXPECT_EQ(d.on_recurrence, core::AnomalyRecurrence::kSkipStep);
  EXPECT_EQ(d.on_data_spike, core::DataSpikeAction::kContinue);
  EXPECT_EQ(d.straggler_min_excess, std::chrono::milliseconds(10));
  EXPECT_EQ(d.log_rules, "");
  EXPECT_EQ(d.stack_timeout, std::chrono::seconds(2));
  EXPECT_EQ(d.progress_pattern, "");
  const RecoverySpec& r = spec->recovery;
  EXPECT_EQ(r.max_restarts, 20);
  EXPECT_EQ(r.restart_window, std::chrono::hours(1));
  EXPECT_EQ(r.backoff_initial, std::chrono::seconds(1));
  EXPECT_EQ(r.backoff_max, std::chrono::seconds(30));
  EXPECT_EQ(r.grace_period, std::chrono::seconds(2));
  EXPECT_EQ(r.structural_repeats, 3);
  EXPECT_EQ(r.evict_node_after, 2);
  EXPECT_EQ(r.startup_repeats, 3);
  EXPECT_EQ(r.repair_delay, std::chrono::seconds(5));
  ASSERT_EQ(r.paths.size(), 1u);
  EXPECT_EQ(r.paths.at("node_lost"), core::RecoveryPath::kEvictAndReplace);
  EXPECT_TRUE(spec->faults.empty());
  EXPECT_FALSE(spec->schedule.has_value());
}

TEST(JobSpec, ParsesEveryKey) {
  const std::string text = R"([job]
name = "big.run-1"
command = ["python", "train.py"]
nodes = 4
ranks_per_node = 8
state_dir = "/var/endure/big"
env = { NCCL_DEBUG = "WARN", OMP_NUM_THREADS = "1" }
listen = "0.0.0.0:7000"
token = "s3cret"

[checkpoint]
every_steps = 100
dir = "/nfs/ckpt"
keep = 5
persist_every_steps = 1000
replicas = 0
memory = false
memory_budget = "2GiB"

[detection]
hang_timeout_floor = "500ms"
hang_timeout_k = 4
hang_window = 20
startup_timeout = "5m"
heartbeat_timeout = "3s"
loss_anomalies = false
loss_spike_z = 8.5
loss_spike_min_jump = 0.5
loss_window = 10
on_recurrence = "stop"
straggler_min_excess = "25ms"
log_rules = "my_rules.toml"
stack_timeout = "20s"
progress_pattern = 'step (?P<step>\d+) loss (?P<loss>\S+)'

[anomaly]
on_data_spike = "skip"

[recovery]
max_restarts = 0
restart_window = "2h"
backoff_initial = "0s"
backoff_max = "1m"
grace_period = "5s"
structural_repeats = 4
evict_node_after = 0
startup_repeats = 5
repair_delay = "1m30s"
paths = { xid_79 = "evict", nccl_timeout = "restart", node_lost = "wait" }

[[faults]]
kind = "exit"
rank = 3
step = 7
exit_code = 42
id = "exit-7"

[[faults]]
kind = "kill-agent"
node = "node2"
at = "90s"

[[faults]]
kind = "slow"
rank = 31
step = 5
factor = 2.5

[[faults]]
kind = "log"
rank = 0
step = 9
line = "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus."

[faults_schedule]
mtbf = "60s"
seed = 7
kind = "kill"
horizon = "5m"
)";
  Result<JobSpec> spec = ParseJobSpec(text, "big.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->name, "big.run-1");
  EXPECT_EQ(spec->world_size(), 32);
  EXPECT_EQ(spec->env.at("NCCL_DEBUG"), "WARN");
  EXPECT_EQ(spec->env.at("OMP_NUM_THREADS"), "1");
  EXPECT_EQ(spec->listen, "0.0.0.0:7000");
  EXPECT_EQ(spec->token, "s3cret");
  EXPECT_EQ(spec->checkpoint.dir, "/nfs/ckpt");
  EXPECT_EQ(spec->checkpoint.keep, 5);
  EXPECT_EQ(spec->checkpoint.persist_every_steps, 1000);
  EXPECT_EQ(spec->checkpoint.replicas, 0);
  EXPECT_FALSE(spec->checkpoint.memory);
  EXPECT_EQ(spec->checkpoint.memory_budget_bytes, int64_t{2} << 30);
  EXPECT_EQ(spec->detection.hang_timeout_floor, std::chrono::milliseconds(500));
  EXPECT_DOUBLE_EQ(spec->detection.hang_timeout_k, 4.0);
  EXPECT_FALSE(spec->detection.loss_anomalies);
  EXPECT_EQ(spec->detection.on_recurrence, core::AnomalyRecurrence::kStop);
  EXPECT_EQ(spec->detection.log_rules, "my_rules.toml");
  EXPECT_EQ(spec->detection.progress_pattern, R"(step (?P<step>\d+) loss (?P<loss>\S+))");
  EXPECT_EQ(spec->recovery.repair_delay, std::chrono::seconds(90));
  EXPECT_EQ(spec->recovery.paths.size(), 3u);
  EXPECT_EQ(spec->recovery.paths.at("node_lost"), core::RecoveryPath::kWaitForRepair);
  EXPECT_EQ(spec->recovery.paths.at("xid_79"), core::RecoveryPath::kEvictAndReplace);

  ASSERT_GE(spec->faults.size(), 4u);
  EXPECT_EQ(spec->faults[0].id, "exit-7");
  EXPECT_EQ(spec->faults[0].exit_code, 42);
  EXPECT_EQ(spec->faults[1].id, "fault-1");
  EXPECT_EQ(spec->faults[1].node, "node2");
  EXPECT_EQ(spec->faults[1].at, std::optional<Duration>(std::chrono::seconds(90)));
  EXPECT_DOUBLE_EQ(spec->faults[2].factor, 2.5);
  EXPECT_THAT(spec->faults[3].line, HasSubstr("Xid"));
  // The schedule is expanded after the listed faults, reproducibly.
  ASSERT_TRUE(spec->schedule.has_value());
  EXPECT_EQ(spec->schedule->seed, 7u);
  const std::vector<faults::Fault> expected =
      *faults::PoissonSchedule(std::chrono::seconds(60), 7, std::chrono::minutes(5), 32);
  ASSERT_EQ(spec->faults.size(), 4 + expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(spec->faults[4 + i], expected[i]);

  core::JobMachineOptions o = MachineOptions(*spec);
  EXPECT_TRUE(o.Validate().ok()) << o.Validate().ToString();
  EXPECT_EQ(o.nodes, 4);
  EXPECT_EQ(o.ranks_per_node, 8);
  EXPECT_EQ(o.hang.floor, std::chrono::milliseconds(500));
  EXPECT_DOUBLE_EQ(o.hang.k, 4.0);
  EXPECT_EQ(o.hang.window, 20);
  EXPECT_EQ(o.hang.startup_timeout, std::chrono::minutes(5));
  EXPECT_FALSE(o.detect_loss_anomalies);
  EXPECT_EQ(o.loss.window, 10);
  EXPECT_LE(o.loss.min_count, 10);
  EXPECT_DOUBLE_EQ(o.loss.z_threshold, 8.5);
  EXPECT_DOUBLE_EQ(o.loss.min_jump, 0.5);
  EXPECT_EQ(o.anomaly.on_data_spike, core::DataSpikeAction::kSkip);
  EXPECT_DOUBLE_EQ(o.isolation.straggler.min_excess_s, 0.025);
  EXPECT_EQ(o.anomaly.on_recurrence, core::AnomalyRecurrence::kStop);
  EXPECT_EQ(o.recovery.max_restarts_in_window, 0);
  EXPECT_EQ(o.recovery.restart_window, std::chrono::hours(2));
  EXPECT_EQ(o.recovery.backoff_initial, Duration(0));
  EXPECT_EQ(o.recovery.backoff_max, std::chrono::minutes(1));
  EXPECT_EQ(o.recovery.structural_repeats, 4);
  EXPECT_EQ(o.recovery.evict_node_after, 0);
  EXPECT_EQ(o.recovery.startup_repeats, 5);
  EXPECT_EQ(o.recovery.paths.at("xid_79"), core::RecoveryPath::kEvictAndReplace);

  // The controller fires kill-agent and time-keyed faults; the workers the rest.
  std::vector<core::ExternalFault> external = ExternalFaults(*spec);
  ASSERT_EQ(external.size(), 1 + expected.size());
  EXPECT_EQ(external[0].id, "fault-1");
  EXPECT_EQ(external[0].kind, faults::FaultKind::kKillAgent);
  EXPECT_EQ(external[0].rank.value, 16);  // node2's first rank
  EXPECT_EQ(external[0].at, std::optional<Duration>(std::chrono::seconds(90)));
  EXPECT_EQ(external[1].id, "sched-1");
  EXPECT_EQ(external[1].kind, faults::FaultKind::kKill);
  EXPECT_EQ(external[1].at, expected[0].at);
}

TEST(JobSpec, MachineOptionsOfDefaultsAreValid) {
  Result<JobSpec> spec = ParseJobSpec(kMinimal, "job.toml");
  ASSERT_TRUE(spec.ok());
  core::JobMachineOptions o = MachineOptions(*spec);
  EXPECT_TRUE(o.Validate().ok());
  EXPECT_EQ(o.recovery.paths.at("node_lost"), core::RecoveryPath::kEvictAndReplace);
  EXPECT_EQ(o.recovery.max_restarts_in_window, 20);
  EXPECT_EQ(o.recovery.backoff_initial, std::chrono::seconds(1));
  EXPECT_TRUE(ExternalFaults(*spec).empty());
}

TEST(JobSpec, MemoryBudgetUnits) {
  struct Case {
    std::string value;
    int64_t bytes;
  };
  for (const Case& c : std::vector<Case>{{"1024", 1024},
                                         {"\"512B\"", 512},
                                         {"\"4KiB\"", 4096},
                                         {"\"3MiB\"", 3 << 20},
                                         {"\"1.5GiB\"", int64_t{3} << 29},
                                         {"\"2KB\"", 2000},
                                         {"\"5MB\"", 5000000},
                                         {"\"1GB\"", 1000000000}}) {
    Result<JobSpec> spec = ParseJobSpec(
        std::string(kMinimal) + "[checkpoint]\nmemory_budget = " + c.value + "\n", "job.toml");
    ASSERT_TRUE(spec.ok()) << c.value << ": " << spec.status().ToString();
    EXPECT_EQ(spec->checkpoint.memory_budget_bytes, c.bytes) << c.value;
  }
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[checkpoint]\nmemory_budget = \"2TiB\"\n"),
              HasSubstr("job.toml:6: key 'checkpoint.memory_budget': unknown unit"));
}

TEST(JobSpec, ABadAnomalyActionOrStragglerFloorNamesItsLineAndTheChoices) {
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "[anomaly]\non_data_spike = \"ignore\"\n"),
            "job.toml:6: key 'anomaly.on_data_spike': unknown action on a reproduced loss spike "
            "'ignore': expected \"continue\", \"skip\" or \"stop\"");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "[anomaly]\nskip = true\n"),
            "job.toml:6: key 'anomaly.skip': unknown key in [anomaly]; valid keys are "
            "on_data_spike");
  EXPECT_NE(ErrorOf(std::string(kMinimal) + "[detection]\nstraggler_min_excess = \"-1ms\"\n")
                .find("job.toml:6: key 'detection.straggler_min_excess'"),
            std::string::npos);
}

TEST(JobSpec, UnknownKeyNamesItsLine) {
  EXPECT_EQ(
      ErrorOf(std::string(kMinimal) + "[detection]\nhang_timeout_floor = \"2s\"\n"
                                      "hang_timout = \"3s\"\n"),
      "job.toml:7: key 'detection.hang_timout': unknown key in [detection]; valid keys are "
      "hang_timeout_floor, hang_timeout_k, hang_window, startup_timeout, "
      "heartbeat_timeout, loss_anomalies, loss_spike_z, loss_spike_min_jump, loss_window, "
      "on_recurrence, "
      "log_rules, stack_timeout, progress_pattern, phase_timeout, stragglers, straggler_theta, "
      "straggler_window, straggler_min_excess, straggler_min_slow, sdc_check_every");
  EXPECT_THAT(ErrorOf("[job]\nname = \"j\"\ncomand = [\"x\"]\n"),
              HasSubstr("job.toml:3: key 'job.comand': unknown key in [job]"));
  EXPECT_THAT(ErrorOf(std::string(kIssueExample) + "colour = \"red\"\n"),
              HasSubstr("job.toml:18: key 'faults[0].colour': unknown key in [[faults]]"));
  // The first offending key in the file, not in alphabetical order.
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "zeta = 1\nalpha = 2\n"),
              HasSubstr("job.toml:5: key 'job.zeta': unknown key"));
}

TEST(JobSpec, UnknownTableNamesItsLine) {
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "\n[checkpoints]\nevery_steps = 5\n"),
              HasSubstr("job.toml:6: key 'checkpoints': unknown table; the spec has the tables "
                        "[job], [checkpoint]"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[job.extra]\nx = 1\n"),
              HasSubstr("job.toml:5: key 'job.extra': unknown table in [job]"));
  EXPECT_THAT(ErrorOf("top = 1\n" + std::string(kMinimal)),
              HasSubstr("job.toml:1: key 'top': unknown key"));
}

TEST(JobSpec, WrongTypeNamesTheExpectedType) {
  EXPECT_EQ(ErrorOf("[job]\nname = \"j\"\ncommand = \"train.py\"\nstate_dir = \"s\"\n"),
            "job.toml:3: key 'job.command': expected an array of strings such as [\"python\", "
            "\"train.py\"], got a string");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "nodes = \"2\"\n"),
            "job.toml:5: key 'job.nodes': expected an integer, got a string");
  EXPECT_EQ(ErrorOf(std::string(kMinimal) + "[detection]\nloss_anomalies = 1\n"),
            "job.toml:6: key 'detection.loss_anomalies': expected a boolean (true or false), got "
            "an integer");
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[detection]\nstartup_timeout = 60\n"),
              HasSubstr("job.toml:6: key 'detection.startup_timeout': expected a duration string "
                        "such as \"2s\" or \"500ms\", got an integer"));
  EXPECT_THAT(ErrorOf("[job]\nname = \"j\"\ncommand = [\"a\", 2]\nstate_dir = \"s\"\n"),
              HasSubstr("job.toml:3: key 'job.command': expected an array of strings, got an "
                        "integer"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "env = { A = 1 }\n"),
              HasSubstr("job.toml:5: key 'job.env.A': expected a string, got an integer"));
  EXPECT_THAT(ErrorOf("job = 3\n"), HasSubstr("job.toml:1: key 'job': expected a table"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[faults]\nkind = \"kill\"\n"),
              HasSubstr("job.toml:5: key 'faults': expected an array of tables"));
}

TEST(JobSpec, MissingRequiredKeys) {
  EXPECT_EQ(ErrorOf("[job]\nname = \"j\"\nstate_dir = \"s\"\n"),
            "job.toml:1: key 'job.command': missing: [job] needs name, command and state_dir");
  EXPECT_THAT(ErrorOf("# nothing\n[checkpoint]\nevery_steps = 3\n\n[job]\nname = \"j\"\n"
                      "command = [\"x\"]\n"),
              HasSubstr("job.toml:5: key 'job.state_dir': missing"));
  EXPECT_THAT(ErrorOf("[checkpoint]\nevery_steps = 3\n"),
              HasSubstr("job.toml:1: key 'job': missing [job] table"));
  EXPECT_THAT(ErrorOf("[job]\nname = \"j\"\ncommand = []\nstate_dir = \"s\"\n"),
              HasSubstr("job.toml:3: key 'job.command': must not be empty"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[[faults]]\nrank = 0\nstep = 3\n"),
              HasSubstr("job.toml:5: key 'faults[0].kind': missing"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[faults_schedule]\nseed = 3\n"),
              HasSubstr("job.toml:5: key 'faults_schedule.mtbf': missing"));
}

TEST(JobSpec, BadDurations) {
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[detection]\nhang_timeout_floor = \"2 parsecs\"\n"),
              HasSubstr("job.toml:6: key 'detection.hang_timeout_floor': invalid duration "
                        "'2 parsecs'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[recovery]\nrestart_window = \"-5m\"\n"),
              HasSubstr("job.toml:6: key 'recovery.restart_window': invalid duration '-5m'"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[detection]\nstartup_timeout = \"0s\"\n"),
              HasSubstr("job.toml:6: key 'detection.startup_timeout': must be longer than 0"));
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "[recovery]\nbackoff_initial = \"1m\"\n"
                                              "backoff_max = \"10s\"\n"),
              HasSubstr("job.toml:7: key 'recovery.backoff_max': must be at least "
                        "backoff_initial"));
}

TEST(JobSpec, BadFaults) {
  EXPECT_THAT(ErrorOf(std::string(kIssueExample) + "[[faults]]\nkind = \"kil\"\nrank = 0\n"
                                                   "step = 3\n"),
              HasSubstr("job.toml:19: key 'faults[1].kind': unknown fault kind 'kil'"));
  // Validate()'s message, at the line of the [[faults]] entry.
  EXPECT_THAT(ErrorOf(std::string(kIssueExample) + "\n[[faults]]\nkind = \"kill\"\nrank = 0\n"),
              HasSubstr("job.toml:19: key 'faults[1]': fault 'fault-1' (kill)"));
  EXPECT_THAT(ErrorOf(std::string(kIssueExample) + "[[faults]]\nkind = \"kill\"\nrank = 2\n"
                                                   "step = 3\n"),
              HasSubstr("job.toml:20: key 'faults[1].rank': rank 2 is outside the job's 2 ranks"));
  EXPECT_THAT(ErrorOf(std::string(kIssueExample) + "[[faults]]\nkind = \"kill-agent\"\n"
                                                   "node = \"node7\"\nat = \"5s\"\n"),
              HasSubstr("job.toml:20: key 'faults[1].node': 'node7' is not a node of this job: "
                        "use node0 .. node1"));
  EXPECT_THAT(ErrorOf(std::string(kIssueExample) + "[[faults]]\nkind = \"kill\"\nrank = 0\n"
                                                   "step = 3\nid = \"fault-0\"\n"),
              HasSubstr("job.toml:22: key 'faults[1].id': duplicate fault id 'fault-0'"));
  EXPECT_THAT(
      ErrorOf(std::string(kMinimal) + "[faults_schedule]\nmtbf = \"1m\"\nkind = \"boom\"\n"),
      HasSubstr("job.toml:7: key 'faults_schedule.kind': unknown fault kind 'boom'"));
}

TEST(JobSpec, NegativeAndOutOfRangeValues) {
  struct Case {
    std::string text;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"nodes = 0\n", "job.toml:5: key 'job.nodes': must be at least 1, got 0"},
           {"ranks_per_node = -2\n", "job.toml:5: key 'job.ranks_per_node': must be at least 1"},
           {"[checkpoint]\nevery_steps = -10\n",
            "job.toml:6: key 'checkpoint.every_steps': must be at least 0, got -10"},
           {"[checkpoint]\nkeep = 0\n", "job.toml:6: key 'checkpoint.keep': must be at least 1"},
           {"[checkpoint]\nreplicas = 2\n",
            "job.toml:6: key 'checkpoint.replicas': must be 0 or 1 (one peer replica per node), "
            "got 2"},
           {"[recovery]\nmax_restarts = -1\n",
            "job.toml:6: key 'recovery.max_restarts': must be at least 0, got -1"},
           {"[detection]\nhang_timeout_k = 0.5\n",
            "job.toml:6: key 'detection.hang_timeout_k': must be a finite number >= 1"},
           {"[detection]\nloss_spike_z = -1.0\n",
            "job.toml:6: key 'detection.loss_spike_z': must be a finite number > 0"},
           {"[detection]\nloss_window = 1\n", "job.toml:6: key 'detection.loss_window'"},
           {"[detection]\non_recurrence = \"ignore\"\n",
            "job.toml:6: key 'detection.on_recurrence':"},
           {"[recovery]\npaths = { oom = \"reboot\" }\n",
            "job.toml:6: key 'recovery.paths.oom': unknown recovery path 'reboot'"},
           {"listen = \"localhost\"\n",
            "job.toml:5: key 'job.listen': 'localhost' is not HOST:PORT"},
           {"name = \"my job\"\n", "key 'job.name'"},
       }) {
    std::string text = c.text.find("name =") == 0
                           ? "[job]\n" + c.text + "command = [\"x\"]\nstate_dir = \"s\"\n"
                           : std::string(kMinimal) + c.text;
    EXPECT_THAT(ErrorOf(text), HasSubstr(c.message)) << c.text;
  }
}

// Specs that used to crash or exhaust the machine: a world size that
// overflowed int (65536 x 65536 = 0, then SIGFPE), a schedule of 6e8 faults
// (bad_alloc), windows that reserve gigabytes, node numbers that made
// std::stoi throw, stop deadlines of days. Each is refused with its key.
TEST(JobSpec, AbsurdSizesAreRefusedWithTheirKey) {
  struct Case {
    std::string text;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"nodes = 65536\nranks_per_node = 65536\n",
            "job.toml:6: key 'job.ranks_per_node': must be at most 1024, got 65536: it is the "
            "number of workers (GPUs) on one machine"},
           {"nodes = 100001\n", "job.toml:5: key 'job.nodes': must be at most 100000, got 100001"},
           {"ranks_per_node = 16\nnodes = 100000\n",
            "job.toml:6: key 'job.nodes': the world size nodes x ranks_per_node = 100000 x 16 = "
            "1600000 is more than 1048576 ranks"},
           {"[faults_schedule]\nmtbf = \"1us\"\n",
            "job.toml:6: key 'faults_schedule.mtbf': the schedule would hold about 6e+08 faults "
            "over the horizon 600s with mtbf 1us; at most 100000 are allowed: raise the mtbf or "
            "shorten the horizon"},
           {"[faults_schedule]\nhorizon = \"100d\"\nmtbf = \"1s\"\n",
            "job.toml:7: key 'faults_schedule.mtbf': the schedule would hold about 8.64e+06"},
           {"[detection]\nhang_window = 2147483647\n",
            "job.toml:6: key 'detection.hang_window': must be at most 100000, got 2147483647"},
           {"[detection]\nloss_window = 1000000000\n",
            "job.toml:6: key 'detection.loss_window': must be at most 100000"},
           {"[recovery]\ngrace_period = \"1000h\"\n",
            "job.toml:6: key 'recovery.grace_period': must be at most 1h, got 1000h"},
           {"[detection]\nstack_timeout = \"2h\"\n",
            "job.toml:6: key 'detection.stack_timeout': must be at most 1h"},
           {"listen = \"h:99999999999999999999\"\n", "job.toml:5: key 'job.listen'"},
           {"nodes = 2\n[[faults]]\nkind = \"kill-agent\"\nnode = \"node99999999999999999999\"\n"
            "at = \"1s\"\n",
            "job.toml:8: key 'faults[0].node': 'node99999999999999999999' is not a node of this "
            "job"},
           {"nodes = 2\n[[faults]]\nkind = \"kill-agent\"\nnode = \"node+1\"\nat = \"1s\"\n",
            "job.toml:8: key 'faults[0].node': 'node+1' is not a node of this job"},
           {"nodes = 2\n[[faults]]\nkind = \"kill-agent\"\nnode = \"node-1\"\nat = \"1s\"\n",
            "job.toml:8: key 'faults[0].node': 'node-1' is not a node of this job"},
       }) {
    EXPECT_THAT(ErrorOf(std::string(kMinimal) + c.text), HasSubstr(c.message)) << c.text;
  }
  // At the bounds, a spec parses (a controller across machines may run it).
  Result<JobSpec> big = ParseJobSpec(std::string(kMinimal) +
                                         "nodes = 100000\nranks_per_node = 8\n[faults_schedule]\n"
                                         "mtbf = \"6ms\"\n",
                                     "job.toml");
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->world_size(), 800000);
  EXPECT_GT(big->faults.size(), 99000u);
  EXPECT_LE(big->faults.size(), 100000u);
}

TEST(JobSpec, EmbeddedRunLimitsNameTheKey) {
  Result<JobSpec> many = ParseJobSpec(std::string(kMinimal) + "nodes = 100000\n", "job.toml");
  ASSERT_TRUE(many.ok()) << many.status().ToString();
  Status st = ValidateForEmbeddedRun(*many);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(),
              AllOf(HasSubstr("job.toml:5: key 'job.nodes': endure run starts every node as a "
                              "process on this machine: at most 256 nodes (spares included), "
                              "got 100000"),
                    HasSubstr("`endure controller`"), HasSubstr("`endure agent`")));
  Result<JobSpec> wide =
      ParseJobSpec(std::string(kMinimal) + "nodes = 8\nranks_per_node = 256\n", "job.toml");
  ASSERT_TRUE(wide.ok()) << wide.status().ToString();
  EXPECT_THAT(ValidateForEmbeddedRun(*wide).message(),
              HasSubstr("job.toml:6: key 'job.ranks_per_node': endure run starts every rank as a "
                        "process on this machine: at most 1024 ranks (nodes x ranks_per_node), "
                        "got 2048"));
  Result<JobSpec> spares =
      ParseJobSpec(std::string(kMinimal) + "nodes = 250\nspares = 10\n", "job.toml");
  ASSERT_TRUE(spares.ok()) << spares.status().ToString();
  EXPECT_EQ(spares->spares, 10);
  EXPECT_THAT(ValidateForEmbeddedRun(*spares).message(),
              HasSubstr("job.toml:6: key 'job.spares': endure run starts every node as a process "
                        "on this machine: at most 256 nodes (spares included), got 260"));
  Result<JobSpec> fits =
      ParseJobSpec(std::string(kMinimal) + "nodes = 256\nranks_per_node = 4\n", "job.toml");
  ASSERT_TRUE(fits.ok());
  EXPECT_TRUE(ValidateForEmbeddedRun(*fits).ok());
}

TEST(JobSpec, LoadRefusesAHugeFile) {
  char tmpl[] = "/tmp/endure-spec-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string path = dir + "/huge.toml";
  std::string text = kMinimal;
  text += "# " + std::string(kMaxSpecBytes, 'x') + "\n";
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), path, text).ok());
  Result<JobSpec> spec = LoadJobSpec(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr(path + ": the job spec is"));
  EXPECT_THAT(spec.status().message(), HasSubstr("at most 1048576"));
  EXPECT_THAT(LoadJobSpec(dir).status().message(), HasSubstr("not a regular file"));
  ASSERT_TRUE(Env::Default()->RemoveAll(dir).ok());
}

TEST(JobSpec, ProgressPatternMustCompileAndNameTheStep) {
  const std::string detection = std::string(kMinimal) + "[detection]\n";
  // TOML literal strings ('...') keep backslashes as they are.
  Result<JobSpec> ok =
      ParseJobSpec(detection + "progress_pattern = '(?P<step>\\d+)/\\d+ \\['\n", "job.toml");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->detection.progress_pattern, R"((?P<step>\d+)/\d+ \[)");

  EXPECT_THAT(ErrorOf(detection + "progress_pattern = 'step (?P<step>\\d+'\n"),
              AllOf(HasSubstr("job.toml:6: key 'detection.progress_pattern': the regular "
                              "expression does not compile: missing )"),
                    HasSubstr("RE2 syntax")));
  EXPECT_EQ(ErrorOf(detection + "progress_pattern = 'step (\\d+)'\n"),
            "job.toml:6: key 'detection.progress_pattern': needs a named group 'step' around the "
            "step number, e.g. 'step (?P<step>\\d+)'");
  EXPECT_THAT(ErrorOf(detection + "progress_pattern = 'step (?P<stp>\\d+)'\n"),
              HasSubstr("job.toml:6: key 'detection.progress_pattern': unknown named group "
                        "'stp': only (?P<step>...) and (?P<loss>...) are read"));
  EXPECT_THAT(ErrorOf(detection + "progress_pattern = ''\n"),
              HasSubstr("job.toml:6: key 'detection.progress_pattern': must not be empty"));
  EXPECT_THAT(ErrorOf(detection + "progress_pattern = 12\n"),
              HasSubstr("job.toml:6: key 'detection.progress_pattern': expected a string"));
}

TEST(JobSpec, SyntaxErrorNamesTheLine) {
  EXPECT_THAT(ErrorOf(std::string(kMinimal) + "nodes = = 2\n"),
              HasSubstr("job.toml:5: TOML syntax error"));
}

TEST(JobSpec, LoadReportsUnreadableFile) {
  Result<JobSpec> spec = LoadJobSpec("/nonexistent/dir/job.toml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("/nonexistent/dir/job.toml: cannot read"));
}

// [detection]'s implicit-failure keys, [isolation] and [cluster]: parsed,
// carried into the machine's options, and bad values refused with file,
// line and key.
TEST(JobSpec, IsolationKeysParseAndBadValuesNameTheirLine) {
  Result<JobSpec> spec =
      ParseJobSpec(std::string(kMinimal) +
                       "[detection]\nstraggler_theta = 0.2\nstraggler_window = 30\n"
                       "straggler_min_slow = 20\nsdc_check_every = 50\n"
                       "phase_timeout = \"90s\"\n"
                       "[isolation]\nover_evict = false\npairwise_test = false\n"
                       "soft_strikes = 5\nsoft_window = \"2h\"\nhealth_check = false\n"
                       "[cluster]\nstate_dir = \"/var/lib/endure\"\n",
                   "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  const core::JobMachineOptions o = MachineOptions(*spec);
  EXPECT_DOUBLE_EQ(o.isolation.straggler.theta, 0.2);
  EXPECT_EQ(o.isolation.straggler.window, 30);
  EXPECT_EQ(o.isolation.straggler.min_slow, 20);
  EXPECT_EQ(o.isolation.sdc_check_every, 50);
  EXPECT_EQ(o.hang.phase_first_timeout, std::chrono::seconds(90));
  EXPECT_FALSE(o.isolation.over_evict);
  EXPECT_FALSE(o.isolation.pairwise_test);
  EXPECT_EQ(o.isolation.health.soft_strikes, 5);
  EXPECT_EQ(o.isolation.health.soft_window, std::chrono::hours(2));
  EXPECT_FALSE(spec->isolation.health_check);
  EXPECT_EQ(spec->cluster.state_dir, "/var/lib/endure");
  EXPECT_TRUE(o.Validate().ok());

  const std::string base = kMinimal;  // 4 lines
  EXPECT_EQ(
      ErrorOf(base + "[detection]\nstraggler_theta = 0\n"),
      "job.toml:6: key 'detection.straggler_theta': must be a finite number > 0, got 0.000000");
  EXPECT_EQ(ErrorOf(base + "[detection]\nstraggler_window = 10\nstraggler_min_slow = 11\n"),
            "job.toml:7: key 'detection.straggler_min_slow': must not exceed straggler_window "
            "(10): it counts slow steps among the window's");
  EXPECT_EQ(ErrorOf(base + "[detection]\nsdc_check_every = -1\n"),
            "job.toml:6: key 'detection.sdc_check_every': must be at least 0, got -1");
  EXPECT_EQ(ErrorOf(base + "[isolation]\nsoft_strikes = 0\n"),
            "job.toml:6: key 'isolation.soft_strikes': must be at least 1, got 0");
  EXPECT_EQ(
      ErrorOf(base + "[isolation]\nover_evict = \"yes\"\n"),
      "job.toml:6: key 'isolation.over_evict': expected a boolean (true or false), got a string");
  EXPECT_EQ(ErrorOf(base + "[isolation]\nsoft_window = \"0s\"\n"),
            "job.toml:6: key 'isolation.soft_window': must be longer than 0");
  EXPECT_EQ(ErrorOf(base + "[cluster]\nledger = \"x\"\n"),
            "job.toml:6: key 'cluster.ledger': unknown key in [cluster]; valid keys are state_dir");
}

}  // namespace
}  // namespace endure::controller
