// Command-line parsing shared by ckptd and ckptctl: CLI11 underneath, but every
// usage error exits with the documented code 2 (not CLI11's own 1xx codes) and
// names the closest subcommand or flag when one was misspelt. Main thread only.
#ifndef CKPTD_DAEMON_BASE_COMMAND_LINE_H_
#define CKPTD_DAEMON_BASE_COMMAND_LINE_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>

#include "absl/strings/string_view.h"

namespace ckptd {

inline constexpr int kUsageError = 2;

// Parses argv into `app`. nullopt: go on. Otherwise the process's exit code: 0 after
// --help or --version (printed), kUsageError after printing "<program>: <what>" with
// "did you mean '...'" when a subcommand or flag is close to a known one.
std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv, absl::string_view program);

// Checks for numeric flags whose refusals say the allowed range in words ("must be
// an integer 1 or more, not '0'"), where CLI11's own print the limits of a double.
CLI::Validator IntegerAtLeast(int64_t min);
CLI::Validator NumberAtLeastZero();

}  // namespace ckptd

#endif  // CKPTD_DAEMON_BASE_COMMAND_LINE_H_
