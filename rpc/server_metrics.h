// RPC metrics of a daemon's gRPC server, recorded by a server interceptor so
// that every service (ours, health checking) is measured the same way:
//
//   downpour_rpc_server_handling_seconds{method}     histogram
//   downpour_rpc_server_handled_total{method,code}   counter
//
// `method` is the full name without its leading slash
// ("downpour.ParameterServer/Push", "grpc.health.v1.Health/Check"); `code` is
// the gRPC status code as gRPC's Go and Python libraries spell it ("OK",
// "DeadlineExceeded", "Unavailable"). A unary call is timed from its arrival
// to its status. A streaming call counts once in handled_total when it ends,
// and its histogram times each answer from the request it follows (a
// PushPullStream exchange), not the stream's life.
//
// Thread-safe. The registry is not owned and must outlive the server.
#ifndef DOWNPOUR_RPC_SERVER_METRICS_H_
#define DOWNPOUR_RPC_SERVER_METRICS_H_

#include <memory>
#include <string>

#include "common/metrics.h"
#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/support/status_code_enum.h"

namespace downpour {

// The factory to pass to ServerBuilder::experimental().SetInterceptorCreators.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeServerMetricsFactory(
    MetricsRegistry* metrics);

// "OK", "Canceled", ..., "Unauthenticated"; "Code<N>" for a number gRPC does
// not define.
std::string GrpcCodeName(grpc::StatusCode code);

}  // namespace downpour

#endif  // DOWNPOUR_RPC_SERVER_METRICS_H_
