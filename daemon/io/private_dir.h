// Start-up guards for the directories a daemon owns: its socket directory and its
// checkpoint root. PreparePrivateDirectory refuses a directory someone else could have
// planted (a squatter who pre-creates a path under /tmp can swap sockets or plant
// steps); ProcessLock makes a second daemon on the same socket or root refuse to start
// instead of silently taking over. POSIX calls on paths outside any checkpoint, so
// they sit beside FileSystem rather than behind it. Thread-safe (no shared state).
#ifndef CKPTD_DAEMON_IO_PRIVATE_DIR_H_
#define CKPTD_DAEMON_IO_PRIVATE_DIR_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckptd {

// Modes of what a daemon creates: private to its user, or readable by one group.
inline constexpr uint32_t kPrivateDirMode = 0700;
inline constexpr uint32_t kGroupDirMode = 0750;
inline constexpr uint32_t kPrivateFileMode = 0600;
inline constexpr uint32_t kGroupFileMode = 0640;
inline constexpr gid_t kNoGroup = static_cast<gid_t>(-1);

// The modes for directories and files created beneath `path` (or, when it does not
// exist, beneath its nearest existing ancestor), so that nothing written there is
// more readable than where it lands: group modes (0750/0640) beneath a directory
// open to its group with set-group-id and closed to others (a root with
// checkpoint_group), private ones (0700/0600) beneath any other directory closed to
// others, or always with `private_at_least` (a writer into a checkpoint root), else
// 0755/0644. Every ckptctl command that writes beneath a root (import, gc, export)
// uses it, so its files are as private as the daemon's.
struct CreateModes {
  uint32_t dir = 0755;
  uint32_t file = 0644;
};
CreateModes ModesBeneath(const std::string& path, bool private_at_least);

// Creates `path` (and missing parents) if needed, then requires that it is a real
// directory (not a symlink) owned by this process's effective uid and not writable
// by others (nor by its group unless `group` is given). FAILED_PRECONDITION naming
// the owner, the mode and the config key `setting` to change otherwise. Then sets
// mode 0700, or 0750 owned by `group` with the set-group-id bit, so that everything
// created beneath inherits the group.
absl::Status PreparePrivateDirectory(const std::string& path, gid_t group, absl::string_view setting);

// An exclusive flock on `path` (created 0600), held until destruction, with this
// process's pid written in it. FAILED_PRECONDITION naming the holder's pid and
// `what` when another process holds it. File systems without flock (some parallel
// file systems) give a lock that holds nothing, with a warning logged.
class ProcessLock {
 public:
  static absl::StatusOr<std::unique_ptr<ProcessLock>> Acquire(const std::string& path,
                                                              absl::string_view what);
  ~ProcessLock();
  ProcessLock(const ProcessLock&) = delete;
  ProcessLock& operator=(const ProcessLock&) = delete;

 private:
  explicit ProcessLock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_IO_PRIVATE_DIR_H_
