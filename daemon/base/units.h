// Quantities as people write them: durations ("90s"), sizes ("16GiB") and byte rates
// ("200MB/s"), parsed and printed back. Shared by the daemon's configuration and
// ckptctl's flags, so that both accept the same units. Pure functions; any thread.
#ifndef CKPTD_DAEMON_BASE_UNITS_H_
#define CKPTD_DAEMON_BASE_UNITS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace ckptd {

// "90s", "500ms", "2m", "1h" or a bare number of seconds; positive.
absl::StatusOr<absl::Duration> ParseDuration(absl::string_view text);

// "200MB/s", "1.5GiB/s", "500M", a bare number of bytes per second, or 0 (no limit).
absl::StatusOr<int64_t> ParseByteRate(absl::string_view text);

// "16GiB", "512MB", "4096" (bytes), "0": the units of ParseByteRate without "/s".
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

// The shortest exact form ParseByteSize reads back: "16GiB", "512MiB", "1500000".
std::string FormatByteSize(int64_t bytes);

// The one way a duration measured in seconds is shown to people (the daemon's log,
// ckptctl's tables): "0.038 s", "12.500 s". Machine-readable outputs carry the double.
std::string FormatSeconds(double seconds);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_BASE_UNITS_H_
