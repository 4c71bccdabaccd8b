// MetricsServer: GET /metrics over plain HTTP (cpp-httplib) for Prometheus to scrape.
// Owned by main; it runs one listener thread of its own, which calls `render` for each
// scrape (render must be thread-safe). Anything but GET /metrics is 404.
#ifndef CKPTD_DAEMON_SERVICE_METRICS_SERVER_H_
#define CKPTD_DAEMON_SERVICE_METRICS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace ckptd {

class MetricsServer {
 public:
  // Listens on host:port (port 0: any free port) and serves until destroyed.
  // UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host, int port,
                                                              std::function<std::string()> render);
  ~MetricsServer();
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_SERVICE_METRICS_SERVER_H_
