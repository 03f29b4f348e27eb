#include "rpc/server_metrics.h"

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "common/metrics.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/health_service.grpc.pb.h"
#include "ps/parameter_store.h"
#include "rpc/daemon.h"
#include "rpc/remote_parameter_shard.h"
#include "rpc/shard_service.h"

namespace downpour {
namespace {

// A shard service (hosting no job) on loopback, measured into `metrics_`.
class ServerMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = StartGrpcServer("127.0.0.1:0", {&service_}, &metrics_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }
  void TearDown() override { server_.server->Shutdown(); }

  std::string Exposition() { return metrics_.Exposition(); }
  bool Has(const std::string& line) { return Exposition().find(line + "\n") != std::string::npos; }

  MetricsRegistry metrics_;
  ParameterStore store_;
  ParameterServerService service_{&store_};
  RunningServer server_;
};

TEST_F(ServerMetricsTest, UnaryCallsAreTimedAndCountedByMethodAndCode) {
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(server_.address, grpc::InsecureChannelCredentials()));
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    ASSERT_TRUE(health->Check(&context, request, &response).ok());
  }
  auto shard = RemoteParameterShard::Create(server_.address);
  PullRequest pull;
  pull.set_job_id("nobody");
  Payload payload;
  EXPECT_FALSE(shard->Pull(pull, absl::Now() + absl::Seconds(10), &payload).ok());

  EXPECT_TRUE(
      Has("downpour_rpc_server_handled_total{code=\"OK\","
          "method=\"grpc.health.v1.Health/Check\"} 2"))
      << Exposition();
  EXPECT_TRUE(
      Has("downpour_rpc_server_handling_seconds_count{"
          "method=\"grpc.health.v1.Health/Check\"} 2"))
      << Exposition();
  EXPECT_TRUE(
      Has("downpour_rpc_server_handling_seconds_bucket{"
          "le=\"+Inf\",method=\"grpc.health.v1.Health/Check\"} 2"))
      << Exposition();
  // The store's answer for a job it does not host, as its gRPC code.
  EXPECT_TRUE(
      Has("downpour_rpc_server_handled_total{code=\"NotFound\","
          "method=\"downpour.ParameterServer/Pull\"} 1"))
      << Exposition();
}

TEST_F(ServerMetricsTest, AStreamIsTimedPerExchangeAndCountedWhenItEnds) {
  RemoteParameterShard::Options options;
  // /PushPullStream itself (a shared-memory stream's first message attaches).
  options.use_shared_memory = false;
  auto shard = RemoteParameterShard::Create(server_.address, options);
  PushRequest push;
  push.set_job_id("nobody");
  PullRequest pull;
  pull.set_job_id("nobody");
  for (int i = 0; i < 3; ++i) {
    Payload payload;
    // Refused in the stream's answer: the stream itself goes on.
    EXPECT_FALSE(
        shard->PushPull(push, Payload(), pull, absl::Now() + absl::Seconds(10), &payload).ok());
  }
  EXPECT_TRUE(
      Has("downpour_rpc_server_handling_seconds_count{"
          "method=\"downpour.ParameterServer/PushPullStream\"} 3"))
      << Exposition();
  EXPECT_EQ(Exposition().find("PushPullStream\",code"), std::string::npos);
  // Closing the client ends the stream; its status is counted once the
  // server has sent it.
  shard.reset();
  const std::string ended =
      "downpour_rpc_server_handled_total{code=\"OK\","
      "method=\"downpour.ParameterServer/PushPullStream\"} 1";
  for (int i = 0; i < 500 && !Has(ended); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(Has(ended)) << Exposition();
}

TEST(GrpcCodeNameTest, NamesAsGrpcsOtherLanguagesDo) {
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::OK), "OK");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::CANCELLED), "Canceled");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::DEADLINE_EXCEEDED), "DeadlineExceeded");
  EXPECT_EQ(GrpcCodeName(grpc::StatusCode::UNAUTHENTICATED), "Unauthenticated");
  EXPECT_EQ(GrpcCodeName(static_cast<grpc::StatusCode>(42)), "Code42");
}

}  // namespace
}  // namespace downpour
