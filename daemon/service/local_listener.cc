#include "daemon/service/local_listener.h"

#include <fcntl.h>
#include <grpcpp/server.h>
#include <grpcpp/server_posix.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"
#include "daemon/io/file_system.h"
#include "daemon/io/private_dir.h"

namespace ckptd {

void PeerTable::Record(int fd, pid_t pid, uid_t uid, gid_t gid, bool allowed) {
  absl::MutexLock lock(&mu_);
  by_fd_[fd] = Peer{pid, uid, gid, allowed};
}

absl::Status PeerTable::Check(const std::string& grpc_peer) const {
  int fd = -1;
  if (!absl::StartsWith(grpc_peer, "fd:") || !absl::SimpleAtoi(grpc_peer.substr(3), &fd))
    return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return absl::PermissionDeniedError("unknown local peer");
  if (!it->second.allowed) {
    return absl::PermissionDeniedError(
        absl::StrCat("uid ", it->second.uid, " gid ", it->second.gid,
                     " may not use this ckptd (see security.allowed_uids / allowed_gids)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<pid_t> PeerTable::LocalPid(const std::string& grpc_peer) const {
  int fd = -1;
  if (absl::StartsWith(grpc_peer, "fd:") && absl::SimpleAtoi(grpc_peer.substr(3), &fd)) {
    absl::MutexLock lock(&mu_);
    auto it = by_fd_.find(fd);
    if (it != by_fd_.end() && it->second.allowed) return it->second.pid;
  }
  return absl::FailedPreconditionError("shared_memory: only for trainers on the daemon's unix socket");
}

std::string PeerTable::Describe(const std::string& grpc_peer) const {
  int fd = -1;
  if (absl::StartsWith(grpc_peer, "fd:") && absl::SimpleAtoi(grpc_peer.substr(3), &fd)) {
    absl::MutexLock lock(&mu_);
    auto it = by_fd_.find(fd);
    if (it != by_fd_.end()) return absl::StrCat("pid ", it->second.pid, " uid ", it->second.uid);
  }
  return grpc_peer;
}

absl::StatusOr<std::unique_ptr<LocalListener>> LocalListener::Listen(const std::string& path, gid_t group) {
  const std::string dir = DirName(path);
  const bool grouped = group != static_cast<gid_t>(-1);
  RETURN_IF_ERROR(PreparePrivateDirectory(dir, group, "socket_path"));
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path ", path, " is longer than ", sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    return ErrnoToStatus(errno, absl::StrCat("unlink ", path));
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoToStatus(errno, "socket");
  // The socket file is created under the process umask; tighten it before listen.
  const mode_t old_umask = ::umask(grouped ? 0117 : 0177);
  const int rc = ::bind(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old_umask);
  if (rc != 0 || (grouped && ::chown(path.c_str(), static_cast<uid_t>(-1), group) != 0) ||
      ::listen(fd, 512) != 0) {
    const int err = rc != 0 ? bind_errno : errno;
    ::close(fd);
    return ErrnoToStatus(err, absl::StrCat("listen on ", path));
  }
  return std::unique_ptr<LocalListener>(new LocalListener(path, fd));
}

LocalListener::~LocalListener() {
  Stop();
  ::close(fd_);
  ::unlink(path_.c_str());
}

void LocalListener::Serve(grpc::Server* server, PeerTable* peers, PeerPolicy policy) {
  thread_ =
      std::thread([this, server, peers, policy = std::move(policy)] { AcceptLoop(server, peers, policy); });
}

void LocalListener::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void LocalListener::AcceptLoop(grpc::Server* server, PeerTable* peers, PeerPolicy policy) {
  while (!stop_) {
    struct pollfd pfd = {fd_, POLLIN, 0};
    if (::poll(&pfd, 1, 200) <= 0) continue;  // wakes to notice Stop()
    int conn = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) continue;
    struct ucred cred = {};
    socklen_t len = sizeof(cred);
    if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      spdlog::warn("refusing a connection whose peer credentials cannot be read: {}", std::strerror(errno));
      ::close(conn);
      continue;
    }
    const bool allowed = policy.allowed_uids.count(cred.uid) > 0 || policy.allowed_gids.count(cred.gid) > 0;
    if (!allowed) {
      spdlog::warn("connection from pid {} uid {} gid {}: not allowed; its calls get PERMISSION_DENIED",
                   cred.pid, cred.uid, cred.gid);
    }
    // Recorded before gRPC sees the fd, so no call can race ahead of its check.
    peers->Record(conn, cred.pid, cred.uid, cred.gid, allowed);
    grpc::AddInsecureChannelFromFd(server, conn);
  }
}

}  // namespace ckptd
