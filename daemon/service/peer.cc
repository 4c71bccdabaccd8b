#include "daemon/service/peer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "ckptd/v1/wire.h"
#include "daemon/base/status.h"
#include "daemon/bundle/bundle.h"
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
             std::string peer, absl::Time deadline)
      : stub_(stub),
        request_(std::move(request)),
        token_(std::move(token)),
        peer_(std::move(peer)),
        deadline_(deadline) {}

  // Asks for the size (a zero-length read): also proves the peer serves the file.
  absl::Status Open() { return Call(0, 0, nullptr); }

  absl::Status Read(uint64_t offset, size_t n, char* dst) const override {
    if (offset + n > size_) {
      return absl::OutOfRangeError(absl::StrCat("read [", offset, ", +", n, ") past the end of ", peer_,
                                                "'s data file (", size_, " bytes)"));
    }
    return Call(offset, n, dst);
  }
  uint64_t Size() const override { return size_; }

 private:
  absl::Status Call(uint64_t offset, size_t n, char* dst) const {
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
      if (first && dst == nullptr) size_ = static_cast<uint64_t>(chunk.file_size());
      first = false;
      if (chunk.data().size() > n - received) {
        ctx.TryCancel();
        return absl::DataLossError(absl::StrCat(peer_, " sent more bytes than asked for"));
      }
      // A size-only call passes no buffer (and gets no data).
      if (!chunk.data().empty()) std::memcpy(dst + received, chunk.data().data(), chunk.data().size());
      received += chunk.data().size();
    }
    const grpc::Status finished = reader->Finish();
    if (finished.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
        finished.error_code() == grpc::StatusCode::UNAVAILABLE) {
      return absl::UnavailableError(absl::StrCat(peer_,
                                                 " did not answer a read of its data file within the "
                                                 "restore deadline: ",
                                                 finished.error_message()));
    }
    if (!finished.ok()) return Annotate(FromGrpc(finished), peer_);
    if (received != n) {
      return absl::DataLossError(absl::StrCat(peer_, " sent ", received, " of ", n, " bytes"));
    }
    return absl::OkStatus();
  }

  internal::Peer::Stub* stub_;
  internal::ReadRangeRequest request_;
  std::string token_;
  std::string peer_;
  absl::Time deadline_;
  mutable uint64_t size_ = 0;  // set by Open, before the file is shared between threads
};

}  // namespace

absl::Status StreamRange(const RandomAccessFile& file, int64_t offset, int64_t length,
                         const std::function<bool(const std::string& piece)>& send) {
  if (offset < 0 || length < 0 || static_cast<uint64_t>(offset + length) > file.Size()) {
    return absl::OutOfRangeError(
        absl::StrCat("[", offset, ", +", length, ") is past the end of the file (", file.Size(), " bytes)"));
  }
  std::string buffer;
  for (int64_t done = 0; done < length;) {
    const int64_t n = std::min<int64_t>(length - done, static_cast<int64_t>(wire::kRestoreChunkBytes));
    buffer.resize(static_cast<size_t>(n));
    RETURN_IF_ERROR(file.Read(static_cast<uint64_t>(offset + done), buffer.size(), buffer.data()));
    if (!send(buffer)) return absl::CancelledError("the reader went away");
    done += n;
  }
  return absl::OkStatus();
}

absl::Status PeerDirectory::Set(int rank, std::vector<std::string> addresses, std::vector<std::string> hosts,
                                std::string token, const TlsFilePaths& tls, FileSystem* fs) {
  ASSIGN_OR_RETURN(TlsPem pem, ReadTlsFiles(fs, tls));
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
    stubs_[r] = internal::Peer::NewStub(grpc::CreateCustomChannel(addresses_[r], credentials_, args));
  }
  return stubs_[r].get();
}

std::string PeerDirectory::Describe(int r) const {
  absl::MutexLock lock(&mu_);
  if (r < 0 || r >= static_cast<int>(addresses_.size())) return absl::StrCat("rank ", r);
  return absl::StrCat("rank ", r, " (", hosts_[r], ", ", addresses_[r], ")");
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
  if (request.shard() != directory_->rank() || request.num_shards() < 1 || request.offset() < 0 ||
      request.length() < 0 || request.length() > kMaxRangeBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ReadRange: shard ", request.shard(), " of ",
                                                   request.num_shards(), " [", request.offset(), ", +",
                                                   request.length(), ") is not this daemon's to serve"));
  }
  const StepKey key{request.run(), request.step()};
  // Retention leaves the step alone while another host restores from it.
  const StepRegistry::RestorePin pin(registry_, key);
  const std::string path = DataPath(CheckpointStore::Prefix(store_->StepDir(request.run(), request.step())),
                                    request.shard(), request.num_shards());
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, store_->fs()->NewRandomAccessFile(path));
  return Annotate(SendFileRange(*file, request.offset(), request.length(), writer), path);
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> PeerFileSystem::NewRandomAccessFile(
    const std::string& path) {
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> local = target()->NewRandomAccessFile(path);
  int shard = 0, num_shards = 0;
  if (!absl::IsNotFound(local.status()) || !ParseDataFileName(path, &shard, &num_shards) ||
      shard == directory_->rank()) {
    return local;  // found here, not a data file, or this host's own (then it is lost)
  }
  ASSIGN_OR_RETURN(internal::Peer::Stub * stub, directory_->Stub(shard));
  internal::ReadRangeRequest request;
  request.set_run(run_);
  request.set_step(step_);
  request.set_shard(shard);
  request.set_num_shards(num_shards);
  auto file = std::make_unique<RemoteFile>(stub, std::move(request), directory_->token(),
                                           directory_->Describe(shard), deadline_);
  RETURN_IF_ERROR(file->Open());
  return file;
}

}  // namespace ckptd
