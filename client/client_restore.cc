// Client::Restore: the request built from the trainer's targets, and the reply read
// as raw bytes (restore_stream.h) into them, from the shared-memory segment or from
// the stream's chunks. See ckptd/client.h.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckptd/client.h"
#include "ckptd/v1/wire.h"
#include "client_internal.h"
#include "restore_stream.h"

namespace ckptd {

using client_internal::DeadlineIn;
using client_internal::SetBox;
using client_internal::SetDeviceMemory;
using client_internal::SharedMemoryUnusable;

absl::StatusOr<int64_t> Client::Restore(const std::string& run, std::optional<int64_t> step,
                                        const std::vector<RestoreTarget>& targets,
                                        const RestoreOptions& options) {
  v1::RestoreRequest request;
  request.set_run(run);
  if (step.has_value()) {
    request.set_step(*step);
  } else {
    request.set_latest(true);
  }
  request.set_mesh(options.mesh);
  request.mutable_device_ids()->Add(options.device_ids.begin(), options.device_ids.end());
  request.set_trainer_id(options.trainer_id);
  request.set_trainer_state(options.trainer_state != nullptr);
  // Each target's reply is one byte stream, scattered over its buffers in order.
  std::vector<std::vector<std::pair<void*, size_t>>> pieces;
  std::vector<size_t> capacity;
  pieces.reserve(targets.size());
  capacity.reserve(targets.size());
  request.mutable_tensors()->Reserve(static_cast<int>(targets.size()));
  for (const RestoreTarget& t : targets) {
    if (t.host_buffer != nullptr &&
        (t.use_layout || t.device_memory.has_value() || !t.host_buffer->Contains(t.data, t.size))) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name,
                       "': host_buffer is set, but data/size do not lie inside it (or use_layout or "
                       "device_memory is set too)"));
    }
    v1::TensorRequest* r = request.add_tensors();
    r->set_name(t.name);
    r->set_dtype(t.dtype);
    r->mutable_shape()->Add(t.shape.begin(), t.shape.end());
    if (t.use_layout) {
      r->mutable_layout()->mutable_sharding_specs()->Add(t.sharding_specs.begin(), t.sharding_specs.end());
      pieces.push_back(t.device_data);
    } else {
      if (!t.box_start.empty() || !t.box_length.empty()) SetBox(r->mutable_box(), t.box_start, t.box_length);
      if (t.device_memory.has_value()) {
        SetDeviceMemory(r->mutable_device_memory(), *t.device_memory);
        pieces.emplace_back();  // nothing arrives here: the daemon writes to the device
      } else {
        pieces.push_back({{t.data, t.size}});
      }
    }
    size_t total = 0;
    for (const auto& piece : pieces.back()) total += piece.second;
    capacity.push_back(total);
  }
  if (UseSharedMemory(options.transport)) {
    absl::StatusOr<int64_t> restored = RestoreVia(true, &request, targets, pieces, capacity, options);
    if (restored.ok() || options.transport != Transport::kAuto || !SharedMemoryUnusable(restored.status())) {
      return restored;
    }
    std::lock_guard<std::mutex> lock(mu_);
    shared_memory_works_ = false;
  }
  return RestoreVia(false, &request, targets, pieces, capacity, options);
}

namespace {

// Copies `n` bytes that belong at byte `offset` of a target's stream into its buffers.
void Scatter(const std::vector<std::pair<void*, size_t>>& pieces, size_t offset, const char* src, size_t n) {
  for (const auto& [dst, size] : pieces) {
    if (n == 0) break;
    if (offset >= size) {
      offset -= size;
      continue;
    }
    const size_t take = std::min(n, size - offset);
    std::memcpy(static_cast<char*>(dst) + offset, src, take);
    src += take;
    n -= take;
    offset = 0;
  }
}

}  // namespace

namespace {

using Pieces = std::vector<std::vector<std::pair<void*, size_t>>>;

// Where each target's bytes lie in a shared-memory reply, by the daemon's rule
// (RestoreHeader.shared_memory_offsets): -1 for targets the daemon writes itself
// (device memory, or with `shared_memory` a HostBuffer, whose range the request
// names). Returns the reply's size.
size_t LayOutReply(bool shared_memory, v1::RestoreRequest* request, const std::vector<RestoreTarget>& targets,
                   const std::vector<size_t>& capacity, std::vector<int64_t>* offsets) {
  size_t total = 0;
  for (size_t i = 0; i < capacity.size(); ++i) {
    v1::TensorRequest& tensor = *request->mutable_tensors(static_cast<int>(i));
    const HostBuffer* host = targets[i].host_buffer;
    if (shared_memory && host != nullptr) {  // the daemon writes into the target itself
      v1::SharedMemory* range = tensor.mutable_host_memory();
      range->set_fd(host->fd());
      range->set_offset(static_cast<char*>(targets[i].data) - host->data());
      range->set_size(static_cast<int64_t>(targets[i].size));
    } else {
      tensor.clear_host_memory();
    }
    if (tensor.has_device_memory() || tensor.has_host_memory()) {
      offsets->push_back(-1);
      continue;
    }
    const int64_t start =
        wire::SharedMemoryOffset(static_cast<int64_t>(total), static_cast<int64_t>(capacity[i]));
    offsets->push_back(start);
    total = static_cast<size_t>(start) + capacity[i];
  }
  return total;
}

// One Restore call's replies as they arrive: the header checked against the reply's
// layout, RestoreReady's tensors copied out of the segment (`segment`, null for a
// streamed reply), chunks scattered into the targets. The first problem is kept and
// the caller cancels the call.
class ReplyReader {
 public:
  ReplyReader(const std::vector<RestoreTarget>& targets, const Pieces& pieces,
              const std::vector<size_t>& capacity, const std::vector<int64_t>& offsets, size_t total,
              const char* segment, bool copy_out_when_ready)
      : targets_(targets),
        pieces_(pieces),
        capacity_(capacity),
        offsets_(offsets),
        total_(total),
        segment_(segment),
        copy_out_when_ready_(copy_out_when_ready),
        received_(targets.size(), 0),
        copied_out_(targets.size(), false) {}

  // One message; false when it was a problem (see problem()).
  bool Take(internal::RawRestoreResponse& message) {
    if (message.has_header) return TakeHeader(message);
    if (message.has_ready) return TakeReady(message);
    if (message.has_trailer) {  // the counters of a restore streamed while it was read
      header_.set_storage_bytes_read(message.trailer.storage_bytes_read());
      header_.set_peer_bytes_received(message.trailer.peer_bytes_received());
      return true;
    }
    if (!message.has_chunk) return true;
    const size_t index = static_cast<size_t>(message.tensor_index);
    if (message.tensor_index < 0 || index >= targets_.size() || message.offset < 0 ||
        static_cast<size_t>(message.offset) + message.data_size > capacity_[index]) {
      problem_ = absl::InvalidArgumentError(
          absl::StrCat("tensor '", index < targets_.size() ? targets_[index].name : "?",
                       "': the daemon sent more bytes than the target buffers hold"));
      return false;
    }
    size_t at = static_cast<size_t>(message.offset);
    for (const auto& [data, n] : message.data) {
      Scatter(pieces_[index], at, data, n);
      at += n;
    }
    received_[index] += message.data_size;
    return true;
  }

  // Tensor i copied out of the segment into its target (once).
  void CopyOut(size_t i) {
    if (offsets_[i] < 0 || copied_out_[i]) return;
    Scatter(pieces_[i], 0, segment_ + offsets_[i], capacity_[i]);
    copied_out_[i] = true;
    received_[i] = capacity_[i];
  }
  // Every target was filled: INVALID_ARGUMENT naming the first that was not.
  absl::Status CheckComplete(const v1::RestoreRequest& request) {
    for (size_t i = 0; i < targets_.size(); ++i) {
      const v1::TensorRequest& tensor = request.tensors(static_cast<int>(i));
      if (tensor.has_host_memory() || (header_.process_memory() && tensor.process_memory_size() > 0)) {
        received_[i] = capacity_[i];
      }
    }
    for (size_t i = 0; i < targets_.size(); ++i) {
      if (received_[i] != capacity_[i]) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", targets_[i].name, "': the daemon sent ",
                                                       received_[i], " bytes but the target buffers hold ",
                                                       capacity_[i]));
      }
    }
    return absl::OkStatus();
  }

  const absl::Status& problem() const { return problem_; }
  bool have_header() const { return have_header_; }
  const v1::RestoreHeader& header() const { return header_; }

 private:
  bool TakeHeader(internal::RawRestoreResponse& message) {
    header_ = std::move(message.header);
    have_header_ = true;
    // A layout unlike the client's would put bytes where the targets do not expect them.
    if (segment_ != nullptr &&
        (header_.shared_memory_bytes() != static_cast<int64_t>(total_) ||
         !std::equal(offsets_.begin(), offsets_.end(), header_.shared_memory_offsets().begin(),
                     header_.shared_memory_offsets().end()))) {
      problem_ = absl::InvalidArgumentError(absl::StrCat(
          "the restored tensors need ", header_.shared_memory_bytes(), " bytes but the target buffers hold ",
          total_, " (a target's size differs from its box)"));
      return false;
    }
    return true;
  }
  bool TakeReady(const internal::RawRestoreResponse& message) {
    for (const int32_t index : message.ready.tensor_indices()) {
      if (!have_header_ || segment_ == nullptr || index < 0 ||
          static_cast<size_t>(index) >= targets_.size()) {
        problem_ = absl::InvalidArgumentError(absl::StrCat(
            "the daemon named tensor ", index, " ready, which is not in its shared-memory reply"));
        return false;
      }
      if (copy_out_when_ready_) CopyOut(static_cast<size_t>(index));
    }
    return true;
  }

  const std::vector<RestoreTarget>& targets_;
  const Pieces& pieces_;
  const std::vector<size_t>& capacity_;
  const std::vector<int64_t>& offsets_;
  const size_t total_;
  const char* segment_;
  const bool copy_out_when_ready_;
  std::vector<size_t> received_;
  std::vector<bool> copied_out_;  // tensors copied out of the segment so far
  v1::RestoreHeader header_;
  bool have_header_ = false;
  absl::Status problem_;
};

}  // namespace

absl::StatusOr<int64_t> Client::RestoreVia(bool shared_memory, v1::RestoreRequest* request,
                                           const std::vector<RestoreTarget>& targets, const Pieces& pieces,
                                           const std::vector<size_t>& capacity,
                                           const RestoreOptions& options) {
  std::vector<int64_t> offsets;
  const size_t total = LayOutReply(shared_memory, request, targets, capacity, &offsets);
  // On this host the daemon may write plain targets itself, straight from its reads
  // into memory the trainer already holds, with the segment left untouched; not when
  // a failed restore must leave them as they were.
  for (size_t i = 0; i < pieces.size(); ++i) {
    v1::TensorRequest& tensor = *request->mutable_tensors(static_cast<int>(i));
    tensor.clear_process_memory();
    if (!shared_memory || offsets[i] < 0 || options.keep_targets_on_failure) continue;
    for (const auto& [data, size] : pieces[i]) {
      v1::MemoryRange* range = tensor.add_process_memory();
      range->set_address(reinterpret_cast<uintptr_t>(data));
      range->set_size(static_cast<int64_t>(size));
    }
  }
  std::unique_ptr<Segment> segment;
  if (shared_memory && total > 0) {
    ASSIGN_OR_RETURN_CLIENT(segment, TakeSegment(total));
    v1::SharedMemory* shm = request->mutable_shared_memory();
    shm->set_fd(segment->fd());
    shm->set_offset(0);
    shm->set_size(static_cast<int64_t>(segment->size()));
  } else {
    request->clear_shared_memory();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(options.timeout));
  // The replies are read as raw bytes (what the generated stub does, less protobuf's
  // parse): each chunk's data goes from gRPC's slices straight into the targets.
  const grpc::internal::RpcMethod method(internal::kRestoreMethod,
                                         grpc::internal::RpcMethod::SERVER_STREAMING, channel_);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel_.get(), method, &ctx, *request));
  ReplyReader reply(targets, pieces, capacity, offsets, total, segment != nullptr ? segment->data() : nullptr,
                    /*copy_out_when_ready=*/!options.keep_targets_on_failure);
  grpc::ByteBuffer bytes;
  std::vector<grpc::Slice> slices;
  internal::RawRestoreResponse message;
  absl::Status problem;
  while (reader->Read(&bytes)) {
    if (!problem.ok()) continue;
    slices.clear();
    problem = bytes.Dump(&slices).ok() ? internal::ParseRestoreResponse(slices, &message)
                                       : absl::InternalError("cannot read a RestoreResponse's bytes");
    if (problem.ok() && !reply.Take(message)) problem = reply.problem();
    if (!problem.ok()) ctx.TryCancel();
  }
  grpc::Status status = reader->Finish();
  if (!problem.ok()) return problem;
  if (!status.ok()) return FromGrpcStatus(status);
  if (segment != nullptr) {
    if (!reply.have_header()) return absl::InternalError("the daemon's restore reply had no header");
    if (!reply.header().process_memory()) {
      for (size_t i = 0; i < targets.size(); ++i) reply.CopyOut(i);
    }
    ReturnSegment(std::move(segment));
  }
  RETURN_IF_ERROR_CLIENT(reply.CheckComplete(*request));
  const v1::RestoreHeader& header = reply.header();
  if (options.trainer_state != nullptr) {
    for (const auto& [key, value] : header.trainer_state()) (*options.trainer_state)[key] = value;
  }
  if (options.stats != nullptr) {
    *options.stats = {.storage_bytes_read = header.storage_bytes_read(),
                      .peer_bytes_received = header.peer_bytes_received(),
                      .bytes_delivered = header.bytes_delivered(),
                      .into_trainer_memory = header.process_memory()};
  }
  return header.step();
}

absl::StatusOr<int64_t> Client::RestoreByName(const std::string& run, std::optional<int64_t> step,
                                              const NamedTensors& tensors, const RestoreOptions& options) {
  std::vector<RestoreTarget> targets;
  for (const auto& [name, t] : tensors) {
    RestoreTarget r;
    r.name = name;
    r.dtype = t.dtype;
    r.shape = t.shape;
    r.use_layout = true;
    r.sharding_specs = t.sharding_specs;
    r.device_data = t.device_data;
    targets.push_back(std::move(r));
  }
  return Restore(run, step, targets, options);
}

}  // namespace ckptd
