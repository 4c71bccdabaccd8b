// What every ckptctl subcommand shares: exit codes, error and JSON output, byte and
// time formatting, the --tensors filter, a progress line and the flags that reach a
// daemon. ckptctl is single-threaded; nothing here is meant for threads.
#ifndef CKPTD_CLIENT_CKPTCTL_CLI_H_
#define CKPTD_CLIENT_CKPTCTL_CLI_H_

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckptd/client.h"
#include "daemon/io/file_system.h"
#include "daemon/io/private_dir.h"
#include "daemon/layout/box.h"

namespace ckptctl {

using json = nlohmann::json;

// Printed under every subcommand's help; docs/operations.md has the same table.
extern const char kExitCodes[];
enum ExitCode {
  kOk = 0,
  kFound = 1,        // a problem in the data (checksum, missing shard), or diff's differences
  kError = 2,        // usage or input: a bad flag, a path that is not a checkpoint
  kTimedOut = 3,     // wait's deadline or --timeout passed
  kUnreachable = 4,  // no daemon answered (not running, refused, gone mid-call)
};

// The exit code a failure means: DATA_LOSS kFound, this client's own deadline
// kTimedOut, UNAVAILABLE kUnreachable, anything else kError.
int ExitCodeFor(const absl::Status& status);
// Prints "ckptctl: <message>" to stderr and returns ExitCodeFor(status).
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

// The output files of export and restore, made so that a command that fails leaves
// nothing behind: every file goes through WriteFileWhole, and unless Keep() is called
// the destructor removes the files written and the directories created through it
// (the output directory too, when this created it). What it creates is no more
// readable than the directory it lands in (ckptd::ModesBeneath): an export into a
// checkpoint root is as private as the daemon's files.
class OutputFiles {
 public:
  explicit OutputFiles(std::string dir);
  ~OutputFiles();
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;

  // Creates files with the output's mode.
  ckptd::FileSystem* fs() const { return fs_.get(); }
  // `path` and its missing parents; those created are remembered.
  absl::Status CreateDirs(const std::string& path);
  absl::Status Write(const std::string& path, const std::function<absl::Status(const std::string&)>& write);
  void Keep() { kept_ = true; }

 private:
  std::string dir_;
  ckptd::CreateModes modes_;
  std::unique_ptr<ckptd::FileSystem> fs_;
  std::vector<std::string> written_, created_;
  bool kept_ = false;
};

// --address, the TLS files and --timeout, for the subcommands that talk to a daemon.
struct DaemonFlags {
  std::string address;
  ckptd::TlsFiles tls;
  std::string timeout_text;  // --timeout; empty: each call's own limit
  // `timeout_help` describes --timeout for this subcommand.
  void AddTo(CLI::App* app, const std::string& timeout_help = "");
  // Starts --timeout's clock; INVALID_ARGUMENT naming the flag for a bad duration.
  absl::Status Start();
  // How long the next call may take: what is left of --timeout, else `otherwise`.
  absl::Duration Left(absl::Duration otherwise) const;
  absl::StatusOr<std::unique_ptr<ckptd::Client>> Connect() const;

 private:
  std::optional<absl::Time> deadline_;
};

}  // namespace ckptctl

#endif  // CKPTD_CLIENT_CKPTCTL_CLI_H_
