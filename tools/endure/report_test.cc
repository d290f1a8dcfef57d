// Runs the built `endure report` against state directories written here with
// the StateStore: the table, --json, a job without a final report, and the
// usage errors (exit 2) for a missing directory or database.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/subprocess.h"
#include "controller/state_store.h"
#include "tests/support/test_support.h"

namespace endure {
namespace {

using testing::HasSubstr;
using testing::Not;

using Outcome = testing_support::CommandOutcome;

Outcome RunEndure(std::vector<std::string> args) {
  args.insert(args.begin(), ENDURE_BIN);
  return testing_support::RunCommand(args);
}

// `name`, a new directory in `scratch` (the test's own).
std::string FreshDir(const testing_support::ScratchDir& scratch, const std::string& name) {
  EXPECT_FALSE(scratch.path().empty());
  const std::string dir = scratch.Path(name);
  EXPECT_TRUE(Env::Default()->CreateDirs(dir).ok());
  return dir;
}

nlohmann::json SampleReport() {
  return nlohmann::json::parse(R"({
    "job": "demo", "final": true, "exit_code": 0, "verdict": "training completed",
    "param_fingerprint": "c0ffee", "steps": 300, "last_loss": 2.25, "generations": 2,
    "checkpoints": 30, "nodes": ["node0", "node1"], "wall_s": 60.0, "ettr": 0.9,
    "ledger_s": {"productive": 54.0, "checkpoint_stall": 1.0, "detection": 0.5,
                 "recovery": 1.5, "recompute": 1.0, "startup": 2.0, "other": 0.0},
    "recovery_s": {"teardown": 0.25, "wait": 0.0, "relaunch": 1.0, "restore": 0.25},
    "incidents": [{"id": 1, "generation": 0, "cause": "signal 9 SIGKILL", "rank": 1,
                   "node": "node1", "injected_at_s": 12.5, "fault_at_s": 12.5,
                   "detected_at_s": 12.52, "detected_after_s": 0.02,
                   "recovered_after_s": 1.52, "teardown_s": 0.25, "wait_s": 0.0,
                   "relaunch_s": 1.0, "restore_s": 0.25, "failed_at_step": 42,
                   "restored_step": 40, "steps_lost": 2, "action": "restart_in_place",
                   "reason": "rank 1 was killed by signal 9", "log_line": "", "stacks": []}]
  })");
}

TEST(EndureReportCli, PrintsTheStoredReport) {
  testing_support::ScratchDir scratch("endure_report_test");
  const std::string dir = FreshDir(scratch, "final");
  {
    Result<controller::StateStore> store =
        controller::StateStore::Open(controller::StateStore::PathIn(dir));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE(store->SaveJob({"demo", "demo.toml", "", 1.7e9, 1.7e9 + 60, 0, "ok", ""}).ok());
    ASSERT_TRUE(store->SaveReport(SampleReport()).ok());
  }
  Outcome o = RunEndure({"report", dir});
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("Job demo: completed (exit 0)"));
  EXPECT_THAT(o.output, HasSubstr("param_fingerprint c0ffee"));
  EXPECT_THAT(o.output, HasSubstr("ETTR 0.900"));
  EXPECT_THAT(o.output, HasSubstr("signal 9 SIGKILL"));
  EXPECT_THAT(o.output, HasSubstr("12.500s"));  // injected at
  EXPECT_THAT(o.output, HasSubstr("1.520s"));   // recovered after

  Outcome j = RunEndure({"report", dir, "--json"});
  ASSERT_EQ(j.code, 0) << j.output;
  nlohmann::json parsed = nlohmann::json::parse(j.output, nullptr, false);
  ASSERT_FALSE(parsed.is_discarded()) << j.output;
  EXPECT_EQ(parsed, SampleReport());
}

TEST(EndureReportCli, JobWithoutAFinalReport) {
  testing_support::ScratchDir scratch("endure_report_test");
  const std::string dir = FreshDir(scratch, "running");
  {
    Result<controller::StateStore> store =
        controller::StateStore::Open(controller::StateStore::PathIn(dir));
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE(store->SaveJob({"demo", "demo.toml", "", 1.7e9, {}, {}, "", ""}).ok());
  }
  Outcome o = RunEndure({"report", dir});
  EXPECT_EQ(o.code, 0) << o.output;
  EXPECT_THAT(o.output, HasSubstr("Job demo: not finished"));
  EXPECT_THAT(o.output, HasSubstr("no final report"));
}

TEST(EndureReportCli, MissingDirectoryOrDatabaseIsAUsageError) {
  Outcome none = RunEndure({"report", "/nonexistent/endure/state"});
  EXPECT_EQ(none.code, 2) << none.output;
  EXPECT_THAT(none.output, HasSubstr("/nonexistent/endure/state: no such directory; pass the "
                                     "state directory of a job"));

  testing_support::ScratchDir scratch("endure_report_test");
  const std::string empty = FreshDir(scratch, "empty");
  Outcome no_db = RunEndure({"report", empty});
  EXPECT_EQ(no_db.code, 2) << no_db.output;
  EXPECT_THAT(no_db.output, HasSubstr("no controller database"));
  EXPECT_THAT(no_db.output, HasSubstr(empty + "/controller.db"));
  EXPECT_FALSE(Env::Default()->Exists(empty + "/controller.db"));

  // A database without a job (the controller died before saving one).
  const std::string bare = FreshDir(scratch, "bare");
  ASSERT_TRUE(controller::StateStore::Open(controller::StateStore::PathIn(bare)).ok());
  Outcome no_job = RunEndure({"report", bare});
  EXPECT_EQ(no_job.code, 2) << no_job.output;
  EXPECT_THAT(no_job.output, HasSubstr("no job recorded yet"));

  Outcome no_arg = RunEndure({"report"});
  EXPECT_EQ(no_arg.code, 2) << no_arg.output;
  EXPECT_THAT(no_arg.output, HasSubstr("state_dir"));
  EXPECT_THAT(no_arg.output, Not(HasSubstr("Job ")));
}

}  // namespace
}  // namespace endure
