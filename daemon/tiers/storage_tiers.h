// StorageTiers: where this daemon's checkpoint bytes live and how reads reach them,
// built once at start-up from the config. It is the one place that stacks the
// read-side tiers into file systems, in this order from the top:
//
//   peers (PeerFileSystem)       other hosts' data files, through their daemons
//                                 (storage: local, or read_once)
//   memory tier                   data files of the last memory_steps committed steps
//   read cache (CachingFileSystem) blocks shared by this host's restores and peer reads
//   storage                       the confined checkpoint root
//
// and, for a step the root cannot give whole, the drain (drain_to) beneath its own
// read cache counter. Callers ask for a step's stack (ForStep, ForDrainedStep) and
// never build these decorators themselves; a new tier is a new decorator added here.
//
// Owns the read cache, the memory tier, the peer directory and the stores over the
// root and the drain. The accessors are thread-safe; the stores' file systems and the
// peer directory are as thread-safe as documented on them. Every StepReads belongs to
// one call on one thread (its files may be read by that call's reading threads).
#ifndef CKPTD_DAEMON_TIERS_STORAGE_TIERS_H_
#define CKPTD_DAEMON_TIERS_STORAGE_TIERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/base/storage_mode.h"
#include "daemon/coord/commit_observer.h"
#include "daemon/coord/coordinator.h"
#include "daemon/coord/memory_tier.h"
#include "daemon/io/file_system.h"
#include "daemon/io/read_cache.h"
#include "daemon/peer/credentials.h"
#include "daemon/peer/peer.h"
#include "daemon/staging/staging_area.h"
#include "daemon/store/checkpoint_store.h"
#include "daemon/store/drain.h"

namespace ckptd {

struct StorageTiersOptions {
  FileSystem* storage = nullptr;  // the checkpoint root's file system (not owned)
  // The root's path.
  std::string root{};
  Storage mode = Storage::kShared;
  bool read_once = false;
  int num_ranks = 1;
  // The read cache: bytes it may hold (0: none) and how long an unused block stays.
  uint64_t read_cache_bytes = uint64_t{1} << 30;
  absl::Duration read_cache_linger = absl::Seconds(30);
  int memory_steps = 0;  // 0: no memory tier
  // Reads of other hosts' files end within this (or the call's deadline).
  absl::Duration peer_timeout = absl::Minutes(1);
  // The drain root's file system (not owned) and path; null without drain_to. The
  // drain's directories are made with drain_dir_mode; each host copies at up to
  // drain_bandwidth bytes per second (0: unthrottled).
  FileSystem* drain = nullptr;
  std::string drain_root{};
  uint32_t drain_dir_mode = 0700;
  int64_t drain_bandwidth = 0;
};

// What a daemon brings to the peer channel's set-up (StorageTiers::MeetPeers).
struct PeerSetUp {
  int rank = 0;
  std::string tcp_address{};  // as configured (tcp.address); "" without a listener
  int tcp_port = 0;           // the port it got (0: no listener)
  TlsFilePaths tls{};         // the operator's certificates, with tcp.address
  // Without tcp.address: where the job's own peer channel listens (see ChoosePeerHost),
  // and what starts it: a mutual-TLS listener for the peer service on `host`, any port,
  // with `pem`; returns the port.
  std::string peer_interface{};
  std::function<absl::StatusOr<int>(const std::string& host, const TlsPem& pem)> start_peer_listener{};
  std::map<std::string, std::string> failure_domains{};  // host -> domain; unmapped: its own
  int replicas = 0;
  // redundancy parity: `parity` (0: none) parity chunks per stripe in groups of about
  // `parity_group` hosts.
  int parity = 0;
  int parity_group = 0;
};

// The drain root (drain_to), claimed at start-up: made private (or open to `group`),
// and a file system confined beneath it. Shared by every host, so not locked: each
// rank copies its own files. `fs` is null without a drain; `path` is resolved.
struct DrainRootClaim {
  std::unique_ptr<FileSystem> fs;
  std::string path;
};
absl::StatusOr<DrainRootClaim> ClaimDrainRoot(const std::string& drain_to, gid_t group);

class StorageTiers {
 public:
  explicit StorageTiers(StorageTiersOptions options);
  StorageTiers(const StorageTiers&) = delete;
  StorageTiers& operator=(const StorageTiers&) = delete;

  // The store a commit writes through: its renames and deletions make the read cache
  // forget a step that is replaced or removed; its reads bypass the cache.
  CheckpointStore* commit_store() { return &commit_store_; }
  // The store that restores, listings and peer reads read committed steps through:
  // the read cache, then (with memory_steps) the memory tier.
  CheckpointStore* read_store() { return &read_store_; }
  const CheckpointStore* read_store() const { return &read_store_; }
  // The drain root (drain_to), or null.
  const CheckpointStore* drain_store() const { return drain_store_ ? &*drain_store_ : nullptr; }
  // The thread that copies committed steps into the drain root, or null without one.
  Drainer* drainer() { return drainer_ ? &*drainer_ : nullptr; }
  // memory_steps: the kept steps (none, with a limit of 0, without a memory tier).
  const MemoryTier* memory_tier() const { return &memory_tier_; }
  // Where else committed steps may be read, after the root, in the order a restore
  // tries them: the drain, when there is one.
  std::vector<const CheckpointStore*> CopiesBeyondRoot() const;
  ReadCache* read_cache() { return &read_cache_; }
  const ReadCache* read_cache() const { return &read_cache_; }
  // Where the other hosts' daemons listen (filled at start-up by MeetPeers).
  PeerDirectory* peer_directory() { return &peer_directory_; }
  bool local_storage() const { return options_.mode == Storage::kLocal; }
  // Whether the daemons need a peer channel: local disks, or read_once.
  bool NeedsPeers() const { return local_storage() || options_.read_once; }
  // Whether restores read other hosts' data files through their daemons (local
  // storage, or read_once, once the peers are known); then those daemons read this
  // host's files through this one.
  bool ReadsThroughPeers() const;

  // The file systems one read of a step goes through, built per call so that it
  // counts its own bytes. Not copyable or movable: its decorators point at its counts.
  class StepReads {
   public:
    StepReads() = default;
    StepReads(const StepReads&) = delete;
    StepReads& operator=(const StepReads&) = delete;
    FileSystem* fs() const { return top_; }
    // Whether other hosts' files come through their daemons.
    bool through_peers() const { return peers_.has_value(); }
    // Whether a data file missing here may simply be another host's (local disks,
    // read without the peers): then it is not evidence that the step was lost.
    bool others_hold_missing_files() const { return others_hold_missing_files_; }
    uint64_t storage_bytes() const { return counts_.storage_bytes.load(); }
    uint64_t peer_bytes() const { return counts_.peer_bytes.load(); }
    // Declares the stored ranges this read will take, so the read cache keeps blocks
    // another declared reader wants (see ReadCache::Declare). Once, before reading.
    void Declare(ReadCache* cache, std::vector<ReadCache::Range> ranges) {
      interest_ = cache->Declare(std::move(ranges));
    }

   private:
    friend class StorageTiers;
    ReadCounts counts_;
    // Outlives cached_, whose files point at it.
    ReadCache::Interest interest_;
    std::optional<CachingFileSystem> cached_;
    std::optional<MemoryTierFileSystem> memory_;
    std::optional<PeerFileSystem> peers_;
    FileSystem* top_ = nullptr;
    bool others_hold_missing_files_ = false;
  };
  // The stack for reading committed `step` of `run` from the root (within `deadline`).
  // With `keep_all`, the read cache keeps every block read; otherwise only those
  // another declared reader wants.
  std::unique_ptr<StepReads> ForStep(const std::string& run, int64_t step, absl::Time deadline,
                                     bool keep_all) const;
  // The stack for reading a step from the drain, which is whole in one directory:
  // counted, not cached (the cache follows the root's renames only).
  std::unique_ptr<StepReads> ForDrainedStep() const;

  // The tiers' commit-time work, for the coordinator to call (Coordinator::
  // AddObserver): with memory_steps, each committed step's data file kept in the
  // memory tier (copies of bytes in trainers' shared memory come from `staging`,
  // and a Save that needs the room evicts the oldest kept step). Call once, at start.
  std::vector<CommitObserver*> CommitObservers(StagingArea* staging);

  // The peer channel, with local storage or read_once (else nothing to do): every
  // daemon learns where the others listen and the job's token, over `coordinator`'s
  // collective (every rank must call it), so that a restore can read other hosts'
  // files through their daemons. With tcp.address on every host, over the operator's
  // listeners and certificates; on none, over a channel the job makes itself: each
  // rank makes a key, rank 0 an in-memory CA that certifies them all (only public keys
  // and certificates travel, over MPI), and each daemon starts a listener
  // (start_peer_listener) on the address ChoosePeerHost picks. Not needed, and not
  // made, for read_once alone when every rank runs on one host. tcp.address on some
  // hosts only is FAILED_PRECONDITION naming them. With replicas, places each host's
  // copies (other failure domains) and hands them and `copier` to the coordinator;
  // with parity, the groups (PlaceParityGroups), likewise.
  absl::Status MeetPeers(const PeerSetUp& mine, Coordinator& coordinator, ShardCopier* copier);

  // Logs, once the daemon serves, what the tiers add to the root (the drain).
  void LogSetUp() const;

 private:
  // MeetPeers' part for redundancy parity.
  absl::Status PlaceParity(const PeerSetUp& mine, const std::vector<std::string>& domains,
                           Coordinator& coordinator, ShardCopier* copier);

  StorageTiersOptions options_;
  mutable ReadCache read_cache_;
  MemoryTier memory_tier_;  // holds nothing with memory_steps 0
  CachingFileSystem commit_fs_;
  CachingFileSystem restore_fs_;
  MemoryTierFileSystem memory_fs_;
  CheckpointStore commit_store_;
  CheckpointStore read_store_;
  std::optional<CheckpointStore> drain_store_;
  std::optional<Drainer> drainer_;  // after the stores it copies between
  mutable PeerDirectory peer_directory_;
  std::optional<MemoryTierObserver> memory_observer_;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_TIERS_STORAGE_TIERS_H_
