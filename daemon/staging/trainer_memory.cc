#include "daemon/staging/trainer_memory.h"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/base/status.h"

namespace ckptd {
namespace {

absl::Status Gone(pid_t pid) {
  return absl::CancelledError(absl::StrCat("process_memory: trainer process ", pid, " has exited"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerMemory>> TrainerMemory::Open(pid_t pid, uint64_t probe_address) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    if (errno == ESRCH) return Gone(pid);
    return ErrnoToStatus(errno, absl::StrCat("process_memory: pidfd_open of trainer process ", pid));
  }
  std::unique_ptr<TrainerMemory> memory(new TrainerMemory(pid, pidfd));
  // process_vm_readv asks the kernel the same question as a write (may this process
  // ptrace that one?) and changes nothing.
  char byte = 0;
  const iovec local = {&byte, 1};
  const iovec remote = {reinterpret_cast<void*>(probe_address), 1};
  if (::process_vm_readv(pid, &local, 1, &remote, 1, 0) == 1) return memory;
  const int err = errno;
  switch (err) {
    case EPERM:
    case EACCES:
      return absl::PermissionDeniedError(
          absl::StrCat("process_memory: the kernel does not let the daemon write trainer process ", pid,
                       "'s memory (ptrace access: another user, Yama's ptrace_scope, or a seccomp profile)"));
    case ENOSYS:
      return absl::UnimplementedError("process_memory: process_vm_writev is not available here");
    case EFAULT:
      return absl::InvalidArgumentError(
          absl::StrCat("process_memory: address 0x", absl::Hex(probe_address),
                       " is not mapped in the trainer, or not readable and writable there"));
    case ESRCH:
      return Gone(pid);
    default:
      return ErrnoToStatus(err, "process_memory: process_vm_readv");
  }
}

TrainerMemory::~TrainerMemory() { ::close(pidfd_); }

bool TrainerMemory::Exited() const {
  pollfd p = {pidfd_, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;  // readable once the process has exited (or poll failed)
}

absl::Status TrainerMemory::Write(uint64_t address, absl::Span<const char> data) const {
  while (!data.empty()) {
    if (Exited()) return Gone(pid_);
    const iovec local = {const_cast<char*>(data.data()), data.size()};
    const iovec remote = {reinterpret_cast<void*>(address), data.size()};
    const ssize_t n = ::process_vm_writev(pid_, &local, 1, &remote, 1, 0);
    if (n <= 0) {
      const int err = n == 0 ? EFAULT : errno;
      if (err == EINTR) continue;
      if (err == ESRCH) return Gone(pid_);
      if (err == EFAULT) {
        return absl::InvalidArgumentError(absl::StrCat("process_memory: [0x", absl::Hex(address), ", +",
                                                       data.size(), ") is not writable in the trainer"));
      }
      return ErrnoToStatus(err, "process_memory: process_vm_writev");
    }
    // A partial write stops at the first page it could not write: the next call
    // starts there and reports it.
    address += static_cast<uint64_t>(n);
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace ckptd
