#include "ckptd/client.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckptd/v1/wire.h"
#include "client_internal.h"
#include "restore_stream.h"

namespace ckptd {
namespace client_internal {

std::chrono::system_clock::time_point DeadlineIn(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

void SetBox(v1::Box* box, const std::vector<int64_t>& start, const std::vector<int64_t>& length) {
  box->mutable_start()->Add(start.begin(), start.end());
  box->mutable_length()->Add(length.begin(), length.end());
}

void SetDeviceMemory(v1::DeviceMemory* out, const DeviceMemory& in) {
  out->set_ipc_handle(in.ipc_handle);
  out->set_offset(in.offset);
  out->set_device_uuid(in.device_uuid);
}

bool SharedMemoryUnusable(const absl::Status& s) {
  return absl::StrContains(s.message(), "shared_memory:") &&
         (s.code() == absl::StatusCode::kFailedPrecondition ||
          s.code() == absl::StatusCode::kPermissionDenied || s.code() == absl::StatusCode::kNotFound);
}

}  // namespace client_internal

using client_internal::DeadlineIn;
using client_internal::SetBox;
using client_internal::SetDeviceMemory;
using client_internal::SharedMemoryUnusable;

void KeepFreedMemoryForReuse() {
#ifdef M_MMAP_THRESHOLD
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest setting
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
#endif
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // gRPC core's own words when the deadline passes on this side; the daemon always
  // sends a message of its own.
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
      status.error_message() == "Deadline Exceeded") {
    return absl::DeadlineExceededError(absl::StrCat(
        kClientTimeout,
        ": ckptd did not answer within the call's timeout (the daemon may still finish the work)"));
  }
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

bool IsClientTimeout(const absl::Status& status) {
  return absl::IsDeadlineExceeded(status) && absl::StartsWith(status.message(), kClientTimeout);
}

Client::Client(std::shared_ptr<grpc::Channel> channel, bool local)
    : channel_(std::move(channel)), stub_(v1::Ckptd::NewStub(channel_)), local_(local) {}

namespace {

// Segments of this many bytes or more go in huge pages when the system has them to
// spare: the daemon then reads into them and writes from them with O_DIRECT in place
// (a 4 KiB-page segment's scattered pages make small disk requests, so the daemon
// copies through huge pages of its own), and first touch costs one fault per 2 MiB
// instead of per 4 KiB. Smaller ones would waste most of their last huge page.
constexpr size_t kHugePagesFrom = size_t{4} << 20;
constexpr size_t kHugePageBytes = size_t{2} << 20;

// CKPTD_HUGE_PAGES=0 (or off, no, false) keeps every segment in ordinary pages, for
// hosts whose huge pages belong to something else.
bool HugePagesAllowed() {
  static const bool allowed = [] {
    const char* env = std::getenv("CKPTD_HUGE_PAGES");
    if (env == nullptr) return true;
    const std::string value = absl::AsciiStrToLower(env);
    return !(value == "0" || value == "off" || value == "no" || value == "false");
  }();
  return allowed;
}

// A sealed memfd of `length` bytes mapped into this process, or an error with errno.
absl::StatusOr<std::pair<int, char*>> MapSealedMemfd(size_t length, unsigned extra_flags) {
  const int fd = ::memfd_create("ckptd-segment", MFD_CLOEXEC | MFD_ALLOW_SEALING | extra_flags);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  // Sealed against shrinking: the daemon maps it, and a truncation under its mapping
  // would kill it with SIGBUS (it refuses unsealed segments).
  if (::ftruncate(fd, static_cast<off_t>(length)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("shared-memory segment of ", length, " bytes: ", std::strerror(err)));
  }
  // A shared mapping of huge pages reserves them here, or fails with ENOMEM: never a
  // SIGBUS at first touch for want of pages.
  void* map = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of a ", length, "-byte segment: ", std::strerror(err)));
  }
  return std::make_pair(fd, static_cast<char*>(map));
}

}  // namespace

// A memfd mapped into this process, sealed so it can neither shrink nor grow (the
// daemon refuses segments that could shrink under its mapping). Large ones go in huge
// pages where the kernel has enough to give (reserved with vm.nr_hugepages, or made on
// demand up to vm.nr_overcommit_hugepages), else in ordinary pages.
absl::StatusOr<std::unique_ptr<HostBuffer>> HostBuffer::Allocate(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  if (bytes >= kHugePagesFrom && HugePagesAllowed()) {
    const auto length =
        static_cast<size_t>(wire::AlignUp(static_cast<int64_t>(bytes), static_cast<int64_t>(kHugePageBytes)));
    if (auto huge = MapSealedMemfd(length, MFD_HUGETLB); huge.ok()) {
      return std::unique_ptr<HostBuffer>(new HostBuffer(huge->first, huge->second, bytes, length, true));
    }
  }
  absl::StatusOr<std::pair<int, char*>> mapped = MapSealedMemfd(bytes, 0);
  if (!mapped.ok()) return mapped.status();
  return std::unique_ptr<HostBuffer>(new HostBuffer(mapped->first, mapped->second, bytes, bytes, false));
}

HostBuffer::~HostBuffer() {
  ::munmap(data_, mapped_);
  ::close(fd_);
}

Client::~Client() = default;

namespace {

constexpr size_t kMaxFreeSegments = 2;
constexpr size_t kMaxBusySegments = 4;

}  // namespace

bool Client::UseSharedMemory(Transport transport) const {
  if (transport == Transport::kStream) return false;
  if (transport == Transport::kSharedMemory) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return local_ && shared_memory_works_;
}

absl::StatusOr<std::unique_ptr<Client::Segment>> Client::TakeSegment(size_t size) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = free_segments_.begin(); it != free_segments_.end(); ++it) {
      if ((*it)->size() >= size && (*it)->size() - size <= (*it)->size() / 4) {
        std::unique_ptr<Segment> segment = std::move(*it);
        free_segments_.erase(it);
        return segment;
      }
    }
    // Kept segments too small for this call go before a larger one is made: idle
    // shared memory of sizes the trainer has moved past is not held beside it.
    std::erase_if(free_segments_, [size](const std::unique_ptr<Segment>& s) { return s->size() < size; });
  }
  return Segment::Allocate(size);
}

void Client::ReturnSegment(std::unique_ptr<Segment> segment) {
  std::lock_guard<std::mutex> lock(mu_);
  free_segments_.push_back(std::move(segment));
  if (free_segments_.size() > kMaxFreeSegments) free_segments_.erase(free_segments_.begin());
}

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& address, absl::Duration timeout,
                                                        const TlsFiles* tls, WaitForDaemon wait) {
  const std::string target = DaemonTarget(address);
  const std::string chosen = client_internal::HowAddressWasChosen(address);
  if (wait == WaitForDaemon::kNo) {
    if (absl::Status listening = client_internal::CheckSocketListening(target, chosen); !listening.ok()) {
      return listening;
    }
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(wire::kMaxMessageBytes);
  args.SetMaxSendMessageSize(wire::kMaxMessageBytes);
  // A trainer often starts beside its daemon, before the daemon listens. gRPC's
  // default reconnect backoff (1 s, growing 1.6x) would then keep it waiting seconds
  // after the daemon is up; retrying every 100 ms, at most every 2 s, costs nothing
  // against a daemon on the same host or network.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (tls != nullptr) {
    grpc::SslCredentialsOptions options;
    auto ca = ReadPem(tls->ca);
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *ca;
    if (!tls->cert.empty()) {
      auto cert = ReadPem(tls->cert);
      auto key = ReadPem(tls->key);
      if (!cert.ok()) return cert.status();
      if (!key.ok()) return key.status();
      options.pem_cert_chain = *cert;
      options.pem_private_key = *key;
    }
    credentials = grpc::SslCredentials(options);
  }
  auto channel = grpc::CreateCustomChannel(target, credentials, args);
  if (!channel->WaitForConnected(DeadlineIn(timeout))) {
    return absl::UnavailableError(absl::StrCat("cannot connect to ckptd at ", target, chosen, " within ",
                                               absl::FormatDuration(timeout)));
  }
  return std::unique_ptr<Client>(new Client(std::move(channel), absl::StartsWith(target, "unix:")));
}

absl::StatusOr<SaveResult> Client::Save(const std::string& run, int64_t step, int trainer_id,
                                        int trainer_count, const std::vector<TensorShard>& shards,
                                        const SaveOptions& options) {
  v1::SaveRequest message;
  v1::SaveHeader* header = message.mutable_header();
  header->set_run(run);
  header->set_step(step);
  header->set_trainer_id(trainer_id);
  header->set_trainer_count(trainer_count);
  header->set_mesh(options.mesh);
  header->mutable_device_ids()->Add(options.device_ids.begin(), options.device_ids.end());
  header->set_store_float32_as_bfloat16(options.store_float32_as_bfloat16);
  for (const auto& [key, value] : options.trainer_state) (*header->mutable_trainer_state())[key] = value;
  std::vector<std::pair<const void*, size_t>> pieces;
  pieces.reserve(shards.size());
  header->mutable_tensors()->Reserve(static_cast<int>(shards.size()));
  for (const TensorShard& s : shards) {
    v1::TensorDescriptor* d = header->add_tensors();
    d->set_name(s.name);
    d->set_dtype(s.dtype);
    d->mutable_shape()->Add(s.shape.begin(), s.shape.end());
    if (s.use_layout) {
      d->mutable_layout()->mutable_sharding_specs()->Add(s.sharding_specs.begin(), s.sharding_specs.end());
      pieces.insert(pieces.end(), s.device_data.begin(), s.device_data.end());
    } else {
      if (!s.box_start.empty() || !s.box_length.empty()) SetBox(d->mutable_box(), s.box_start, s.box_length);
      if (s.device_memory.has_value()) {
        SetDeviceMemory(d->mutable_device_memory(), *s.device_memory);
      } else {
        pieces.emplace_back(s.data, s.size);
      }
    }
  }
  if (UseSharedMemory(options.transport)) {
    absl::StatusOr<SaveResult> result = SaveVia(true, &message, pieces, options);
    if (result.ok() || options.transport != Transport::kAuto || !SharedMemoryUnusable(result.status())) {
      return result;
    }
    std::lock_guard<std::mutex> lock(mu_);
    shared_memory_works_ = false;
  }
  return SaveVia(false, &message, pieces, options);
}

absl::StatusOr<SaveResult> Client::SaveVia(bool shared_memory, v1::SaveRequest* message,
                                           const std::vector<std::pair<const void*, size_t>>& pieces,
                                           const SaveOptions& options) {
  size_t total = 0;
  for (const auto& piece : pieces) total += piece.second;
  std::unique_ptr<Segment> segment;
  if (shared_memory) {
    ASSIGN_OR_RETURN_CLIENT(segment, TakeSegment(total));
    char* out = segment->data();
    for (const auto& [data, size] : pieces) {
      if (size > 0) std::memcpy(out, data, size);
      out += size;
    }
    v1::SharedMemory* shm = message->mutable_header()->mutable_shared_memory();
    shm->set_fd(segment->fd());
    shm->set_offset(0);
    shm->set_size(static_cast<int64_t>(total));
  } else {
    message->mutable_header()->clear_shared_memory();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(options.timeout));
  v1::SaveResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::SaveRequest>> writer(stub_->Save(&ctx, &response));
  bool open = writer->Write(*message);
  // Pack consecutive pieces into chunks of up to 4 MiB. One message is reused: its
  // buffer keeps its pages, where a fresh 4 MiB string per chunk would page-fault
  // through every chunk (first touch runs at a fraction of memcpy speed).
  v1::SaveRequest data;
  std::string* chunk = data.mutable_data();
  if (!shared_memory) chunk->reserve(std::min(total, wire::kSaveChunkBytes));
  for (size_t i = 0; !shared_memory && open && i < pieces.size(); ++i) {
    const char* p = static_cast<const char*>(pieces[i].first);
    size_t left = pieces[i].second;
    while (open && left > 0) {
      const size_t n = std::min(left, wire::kSaveChunkBytes - chunk->size());
      chunk->append(p, n);
      p += n;
      left -= n;
      if (chunk->size() == wire::kSaveChunkBytes) {
        open = writer->Write(data);
        chunk->clear();
      }
    }
  }
  if (open && !chunk->empty()) writer->Write(data);
  writer->WritesDone();
  const absl::Status status = FromGrpcStatus(writer->Finish());
  if (segment != nullptr) {
    const auto key = std::make_pair(message->header().run(), message->header().step());
    if (status.ok()) {
      // The daemon writes from the segment until the step is committed.
      std::lock_guard<std::mutex> lock(mu_);
      busy_segments_[key] = std::move(segment);
      if (busy_segments_.size() > kMaxBusySegments) busy_segments_.erase(busy_segments_.begin());
    } else if (status.code() != absl::StatusCode::kDeadlineExceeded &&
               status.code() != absl::StatusCode::kCancelled &&
               status.code() != absl::StatusCode::kUnavailable) {
      ReturnSegment(std::move(segment));  // refused outright: the daemon holds nothing of it
    }
  }
  if (!status.ok()) return status;
  return SaveResult{response.bytes_staged(), response.staging_seconds(), shared_memory};
}

absl::StatusOr<SaveResult> Client::SaveByName(const std::string& run, int64_t step, int trainer_id,
                                              int trainer_count, const NamedTensors& tensors,
                                              const SaveOptions& options) {
  std::vector<TensorShard> shards;
  for (const auto& [name, t] : tensors) {
    TensorShard s;
    s.name = name;
    s.dtype = t.dtype;
    s.shape = t.shape;
    s.use_layout = true;
    s.sharding_specs = t.sharding_specs;
    for (const auto& [data, size] : t.device_data) s.device_data.emplace_back(data, size);
    shards.push_back(std::move(s));
  }
  return Save(run, step, trainer_id, trainer_count, shards, options);
}

absl::Status Client::Wait(const std::string& run, int64_t step, absl::Duration timeout,
                          UnknownRun unknown_run) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout));
  v1::WaitRequest request;
  request.set_run(run);
  request.set_step(step);
  request.set_allow_unknown_run(unknown_run == UnknownRun::kWait);
  v1::WaitResponse response;
  const absl::Status status = FromGrpcStatus(stub_->Wait(&ctx, request, &response));
  if (status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = busy_segments_.lower_bound({run, INT64_MIN});
         it != busy_segments_.end() && it->first.first == run && it->first.second <= step;) {
      free_segments_.push_back(std::move(it->second));
      it = busy_segments_.erase(it);
    }
    while (free_segments_.size() > kMaxFreeSegments) free_segments_.erase(free_segments_.begin());
  }
  return status;
}

absl::Status Client::Barrier(const std::string& run, int trainer_id, int trainer_count,
                             absl::Duration timeout, const std::string& mesh,
                             const std::vector<int64_t>& device_ids) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout));
  v1::BarrierRequest request;
  request.set_run(run);
  request.set_trainer_id(trainer_id);
  request.set_trainer_count(trainer_count);
  request.set_barrier_id(barrier_sequence_[run]++);
  request.set_mesh(mesh);
  request.mutable_device_ids()->Add(device_ids.begin(), device_ids.end());
  v1::BarrierResponse response;
  return FromGrpcStatus(stub_->Barrier(&ctx, request, &response));
}

absl::StatusOr<v1::StatusResponse> Client::Status(absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout));
  v1::StatusResponse response;
  grpc::Status status = stub_->Status(&ctx, v1::StatusRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::ListCheckpointsResponse> Client::ListCheckpoints(const std::string& run,
                                                                    absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout));
  v1::ListCheckpointsRequest request;
  request.set_run(run);
  v1::ListCheckpointsResponse response;
  grpc::Status status = stub_->ListCheckpoints(&ctx, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::ListTensorsResponse> Client::ListTensors(const std::string& run,
                                                            std::optional<int64_t> step,
                                                            absl::Duration timeout) {
  v1::ListTensorsRequest request;
  request.set_run(run);
  request.set_latest(!step.has_value());
  request.set_step(step.value_or(0));
  request.set_page_size(10000);  // the daemon's cap: fewest index reads
  v1::ListTensorsResponse all;
  do {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(timeout));
    v1::ListTensorsResponse page;
    grpc::Status status = stub_->ListTensors(&ctx, request, &page);
    if (!status.ok()) return FromGrpcStatus(status);
    // Later pages come from the step the first one chose, even if a newer one commits.
    request.set_latest(false);
    request.set_step(page.step());
    all.set_step(page.step());
    for (v1::TensorDescriptor& t : *page.mutable_tensors()) *all.add_tensors() = std::move(t);
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return all;
}

absl::StatusOr<int64_t> Client::ReadStepFile(const std::string& run, int64_t step, const std::string& file,
                                             int64_t offset, int64_t size, char* dst,
                                             absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout));
  v1::ReadStepFileRequest request;
  request.set_run(run);
  request.set_step(step);
  request.set_file(file);
  request.set_offset(offset);
  request.set_length(size);
  auto reader = stub_->ReadStepFile(&ctx, request);
  v1::ReadStepFileResponse message;
  int64_t file_size = -1, received = 0;
  while (reader->Read(&message)) {
    if (file_size < 0) file_size = message.file_size();
    const int64_t n = static_cast<int64_t>(message.data().size());
    if (n > size - received) {
      ctx.TryCancel();
      return absl::DataLossError(absl::StrCat("the daemon sent more of ", file, " than asked for"));
    }
    if (n > 0) std::memcpy(dst + received, message.data().data(), static_cast<size_t>(n));  // dst may be null
    received += n;
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  if (received != size)
    return absl::DataLossError(absl::StrCat("the daemon sent ", received, " of ", size, " bytes"));
  return file_size;
}

}  // namespace ckptd
