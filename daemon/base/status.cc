#include "daemon/base/status.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckptd {

absl::Status ErrnoToStatus(int err, absl::string_view context) {
  std::string message = absl::StrCat(context, ": ", std::strerror(err));
  switch (err) {
    case 0:
      return absl::OkStatus();
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EFBIG:
      return absl::ResourceExhaustedError(message);
    case EIO:
      return absl::DataLossError(message);
    case EINVAL:
    case ENAMETOOLONG:
    case EISDIR:
      return absl::InvalidArgumentError(message);
    case EAGAIN:
    case EINTR:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

namespace {

template <typename T>
std::string JoinFirst(const std::vector<T>& items, size_t shown) {
  if (items.size() <= shown) return absl::StrJoin(items, ",");
  std::vector<T> head(items.begin(), items.begin() + static_cast<long>(shown));
  return absl::StrCat(absl::StrJoin(head, ","), " and ", items.size() - shown, " more");
}

}  // namespace

std::string JoinBounded(const std::vector<int>& ids, size_t shown) { return JoinFirst(ids, shown); }

std::string JoinBounded(const std::vector<std::string>& items, size_t shown) {
  return JoinFirst(items, shown);
}

std::string BoundMessage(absl::string_view message, size_t max) {
  if (message.size() <= max) return std::string(message);
  return absl::StrCat(message.substr(0, max), "... (", message.size() - max, " more bytes cut)");
}

const std::string& HostName() {
  static const std::string* name = [] {
    char buffer[256] = {};
    if (::gethostname(buffer, sizeof(buffer) - 1) != 0) return new std::string("unknown-host");
    return new std::string(buffer);
  }();
  return *name;
}

absl::Status OnRank(const absl::Status& status, int rank) {
  if (status.ok()) return status;
  return Annotate(status, absl::StrCat("on rank ", rank, " (host ", HostName(), ")"));
}

}  // namespace ckptd
