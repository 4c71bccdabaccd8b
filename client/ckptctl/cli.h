// What every ckptctl subcommand shares: exit codes, error and JSON output, byte and
// time formatting, the --tensors filter, a progress line and the flags that reach a
// daemon. ckptctl is single-threaded; nothing here is meant for threads.
#ifndef CKPTD_CLIENT_CKPTCTL_CLI_H_
#define CKPTD_CLIENT_CKPTCTL_CLI_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/client.h"
#include "daemon/io/file_system.h"
#include "daemon/layout/box.h"

namespace ckptctl {

using json = nlohmann::json;

// Printed under every subcommand's help.
extern const char kExitCodes[];
enum ExitCode { kOk = 0, kFound = 1, kError = 2, kTimedOut = 3 };

// Prints "ckptctl: <message>" to stderr and returns kError.
int Error(const absl::Status& status);
// Names in a checkpoint are bytes; invalid UTF-8 is printed as U+FFFD, never a crash.
void PrintJson(const json& j);

std::string ShapeString(const ckptd::Shape& shape);
std::string HumanBytes(double bytes);
std::string LocalTime(double unix_seconds);

// The names matching `pattern` (ECMAScript regex, searched anywhere in the name;
// empty matches all), in their given order. INVALID_ARGUMENT for a bad pattern.
absl::StatusOr<std::vector<std::string>> FilterNames(std::vector<std::string> names,
                                                     const std::string& pattern);

// One committed step as `ckptctl ls` shows it.
struct StepRow {
  int64_t step = 0;
  std::string path{};
  int64_t bytes = 0;
  double created_unix = 0;    // 0: unknown (not a ckptd checkpoint)
  double commit_seconds = 0;  // 0: unknown
};
// Prints the rows (oldest first) as a table or a JSON array; the last is the latest.
void PrintSteps(const std::vector<StepRow>& rows, bool as_json);

// A progress bar on a terminal; a plain line every 10% when stderr is piped. Counts
// bytes, or things named `unit` ("steps") when one is given.
class Progress {
 public:
  explicit Progress(std::string what, std::string unit = "");
  void Update(int64_t done, int64_t total);

 private:
  std::string Amount(int64_t n, bool with_unit) const;

  std::string what_;
  std::string unit_;
  bool tty_;
  int last_tenth_ = -1;
};

// Writes `path` whole or not at all: write(PATH.partial), then a rename; the partial
// file is removed on failure. Output files of export and restore go through this.
absl::Status WriteFileWhole(ckptd::FileSystem* fs, const std::string& path,
                            const std::function<absl::Status(const std::string&)>& write);

// --address and the TLS files, for the subcommands that talk to a daemon.
struct DaemonFlags {
  std::string address;
  ckptd::TlsFiles tls;
  void AddTo(CLI::App* app);
  absl::StatusOr<std::unique_ptr<ckptd::Client>> Connect() const;
};

}  // namespace ckptctl

#endif  // CKPTD_CLIENT_CKPTCTL_CLI_H_
