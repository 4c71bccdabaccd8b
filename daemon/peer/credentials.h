// Credentials for the daemon's listeners: mutual TLS for TCP, and group lookup for
// the local socket. Called once at start-up from main.
#ifndef CKPTD_DAEMON_PEER_CREDENTIALS_H_
#define CKPTD_DAEMON_PEER_CREDENTIALS_H_

#include <grpcpp/security/server_credentials.h>
#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/io/file_system.h"

namespace ckptd {

// A daemon's TLS files: its certificate and key, and the CA every peer's or client's
// certificate must chain to. The same three serve the external TCP listener and the
// channels between daemons.
struct TlsFilePaths {
  std::string cert, key, ca;
};

// The PEM contents of the files (each at most 1 MiB); the error names the file.
struct TlsPem {
  std::string cert, key, ca;
};
absl::StatusOr<TlsPem> ReadTlsFiles(FileSystem* fs, const TlsFilePaths& files);

// Server credentials: clients without a valid certificate from the CA are refused in
// the handshake.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MutualTlsCredentials(FileSystem* fs,
                                                                              const TlsFilePaths& files);
std::shared_ptr<grpc::ServerCredentials> MutualTlsCredentials(TlsPem pem);

// A group name or number.
absl::StatusOr<gid_t> ResolveGroup(const std::string& group);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_PEER_CREDENTIALS_H_
