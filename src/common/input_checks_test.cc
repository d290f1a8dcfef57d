// Node names, constant-time comparison, random credentials and UTF-8 repair:
// the checks every hostile input goes through.
#include <gtest/gtest.h>

#include <set>

#include "common/names.h"
#include "common/net.h"
#include "common/secret.h"
#include "common/utf8.h"

namespace endure {
namespace {

TEST(NodeName, AcceptsTheNamesEndureGives) {
  const std::string names[] = {"node0", "node17", "gpu-node-3.rack_2",
                               "N",     "0",      std::string(64, 'a')};
  for (const std::string& name : names) EXPECT_TRUE(IsValidNodeName(name)) << name;
}

TEST(NodeName, RefusesAnythingThatCouldLeaveADirectory) {
  const std::string cases[] = {"",
                               ".",
                               "..",
                               "../../../etc",
                               "a/b",
                               "/abs",
                               ".hidden",
                               "-rf",
                               "node 0",
                               std::string("node\0x", 6),
                               "n\xc3\xa9ud",
                               std::string(65, 'a')};
  for (const std::string& name : cases) {
    EXPECT_FALSE(IsValidNodeName(name)) << QuoteForLog(name);
    Status st = CheckNodeName(name, "--node-id");
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message().rfind("--node-id: '", 0), 0u) << st.message();
  }
}

TEST(NodeName, AHostIsNamedByItsFirstLabel) {
  EXPECT_EQ(NodeNameOfHost("gpu-17.cluster.example.org").value(), "gpu-17");
  EXPECT_EQ(NodeNameOfHost("node0").value(), "node0");
  for (const std::string_view bad : {"", ".example", "-x.example", "h\xc3\xa9te"}) {
    Result<std::string> name = NodeNameOfHost(bad);
    ASSERT_FALSE(name.ok()) << bad;
    EXPECT_NE(name.status().message().find("pass --node-id NAME"), std::string::npos)
        << name.status().message();
  }
}

TEST(Address, HostOfEveryForm) {
  EXPECT_EQ(HostOfAddress("127.0.0.1:5000"), "127.0.0.1");
  EXPECT_EQ(HostOfAddress("[::1]:5000"), "::1");
  EXPECT_EQ(HostOfAddress("node7.example:0"), "node7.example");
  EXPECT_EQ(HostOfAddress("::1"), "::1");
  EXPECT_EQ(HostOfAddress("0.0.0.0:1"), "0.0.0.0");
}

TEST(Address, TheInterfaceOfAnAddressIsFound) {
  EXPECT_EQ(InterfaceWithAddress("127.0.0.1"), "lo");
  EXPECT_EQ(InterfaceWithAddress("192.0.2.77"), "");  // TEST-NET-1: on no interface here
  EXPECT_EQ(InterfaceWithAddress("not-an-address"), "");
  EXPECT_EQ(InterfaceWithAddress(""), "");
}

TEST(Address, LoopbackIsOnlyThisMachine) {
  for (const char* host : {"localhost", "127.0.0.1", "127.1.2.3", "::1"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  // Every interface, other hosts, and names that only start like loopback.
  for (const char* host : {"", "0.0.0.0", "::", "10.0.0.1", "127.example.com", "127.0.0.1.nip.io",
                           "127.0.0.256", "127..0.1", "localhost.evil", "[::1]"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

TEST(QuoteForLog, ShowsUnprintableBytesAndCuts) {
  EXPECT_EQ(QuoteForLog("a\nb\xe9"), "a\\x0ab\\xe9");
  EXPECT_EQ(QuoteForLog(std::string(100, 'x'), 4), "xxxx...");
}

TEST(ConstantTimeEquals, ComparesContentsAndLengths) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("secret-token", "secret-token"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", "secret-tokeN"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", "secret-toke"));
  EXPECT_FALSE(ConstantTimeEquals("secret", ""));
  EXPECT_FALSE(ConstantTimeEquals("", "secret"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), std::string("a\0c", 3)));
  // A prefix followed by NULs is not the shorter string.
  EXPECT_FALSE(ConstantTimeEquals(std::string("ab\0", 3), "ab"));
}

TEST(RandomHex, GivesDistinctLowercaseHexOfTheRightLength) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    Result<std::string> hex = RandomHex(16);
    ASSERT_TRUE(hex.ok()) << hex.status().ToString();
    ASSERT_EQ(hex->size(), 32u);
    EXPECT_EQ(hex->find_first_not_of("0123456789abcdef"), std::string::npos) << *hex;
    seen.insert(*hex);
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(Utf8, ValidTextIsUnchanged) {
  for (const char* s :
       {"", "plain ascii", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xf4\x8f\xbf\xbf"}) {
    EXPECT_TRUE(IsValidUtf8(s)) << s;
    EXPECT_EQ(SanitizeUtf8(s), s);
  }
}

TEST(Utf8, IllFormedSequencesBecomeReplacementCharacters) {
  const std::string fffd = "\xef\xbf\xbd";
  const std::pair<std::string, std::string> cases[] = {
      {"No space left on device \xe9", "No space left on device " + fffd},  // Latin-1 e-acute
      {"\xc0\xaf", fffd + fffd},                                            // overlong '/'
      {"\xed\xa0\x80", fffd + fffd + fffd},                                 // a surrogate
      {"\xf4\x90\x80\x80", fffd + fffd + fffd + fffd},                      // above U+10FFFF
      {"\xe2\x82", fffd},                                                   // truncated
      {"\xe2\x82x", fffd + "x"},                                            // cut short
      {"\xff", fffd},
      {std::string("a\0b", 3), std::string("a\0b", 3)},  // NUL is valid UTF-8
  };
  for (const auto& [in, out] : cases) {
    EXPECT_EQ(SanitizeUtf8(in), out) << QuoteForLog(in);
    EXPECT_TRUE(IsValidUtf8(SanitizeUtf8(in)));
    EXPECT_EQ(IsValidUtf8(in), in == out) << QuoteForLog(in);
  }
}

}  // namespace
}  // namespace endure
