// Where a Status becomes a grpc::Status: the one conversion the daemon's services
// use, and the interceptor that turns gRPC's own answer to a request that does not
// parse into one that says so. Pure functions; thread-safe.
#ifndef CKPTD_DAEMON_SERVICE_GRPC_STATUS_H_
#define CKPTD_DAEMON_SERVICE_GRPC_STATUS_H_

#include <grpcpp/support/server_interceptor.h>
#include <grpcpp/support/status.h>

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace ckptd {

// The same code, and the message bounded (see BoundMessage).
grpc::Status ToGrpcStatus(const absl::Status& status);

// What a client is told when its request to `method` does not parse.
std::string UnparsedRequestError(const std::string& method);

// gRPC answers a request that does not parse with INTERNAL and an empty message
// before any handler runs; this interceptor turns that into INVALID_ARGUMENT naming
// the method, so a client learns its request was malformed.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewParseErrorInterceptorFactory();

}  // namespace ckptd

#endif  // CKPTD_DAEMON_SERVICE_GRPC_STATUS_H_
