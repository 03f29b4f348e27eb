// The coordinator's door: each bound of spec/limits.h over the requests a
// client or a node sends, refused with one sentence naming the field, its
// size and the limit; what is within the limits passes.
#include "control/request_limits.h"

#include <string>

#include "gtest/gtest.h"
#include "spec/limits.h"

namespace downpour {
namespace control {
namespace {

NodeInfo GoodNode() {
  NodeInfo node;
  node.set_id("worker@10.0.0.7:7071");
  node.set_role(WORKER);
  node.set_address("10.0.0.7:7071");
  node.set_metrics_address("10.0.0.7:9100");
  node.set_hostname("host7");
  node.add_devices("cuda:0 NVIDIA H100 80GB HBM3");
  return node;
}

void ExpectRefused(const absl::Status& status, const std::string& message) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message(), message);
}

TEST(RequestLimitsTest, JobAndNodeIdArguments) {
  EXPECT_TRUE(CheckJobIdArgument(std::string(kMaxJobIdBytes, 'j')).ok());
  ExpectRefused(CheckJobIdArgument(std::string(1 << 20, 'j')),
                "job_id is 1048576 bytes; the limit is 64 bytes");
  EXPECT_TRUE(CheckNodeIdArgument(std::string(kMaxNodeIdBytes, 'n')).ok());
  ExpectRefused(CheckNodeIdArgument(std::string(kMaxNodeIdBytes + 1, 'n')),
                "node_id is 513 bytes; the limit is 512 bytes");
}

TEST(RequestLimitsTest, RegisteredNodes) {
  EXPECT_TRUE(CheckNodeInfo(GoodNode()).ok());
  NodeInfo node = GoodNode();
  node.set_id(std::string(600, 'n'));
  ExpectRefused(CheckNodeInfo(node), "node.id is 600 bytes; the limit is 512 bytes");
  node = GoodNode();
  node.set_id("ps\n1");
  ExpectRefused(CheckNodeInfo(node), "node.id \"ps\\n1\" holds a control character");
  node = GoodNode();
  node.set_address(std::string(513, 'a'));
  ExpectRefused(CheckNodeInfo(node), "node.address is 513 bytes; the limit is 512 bytes");
  node = GoodNode();
  node.set_metrics_address(std::string(513, 'a'));
  ExpectRefused(CheckNodeInfo(node), "node.metrics_address is 513 bytes; the limit is 512 bytes");
  node = GoodNode();
  node.set_hostname(std::string(257, 'h'));
  ExpectRefused(CheckNodeInfo(node), "node.hostname is 257 bytes; the limit is 256 bytes");
  node = GoodNode();
  for (int i = 0; i < 64; ++i) node.add_devices("cpu");
  ExpectRefused(CheckNodeInfo(node), "node.devices has 65 entries; the limit is 64");
  node = GoodNode();
  node.set_devices(0, std::string(257, 'd'));
  ExpectRefused(CheckNodeInfo(node), "node.devices[0] is 257 bytes; the limit is 256 bytes");
  // Fields a newer node sends that this coordinator does not know count too.
  // Field 999, length-delimited, 81920 bytes (varint 80 80 05).
  std::string bytes = GoodNode().SerializeAsString() + std::string("\xba\x3e\x80\x80\x05", 5) +
                      std::string(81920, 'u');
  ASSERT_TRUE(node.ParseFromString(bytes));
  EXPECT_EQ(CheckNodeInfo(node).message().substr(0, 8), "node is ");
}

TEST(RequestLimitsTest, SubmittedJobIdsAndInitialWeights) {
  SubmitJobRequest request;
  EXPECT_TRUE(CheckSubmitJobRequest(request).ok());
  request.set_job_id(std::string(65, 'j'));
  ExpectRefused(CheckSubmitJobRequest(request), "the job id is 65 bytes; the limit is 64 bytes");
  request.set_job_id("fine");
  request.mutable_init_from()->set_job_id(std::string(100, 'j'));
  ExpectRefused(CheckSubmitJobRequest(request),
                "init_from.job_id is 100 bytes; the limit is 64 bytes");
  request.mutable_init_from()->set_job_id("");
  request.mutable_init_from()->set_weights_name(std::string(5000, 'w'));
  ExpectRefused(CheckSubmitJobRequest(request),
                "init_from.weights_name is 5000 bytes; the limit is 4096 bytes (4 KiB)");
}

TEST(RequestLimitsTest, Heartbeats) {
  HeartbeatRequest request;
  request.set_node_id("ps@1");
  for (int i = 0; i < kMaxLogLinesPerHeartbeat; ++i) request.add_logs()->set_text("x");
  EXPECT_TRUE(CheckHeartbeatRequest(request).ok());
  request.add_logs();
  ExpectRefused(CheckHeartbeatRequest(request), "logs has 2001 entries; the limit is 2000");
  request.clear_logs();
  for (int i = 0; i <= kMaxCheckpointPartsPerHeartbeat; ++i) request.add_checkpoints();
  ExpectRefused(CheckHeartbeatRequest(request), "checkpoints has 4097 entries; the limit is 4096");
  request.clear_checkpoints();
  request.set_node_id(std::string(513, 'n'));
  ExpectRefused(CheckHeartbeatRequest(request), "node_id is 513 bytes; the limit is 512 bytes");
  // A long log line is cut where the coordinator takes it, not refused.
  request.set_node_id("ps@1");
  request.add_logs()->set_text(std::string(1 << 20, 'x'));
  EXPECT_TRUE(CheckHeartbeatRequest(request).ok());
}

TEST(RequestLimitsTest, ProgressReports) {
  ReportProgressRequest request;
  request.set_job_id("job");
  request.set_node_id("worker@1");
  request.add_data_files("train-0.tfrecord");
  request.set_error(std::string(1 << 20, 'e'));  // Cut, not refused.
  EXPECT_TRUE(CheckReportProgressRequest(request).ok());

  ReportProgressRequest bad = request;
  bad.set_job_id(std::string(65, 'j'));
  ExpectRefused(CheckReportProgressRequest(bad), "job_id is 65 bytes; the limit is 64 bytes");
  bad = request;
  bad.set_node_id(std::string(513, 'n'));
  ExpectRefused(CheckReportProgressRequest(bad), "node_id is 513 bytes; the limit is 512 bytes");
  bad = request;
  for (int i = 0; i < kMaxDataFiles; ++i) bad.add_data_files("f");
  ExpectRefused(CheckReportProgressRequest(bad),
                "data_files has 100001 entries; the limit is 100000");
  bad = request;
  bad.add_data_files(std::string(4097, 'f'));
  ExpectRefused(CheckReportProgressRequest(bad),
                "data_files[1] is 4097 bytes; the limit is 4096 bytes (4 KiB)");
  bad = request;
  bad.add_data_files("/etc/passwd");
  EXPECT_EQ(CheckReportProgressRequest(bad).message().substr(0, 41),
            "data_files[1] \"/etc/passwd\" is an absolut");
  bad = request;
  for (int i = 0; i < 2100; ++i) bad.add_data_files(std::string(4000, 'f'));
  ExpectRefused(CheckReportProgressRequest(bad),
                "data_files (the names together) is 8400016 bytes; the limit is 8388608 bytes "
                "(8 MiB)");
  bad = request;
  bad.mutable_checkpoint()->set_state(std::string(kMaxWorkerStateBytes + 1, 's'));
  ExpectRefused(CheckReportProgressRequest(bad),
                "checkpoint.state is 8388609 bytes; the limit is 8388608 bytes (8 MiB)");
}

}  // namespace
}  // namespace control
}  // namespace downpour
