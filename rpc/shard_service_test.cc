#include "rpc/shard_service.h"

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
#include "rpc/shared_segment.h"

namespace downpour {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kJob[] = "job-1";

// Tensor 0 is bn/gamma: 4 ones, in partitions 0/0 [0, 2) and 0/1 [2, 4).
JobSpec Spec(ConsistencySpec::Mode mode, int num_workers, int inputs = 4) {
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
    EXPECT_GT(result->handled_us(), 0);  // Said by streams and unary calls alike.
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

// A shard that found a non-finite gradient fails every later push and pull
// of the job; the worker learns it is a divergence from the status itself,
// over a unary call and over a stream alike.
TEST_F(PsServiceTest, ADivergedJobsErrorsReachTheWorkerMarked) {
  ASSERT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  ASSERT_TRUE(shard_->Push(MakePush(kJob, 0, 1, 0, 1, {1.f, std::nanf("")})).ok());

  absl::StatusOr<PushResponse> pushed = shard_->Push(MakePush(kJob, 0, 2, 1, 1, {1.f, 1.f}));
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(pushed.status().message()),
              StartsWith(absl::StrCat("shard ", address_, ": training diverged at step 0")));
  EXPECT_TRUE(IsDiverged(pushed.status())) << pushed.status();

  const PushRequest push = MakePush(kJob, 0, 3, 2, 1, {1.f, 1.f});
  Payload grads;
  grads.Append(push.payload().data(), push.payload().size());
  PullRequest pull;
  pull.set_job_id(kJob);
  Payload params;
  absl::StatusOr<PushPullResponse> streamed =
      shard_->PushPull(push, grads, pull, absl::Now() + absl::Seconds(10), &params);
  EXPECT_EQ(streamed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsDiverged(streamed.status())) << streamed.status();

  // Any other refusal is no divergence.
  EXPECT_FALSE(IsDiverged(shard_->Push(MakePush("nope", 0, 1, 0, 0, {1.f, 1.f})).status()));
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
    absl::SleepFor(absl::Milliseconds(500));
    EXPECT_TRUE(store_.Push(MakePush(kJob, 1, 1, 0, 0, {1.f, 1.f})).ok());
  });
  const absl::Time retried = absl::Now();
  absl::StatusOr<PushPullResponse> done = exchange(1, absl::Seconds(10));
  const absl::Duration round_trip = absl::Now() - retried;
  other.join();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(done->push().duplicate());
  EXPECT_EQ(done->pull().partitions_size(), 2);
  // The shard says how long it held the exchange: the wait for worker 1
  // included, no longer than the round trip.
  EXPECT_GE(done->handled_us(), 200'000);
  EXPECT_LE(done->handled_us(), absl::ToInt64Microseconds(round_trip));
}

// A worker's run that was cancelled ends its calls to a shard at once
// (CancelCalls) instead of waiting out their deadlines, over a unary call
// and both kinds of stream; the client then refuses every call.
TEST_F(PsServiceTest, CancelledCallsEndAtOnceAndLaterOnesAreRefused) {
  ASSERT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::SYNC, 2), 0, Placements()).ok());
  // Waits for worker 1, which never pushes: answered only at the deadline.
  PullRequest pull;
  pull.set_job_id(kJob);
  pull.set_min_worker_steps(1);
  int64_t sequence = 0;
  auto exchange = [&](RemoteParameterShard* shard, bool streamed) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    if (!streamed) return shard->Pull(pull, deadline).status();
    const PushRequest push = MakePush(kJob, 0, ++sequence, 0, 0, {1.f, 1.f});
    Payload grads, params;
    grads.Append(push.payload().data(), push.payload().size());
    return shard->PushPull(push, grads, pull, deadline, &params).status();
  };
  for (const auto& [streamed, shared_memory] :
       std::vector<std::pair<bool, bool>>{{false, false}, {true, false}, {true, true}}) {
    SCOPED_TRACE(absl::StrCat("streamed ", streamed, ", shared memory ", shared_memory));
    RemoteParameterShard::Options options;
    options.use_shared_memory = shared_memory;
    options.use_streams = streamed;
    std::unique_ptr<RemoteParameterShard> shard = RemoteParameterShard::Create(address_, options);
    absl::Status waited;
    std::thread call([&] { waited = exchange(shard.get(), streamed); });
    absl::SleepFor(absl::Milliseconds(300));  // The call reaches the shard and waits there.
    shard->CancelCalls();
    call.join();
    // Not DeadlineExceeded (the shard's answer a minute later).
    EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled) << waited;
    EXPECT_THAT(std::string(waited.message()), StartsWith(absl::StrCat("shard ", address_)));
    const absl::Status later = exchange(shard.get(), streamed);
    EXPECT_EQ(later.code(), absl::StatusCode::kCancelled) << later;
  }
  // Worker 1 pushes: the shard's handlers of the cancelled calls stop
  // waiting, and another client of the shard gets its answer.
  ASSERT_TRUE(store_.Push(MakePush(kJob, 1, 1, 0, 0, {1.f, 1.f})).ok());
  absl::StatusOr<PullResponse> pulled = shard_->Pull(pull, absl::Now() + absl::Seconds(10));
  EXPECT_TRUE(pulled.ok()) << pulled.status();
}

// A listening socket on loopback that nobody accepts from: connections
// open (the kernel completes them) and nothing ever answers.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(fd_, 16) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    address_ = absl::StrCat("127.0.0.1:", ntohs(addr.sin_port));
  }
  ~SilentListener() {
    if (fd_ >= 0) close(fd_);
  }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;
  // Empty when the socket could not be set up.
  const std::string& address() const { return address_; }

 private:
  int fd_ = -1;
  std::string address_;
};

// A shard that never answers (a listener that accepts connections and
// says nothing: the call is still connecting): a cancelled call ends at
// once all the same.
TEST_F(PsServiceTest, CancelledCallsToAShardThatNeverAnswersEnd) {
  const SilentListener listener;
  ASSERT_FALSE(listener.address().empty());
  RemoteParameterShard::Options options;
  options.push_attempt_timeout = absl::Seconds(60);
  std::unique_ptr<RemoteParameterShard> shard =
      RemoteParameterShard::Create(listener.address(), options);
  absl::Status pushed;
  std::thread call([&] { pushed = shard->Push(MakePush(kJob, 0, 1, 0, 1, {1.f, 1.f})).status(); });
  absl::SleepFor(absl::Milliseconds(500));
  shard->CancelCalls();
  call.join();
  // Not DeadlineExceeded a minute later.
  EXPECT_EQ(pushed.code(), absl::StatusCode::kCancelled) << pushed;
}

// A SYNC job of two workers with a sparse table "emb/table" (100 rows of 4)
// read by fc (fc/weight: 8 elements, tensor 0; fc/bias: 2, tensor 1), all on
// this one shard.
JobSpec SparseSpec() {
  JobSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        model {
          num_classes: 2
          inputs { name: "c" kind: SPARSE }
          layer {
            name: "emb"
            inputs: "c"
            embedding { sparse: true vocab_size: 100 dim: 4 }
          }
          layer {
            name: "fc"
            dense { units: 2 }
          }
          layer { softmax_cross_entropy {} }
        }
        dataset { train_files: "train-*" test_files: "test-*" batch_size: 2 }
        optimizer { kind: SGD learning_rate: 0.5 }
        consistency { mode: SYNC }
        num_workers: 2
        num_shards: 1
        steps: 10
      )pb",
      &spec));
  return spec;
}

std::vector<PartitionPlacement> SparsePlacements() {
  std::vector<PartitionPlacement> out(2);
  for (int t = 0; t < 2; ++t) {
    out[t].set_tensor_id(t);
    out[t].set_num_elements(t == 0 ? 8 : 2);
  }
  return out;
}

// A worker's step: fc/bias's gradient (float32), then rows 3 and 7 of the
// table with bfloat16 gradients (one row per four values of `rows`).
PushRequest SparsePush(int rank, const std::vector<float>& bias, const std::vector<float>& rows,
                       Payload* payload, std::string* storage) {
  PushRequest request = MakePush(kJob, rank, 1, 0, 0, bias);
  request.mutable_partitions(0)->mutable_key()->set_tensor_id(1);
  SparseRows* sparse = request.add_sparse();
  sparse->set_dtype(BFLOAT16);
  sparse->add_ids(3);
  sparse->add_ids(7);
  *storage = request.payload();
  storage->resize(storage->size() + rows.size() * 2);
  EncodeFloats(WireDtype::kBfloat16, rows.data(), static_cast<int64_t>(rows.size()),
               storage->data() + bias.size() * sizeof(float));
  request.clear_payload();
  *payload = Payload();
  payload->Append(storage->data(), storage->size());
  return request;
}

TEST_F(PsServiceTest, SparseRowsTravelBesideThePartitions) {
  ASSERT_TRUE(store_.AddJob(kJob, SparseSpec(), 0, SparsePlacements()).ok());
  PullRequest rows_only;
  rows_only.set_job_id(kJob);
  SparseRows* asked = rows_only.add_sparse();
  asked->add_ids(3);
  asked->add_ids(7);
  absl::StatusOr<PullResponse> before = shard_->Pull(rows_only, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->partitions_size(), 0);
  ASSERT_EQ(before->sparse_size(), 1);
  const std::vector<float> initial = Floats(before->payload());
  ASSERT_EQ(initial.size(), 8u);

  // Both values exact in bfloat16; the mean of the two workers' rows is
  // {1, 0, 0, 0.5} for row 3 and {-1, 1, 0.25, 0} for row 7.
  const std::vector<float> rows0 = {0.5f, -1.f, 2.f, 0.25f, -1.5f, 2.f, 0.5f, 1.f};
  const std::vector<float> rows1 = {1.5f, 1.f, -2.f, 0.75f, -0.5f, 0.f, 0.f, -1.f};
  // Rank 1 pushes and pulls the next step in one streamed exchange, which
  // waits for rank 0's unary push.
  PullRequest step1 = rows_only;
  step1.add_keys()->set_tensor_id(1);
  step1.set_min_version(1);
  absl::StatusOr<PushPullResponse> exchanged;
  Payload pulled;
  std::thread rank1([&] {
    Payload payload;
    std::string storage;
    const PushRequest push = SparsePush(1, {3.f, 1.f}, rows1, &payload, &storage);
    exchanged = shard_->PushPull(push, payload, step1, absl::Now() + absl::Seconds(10), &pulled);
  });
  Payload payload;
  std::string storage;
  const PushRequest push = SparsePush(0, {1.f, 1.f}, rows0, &payload, &storage);
  absl::SleepFor(absl::Milliseconds(50));
  absl::StatusOr<PushResponse> pushed = shard_->Push(push, payload);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  rank1.join();
  ASSERT_TRUE(exchanged.ok()) << exchanged.status();
  const PullResponse& response = exchanged->pull();
  ASSERT_EQ(response.partitions_size(), 1);
  ASSERT_EQ(response.sparse_size(), 1);
  EXPECT_EQ(response.sparse(0).dtype(), FLOAT32);
  EXPECT_THAT(response.sparse(0).ids(), ::testing::ElementsAre(3, 7));
  // fc/bias: 0 - 0.5 * mean({1, 1}, {3, 1}); then the rows.
  const std::vector<float> mean = {1.f, 0.f, 0.f, 0.5f, -1.f, 1.f, 0.25f, 0.f};
  std::vector<float> expected = {-1.f, -0.5f};
  for (size_t k = 0; k < 8; ++k) expected.push_back(initial[k] - 0.5f * mean[k]);
  EXPECT_EQ(Floats(pulled.ToString()), expected);

  // A payload longer than its partitions and rows is refused, naming both.
  payload.Append("\0\0", 2);
  absl::StatusOr<PushResponse> bad = shard_->Push(push, payload);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("payload has 26 bytes, the "
                                                             "headers describe 24"));
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
  const SilentListener listener;
  ASSERT_FALSE(listener.address().empty());
  const std::string& frozen_address = listener.address();
  std::vector<float> big(1 << 20, 1.f);  // More than the socket buffers take.
  PushRequest push = MakePush(kJob, 0, 1, 0, 0, {});
  Payload grads, params;
  grads.Append(reinterpret_cast<const char*>(big.data()), big.size() * sizeof(float));
  // Stuck attaching a segment, or sending the bytes themselves.
  for (const bool shared_memory : {true, false}) {
    RemoteParameterShard::Options options;
    options.use_shared_memory = shared_memory;
    std::unique_ptr<RemoteParameterShard> frozen =
        RemoteParameterShard::Create(frozen_address, options);
    for (int attempt = 0; attempt < 2; ++attempt) {
      const absl::Time start = absl::Now();
      absl::StatusOr<PushPullResponse> result =
          frozen->PushPull(push, grads, PullRequest(), start + absl::Milliseconds(300), &params);
      EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
      EXPECT_LT(absl::Now() - start, absl::Seconds(3));
    }
  }
}

// A worker frozen as its exchange's deadline passes (SIGSTOP, a paused VM)
// wakes to find the shard's answer arrived: the exchange fails as a timeout
// (or, frozen before it looked, succeeds), and the answer landing in the
// stream as it is closed writes nowhere it should not. (It used to land in
// the returned exchange's stack frame: a worker crashed so on SIGCONT.)
TEST_F(PsServiceTest, AnExchangeFrozenAtItsDeadlineEndsCleanlyWhenItsAnswerComes) {
  ASSERT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  PullRequest pull;
  pull.set_job_id(kJob);
  int64_t sequence = 0;
  auto exchange = [&](RemoteParameterShard* shard, absl::Time deadline) {
    const PushRequest push = MakePush(kJob, 0, ++sequence, 0, 0, {1.f, 1.f});
    Payload grads, params;
    grads.Append(push.payload().data(), push.payload().size());
    absl::StatusOr<PushPullResponse> result = shard->PushPull(push, grads, pull, deadline, &params);
    if (result.ok()) EXPECT_EQ(params.size(), 4 * sizeof(float));
    return result.status();
  };
  for (const bool shared_memory : {false, true}) {
    RemoteParameterShard::Options options;
    options.use_shared_memory = shared_memory;
    options.testing_stall_at_deadline = absl::Milliseconds(50);
    std::unique_ptr<RemoteParameterShard> frozen = RemoteParameterShard::Create(address_, options);
    // Due at once on a new stream (a timed-out one is closed): its first
    // message (the segment's attach, or the exchange) is answered while the
    // exchange is frozen, or (answered first) the exchange succeeds.
    int timed_out = 0;
    for (int attempt = 0; attempt < 500 && timed_out < 5; ++attempt) {
      const absl::Status status = exchange(frozen.get(), absl::Now());
      if (!status.ok()) {
        ++timed_out;
        EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
      }
    }
    EXPECT_EQ(timed_out, 5) << "shared memory " << shared_memory
                            << ": too few frozen exchanges timed out to exercise the case";
  }
  // The shard still serves.
  absl::StatusOr<PullResponse> pulled = shard_->Pull(pull, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(pulled.ok()) << pulled.status();
}

// ------------------------------------------------------------ shared memory

// A worker's steps on job `job` (ASYNC, one worker): pushes of `grad` to
// both partitions, each answered with the parameters, as bytes.
std::vector<std::string> Steps(RemoteParameterShard* shard, const std::string& job, int steps) {
  std::vector<std::string> pulled;
  PullRequest pull;
  pull.set_job_id(job);
  for (int step = 0; step < steps; ++step) {
    const std::vector<float> grad = {0.25f * step, -1.f, 2.f, 0.5f + step};
    PushRequest push = MakePush(job, 0, step + 1, step, 0, grad);
    PartitionHeader* second = push.add_partitions();
    *second = push.partitions(0);
    second->mutable_key()->set_partition(1);
    push.mutable_partitions(0)->set_num_elements(2);
    second->set_num_elements(2);
    Payload grads, params;
    grads.Append(push.payload().data(), push.payload().size());
    absl::StatusOr<PushPullResponse> result =
        shard->PushPull(push, grads, pull, absl::Now() + absl::Seconds(10), &params);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) break;
    EXPECT_EQ(result->pull().partitions_size(), 2);
    pulled.push_back(params.ToString());
  }
  return pulled;
}

TEST_F(PsServiceTest, StreamedPushPullMovesItsBytesThroughSharedMemory) {
  ASSERT_TRUE(store_.AddJob("shm", Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  ASSERT_TRUE(store_.AddJob("wire", Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  std::vector<std::string> said;
  RemoteParameterShard::Options shm_options;
  shm_options.log = [&said](const std::string& line) { said.push_back(line); };
  RemoteParameterShard::Options wire_options;
  wire_options.use_shared_memory = false;
  auto shm = RemoteParameterShard::Create(address_, shm_options);
  auto wire = RemoteParameterShard::Create(address_, wire_options);

  const std::vector<std::string> through_memory = Steps(shm.get(), "shm", 5);
  EXPECT_EQ(through_memory, Steps(wire.get(), "wire", 5));
  ASSERT_EQ(through_memory.size(), 5u);
  EXPECT_NE(through_memory[0], through_memory[4]);
  // One stream, one segment; every tensor byte of the five exchanges went
  // through it.
  const RemoteParameterShard::SharedMemoryStats stats = shm->shared_memory_stats();
  EXPECT_EQ(stats.segments, 1);
  EXPECT_EQ(stats.push_bytes, 5 * 16);
  EXPECT_EQ(stats.pull_bytes, 5 * 16);
  // ... and every exchange was signalled through it, not sent.
  EXPECT_EQ(stats.signalled, 5);
  EXPECT_EQ(wire->shared_memory_stats().segments, 0);
  EXPECT_EQ(wire->shared_memory_stats().push_bytes, 0);
  EXPECT_EQ(service_.shared_segments().segments(), 1);
  EXPECT_THAT(said, ::testing::ElementsAre(AllOf(HasSubstr("tensors go through shared memory"),
                                                 HasSubstr("signalled through it"))));
  // The stream's end unmaps the segment.
  shm.reset();
  EXPECT_TRUE(service_.shared_segments().AwaitSegments(0, absl::Seconds(10)));
}

TEST_F(PsServiceTest, ASegmentTooSmallForAPushIsReplacedByALargerOne) {
  // bn/gamma of 2050 elements: partition 0 [0, 2), partition 1 [2, 2050).
  std::vector<PartitionPlacement> placements = Placements();
  placements[1].set_num_elements(2048);
  for (const char* job : {"shm", "wire"}) {
    ASSERT_TRUE(store_.AddJob(job, Spec(ConsistencySpec::ASYNC, 1, 2050), 0, placements).ok());
  }
  RemoteParameterShard::Options wire_options;
  wire_options.use_shared_memory = false;
  auto wire = RemoteParameterShard::Create(address_, wire_options);
  const std::vector<float> small = {1.f, 2.f};
  const std::vector<float> large(2048, 0.5f);
  std::string pulled[2];
  for (RemoteParameterShard* shard : {shard_.get(), wire.get()}) {
    const std::string job = shard == wire.get() ? "wire" : "shm";
    PullRequest pull;
    pull.set_job_id(job);
    // A small push first (the segment is sized for it), then large ones.
    int64_t seq = 0;
    for (const std::vector<float>* grad : {&small, &large, &large}) {
      const PushRequest push = MakePush(job, 0, ++seq, 0, grad == &small ? 0 : 1, *grad);
      Payload grads, params;
      grads.Append(push.payload().data(), push.payload().size());
      absl::StatusOr<PushPullResponse> result =
          shard->PushPull(push, grads, pull, absl::Now() + absl::Seconds(10), &params);
      ASSERT_TRUE(result.ok()) << result.status();
      pulled[shard == wire.get()] = params.ToString();
    }
  }
  EXPECT_EQ(pulled[0], pulled[1]);
  EXPECT_EQ(pulled[0].size(), 2050 * sizeof(float));
  // The second push did not fit the first segment and went in its message;
  // the third went through a new, larger one. Every pull fit.
  const RemoteParameterShard::SharedMemoryStats stats = shard_->shared_memory_stats();
  EXPECT_EQ(stats.segments, 2);
  EXPECT_EQ(stats.push_bytes, (2 + 2048) * sizeof(float));
  EXPECT_EQ(stats.pull_bytes, 3 * 2050 * sizeof(float));
  EXPECT_TRUE(service_.shared_segments().AwaitSegments(1, absl::Seconds(10)));
}

TEST_F(PsServiceTest, APulledPayloadStillHeldKeepsItsBytes) {
  ASSERT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  PullRequest pull;
  pull.set_job_id(kJob);
  auto exchange = [&](int64_t seq, Payload* params) {
    const PushRequest push = MakePush(kJob, 0, seq, 0, 1, {1.f, 1.f});
    Payload grads;
    grads.Append(push.payload().data(), push.payload().size());
    return shard_->PushPull(push, grads, pull, absl::Now() + absl::Seconds(10), params);
  };
  Payload first, second;
  ASSERT_TRUE(exchange(1, &first).ok());
  const std::string held = first.ToString();
  // The pull area is `first`'s: the next answer comes over the connection.
  ASSERT_TRUE(exchange(2, &second).ok());
  EXPECT_EQ(first.ToString(), held);
  EXPECT_NE(second.ToString(), held);
  EXPECT_EQ(shard_->shared_memory_stats().pull_bytes, 16);
  first = Payload();
  second = Payload();
  ASSERT_TRUE(exchange(3, &second).ok());
  EXPECT_EQ(shard_->shared_memory_stats().pull_bytes, 32);
  EXPECT_EQ(shard_->shared_memory_stats().push_bytes, 3 * 8);
}

// A second shard server in this process, with its own options.
struct OtherShard {
  explicit OtherShard(ParameterServerService::Options options) : service(&store, options) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    AcceptClientKeepalive(&builder);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
  }
  ~OtherShard() { server->Shutdown(std::chrono::system_clock::now()); }

  ParameterStore store;
  ParameterServerService service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

TEST_F(PsServiceTest, AShardWithSharedMemoryOffIsAskedOnceAndServesOverTheConnection) {
  ParameterServerService::Options options;
  options.shared_memory = false;
  OtherShard off(options);
  ASSERT_NE(off.server, nullptr);
  ASSERT_TRUE(off.store.AddJob("off", Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  ASSERT_TRUE(store_.AddJob("on", Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  std::vector<std::string> said;
  RemoteParameterShard::Options client_options;
  client_options.log = [&said](const std::string& line) { said.push_back(line); };
  auto shard = RemoteParameterShard::Create(off.address, client_options);
  EXPECT_EQ(Steps(shard.get(), "off", 3), Steps(shard_.get(), "on", 3));
  EXPECT_EQ(shard->shared_memory_stats().segments, 0);
  EXPECT_EQ(shard->shared_memory_stats().push_bytes, 0);
  EXPECT_EQ(off.service.shared_segments().segments(), 0);
  EXPECT_THAT(said, ::testing::ElementsAre(AllOf(HasSubstr("shared memory not used"),
                                                 HasSubstr("shared memory is off"))));
}

TEST_F(PsServiceTest, AShardWithoutTheDoorbellGetsTheHeadersOverTheConnection) {
  ParameterServerService::Options options;
  options.doorbell = false;  // As a shard from before it.
  OtherShard older(options);
  ASSERT_NE(older.server, nullptr);
  ASSERT_TRUE(older.store.AddJob("older", Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  ASSERT_TRUE(store_.AddJob("newer", Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  std::vector<std::string> said;
  RemoteParameterShard::Options client_options;
  client_options.log = [&said](const std::string& line) { said.push_back(line); };
  auto shard = RemoteParameterShard::Create(older.address, client_options);
  EXPECT_EQ(Steps(shard.get(), "older", 3), Steps(shard_.get(), "newer", 3));
  const RemoteParameterShard::SharedMemoryStats stats = shard->shared_memory_stats();
  EXPECT_EQ(stats.segments, 1);
  EXPECT_EQ(stats.push_bytes, 3 * 16);
  EXPECT_EQ(stats.signalled, 0);
  EXPECT_EQ(shard_->shared_memory_stats().signalled, 3);
  EXPECT_THAT(said, ::testing::ElementsAre(AllOf(HasSubstr("tensors go through shared memory"),
                                                 ::testing::Not(HasSubstr("signalled")))));
}

// A pull answered through the doorbell that outgrew the segment's pull area
// comes again over the connection (its push applied once), and the next
// exchange gets a segment of its size.
TEST_F(PsServiceTest, ASignalledPullTooLargeForItsAreaIsPulledAgain) {
  // bn/gamma of 20,002 elements: partition 0 [0, 2), partition 1 [2, 20002):
  // 80 KB pulled, past a new segment's 64 KiB pull area for an 8-byte push.
  std::vector<PartitionPlacement> placements = Placements();
  placements[1].set_num_elements(20000);
  for (const char* job : {"shm", "wire"}) {
    ASSERT_TRUE(store_.AddJob(job, Spec(ConsistencySpec::ASYNC, 1, 20002), 0, placements).ok());
  }
  RemoteParameterShard::Options wire_options;
  wire_options.use_shared_memory = false;
  auto wire = RemoteParameterShard::Create(address_, wire_options);
  std::vector<std::string> pulled[2];
  for (RemoteParameterShard* shard : {shard_.get(), wire.get()}) {
    const std::string job = shard == wire.get() ? "wire" : "shm";
    PullRequest pull;
    pull.set_job_id(job);
    for (int64_t seq = 1; seq <= 3; ++seq) {
      const PushRequest push = MakePush(job, 0, seq, 0, 0, {1.f, 2.f});
      Payload grads, params;
      grads.Append(push.payload().data(), push.payload().size());
      absl::StatusOr<PushPullResponse> result =
          shard->PushPull(push, grads, pull, absl::Now() + absl::Seconds(10), &params);
      ASSERT_TRUE(result.ok()) << result.status();
      EXPECT_FALSE(result->push().duplicate());
      EXPECT_EQ(result->pull().partitions_size(), 2);
      pulled[shard == wire.get()].push_back(params.ToString());
    }
  }
  EXPECT_EQ(pulled[0], pulled[1]);
  ASSERT_EQ(pulled[0].size(), 3u);
  EXPECT_EQ(pulled[0][0].size(), 20002 * sizeof(float));
  EXPECT_NE(pulled[0][0], pulled[0][2]);
  // The first pull came over the connection; the later two through a new,
  // larger segment.
  const RemoteParameterShard::SharedMemoryStats stats = shard_->shared_memory_stats();
  EXPECT_EQ(stats.segments, 2);
  EXPECT_EQ(stats.pull_bytes, 2 * 20002 * sizeof(float));
  EXPECT_EQ(stats.signalled, 3);
}

// A shard that goes away while a signalled exchange waits (SYNC, for a
// worker that never pushes) ends the exchange then, not at its deadline.
TEST_F(PsServiceTest, ASignalledExchangeEndsWhenItsShardGoesAway) {
  ParameterServerService::Options options;
  // Its thread for the stream waits out the pull (as the stream's waiter
  // would) before the server is gone.
  options.max_pull_wait = absl::Seconds(3);
  auto going = std::make_unique<OtherShard>(options);
  ASSERT_NE(going->server, nullptr);
  ASSERT_TRUE(going->store.AddJob(kJob, Spec(ConsistencySpec::SYNC, 2), 0, Placements()).ok());
  auto shard = RemoteParameterShard::Create(going->address);
  PullRequest pull;
  pull.set_job_id(kJob);
  pull.set_min_version(1);
  const PushRequest push = MakePush(kJob, 0, 1, 0, 0, {1.f, 1.f});
  Payload grads, params;
  grads.Append(push.payload().data(), push.payload().size());
  std::thread stop([&] {
    absl::SleepFor(absl::Milliseconds(300));
    going->server->Shutdown(std::chrono::system_clock::now());
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<PushPullResponse> result =
      shard->PushPull(push, grads, pull, start + absl::Seconds(30), &params);
  const absl::Duration took = absl::Now() - start;
  stop.join();
  // The stream's end, not the shard's answer at its pull's end (a
  // DeadlineExceeded naming worker 1, 3 s on).
  EXPECT_FALSE(result.ok());
  EXPECT_NE(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
  EXPECT_LT(took, absl::Seconds(2)) << result.status();
  EXPECT_EQ(shard->shared_memory_stats().segments, 1);
  going.reset();
}

TEST_F(PsServiceTest, StreamsPastTheShardsBoundPerWorkerGoOverTheConnection) {
  ParameterServerService::Options options;
  options.max_segments_per_worker = 1;
  OtherShard bounded(options);
  ASSERT_NE(bounded.server, nullptr);
  for (const char* job : {"first", "second"}) {
    ASSERT_TRUE(bounded.store.AddJob(job, Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  }
  ASSERT_TRUE(store_.AddJob("alone", Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  // Two clients in one process: one worker process to the shard.
  std::vector<std::string> said;
  RemoteParameterShard::Options client_options;
  client_options.log = [&said](const std::string& line) { said.push_back(line); };
  auto first = RemoteParameterShard::Create(bounded.address);
  auto second = RemoteParameterShard::Create(bounded.address, client_options);
  const std::vector<std::string> expected = Steps(shard_.get(), "alone", 3);
  EXPECT_EQ(Steps(first.get(), "first", 3), expected);
  EXPECT_EQ(Steps(second.get(), "second", 3), expected);
  EXPECT_EQ(first->shared_memory_stats().segments, 1);
  EXPECT_EQ(second->shared_memory_stats().segments, 0);
  EXPECT_EQ(bounded.service.shared_segments().segments(), 1);
  EXPECT_THAT(said, ::testing::ElementsAre(HasSubstr("has 1 shared memory segments")));
  // Once the first one's stream is gone, a new stream of the second maps one.
  first.reset();
  ASSERT_TRUE(bounded.service.shared_segments().AwaitSegments(0, absl::Seconds(10)));
  auto third = RemoteParameterShard::Create(bounded.address);
  Steps(third.get(), "second", 1);
  EXPECT_EQ(third->shared_memory_stats().segments, 1);
}

// /PushPullSharedMemoryStream driven by hand, as a worker that breaks its
// rules would.
class RawSharedMemoryStream {
 public:
  explicit RawSharedMemoryStream(const std::string& address)
      : channel_(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())),
        method_(kPushPullSharedMemoryStreamMethod, grpc::internal::RpcMethod::BIDI_STREAMING,
                channel_) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    stream_.reset(grpc::internal::ClientReaderWriterFactory<TensorMessage, TensorMessage>::Create(
        channel_.get(), method_, &context_));
  }
  ~RawSharedMemoryStream() {
    if (finished_) return;
    context_.TryCancel();
    stream_->Finish();
  }

  // The shard's answer, or the status the stream ended with.
  absl::StatusOr<PushPullStreamResponse> Send(const PushPullStreamRequest& header,
                                              Payload payload = Payload()) {
    TensorMessage request, reply;
    request.header = header.SerializeAsString();
    request.payload = std::move(payload);
    if (stream_->Write(request) && stream_->Read(&reply)) {
      PushPullStreamResponse answer;
      if (!answer.ParseFromString(reply.header)) return absl::InternalError("malformed answer");
      return answer;
    }
    finished_ = true;
    return FromGrpcStatus(stream_->Finish());
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  grpc::internal::RpcMethod method_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<TensorMessage, TensorMessage>> stream_;
  bool finished_ = false;
};

PushPullStreamRequest AttachOf(const SharedSegmentAttach& attach) {
  PushPullStreamRequest request;
  *request.mutable_attach() = attach;
  return request;
}

TEST_F(PsServiceTest, TheShardRefusesAnUnsealedSegmentOrAWrongToken) {
  const int64_t size = SharedSegment::kHeaderBytes + 4096;
  const int fd = memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, size), 0);
  SharedSegmentAttach unsealed;
  unsealed.set_pid(getpid());
  unsealed.set_fd(fd);
  unsealed.set_token(std::string(SharedSegment::kTokenBytes, '\0'));
  unsealed.set_size(size);
  absl::StatusOr<PushPullStreamResponse> answer =
      RawSharedMemoryStream(address_).Send(AttachOf(unsealed));
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(answer.status().message()),
              AllOf(HasSubstr("shared memory segment refused"), HasSubstr("not sealed")));
  close(fd);

  absl::StatusOr<std::shared_ptr<SharedSegment>> segment = SharedSegment::Create(size);
  ASSERT_TRUE(segment.ok()) << segment.status();
  SharedSegmentAttach forged = (*segment)->attach();
  forged.mutable_token()->front() ^= 0x5a;
  answer = RawSharedMemoryStream(address_).Send(AttachOf(forged));
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(answer.status().message()), HasSubstr("attach.token"));

  // A first message that is an exchange.
  PushPullStreamRequest exchange;
  exchange.mutable_exchange()->mutable_pull()->set_job_id(kJob);
  answer = RawSharedMemoryStream(address_).Send(exchange);
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(service_.shared_segments().segments(), 0);
}

TEST_F(PsServiceTest, OffsetsOutsideTheSegmentAreRefusedNamingTheField) {
  ASSERT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  const int64_t size = SharedSegment::kHeaderBytes + 4096;
  absl::StatusOr<std::shared_ptr<SharedSegment>> segment = SharedSegment::Create(size);
  ASSERT_TRUE(segment.ok()) << segment.status();
  RawSharedMemoryStream stream(address_);
  absl::StatusOr<PushPullStreamResponse> attached = stream.Send(AttachOf((*segment)->attach()));
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ(attached->code(), 0);
  EXPECT_TRUE(service_.shared_segments().AwaitSegments(1, absl::Seconds(10)));

  const std::vector<float> grad = {3.f, 4.f};
  PushPullStreamRequest request;
  *request.mutable_exchange()->mutable_push() = MakePush(kJob, 0, 1, 0, 1, grad);
  request.mutable_exchange()->mutable_push()->clear_payload();
  request.mutable_exchange()->mutable_pull()->set_job_id(kJob);
  SharedSegmentExchange* place = request.mutable_segment();
  place->set_push_in_segment(true);
  place->set_push_offset(size - 4);
  place->set_push_bytes(8);
  absl::StatusOr<PushPullStreamResponse> answer = stream.Send(request);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(answer->message(), HasSubstr("segment.push_offset 8188 and segment.push_bytes 8"));

  place->set_push_offset(SharedSegment::kHeaderBytes);
  place->set_pull_offset(SharedSegment::kHeaderBytes + 8);
  place->set_pull_capacity(size);
  answer = stream.Send(request);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(answer->message(), HasSubstr("segment.pull_offset 4104 and segment.pull_capacity"));

  // Bytes both in the segment and in the message.
  place->set_pull_capacity(64);
  Payload extra;
  extra.Append("12345678", 8);
  answer = stream.Send(request, extra);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_THAT(answer->message(), HasSubstr("segment.push_in_segment"));

  // Nothing was applied; the stream is still usable.
  std::memcpy((*segment)->data() + SharedSegment::kHeaderBytes, grad.data(), 8);
  answer = stream.Send(request);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->code(), 0) << answer->message();
  EXPECT_FALSE(answer->exchange().push().duplicate());
  ASSERT_TRUE(answer->segment().pull_in_segment());
  ASSERT_EQ(answer->segment().pull_bytes(), 16);
  std::vector<float> params(4);
  std::memcpy(params.data(), (*segment)->data() + SharedSegment::kHeaderBytes + 8, 16);
  EXPECT_THAT(params, ::testing::ElementsAre(1.f, 1.f, -0.5f, -1.f));
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
