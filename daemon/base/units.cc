#include "daemon/base/units.h"

#include <functional>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace ckptd {
namespace {

// A number followed by an optional unit of bytes; nullopt when either is not one.
std::optional<int64_t> BytesWithUnit(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  size_t digits = 0;
  while (digits < t.size() && (absl::ascii_isdigit(t[digits]) || t[digits] == '.')) ++digits;
  double number = 0;
  const absl::string_view unit = absl::StripAsciiWhitespace(t.substr(digits));
  static const std::map<std::string, double, std::less<>> kUnits = {
      {"", 1},    {"B", 1},    {"K", 1e3},      {"KB", 1e3},        {"M", 1e6},           {"MB", 1e6},
      {"G", 1e9}, {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  const auto factor = kUnits.find(unit);
  if (digits == 0 || !absl::SimpleAtod(t.substr(0, digits), &number) || factor == kUnits.end() ||
      number * factor->second >= 9e18) {
    return std::nullopt;
  }
  return static_cast<int64_t>(number * factor->second);
}

}  // namespace

absl::StatusOr<absl::Duration> ParseDuration(absl::string_view text) {
  double seconds = 0;
  if (absl::SimpleAtod(text, &seconds) && seconds > 0) {
    return absl::Seconds(seconds);
  }
  absl::Duration d;
  if (absl::ParseDuration(text, &d) && d > absl::ZeroDuration()) return d;
  return absl::InvalidArgumentError(absl::StrCat("bad duration '", text, "' (want e.g. 30s, 500ms, 2m)"));
}

absl::StatusOr<int64_t> ParseByteRate(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  absl::ConsumeSuffix(&t, "/s");
  const std::optional<int64_t> bytes = BytesWithUnit(t);
  if (!bytes.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad byte rate '", text, "' (want e.g. 200MB/s, 1GiB/s, or 0 for no limit)"));
  }
  return *bytes;
}

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  const std::optional<int64_t> bytes = BytesWithUnit(text);
  if (!bytes.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("bad size '", text, "' (want e.g. 1GiB, 512MB, 4096)"));
  }
  return *bytes;
}

std::string FormatByteSize(int64_t bytes) {
  for (const auto& [unit, factor] : {std::pair<const char*, int64_t>{"GiB", int64_t{1} << 30},
                                     {"MiB", int64_t{1} << 20},
                                     {"KiB", int64_t{1} << 10}}) {
    if (bytes != 0 && bytes % factor == 0) return absl::StrCat(bytes / factor, unit);
  }
  return absl::StrCat(bytes);
}

std::string FormatSeconds(double seconds) { return absl::StrFormat("%.3f s", seconds); }

}  // namespace ckptd
