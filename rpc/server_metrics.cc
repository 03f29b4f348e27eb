#include "rpc/server_metrics.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace downpour {
namespace {

using grpc::experimental::InterceptionHookPoints;

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(MetricsRegistry* metrics, grpc::experimental::ServerRpcInfo* info)
      : metrics_(metrics),
        method_(absl::StripPrefix(info->method() != nullptr ? info->method() : "unknown", "/")),
        streaming_(info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY),
        started_(std::chrono::steady_clock::now()),
        handling_(metrics->GetHistogram(
            "downpour_rpc_server_handling_seconds",
            "Time the server took to answer an RPC: a unary call from its arrival to its status, "
            "a streaming call from each request to the answer that follows it.",
            {{"method", method_}})) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (streaming_) {
      if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
        request_at_ = std::chrono::steady_clock::now();
        awaiting_answer_ = true;
      }
      if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE) &&
          awaiting_answer_) {
        handling_->Observe(SecondsSince(request_at_));
        awaiting_answer_ = false;
      }
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      if (!streaming_) handling_->Observe(SecondsSince(started_));
      metrics_
          ->GetCounter(
              "downpour_rpc_server_handled_total",
              "RPCs the server completed, by method and gRPC status code.",
              {{"method", method_}, {"code", GrpcCodeName(methods->GetSendStatus().error_code())}})
          ->Increment();
    }
    methods->Proceed();
  }

 private:
  MetricsRegistry* const metrics_;
  const std::string method_;
  const bool streaming_;
  const std::chrono::steady_clock::time_point started_;
  Histogram* const handling_;
  // A streaming call: the last request not yet answered.
  std::chrono::steady_clock::time_point request_at_;
  bool awaiting_answer_ = false;
};

class MetricsFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsFactory(MetricsRegistry* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(metrics_, info);
  }

 private:
  MetricsRegistry* const metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeServerMetricsFactory(
    MetricsRegistry* metrics) {
  return std::make_unique<MetricsFactory>(metrics);
}

std::string GrpcCodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {
      "OK",       "Canceled",       "Unknown",          "InvalidArgument",   "DeadlineExceeded",
      "NotFound", "AlreadyExists",  "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
      "Aborted",  "OutOfRange",     "Unimplemented",    "Internal",          "Unavailable",
      "DataLoss", "Unauthenticated"};
  const int index = static_cast<int>(code);
  if (index >= 0 && index < static_cast<int>(sizeof(kNames) / sizeof(kNames[0]))) {
    return kNames[index];
  }
  return absl::StrCat("Code", index);
}

}  // namespace downpour
