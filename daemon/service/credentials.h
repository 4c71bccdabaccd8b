// Credentials for the daemon's listeners: mutual TLS for TCP, and group lookup for
// the local socket. Called once at start-up from main.
#ifndef CKPTD_DAEMON_SERVICE_CREDENTIALS_H_
#define CKPTD_DAEMON_SERVICE_CREDENTIALS_H_

#include <grpcpp/security/server_credentials.h>
#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/io/file_system.h"

namespace ckptd {

// Server certificate and key, and the CA every client certificate must chain to:
// clients without a valid certificate from that CA are refused in the handshake.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MutualTlsCredentials(FileSystem* fs,
                                                                              const std::string& cert,
                                                                              const std::string& key,
                                                                              const std::string& ca);

// A group name or number.
absl::StatusOr<gid_t> ResolveGroup(const std::string& group);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_SERVICE_CREDENTIALS_H_
