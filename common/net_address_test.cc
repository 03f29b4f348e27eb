#include "common/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <string>

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

// What a daemon registers: --advertise when given (its port, or the bound
// one), else where it listens, a wildcard host replaced by the machine's
// name.
TEST(IsLoopbackHostTest, OnlyLoopbackNames) {
  for (const char* host : {"localhost", "127.0.0.1", "127.1.2.3", "::1", "[::1]"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"", "0.0.0.0", "::", "10.0.0.1", "example.org", "128.0.0.1"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

// Loopback in every spelling, and an address an interface of this host
// holds (found here with getifaddrs); not a documentation-only address, a
// name, or garbage.
TEST(IsThisHostAddressTest, LoopbackAndThisHostsInterfacesOnly) {
  EXPECT_TRUE(IsThisHostAddress("127.0.0.1"));
  EXPECT_TRUE(IsThisHostAddress("127.3.2.1"));
  EXPECT_TRUE(IsThisHostAddress("::1"));
  EXPECT_TRUE(IsThisHostAddress("::ffff:127.0.0.1"));
  EXPECT_FALSE(IsThisHostAddress("192.0.2.77"));  // TEST-NET-1.
  EXPECT_FALSE(IsThisHostAddress("2001:db8::77"));
  EXPECT_FALSE(IsThisHostAddress("localhost"));
  EXPECT_FALSE(IsThisHostAddress("not an address"));
  ifaddrs* interfaces = nullptr;
  ASSERT_EQ(getifaddrs(&interfaces), 0);
  for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text,
              sizeof(text));
    EXPECT_TRUE(IsThisHostAddress(text)) << text;
    EXPECT_TRUE(IsThisHostAddress(std::string("::ffff:") + text)) << text;
  }
  freeifaddrs(interfaces);
}

TEST(AdvertisedAddressTest, ListenAddressByDefault) {
  EXPECT_EQ(*AdvertisedAddress("", "127.0.0.1", 4100, "node7"), "127.0.0.1:4100");
  EXPECT_EQ(*AdvertisedAddress("", "10.0.0.5", 4100, "node7"), "10.0.0.5:4100");
  EXPECT_EQ(*AdvertisedAddress("", "::1", 4100, "node7"), "[::1]:4100");
}

TEST(AdvertisedAddressTest, WildcardListenAdvertisesTheHostName) {
  EXPECT_EQ(*AdvertisedAddress("", "0.0.0.0", 4100, "node7"), "node7:4100");
  EXPECT_EQ(*AdvertisedAddress("", "::", 4100, "node7"), "node7:4100");
  const auto nameless = AdvertisedAddress("", "0.0.0.0", 4100, "");
  EXPECT_EQ(nameless.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nameless.status().message().find("--advertise=HOST"), std::string::npos);
}

TEST(AdvertisedAddressTest, AdvertiseWinsAndMayTakeTheBoundPort) {
  EXPECT_EQ(*AdvertisedAddress("10.1.2.3:5000", "0.0.0.0", 4100, "node7"), "10.1.2.3:5000");
  EXPECT_EQ(*AdvertisedAddress("10.1.2.3", "0.0.0.0", 4100, "node7"), "10.1.2.3:4100");
  EXPECT_EQ(*AdvertisedAddress("shard-0.ps:0", "0.0.0.0", 4100, ""), "shard-0.ps:4100");
  EXPECT_EQ(*AdvertisedAddress("[fd00::2]", "::", 4100, ""), "[fd00::2]:4100");
}

TEST(AdvertisedAddressTest, BadAdvertiseIsInvalidArgument) {
  for (const char* bad : {"0.0.0.0:4100", ":4100", "host:http", "host:70000", "[::]"}) {
    const auto a = AdvertisedAddress(bad, "127.0.0.1", 4100, "node7");
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace downpour
