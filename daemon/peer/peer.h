// Reading other hosts' shards through their daemons (storage: local).
//
// PeerDirectory: every rank's TCP address and the job token, learned once at start-up
// (Set, on the main thread, before any restore); read by any thread afterwards.
// PeerService: the gRPC service that serves byte ranges of this daemon's own data
// files to the other daemons; sync handlers on gRPC's pool, each touching only its
// own request's file. PeerFileSystem: a FileSystem for one restore that opens another
// host's data file as a remote file (ranged reads over gRPC, under the restore's
// deadline); everything else goes to the local file system. The bytes are checked by
// the entry checksums the bundle reader verifies, so a peer cannot pass off bad data.
#ifndef CKPTD_DAEMON_PEER_PEER_H_
#define CKPTD_DAEMON_PEER_PEER_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ckptd/internal/peer.grpc.pb.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/coord/replicas.h"
#include "daemon/coord/step_registry.h"
#include "daemon/io/file_system.h"
#include "daemon/io/read_cache.h"
#include "daemon/peer/credentials.h"
#include "daemon/store/checkpoint_store.h"

namespace ckptd {

inline constexpr char kJobTokenHeader[] = "ckptd-job-token";

// Reads [offset, offset + length) of `file` and hands it to `send` in pieces of at
// most wire::kRestoreChunkBytes, in order (from 4 KiB-aligned memory in whole blocks,
// so that the file is read with O_DIRECT where it can be); `send` returns false once the reader is
// gone (CANCELLED). OUT_OF_RANGE past the end of the file.
absl::Status StreamRange(const RandomAccessFile& file, int64_t offset, int64_t length,
                         const std::function<bool(absl::string_view piece)>& send);

// Answers a ranged read: the file's size in the first message, then the range's bytes
// (length 0: the size alone). Message: ReadRangeChunk or ReadStepFileResponse.
template <typename Message>
absl::Status SendFileRange(const RandomAccessFile& file, int64_t offset, int64_t length,
                           grpc::ServerWriter<Message>* writer) {
  Message message;
  message.set_file_size(static_cast<int64_t>(file.Size()));
  if (length == 0)
    return writer->Write(message) ? absl::OkStatus() : absl::CancelledError("the reader went away");
  return StreamRange(file, offset, length, [&](absl::string_view piece) {
    message.set_data(piece.data(), piece.size());
    const bool sent = writer->Write(message);
    message.clear_file_size();
    return sent;
  });
}

class PeerDirectory {
 public:
  // addresses[r]: rank r's "host:port"; hosts[r]: its host name (for messages). `tls`:
  // the certificate and key this daemon presents, and the CA peers' chain to; with
  // `peer_name`, peers' certificates must name it instead of the address dialled.
  absl::Status Set(int rank, std::vector<std::string> addresses, std::vector<std::string> hosts,
                   std::string token, TlsPem tls, std::string peer_name = "");
  bool ready() const;
  int rank() const;
  bool TokenMatches(const std::string& token) const;
  // A stub for rank r's daemon (channels are made once and shared).
  absl::StatusOr<internal::Peer::Stub*> Stub(int r);
  // "rank 1 (host1, host1:7070)".
  std::string Describe(int r) const;
  // Replicas: copies[r] are the ranks that keep a copy of rank r's data file.
  void SetCopies(std::vector<std::vector<int>> copies);
  // Where rank `shard`'s data file is kept: that rank first, then its copies.
  std::vector<int> Holders(int shard) const;
  // The rank running on `host` in this job, if any.
  std::optional<int> RankOfHost(const std::string& host) const;
  int size() const;  // ranks in the job
  const std::string& token() const;

 private:
  mutable absl::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  int rank_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> hosts_ ABSL_GUARDED_BY(mu_);
  std::string token_;  // written once in Set, before ready_; read-only afterwards
  std::shared_ptr<grpc::ChannelCredentials> credentials_ ABSL_GUARDED_BY(mu_);
  std::string peer_name_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<internal::Peer::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<int>> copies_ ABSL_GUARDED_BY(mu_);
};

// Copies another rank's files of a step from its daemon: the coordinator's replicas
// and repairs (called on the coordinator's thread).
class PeerShardCopier final : public ShardCopier {
 public:
  explicit PeerShardCopier(PeerDirectory* directory) : directory_(directory) {}
  absl::Status CopyStepFile(const StepKey& key, const std::string& name, int from, bool pending,
                            FileSystem* fs, const std::string& dest, absl::Time deadline) override;
  absl::Status ReadStepRange(const StepKey& key, const std::string& name, int from, bool pending,
                             int64_t offset, int64_t length, char* dst, absl::Time deadline) override;
  absl::Status RebuildDataFile(const StepKey& key, const std::string& step_dir, int shard, int num_shards,
                               FileSystem* fs, const std::string& dest, absl::Time deadline) override;

 private:
  PeerDirectory* directory_;
};

class PeerService final : public internal::Peer::Service {
 public:
  // Restores' ranges are read through store's file system; whole-file copies
  // (replicas, repair) through copy_fs when set, which bypasses the read cache.
  PeerService(const PeerDirectory* directory, CheckpointStore* store, StepRegistry* registry,
              FileSystem* copy_fs = nullptr)
      : directory_(directory), store_(store), registry_(registry), copy_fs_(copy_fs) {}
  grpc::Status ReadRange(grpc::ServerContext* ctx, const internal::ReadRangeRequest* request,
                         grpc::ServerWriter<internal::ReadRangeChunk>* writer) override;

 private:
  absl::Status DoReadRange(const internal::ReadRangeRequest& request,
                           grpc::ServerWriter<internal::ReadRangeChunk>* writer);
  const PeerDirectory* directory_;
  CheckpointStore* store_;
  StepRegistry* registry_;
  FileSystem* copy_fs_;
};

// Opens data files of the step directory `step_dir` that are not on this host from
// the daemon whose rank wrote them or, when that one cannot serve it, from the daemons
// that keep copies (replicas), in order; every call on a remote file ends by
// `deadline`. With `read_once`, a data file this daemon is not the designated reader
// of (see ReaderOf) comes from its reader's daemon even when this host could read it
// (a shared root, a replica's copy), so that each stored byte leaves storage once;
// storage here is the fallback when that daemon cannot serve it. Bytes received
// from peers are added to counts->peer_bytes (counts may be null). With parity, a data
// file no host can serve is rebuilt from its group's other data and parity files
// (RebuiltFile), read wherever they are.
class PeerFileSystem final : public FileSystemWrapper {
 public:
  PeerFileSystem(FileSystem* local, PeerDirectory* directory, std::string run, int64_t step,
                 absl::Time deadline, bool read_once, bool shared_root, ReadCounts* counts)
      : FileSystemWrapper(local),
        directory_(directory),
        run_(std::move(run)),
        step_(step),
        deadline_(deadline),
        read_once_(read_once),
        shared_root_(shared_root),
        counts_(counts) {}
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override;

 private:
  // The ranks of this job that hold rank `shard`'s data file of the step: found by
  // host name from the step's ckptd.json (the writer's host, then its copies' hosts),
  // so that a job on more, fewer or re-ranked hosts still finds them; the directory's
  // ranks when ckptd.json does not say.
  std::vector<int> HoldersOf(int shard, const std::string& step_dir);
  // The one rank that reads rank `shard`'s data file from storage for the job: its
  // first holder in this job; on a shared root, where every rank could, shard mod
  // ranks when no holder is in the job.
  int ReaderOf(int shard, const std::vector<int>& holders) const;
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenRemote(int holder, const std::string& path);
  // The step's ckptd.json (empty when it has none), read on first use.
  const CheckpointMeta& MetaOf(const std::string& step_dir);
  // File `path` (data or parity) of saving rank `saving_rank`: here when its host is
  // this one, else from the daemon on its host.
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> OpenSaved(const CheckpointMeta& meta, int saving_rank,
                                                              const std::string& path);
  // Rank `shard`'s data file rebuilt from its parity group; `why` is why it could not
  // be read as it is.
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> Rebuild(int shard, int num_shards,
                                                            const std::string& step_dir,
                                                            const absl::Status& why);

  PeerDirectory* directory_;
  std::string run_;
  int64_t step_;
  absl::Time deadline_;
  bool read_once_;
  bool shared_root_;
  ReadCounts* counts_;
  absl::Mutex mu_;
  std::optional<CheckpointMeta> meta_ ABSL_GUARDED_BY(mu_);  // read once per restore
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_PEER_PEER_H_
