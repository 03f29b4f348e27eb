// Fuzzes what the coordinator does with a submitted job spec: the bytes are
// parsed as a JobSpec in text format (what downpourctl reads from a .pbtxt)
// and, separately, as a binary protobuf (what arrives in SubmitJobRequest);
// each spec that parses goes through ApplyJobDefaults and ValidateJobSpec
// (control/coordinator_state.cc's SubmitJob) and, when valid, through what
// the scheduler and the daemons derive from it: shape inference
// (InferModel), placement over the shards (PlacePartitions, control/
// scheduler.cc) and the check shards make of a placement (CheckPlacement).
//
// Invariants beyond "no crash": an error is InvalidArgument with a message;
// a valid spec infers the same parameters and places them validly.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "proto/job.pb.h"
#include "spec/job_validation.h"
#include "spec/model_shape.h"
#include "spec/shard_map.h"

namespace downpour {
namespace {

// Keeps the text parser's errors off stderr (libFuzzer's output is the
// report; a parse error is an expected outcome, not a finding).
class QuietErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int, int, const std::string&) override {}
  void AddWarning(int, int, const std::string&) override {}
};

void Submit(JobSpec spec) {
  ApplyJobDefaults(&spec);
  absl::StatusOr<std::vector<ParamInfo>> params = ValidateJobSpec(spec);
  if (!params.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(params.status()) && !params.status().message().empty(),
               params.status().ToString());
    return;
  }
  absl::StatusOr<ModelShape> shape = InferModel(spec.model());
  FUZZ_CHECK(shape.ok(), "a valid spec fails shape inference: ", shape.status().ToString());
  FUZZ_CHECK(shape->params.size() == params->size(), "validation and shape inference disagree");
  for (size_t i = 0; i < params->size(); ++i) {
    FUZZ_CHECK((*params)[i].num_elements == shape->params[i].num_elements &&
                   (*params)[i].id == static_cast<int32_t>(i),
               "parameter ", i, " differs");
  }
  absl::StatusOr<std::vector<PartitionPlacement>> placed =
      PlacePartitions(*params, spec.num_shards(), spec.partition_bytes());
  FUZZ_CHECK(placed.ok(), "a valid spec cannot be placed: ", placed.status().ToString());
  const absl::Status checked = CheckPlacement(*params, *placed, spec.num_shards());
  FUZZ_CHECK(checked.ok(), "the placement of a valid spec fails its check: ", checked.ToString());
  int64_t placed_bytes = 0;
  for (int64_t bytes : BytesPerShard(*placed, spec.num_shards())) placed_bytes += bytes;
  int64_t param_bytes = 0;
  for (const ParamInfo& p : *params) param_bytes += p.num_elements * 4;
  FUZZ_CHECK(placed_bytes == param_bytes, "placed ", placed_bytes, " of ", param_bytes, " bytes");
}

}  // namespace
}  // namespace downpour

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  downpour::JobSpec spec;
  if (spec.ParseFromString(bytes)) downpour::Submit(spec);

  downpour::QuietErrors errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  spec.Clear();
  if (parser.ParseFromString(bytes, &spec)) downpour::Submit(spec);
  return 0;
}
