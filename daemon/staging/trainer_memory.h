// TrainerMemory: a trainer process's own memory, written by the daemon itself
// (process_vm_writev), so that a restore lands in the trainer's tensors, which it
// already uses and has touched, with one copy and no shared segment to fault in
// first (a process's first restore into a fresh segment paid a page fault per 4 KiB
// there, in the daemon, at a fraction of the disk's speed).
//
// The kernel allows the call only where the daemon may ptrace the trainer: the same
// user with Yama's ptrace_scope 0, or CAP_SYS_PTRACE. Seccomp profiles may forbid it
// too. Open probes with a one-byte read, so that the caller learns before it sends
// anything whether to use the trainer's segment instead.
//
// The pid comes from the connection (SO_PEERCRED), never from a request. A pidfd
// taken by Open is polled before every write: once the trainer has exited, writes
// end with CANCELLED rather than reach a process that later gets its pid (the kernel
// hands out pids in turn, so a freed one returns only after pid_max more).
// Immutable after Open; Write may be called from any thread.
#ifndef CKPTD_DAEMON_STAGING_TRAINER_MEMORY_H_
#define CKPTD_DAEMON_STAGING_TRAINER_MEMORY_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ckptd {

class TrainerMemory {
 public:
  // The memory of process `pid`, where this process may write it. Probes one byte at
  // `probe_address`: PERMISSION_DENIED when the kernel refuses (ptrace access,
  // seccomp), UNIMPLEMENTED without the system call, INVALID_ARGUMENT when the
  // address is not mapped there, CANCELLED when the process has gone.
  static absl::StatusOr<std::unique_ptr<TrainerMemory>> Open(pid_t pid, uint64_t probe_address);
  ~TrainerMemory();
  TrainerMemory(const TrainerMemory&) = delete;
  TrainerMemory& operator=(const TrainerMemory&) = delete;

  // Copies `data` to [address, address + data.size()) of the trainer. INVALID_ARGUMENT
  // naming the range when part of it is not mapped writable there (bytes before that
  // point may have landed), CANCELLED once the trainer has exited.
  absl::Status Write(uint64_t address, absl::Span<const char> data) const;

  pid_t pid() const { return pid_; }

 private:
  TrainerMemory(pid_t pid, int pidfd) : pid_(pid), pidfd_(pidfd) {}
  bool Exited() const;

  const pid_t pid_;
  const int pidfd_;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_STAGING_TRAINER_MEMORY_H_
