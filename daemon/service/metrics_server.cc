#include "daemon/service/metrics_server.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"

namespace ckptd {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host, int port,
                                                                    std::function<std::string()> render) {
  std::unique_ptr<MetricsServer> out(new MetricsServer());
  out->server_ = std::make_unique<httplib::Server>();
  out->server_->Get("/metrics",
                    [render = std::move(render)](const httplib::Request&, httplib::Response& res) {
                      res.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
                    });
  if (port == 0) {
    out->port_ = out->server_->bind_to_any_port(host);
  } else if (out->server_->bind_to_port(host, port)) {
    out->port_ = port;
  }
  if (out->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", host, ":", port));
  }
  httplib::Server* server = out->server_.get();
  out->thread_ = std::thread([server] { server->listen_after_bind(); });
  return out;
}

MetricsServer::~MetricsServer() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace ckptd
