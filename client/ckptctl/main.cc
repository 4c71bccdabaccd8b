// ckptctl: the operator's tool. This file only declares the command line; each
// offline subcommand lives in a file of its own (ls_command.cc, ...), the online ones
// in online_commands.cc.
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckptd/v1/wire.h"
#include "client/ckptctl/commands.h"
#include "client/ckptctl/daemon_file_system.h"
#include "client/ckptctl/offline_common.h"
#include "daemon/base/command_line.h"
#include "daemon/base/status.h"
#include "daemon/base/units.h"

namespace {

const char* kCheckpointHelp =
    "checkpoint prefix, step directory or run directory (its newest step); with --address, a run name";
const char* kRegexHelp = "only tensors whose name matches this regular expression (ECMAScript, searched)";

// Every flag's value; a flag several subcommands take has one home here.
struct Args {
  bool as_json = false, quiet = false, dry_run = false, show_orphans = false;
  bool all_steps = false, verified = false, allow_unknown = false;
  std::string target, second, pattern, out_dir, format = "npy", run;
  std::string max_shard_text = "5GB";
  int keep_last = 0, keep_every = 0;
  int64_t step = -1;
  ckptctl::DaemonFlags daemon;
  ckptctl::InspectOptions inspect_options;
  ckptctl::ExportOptions export_options;
  ckptctl::DiffOptions diff_options;
  ckptctl::RestoreCommandOptions restore_options;
};

// The subcommands, as declared; after parsing, the one given says parsed().
struct Commands {
  CLI::App *ls, *inspect, *verify, *latest, *exporter, *diff, *importer, *gc, *status, *wait, *restore;
};

// ls, inspect, verify, latest and export: the files of a checkpoint, or with
// --address the daemon's view of them.
void DeclareReaders(CLI::App& app, Args& a, Commands& c) {
  c.ls = app.add_subcommand(
      "ls", "list a run's committed steps (size, creation time, commit time, latest), or a root's runs");
  c.ls->add_option("DIR", a.target, "run directory (<root>/<run>) or a root; with --address, a run name")
      ->required();
  a.daemon.AddTo(c.ls);
  c.ls->add_flag("--json", a.as_json, "print JSON");
  c.ls->add_flag("--all", a.show_orphans, "also what a crash left: temp and half-deleted step directories");

  c.inspect = app.add_subcommand("inspect", "show tensors: dtype, shape, slices, bytes, shard, layout, mesh");
  c.inspect->add_option("PREFIX", a.target, kCheckpointHelp)->required();
  c.inspect->add_option("--tensors", a.pattern, kRegexHelp);
  c.inspect->add_option(
      "--values", a.inspect_options.values,
      "print this tensor's values (numpy-style, summarized above 1000 elements; every value "
      "with --json)");
  c.inspect->add_flag("--stats", a.inspect_options.stats,
                      "min, max, mean (of finite values), NaN and infinity counts of each numeric tensor");
  c.inspect->add_flag("--json", a.as_json, "print one JSON object");

  c.verify = app.add_subcommand("verify", "read every byte and check every checksum; exit 1 on any problem");
  c.verify->add_option("PREFIX", a.target, kCheckpointHelp)->required();
  c.verify->add_flag("--json", a.as_json, "print one JSON object");
  c.verify->add_flag("-q,--quiet", a.quiet, "no progress");
  c.verify->add_flag("--all", a.all_steps, "every committed step of the run directory");

  c.latest = app.add_subcommand("latest", "the newest committed step of a run directory");
  c.latest->add_option("DIR", a.target, "run directory (<root>/<run>); with --address, a run name")
      ->required();
  a.daemon.AddTo(c.latest);
  c.latest->add_flag("--verified", a.verified, "the newest step whose every checksum holds (reads them all)");
  c.latest->add_flag("--json", a.as_json, "print JSON");

  c.exporter =
      app.add_subcommand("export", "write tensors as whole arrays: .npy files or one model.safetensors");
  c.exporter->add_option("PREFIX", a.target, kCheckpointHelp)->required();
  c.exporter
      ->add_option("--format", a.format,
                   "npy (one file per tensor; bfloat16 widened to float32) or safetensors")
      ->check(CLI::IsMember({"npy", "safetensors"}));
  c.exporter->add_option("--out", a.out_dir, "output directory (created)")->required();
  c.exporter->add_option("--tensors", a.pattern, kRegexHelp);
  c.exporter->add_flag("--force", a.export_options.force, "replace the files of an earlier export in --out");
  c.exporter->add_option("--max-shard-size", a.max_shard_text,
                         "safetensors: split into model-0000K-of-0000N.safetensors with "
                         "model.safetensors.index.json above this size (5GB, 500MB, 2GiB)");
  c.exporter->add_flag("-q,--quiet", a.export_options.quiet, "no progress");
  c.exporter->add_flag("--json", a.as_json, "print JSON");
  for (CLI::App* sub : {c.inspect, c.verify, c.exporter}) {  // these also read through a daemon
    sub->add_option(
        "--step", a.step,
        "the step of a run directory, or with --address of the run (default: the newest committed)");
    a.daemon.AddTo(sub);
  }
}

// diff, import and gc: comparing checkpoints, and writing into a root.
void DeclareWriters(CLI::App& app, Args& a, Commands& c) {
  c.diff =
      app.add_subcommand("diff", "tensors added, removed or changed (dtype, shape, checksum) from A to B");
  // diff reads files only (no --address): both checkpoints must be visible here.
  const char* diff_help = "checkpoint prefix, step directory or run directory (its newest step)";
  c.diff->add_option("A", a.target, diff_help)->required();
  c.diff->add_option("B", a.second, diff_help)->required();
  c.diff->add_option("--tensors", a.pattern, kRegexHelp);
  c.diff
      ->add_option("--atol", a.diff_options.atol,
                   "compare numbers with this absolute tolerance (as numpy.isclose; NaN equals NaN)")
      ->check(ckptd::NumberAtLeastZero());
  c.diff
      ->add_option("--rtol", a.diff_options.rtol,
                   "compare numbers with this relative tolerance (of B's value)")
      ->check(ckptd::NumberAtLeastZero());
  c.diff->add_flag("--json", a.as_json, "print JSON");

  c.importer = app.add_subcommand(
      "import",
      "make a TensorFlow V2 checkpoint or safetensors a committed step of a run (trainers restore it)");
  c.importer
      ->add_option("SRC", a.target,
                   "TF checkpoint (prefix, step or run directory), a .safetensors file, or a directory with "
                   "model.safetensors or model.safetensors.index.json")
      ->required();
  c.importer->add_option("RUN_DIR", a.second, "run directory (<root>/<run>) on a shared root")->required();
  c.importer->add_option("--step", a.step, "the step it becomes (never replaces one)")->required();
  c.importer->add_flag("-q,--quiet", a.quiet, "no progress");
  c.importer->add_flag("--json", a.as_json, "print JSON");

  c.gc = app.add_subcommand("gc", "apply retention to a run directory (never removes the newest step)");
  c.gc->add_option("DIR", a.target, "run directory (<root>/<run>)")->required();
  c.gc->add_option("--keep-last", a.keep_last, "keep the newest N committed steps")
      ->required()
      ->check(ckptd::IntegerAtLeast(1));
  c.gc->add_option("--keep-every-n-steps,--keep-every", a.keep_every,
                   "also keep steps divisible by K (as the config's retention.keep_every_n_steps)")
      ->check(ckptd::IntegerAtLeast(0));
  c.gc->add_flag("--dry-run", a.dry_run, "only say what would be removed");
  c.gc->add_flag("-q,--quiet", a.quiet, "no progress");
  c.gc->add_flag("--json", a.as_json, "print JSON");
}

// status, wait and restore: through a running daemon only.
void DeclareOnline(CLI::App& app, Args& a, Commands& c) {
  c.status = app.add_subcommand("status", "a running job, every rank: pending steps, bytes, last commit");
  a.daemon.AddTo(c.status);
  c.status->add_flag("--json", a.as_json, "print JSON");

  c.wait = app.add_subcommand("wait", "block until RUN STEP is committed on every host (exit 1 if it fails)");
  c.wait->add_option("RUN", a.run, "run name")->required();
  c.wait->add_option("STEP", a.step, "step")->required();
  a.daemon.AddTo(c.wait, "how long to wait: 30s, 10m, 1h, or seconds (default 10m; exit 3 when it passes)");
  c.wait->add_flag("--allow-unknown", a.allow_unknown,
                   "wait even if the daemon has never seen the run (for a run about to start); without it, "
                   "an unknown run is an error at once");
  c.wait->add_flag("--json", a.as_json, "print JSON");

  c.restore = app.add_subcommand("restore", "restore tensors through the daemon into .npy files");
  c.restore->add_option("RUN", a.run, "run name")->required();
  c.restore->add_option("--step", a.step, "step (default: the newest committed)");
  c.restore->add_option("--tensors", a.pattern, kRegexHelp);
  c.restore->add_option("--out", a.out_dir, "output directory (created)")->required();
  c.restore->add_flag(
      "--fallback", a.restore_options.fallback,
      "without --step: if the newest step fails its checksums, the newest older one that passes");
  c.restore->add_option("--dtype", a.restore_options.dtype,
                        "float32, bfloat16 and float16 tensors become this (float32, float16; bfloat16 is "
                        "written as float32); others stay as stored (default: as stored)");
  c.restore->add_option("--dtype-for", a.restore_options.dtype_for,
                        "NAME=DTYPE: that tensor as that dtype, overriding --dtype (repeatable)");
  c.restore->add_flag("--force", a.restore_options.force,
                      "write into an --out that is not empty, replacing files of the same names");
  a.daemon.AddTo(c.restore);
  c.restore->add_flag("-q,--quiet", a.restore_options.quiet, "no progress");
  c.restore->add_flag("--json", a.as_json, "print JSON");
}

// Runs the subcommand given; its exit code.
int Dispatch(const Commands& c, Args& a) {
  ckptctl::Context ctx;
  if (c.wait->parsed() && a.daemon.timeout_text.empty()) a.daemon.timeout_text = "10m";
  if (absl::Status s = a.daemon.Start(); !s.ok()) return ckptctl::Error(s);
  if (c.ls->parsed()) {
    return c.ls->count("--address") > 0 ? ckptctl::LsThroughDaemon(a.daemon, a.target, a.as_json)
                                        : ckptctl::Ls(ctx, a.target, a.as_json, a.show_orphans);
  }
  // inspect, verify and export read through a daemon when given its address.
  std::unique_ptr<ckptd::Client> client;
  std::unique_ptr<ckptctl::DaemonFileSystem> through_daemon;
  for (CLI::App* sub : {c.inspect, c.verify, c.exporter}) {
    if (!sub->parsed() || sub->count("--address") == 0) continue;
    absl::StatusOr<std::string> prefix = ckptctl::DaemonPrefix(
        a.daemon, a.target, a.step >= 0 ? std::optional<int64_t>(a.step) : std::nullopt, &client);
    if (!prefix.ok()) return ckptctl::Error(prefix.status());
    through_daemon = std::make_unique<ckptctl::DaemonFileSystem>(client.get(), a.daemon);
    ctx.checkpoints = through_daemon.get();
    a.target = *prefix;
  }
  // Offline, --step picks a step of a run directory.
  for (CLI::App* sub : {c.inspect, c.verify, c.exporter}) {
    if (sub->parsed() && through_daemon == nullptr && a.step >= 0) {
      absl::StatusOr<std::string> prefix = ckptctl::StepOfRunDir(a.target, a.step);
      if (!prefix.ok()) return ckptctl::Error(prefix.status());
      a.target = *prefix;
    }
  }
  if (c.inspect->parsed()) return ckptctl::Inspect(ctx, a.target, a.pattern, a.as_json, a.inspect_options);
  if (c.verify->parsed() && a.all_steps) {
    if (a.step >= 0 || through_daemon != nullptr) {
      return ckptctl::Error(
          absl::InvalidArgumentError("verify --all takes a run directory, without --step or --address"));
    }
    return ckptctl::VerifyAll(ctx, a.target, a.as_json, a.quiet);
  }
  if (c.verify->parsed()) return ckptctl::Verify(ctx, a.target, a.as_json, a.quiet);
  if (c.latest->parsed() && c.latest->count("--address") > 0) {
    auto steps = ckptctl::DaemonSteps(a.daemon, a.target, &client);
    if (!steps.ok()) return ckptctl::Error(steps.status());
    through_daemon = std::make_unique<ckptctl::DaemonFileSystem>(client.get(), a.daemon);
    ctx.checkpoints = through_daemon.get();
    return ckptctl::Latest(ctx, *steps, absl::StrCat("run '", a.target, "'"), a.verified, a.as_json);
  }
  if (c.latest->parsed()) return ckptctl::Latest(ctx, a.target, a.verified, a.as_json);
  if (c.exporter->parsed()) {
    absl::StatusOr<int64_t> max_shard = ckptd::ParseByteRate(a.max_shard_text);
    if (!max_shard.ok() || *max_shard <= 0 || absl::EndsWith(a.max_shard_text, "/s")) {
      return ckptctl::Error(absl::InvalidArgumentError(
          absl::StrCat("--max-shard-size: bad size '", a.max_shard_text, "' (want e.g. 5GB, 500MB, 2GiB)")));
    }
    a.export_options.format = a.format;
    a.export_options.out_dir = a.out_dir;
    a.export_options.pattern = a.pattern;
    a.export_options.max_shard_bytes = *max_shard;
    return ckptctl::Export(ctx, a.target, a.export_options, a.as_json);
  }
  if (c.importer->parsed()) return ckptctl::Import(ctx, a.target, a.second, a.step, a.quiet, a.as_json);
  if (c.diff->parsed()) return ckptctl::Diff(ctx, a.target, a.second, a.pattern, a.diff_options, a.as_json);
  if (c.gc->parsed()) return ckptctl::Gc(a.target, a.keep_last, a.keep_every, a.dry_run, a.quiet, a.as_json);
  if (c.status->parsed()) return ckptctl::Status(a.daemon, a.as_json);
  if (c.wait->parsed()) return ckptctl::Wait(a.daemon, a.run, a.step, a.allow_unknown, a.as_json);
  if (c.restore->parsed()) {
    if (a.restore_options.fallback && a.step >= 0) {
      return ckptctl::Error(
          absl::InvalidArgumentError("restore: --fallback goes with the newest step, not --step"));
    }
    if (a.step >= 0) a.restore_options.step = a.step;
    a.restore_options.pattern = a.pattern;
    a.restore_options.out_dir = a.out_dir;
    return ckptctl::Restore(a.daemon, a.run, a.restore_options, a.as_json);
  }
  return ckptctl::kError;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ckptctl: list, inspect, verify, export and restore ckptd (and any TensorFlow V2) checkpoints"};
  app.footer(ckptctl::kExitCodes);
  app.require_subcommand(1);
  Args args;
  Commands commands{};
  DeclareReaders(app, args, commands);
  DeclareWriters(app, args, commands);
  DeclareOnline(app, args, commands);
  for (CLI::App* sub : app.get_subcommands({})) sub->footer(ckptctl::kExitCodes);
  app.set_version_flag("--version", ckptd::wire::kVersion);
  if (std::optional<int> ended = ckptd::ParseCommandLine(app, argc, argv, "ckptctl")) return *ended;
  return Dispatch(commands, args);
}
