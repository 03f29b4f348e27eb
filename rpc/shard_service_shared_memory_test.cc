// The shard service's shared-memory streams: segments, their doorbells, their bounds.
#include "common/metrics.h"
#include "rpc/segment_doorbell.h"
#include "rpc/shard_service_fixture.h"

namespace downpour {
namespace shard_service_testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
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

// Client options whose log lines go to `said`.
RemoteParameterShard::Options Saying(std::vector<std::string>* said) {
  RemoteParameterShard::Options options;
  options.log = [said](const std::string& line) { said->push_back(line); };
  return options;
}

TEST_F(PsServiceTest, StreamedPushPullMovesItsBytesThroughSharedMemory) {
  ASSERT_TRUE(store_.AddJob("shm", Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  ASSERT_TRUE(store_.AddJob("wire", Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
  std::vector<std::string> said;
  const RemoteParameterShard::Options shm_options = Saying(&said);
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
  // The stream's end unmaps the segment; the client's end says how its
  // exchanges went.
  shm.reset();
  EXPECT_TRUE(service_.shared_segments().AwaitSegments(0, absl::Seconds(10)));
  ASSERT_EQ(said.size(), 2u);
  EXPECT_THAT(said[1], AllOf(HasSubstr(": 5 exchanges on streams, 5 signalled through shared "
                                       "memory; over the connection 0 on streams without"),
                             HasSubstr("1 segments mapped")));
}

// Jobs "shm" and "wire" (ASYNC, one worker) of bn/gamma with partition 1
// of `second` elements after partition 0's 2, on the fixture's shard; a
// client of it that sends everything over the connection.
std::unique_ptr<RemoteParameterShard> ShmAndWireJobs(ParameterStore* store,
                                                     const std::string& address, int second) {
  std::vector<PartitionPlacement> placements = Placements();
  placements[1].set_num_elements(second);
  for (const char* job : {"shm", "wire"}) {
    EXPECT_TRUE(
        store->AddJob(job, Spec(ConsistencySpec::ASYNC, 1, 2 + second), 0, placements).ok());
  }
  RemoteParameterShard::Options wire_options;
  wire_options.use_shared_memory = false;
  return RemoteParameterShard::Create(address, wire_options);
}

TEST_F(PsServiceTest, ASegmentTooSmallForAPushIsReplacedByALargerOne) {
  // bn/gamma of 2050 elements: partition 0 [0, 2), partition 1 [2, 2050).
  std::unique_ptr<RemoteParameterShard> wire = ShmAndWireJobs(&store_, address_, 2048);
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
  const RemoteParameterShard::Options client_options = Saying(&said);
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
  const RemoteParameterShard::Options client_options = Saying(&said);
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

// The shard observes each exchange answered through a doorbell (they pass
// no gRPC handler); one without the doorbell observes none.
TEST_F(PsServiceTest, TheShardTimesTheExchangesItAnswersThroughTheDoorbell) {
  for (const bool doorbell : {true, false}) {
    Histogram seconds(SecondsBuckets());
    ParameterServerService::Options options;
    options.doorbell = doorbell;
    options.signalled_seconds = &seconds;
    OtherShard other(options);
    ASSERT_NE(other.server, nullptr);
    ASSERT_TRUE(other.store.AddJob("j", Spec(ConsistencySpec::ASYNC, 1), 0, Placements()).ok());
    auto shard = RemoteParameterShard::Create(other.address);
    EXPECT_EQ(Steps(shard.get(), "j", 4).size(), 4u);
    EXPECT_EQ(shard->shared_memory_stats().signalled, doorbell ? 4 : 0);
    const Histogram::Snapshot observed = seconds.Read();
    EXPECT_EQ(observed.count, doorbell ? 4u : 0u) << doorbell;
    EXPECT_GE(observed.sum, 0.0);
    EXPECT_LT(observed.sum, 60.0);
  }
}

// A pull answered through the doorbell that outgrew the segment's pull area
// comes again over the connection (its push applied once), and the next
// exchange gets a segment of its size.
TEST_F(PsServiceTest, ASignalledPullTooLargeForItsAreaIsPulledAgain) {
  // bn/gamma of 20,002 elements: partition 0 [0, 2), partition 1 [2, 20002):
  // 80 KB pulled, past a new segment's 64 KiB pull area for an 8-byte push.
  std::unique_ptr<RemoteParameterShard> wire = ShmAndWireJobs(&store_, address_, 20000);
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

// A worker whose run is cancelled while its signalled exchange's pull
// waits (SYNC, for a worker that never pushes) ends it at once; the shard's
// thread for the stream gives the wait up soon after, not at its deadline,
// and the stream's segment is unmapped.
TEST_F(PsServiceTest, ASignalledPullIsGivenUpSoonOnceItsStreamEnds) {
  ASSERT_TRUE(store_.AddJob(kJob, Spec(ConsistencySpec::SYNC, 2), 0, Placements()).ok());
  PullRequest pull;
  pull.set_job_id(kJob);
  pull.set_min_version(1);
  const PushRequest push = MakePush(kJob, 0, 1, 0, 0, {1.f, 1.f});
  Payload grads, params;
  grads.Append(push.payload().data(), push.payload().size());
  std::thread cancel([&] {
    absl::SleepFor(absl::Milliseconds(300));
    shard_->CancelCalls();
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<PushPullResponse> result =
      shard_->PushPull(push, grads, pull, start + absl::Seconds(30), &params);
  cancel.join();
  EXPECT_FALSE(result.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << result.status();
  EXPECT_EQ(shard_->shared_memory_stats().segments, 1);
  // Not the pull's 30 s.
  EXPECT_TRUE(service_.shared_segments().AwaitSegments(0, absl::Seconds(5)));
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
  const RemoteParameterShard::Options client_options = Saying(&said);
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

// A doorbell the attach places off the segment or misaligned ends the
// stream naming the field; one of another layout is not taken; one of this
// layout placed well is taken, and a header
// signalled there that is not an exchange with its push in the segment is
// answered as refused.
TEST_F(PsServiceTest,
       ADoorbellOutsideTheSegmentIsRefusedNamingTheFieldAndOneOfAnotherLayoutNotTaken) {
  const int64_t size = SharedSegment::kHeaderBytes + 4096 + SegmentDoorbell::kBytes;
  absl::StatusOr<std::shared_ptr<SharedSegment>> segment = SharedSegment::Create(size);
  ASSERT_TRUE(segment.ok()) << segment.status();
  for (const int64_t offset : {size - SegmentDoorbell::kBytes + 64, int64_t{4096 + 8}}) {
    SharedSegmentAttach attach = (*segment)->attach();
    attach.set_doorbell_offset(offset);
    attach.set_doorbell_layout(SegmentDoorbell::kLayout);
    absl::StatusOr<PushPullStreamResponse> answer =
        RawSharedMemoryStream(address_).Send(AttachOf(attach));
    EXPECT_EQ(answer.status().code(), absl::StatusCode::kInvalidArgument) << offset;
    EXPECT_THAT(std::string(answer.status().message()), HasSubstr("attach.doorbell_offset"));
  }
  SharedSegmentAttach attach = (*segment)->attach();
  attach.set_doorbell_offset(size - SegmentDoorbell::kBytes);
  // A worker writing another layout (or none: one from before the field)
  // gets no doorbell; its exchanges would come over the stream.
  for (const int32_t layout : {0, SegmentDoorbell::kLayout + 1}) {
    attach.set_doorbell_layout(layout);
    RawSharedMemoryStream other(address_);
    absl::StatusOr<PushPullStreamResponse> answer = other.Send(AttachOf(attach));
    ASSERT_TRUE(answer.ok()) << answer.status();
    EXPECT_FALSE(answer->doorbell()) << layout;
  }
  attach.set_doorbell_layout(SegmentDoorbell::kLayout);
  RawSharedMemoryStream stream(address_);
  absl::StatusOr<PushPullStreamResponse> answer = stream.Send(AttachOf(attach));
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->doorbell());
  EXPECT_EQ(answer->doorbell_layout(), SegmentDoorbell::kLayout);
  SegmentDoorbell doorbell((*segment)->data() + size - SegmentDoorbell::kBytes);
  PushPullStreamRequest pull_only;
  pull_only.mutable_exchange()->mutable_pull()->set_job_id(kJob);
  for (const std::string& header :
       {std::string("not a header \xff"), pull_only.SerializeAsString()}) {
    const uint32_t sequence = doorbell.Ring(header);
    ASSERT_TRUE(doorbell.AwaitAnswer(sequence, absl::Seconds(10)));
    absl::StatusOr<std::string> bytes = doorbell.Answer();
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    PushPullStreamResponse refused;
    ASSERT_TRUE(refused.ParseFromString(*bytes));
    EXPECT_EQ(refused.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  }
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

}  // namespace
}  // namespace shard_service_testing
}  // namespace downpour
