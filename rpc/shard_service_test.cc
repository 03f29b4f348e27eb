#include "rpc/shard_service_fixture.h"

namespace downpour {
namespace shard_service_testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
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
}  // namespace shard_service_testing
}  // namespace downpour
