#include "common/net_address.h"

#include "gtest/gtest.h"

namespace downpour {
namespace {

TEST(ParseHostPortTest, AcceptsForms) {
  auto a = ParseHostPort("127.0.0.1:0");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 0);
  auto b = ParseHostPort("[::1]:80");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  auto c = ParseHostPort(":9000");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->host, "0.0.0.0");
}

TEST(ParseHostPortTest, RejectsBadPorts) {
  EXPECT_FALSE(ParseHostPort("localhost").ok());
  EXPECT_FALSE(ParseHostPort("localhost:http").ok());
  EXPECT_FALSE(ParseHostPort("localhost:70000").ok());
  EXPECT_NE(ParseHostPort("x:y").status().message().find("\"x:y\""), std::string::npos);
}

}  // namespace
}  // namespace downpour
