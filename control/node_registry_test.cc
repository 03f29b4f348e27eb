#include "control/node_registry.h"

#include "control/memory_job_store.h"
#include "gtest/gtest.h"

namespace downpour {
namespace control {
namespace {

class NodeRegistryTest : public ::testing::Test {
 protected:
  NodeRegistry::Options Options() {
    NodeRegistry::Options options;
    options.node_timeout = absl::Seconds(5);
    options.recovery_grace = absl::Seconds(60);
    options.dead_node_retention = absl::Hours(1);
    options.now = [this] { return now_; };
    return options;
  }

  static NodeInfo Node(const std::string& id, NodeRole role, int64_t incarnation = 1) {
    NodeInfo node;
    node.set_id(id);
    node.set_role(role);
    node.set_address(id + ":1");
    node.set_incarnation(incarnation);
    node.set_checkpoints(role == SHARD);
    return node;
  }

  static std::vector<std::string> Ids(const std::vector<NodeInfo>& nodes) {
    std::vector<std::string> ids;
    for (const NodeInfo& node : nodes) ids.push_back(node.id());
    return ids;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  MemoryJobStore::Data data_;
  MemoryJobStore store_{&data_};
};

TEST_F(NodeRegistryTest, ASilentNodeIsDeadAfterTheTimeoutAndComesBackByHeartbeat) {
  NodeRegistry nodes(Options(), &store_);
  ASSERT_TRUE(nodes.Register(Node("w", WORKER)).ok());
  ASSERT_TRUE(nodes.Register(Node("s", SHARD)).ok());
  EXPECT_EQ(nodes.Address("s"), "s:1");
  EXPECT_TRUE(nodes.KeepsCheckpoints("s"));
  EXPECT_FALSE(nodes.KeepsCheckpoints("w"));
  now_ += absl::Seconds(4);
  ASSERT_TRUE(nodes.Heartbeat("s", 1, false).has_value());
  now_ += absl::Seconds(2);
  auto silent = nodes.Silent();
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0].first, "w");
  EXPECT_EQ(silent[0].second, "worker node w at w:1 stopped heartbeating for 6s");
  EXPECT_EQ(Ids(nodes.Available()), (std::vector<std::string>{"s"}));
  ASSERT_TRUE(nodes.MarkDead("w").ok());
  EXPECT_TRUE(nodes.Silent().empty());
  EXPECT_FALSE(data_.nodes[0].alive());
  // An unknown incarnation must register again; the known one revives it.
  EXPECT_FALSE(nodes.Heartbeat("w", 2, false).has_value());
  std::optional<NodeRegistry::Beat> beat = nodes.Heartbeat("w", 1, false);
  ASSERT_TRUE(beat.has_value());
  EXPECT_TRUE(beat->revived);
  EXPECT_TRUE(beat->revival.ok());
  EXPECT_TRUE(data_.nodes[0].alive());
}

TEST_F(NodeRegistryTest, NodesLoadedAfterARestartGetTheGraceButNoNewWork) {
  {
    NodeRegistry nodes(Options(), &store_);
    ASSERT_TRUE(nodes.Register(Node("w", WORKER)).ok());
    ASSERT_TRUE(nodes.Register(Node("gone", WORKER)).ok());
    now_ += absl::Seconds(10);
    ASSERT_TRUE(nodes.MarkDead("gone").ok());
  }
  NodeRegistry nodes(Options(), &store_);
  nodes.Load(data_.nodes);
  now_ += absl::Seconds(30);
  EXPECT_TRUE(nodes.Silent().empty());
  EXPECT_TRUE(nodes.Available().empty());  // Not heard since the restart.
  ASSERT_TRUE(nodes.Heartbeat("w", 1, false).has_value());
  EXPECT_EQ(Ids(nodes.Available()), (std::vector<std::string>{"w"}));
  EXPECT_FALSE(nodes.Find("gone")->alive());
  // Once heard, a node is judged by its own timeout; one never heard again,
  // once the grace is over.
  now_ += absl::Seconds(6);
  ASSERT_EQ(nodes.Silent().size(), 1u);
  EXPECT_EQ(nodes.Silent()[0].first, "w");
}

TEST_F(NodeRegistryTest, RestartsDrainsAndCordons) {
  NodeRegistry nodes(Options(), &store_);
  ASSERT_TRUE(nodes.Register(Node("w", WORKER)).ok());
  EXPECT_FALSE(nodes.Restarted(Node("w", WORKER, 1)));
  EXPECT_TRUE(nodes.Restarted(Node("w", WORKER, 2)));
  EXPECT_FALSE(nodes.Restarted(Node("new", WORKER, 2)));

  absl::StatusOr<NodeInfo> cordoned = nodes.SetCordoned("w", true);
  ASSERT_TRUE(cordoned.ok());
  EXPECT_TRUE(cordoned->cordoned());
  EXPECT_TRUE(nodes.Available().empty());
  // The cordon outlives the node's restart.
  ASSERT_TRUE(nodes.Register(Node("w", WORKER, 2)).ok());
  EXPECT_TRUE(nodes.Find("w")->cordoned());
  ASSERT_TRUE(nodes.SetCordoned("w", false).ok());
  EXPECT_EQ(nodes.SetCordoned("zzz", true).status().message(), "no node \"zzz\"");

  std::optional<NodeRegistry::Beat> beat = nodes.Heartbeat("w", 2, /*draining=*/true);
  ASSERT_TRUE(beat.has_value());
  EXPECT_TRUE(beat->began_draining);
  EXPECT_TRUE(beat->draining);
  EXPECT_FALSE(nodes.Heartbeat("w", 2, true)->began_draining);
  EXPECT_TRUE(nodes.Available().empty());
  EXPECT_TRUE(nodes.List()[0].draining());
}

TEST_F(NodeRegistryTest, ANodeKeepsItsRoleWhileItIsAlive) {
  NodeRegistry nodes(Options(), &store_);
  ASSERT_TRUE(nodes.Register(Node("w0", WORKER)).ok());
  absl::Status as_shard = nodes.Register(Node("w0", SHARD, 2));
  EXPECT_EQ(as_shard.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(as_shard.message(),
            "node w0 is registered as a worker and cannot register as a shard: a node keeps its "
            "role while it is alive (give the new one another --node_id)");
  EXPECT_EQ(nodes.Find("w0")->role(), WORKER);
  EXPECT_EQ(nodes.Find("w0")->incarnation(), 1);
  // Once it is dead, the name may be used again.
  now_ += absl::Seconds(6);
  ASSERT_TRUE(nodes.MarkDead("w0").ok());
  EXPECT_TRUE(nodes.Register(Node("w0", SHARD, 2)).ok());
  EXPECT_EQ(nodes.Find("w0")->role(), SHARD);
}

TEST_F(NodeRegistryTest, AFailedWriteChangesNothing) {
  NodeRegistry nodes(Options(), &store_);
  ASSERT_TRUE(nodes.Register(Node("w", WORKER)).ok());
  data_.failing = true;
  EXPECT_FALSE(nodes.SetCordoned("w", true).ok());
  EXPECT_FALSE(nodes.Find("w")->cordoned());
  now_ += absl::Seconds(6);
  EXPECT_FALSE(nodes.MarkDead("w").ok());
  EXPECT_EQ(nodes.Silent().size(), 1u);  // Still to be declared dead.
  EXPECT_FALSE(nodes.Register(Node("x", WORKER)).ok());
  EXPECT_FALSE(nodes.Find("x").has_value());
}

TEST_F(NodeRegistryTest, DeadNodesLeaveAfterTheRetentionUnlessAJobNamesThem) {
  NodeRegistry nodes(Options(), &store_);
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(nodes.Register(Node(id, WORKER)).ok());
  now_ += absl::Seconds(6);
  for (const char* id : {"a", "b"}) ASSERT_TRUE(nodes.MarkDead(id).ok());
  ASSERT_TRUE(nodes.Heartbeat("c", 1, false).has_value());
  now_ += absl::Minutes(59);
  ASSERT_TRUE(nodes.Heartbeat("c", 1, false).has_value());
  EXPECT_TRUE(nodes.RemoveDead({}).empty());
  EXPECT_EQ(nodes.List().size(), 3u);
  now_ += absl::Minutes(2);
  ASSERT_TRUE(nodes.Heartbeat("c", 1, false).has_value());
  EXPECT_TRUE(nodes.RemoveDead({"b"}).empty());
  EXPECT_EQ(Ids(nodes.List()), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(data_.nodes.size(), 2u);
}

}  // namespace
}  // namespace control
}  // namespace downpour
