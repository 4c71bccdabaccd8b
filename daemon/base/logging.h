// Process-wide spdlog setup. Call once from main before any thread starts; after that
// spdlog's default logger is thread-safe and every line carries the MPI rank.
#ifndef CKPTD_DAEMON_BASE_LOGGING_H_
#define CKPTD_DAEMON_BASE_LOGGING_H_

#include <string>

#include "absl/status/status.h"

namespace ckptd {

// format: "text" ("[time] [rank N] [level] message") or "json" (one object per line:
// {"time":"2026-12-04T16:00:00.123Z","rank":0,"level":"info","msg":"..."}).
absl::Status SetUpLogging(int rank, const std::string& level, const std::string& format = "text");

}  // namespace ckptd

#endif  // CKPTD_DAEMON_BASE_LOGGING_H_
