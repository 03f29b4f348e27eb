// The shard service's tests' common parts: a job's spec and placement of
// one small tensor, pushes of it, and a fixture serving a store on loopback.
#ifndef DOWNPOUR_RPC_SHARD_SERVICE_FIXTURE_H_
#define DOWNPOUR_RPC_SHARD_SERVICE_FIXTURE_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/wire_dtype.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "ps/parameter_store.h"
#include "rpc/grpc_status.h"
#include "rpc/keepalive.h"
#include "rpc/remote_parameter_shard.h"
#include "rpc/shard_service.h"
#include "rpc/shared_segment.h"

namespace downpour {
namespace shard_service_testing {

inline constexpr char kJob[] = "job-1";

// Tensor 0 is bn/gamma: 4 ones, in partitions 0/0 [0, 2) and 0/1 [2, 4).
inline JobSpec Spec(ConsistencySpec::Mode mode, int num_workers, int inputs = 4) {
  JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        model {
          input_shape: 4
          num_classes: 4
          layer {
            name: "bn"
            batch_norm {}
          }
          layer { softmax_cross_entropy {} }
        }
        dataset { train_files: "train-*" test_files: "test-*" batch_size: 2 }
        num_shards: 1
        steps: 10
      )pb",
      &spec));
  spec.mutable_model()->set_input_shape(0, inputs);
  spec.mutable_model()->set_num_classes(inputs);
  spec.set_num_workers(num_workers);
  spec.set_seed(3);
  spec.mutable_consistency()->set_mode(mode);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(0.5f);
  return spec;
}

inline std::vector<PartitionPlacement> Placements() {
  std::vector<PartitionPlacement> out(2);
  for (int i = 0; i < 2; ++i) {
    out[i].set_tensor_id(0);
    out[i].set_partition(i);
    out[i].set_offset(2 * i);
    out[i].set_num_elements(2);
    out[i].set_shard(0);
  }
  return out;
}

inline PushRequest MakePush(const std::string& job, int rank, int64_t seq, int64_t step,
                            int32_t part, const std::vector<float>& grad) {
  PushRequest request;
  request.set_job_id(job);
  request.set_worker_rank(rank);
  request.mutable_request_id()->set_worker_id(absl::StrCat("worker-", rank));
  request.mutable_request_id()->set_incarnation(1);
  request.mutable_request_id()->set_sequence(seq);
  request.set_step(step);
  PartitionHeader* header = request.add_partitions();
  header->mutable_key()->set_tensor_id(0);
  header->mutable_key()->set_partition(part);
  header->set_dtype(FLOAT32);
  header->set_num_elements(grad.size());
  request.set_payload(
      std::string(reinterpret_cast<const char*>(grad.data()), grad.size() * sizeof(float)));
  return request;
}

inline std::vector<float> Floats(const std::string& bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

class PsServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    AcceptClientKeepalive(&builder);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);
    shard_ = RemoteParameterShard::Create(address_);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  ParameterStore store_;
  ParameterServerService service_{&store_};
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<RemoteParameterShard> shard_;
};

}  // namespace shard_service_testing
}  // namespace downpour

#endif  // DOWNPOUR_RPC_SHARD_SERVICE_FIXTURE_H_
