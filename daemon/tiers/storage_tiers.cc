#include "daemon/tiers/storage_tiers.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/bundle/bundle.h"

namespace ckptd {
namespace {

// Data files are cached and counted; the index and ckptd.json are passed on.
ReadCache::Options ReadCacheOptions(const StorageTiersOptions& options) {
  ReadCache::Options cache;
  cache.capacity_bytes = options.read_cache_bytes;
  cache.linger = options.read_cache_linger;
  cache.data_file = [](const std::string& path) {
    int shard = 0, num_shards = 0;
    return ParseDataFileName(path, &shard, &num_shards);
  };
  return cache;
}

}  // namespace

StorageTiers::StorageTiers(StorageTiersOptions options)
    : options_(std::move(options)),
      read_cache_(ReadCacheOptions(options_)),
      memory_tier_(options_.memory_steps),
      commit_fs_(options_.storage, &read_cache_, CachingFileSystem::Reads::kPassedOn),
      restore_fs_(options_.storage, &read_cache_, CachingFileSystem::Reads::kCached),
      memory_fs_(&restore_fs_, &memory_tier_),
      commit_store_(&commit_fs_, options_.root),
      read_store_(options_.memory_steps > 0 ? static_cast<FileSystem*>(&memory_fs_) : &restore_fs_,
                  options_.root) {
  if (options_.drain != nullptr) {
    drain_store_.emplace(options_.drain, options_.drain_root);
    drainer_.emplace(&commit_store_, &*drain_store_, options_.drain_dir_mode, options_.drain_bandwidth);
  }
}

void StorageTiers::LogSetUp() const {
  if (drainer_.has_value()) {
    spdlog::info("drain to {}{}", options_.drain_root,
                 options_.drain_bandwidth > 0
                     ? absl::StrCat(" at up to ", options_.drain_bandwidth / 1000000, " MB/s")
                     : std::string());
  }
}

bool StorageTiers::ReadsThroughPeers() const {
  // Other hosts' data files are read through their daemons once the peer channel is
  // up (MeetPeers): on local disks, where they are not here, and with
  // read_once, where one daemon reads each file for all.
  return NeedsPeers() && peer_directory_.ready() && options_.num_ranks >= 2;
}

std::unique_ptr<StorageTiers::StepReads> StorageTiers::ForStep(const std::string& run, int64_t step,
                                                               absl::Time deadline, bool keep_all) const {
  auto reads = std::make_unique<StepReads>();
  FileSystem* fs = &reads->cached_.emplace(options_.storage, &read_cache_, CachingFileSystem::Reads::kCached,
                                           &reads->counts_, keep_all ? nullptr : &reads->interest_);
  if (options_.memory_steps > 0) fs = &reads->memory_.emplace(fs, &memory_tier_);
  if (ReadsThroughPeers()) {
    fs = &reads->peers_.emplace(fs, &peer_directory_, run, step,
                                std::min(deadline, absl::Now() + options_.peer_timeout), options_.read_once,
                                !local_storage(), &reads->counts_);
  }
  reads->top_ = fs;
  reads->others_hold_missing_files_ = local_storage() && !reads->through_peers();
  return reads;
}

std::vector<const CheckpointStore*> StorageTiers::CopiesBeyondRoot() const {
  if (!drain_store_.has_value()) return {};
  return {&*drain_store_};
}

std::vector<CommitObserver*> StorageTiers::CommitObservers(StagingArea* staging) {
  std::vector<CommitObserver*> observers;
  if (options_.memory_steps > 0) {
    staging->SetReclaimer([this] { return memory_tier_.EvictOldest(); });
    observers.push_back(&memory_observer_.emplace(&memory_tier_, staging));
  }
  return observers;
}

std::unique_ptr<StorageTiers::StepReads> StorageTiers::ForDrainedStep() const {
  auto reads = std::make_unique<StepReads>();
  reads->top_ = &reads->cached_.emplace(drain_store_->fs(), &read_cache_, CachingFileSystem::Reads::kCounted,
                                        &reads->counts_);
  return reads;
}

}  // namespace ckptd
