// Process-wide spdlog setup and the operator's handles on it. SetUpLogging runs once
// from main before the daemon's own threads start; after that spdlog's default logger
// is thread-safe, every line carries the MPI rank, and the signal thread may call
// ReopenLogFile (SIGHUP) and ToggleDebugLogging (SIGUSR1) at any time.
#ifndef CKPTD_DAEMON_BASE_LOGGING_H_
#define CKPTD_DAEMON_BASE_LOGGING_H_

#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"

namespace ckptd {

struct LoggingOptions {
  int rank = 0;
  std::string level = "info";  // spdlog level name
  // "text" ("[time] [rank N] [level] message") or "json" (one object per line:
  // {"time":"2026-12-04T16:00:00.123+0000","rank":0,"host":"h1","level":"info",
  //  "msg":"...", then the line's LogFields: "run","step","trainer","bytes","seconds"}).
  std::string format = "text";
  // Empty: every line goes to stderr (mpirun collects it). Otherwise lines are appended
  // to this file ("{rank}" in it becomes the rank), and lines at error and above also
  // go to stderr, so that mpirun's output still says why a rank stopped.
  std::string file{};
};

// INVALID_ARGUMENT for an unknown level or format; the errno of a log file that
// cannot be opened, naming it.
absl::Status SetUpLogging(const LoggingOptions& options);

// The log file named by a path that may hold "{rank}".
std::string LogFilePath(const std::string& pattern, int rank);

// SIGHUP: closes the log file and opens its path again (after logrotate moved it away),
// logging what it did; with no log file, logs that there is none to reopen. A path that
// no longer opens keeps the old file and logs why.
void ReopenLogFile();

// SIGUSR1: from the configured level to debug, or back; logs the level it leaves in force.
void ToggleDebugLogging();

// Facts of one event, which JSON lines carry as keys of their own so that log shippers
// need not parse messages. Unset fields (empty, negative) are left out. Text lines
// show only the message, which states the same facts in words.
struct LogFields {
  std::string run{};
  int64_t step = -1;
  int trainer = -1;
  int64_t bytes = -1;
  double seconds = -1;
};

namespace logging_internal {
// The fields of the line being logged on this thread (spdlog formats synchronously on
// the logging thread).
class FieldsScope {
 public:
  explicit FieldsScope(const LogFields* fields);
  ~FieldsScope();
  FieldsScope(const FieldsScope&) = delete;
  FieldsScope& operator=(const FieldsScope&) = delete;

 private:
  const LogFields* previous_;
};
}  // namespace logging_internal

// spdlog::log with structured fields.
template <typename... Args>
void LogEvent(spdlog::level::level_enum level, const LogFields& fields,
              spdlog::format_string_t<Args...> format, Args&&... args) {
  if (!spdlog::should_log(level)) return;
  logging_internal::FieldsScope scope(&fields);
  spdlog::log(level, format, std::forward<Args>(args)...);
}

}  // namespace ckptd

#endif  // CKPTD_DAEMON_BASE_LOGGING_H_
