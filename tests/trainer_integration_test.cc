// endure-train end to end: real processes, ranks rendezvous over 127.0.0.1.
// Asserts determinism, 1-vs-2-rank equivalence, bit-exact resume after
// SIGKILL, refusal of corrupt checkpoints with fallback, and exit code 2 with
// a one-line message for bad input.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "checkpoint/checkpoint_dir.h"
#include "common/subprocess.h"
#include "tests/support/test_support.h"

namespace endure {
namespace {

using testing_support::ReadAll;

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const std::vector<std::string>& kSmall = testing_support::SmallTrainerFlags();

struct TrainRun {
  std::vector<ExitStatus> exits;
  std::string output;          // rank 0's stdout and stderr
  std::vector<double> losses;  // from --metrics-file, in order
  std::string Fingerprint() const {
    std::smatch m;
    return std::regex_search(output, m, std::regex("param_fingerprint=([0-9a-f]{16})")) ? m[1].str()
                                                                                        : "";
  }
  bool Ok() const {
    for (const ExitStatus& e : exits) {
      if (!e.Success()) return false;
    }
    return true;
  }
};

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/endure_trainer_test.XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Starts `world` ranks of endure-train with `args`. `until`, if set, is
  // polled while they run; when it returns true every rank gets SIGKILL.
  TrainRun Train(int world, std::vector<std::string> args, const std::string& tag,
                 const std::function<bool()>& until = nullptr) {
    const fs::path metrics = dir_ / (tag + ".metrics");
    std::vector<std::string> argv = {ENDURE_TRAIN_BIN};
    for (size_t i = 0; i + 1 < kSmall.size(); i += 2) {  // the flags `args` does not set
      if (std::find(args.begin(), args.end(), kSmall[i]) == args.end()) {
        argv.insert(argv.end(), {kSmall[i], kSmall[i + 1]});
      }
    }
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--metrics-file", metrics.string()});
    const int port = PickFreePort().value();
    std::vector<Subprocess> procs;
    for (int r = 0; r < world; ++r) {
      ProcessSpec spec;
      spec.argv = argv;
      spec.output_path = (dir_ / (tag + ".rank" + std::to_string(r) + ".out")).string();
      if (world > 1) {
        spec.env = {
            {"RANK", std::to_string(r)},           {"LOCAL_RANK", std::to_string(r)},
            {"WORLD_SIZE", std::to_string(world)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
            {"MASTER_ADDR", "127.0.0.1"},          {"MASTER_PORT", std::to_string(port)}};
      } else {
        spec.unset_env = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"};
      }
      procs.push_back(Subprocess::Start(spec).value());
    }
    TrainRun run;
    if (until) {
      const auto deadline = std::chrono::steady_clock::now() + 300s;
      while (!until() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(2ms);
      }
      for (Subprocess& p : procs) p.Signal(SIGKILL);
    }
    for (Subprocess& p : procs) {
      std::optional<ExitStatus> e = p.WaitFor(600s);
      if (!e) {
        p.Signal(SIGKILL);
        e = p.Wait();
      }
      run.exits.push_back(*e);
    }
    run.output = ReadAll(dir_ / (tag + ".rank0.out"));
    std::ifstream lines(metrics);
    for (std::string line; std::getline(lines, line);) {
      run.losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
    }
    return run;
  }

  fs::path dir_;
};

TEST_F(TrainerTest, IdenticalRunsGiveTheSameFingerprint) {
  TrainRun a = Train(2, {"--steps", "6"}, "a");
  TrainRun b = Train(2, {"--steps", "6"}, "b");
  ASSERT_TRUE(a.Ok()) << a.output;
  ASSERT_TRUE(b.Ok()) << b.output;
  EXPECT_EQ(a.Fingerprint().size(), 16u);
  EXPECT_EQ(a.Fingerprint(), b.Fingerprint());
  EXPECT_EQ(a.losses, b.losses);
  TrainRun other_seed = Train(2, {"--steps", "6", "--seed", "99"}, "c");
  EXPECT_NE(a.Fingerprint(), other_seed.Fingerprint());
}

// Gradients are summed exactly (trainer/exact_sum.h): the same global
// batch on one rank or on two gives the same parameters and losses, bit for
// bit, and so does an uneven split (3 micro-batches over 2 ranks).
TEST_F(TrainerTest, OneRankAndTwoRanksTrainTheSameParametersBitForBit) {
  TrainRun one = Train(1, {"--steps", "12"}, "one");
  TrainRun two = Train(2, {"--steps", "12"}, "two");
  ASSERT_TRUE(one.Ok()) << one.output;
  ASSERT_TRUE(two.Ok()) << two.output;
  ASSERT_EQ(one.losses.size(), 12u);
  EXPECT_EQ(one.Fingerprint().size(), 16u);
  EXPECT_EQ(one.Fingerprint(), two.Fingerprint());
  EXPECT_EQ(one.losses, two.losses);
  EXPECT_LT(one.losses.back(), one.losses.front() - 0.5);  // and it learns

  const std::vector<std::string> three_slots = {"--steps", "6", "--global-batch", "24"};
  TrainRun uneven = Train(2, three_slots, "uneven");
  TrainRun single = Train(1, three_slots, "single");
  ASSERT_TRUE(uneven.Ok()) << uneven.output;
  ASSERT_TRUE(single.Ok()) << single.output;
  EXPECT_EQ(uneven.Fingerprint(), single.Fingerprint());
  EXPECT_EQ(uneven.losses, single.losses);
}

// Elastic data parallelism, in process, with no agent: the test plays the
// agent's part (the rejoin offers, client.h Rejoin). Rank 0 is SIGKILLed at
// step 5; rank 1 keeps its process, is offered a world of one in which it is
// rank 0, trains on alone with the whole global batch, then is offered a
// world of two again and a fresh rank 1 takes the state from it. The
// parameters and every logged loss are those of a failure-free run.
TEST_F(TrainerTest, ARankThatShrinksToAWorldOfOneAndGrowsBackTrainsTheSameParameters) {
  const std::vector<std::string> steps = {"--steps", "60"};
  TrainRun ref = Train(2, steps, "ref");
  ASSERT_TRUE(ref.Ok()) << ref.output;
  ASSERT_EQ(ref.losses.size(), 60u);

  std::vector<std::string> argv = {ENDURE_TRAIN_BIN};
  argv.insert(argv.end(), kSmall.begin(), kSmall.end());
  argv.insert(argv.end(), steps.begin(), steps.end());
  auto start = [&](int rank, int generation, int port, const std::string& tag,
                   std::vector<std::pair<std::string, std::string>> extra) {
    ProcessSpec spec;
    spec.argv = argv;
    spec.argv.insert(spec.argv.end(), {"--metrics-file", (dir_ / (tag + ".metrics")).string()});
    spec.output_path = (dir_ / (tag + ".out")).string();
    spec.env = {{"RANK", std::to_string(rank)},
                {"LOCAL_RANK", "0"},
                {"WORLD_SIZE", "2"},
                {"LOCAL_WORLD_SIZE", "1"},
                {"MASTER_ADDR", "127.0.0.1"},
                {"MASTER_PORT", std::to_string(port)},
                {"ENDURE_GENERATION", std::to_string(generation)},
                {"ENDURE_REJOIN_FILE", (dir_ / (tag + ".rejoin")).string()}};
    spec.env.insert(spec.env.end(), extra.begin(), extra.end());
    return Subprocess::Start(spec).value();
  };
  // What an agent publishes: KEY=VALUE lines, renamed into place.
  auto offer = [&](const std::string& tag, const std::string& lines) {
    const fs::path tmp = dir_ / (tag + ".rejoin.tmp");
    std::ofstream(tmp) << lines;
    fs::rename(tmp, dir_ / (tag + ".rejoin"));
  };
  auto await = [&](const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (!done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(2ms);
    return done();
  };
  auto metric_lines = [&](const std::string& tag) {
    std::string text = ReadAll(dir_ / (tag + ".metrics"));
    return std::count(text.begin(), text.end(), '\n');
  };

  const int port1 = PickFreePort().value();
  Subprocess a = start(0, 1, port1, "a",
                       {{"ENDURE_FAULTS", R"([{"id":"k","kind":"kill","rank":0,"step":5}])"}});
  Subprocess b = start(1, 1, port1, "b", {});
  ASSERT_TRUE(a.WaitFor(120s).has_value());
  // The survivor: rank 0 of a world of one.
  offer("b", "ENDURE_GENERATION=2\nRANK=0\nLOCAL_RANK=0\nWORLD_SIZE=1\nLOCAL_WORLD_SIZE=1\n");
  ASSERT_TRUE(await([&] { return metric_lines("b") >= 3; })) << ReadAll(dir_ / "b.out");
  // Back to two: a fresh rank 1 takes the state from it.
  const int port3 = PickFreePort().value();
  Subprocess c = start(1, 3, port3, "c", {{"ENDURE_PEER_RESTORE", "1"}});
  offer("b",
        "ENDURE_GENERATION=3\nRANK=0\nLOCAL_RANK=0\nWORLD_SIZE=2\nLOCAL_WORLD_SIZE=1\n"
        "MASTER_ADDR=127.0.0.1\nMASTER_PORT=" +
            std::to_string(port3) + "\n");
  std::optional<ExitStatus> b_exit = b.WaitFor(300s), c_exit = c.WaitFor(300s);
  if (!b_exit) b.Signal(SIGKILL);
  if (!c_exit) c.Signal(SIGKILL);
  const std::string out = ReadAll(dir_ / "b.out");
  ASSERT_TRUE(b_exit && b_exit->Success()) << out;
  ASSERT_TRUE(c_exit && c_exit->Success()) << ReadAll(dir_ / "c.out");
  EXPECT_NE(out.find("rejoined generation 2 at step 4 as rank 0 of 1"), std::string::npos) << out;
  EXPECT_NE(out.find("as rank 0 of 2"), std::string::npos) << out;

  TrainRun elastic;
  elastic.output = out;
  EXPECT_EQ(elastic.Fingerprint(), ref.Fingerprint());
  // It logged from its first step as rank 0 (step 5, recomputed alone) on.
  std::ifstream lines(dir_ / "b.metrics");
  std::vector<double> losses;
  for (std::string line; std::getline(lines, line);) {
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  }
  ASSERT_EQ(losses.size(), 56u);
  EXPECT_TRUE(std::equal(losses.begin(), losses.end(), ref.losses.begin() + 4));
}

TEST_F(TrainerTest, ResumeAfterSigkillIsBitExact) {
  const std::string ref_dir = (dir_ / "ref").string(), dir = (dir_ / "ckpt").string();
  TrainRun ref = Train(2, {"--steps", "20", "--ckpt-dir", ref_dir, "--ckpt-every", "10"}, "ref");
  ASSERT_TRUE(ref.Ok()) << ref.output;
  ASSERT_EQ(ref.losses.size(), 20u);

  const fs::path committed = fs::path(dir) / "step-00000010" / "MANIFEST.json";
  TrainRun killed = Train(2, {"--steps", "20", "--ckpt-dir", dir, "--ckpt-every", "10"}, "killed",
                          [&] { return fs::exists(committed); });
  ASSERT_FALSE(killed.exits[0].exited) << "the run ended before it could be killed";
  EXPECT_EQ(killed.exits[0].signal, SIGKILL);
  ASSERT_FALSE(fs::exists(fs::path(dir) / "step-00000020" / "MANIFEST.json"));

  TrainRun resumed =
      Train(2, {"--steps", "20", "--ckpt-dir", dir, "--ckpt-every", "10", "--resume"}, "resumed");
  ASSERT_TRUE(resumed.Ok()) << resumed.output;
  EXPECT_NE(resumed.output.find("(step 10)"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.Fingerprint(), ref.Fingerprint());
  ASSERT_EQ(resumed.losses.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_EQ(resumed.losses[i], ref.losses[10 + i]) << "step " << 11 + i;  // bit for bit
  }
}

// One rank trains 20 steps with checkpoints at 10 and 20; the test damages
// step 20 and resumes: the damage is named, step 10 is used, and the ten
// recomputed steps end at the reference parameters.
class CorruptionTest : public TrainerTest {
 protected:
  void ExpectFallback(const std::function<void(const fs::path& step20)>& damage,
                      const std::string& message) {
    const std::string dir = (dir_ / "ckpt").string();
    TrainRun ref = Train(1, {"--steps", "20", "--ckpt-dir", dir, "--ckpt-every", "10"}, "ref");
    ASSERT_TRUE(ref.Ok()) << ref.output;
    damage(fs::path(dir) / "step-00000020");
    TrainRun resumed = Train(1, {"--steps", "20", "--ckpt-dir", dir, "--resume"}, "resumed");
    ASSERT_TRUE(resumed.Ok()) << resumed.output;
    EXPECT_NE(resumed.output.find(message), std::string::npos) << resumed.output;
    EXPECT_NE(resumed.output.find("(step 10)"), std::string::npos) << resumed.output;
    EXPECT_EQ(resumed.Fingerprint(), ref.Fingerprint());
  }
};

TEST_F(CorruptionTest, FlippedByteIsRefused) {
  ExpectFallback(
      [](const fs::path& step) {
        std::fstream f(step / "shard-00000.bin", std::ios::in | std::ios::out | std::ios::binary);
        f.seekg(5000);
        char c = 0;
        f.read(&c, 1);
        c ^= 0x01;
        f.seekp(5000);
        f.write(&c, 1);
      },
      "step-00000020/shard-00000.bin: checksum mismatch");
}

TEST_F(CorruptionTest, TruncatedFileIsRefused) {
  ExpectFallback([](const fs::path& step) { fs::resize_file(step / "shard-00000.bin", 1000); },
                 "step-00000020/shard-00000.bin: size 1000 bytes");
}

TEST_F(CorruptionTest, MissingManifestIsRefused) {
  ExpectFallback([](const fs::path& step) { fs::remove(step / "MANIFEST.json"); },
                 "step-00000020/MANIFEST.json: manifest missing");
}

TEST_F(TrainerTest, SampleGeneratesFromACheckpoint) {
  // Two checkpoints of different models (other initial weights).
  const std::string a = (dir_ / "ckpt-a").string(), b = (dir_ / "ckpt-b").string();
  ASSERT_TRUE(Train(1, {"--steps", "2", "--ckpt-dir", a}, "train-a").Ok());
  ASSERT_TRUE(Train(1, {"--steps", "2", "--ckpt-dir", b, "--seed", "99"}, "train-b").Ok());
  int n = 0;
  auto sample = [&](const std::string& dir, const std::string& prompt) {
    const fs::path out = dir_ / ("sample" + std::to_string(n++) + ".out");
    auto p = Subprocess::Start({.argv = {ENDURE_TRAIN_BIN, "sample", "--ckpt-dir", dir, "--prompt",
                                         prompt, "--tokens", "20"},
                                .output_path = out.string()});
    EXPECT_TRUE(p->Wait().Success()) << ReadAll(out);
    return ReadAll(out);
  };
  const std::string text = sample(a, "Q:");
  EXPECT_EQ(text.rfind("Q:", 0), 0u) << text;
  EXPECT_GE(text.size(), 22u) << text;
  // The same checkpoint and prompt give the same text (the sampling seed is fixed)...
  EXPECT_EQ(sample(a, "Q:"), text);
  // ...another checkpoint, another continuation of the same prompt: the
  // model's weights are used...
  const std::string other_model = sample(b, "Q:");
  EXPECT_EQ(other_model.rfind("Q:", 0), 0u) << other_model;
  EXPECT_NE(other_model.substr(2), text.substr(2));
  // ...and another prompt starts the text and changes what follows it.
  const std::string other_prompt = sample(a, "A long time ago");
  EXPECT_EQ(other_prompt.rfind("A long time ago", 0), 0u) << other_prompt;
  EXPECT_NE(other_prompt.substr(15), text.substr(2));
}

TEST_F(TrainerTest, RunsUnmodifiedUnderTorchrun) {
  const char* torchrun = "/usr/bin/torchrun";
  if (!fs::exists(torchrun)) GTEST_SKIP() << "python3-torch (torchrun) is not installed";
  TrainRun ours = Train(2, {"--steps", "4"}, "ours");
  ASSERT_TRUE(ours.Ok()) << ours.output;
  const fs::path out = dir_ / "torchrun.out";
  std::vector<std::string> argv = {torchrun,
                                   "--no_python",
                                   "--nproc_per_node",
                                   "2",
                                   "--master_port",
                                   std::to_string(PickFreePort().value()),
                                   "--redirects",
                                   "2",
                                   "--tee",
                                   "2",
                                   ENDURE_TRAIN_BIN};
  argv.insert(argv.end(), kSmall.begin(), kSmall.end());
  argv.insert(argv.end(), {"--steps", "4"});
  auto p = Subprocess::Start({.argv = argv,
                              .unset_env = {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"},
                              .output_path = out.string()});
  ASSERT_TRUE(p->Wait().Success()) << ReadAll(out);
  EXPECT_NE(ReadAll(out).find("param_fingerprint=" + ours.Fingerprint()), std::string::npos)
      << ReadAll(out);
}

struct BadInput {
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> env;
  std::string expected;
};

TEST_F(TrainerTest, BadInputExitsTwoWithOneLineSayingWhatToFix) {
  fs::create_directories(dir_ / "empty");
  const std::vector<BadInput> cases = {
      {{"--data", "/nonexistent/corpus"}, {}, "'/nonexistent/corpus' is neither a file nor"},
      {{"--data", (dir_ / "empty").string()}, {}, "found 0 bytes of text"},
      {{}, {{"WORLD_SIZE", "2"}, {"RANK", "0"}}, "MASTER_ADDR is not"},
      {{"--no-such-flag"}, {}, "--no-such-flag"},
      {{"--steps", "abc"}, {}, "--steps"},
      {{"--global-batch", "10"}, {}, "--global-batch 10 must be a multiple"},
  };
  for (const BadInput& c : cases) {
    const fs::path out = dir_ / "bad.out";
    fs::remove(out);
    std::vector<std::string> argv = {ENDURE_TRAIN_BIN};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    ProcessSpec spec{.argv = argv, .env = c.env, .output_path = out.string()};
    if (c.env.empty()) spec.unset_env = {"WORLD_SIZE", "RANK", "MASTER_ADDR"};
    ExitStatus e = Subprocess::Start(spec)->Wait();
    std::string text = ReadAll(out);
    EXPECT_TRUE(e.exited && e.code == 2) << c.expected << ": " << e.ToString() << "\n" << text;
    EXPECT_NE(text.find(c.expected), std::string::npos) << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  }
}

}  // namespace
}  // namespace endure
