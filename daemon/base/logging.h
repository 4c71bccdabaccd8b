// Process-wide spdlog setup. Call once from main before any thread starts; after that
// spdlog's default logger is thread-safe and every line carries the MPI rank.
#ifndef CKPTD_DAEMON_BASE_LOGGING_H_
#define CKPTD_DAEMON_BASE_LOGGING_H_

#include <string>

#include "absl/status/status.h"

namespace ckptd {

absl::Status SetUpLogging(int rank, const std::string& level);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_BASE_LOGGING_H_
