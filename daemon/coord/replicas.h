// Replicas of data files on partner hosts (config `replicas`, local storage): where
// each rank's data file is copied, and the interface through which the coordinator
// copies a file from the rank that wrote it. Placement is a pure function; the copier
// is implemented over the peer channel (peer/peer.h) and called on the
// coordinator's thread during a commit.
#ifndef CKPTD_DAEMON_COORD_REPLICAS_H_
#define CKPTD_DAEMON_COORD_REPLICAS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/coord/step_registry.h"
#include "daemon/io/file_system.h"

namespace ckptd {

// copies[r]: the ranks that hold a copy of rank r's data file, in the order a reader
// tries them after rank r itself. domains[r] is rank r's failure domain (its host name
// unless the config maps the host to a rack). No two of a file's replicas, the
// original included, share a domain. Rank r's copies go to the first ranks after r
// (wrapping) whose domains are new to that file, so copies spread evenly around the
// ring. FAILED_PRECONDITION when there are too few domains for `replicas` copies.
absl::StatusOr<std::vector<std::vector<int>>> PlaceReplicas(const std::vector<std::string>& domains,
                                                            int replicas);

class ShardCopier {
 public:
  virtual ~ShardCopier() = default;
  // Copies file `name` of step `key` (a data file, ckpt.index or ckptd.json) from rank
  // `from` to `dest` on `fs`, and syncs it; gives up at `deadline`. With `pending`,
  // `name` is `from`'s own data file in its temp directory (every rank has written its
  // file and none has published); otherwise the file in `from`'s step directory.
  virtual absl::Status CopyStepFile(const StepKey& key, const std::string& name, int from, bool pending,
                                    FileSystem* fs, const std::string& dest, absl::Time deadline) = 0;
  // Reads [offset, offset + length) of that file (named and found as by CopyStepFile)
  // into `dst`: the parity phase's reads of the group's pending data files.
  virtual absl::Status ReadStepRange(const StepKey& key, const std::string& name, int from, bool pending,
                                     int64_t offset, int64_t length, char* dst, absl::Time deadline) = 0;
  // Rebuilds saving rank `shard`'s data file of committed step `key` from its parity
  // group, as ckptd.json in `step_dir` (on `fs`) describes it, into `dest` on `fs`,
  // synced: the repair of a host that lost its disk.
  virtual absl::Status RebuildDataFile(const StepKey& key, const std::string& step_dir, int shard,
                                       int num_shards, FileSystem* fs, const std::string& dest,
                                       absl::Time deadline) = 0;
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_COORD_REPLICAS_H_
