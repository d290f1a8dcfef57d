#include "controller/incident_kb.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/incident_match.h"

namespace endure::controller {
namespace {

class IncidentKbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "incident_kb_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static KbIncident Incident(const std::string& job, int id, const std::string& excerpt) {
    KbIncident k;
    k.job = job;
    k.job_dir = "/runs/" + job;
    k.run = 1;
    k.job_incident = id;
    k.at_unix_ms = 1000 * id;
    k.node = "node1";
    k.rank = 0;
    k.cause = "worker_exit code 1";
    k.action = "restart_in_place";
    k.excerpt = excerpt;
    k.normalized = core::NormalizeExcerpt(excerpt);
    return k;
  }

  std::string dir_;
};

TEST_F(IncidentKbTest, RecordsOnceResolvesAndFindsTheEarlierLikeIt) {
  Result<IncidentKb> kb = IncidentKb::Open(IncidentKb::PathIn(dir_));
  ASSERT_TRUE(kb.ok()) << kb.status().ToString();
  const std::string hca = "fabricd[1]: mlx5_3: firmware assert 0x1f (syndrome 0x8b)\n";
  Result<int64_t> a = kb->Record(Incident("one", 1, hca));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  // A replayed journal records the same incident again: the same row.
  EXPECT_EQ(*kb->Record(Incident("one", 1, hca)), *a);
  Result<int64_t> other = kb->Record(Incident("one", 2, "Out of memory: Killed process 4 (x)\n"));
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *a);
  ASSERT_TRUE(
      kb->Resolve(*a, core::LogAction::kEvictNode, "hca_firmware", "HCA replaced", 5000).ok());
  EXPECT_EQ(kb->Resolve(999, core::LogAction::kStop, "", "", 0).code(), StatusCode::kNotFound);
  ASSERT_TRUE(kb->UpdateAction(*other, "stop").ok());

  // Another controller, another job: the knowledge base is the cluster's.
  Result<IncidentKb> again = IncidentKb::OpenExisting(IncidentKb::PathIn(dir_));
  ASSERT_TRUE(again.ok());
  KbIncident next =
      Incident("two", 1, "fabricd[77]: mlx5_0: firmware assert 0x9 (syndrome 0x8b)\n");
  Result<std::vector<Recurrence>> similar =
      again->Similar(next, 3, core::kRecurrenceScore, /*earlier_only=*/true);
  ASSERT_TRUE(similar.ok()) << similar.status().ToString();
  ASSERT_EQ(similar->size(), 1u);
  EXPECT_EQ((*similar)[0].id, *a);
  EXPECT_TRUE((*similar)[0].resolved);
  EXPECT_EQ((*similar)[0].action, "evict_node");
  EXPECT_EQ((*similar)[0].cause, "hca_firmware");
  EXPECT_EQ((*similar)[0].note, "HCA replaced");

  Result<std::vector<KbIncident>> all = again->List();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].action, "stop");
  EXPECT_EQ((*all)[0].resolved_at_unix_ms, 5000);
  EXPECT_FALSE((*all)[1].resolution.has_value());
}

// A base shared by every job grows without end: a new incident is compared
// with the newest `compared` only, earlier ones than itself when asked.
TEST_F(IncidentKbTest, ANewIncidentIsComparedWithTheNewestOnly) {
  Result<IncidentKb> kb = IncidentKb::Open(IncidentKb::PathIn(dir_));
  ASSERT_TRUE(kb.ok()) << kb.status().ToString();
  const std::string hca = "fabricd[1]: mlx5_3: firmware assert 0x1f (syndrome 0x8b)\n";
  std::vector<int64_t> ids;
  for (int i = 1; i <= 12; ++i) ids.push_back(kb->Record(Incident("one", i, hca)).value());
  KbIncident next = Incident("two", 1, hca);
  Result<std::vector<Recurrence>> all = kb->Similar(next, 100, core::kRecurrenceScore, true);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->size(), 12u) << "all of them, under the default bound";
  Result<std::vector<Recurrence>> newest =
      kb->Similar(next, 100, core::kRecurrenceScore, true, /*compared=*/5);
  ASSERT_TRUE(newest.ok());
  ASSERT_EQ(newest->size(), 5u);
  for (const Recurrence& r : *newest) EXPECT_GE(r.id, ids[7]) << "one of the newest five";
  // Earlier than a recorded one: the five before it.
  next.id = ids[5];
  Result<std::vector<Recurrence>> before =
      kb->Similar(next, 100, core::kRecurrenceScore, true, /*compared=*/5);
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->size(), 5u);
  for (const Recurrence& r : *before) {
    EXPECT_LT(r.id, ids[5]);
    EXPECT_GE(r.id, ids[0]);
  }
  Result<std::vector<KbIncident>> last3 = kb->List(3);
  ASSERT_TRUE(last3.ok());
  ASSERT_EQ(last3->size(), 3u);
  EXPECT_EQ((*last3)[0].id, ids[9]) << "oldest first";
}

TEST_F(IncidentKbTest, AFileThatIsNoDatabaseIsDataLossNamingIt) {
  const std::string path = IncidentKb::PathIn(dir_);
  std::ofstream(path) << "not a database, just some text that is long enough to be read";
  Result<IncidentKb> kb = IncidentKb::Open(path);
  ASSERT_FALSE(kb.ok());
  EXPECT_EQ(kb.status().code(), StatusCode::kDataLoss) << kb.status().ToString();
  EXPECT_NE(kb.status().message().find(path), std::string::npos);
  EXPECT_EQ(IncidentKb::OpenExisting(dir_ + "/none.db").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace endure::controller
