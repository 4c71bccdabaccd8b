// Start-up reconciliation of local roots (Coordinator::ReconcileLocalSteps): steps
// that are not whole on every host are repaired from the hosts that still hold their
// files (with replicas) or taken back. Runs on the coordinator's thread before Run.
#include <spdlog/spdlog.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/coord/coordinator.h"

namespace ckptd {

struct Coordinator::StepHolders {
  std::set<int> ranks;                    // ranks that hold the step committed
  std::map<int, std::vector<int>> files;  // shard -> ranks that hold its data file
  int num_shards = 0;
  // With parity (from the holders' ckptd.json): P, each saving rank's group, and the
  // saving ranks whose parity files survive.
  int parity = 0;
  std::vector<int> group_of;
  std::set<int> parity_files;

  // Whether every data file that no host holds can be rebuilt from parity: in every
  // group, at most P members lack their data or parity file.
  bool RebuildableFromParity() const {
    if (parity == 0 || static_cast<int>(group_of.size()) != num_shards) return false;
    std::map<int, int> missing;
    for (int shard = 0; shard < num_shards; ++shard) {
      if (files.count(shard) == 0 || parity_files.count(shard) == 0) ++missing[group_of[shard]];
    }
    for (const auto& [group, count] : missing) {
      if (count > parity) return false;
    }
    return true;
  }
};

absl::Status Coordinator::ListHeldSteps(internal::StepList* mine) {
  ASSIGN_OR_RETURN(std::vector<std::string> runs, store_->ListRuns());
  for (const std::string& run : runs) {
    ASSIGN_OR_RETURN(std::vector<int64_t> steps, store_->ListSteps(run));
    for (int64_t step : steps) {
      internal::HeldStep* held = mine->add_steps();
      held->set_run(run);
      held->set_step(step);
      const std::string dir = store_->StepDir(run, step);
      ASSIGN_OR_RETURN(std::vector<std::string> names, store_->fs()->ListDir(dir));
      for (const std::string& name : names) {
        int shard = 0, num_shards = 0;
        if (ParseParityFileName(name, &shard, &num_shards)) held->add_parity_files(shard);
        if (!ParseDataFileName(name, &shard, &num_shards)) continue;
        held->add_data_files(shard);
        held->set_num_shards(num_shards);
      }
      // Only a step with parity files has its ckptd.json read: it may be megabytes.
      if (held->parity_files_size() == 0) continue;
      if (absl::StatusOr<CheckpointMeta> meta = ReadCheckpointMeta(store_->fs(), dir);
          meta.ok() && meta->parity.parity > 0) {
        held->set_parity(meta->parity.parity);
        std::vector<int> group_of(static_cast<size_t>(meta->num_hosts), 0);
        for (size_t g = 0; g < meta->parity.groups.size(); ++g) {
          for (int member : meta->parity.groups[g].members) {
            if (member >= 0 && member < meta->num_hosts) group_of[member] = static_cast<int>(g);
          }
        }
        held->mutable_group_of()->Add(group_of.begin(), group_of.end());
        if (held->num_shards() == 0) held->set_num_shards(meta->num_hosts);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::ReconcileLocalSteps() {
  if (options_.storage != Storage::kLocal) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + options_.commit_timeout;
  internal::StepList mine;
  const absl::Status listed = ListHeldSteps(&mine);
  // A rank that cannot list its root must not let the others keep steps it may lack.
  ASSIGN_OR_RETURN(absl::Status agreed, Vote(Where(listed), deadline));
  RETURN_IF_ERROR(agreed);
  ASSIGN_OR_RETURN(std::vector<std::string> all, collective_->AllGather(mine.SerializeAsString(), deadline));
  std::map<StepKey, StepHolders> held;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    internal::StepList list;
    if (!list.ParseFromString(all[r])) return absl::InternalError("a rank sent an unparsable step list");
    for (const internal::HeldStep& step : list.steps()) {
      StepHolders& h = held[{step.run(), step.step()}];
      h.ranks.insert(r);
      for (int shard : step.data_files()) h.files[shard].push_back(r);
      if (step.num_shards() > 0) h.num_shards = step.num_shards();
      h.parity_files.insert(step.parity_files().begin(), step.parity_files().end());
      if (step.parity() > 0) {
        h.parity = step.parity();
        h.group_of.assign(step.group_of().begin(), step.group_of().end());
      }
    }
  }
  const int ranks = collective_->size();
  // Every rank walks the same steps in the same order and decides the same way: the
  // votes below line up.
  for (const auto& [key, h] : held) {
    // Every data file survives somewhere; the job may run on more or fewer hosts than
    // the one that saved the step.
    bool repairable = copier_ != nullptr && h.num_shards > 0;
    for (int shard = 0; repairable && shard < h.num_shards; ++shard) repairable = h.files.count(shard) > 0;
    // With parity, a lost data file is rebuilt from its group instead.
    repairable = repairable || (copier_ != nullptr && h.RebuildableFromParity());
    if (repairable) {
      const absl::Status repaired = RepairStep(key, h, deadline);
      ASSIGN_OR_RETURN(absl::Status outcome, Vote(Where(repaired), deadline));
      if (outcome.ok()) continue;
      spdlog::warn("run '{}' step {} could not be repaired on every host ({}); taking it back", key.run,
                   key.step, std::string(outcome.message()));
    } else if (static_cast<int>(h.ranks.size()) == ranks) {
      continue;
    } else {
      std::vector<int> lost;
      std::vector<std::string> lost_files;
      for (int shard = 0; shard < h.num_shards; ++shard) {
        if (h.files.count(shard) > 0) continue;
        lost.push_back(shard);
        lost_files.push_back(DataPath("ckpt", shard, h.num_shards));
      }
      if (!lost.empty()) {
        // Every host remembers why, so that a restore of it says so on any of them.
        const std::string why = absl::StrCat("no host holds the data files of rank(s) ", JoinBounded(lost),
                                             " (", JoinBounded(lost_files), ") any more");
        if (absl::Status s = store_->MarkLost(key.run, key.step, why); !s.ok()) {
          spdlog::error("run '{}' step {}: recording it lost: {}", key.run, key.step,
                        std::string(s.message()));
        }
      }
      spdlog::warn(
          "run '{}' step {} is committed on {} of {} hosts (a crash between their publishes, or lost "
          "hosts{}); "
          "taking it back here",
          key.run, key.step, h.ranks.size(), ranks,
          lost.empty()
              ? ""
              : absl::StrCat(": no host holds the data files of rank(s) ", absl::StrJoin(lost, ", ")));
    }
    ASSIGN_OR_RETURN(bool committed, store_->Committed(key.run, key.step));
    if (committed) TakeBack(key);
  }
  return absl::OkStatus();
}

absl::Status Coordinator::RepairStep(const StepKey& key, const StepHolders& holders, absl::Time deadline) {
  const int rank = collective_->rank();
  FileSystem* fs = store_->fs();
  const bool have_step = holders.ranks.count(rank) > 0;
  // A step this host lacks is rebuilt in its temp directory and published like a
  // commit; files missing from a step it has are copied beside them and renamed in.
  const std::string dir = have_step ? store_->StepDir(key.run, key.step) : store_->TempDir(key.run, key.step);
  std::vector<std::string> fetched;
  if (!have_step) {
    RETURN_IF_ERROR(PrepareTempDir(key));
    for (const std::string& name : {IndexPath("ckpt"), std::string(kCheckpointMetaFile)}) {
      RETURN_IF_ERROR(copier_->CopyStepFile(key, name, *holders.ranks.begin(), /*pending=*/false, fs,
                                            JoinPath(dir, name), deadline));
      fetched.push_back(name);
    }
  }
  // The data files this host keeps: its own, and those ckptd.json says it keeps copies
  // of, found by host name (the saving job's ranks may have run elsewhere); a host
  // that was not part of the saving job keeps none and reads them through its peers.
  ASSIGN_OR_RETURN(CheckpointMeta meta, ReadCheckpointMeta(fs, dir));
  auto is_here = [&](int saving_rank) {
    const std::string host = meta.HostOf(saving_rank);
    return host.empty() ? saving_rank == rank : host == HostName();
  };
  std::set<int> wanted;
  for (const CheckpointMeta::Host& h : meta.hosts) {
    if (is_here(h.rank)) wanted.insert(h.rank);
    for (int copy : h.copies) {
      if (is_here(copy)) wanted.insert(h.rank);
    }
  }
  for (int shard : wanted) {
    const std::string name = DataPath("ckpt", shard, holders.num_shards);
    const std::string path = JoinPath(dir, name);
    if (fs->Exists(path)) continue;
    const std::string landing = have_step ? absl::StrCat(path, ".repair") : path;
    absl::Status copied =
        absl::DataLossError(absl::StrCat("no other host holds rank ", shard, "'s data file"));
    const auto held = holders.files.find(shard);
    if (held == holders.files.end() && holders.parity > 0) {
      copied = copier_->RebuildDataFile(key, dir, shard, holders.num_shards, fs, landing, deadline);
    }
    for (int from : held == holders.files.end() ? std::vector<int>() : held->second) {
      if (from == rank) continue;
      copied = copier_->CopyStepFile(key, name, from, /*pending=*/false, fs, landing, deadline);
      if (copied.ok()) break;
      spdlog::warn("run '{}' step {}: copying {} from rank {}: {}", key.run, key.step, name, from,
                   std::string(copied.message()));
    }
    RETURN_IF_ERROR(copied);
    if (have_step) RETURN_IF_ERROR(fs->Rename(landing, path));
    fetched.push_back(name);
  }
  if (fetched.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(fs->SyncDir(dir));
  if (!have_step) RETURN_IF_ERROR(Publish(key));
  spdlog::warn("run '{}' step {}: repaired on this host from its peers ({})", key.run, key.step,
               absl::StrJoin(fetched, ", "));
  return absl::OkStatus();
}

}  // namespace ckptd
