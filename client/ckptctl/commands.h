// ckptctl's subcommands, one function each, called by main after CLI11 has parsed
// the flags. Each prints its result (text or, with as_json, one JSON document) and
// returns an ExitCode (cli.h).
//
// Offline commands (one file each: ls_command.cc, inspect_command.cc, ...) read
// checkpoint files directly through the format library and work on any TensorFlow V2
// checkpoint. Online commands (online_commands.cc) talk to a running daemon through
// the client library only, so they work wherever the daemon is reachable, whether or
// not its files are visible.
#ifndef CKPTD_CLIENT_CKPTCTL_COMMANDS_H_
#define CKPTD_CLIENT_CKPTCTL_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/ckptctl/cli.h"
#include "daemon/bundle/bundle.h"
#include "daemon/io/file_system.h"

namespace ckptctl {

// What the offline commands read checkpoint files through: this machine's file
// system, or a daemon's (DaemonFileSystem) for --address. Files a command writes
// (export's) are always this machine's.
struct Context {
  ckptd::FileSystem* checkpoints = ckptd::PosixFileSystem();
};

// The checkpoint `arg` names (see below), opened through ctx.checkpoints;
// *prefix_out: its bundle prefix.
absl::StatusOr<std::unique_ptr<ckptd::BundleReader>> OpenCheckpoint(const Context& ctx,
                                                                    const std::string& arg,
                                                                    std::string* prefix_out);

// `checkpoint` arguments accept a bundle prefix, a step directory, a run directory
// (its newest step) or a directory holding exactly one PREFIX.index.
// show_orphans: also the temp and half-deleted step directories a crash left.
int Ls(const Context& ctx, const std::string& run_dir, bool as_json, bool show_orphans = false);
struct InspectOptions {
  std::string values{};  // print this tensor's elements instead of the listing
  bool stats = false;    // min, max, mean, NaN and infinity counts of every numeric tensor
};
int Inspect(const Context& ctx, const std::string& checkpoint, const std::string& pattern, bool as_json,
            const InspectOptions& options = {});
int Verify(const Context& ctx, const std::string& checkpoint, bool as_json, bool quiet);
// Every committed step of a run directory; exit 1 if any has a problem.
int VerifyAll(const Context& ctx, const std::string& run_dir, bool as_json, bool quiet);
// The newest committed step of a run directory (with `verified`, the newest whose
// every checksum holds, naming the steps skipped); exit 1 when none verifies.
int Latest(const Context& ctx, const std::string& run_dir, bool verified, bool as_json);
// The same over (step, prefix) pairs, ascending, read through ctx.checkpoints
//  (a daemon's, for --address); `what` names them in messages.
int Latest(const Context& ctx, const std::vector<std::pair<int64_t, std::string>>& steps,
           const std::string& what, bool verified, bool as_json);
// (step, prefix) of each committed step of `run`, ascending, read through the
// daemon (*client keeps the connection the prefixes need).
absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> DaemonSteps(
    const DaemonFlags& flags, const std::string& run, std::unique_ptr<ckptd::Client>* client);
struct ExportOptions {
  std::string format = "npy";  // or "safetensors"
  std::string out_dir{};
  std::string pattern{};
  bool force = false;  // replace the files of an earlier export (else ALREADY_EXISTS)
  // safetensors: above this many bytes, shards model-0000K-of-0000N.safetensors and
  // model.safetensors.index.json, as Hugging Face's save_pretrained writes them.
  int64_t max_shard_bytes = 5'000'000'000;
  bool quiet = false;  // no progress
};
// Each file is written whole (PATH.partial, renamed) or not at all.
int Export(const Context& ctx, const std::string& checkpoint, const ExportOptions& options, bool as_json);
struct DiffOptions {
  // Either set: numbers compare as numpy.isclose(b, a, rtol, atol, equal_nan=True)
  // (the unset one is 0); neither: tensors must be equal byte for byte.
  std::optional<double> atol{};
  std::optional<double> rtol{};
};
// Logical tensors: slicing does not matter, only dtype, shape and values.
int Diff(const Context& ctx, const std::string& a, const std::string& b, const std::string& pattern,
         const DiffOptions& options, bool as_json);
// A TF V2 checkpoint (prefix, step or run directory) or safetensors (a file, or a
// directory with model.safetensors or model.safetensors.index.json and its shards)
// becomes committed step `step` of the run directory <root>/<run> (storage: shared):
// verified, written under a temp name, verified again, renamed. Never replaces a step.
int Import(const Context& ctx, const std::string& src, const std::string& run_dir, int64_t step, bool quiet,
           bool as_json);
int Gc(const std::string& run_dir, int keep_last, int keep_every, bool dry_run, bool quiet, bool as_json);

// Connects (into *client) and names the step of `run` (nullopt: the newest committed)
// as a DaemonFileSystem prefix, for the offline commands to read through the daemon.
absl::StatusOr<std::string> DaemonPrefix(const DaemonFlags& flags, const std::string& run,
                                         std::optional<int64_t> step, std::unique_ptr<ckptd::Client>* client);

// ls through a daemon: its committed steps of `run`; sizes count every host's data.
int LsThroughDaemon(const DaemonFlags& flags, const std::string& run, bool as_json);

int Status(const DaemonFlags& flags, bool as_json);
// --timeout (default 10m) bounds the wait. A run the daemon has never seen is an
// error at once unless allow_unknown.
int Wait(const DaemonFlags& flags, const std::string& run, int64_t step, bool allow_unknown, bool as_json);
struct RestoreCommandOptions {
  std::optional<int64_t> step{};  // nullopt: the newest committed
  std::string pattern{};
  std::string out_dir{};
  // Floating tensors (float, double, half, bfloat16) become this dtype; others stay as
  // stored. Empty: as stored, bfloat16 as float (NumPy has no bfloat16).
  std::string dtype{};
  std::vector<std::string> dtype_for{};  // NAME=DTYPE: that tensor as that dtype, whatever it is
  // Without step: if the newest step fails its checksums, the newest older one that
  // restores whole; nothing of a failed attempt is left.
  bool fallback = false;
  bool force = false;  // write into an --out that is not empty
  bool quiet = false;  // no progress
};
// Restores into .npy files under options.out_dir, one request per GiB of tensors. A
// restore that fails leaves nothing behind: no file, no directory it created.
int Restore(const DaemonFlags& flags, const std::string& run, const RestoreCommandOptions& options,
            bool as_json);

}  // namespace ckptctl

#endif  // CKPTD_CLIENT_CKPTCTL_COMMANDS_H_
