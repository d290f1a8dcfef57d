#include "controller/live_history.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace endure::controller {
namespace {

HistorySample At(double t_s) {
  HistorySample s;
  s.t_s = t_s;
  s.ettr = t_s / 10000;
  s.step = static_cast<int64_t>(t_s);
  s.loss = std::numeric_limits<double>::quiet_NaN();
  s.ledger_s[0] = t_s;
  return s;
}

// A month at one sample a second would be 2.6 million points: the history
// stays within kMaxPoints, keeps the first and the newest sample, and its
// spacing doubles as it thins.
TEST(LiveHistory, ARunOfAnyLengthKeepsItsShapeInBoundedSpace) {
  LiveHistory h;
  int added = 0;
  for (double t = 0; t <= 30 * 86400; t += 1) {
    if (!h.Due(t)) continue;
    h.Add(At(t));
    ++added;
    ASSERT_LE(h.size(), LiveHistory::kMaxPoints);
  }
  EXPECT_GT(h.size(), LiveHistory::kMaxPoints / 2);
  EXPECT_EQ(h.samples().front().t_s, 0);
  EXPECT_GE(h.samples().back().t_s, 30 * 86400 - h.spacing_s());
  EXPECT_GE(h.spacing_s(), 4096);  // 2.6e6 s / 600 points, rounded up to a power of two
  EXPECT_LT(added, 10000);         // asked once per spacing, not once a second
  for (size_t i = 1; i < h.size(); ++i) {
    EXPECT_LT(h.samples()[i - 1].t_s, h.samples()[i].t_s);
  }
}

TEST(LiveHistory, TheJsonColumnsAreAsLongAsEachOtherAndComeBackTheSame) {
  LiveHistory h;
  for (double t = 0; t < 1500; t += 1) {
    if (h.Due(t)) h.Add(At(t));
  }
  HistorySample with_loss = At(5000);
  with_loss.loss = 2.5;
  h.Add(with_loss);
  const nlohmann::json j = h.ToJson();
  ASSERT_EQ(j["t_s"].size(), h.size());
  EXPECT_EQ(j["ettr"].size(), h.size());
  EXPECT_EQ(j["ledger_s"]["productive"].size(), h.size());
  EXPECT_TRUE(j["loss"][0].is_null());  // NaN: no loss yet
  EXPECT_EQ(j["loss"].back(), 2.5);
  Result<LiveHistory> back = LiveHistory::FromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->ToJson(), j);
  EXPECT_EQ(back->spacing_s(), h.spacing_s());
}

TEST(LiveHistory, ADamagedSavedHistoryIsAnErrorThatSaysWhat) {
  LiveHistory h;
  h.Add(At(0));
  h.Add(At(1));
  nlohmann::json shorter = h.ToJson();
  shorter["ettr"].erase(0);
  nlohmann::json backwards = h.ToJson();
  backwards["t_s"] = {5, 1};
  for (const auto& [bad, says] :
       std::vector<std::pair<nlohmann::json, std::string>>{{nlohmann::json::array(), "object"},
                                                           {shorter, "ettr"},
                                                           {backwards, "rising"},
                                                           {{{"t_s", 1}}, "t_s"}}) {
    Result<LiveHistory> r = LiveHistory::FromJson(bad);
    ASSERT_FALSE(r.ok()) << bad.dump();
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
  }
}

TEST(LiveHistory, ASampleFromBeforeTheNewestIsDropped) {
  LiveHistory h;
  h.Add(At(10));
  h.Add(At(5));
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h.samples()[0].t_s, 10);
}

}  // namespace
}  // namespace endure::controller
