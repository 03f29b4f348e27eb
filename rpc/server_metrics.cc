#include "rpc/server_metrics.h"

#include <atomic>
#include <chrono>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"

namespace downpour {
namespace {

using grpc::experimental::InterceptionHookPoints;

// gRPC's status codes, 0 (OK) to 16 (Unauthenticated).
constexpr int kNumCodes = 17;

// What the interceptors of one method record into, made once per method: a
// call looks them up without allocating.
struct MethodMetrics {
  std::string name;
  bool streaming = false;
  Histogram* handling = nullptr;
  std::atomic<Counter*> handled[kNumCodes] = {};
};

class MetricsFactory;

class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(MetricsFactory* factory, MethodMetrics* method)
      : factory_(factory), method_(method), started_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override;

 private:
  MetricsFactory* const factory_;
  MethodMetrics* const method_;
  const std::chrono::steady_clock::time_point started_;
  // A streaming call: the last request not yet answered.
  std::chrono::steady_clock::time_point request_at_;
  bool awaiting_answer_ = false;
};

class MetricsFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsFactory(MetricsRegistry* metrics) : metrics_(metrics) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(this, Method(info));
  }

  Counter* Handled(MethodMetrics* method, grpc::StatusCode code) {
    const int index = static_cast<int>(code);
    const bool known = index >= 0 && index < kNumCodes;
    if (known) {
      if (Counter* counter = method->handled[index].load(std::memory_order_acquire)) {
        return counter;
      }
    }
    Counter* counter =
        metrics_->GetCounter("downpour_rpc_server_handled_total",
                             "RPCs the server completed, by method and gRPC status code.",
                             {{"method", method->name}, {"code", GrpcCodeName(code)}});
    if (known) method->handled[index].store(counter, std::memory_order_release);
    return counter;
  }

 private:
  MethodMetrics* Method(grpc::experimental::ServerRpcInfo* info) {
    // The method's name lives as long as the server (its RpcServiceMethod).
    const char* key = info->method() != nullptr ? info->method() : "";
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = methods_.find(key);
      if (it != methods_.end()) return it->second.get();
    }
    absl::MutexLock lock(&mu_);
    auto& slot = methods_[key];
    if (slot == nullptr) {
      slot = std::make_unique<MethodMetrics>();
      slot->name = std::string(absl::StripPrefix(*key != 0 ? key : "unknown", "/"));
      slot->streaming = info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY;
      slot->handling = metrics_->GetHistogram(
          "downpour_rpc_server_handling_seconds",
          "Time the server took to answer an RPC: a unary call from its arrival to its status, "
          "a streaming call from each request to the answer that follows it.",
          {{"method", slot->name}});
    }
    return slot.get();
  }

  MetricsRegistry* const metrics_;
  absl::Mutex mu_;
  absl::flat_hash_map<const char*, std::unique_ptr<MethodMetrics>> methods_ ABSL_GUARDED_BY(mu_);
};

void MetricsInterceptor::Intercept(grpc::experimental::InterceptorBatchMethods* methods) {
  if (method_->streaming) {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      request_at_ = std::chrono::steady_clock::now();
      awaiting_answer_ = true;
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE) &&
        awaiting_answer_) {
      method_->handling->Observe(SecondsSince(request_at_));
      awaiting_answer_ = false;
    }
  }
  if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
    if (!method_->streaming) method_->handling->Observe(SecondsSince(started_));
    factory_->Handled(method_, methods->GetSendStatus().error_code())->Increment();
  }
  methods->Proceed();
}

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
