// The torchrun-style command line as a job spec (launch.h): what a flag
// becomes, parsed as any spec is, and each bad flag named.
#include "tools/endure/launch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "controller/job_spec.h"

namespace endure::cli {
namespace {

using testing::ElementsAre;
using testing::HasSubstr;

Result<controller::JobSpec> Spec(LaunchFlags f, LaunchHost host = {4, 0, false}) {
  Result<std::string> text = LaunchSpec(f, host);
  if (!text.ok()) return text.status();
  return controller::ParseJobSpec(*text, "launch");
}

TEST(Launch, AScriptRunsAsTorchrunRunsIt) {
  LaunchFlags f;
  f.nproc_per_node = "2";
  f.command = {"examples/train.py", "--lr", "0.1", "data dir/x"};
  Result<controller::JobSpec> spec = Spec(f);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->name, "train");
  EXPECT_THAT(spec->command,
              ElementsAre("python3", "-u", "examples/train.py", "--lr", "0.1", "data dir/x"));
  EXPECT_EQ(spec->nodes, 1);
  EXPECT_EQ(spec->ranks_per_node, 2);
  EXPECT_EQ(spec->min_nodes, 0);
  EXPECT_EQ(spec->state_dir, "endure-train");
  // More than one worker per node and no OMP_NUM_THREADS: 1, as torchrun.
  EXPECT_EQ(spec->env.at("OMP_NUM_THREADS"), "1");
  // Until the first step, torch.distributed's own default timeout.
  EXPECT_EQ(spec->detection.startup_timeout, std::chrono::minutes(30));
  // The same command line is the same spec: a rerun carries an unfinished
  // run on.
  EXPECT_EQ(Spec(f)->digest, spec->digest);
}

TEST(Launch, FlagsSayNodesElasticityRestartsNameAndHowToRun) {
  LaunchFlags f;
  f.nproc_per_node = "cpu";
  f.nnodes = "2:3";
  f.max_restarts = 5;
  f.run_id = "exp-7";
  f.state_dir = "/tmp/runs/exp-7";
  f.module = true;
  f.command = {"mypkg.train", "--epochs", "1"};
  Result<controller::JobSpec> spec = Spec(f, {6, 0, true});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->name, "exp-7");
  EXPECT_THAT(spec->command, ElementsAre("python3", "-u", "-m", "mypkg.train", "--epochs", "1"));
  EXPECT_EQ(spec->nodes, 3);
  EXPECT_EQ(spec->min_nodes, 2);
  EXPECT_EQ(spec->ranks_per_node, 6);
  EXPECT_EQ(spec->state_dir, "/tmp/runs/exp-7");
  EXPECT_EQ(spec->recovery.max_restarts, 5);
  EXPECT_EQ(spec->env.count("OMP_NUM_THREADS"), 0u) << "the environment sets it";

  f = {};
  f.no_python = true;
  f.nproc_per_node = "gpu";
  f.command = {"./trainer", "--x"};
  spec = Spec(f, {16, 8, false});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_THAT(spec->command, ElementsAre("./trainer", "--x"));
  EXPECT_EQ(spec->ranks_per_node, 8);
}

TEST(Launch, ABadFlagIsAnErrorNamingIt) {
  struct Case {
    LaunchFlags flags;
    std::string message;
  };
  auto with = [](auto set) {
    LaunchFlags f;
    f.command = {"train.py"};
    set(f);
    return f;
  };
  const std::vector<Case> cases = {
      {with([](LaunchFlags& f) { f.nproc_per_node = "0"; }), "--nproc-per-node: '0'"},
      {with([](LaunchFlags& f) { f.nproc_per_node = "two"; }), "--nproc-per-node: 'two'"},
      {with([](LaunchFlags& f) { f.nproc_per_node = "gpu"; }), "this machine has no GPU"},
      {with([](LaunchFlags& f) { f.nproc_per_node = "2000"; }), "--nproc-per-node: '2000'"},
      {with([](LaunchFlags& f) { f.nnodes = "3:2"; }), "--nnodes: '3:2'"},
      {with([](LaunchFlags& f) { f.nnodes = "1:"; }), "--nnodes: '1:'"},
      {with([](LaunchFlags& f) { f.nnodes = "999"; }), "--nnodes: '999'"},
      {with([](LaunchFlags& f) { f.max_restarts = 0; }), "--max-restarts: must be 1 or more"},
      {with([](LaunchFlags& f) { f.module = f.no_python = true; }), "-m and --no-python"},
      {with([](LaunchFlags& f) {
         f.command = {"--nproc-per-nod", "2", "t.py"};
       }),
       "unknown flag --nproc-per-nod"},
      {with([](LaunchFlags& f) { f.command.clear(); }), "no script"},
      {with([](LaunchFlags& f) { f.run_id = "a b"; }), "job.name"},
  };
  for (const Case& c : cases) {
    Result<controller::JobSpec> spec = Spec(c.flags);
    ASSERT_FALSE(spec.ok()) << c.message;
    EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace endure::cli
