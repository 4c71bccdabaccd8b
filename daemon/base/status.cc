#include "daemon/base/status.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

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

}  // namespace ckptd
