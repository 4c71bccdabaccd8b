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
#include "daemon/base/command_line.h"
#include "daemon/base/config.h"
#include "daemon/base/status.h"

int main(int argc, char** argv) {
  CLI::App app{
      "ckptctl: list, inspect, verify, export and restore ckptd (and any TensorFlow V2) checkpoints"};
  app.footer(ckptctl::kExitCodes);
  app.require_subcommand(1);
  bool as_json = false, quiet = false, dry_run = false;
  std::string target, second, pattern, out_dir, format = "npy", run, dtype_name;
  int keep_last = 0, keep_every = 0;
  int64_t step = -1;
  std::string timeout_text = "10m";
  ckptctl::DaemonFlags daemon;
  const char* kCheckpointHelp =
      "checkpoint prefix, step directory or run directory (its newest step); with --address, a run name";
  const char* kRegexHelp = "only tensors whose name matches this regular expression (ECMAScript, searched)";

  CLI::App* ls = app.add_subcommand(
      "ls", "list a run's committed steps (size, creation time, commit time, latest), or a root's runs");
  ls->add_option("DIR", target, "run directory (<root>/<run>) or a root; with --address, a run name")
      ->required();
  daemon.AddTo(ls);
  ls->add_flag("--json", as_json, "print JSON");
  bool show_orphans = false;
  ls->add_flag("--all", show_orphans, "also what a crash left: temp and half-deleted step directories");

  CLI::App* inspect =
      app.add_subcommand("inspect", "show tensors: dtype, shape, slices, bytes, shard, layout, mesh");
  inspect->add_option("PREFIX", target, kCheckpointHelp)->required();
  inspect->add_option("--tensors", pattern, kRegexHelp);
  ckptctl::InspectOptions inspect_options;
  inspect->add_option("--values", inspect_options.values,
                      "print this tensor's values (numpy-style, summarized above 1000 elements; every value "
                      "with --json)");
  inspect->add_flag("--stats", inspect_options.stats,
                    "min, max, mean (of finite values), NaN and infinity counts of each numeric tensor");
  inspect->add_flag("--json", as_json, "print one JSON object");

  CLI::App* verify =
      app.add_subcommand("verify", "read every byte and check every checksum; exit 1 on any problem");
  verify->add_option("PREFIX", target, kCheckpointHelp)->required();
  verify->add_flag("--json", as_json, "print one JSON object");
  verify->add_flag("-q,--quiet", quiet, "no progress");
  bool all_steps = false, verified = false, fallback = false;
  verify->add_flag("--all", all_steps, "every committed step of the run directory");

  CLI::App* latest = app.add_subcommand("latest", "the newest committed step of a run directory");
  latest->add_option("DIR", target, "run directory (<root>/<run>); with --address, a run name")->required();
  daemon.AddTo(latest);
  latest->add_flag("--verified", verified, "the newest step whose every checksum holds (reads them all)");
  latest->add_flag("--json", as_json, "print JSON");

  CLI::App* exporter =
      app.add_subcommand("export", "write tensors as whole arrays: .npy files or one model.safetensors");
  exporter->add_option("PREFIX", target, kCheckpointHelp)->required();
  exporter
      ->add_option("--format", format,
                   "npy (one file per tensor; bfloat16 widened to float32) or safetensors")
      ->check(CLI::IsMember({"npy", "safetensors"}));
  exporter->add_option("--out", out_dir, "output directory (created)")->required();
  exporter->add_option("--tensors", pattern, kRegexHelp);
  ckptctl::ExportOptions export_options;
  exporter->add_flag("--force", export_options.force, "replace the files of an earlier export in --out");
  std::string max_shard_text = "5GB";
  exporter->add_option("--max-shard-size", max_shard_text,
                       "safetensors: split into model-0000K-of-0000N.safetensors with "
                       "model.safetensors.index.json above this size (5GB, 500MB, 2GiB)");
  exporter->add_flag("-q,--quiet", export_options.quiet, "no progress");
  exporter->add_flag("--json", as_json, "print JSON");
  for (CLI::App* sub : {inspect, verify, exporter}) {  // these also read through a daemon
    sub->add_option(
        "--step", step,
        "the step of a run directory, or with --address of the run (default: the newest committed)");
    daemon.AddTo(sub);
  }

  CLI::App* diff =
      app.add_subcommand("diff", "tensors added, removed or changed (dtype, shape, checksum) from A to B");
  diff->add_option("A", target, kCheckpointHelp)->required();
  diff->add_option("B", second, kCheckpointHelp)->required();
  diff->add_option("--tensors", pattern, kRegexHelp);
  ckptctl::DiffOptions diff_options;
  diff->add_option("--atol", diff_options.atol,
                   "compare numbers with this absolute tolerance (as numpy.isclose; NaN equals NaN)")
      ->check(CLI::NonNegativeNumber);
  diff->add_option("--rtol", diff_options.rtol, "compare numbers with this relative tolerance (of B's value)")
      ->check(CLI::NonNegativeNumber);
  diff->add_flag("--json", as_json, "print JSON");

  CLI::App* importer = app.add_subcommand(
      "import",
      "make a TensorFlow V2 checkpoint or safetensors a committed step of a run (trainers restore it)");
  importer
      ->add_option("SRC", target,
                   "TF checkpoint (prefix, step or run directory), a .safetensors file, or a directory with "
                   "model.safetensors or model.safetensors.index.json")
      ->required();
  importer->add_option("RUN_DIR", second, "run directory (<root>/<run>) on a shared root")->required();
  importer->add_option("--step", step, "the step it becomes (never replaces one)")->required();
  importer->add_flag("-q,--quiet", quiet, "no progress");
  importer->add_flag("--json", as_json, "print JSON");

  CLI::App* gc =
      app.add_subcommand("gc", "apply retention to a run directory (never removes the newest step)");
  gc->add_option("DIR", target, "run directory (<root>/<run>)")->required();
  gc->add_option("--keep-last", keep_last, "keep the newest N committed steps")
      ->required()
      ->check(CLI::PositiveNumber);
  gc->add_option("--keep-every-n-steps,--keep-every", keep_every,
                 "also keep steps divisible by K (as the config's retention.keep_every_n_steps)")
      ->check(CLI::NonNegativeNumber);
  gc->add_flag("--dry-run", dry_run, "only say what would be removed");
  gc->add_flag("-q,--quiet", quiet, "no progress");
  gc->add_flag("--json", as_json, "print JSON");

  CLI::App* status =
      app.add_subcommand("status", "a running job, every rank: pending steps, bytes, last commit");
  daemon.AddTo(status);
  status->add_flag("--json", as_json, "print JSON");

  CLI::App* wait =
      app.add_subcommand("wait", "block until RUN STEP is committed on every host (exit 1 if it fails)");
  wait->add_option("RUN", run, "run name")->required();
  wait->add_option("STEP", step, "step")->required();
  wait->add_option("--timeout", timeout_text,
                   "how long to wait: 30s, 10m, 1h, or seconds (exit 3 when it passes)");
  daemon.AddTo(wait);
  wait->add_flag("--json", as_json, "print JSON");

  CLI::App* restore = app.add_subcommand("restore", "restore tensors through the daemon into .npy files");
  restore->add_option("RUN", run, "run name")->required();
  restore->add_option("--step", step, "step (default: the newest committed)");
  restore->add_option("--tensors", pattern, kRegexHelp);
  restore->add_option("--out", out_dir, "output directory (created)")->required();
  restore->add_flag(
      "--fallback", fallback,
      "without --step: if the newest step fails its checksums, the newest older one that passes");
  restore->add_option(
      "--dtype", dtype_name,
      "restore float32/bfloat16/float16 tensors as float or half (default: as stored; bfloat16 as float)");
  daemon.AddTo(restore);
  restore->add_flag("-q,--quiet", quiet, "no progress");
  restore->add_flag("--json", as_json, "print JSON");

  for (CLI::App* sub : app.get_subcommands({})) sub->footer(ckptctl::kExitCodes);
  app.set_version_flag("--version", ckptd::wire::kVersion);
  if (std::optional<int> ended = ckptd::ParseCommandLine(app, argc, argv, "ckptctl")) return *ended;
  ckptctl::Context ctx;
  if (ls->parsed()) {
    return ls->count("--address") > 0 ? ckptctl::LsThroughDaemon(daemon, target, as_json)
                                      : ckptctl::Ls(ctx, target, as_json, show_orphans);
  }
  // inspect, verify and export read through a daemon when given its address.
  std::unique_ptr<ckptd::Client> client;
  std::unique_ptr<ckptctl::DaemonFileSystem> through_daemon;
  for (CLI::App* sub : {inspect, verify, exporter}) {
    if (!sub->parsed() || sub->count("--address") == 0) continue;
    absl::StatusOr<std::string> prefix = ckptctl::DaemonPrefix(
        daemon, target, step >= 0 ? std::optional<int64_t>(step) : std::nullopt, &client);
    if (!prefix.ok()) return ckptctl::Error(prefix.status());
    through_daemon = std::make_unique<ckptctl::DaemonFileSystem>(client.get());
    ctx.checkpoints = through_daemon.get();
    target = *prefix;
  }
  // Offline, --step picks a step of a run directory.
  for (CLI::App* sub : {inspect, verify, exporter}) {
    if (sub->parsed() && through_daemon == nullptr && step >= 0) target = ckptctl::StepOf(target, step);
  }
  if (inspect->parsed()) return ckptctl::Inspect(ctx, target, pattern, as_json, inspect_options);
  if (verify->parsed() && all_steps) {
    if (step >= 0 || through_daemon != nullptr) {
      return ckptctl::Error(
          absl::InvalidArgumentError("verify --all takes a run directory, without --step or --address"));
    }
    return ckptctl::VerifyAll(ctx, target, as_json, quiet);
  }
  if (verify->parsed()) return ckptctl::Verify(ctx, target, as_json, quiet);
  if (latest->parsed() && latest->count("--address") > 0) {
    auto steps = ckptctl::DaemonSteps(daemon, target, &client);
    if (!steps.ok()) return ckptctl::Error(steps.status());
    through_daemon = std::make_unique<ckptctl::DaemonFileSystem>(client.get());
    ctx.checkpoints = through_daemon.get();
    return ckptctl::Latest(ctx, *steps, absl::StrCat("run '", target, "'"), verified, as_json);
  }
  if (latest->parsed()) return ckptctl::Latest(ctx, target, verified, as_json);
  if (exporter->parsed()) {
    absl::StatusOr<int64_t> max_shard = ckptd::ParseByteRate(max_shard_text);
    if (!max_shard.ok() || *max_shard <= 0 || absl::EndsWith(max_shard_text, "/s")) {
      return ckptctl::Error(absl::InvalidArgumentError(
          absl::StrCat("--max-shard-size: bad size '", max_shard_text, "' (want e.g. 5GB, 500MB, 2GiB)")));
    }
    export_options.format = format;
    export_options.out_dir = out_dir;
    export_options.pattern = pattern;
    export_options.max_shard_bytes = *max_shard;
    return ckptctl::Export(ctx, target, export_options, as_json);
  }
  if (importer->parsed()) return ckptctl::Import(ctx, target, second, step, quiet, as_json);
  if (diff->parsed()) return ckptctl::Diff(ctx, target, second, pattern, diff_options, as_json);
  if (gc->parsed()) return ckptctl::Gc(target, keep_last, keep_every, dry_run, quiet, as_json);
  if (status->parsed()) return ckptctl::Status(daemon, as_json);
  if (wait->parsed()) {
    absl::StatusOr<absl::Duration> timeout = ckptd::ParseDuration(timeout_text);
    if (!timeout.ok()) return ckptctl::Error(ckptd::Annotate(timeout.status(), "--timeout"));
    return ckptctl::Wait(daemon, run, step, absl::ToDoubleSeconds(*timeout), as_json);
  }
  if (restore->parsed()) {
    if (fallback && step >= 0) {
      return ckptctl::Error(
          absl::InvalidArgumentError("restore: --fallback goes with the newest step, not --step"));
    }
    return ckptctl::Restore(daemon, run, step >= 0 ? std::optional<int64_t>(step) : std::nullopt, pattern,
                            out_dir, dtype_name, fallback, quiet, as_json);
  }
  return ckptctl::kError;
}
