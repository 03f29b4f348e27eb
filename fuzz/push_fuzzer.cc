// Fuzzes the shard's push handler end to end: the input (see
// fuzz/received_message.h) is deserialized as gRPC hands a request to
// /downpour.ParameterServer/Push (rpc/tensor_wire.h) and passed to
// ParameterServerService::Push (rpc/shard_service.cc), which parses the
// PushRequest header and applies it to a ParameterStore through the
// ParameterShard interface, as a shard daemon does. The store is made afresh
// for each input (so a finding replays alone) and hosts three jobs over one
// small model, one per consistency mode, each with a different optimizer:
//
//   "sync"   SYNC, 2 workers (1 backup), MOMENTUM, start (attempt) 1, checkpointing
//   "async"  ASYNC, 2 workers, ADAM with a cosine schedule, push_every 2
//   "ssp"    SSP (staleness 1), 2 workers, ADAGRAD, BFLOAT16 gradients
//
// Partitions on this shard (shard 0): 0/0 [0, 3) and 0/1 [3, 6) of
// dense0/weight (6 elements), 1/0 [0, 2) of bn/gamma (3); 1/1 is on shard 1.
//
// Invariants beyond "no crash": a refused push is an error the caller can
// act on, with a message (never INTERNAL or UNKNOWN); an accepted push sent
// again is answered as a duplicate (or as diverged, when its gradient was
// not finite); the store still answers a pull.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/status.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/received_message.h"
#include "google/protobuf/text_format.h"
#include "ps/parameter_store.h"
#include "rpc/grpc_status.h"
#include "rpc/shard_service.h"
#include "rpc/tensor_wire.h"

namespace downpour {
namespace {

constexpr char kModel[] = R"pb(
  input_shape: 2
  num_classes: 3
  layer {
    name: "dense0"
    dense { units: 3 no_bias: true }
  }
  layer {
    name: "bn"
    batch_norm {}
  }
  layer { softmax_cross_entropy {} }
)pb";

JobSpec Spec(const char* text) {
  JobSpec spec;
  const bool parsed = google::protobuf::TextFormat::ParseFromString(text, &spec) &&
                      google::protobuf::TextFormat::ParseFromString(kModel, spec.mutable_model());
  FUZZ_CHECK(parsed, "the fuzzer's own job spec does not parse");
  spec.mutable_dataset()->set_train_files("train-*");
  spec.mutable_dataset()->set_test_files("test-*");
  spec.mutable_dataset()->set_batch_size(4);
  spec.set_num_shards(2);
  spec.set_steps(100);
  spec.set_num_workers(2);
  spec.set_seed(7);
  return spec;
}

std::vector<PartitionPlacement> Placements() {
  auto make = [](int32_t tensor, int32_t partition, int64_t offset, int64_t n, int32_t shard) {
    PartitionPlacement p;
    p.set_tensor_id(tensor);
    p.set_partition(partition);
    p.set_offset(offset);
    p.set_num_elements(n);
    p.set_shard(shard);
    return p;
  };
  return {make(0, 0, 0, 3, 0), make(0, 1, 3, 3, 0), make(1, 0, 0, 2, 0), make(1, 1, 2, 1, 1)};
}

std::unique_ptr<ParameterStore> MakeStore() {
  auto store = std::make_unique<ParameterStore>();
  store->SetCheckpointSink([](ShardCapture) {});
  struct {
    const char* id;
    const char* spec;
    int64_t attempt;
  } jobs[] = {
      {"sync",
       R"pb(consistency { mode: SYNC backup_workers: 1 }
            optimizer { kind: MOMENTUM learning_rate: 0.1 })pb",
       1},
      {"async",
       R"pb(consistency { mode: ASYNC push_every: 2 }
            optimizer {
              kind: ADAM
              learning_rate: 0.01
              schedule { kind: COSINE decay_steps: 10 warmup_steps: 2 }
            })pb",
       0},
      {"ssp",
       R"pb(consistency { mode: SSP staleness: 1 }
            optimizer { kind: ADAGRAD learning_rate: 0.1 }
            gradient_wire_dtype: BFLOAT16)pb",
       0},
  };
  for (const auto& job : jobs) {
    const absl::Status added =
        store->AddJob(job.id, Spec(job.spec), /*shard_index=*/0, Placements(), job.attempt);
    FUZZ_CHECK(added.ok(), "the fuzzer's job ", job.id, ": ", added.ToString());
  }
  return store;
}

void CheckRefusal(const grpc::Status& status) {
  FUZZ_CHECK(status.error_code() != grpc::StatusCode::INTERNAL &&
                 status.error_code() != grpc::StatusCode::UNKNOWN &&
                 !status.error_message().empty(),
             "push refused with code ", status.error_code(), ": ", status.error_message());
}

}  // namespace
}  // namespace downpour

#ifdef DOWNPOUR_LIBFUZZER
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// Mutates the PushRequest header with its length prefix kept true, so its
// fields (a step, a rank, a partition) change without the frame falling apart.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  return downpour::fuzz::MutateFramedInput(data, size, max_size, seed, LLVMFuzzerMutate);
}
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  grpc::ByteBuffer buffer = downpour::fuzz::ReceivedMessage(data, size);
  downpour::TensorMessage request;
  if (!grpc::SerializationTraits<downpour::TensorMessage>::Deserialize(&buffer, &request).ok()) {
    return 0;
  }
  std::unique_ptr<downpour::ParameterStore> store = downpour::MakeStore();
  downpour::ParameterServerService service(store.get());
  grpc::ServerContext context;
  downpour::TensorMessage response;
  const grpc::Status pushed = service.Push(&context, &request, &response);
  if (!pushed.ok()) {
    downpour::CheckRefusal(pushed);
    return 0;
  }
  downpour::PushResponse first;
  FUZZ_CHECK(first.ParseFromString(response.header), "an unparsable PushResponse");
  // A retry of the same request (a lost answer) is recognised, not applied
  // again; unless the push made the job diverge (a gradient that is not
  // finite), after which every push and pull of the job fails saying so.
  downpour::TensorMessage again;
  const grpc::Status retried = service.Push(&context, &request, &again);
  downpour::PushResponse second;
  const bool diverged = downpour::IsDiverged(downpour::FromGrpcStatus(retried));
  FUZZ_CHECK(
      diverged || (retried.ok() && second.ParseFromString(again.header) && second.duplicate()),
      "an accepted push sent again is not a duplicate: ", retried.error_message());

  downpour::PushRequest header;
  header.ParseFromString(request.header);
  downpour::PullRequest pull;
  pull.set_job_id(header.job_id());
  downpour::Payload values;
  // Ready at once (min_version 0), else DeadlineExceeded at once.
  absl::StatusOr<downpour::PullResponse> pulled = store->Pull(pull, absl::InfinitePast(), &values);
  FUZZ_CHECK(pulled.ok() || !pulled.status().message().empty(), pulled.status().ToString());
  return 0;
}
