#include "daemon/base/logging.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace ckptd {

absl::Status SetUpLogging(int rank, const std::string& level) {
  spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat("unknown log level '", level, "'"));
  }
  auto logger = spdlog::stderr_logger_mt("ckptd");
  logger->set_pattern(absl::StrCat("[%Y-%m-%d %H:%M:%S.%e] [rank ", rank, "] [%l] %v"));
  logger->set_level(parsed);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace ckptd
