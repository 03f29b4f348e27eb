#include "rpc/ps_service.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "ps/parameter_store.h"
#include "rpc/ps_client.h"

namespace downpour {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kJob[] = "job-1";

// Tensor 0 is bn/gamma: 4 ones, in partitions 0/0 [0, 2) and 0/1 [2, 4).
JobSpec Spec(ConsistencySpec::Mode mode, int num_workers) {
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
  spec.set_num_workers(num_workers);
  spec.set_seed(3);
  spec.mutable_consistency()->set_mode(mode);
  spec.mutable_optimizer()->set_kind(OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(0.5f);
  return spec;
}

std::vector<PartitionPlacement> Placements() {
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

PushRequest MakePush(const std::string& job, int rank, int64_t seq, int64_t step, int32_t part,
                     const std::vector<float>& grad) {
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

std::vector<float> Floats(const std::string& bytes) {
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

TEST_F(PsServiceTest, PushAndPullThroughGrpc) {
  ASSERT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  const PushRequest push = MakePush(kJob, 0, 1, 0, 1, {1.f, -2.f});
  absl::StatusOr<PushResponse> pushed = shard_->Push(push);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_FALSE(pushed->duplicate());
  absl::StatusOr<PushResponse> again = shard_->Push(push);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->duplicate());

  PullRequest pull;
  pull.set_job_id(kJob);
  pull.set_min_version(0);
  absl::StatusOr<PullResponse> pulled = shard_->Pull(pull, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
  ASSERT_EQ(pulled->partitions_size(), 2);
  EXPECT_EQ(pulled->partitions(0).version(), 0);
  EXPECT_EQ(pulled->partitions(1).version(), 1);
  EXPECT_EQ(pulled->partitions(1).num_elements(), 2);
  EXPECT_THAT(Floats(pulled->payload()), ::testing::ElementsAre(1.f, 1.f, 0.5f, 2.f));
}

TEST_F(PsServiceTest, PushPullIsOneCallThatAppliesOnce) {
  ASSERT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  const PushRequest push = MakePush(kJob, 0, 1, 0, 1, {1.f, -2.f});
  Payload grads;
  grads.Append(push.payload().data(), push.payload().size());
  PullRequest pull;
  pull.set_job_id(kJob);
  pull.set_min_version(0);
  RemoteParameterShard::Options unary_options;
  unary_options.use_streams = false;
  std::unique_ptr<RemoteParameterShard> unary =
      RemoteParameterShard::Create(address_, unary_options);
  // The first on a stream, the retries on the same stream and unary.
  const std::vector<RemoteParameterShard*> attempts = {shard_.get(), shard_.get(), unary.get()};
  for (size_t attempt = 0; attempt < attempts.size(); ++attempt) {
    Payload params;
    absl::StatusOr<PushPullResponse> result =
        attempts[attempt]->PushPull(push, grads, pull, absl::Now() + absl::Seconds(10), &params);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->push().duplicate(), attempt > 0);
    ASSERT_EQ(result->pull().partitions_size(), 2);
    EXPECT_EQ(result->pull().partitions(1).version(), 1);
    EXPECT_THAT(Floats(params.ToString()), ::testing::ElementsAre(1.f, 1.f, 0.5f, 2.f));
  }
}

TEST_F(PsServiceTest, ErrorsNameTheShard) {
  absl::StatusOr<PushResponse> pushed = shard_->Push(MakePush("nope", 0, 1, 0, 0, {1.f, 1.f}));
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(pushed.status().message()),
              StartsWith(absl::StrCat("shard ", address_, ": ")));
  EXPECT_THAT(std::string(pushed.status().message()),
              HasSubstr("job nope is not hosted on this shard"));

  ASSERT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  PushRequest bad = MakePush(kJob, 0, 1, 0, 0, {1.f, 1.f});
  bad.mutable_payload()->resize(4);
  EXPECT_EQ(shard_->Push(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PsServiceTest, PullOfAStepThatNeverCompletesTimesOutQuickly) {
  ASSERT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::SYNC, 2), 0, Placements()).ok());
  ASSERT_TRUE(shard_->Push(MakePush(kJob, 0, 1, 0, 0, {1.f, 1.f})).ok());
  PullRequest pull;
  pull.set_job_id(kJob);
  pull.add_keys()->set_partition(0);
  pull.set_min_version(1);
  const absl::Time start = absl::Now();
  absl::StatusOr<PullResponse> pulled = shard_->Pull(pull, start + absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(pulled.status().message()),
              StartsWith(absl::StrCat("shard ", address_, ": ")));
  // The shard answers just before the deadline, with what it waited for.
  EXPECT_THAT(std::string(pulled.status().message()),
              HasSubstr("partition 0/0 still at version 0 < 1"));
}

TEST_F(PsServiceTest, StreamedPushPullWaitsForOtherWorkersAndStaysUsable) {
  ASSERT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::SYNC, 2), 0, Placements()).ok());
  PullRequest pull;
  pull.set_job_id(kJob);
  pull.set_min_worker_steps(1);
  auto exchange = [&](int64_t seq, absl::Duration timeout) {
    const PushRequest push = MakePush(kJob, 0, seq, 0, 0, {1.f, 1.f});
    Payload grads, params;
    grads.Append(push.payload().data(), push.payload().size());
    return shard_->PushPull(push, grads, pull, absl::Now() + timeout, &params);
  };
  // Worker 1 has not pushed: the shard answers on the stream just before
  // the deadline, saying what it waited for.
  const absl::Time start = absl::Now();
  absl::StatusOr<PushPullResponse> waited = exchange(1, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(waited.status().message()), HasSubstr("worker 1 has pushed 0 steps"));
  // The same stream carries the retry, which is answered once worker 1
  // pushes; the push is not applied again.
  std::thread other([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(store_.Push(MakePush(kJob, 1, 1, 0, 0, {1.f, 1.f})).ok());
  });
  absl::StatusOr<PushPullResponse> done = exchange(1, absl::Seconds(10));
  other.join();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->push().duplicate());
  EXPECT_EQ(done->pull().partitions_size(), 2);
}

TEST_F(PsServiceTest, StreamedPushPullToAnUnreachableShardFailsWithinTheDeadline) {
  std::unique_ptr<RemoteParameterShard> dead = RemoteParameterShard::Create("127.0.0.1:1");
  const PushRequest push = MakePush(kJob, 0, 1, 0, 0, {1.f, 1.f});
  Payload grads, params;
  grads.Append(push.payload().data(), push.payload().size());
  const absl::Time start = absl::Now();
  absl::StatusOr<PushPullResponse> result =
      dead->PushPull(push, grads, PullRequest(), start + absl::Milliseconds(300), &params);
  EXPECT_FALSE(result.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_THAT(std::string(result.status().message()), StartsWith("shard 127.0.0.1:1: "));
}

TEST_F(PsServiceTest, StreamedPushPullToAFrozenShardFailsWithinTheDeadline) {
  // A listening socket nobody accepts from: connections open, nothing answers.
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 16), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string frozen_address = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  std::unique_ptr<RemoteParameterShard> frozen = RemoteParameterShard::Create(frozen_address);
  std::vector<float> big(1 << 20, 1.f);  // More than the socket buffers take.
  PushRequest push = MakePush(kJob, 0, 1, 0, 0, {});
  Payload grads, params;
  grads.Append(reinterpret_cast<const char*>(big.data()), big.size() * sizeof(float));
  for (int attempt = 0; attempt < 2; ++attempt) {
    const absl::Time start = absl::Now();
    absl::StatusOr<PushPullResponse> result =
        frozen->PushPull(push, grads, PullRequest(), start + absl::Milliseconds(300), &params);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  }
  frozen.reset();
  close(listener);
}

TEST_F(PsServiceTest, UnreachableShardFailsWithinTheDeadline) {
  RemoteParameterShard::Options options;
  options.push_attempt_timeout = absl::Milliseconds(200);
  std::unique_ptr<RemoteParameterShard> dead = RemoteParameterShard::Create("127.0.0.1:1", options);
  const absl::Time start = absl::Now();
  absl::StatusOr<PushResponse> pushed = dead->Push(MakePush(kJob, 0, 1, 0, 0, {1.f, 1.f}));
  EXPECT_FALSE(pushed.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_THAT(std::string(pushed.status().message()), StartsWith("shard 127.0.0.1:1: "));
}

}  // namespace
}  // namespace downpour
