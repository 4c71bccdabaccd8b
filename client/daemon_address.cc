// Where a client finds its daemon: addresses as people write them, the default
// socket, and a quick answer when no daemon is there.
#include <errno.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckptd/client.h"
#include "client_internal.h"

namespace ckptd {

std::string DefaultSocketPath() { return absl::StrCat("/tmp/ckptd-", ::getuid(), "/ckptd-0.sock"); }

std::string DaemonTarget(const std::string& address) {
  std::string given = address;
  if (given.empty()) {
    const char* env = std::getenv("CKPTD_ADDRESS");
    given = env != nullptr && *env != '\0' ? std::string(env) : DefaultSocketPath();
  }
  // gRPC's own schemes pass through as written.
  for (const char* scheme : {"unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:"}) {
    if (absl::StartsWith(given, scheme)) return given;
  }
  struct stat info;
  if (absl::StrContains(given, "/") || ::stat(given.c_str(), &info) == 0) return "unix:" + given;
  return given;
}

namespace client_internal {

std::string HowAddressWasChosen(const std::string& address) {
  if (!address.empty()) return "";
  const char* env = std::getenv("CKPTD_ADDRESS");
  if (env != nullptr && *env != '\0') return " (from $CKPTD_ADDRESS)";
  return " (the default socket)";
}

absl::Status CheckSocketListening(const std::string& target, const std::string& chosen) {
  if (!absl::StartsWith(target, "unix:")) return absl::OkStatus();
  std::string path = target.substr(5);
  if (absl::StartsWith(path, "//")) path = path.substr(2);  // unix:///abs/path
  sockaddr_un where{};
  where.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(where.sun_path)) return absl::OkStatus();  // gRPC will say
  std::memcpy(where.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::OkStatus();
  const int connected = ::connect(fd, reinterpret_cast<const sockaddr*>(&where), sizeof(where));
  const int error = errno;
  ::close(fd);
  if (connected == 0) return absl::OkStatus();
  const std::string advice =
      "; is the daemon running? Start one with `mpirun -np 1 ckptd` (docs/operations.md), or name its socket "
      "with --address or CKPTD_ADDRESS";
  if (error == ENOENT) {
    return absl::UnavailableError(
        absl::StrCat("no ckptd is listening on ", target, chosen, ": no such socket file", advice));
  }
  if (error == ECONNREFUSED) {
    return absl::UnavailableError(absl::StrCat("no ckptd is listening on ", target, chosen,
                                               ": the socket file is there but nothing accepts on it (a "
                                               "daemon that stopped?)",
                                               advice));
  }
  if (error == EACCES) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot connect to ckptd at ", target, chosen, ": permission denied (", std::strerror(error),
        "); the daemon's socket_group or security settings decide who may"));
  }
  return absl::OkStatus();  // anything else: gRPC tries, and says what it found
}

}  // namespace client_internal
}  // namespace ckptd
