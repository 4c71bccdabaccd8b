// LocalListener: the daemon's unix socket, accepted by ckptd itself so that every
// connection's peer credentials (SO_PEERCRED) are known; accepted connections are
// handed to gRPC, and handlers refuse calls from peers the policy does not allow
// (gRPC's own unix-socket transport does not check peers).
// PeerTable is thread-safe; LocalListener runs one accept thread of its own.
#ifndef CKPTD_DAEMON_SERVICE_LOCAL_LISTENER_H_
#define CKPTD_DAEMON_SERVICE_LOCAL_LISTENER_H_

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace grpc {
class Server;
}

namespace ckptd {

struct PeerPolicy {
  std::set<uid_t> allowed_uids;  // empty sets allow nobody
  std::set<gid_t> allowed_gids;
};

// What is known of each accepted connection, by gRPC peer name ("fd:N").
class PeerTable {
 public:
  void Record(int fd, pid_t pid, uid_t uid, gid_t gid, bool allowed);
  // OK for an allowed local peer and for peers that did not come through the local
  // listener (TCP, already authenticated by mutual TLS); PERMISSION_DENIED otherwise.
  absl::Status Check(const std::string& grpc_peer) const;
  // The process at the other end of a local connection (for shared memory).
  // FAILED_PRECONDITION for peers that did not come through the local listener.
  absl::StatusOr<pid_t> LocalPid(const std::string& grpc_peer) const;
  // For logs: "pid 4242 uid 1000" for a local peer, else gRPC's name for it
  // ("ipv4:10.0.0.7:51234").
  std::string Describe(const std::string& grpc_peer) const;

 private:
  struct Peer {
    pid_t pid;
    uid_t uid;
    gid_t gid;
    bool allowed;
  };
  mutable absl::Mutex mu_;
  std::map<int, Peer> by_fd_ ABSL_GUARDED_BY(mu_);
};

class LocalListener {
 public:
  // Creates the socket's directory (mode 0700, or 0750 owned by `group` when group
  // >= 0; a directory another user owns or can write is refused, see
  // PreparePrivateDirectory) and listens on `path` (mode 0600 or 0660), replacing a
  // stale socket. The caller holds the socket's ProcessLock, so the socket replaced
  // is never a live daemon's.
  static absl::StatusOr<std::unique_ptr<LocalListener>> Listen(const std::string& path, gid_t group);
  ~LocalListener();

  // Accepts connections until Stop(), checking each against `policy`.
  void Serve(grpc::Server* server, PeerTable* peers, PeerPolicy policy);
  void Stop();

 private:
  LocalListener(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  void AcceptLoop(grpc::Server* server, PeerTable* peers, PeerPolicy policy);

  std::string path_;
  int fd_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_SERVICE_LOCAL_LISTENER_H_
