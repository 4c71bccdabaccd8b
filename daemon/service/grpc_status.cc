#include "daemon/service/grpc_status.h"

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"

namespace ckptd {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering. The message travels as HTTP/2
  // metadata, which a client refuses past its limit (8 KiB by default), failing every
  // call on the connection: it is bounded here.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), BoundMessage(status.message()));
}

std::string UnparsedRequestError(const std::string& method) {
  return absl::StrCat("the request to ", method,
                      " does not parse as its protobuf message (string fields must be valid UTF-8)");
}

namespace {

class ParseErrorInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit ParseErrorInterceptor(std::string method) : method_(std::move(method)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      // Every status of ours carries a message: an empty INTERNAL is gRPC's own
      // "could not deserialize the request".
      if (status.error_code() == grpc::StatusCode::INTERNAL && status.error_message().empty()) {
        methods->ModifySendStatus(
            grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, UnparsedRequestError(method_)));
      }
    }
    methods->Proceed();
  }

 private:
  std::string method_;
};

class ParseErrorInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new ParseErrorInterceptor(info->method());
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewParseErrorInterceptorFactory() {
  return std::make_unique<ParseErrorInterceptorFactory>();
}

}  // namespace ckptd
