// Status helpers shared by every daemon layer: errno conversion and early-return
// macros. Errors are values; nothing here throws or exits. Thread-safe (stateless).
#ifndef CKPTD_DAEMON_BASE_STATUS_H_
#define CKPTD_DAEMON_BASE_STATUS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckptd {

// Maps an errno value to the closest canonical code (ENOSPC -> RESOURCE_EXHAUSTED,
// ENOENT -> NOT_FOUND, EIO -> DATA_LOSS...) with "context: strerror" as message.
absl::Status ErrnoToStatus(int err, absl::string_view context);

// Returns `status` with `context` prepended to its message, keeping the code.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// "3,5,9" for up to `shown` ids, else the first `shown` and "and N more": error
// messages stay small whatever the job's size (gRPC refuses large status details).
std::string JoinBounded(const std::vector<int>& ids, size_t shown = 8);
std::string JoinBounded(const std::vector<std::string>& items, size_t shown = 8);

// Messages longer than this are cut (and say so) where they leave the daemon.
inline constexpr size_t kMaxErrorMessageBytes = 2048;
std::string BoundMessage(absl::string_view message, size_t max = kMaxErrorMessageBytes);

// This machine's host name (for messages that say where something failed).
const std::string& HostName();

// `status` naming MPI rank `rank` and this host, so that every rank's log and every
// trainer's error say where it failed; OK stays OK.
absl::Status OnRank(const absl::Status& status, int rank);

}  // namespace ckptd

#define CKPTD_CONCAT_INNER(a, b) a##b
#define CKPTD_CONCAT(a, b) CKPTD_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                      \
  do {                                             \
    ::absl::Status ckptd_status_ = (expr);         \
    if (!ckptd_status_.ok()) return ckptd_status_; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) ASSIGN_OR_RETURN_IMPL(CKPTD_CONCAT(ckptd_statusor_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

#endif  // CKPTD_DAEMON_BASE_STATUS_H_
