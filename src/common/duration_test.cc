#include "common/duration.h"

#include <gtest/gtest.h>

namespace endure {
namespace {

using namespace std::chrono_literals;

TEST(ParseDuration, AcceptsUnitsAndSums) {
  EXPECT_EQ(*ParseDuration("500ms"), 500ms);
  EXPECT_EQ(*ParseDuration("30s"), 30s);
  EXPECT_EQ(*ParseDuration("5m"), 5min);
  EXPECT_EQ(*ParseDuration("2h"), 2h);
  EXPECT_EQ(*ParseDuration("1h30m"), 90min);
  EXPECT_EQ(*ParseDuration("90d"), 90 * 24h);
  EXPECT_EQ(*ParseDuration("1.5s"), 1500ms);
}

TEST(ParseDuration, RefusesWithAHint) {
  for (const char* bad : {"", "10", "-5s", "5x", "s", "1..2s"}) {
    Result<Duration> r = ParseDuration(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("e.g. 500ms"), std::string::npos);
  }
}

TEST(FormatDuration, IsShortAndHuman) {
  EXPECT_EQ(FormatDuration(850ms), "850ms");
  EXPECT_EQ(FormatDuration(12500ms), "12.5s");
  EXPECT_EQ(FormatDuration(200s), "3m20s");
  EXPECT_EQ(FormatDuration(125min), "2h05m");
}

}  // namespace
}  // namespace endure
