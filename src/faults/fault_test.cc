#include "faults/fault.h"

#include <gtest/gtest.h>

#include <cmath>

namespace endure::faults {
namespace {

using namespace std::chrono_literals;

Fault StepFault(std::string id, FaultKind kind, int rank, int64_t step) {
  Fault f;
  f.id = std::move(id);
  f.kind = kind;
  f.rank = rank;
  f.step = step;
  return f;
}

TEST(FaultKind, NamesRoundTrip) {
  for (FaultKind k :
       {FaultKind::kKill, FaultKind::kExit, FaultKind::kHang, FaultKind::kNan, FaultKind::kSlow,
        FaultKind::kLog, FaultKind::kKillAgent, FaultKind::kDiskFull, FaultKind::kDiskError,
        FaultKind::kCorruptT0, FaultKind::kCorruptT1, FaultKind::kBitflip, FaultKind::kCommFail,
        FaultKind::kCommSlow, FaultKind::kSpike}) {
    Result<FaultKind> parsed = ParseFaultKind(FaultKindName(k));
    ASSERT_TRUE(parsed.ok()) << FaultKindName(k);
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_EQ(FaultKindName(FaultKind::kKillAgent), "kill-agent");
  EXPECT_EQ(FaultKindName(FaultKind::kBitflip), "bitflip");
  EXPECT_EQ(FaultKindName(FaultKind::kCommFail), "comm-fail");
  EXPECT_EQ(FaultKindName(FaultKind::kCommSlow), "comm-slow");
  EXPECT_EQ(FaultKindName(FaultKind::kSpike), "spike");
  Result<FaultKind> bad = ParseFaultKind("kil");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'kil'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("kill-agent"), std::string::npos);
  EXPECT_NE(bad.status().message().find("comm-slow"), std::string::npos);
}

// The worker fires its parameter and collective faults itself.
TEST(FaultKind, BitflipAndCommFaultsAreFiredByTheWorker) {
  for (FaultKind k : {FaultKind::kBitflip, FaultKind::kCommFail, FaultKind::kCommSlow}) {
    EXPECT_FALSE(FiredByController(k)) << FaultKindName(k);
  }
  std::vector<Fault> all = {StepFault("b", FaultKind::kBitflip, 1, 4),
                            StepFault("f", FaultKind::kCommFail, 1, 5),
                            StepFault("s", FaultKind::kCommSlow, 0, 6)};
  std::vector<Fault> mine = FaultsForRank(all, 1, {});
  ASSERT_EQ(mine.size(), 2u);
  EXPECT_EQ(mine[0].id, "b");
  EXPECT_EQ(mine[1].id, "f");
}

// A spike multiplies the loss the rank reports for one step: a factor > 1,
// at a step (the worker fires it in its step report).
TEST(Validate, ASpikeNeedsAFactorAboveOneAndAStep) {
  Fault spike = StepFault("p", FaultKind::kSpike, 0, 7);
  spike.factor = 3;
  EXPECT_TRUE(Validate(spike).ok());
  spike.factor = 0.5;
  EXPECT_EQ(Validate(spike).message(),
            "fault 'p' (spike): factor must be a number > 1 (3 = a loss three times as high)");
  spike.factor = 3;
  spike.step = -1;
  spike.at = 10s;
  EXPECT_NE(Validate(spike).message().find("needs a step, not at"), std::string::npos);
}

TEST(Validate, AcceptsWellFormedFaults) {
  EXPECT_TRUE(Validate(StepFault("a", FaultKind::kKill, 0, 1)).ok());
  Fault exit = StepFault("b", FaultKind::kExit, 1, 5);
  exit.exit_code = 255;
  EXPECT_TRUE(Validate(exit).ok());
  Fault timed = StepFault("c", FaultKind::kHang, 2, -1);
  timed.at = 30s;
  EXPECT_TRUE(Validate(timed).ok());
  Fault agent;
  agent.id = "d";
  agent.kind = FaultKind::kKillAgent;
  agent.node = "node1";
  agent.at = 0s;
  EXPECT_TRUE(Validate(agent).ok());
  agent.node.clear();
  agent.rank = 3;  // the node running rank 3
  EXPECT_TRUE(Validate(agent).ok());
}

TEST(Validate, RefusesEachBadCombinationWithAReason) {
  struct Case {
    Fault fault;
    std::string expected;
  };
  std::vector<Case> cases;
  cases.push_back({StepFault("a", FaultKind::kKill, -1, 3), "fault 'a' (kill): needs rank >= 0"});
  cases.push_back({StepFault("b", FaultKind::kNan, 0, 0), "step must be >= 1"});
  cases.push_back({StepFault("c", FaultKind::kHang, 0, -1), "needs exactly one of step and at"});
  Fault both = StepFault("d", FaultKind::kKill, 0, 2);
  both.at = 1s;
  cases.push_back({both, "needs exactly one of step and at"});
  Fault exit = StepFault("e", FaultKind::kExit, 0, 2);
  exit.exit_code = 0;
  cases.push_back({exit, "exit_code must be in 1..255"});
  exit.exit_code = 256;
  cases.push_back({exit, "exit_code must be in 1..255"});
  Fault slow = StepFault("f", FaultKind::kSlow, 0, 2);
  slow.factor = 1.0;
  cases.push_back({slow, "factor must be a number > 1"});
  cases.push_back({StepFault("g", FaultKind::kLog, 0, 2), "needs a non-empty line"});
  Fault agent = StepFault("h", FaultKind::kKillAgent, -1, 4);
  cases.push_back({agent, "(kill-agent): needs the node"});
  Fault flip = StepFault("i", FaultKind::kBitflip, 0, 3);
  flip.bit = 64;
  cases.push_back({flip, "(bitflip): bit must be in 0..63"});
  flip.bit = -1;
  cases.push_back({flip, "bit must be in 0..63"});
  flip.bit = 30;
  flip.element = -1;
  cases.push_back({flip, "element must be >= 0"});
  flip.element = 0;
  flip.tensor = -2;
  cases.push_back({flip, "tensor must be >= 0"});
  cases.push_back({StepFault("j", FaultKind::kCommFail, -1, 3), "(comm-fail): needs rank >= 0"});
  Fault timed_fail = StepFault("k", FaultKind::kCommFail, 0, -1);
  timed_fail.at = 5s;
  cases.push_back({timed_fail, "needs a step, not at"});
  Fault comm_slow = StepFault("l", FaultKind::kCommSlow, 0, 2);
  comm_slow.factor = 0.5;
  cases.push_back({comm_slow, "(comm-slow): factor must be a number > 1"});
  comm_slow.factor = INFINITY;
  cases.push_back({comm_slow, "factor must be a number > 1"});
  for (const Case& c : cases) {
    Status st = Validate(c.fault);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.expected;
    EXPECT_NE(st.message().find(c.expected), std::string::npos) << st.message();
  }
}

TEST(ValidateFaults, RequiresUniqueIds) {
  std::vector<Fault> faults = {StepFault("x", FaultKind::kKill, 0, 2),
                               StepFault("x", FaultKind::kKill, 1, 3)};
  Status st = ValidateFaults(faults);
  EXPECT_NE(st.message().find("faults[1]: id 'x' is used twice"), std::string::npos)
      << st.message();
  faults[1].id = "";
  EXPECT_NE(ValidateFaults(faults).message().find("needs an id"), std::string::npos);
  faults[1].id = "y";
  EXPECT_TRUE(ValidateFaults(faults).ok());
}

TEST(Json, RoundTripsEveryField) {
  std::vector<Fault> faults;
  faults.push_back(StepFault("k", FaultKind::kKill, 1, 40));
  Fault exit = StepFault("e", FaultKind::kExit, 0, 7);
  exit.exit_code = 3;
  faults.push_back(exit);
  Fault slow = StepFault("s", FaultKind::kSlow, 1, 5);
  slow.factor = 3.5;
  faults.push_back(slow);
  Fault log = StepFault("l", FaultKind::kLog, 0, 9);
  log.line = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.";
  faults.push_back(log);
  Fault agent;
  agent.id = "a";
  agent.kind = FaultKind::kKillAgent;
  agent.node = "node1";
  agent.at = Duration(90'123'456'789);
  faults.push_back(agent);
  Fault ms = StepFault("m", FaultKind::kHang, 2, -1);
  ms.at = 1500ms;
  faults.push_back(ms);
  Fault flip = StepFault("b", FaultKind::kBitflip, 3, 40);
  flip.tensor = 2;
  flip.element = 17;
  flip.bit = 62;
  faults.push_back(flip);
  faults.push_back(StepFault("b0", FaultKind::kBitflip, 0, 8));
  faults.push_back(StepFault("cf", FaultKind::kCommFail, 1, 12));
  Fault comm_slow = StepFault("cs", FaultKind::kCommSlow, 2, 10);
  comm_slow.factor = 4.0;
  faults.push_back(comm_slow);

  const std::string json = EncodeFaults(faults);
  EXPECT_NE(json.find(R"({"id":"k","kind":"kill","rank":1,"step":40})"), std::string::npos) << json;
  EXPECT_NE(json.find(R"("at":"1500ms")"), std::string::npos) << json;
  // Keys in sorted order, as nlohmann::json writes an object.
  EXPECT_NE(json.find(R"({"bit":62,"element":17,"id":"b","kind":"bitflip","rank":3,"step":40,)"
                      R"("tensor":2})"),
            std::string::npos)
      << json;
  // The defaults are left out.
  EXPECT_NE(json.find(R"({"id":"b0","kind":"bitflip","rank":0,"step":8})"), std::string::npos)
      << json;
  EXPECT_NE(json.find(R"({"factor":4.0,"id":"cs","kind":"comm-slow","rank":2,"step":10})"),
            std::string::npos)
      << json;
  Result<std::vector<Fault>> back = DecodeFaults(json);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, faults);
}

TEST(Json, EmptyInputMeansNoFaults) {
  EXPECT_TRUE(DecodeFaults("")->empty());
  EXPECT_TRUE(DecodeFaults("  ")->empty());
  EXPECT_TRUE(DecodeFaults("[]")->empty());
  EXPECT_EQ(EncodeFaults({}), "[]");
}

TEST(Json, AtMayBeSeconds) {
  Result<std::vector<Fault>> f = DecodeFaults(R"([{"id":"t","kind":"kill","rank":0,"at":2.5}])");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)[0].at, Duration(2'500'000'000));
}

TEST(Json, ErrorsNameTheField) {
  struct Case {
    std::string json, expected;
  };
  const std::vector<Case> cases = {
      {"{", "faults: not valid JSON"},
      {R"({"kind":"kill"})", "expected a JSON array"},
      {R"([1])", "faults[0]: expected an object"},
      {R"([{"id":"a"}])", "faults[0].kind: missing"},
      {R"([{"id":"a","kind":"kil"}])", "faults[0].kind: unknown fault kind 'kil'"},
      {R"([{"id":"a","kind":"kill","rank":"1"}])", "faults[0].rank: expected an integer"},
      {R"([{"id":"a","kind":"kill"},{"id":"b","kind":"kill","step":1.5}])",
       "faults[1].step: expected an integer"},
      {R"([{"id":"a","kind":"kill","at":"soon"}])", "faults[0].at: invalid duration 'soon'"},
      {R"([{"id":"a","kind":"slow","factor":"x"}])", "faults[0].factor: expected a number"},
      {R"([{"id":"a","kind":"kill","stpe":3}])", "faults[0]: unknown key 'stpe'"},
      {R"([{"id":7,"kind":"kill"}])", "faults[0].id: expected a string"},
      {R"([{"id":"a","kind":"bitflip","bit":"30"}])", "faults[0].bit: expected an integer"},
      {R"([{"id":"a","kind":"bitflip","element":1.5}])", "faults[0].element: expected an integer"},
      {R"([{"id":"a","kind":"bitflip","tensor":4294967296}])",
       "faults[0].tensor: 4294967296 is out of range"},
      // Wrapped around to rank -1 ("no rank") before.
      {R"([{"id":"a","kind":"kill-agent","rank":18446744073709551615,"at":"1s"}])",
       "faults[0].rank: 18446744073709551615 is out of range"},
  };
  for (const Case& c : cases) {
    Result<std::vector<Fault>> r = DecodeFaults(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.expected), std::string::npos)
        << c.json << " -> " << r.status().message();
  }
}

TEST(PoissonSchedule, IsDeterministicForASeed) {
  std::vector<Fault> a = *PoissonSchedule(60s, 42, 3600s, 8);
  std::vector<Fault> b = *PoissonSchedule(60s, 42, 3600s, 8);
  std::vector<Fault> c = *PoissonSchedule(60s, 43, 3600s, 8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a[0].id, "sched-1");
  EXPECT_EQ(a[1].id, "sched-2");
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(Validate(a[i]).ok()) << Validate(a[i]).message();
    EXPECT_EQ(a[i].kind, FaultKind::kKill);
    EXPECT_GE(a[i].rank, 0);
    EXPECT_LT(a[i].rank, 8);
    EXPECT_LT(*a[i].at, 3600s);
    if (i > 0) EXPECT_GE(*a[i].at, *a[i - 1].at);
  }
  EXPECT_TRUE(ValidateFaults(a).ok());
}

TEST(PoissonSchedule, AShareOfNodeLossesKeepsTheTimesAndRanksOfTheSameSeed) {
  std::vector<Fault> kills = *PoissonSchedule(10s, 5, 36000s, 4);
  std::vector<Fault> mixed =
      *PoissonSchedule(10s, 5, 36000s, 4, FaultKind::kKill, kMaxScheduledFaults, 0.1);
  ASSERT_GT(kills.size(), 3000u);
  int losses = 0;
  for (const Fault& f : mixed) losses += f.kind == FaultKind::kKillAgent ? 1 : 0;
  // About a tenth (binomial: 3600 draws, sd about 18).
  EXPECT_NEAR(losses, 0.1 * static_cast<double>(mixed.size()), 100);
  EXPECT_TRUE(ValidateFaults(mixed).ok());
  // Share 0 draws nothing more: the same schedule as without it.
  EXPECT_EQ(*PoissonSchedule(10s, 5, 36000s, 4, FaultKind::kKill, kMaxScheduledFaults, 0), kills);
}

// Pinned, so that a change of the draws shows: std::mt19937_64's output is
// fixed by the standard, and times are compared in whole milliseconds so that
// a last-bit difference of log1p between C libraries does not matter.
TEST(PoissonSchedule, PinnedValues) {
  std::vector<Fault> a = *PoissonSchedule(60s, 42, 600s, 4);
  std::string summary;
  for (const Fault& f : a) {
    summary += std::to_string(f.at->count() / 1000000) + "ms@" + std::to_string(f.rank) + " ";
  }
  EXPECT_EQ(summary,
            "84427ms@0 168122ms@2 308271ms@0 359551ms@0 378753ms@1 379500ms@2 448863ms@2 "
            "553975ms@0 ");
}

TEST(PoissonSchedule, MeanInterArrivalMatchesMtbf) {
  // 20000 arrivals: the sample mean of an exponential has relative standard
  // error 1/sqrt(n) = 0.7%; 3% is more than four standard errors.
  const Duration mtbf = 60s;
  std::vector<Fault> f = *PoissonSchedule(mtbf, 7, mtbf * 20000, 4);
  ASSERT_GT(f.size(), 19000u);
  ASSERT_LT(f.size(), 21000u);
  const double mean = Seconds(*f.back().at) / static_cast<double>(f.size());
  EXPECT_NEAR(mean, 60.0, 60.0 * 0.03);
  // Ranks are drawn uniformly: each of 4 gets 25% +- 2%.
  std::vector<int> per_rank(4);
  for (const Fault& x : f) ++per_rank[x.rank];
  for (int n : per_rank) EXPECT_NEAR(n / static_cast<double>(f.size()), 0.25, 0.02);
  // Exponential: about 1 - 1/e = 63.2% of the gaps are below the mean.
  int below = 0;
  for (size_t i = 1; i < f.size(); ++i) below += (*f[i].at - *f[i - 1].at) < mtbf;
  EXPECT_NEAR(below / static_cast<double>(f.size() - 1), 1 - std::exp(-1.0), 0.02);
}

TEST(PoissonSchedule, OtherKindsAreValid) {
  for (FaultKind k : {FaultKind::kExit, FaultKind::kHang, FaultKind::kNan, FaultKind::kSlow,
                      FaultKind::kLog, FaultKind::kKillAgent}) {
    std::vector<Fault> f = *PoissonSchedule(10s, 1, 100s, 2, k);
    ASSERT_FALSE(f.empty());
    EXPECT_TRUE(ValidateFaults(f).ok()) << ValidateFaults(f).message();
    EXPECT_EQ(f[0].kind, k);
  }
  EXPECT_TRUE(PoissonSchedule(10s, 1, 0s, 2)->empty());
}

// An mtbf of a microsecond over ten minutes would be 6e8 faults (gigabytes):
// refused from the expected count, before anything is drawn, and a draw that
// comes out larger than the bound is refused too.
TEST(PoissonSchedule, RefusesMoreThanTheBound) {
  Result<std::vector<Fault>> huge = PoissonSchedule(1us, 1, 600s, 4);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("about 6e+08 faults"), std::string::npos)
      << huge.status().message();
  EXPECT_NE(huge.status().message().find("at most 100000"), std::string::npos);
  EXPECT_NE(huge.status().message().find("raise the mtbf"), std::string::npos);
  EXPECT_DOUBLE_EQ(ExpectedFaultCount(1us, 600s), 6e8);
  // Expected 100 faults: refused under a bound of 50 before drawing. A seed
  // whose draw comes out above 100 is refused by the draw under a bound of
  // 100 (the expected count passes), and accepted under 150.
  EXPECT_NE(PoissonSchedule(1s, 3, 100s, 2, FaultKind::kKill, 50)
                .status()
                .message()
                .find("about 100 faults"),
            std::string::npos);
  uint64_t seed = 1;
  while (PoissonSchedule(1s, seed, 100s, 2, FaultKind::kKill, 150)->size() <= 100) ++seed;
  Result<std::vector<Fault>> over = PoissonSchedule(1s, seed, 100s, 2, FaultKind::kKill, 100);
  ASSERT_FALSE(over.ok()) << "seed " << seed;
  EXPECT_NE(over.status().message().find("seed " + std::to_string(seed) + " draws more than 100"),
            std::string::npos)
      << over.status().message();
}

TEST(FaultsForRank, KeepsUnfiredStepFaultsOfThatRank) {
  std::vector<Fault> all = {
      StepFault("a", FaultKind::kKill, 0, 3), StepFault("b", FaultKind::kNan, 1, 4),
      StepFault("c", FaultKind::kHang, 0, 5), StepFault("d", FaultKind::kKillAgent, 0, 6)};
  Fault timed = StepFault("e", FaultKind::kKill, 0, -1);
  timed.at = 5s;
  all.push_back(timed);
  std::vector<Fault> mine = FaultsForRank(all, 0, {});
  ASSERT_EQ(mine.size(), 2u);
  EXPECT_EQ(mine[0].id, "a");
  EXPECT_EQ(mine[1].id, "c");
  mine = FaultsForRank(all, 0, {"a"});
  ASSERT_EQ(mine.size(), 1u);
  EXPECT_EQ(mine[0].id, "c");
  EXPECT_EQ(FaultsForRank(all, 1, {}).size(), 1u);
  EXPECT_TRUE(FaultsForRank(all, 2, {}).empty());
}

}  // namespace
}  // namespace endure::faults
