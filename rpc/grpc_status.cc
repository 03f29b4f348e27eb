#include "rpc/grpc_status.h"

#include <string>

#include "absl/strings/cord.h"
#include "proto/status_details.pb.h"

namespace downpour {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const auto code = static_cast<grpc::StatusCode>(status.code());
  StatusDetails details;
  status.ForEachPayload([&details](absl::string_view type_url, const absl::Cord& value) {
    StatusPayload* payload = details.add_payloads();
    payload->set_type_url(std::string(type_url));
    payload->set_value(std::string(value));
  });
  // Most errors have none: no trailer to send.
  if (details.payloads_size() == 0) return grpc::Status(code, std::string(status.message()));
  details.set_code(static_cast<int>(status.code()));
  details.set_message(std::string(status.message()));
  return grpc::Status(code, std::string(status.message()), details.SerializeAsString());
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status converted(static_cast<absl::StatusCode>(status.error_code()),
                         status.error_message());
  StatusDetails details;
  if (!status.error_details().empty() && details.ParseFromString(status.error_details())) {
    for (const StatusPayload& payload : details.payloads()) {
      converted.SetPayload(payload.type_url(), absl::Cord(payload.value()));
    }
  }
  return converted;
}

void SetDeadline(grpc::ClientContext* context, std::chrono::milliseconds timeout) {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
}

}  // namespace downpour
