// ckptctl verify and latest: every checksum of a step, or of every step of a run; the newest (good) step.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/ckptctl/commands.h"
#include "client/ckptctl/offline_common.h"
#include "client/tensor_export.h"
#include "client/tensor_values.h"
#include "daemon/base/dtype.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/bundle/crc32c.h"
#include "daemon/io/private_dir.h"
#include "daemon/layout/cast.h"
#include "daemon/store/checkpoint_store.h"

namespace ckptctl {
namespace {

// One checkpoint checked: every entry's bytes against its checksum.
struct Verified {
  std::string prefix;  // empty: no checkpoint found at all
  std::string open_problem;
  std::vector<std::string> problems;
  int64_t bytes = 0;
  int checked = 0;
  int parity_checked = 0;                   // parity files checked (redundancy: parity)
  std::vector<std::string> parity_missing;  // parity files that could not be read
  HostPart part;
  bool ok() const { return open_problem.empty() && problems.empty(); }
};

// A step saved with parity: each parity file that is readable here (through a daemon,
// every host's) against the size and crc32c ckptd.json recorded. A corrupt one is a
// problem: the data is intact, but a lost host would be rebuilt wrong (and caught,
// late, by the entries' checksums). One that cannot be read only lowers how many lost
// hosts the step survives: a note. Offline, another host's parity file is its own
// business.
void VerifyParity(const Context& ctx, const std::string& prefix, const ckptd::CheckpointMeta& meta,
                  const bool through_daemon, Verified* v) {
  for (const ckptd::CheckpointMeta::Host& h : meta.hosts) {
    if (h.parity_file.empty()) continue;
    const std::string path = ckptd::JoinPath(ckptd::DirName(prefix), h.parity_file);
    const std::string who =
        absl::StrCat(h.parity_file, " (rank ", h.rank, h.host.empty() ? "" : ", ", h.host, ")");
    auto file = ctx.checkpoints->NewRandomAccessFile(path);
    if (!file.ok()) {
      // A whole copy (a drained step, one root) needs no parity; a host's part does.
      if (through_daemon || (v->part.here.count(h.rank) > 0 && !v->part.elsewhere.empty())) {
        v->parity_missing.push_back(absl::StrCat(who, ": ", file.status().message()));
      }
      continue;
    }
    uint32_t crc = 0;
    std::string buffer;
    absl::Status read = absl::OkStatus();
    for (uint64_t offset = 0; offset < (*file)->Size() && read.ok();) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>((*file)->Size() - offset, uint64_t{8} << 20));
      buffer.resize(n);
      read = (*file)->Read(offset, n, buffer.data());
      crc = ckptd::crc32c::Extend(crc, buffer.data(), n);
      offset += n;
    }
    ++v->parity_checked;
    if (!read.ok()) {
      v->problems.push_back(absl::StrCat(who, ": ", read.message()));
    } else if (static_cast<int64_t>((*file)->Size()) != h.parity_bytes || crc != h.parity_crc32c) {
      v->problems.push_back(absl::StrFormat(
          "%s: %d bytes with crc32c %08x, but ckptd.json recorded %d bytes with %08x: the parity is corrupt, "
          "so a lost host of its group could not be rebuilt (the data files are checked separately)",
          who, (*file)->Size(), crc, h.parity_bytes, h.parity_crc32c));
    }
  }
}

Verified VerifyPrefix(const Context& ctx, const std::string& arg, bool progress_on_tty) {
  Verified v;
  auto reader = OpenCheckpoint(ctx, arg, &v.prefix);
  if (!reader.ok()) {
    v.open_problem = std::string(reader.status().message());
    return v;
  }
  Progress progress("verify");
  // One host's part of a local-storage checkpoint: check what is here, say where the
  // rest is. A part with none of the data files is a problem, not a pass.
  const ckptd::CheckpointMeta meta = ReadMeta(ctx, v.prefix);
  v.part = PartHere(ctx, v.prefix, meta);
  if (!v.part.elsewhere.empty() && v.part.here.empty()) {
    v.problems.push_back(v.part.Note(v.prefix));
    return v;
  }
  v.checked = (*reader)->VerifyAll(
      &v.problems, &v.bytes,
      [&](int64_t done, int64_t total) {
        if (progress_on_tty) progress.Update(done, total);
      },
      v.part.here);
  VerifyParity(ctx, v.prefix, meta, ctx.checkpoints != ckptd::PosixFileSystem(), &v);
  return v;
}

json VerifiedJson(const Verified& v) {
  if (!v.open_problem.empty()) return {{"prefix", v.prefix}, {"ok", false}, {"problems", {v.open_problem}}};
  json out = {{"prefix", v.prefix},   {"ok", v.ok()},     {"complete", v.part.elsewhere.empty()},
              {"entries", v.checked}, {"bytes", v.bytes}, {"problems", v.problems}};
  if (!v.part.elsewhere.empty()) out["shards_elsewhere"] = v.part.elsewhere;
  if (v.parity_checked > 0 || !v.parity_missing.empty()) {
    out["parity_files_checked"] = v.parity_checked;
    out["parity_files_missing"] = v.parity_missing;
  }
  return out;
}

void PrintVerified(const Verified& v) {
  if (!v.open_problem.empty()) {
    std::cerr << "ckptctl verify: " << v.open_problem << std::endl;
    return;
  }
  for (const std::string& line : v.problems) std::cerr << "FAIL " << line << std::endl;
  if (!v.part.elsewhere.empty() && !v.part.here.empty())
    std::printf("note: %s\n", v.part.Note(v.prefix).c_str());
  for (const std::string& missing : v.parity_missing) {
    std::printf("note: parity file %s: the step survives one lost host fewer in that group\n",
                missing.c_str());
  }
  if (v.parity_checked > 0) std::printf("%d parity file(s) checked\n", v.parity_checked);
  std::printf("%s: %d entries checked, %lld bytes, %zu problem(s)\n", v.prefix.c_str(), v.checked,
              static_cast<long long>(v.bytes), v.problems.size());
}

// The committed steps of a run directory, or why there are none to look at.
absl::StatusOr<std::vector<int64_t>> RunSteps(const std::string& run_dir) {
  auto dir = OpenRunDir(run_dir);
  if (!dir.ok()) return dir.status();
  const std::vector<int64_t> steps = CommittedSteps(ckptd::PosixFileSystem(), run_dir);
  if (steps.empty()) {
    return absl::NotFoundError(
        absl::StrCat(run_dir, " holds no committed step (want a run directory <root>/<run>)"));
  }
  return steps;
}

}  // namespace

int Verify(const Context& ctx, const std::string& arg, bool as_json, bool quiet) {
  const Verified v = VerifyPrefix(ctx, arg, !quiet && !as_json);
  if (v.prefix.empty()) return Error(absl::NotFoundError(v.open_problem));  // no checkpoint there at all
  if (as_json) {
    if (!v.open_problem.empty()) std::cerr << "ckptctl verify: " << v.open_problem << std::endl;
    PrintJson(VerifiedJson(v));
  } else {
    PrintVerified(v);
  }
  return v.ok() ? kOk : kFound;
}

int VerifyAll(const Context& ctx, const std::string& run_dir, bool as_json, bool quiet) {
  auto steps = RunSteps(run_dir);
  if (!steps.ok()) return Error(steps.status());
  json out = json::array();
  int failed = 0;
  for (int64_t step : *steps) {
    const Verified v = VerifyPrefix(ctx, StepPrefix(run_dir, step), !quiet && !as_json);
    failed += v.ok() ? 0 : 1;
    if (as_json) {
      json j = VerifiedJson(v);
      j["step"] = step;
      out.push_back(j);
    } else {
      PrintVerified(v);
    }
  }
  if (as_json) {
    PrintJson({{"run_dir", run_dir}, {"ok", failed == 0}, {"steps", out}});
  } else {
    std::printf("%zu step(s) verified, %d with problems\n", steps->size(), failed);
  }
  return failed == 0 ? kOk : kFound;
}

int Latest(const Context& ctx, const std::string& run_dir, bool verified, bool as_json) {
  auto steps = RunSteps(run_dir);
  if (!steps.ok()) return Error(steps.status());
  std::vector<std::pair<int64_t, std::string>> prefixes;
  for (int64_t step : *steps) prefixes.emplace_back(step, StepPrefix(run_dir, step));
  return Latest(ctx, prefixes, run_dir, verified, as_json);
}

int Latest(const Context& ctx, const std::vector<std::pair<int64_t, std::string>>& steps,
           const std::string& what, bool verified, bool as_json) {
  if (steps.empty()) return Error(absl::NotFoundError(absl::StrCat(what, " has no committed step")));
  json skipped = json::array();
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const auto& [step, prefix] = *it;
    if (verified) {
      const Verified v = VerifyPrefix(ctx, prefix, false);
      if (!v.ok()) {
        const std::string why = v.open_problem.empty() ? v.problems.front() : v.open_problem;
        skipped.push_back({{"step", step}, {"problem", why}});
        if (!as_json)
          std::fprintf(stderr, "skipped step %lld: %s\n", static_cast<long long>(step), why.c_str());
        continue;
      }
    }
    if (as_json) {
      PrintJson({{"step", step},
                 {"path", ckptd::DirName(prefix)},
                 {"prefix", prefix},
                 {"verified", verified},
                 {"skipped", skipped}});
    } else {
      std::printf("%lld %s\n", static_cast<long long>(step), ckptd::DirName(prefix).c_str());
    }
    return kOk;
  }
  if (as_json) PrintJson({{"step", nullptr}, {"verified", verified}, {"skipped", skipped}});
  std::cerr << "ckptctl latest: no step of " << what << " verifies" << std::endl;
  return kFound;
}

}  // namespace ckptctl
