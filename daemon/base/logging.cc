#include "daemon/base/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace ckptd {
namespace {

// %* in a pattern: the message as the body of a JSON string (quotes, backslashes and
// control bytes escaped), so that a JSON line stays one valid object whatever a
// message holds.
class JsonEscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    for (const char c : msg.payload) {
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
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonEscapedMessage>();
  }
};

}  // namespace

absl::Status SetUpLogging(int rank, const std::string& level, const std::string& format) {
  spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat("unknown log level '", level, "'"));
  }
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(absl::StrCat("unknown log format '", format, "' (text or json)"));
  }
  auto logger = spdlog::stderr_logger_mt("ckptd");
  if (format == "json") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<JsonEscapedMessage>('*').set_pattern(
        absl::StrCat(R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","rank":)", rank, R"(,"level":"%l","msg":"%*"})"));
    logger->set_formatter(std::move(formatter));
  } else {
    logger->set_pattern(absl::StrCat("[%Y-%m-%d %H:%M:%S.%e] [rank ", rank, "] [%l] %v"));
  }
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace ckptd
