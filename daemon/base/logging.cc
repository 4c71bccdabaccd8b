#include "daemon/base/logging.h"

#include <fcntl.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "daemon/base/status.h"

namespace ckptd {
namespace {

thread_local const LogFields* current_fields = nullptr;

// `text` as the body of a JSON string: quotes, backslashes and control bytes escaped,
// so that a JSON line stays one valid object whatever a message holds.
void AppendJsonEscaped(std::string_view text, spdlog::memory_buf_t& dest) {
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      dest.push_back('\\');
      dest.push_back(c);
    } else if (c == '\n') {
      dest.append(std::string_view("\\n"));
    } else if (u < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", u);
      dest.append(std::string_view(escaped));
    } else {
      dest.push_back(c);
    }
  }
}

// %* in a pattern: the message, escaped for a JSON string.
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    AppendJsonEscaped(std::string_view(msg.payload.data(), msg.payload.size()), dest);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

// %& in a pattern: the line's LogFields as JSON members, each preceded by a comma.
class JsonFields final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&, spdlog::memory_buf_t& dest) override {
    const LogFields* f = current_fields;
    if (f == nullptr) return;
    if (!f->run.empty()) {
      dest.append(std::string_view(",\"run\":\""));
      AppendJsonEscaped(f->run, dest);
      dest.push_back('"');
    }
    std::string members;
    if (f->step >= 0) absl::StrAppend(&members, ",\"step\":", f->step);
    if (f->trainer >= 0) absl::StrAppend(&members, ",\"trainer\":", f->trainer);
    if (f->bytes >= 0) absl::StrAppend(&members, ",\"bytes\":", f->bytes);
    if (f->seconds >= 0) absl::StrAppend(&members, absl::StrFormat(",\"seconds\":%.6f", f->seconds));
    dest.append(std::string_view(members));
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JsonFields>(); }
};

absl::StatusOr<int> OpenForAppend(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("log file ", path));
  return fd;
}

// Appends each line with one write(2) to an O_APPEND descriptor, so that ranks sharing
// a file interleave whole lines, and nothing waits in a buffer when a rank dies.
// Reopen swaps the descriptor under the sink's own lock.
class AppendFileSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  AppendFileSink(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~AppendFileSink() override { ::close(fd_); }

  const std::string& path() const { return path_; }

  absl::Status Reopen() {
    ASSIGN_OR_RETURN(int fd, OpenForAppend(path_));
    std::lock_guard<std::mutex> lock(mutex_);
    ::close(fd_);
    fd_ = fd;
    return absl::OkStatus();
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    const char* p = line.data();
    size_t left = line.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // a full disk loses log lines, never the daemon
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  void flush_() override {}

 private:
  const std::string path_;
  int fd_;
};

// What the signal thread changes after start-up.
struct LoggingState {
  absl::Mutex mu;
  std::shared_ptr<AppendFileSink> file ABSL_GUARDED_BY(mu);
  spdlog::level::level_enum configured ABSL_GUARDED_BY(mu) = spdlog::level::info;
  bool debug_toggled ABSL_GUARDED_BY(mu) = false;
};

LoggingState& State() {
  static LoggingState* state = new LoggingState;
  return *state;
}

}  // namespace

namespace logging_internal {
FieldsScope::FieldsScope(const LogFields* fields) : previous_(current_fields) { current_fields = fields; }
FieldsScope::~FieldsScope() { current_fields = previous_; }
}  // namespace logging_internal

std::string LogFilePath(const std::string& pattern, int rank) {
  return absl::StrReplaceAll(pattern, {{"{rank}", absl::StrCat(rank)}});
}

absl::Status SetUpLogging(const LoggingOptions& options) {
  const spdlog::level::level_enum level = spdlog::level::from_str(options.level);
  if (level == spdlog::level::off && options.level != "off") {
    return absl::InvalidArgumentError(absl::StrCat("unknown log level '", options.level, "'"));
  }
  if (options.format != "text" && options.format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown log format '", options.format, "' (text or json)"));
  }
  std::vector<spdlog::sink_ptr> sinks;
  auto to_stderr = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  std::shared_ptr<AppendFileSink> file;
  if (!options.file.empty()) {
    const std::string path = LogFilePath(options.file, options.rank);
    ASSIGN_OR_RETURN(int fd, OpenForAppend(path));
    file = std::make_shared<AppendFileSink>(path, fd);
    sinks.push_back(file);
    to_stderr->set_level(spdlog::level::err);
  }
  sinks.push_back(to_stderr);
  auto logger = std::make_shared<spdlog::logger>("ckptd", sinks.begin(), sinks.end());
  if (options.format == "json") {
    const std::string host(HostName());
    spdlog::memory_buf_t escaped_host;
    AppendJsonEscaped(host, escaped_host);
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<JsonEscapedMessage>('*').add_flag<JsonFields>('&').set_pattern(absl::StrCat(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","rank":)", options.rank, R"(,"host":")",
        std::string(escaped_host.data(), escaped_host.size()), R"(","level":"%l","msg":"%*"%&})"));
    logger->set_formatter(std::move(formatter));
  } else {
    logger->set_pattern(absl::StrCat("[%Y-%m-%d %H:%M:%S.%e] [rank ", options.rank, "] [%l] %v"));
  }
  logger->set_level(level);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  LoggingState& state = State();
  absl::MutexLock lock(&state.mu);
  state.file = std::move(file);
  state.configured = level;
  state.debug_toggled = false;
  return absl::OkStatus();
}

void ReopenLogFile() {
  LoggingState& state = State();
  std::shared_ptr<AppendFileSink> file;
  {
    absl::MutexLock lock(&state.mu);
    file = state.file;
  }
  if (file == nullptr) {
    spdlog::info("SIGHUP: no log file to reopen (lines go to stderr; --log-file PATH names one)");
    return;
  }
  if (absl::Status s = file->Reopen(); !s.ok()) {
    spdlog::error("SIGHUP: cannot reopen {}; still appending to the file opened before: {}", file->path(),
                  std::string(s.message()));
    return;
  }
  spdlog::info("SIGHUP: reopened log file {}", file->path());
}

void ToggleDebugLogging() {
  LoggingState& state = State();
  absl::MutexLock lock(&state.mu);
  const auto name = [](spdlog::level::level_enum l) {
    const auto view = spdlog::level::to_string_view(l);
    return std::string(view.data(), view.size());
  };
  auto logger = spdlog::default_logger();
  const spdlog::level::level_enum verbose = std::min(state.configured, spdlog::level::debug);
  if (!state.debug_toggled) {
    logger->set_level(verbose);
    state.debug_toggled = true;
    logger->info("SIGUSR1: log level {} (configured: {}); SIGUSR1 again returns to {}", name(verbose),
                 name(state.configured), name(state.configured));
  } else {
    // Said before the level goes back up, so that the line is not filtered out.
    logger->info("SIGUSR1: log level back to {}", name(state.configured));
    logger->set_level(state.configured);
    state.debug_toggled = false;
  }
}

}  // namespace ckptd
