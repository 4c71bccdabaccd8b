#include "daemon/peer/peer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ckptd/v1/wire.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/peer/rebuilt_file.h"
#include "daemon/service/validation.h"

namespace ckptd {
namespace {

// Largest range one ReadRange serves: the reader asks for one entry, or part of one,
// at a time; this bounds what a caller can make the daemon read in one call.
constexpr int64_t kMaxRangeBytes = int64_t{1} << 30;

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// A data file on another host, read through its daemon.
class RemoteFile final : public RandomAccessFile {
 public:
  RemoteFile(internal::Peer::Stub* stub, internal::ReadRangeRequest request, std::string token,
             std::string peer, absl::Time deadline, ReadCounts* counts = nullptr)
      : stub_(stub),
        request_(std::move(request)),
        token_(std::move(token)),
        peer_(std::move(peer)),
        deadline_(deadline),
        counts_(counts) {}

  // Asks for the size (a zero-length read): also proves the peer serves the file.
  absl::Status Open() { return Stream(0, 0, nullptr); }

  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    size_t received = 0;
    absl::Status s = Stream(offset, n, [&](absl::string_view piece) {
      std::memcpy(dst + received, piece.data(), piece.size());
      received += piece.size();
      return absl::OkStatus();
    });
    if (s.ok() && counts_ != nullptr) counts_->peer_bytes += n;
    return s;
  }
  uint64_t Size() const override { return size_; }

  // Hands [offset, offset + n) to `sink` piece by piece, in order; a failing sink
  // ends the call with its status. `sink` may be empty for a size-only call (n = 0).
  absl::Status Stream(uint64_t offset, size_t n,
                      const std::function<absl::Status(absl::string_view)>& sink) const {
    if (n > 0 && offset + n > size_) {
      return absl::OutOfRangeError(absl::StrCat("read [", offset, ", +", n, ") past the end of ", peer_,
                                                "'s data file (", size_, " bytes)"));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline_));
    ctx.AddMetadata(kJobTokenHeader, token_);
    internal::ReadRangeRequest request = request_;
    request.set_offset(static_cast<int64_t>(offset));
    request.set_length(static_cast<int64_t>(n));
    std::unique_ptr<grpc::ClientReader<internal::ReadRangeChunk>> reader = stub_->ReadRange(&ctx, request);
    internal::ReadRangeChunk chunk;
    size_t received = 0;
    bool first = true;
    while (reader->Read(&chunk)) {
      if (first && n == 0) size_ = static_cast<uint64_t>(chunk.file_size());
      first = false;
      if (chunk.data().size() > n - received) {
        ctx.TryCancel();
        return absl::DataLossError(absl::StrCat(peer_, " sent more bytes than asked for"));
      }
      if (!chunk.data().empty()) {
        if (absl::Status s = sink(chunk.data()); !s.ok()) {
          ctx.TryCancel();
          return s;
        }
      }
      received += chunk.data().size();
    }
    const grpc::Status finished = reader->Finish();
    if (finished.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
        finished.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::UnavailableError(absl::StrCat(peer_,
                                                 " did not answer a read of its data file within the "
                                                 "deadline: ",
                                                 finished.error_message()));
    }
    if (!finished.ok()) return Annotate(FromGrpc(finished), peer_);
    if (received != n) {
      return absl::DataLossError(absl::StrCat(peer_, " sent ", received, " of ", n, " bytes"));
    }
    return absl::OkStatus();
  }

 private:
  internal::Peer::Stub* stub_;
  internal::ReadRangeRequest request_;
  std::string token_;
  std::string peer_;
  absl::Time deadline_;
  ReadCounts* counts_;
  mutable uint64_t size_ = 0;  // set by Open, before the file is shared between threads
};

// On a shared root, a data file read for the job by another daemon (read_once);
// when that daemon stops answering mid-restore, the reads go to storage here.
class ReaderOrStorageFile final : public RandomAccessFile {
 public:
  ReaderOrStorageFile(std::unique_ptr<RandomAccessFile> remote, FileSystem* local, std::string path)
      : remote_(std::move(remote)), local_(local), path_(std::move(path)) {}
  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    if (!use_local_.load()) {
      absl::Status s = remote_->Read(offset, n, dst);
      if (!absl::IsUnavailable(s)) return s;
      spdlog::warn("{}; reading {} from storage here", std::string(s.message()), path_);
      use_local_ = true;
    }
    const RandomAccessFile* local = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (local_file_ == nullptr) {
        ASSIGN_OR_RETURN(local_file_, local_->NewRandomAccessFile(path_));
      }
      local = local_file_.get();  // set once, never replaced
    }
    return local->Read(offset, n, dst);
  }
  uint64_t Size() const override { return remote_->Size(); }

 private:
  std::unique_ptr<RandomAccessFile> remote_;
  FileSystem* local_;
  std::string path_;
  mutable std::atomic<bool> use_local_{false};
  mutable absl::Mutex mu_;
  mutable std::unique_ptr<RandomAccessFile> local_file_ ABSL_GUARDED_BY(mu_);
};

// A ReadRange request for file `name` of a step: a data file by its shard, or the
// index or ckptd.json by name.
internal::ReadRangeRequest StepFileRequest(const std::string& run, int64_t step, const std::string& name,
                                           bool pending) {
  internal::ReadRangeRequest request;
  request.set_run(run);
  request.set_step(step);
  request.set_pending(pending);
  int shard = 0, num_shards = 0;
  if (ParseDataFileName(name, &shard, &num_shards)) {
    request.set_shard(shard);
    request.set_num_shards(num_shards);
  } else {
    request.set_file(name.substr(name.rfind('/') + 1));
  }
  return request;
}

// File `name` of step `key` on rank `from`, opened for a copy or the parity phase
// (read around the serving daemon's read cache).
absl::StatusOr<std::unique_ptr<RemoteFile>> OpenForCopy(PeerDirectory* directory, const StepKey& key,
                                                        const std::string& name, int from, bool pending,
                                                        absl::Time deadline) {
  ASSIGN_OR_RETURN(internal::Peer::Stub * stub, directory->Stub(from));
  internal::ReadRangeRequest request = StepFileRequest(key.run, key.step, name, pending);
  request.set_copy(true);
  auto source = std::make_unique<RemoteFile>(stub, std::move(request), directory->token(),
                                             directory->Describe(from), deadline);
  RETURN_IF_ERROR(source->Open());
  return source;
}

}  // namespace

absl::Status StreamRange(const RandomAccessFile& file, int64_t offset, int64_t length,
                         const std::function<bool(absl::string_view piece)>& send) {
  if (offset < 0 || length < 0 || static_cast<uint64_t>(offset + length) > file.Size()) {
    return absl::OutOfRangeError(
        absl::StrCat("[", offset, ", +", length, ") is past the end of the file (", file.Size(), " bytes)"));
  }
  // Whole 4 KiB blocks: pieces after an aligned first one stay aligned.
  constexpr size_t kPiece = wire::kRestoreChunkBytes / 4096 * 4096;
  std::unique_ptr<char, decltype(&std::free)> buffer(static_cast<char*>(std::aligned_alloc(4096, kPiece)),
                                                     &std::free);
  if (buffer == nullptr) return absl::ResourceExhaustedError("no memory for a read buffer");
  for (int64_t done = 0; done < length;) {
    const int64_t n = std::min<int64_t>(length - done, static_cast<int64_t>(kPiece));
    RETURN_IF_ERROR(file.Read(static_cast<uint64_t>(offset + done), static_cast<size_t>(n), buffer.get()));
    if (!send(absl::string_view(buffer.get(), static_cast<size_t>(n)))) {
      return absl::CancelledError("the reader went away");
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::Status PeerDirectory::Set(int rank, std::vector<std::string> addresses, std::vector<std::string> hosts,
                                std::string token, TlsPem pem, std::string peer_name) {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = std::move(pem.ca);
  options.pem_private_key = std::move(pem.key);
  options.pem_cert_chain = std::move(pem.cert);
  absl::MutexLock lock(&mu_);
  rank_ = rank;
  addresses_ = std::move(addresses);
  hosts_ = std::move(hosts);
  token_ = std::move(token);
  credentials_ = grpc::SslCredentials(options);
  peer_name_ = std::move(peer_name);
  stubs_.resize(addresses_.size());
  ready_ = true;
  return absl::OkStatus();
}

bool PeerDirectory::ready() const {
  absl::MutexLock lock(&mu_);
  return ready_;
}

int PeerDirectory::rank() const {
  absl::MutexLock lock(&mu_);
  return rank_;
}

const std::string& PeerDirectory::token() const { return token_; }

bool PeerDirectory::TokenMatches(const std::string& token) const {
  absl::MutexLock lock(&mu_);
  return ready_ && !token_.empty() && token == token_;
}

absl::StatusOr<internal::Peer::Stub*> PeerDirectory::Stub(int r) {
  absl::MutexLock lock(&mu_);
  if (!ready_ || r < 0 || r >= static_cast<int>(addresses_.size())) {
    return absl::FailedPreconditionError(absl::StrCat("no address known for rank ", r));
  }
  if (stubs_[r] == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(wire::kMaxMessageBytes);
    if (!peer_name_.empty()) args.SetSslTargetNameOverride(peer_name_);
    stubs_[r] = internal::Peer::NewStub(grpc::CreateCustomChannel(addresses_[r], credentials_, args));
  }
  return stubs_[r].get();
}

std::string PeerDirectory::Describe(int r) const {
  absl::MutexLock lock(&mu_);
  if (r < 0 || r >= static_cast<int>(addresses_.size())) return absl::StrCat("rank ", r);
  return absl::StrCat("rank ", r, " (", hosts_[r], ", ", addresses_[r], ")");
}

void PeerDirectory::SetCopies(std::vector<std::vector<int>> copies) {
  absl::MutexLock lock(&mu_);
  copies_ = std::move(copies);
}

std::vector<int> PeerDirectory::Holders(int shard) const {
  absl::MutexLock lock(&mu_);
  std::vector<int> holders = {shard};
  if (shard >= 0 && shard < static_cast<int>(copies_.size())) {
    holders.insert(holders.end(), copies_[shard].begin(), copies_[shard].end());
  }
  return holders;
}

int PeerDirectory::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(addresses_.size());
}

std::optional<int> PeerDirectory::RankOfHost(const std::string& host) const {
  absl::MutexLock lock(&mu_);
  for (size_t r = 0; r < hosts_.size(); ++r) {
    if (hosts_[r] == host) return static_cast<int>(r);
  }
  return std::nullopt;
}

absl::Status PeerShardCopier::CopyStepFile(const StepKey& key, const std::string& name, int from,
                                           bool pending, FileSystem* fs, const std::string& dest,
                                           absl::Time deadline) {
  ASSIGN_OR_RETURN(std::unique_ptr<RemoteFile> source,
                   OpenForCopy(directory_, key, name, from, pending, deadline));
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, fs->NewDirectWritableFile(dest));
  for (uint64_t offset = 0; offset < source->Size();) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(source->Size() - offset, kMaxRangeBytes));
    RETURN_IF_ERROR(source->Stream(offset, n, [&](absl::string_view piece) { return out->Append(piece); }));
    offset += n;
  }
  RETURN_IF_ERROR(Annotate(out->Sync(), dest));
  return Annotate(out->Close(), dest);
}

absl::Status PeerShardCopier::ReadStepRange(const StepKey& key, const std::string& name, int from,
                                            bool pending, int64_t offset, int64_t length, char* dst,
                                            absl::Time deadline) {
  ASSIGN_OR_RETURN(std::unique_ptr<RemoteFile> source,
                   OpenForCopy(directory_, key, name, from, pending, deadline));
  for (int64_t done = 0; done < length;) {
    const int64_t n = std::min<int64_t>(length - done, kMaxRangeBytes);
    RETURN_IF_ERROR(source->Read(static_cast<uint64_t>(offset + done), static_cast<size_t>(n), dst + done));
    done += n;
  }
  return absl::OkStatus();
}

absl::Status PeerShardCopier::RebuildDataFile(const StepKey& key, const std::string& step_dir, int shard,
                                              int num_shards, FileSystem* fs, const std::string& dest,
                                              absl::Time deadline) {
  PeerFileSystem peers(fs, directory_, key.run, key.step, deadline, /*read_once=*/false,
                       /*shared_root=*/false, /*counts=*/nullptr);
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> source,
                   peers.NewRandomAccessFile(JoinPath(step_dir, DataPath("ckpt", shard, num_shards))));
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> out, fs->NewDirectWritableFile(dest));
  constexpr size_t kPiece = size_t{16} << 20;
  std::string buffer;
  for (uint64_t offset = 0; offset < source->Size();) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(source->Size() - offset, kPiece));
    buffer.resize(n);
    RETURN_IF_ERROR(source->Read(offset, n, buffer.data()));
    RETURN_IF_ERROR(Annotate(out->Append(buffer), dest));
    offset += n;
  }
  RETURN_IF_ERROR(Annotate(out->Sync(), dest));
  return Annotate(out->Close(), dest);
}

grpc::Status PeerService::ReadRange(grpc::ServerContext* ctx, const internal::ReadRangeRequest* request,
                                    grpc::ServerWriter<internal::ReadRangeChunk>* writer) {
  const auto token = ctx->client_metadata().find(kJobTokenHeader);
  if (token == ctx->client_metadata().end() ||
      !directory_->TokenMatches(std::string(token->second.data(), token->second.size()))) {
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "ReadRange is for the job's own daemons");
  }
  const absl::Status s = DoReadRange(*request, writer);
  return s.ok() ? grpc::Status::OK
                : grpc::Status(static_cast<grpc::StatusCode>(s.code()), BoundMessage(s.message()));
}

absl::Status PeerService::DoReadRange(const internal::ReadRangeRequest& request,
                                      grpc::ServerWriter<internal::ReadRangeChunk>* writer) {
  RETURN_IF_ERROR(ValidateRunName(request.run()));
  const bool own = request.shard() == directory_->rank();
  const bool step_file = !request.file().empty();
  int parity_rank = 0, parity_ranks = 0;
  if ((step_file && request.file() != IndexPath("ckpt") && request.file() != kCheckpointMetaFile &&
       !ParseParityFileName(request.file(), &parity_rank, &parity_ranks)) ||
      (!step_file &&
       (request.num_shards() < 1 || request.shard() < 0 || request.shard() >= request.num_shards())) ||
      (request.pending() && (step_file || !own)) || request.offset() < 0 || request.length() < 0 ||
      request.length() > kMaxRangeBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadRange: ", step_file ? request.file() : "shard ",
                     step_file ? "" : absl::StrCat(request.shard(), " of ", request.num_shards()), " [",
                     request.offset(), ", +", request.length(), ")", request.pending() ? " (pending)" : "",
                     " is not this daemon's to serve"));
  }
  const StepKey key{request.run(), request.step()};
  // Retention leaves the step alone while another host restores from it; a pending
  // step's temp directory stays until the commit that is copying from it ends.
  const StepRegistry::RestorePin pin(registry_, key);
  const std::string dir = request.pending() ? store_->TempDir(request.run(), request.step())
                                            : store_->StepDir(request.run(), request.step());
  const std::string path =
      step_file ? JoinPath(dir, request.file())
                : DataPath(CheckpointStore::Prefix(dir), request.shard(), request.num_shards());
  FileSystem* fs = request.copy() && copy_fs_ != nullptr ? copy_fs_ : store_->fs();
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, fs->NewRandomAccessFile(path));
  return Annotate(SendFileRange(*file, request.offset(), request.length(), writer), path);
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> PeerFileSystem::OpenRemote(int holder,
                                                                             const std::string& path) {
  ASSIGN_OR_RETURN(internal::Peer::Stub * stub, directory_->Stub(holder));
  auto file =
      std::make_unique<RemoteFile>(stub, StepFileRequest(run_, step_, path, /*pending=*/false),
                                   directory_->token(), directory_->Describe(holder), deadline_, counts_);
  RETURN_IF_ERROR(file->Open());
  return file;
}

int PeerFileSystem::ReaderOf(int shard, const std::vector<int>& holders) const {
  const int ranks = std::max(directory_->size(), 1);
  for (int holder : holders) {
    if (holder >= 0 && holder < ranks) return holder;
  }
  return shared_root_ ? shard % ranks : directory_->rank();
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> PeerFileSystem::NewRandomAccessFile(
    const std::string& path) {
  int shard = 0, num_shards = 0;
  if (ParseParityFileName(path, &shard, &num_shards)) {
    // Only on its writer's host (ckptctl verify reads them through a daemon).
    const CheckpointMeta& meta = MetaOf(DirName(path));
    if (meta.parity.parity == 0) return target()->NewRandomAccessFile(path);
    return OpenSaved(meta, shard, path);
  }
  if (!ParseDataFileName(path, &shard, &num_shards)) return target()->NewRandomAccessFile(path);
  const std::vector<int> holders = HoldersOf(shard, DirName(path));
  int asked = -1;  // the reader tried first, if not this daemon
  absl::Status asked_failure;
  if (read_once_) {
    const int reader = ReaderOf(shard, holders);
    if (reader != directory_->rank()) {
      absl::StatusOr<std::unique_ptr<RandomAccessFile>> remote = OpenRemote(reader, path);
      if (remote.ok() && shared_root_)
        return std::make_unique<ReaderOrStorageFile>(*std::move(remote), target(), path);
      if (remote.ok()) return remote;
      asked = reader;
      asked_failure = remote.status();
      spdlog::warn("run '{}' step {}: {} cannot serve rank {}'s data file, reading it here: {}", run_, step_,
                   directory_->Describe(reader), shard, std::string(remote.status().message()));
    }
  }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> local = target()->NewRandomAccessFile(path);
  if (!absl::IsNotFound(local.status()) || shared_root_) {
    return local;  // found here, or a shared root's answer
  }
  // The rank that wrote the file first, then the ranks that keep copies of it.
  absl::Status first_failure = asked < 0 ? local.status() : asked_failure;
  bool tried_remote = asked >= 0;
  for (int holder : holders) {
    if (holder == directory_->rank() || holder == asked) continue;  // not here: this host lost it
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> remote = OpenRemote(holder, path);
    if (remote.ok()) {
      if (holder != shard) {
        spdlog::warn("run '{}' step {}: reading rank {}'s data file from the copy on {}: {}", run_, step_,
                     shard, directory_->Describe(holder), std::string(first_failure.message()));
      }
      return remote;
    }
    if (!tried_remote) first_failure = remote.status();
    tried_remote = true;
  }
  if (MetaOf(DirName(path)).parity.parity > 0)
    return Rebuild(shard, num_shards, DirName(path), first_failure);
  return first_failure;
}

const CheckpointMeta& PeerFileSystem::MetaOf(const std::string& step_dir) {
  absl::MutexLock lock(&mu_);
  if (!meta_.has_value()) meta_ = ReadCheckpointMeta(target(), step_dir).value_or(CheckpointMeta{});
  return *meta_;  // set once, never replaced
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> PeerFileSystem::OpenSaved(const CheckpointMeta& meta,
                                                                            int saving_rank,
                                                                            const std::string& path) {
  const std::string host = meta.HostOf(saving_rank);
  if (host.empty() || host == HostName()) return target()->NewRandomAccessFile(path);
  std::optional<int> now = directory_->RankOfHost(host);
  if (!now.has_value()) return absl::NotFoundError(absl::StrCat(host, " is not in this job"));
  return OpenRemote(*now, path);
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> PeerFileSystem::Rebuild(int shard, int num_shards,
                                                                          const std::string& step_dir,
                                                                          const absl::Status& why) {
  const CheckpointMeta& meta = MetaOf(step_dir);
  const CheckpointMeta::ParityGroup* group = meta.ParityGroupOf(shard);
  if (group == nullptr) return why;
  ParitySources sources;
  for (int member : group->members) {
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> data =
        member == shard ? absl::NotFoundError("lost")
                        : OpenSaved(meta, member, JoinPath(step_dir, DataPath("ckpt", member, num_shards)));
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> parity =
        OpenSaved(meta, member, JoinPath(step_dir, ParityPath("ckpt", member, num_shards)));
    sources.data.push_back(data.ok() ? *std::move(data) : nullptr);
    sources.parity.push_back(parity.ok() ? *std::move(parity) : nullptr);
  }
  spdlog::warn(
      "run '{}' step {}: rank {}'s data file cannot be read from any host ({}); rebuilding it from "
      "its parity group",
      run_, step_, shard, std::string(why.message()));
  return NewRebuiltFile(meta, shard, std::move(sources), absl::StrCat("run '", run_, "' step ", step_));
}

std::vector<int> PeerFileSystem::HoldersOf(int shard, const std::string& step_dir) {
  const CheckpointMeta& meta = MetaOf(step_dir);
  std::vector<int> holders;
  auto add = [&](int saving_rank) {
    const std::string host = meta.HostOf(saving_rank);
    if (host.empty()) return;
    std::optional<int> now = directory_->RankOfHost(host);
    if (now.has_value() && std::find(holders.begin(), holders.end(), *now) == holders.end()) {
      holders.push_back(*now);
    }
  };
  add(shard);
  if (const CheckpointMeta::Host* writer = meta.FindHost(shard); writer != nullptr) {
    for (int copy : writer->copies) add(copy);
  }
  // A writer whose host is recorded but not in this job has no holder here; a step
  // that does not say guesses by rank.
  if (holders.empty() && meta.HostOf(shard).empty()) return directory_->Holders(shard);
  return holders;
}

}  // namespace ckptd
