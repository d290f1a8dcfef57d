#include "controller/live_tables.h"

#include <gtest/gtest.h>

namespace endure::controller {
namespace {

std::vector<nlohmann::json> Rows(int n) {
  std::vector<nlohmann::json> rows;
  for (int i = 0; i < n; ++i) rows.push_back({{"i", i}});
  return rows;
}

TEST(LiveTables, APageHoldsTheReportsRowsAndSaysHowManyInAll) {
  const std::vector<nlohmann::json> rows = Rows(120);
  Result<nlohmann::json> first = PageOf(rows, "");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ((*first)["total"], 120);
  EXPECT_EQ((*first)["pages"], 3);
  EXPECT_EQ((*first)["page"], 0);
  ASSERT_EQ((*first)["rows"].size(), kReportRows);
  EXPECT_EQ((*first)["rows"][0]["i"], 0);
  Result<nlohmann::json> last = PageOf(rows, "2");
  ASSERT_TRUE(last.ok());
  ASSERT_EQ((*last)["rows"].size(), 20u);
  EXPECT_EQ((*last)["rows"][0]["i"], 100);
  Result<nlohmann::json> past = PageOf(rows, "3");
  ASSERT_TRUE(past.ok());
  EXPECT_TRUE((*past)["rows"].empty());
  Result<nlohmann::json> none = PageOf({}, "0");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ((*none)["pages"], 0);
}

TEST(LiveTables, APageThatIsNoWholeNumberIsAnErrorThatSaysWhatToSend) {
  for (const char* bad : {"-1", "1x", "one", " 1", "99999999999999999999", "2000000000"}) {
    Result<nlohmann::json> page = PageOf(Rows(3), bad);
    ASSERT_FALSE(page.ok()) << bad;
    EXPECT_EQ(page.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(page.status().message().find("?page=N"), std::string::npos)
        << page.status().message();
  }
}

}  // namespace
}  // namespace endure::controller
